/* qwen.c — the cross-tokenizer drafter (draft.h): a Qwen3 model with its own tokenizer, run by
 * this engine as a second engine on the target's threads.
 *
 * Each step: the text the target has so far goes to the drafter in its own tokenization (raw
 * completion: the whole text; chat: the conversation rendered in the drafter's own chat format,
 * then the target's reply text of the current channel); its session reuses every position the
 * last step left (Qwen3 has no recurrent state, so any prefix is free to return to); it decodes a
 * few tokens greedily; their text is appended to the target's text and re-encoded with the
 * target's tokenizer (draft_bridge). BPE is not prefix-stable, so the tail is re-encoded from a
 * word start a little way back (within the newest text run, after the last special token), and a
 * draft counts only if that re-encoding gives back the target's own tokens before it. Only whole
 * tokens are proposed: those that end before the draft text's last pre-token piece
 * (tok_stable_len), since the draft may end inside a word the two tokenizers split differently and
 * whatever follows could re-tokenize it. The guesses are
 * plain (q = 1): with sampling, speculative sampling with q = 1 is exact whatever the guess
 * (sample-and-match).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/draft.h"
#include "engine/engine_int.h"
#include "engine/sampler.h"

enum { QW_TAIL_TOKENS = 48, QW_EXTRA = 3 }; /* extra: past the k guesses, for the whole-token rule */

typedef struct qwen {
    drafter d;
    engine *target, *qe;
    const tok *tt, *qt;          /* the target's and the drafter's tokenizers */
    session *qs;
    tok_ids qids, tail, chat;    /* the drafter's prompt; a re-encoding; the chat prefix in its format */
    tok_ids cov;                 /* the target tokens seq[enc_base..) the kept encoding was made from */
    int enc_base;
    size_t enc_bytes, enc_n;     /* of their text, the stable bytes and their Qwen tokens (in qids) */
    char *text;                  /* bytes of target tokens */
    size_t text_cap;
    int chat_mode;
    double share;                /* the weights a position uses in its model over the target's (qw_cost) */
} qwen;

/* the bytes of target tokens seq[a..b) into q->text; returns the length or -1 */
static long bytes_of(qwen *q, const int32_t *seq, int a, int b)
{
    size_t n = 0;
    for (int i = a; i < b; i++) {
        size_t l;
        const uint8_t *p = tok_token_bytes(q->tt, seq[i], &l);
        if (!p)
            continue;
        if (n + l + 1 > q->text_cap) {
            size_t cap = 2 * (n + l + 1) + 4096;
            char *t = realloc(q->text, cap);
            if (!t)
                return -1;
            q->text = t;
            q->text_cap = cap;
        }
        memcpy(q->text + n, p, l);
        n += l;
    }
    return (long)n;
}

static int qw_propose(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **qd, errbuf *err)
{
    qwen *q = (qwen *)d;
    *qd = NULL;
    /* the newest text run: after the last special token (a chat format's marker) */
    int run = n;
    while (run > 0 && !tok_is_special(q->tt, seq[run - 1]))
        run--;
    if (n - run < 1)
        return 0;
    /* the drafter's prompt: the chat in its format + the run, or all the text; the Qwen tokens of
     * the text's stable prefix (tok_stable_len) are kept from the last step when the text still
     * begins with the target tokens they came from */
    int from_tok = q->chat_mode ? run : 0;
    if (from_tok != q->enc_base || (int)q->cov.n > n - from_tok ||
        (q->cov.n > 0 && memcmp(q->cov.v, seq + from_tok, sizeof(int32_t) * q->cov.n) != 0)) {
        q->enc_base = from_tok;
        q->enc_bytes = q->enc_n = q->cov.n = 0;
    }
    q->qids.n = 0;
    if (q->chat_mode) {
        for (size_t i = 0; i < q->chat.n; i++)
            if (tok_ids_push(&q->qids, q->chat.v[i]))
                return errbuf_set(err, "Qwen drafter: out of memory");
    }
    q->qids.n += q->enc_n; /* still there from the last step */
    long len = bytes_of(q, seq, from_tok, n);
    size_t from = q->qids.n, stable;
    if (len < 0 || tok_encode(q->qt, q->text + q->enc_bytes, (size_t)len - q->enc_bytes, TOK_SPECIAL_NONE, &q->qids,
                              err) != 0)
        return len < 0 ? errbuf_set(err, "Qwen drafter: out of memory") : -1;
    if (tok_stable_len(q->qt, q->text + q->enc_bytes, (size_t)len - q->enc_bytes, &stable, err) != 0)
        return -1;
    for (size_t i = from, at = 0; i < q->qids.n && at < stable; i++) { /* its tokens: final from now on */
        size_t l;
        tok_token_bytes(q->qt, q->qids.v[i], &l);
        if ((at += l) > stable)
            break;
        q->enc_n++;
        q->enc_bytes += l;
    }
    q->cov.n = 0;
    for (int i = from_tok; i < n; i++)
        if (tok_ids_push(&q->cov, seq[i]))
            return errbuf_set(err, "Qwen drafter: out of memory");
    if (q->qids.n < 1 || (int)q->qids.n + k + QW_EXTRA > session_context(q->qs))
        return 0;
    if (session_sync(q->qs, q->qids.v, (int)q->qids.n, err) != 0)
        return -1;
    /* its greedy continuation, as bytes after the target's text */
    int want = k + QW_EXTRA;
    int start = n - QW_TAIL_TOKENS > run ? n - QW_TAIL_TOKENS : run; /* re-encode from here: a token */
    for (int i = start; i < n - 1 && start > run; i++) {              /* that begins a new word */
        size_t l;
        const uint8_t *p = tok_token_bytes(q->tt, seq[i], &l);
        if (p && l && (p[0] == ' ' || p[0] == '\n')) {
            start = i;
            break;
        }
    }
    long base = bytes_of(q, seq, start, n);
    if (base < 0)
        return errbuf_set(err, "Qwen drafter: out of memory");
    size_t total = (size_t)base;
    const float *lg = session_last_logits(q->qs);
    for (int g = 0; g < want; g++) {
        int32_t id = sampler_argmax(lg, engine_hparams(q->qe)->vocab);
        if (tok_is_stop(q->qt, id) || tok_is_special(q->qt, id))
            break;
        size_t l;
        const uint8_t *p = tok_token_bytes(q->qt, id, &l);
        if (!p)
            break;
        if (total + l + 1 > q->text_cap) {
            size_t cap = 2 * (total + l + 1);
            char *t = realloc(q->text, cap);
            if (!t)
                return errbuf_set(err, "Qwen drafter: out of memory");
            q->text = t;
            q->text_cap = cap;
        }
        memcpy(q->text + total, p, l);
        total += l;
        if (g + 1 == want)
            break;
        session_pass ps = {.tokens = &id, .T = 1, .n_logits = 1};
        if (session_run(q->qs, &ps, err) != 0)
            return -1;
        lg = session_logits(q->qs, 0);
    }
    if (total == (size_t)base)
        return 0;
    return draft_bridge(q->tt, seq + start, n - start, q->text, total, k, &q->tail, out, err);
}

int draft_bridge(const tok *tt, const int32_t *tail, int have, const char *text, size_t len, int k, tok_ids *scratch,
                 int32_t *out, errbuf *err)
{
    size_t stable;
    scratch->n = 0;
    if (tok_stable_len(tt, text, len, &stable, err) != 0 || tok_encode(tt, text, len, TOK_SPECIAL_NONE, scratch, err))
        return -1;
    if ((int)scratch->n <= have || (have > 0 && memcmp(scratch->v, tail, sizeof(int32_t) * (size_t)have) != 0))
        return 0; /* the text re-tokenizes differently around the join: no guess this step */
    size_t at = 0;
    for (int i = 0; i < have; i++) {
        size_t l;
        tok_token_bytes(tt, tail[i], &l);
        at += l;
    }
    int m = 0; /* whole tokens: those that end where no later text can re-tokenize them */
    while (m < k && have + m < (int)scratch->n) {
        size_t l;
        if (!tok_token_bytes(tt, scratch->v[have + m], &l) || at + l > stable)
            break;
        at += l;
        out[m] = scratch->v[have + m];
        m++;
    }
    return m;
}

static void qw_feedback(drafter *d, int proposed, int accepted)
{
    (void)d;
    (void)proposed;
    (void)accepted;
}

static void qw_reset(drafter *d)
{
    qwen *q = (qwen *)d;
    session_reset(q->qs);
    q->enc_bytes = q->enc_n = q->cov.n = 0;
}

/* the conversation in the drafter's own format, its reply opened (NULL: raw completion) */
static int qw_begin(drafter *d, const json_t *messages, int thinking, errbuf *err)
{
    qwen *q = (qwen *)d;
    (void)thinking; /* the drafter drafts the target's current channel's text, whichever it is */
    q->chat.n = 0;
    q->chat_mode = 0;
    q->enc_bytes = q->enc_n = q->cov.n = 0;
    if (!messages)
        return 0;
    tok_chat_opts co;
    tok_chat_opts_init(&co);
    co.thinking = 0;
    if (tok_chat_encode(q->qt, messages, &co, &q->chat, err) != 0)
        return errbuf_prefix(err, "Qwen drafter"), -1;
    q->chat_mode = 1;
    return 0;
}

/* Its model's weights a position uses against the target's: a guess costs that share of a plain
 * target pass, and catching up with the tokens it has not seen the same per token. */
static double qw_cost(drafter *d, int n, int k, double *once)
{
    qwen *q = (qwen *)d;
    double r = q->share;
    int seen = q->enc_base + (int)q->cov.n, unseen = n > seen ? n - seen : 0;
    *once = r * (unseen + (q->chat_mode && session_len(q->qs) == 0 ? (int)q->chat.n : 0));
    return r * (k + QW_EXTRA);
}

static void qw_free(drafter *d)
{
    qwen *q = (qwen *)d;
    if (!q)
        return;
    session_free(q->qs);
    engine_free(q->qe);
    tok_ids_free(&q->qids);
    tok_ids_free(&q->tail);
    tok_ids_free(&q->chat);
    tok_ids_free(&q->cov);
    free(q->text);
    free(q);
}

int draft_qwen_new(const draft_ctx *c, const char *dir, drafter **out, errbuf *err)
{
    *out = NULL;
    qwen *q = calloc(1, sizeof *q);
    if (!q)
        return errbuf_set(err, "Qwen drafter: out of memory");
    q->target = c->target;
    engine_opts o;
    engine_opts_default(&o);
    o.model = dir;
    o.pool_of = c->target;
    o.kernels = engine_kernels(c->target);
    int rc = -1;
    if (engine_open(&o, &q->qe, err) != 0) {
        errbuf_prefix(err, "Qwen drafter");
        goto out;
    }
    const char *arch = engine_hparams(q->qe)->arch;
    if (strcmp(arch, "qwen3") != 0) {
        errbuf_set(err, "%s: model_type '%s' is not qwen3", dir, arch);
        goto out;
    }
    if (!(q->tt = engine_tok(c->target, err)) || !(q->qt = engine_tok(q->qe, err)))
        goto out;
    if (qw_begin(&q->d, c->messages, c->thinking, err) != 0)
        goto out;
    session_opts so;
    session_opts_default(&so);
    so.context = engine_hparams(q->qe)->ctx_len > 0 ? engine_hparams(q->qe)->ctx_len : 32768;
    so.max_pass = 256;
    so.max_logits = 1;
    so.max_commit = 0;
    so.ckpt_budget = 0; /* no recurrent state: every prefix is free to return to */
    if (session_new(q->qe, &so, &q->qs, err) != 0)
        goto out;
    /* computed once: it walks every bound tensor of both models, and the economics asks each step */
    q->share = (double)engine_active_bytes(q->qe) / (double)(engine_active_bytes(q->target) + 1);
    q->d = (drafter){.name = "qwen", .propose = qw_propose, .feedback = qw_feedback, .reset = qw_reset, .free = qw_free,
                       .begin = qw_begin, .cost = qw_cost};
    *out = &q->d;
    rc = 0;
out:
    if (rc)
        qw_free(&q->d);
    return rc;
}
