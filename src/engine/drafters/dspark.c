/* dspark.c — the DSpark block drafter (draft.h), for K3 and the bundled mini-K3: a small
 * DeepSeek-style MLA + SiLU-MLP stack that drafts a whole block at once from the target's own
 * hidden states.
 *
 * Context. For every position t the target computes, the raw AttnRes prefixes leaving the layers
 * target_layer_ids (taps, engine.h) are concatenated, projected (context_proj) and RMS-normed
 * (context_norm) into ctx_t; each draft layer writes its key/value row for t straight from ctx_t:
 * [c ; k_pe] = ctx_t kv_aᵀ, c RMS-normed with kv_a_layernorm, k_pe rotated at t (interleaved
 * YaRN). No input norm and no query for context positions.
 * Block. The anchor (the newest decided token, at position p, not yet run by the target) and
 * block_size - 1 mask tokens at p .. p+K-1, embedded with the target's table; each layer:
 * h += MLA(rmsnorm(h)) attending to every context row t < p and to all K block rows, in both
 * directions inside the block, softmax scale mscale² / sqrt(nope + rope), no output gate;
 * h += down(silu(gate y) up y) with y = rmsnorm(h). Then final_norm and the target's lm_head:
 * U_k. The Markov bias markov_w2 markov_w1[prev] is added to U_k with prev the anchor for k = 0
 * and the previous draft after that; the argmax is draft k (guesses: q = 1).
 * The confidence head is training-only and the file's copy of the embedding (the released K3
 * drafter has one) is never read.
 * Context rows are indexed by position, so a verify pass kept in part needs nothing undone: the
 * rows past the kept positions are written again when the target next computes them.
 * Rows are made lazily: the taps of every pass, a prompt's too, wait in `pend` until the drafter
 * is asked for a block or pend is full (DS_PEND_BYTES, at least DS_TAP_CHUNK positions), then
 * become rows DS_TAP_CHUNK at a time (the kernels give the same bits whatever the batch). A
 * drafter the economics has set aside thus costs a pass a copy of its taps, not a context step
 * (made at every pass, the bundled model's rows were 0.7% of a decode's instructions from RAM,
 * where DSpark is never asked: docs/drafting.md). What an ask will spend making the waiting rows
 * is its catch-up (ds_cost's once).
 * Invariant: rows hold positions 0 .. have-1, pend positions have .. have+npend-1, npend <= pend_cap;
 * the pages of rows below rows_ready (<= cap) and of pend below pend_ready (<= pend_cap) are faulted in.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "base/mem.h"
#include "engine/draft.h"
#include "engine/engine_int.h"
#include "engine/sampler.h"

enum { DS_MAX_LAYERS = 16, DS_MAX_BLOCK = 16, DS_MAX_TAPS = 16, DS_TAP_CHUNK = 64 /* positions per context step */,
       DS_RESERVE = 1 << 16, DS_READY_AHEAD = 256 /* positions of rows or taps faulted in at once */ };
/* taps that may wait (the bundled model's: 4369 positions; K3's, 5 taps of 7168: 117, whose rows
 * cost next to nothing against its passes) */
#define DS_PEND_BYTES ((size_t)16 << 20)

typedef struct ds_layer {
    float *in_norm, *post_norm;  /* [H] */
    kmat q_a, q_b;               /* [q_lora, H], [nh*(nope+rope), q_lora] */
    float *q_a_norm;             /* [q_lora] */
    kmat kv_a;                   /* [kv_lora + rope, H] */
    float *kv_a_norm;            /* [kv_lora] */
    kmat kv_b;                   /* [nh*(nope+v), kv_lora] */
    kmat o;                      /* [H, nh*v] */
    kmat gate, up, down;         /* [I, H], [I, H], [H, I] */
    float *cache;                /* [cap][kv_lora + rope] context rows by position */
} ds_layer;

typedef struct dspark {
    drafter d;
    engine *e;                   /* the target: pool, kernels, embedding, lm_head */
    model m;                     /* the drafter's own tensors (no family: bound by hand) */
    hparams hp;                  /* hidden, heads, MLA widths, eps, RoPE (interleaved YaRN) */
    int L, K, inter, mask_id, R, vocab, Ht, ntaps;
    int taps[DS_MAX_TAPS];
    float scale;
    kmat ctx_proj;               /* [H, ntaps * Ht] */
    float *ctx_norm, *final_norm; /* [H] */
    kmat mw1, mw2;               /* [V, R], [V, R] */
    ds_layer lay[DS_MAX_LAYERS];
    int cap;                     /* context rows allocated */
    int rows_ready, pend_ready;  /* positions of rows, of pend, faulted in (ready) */
    float *sc;                   /* [2 kv_lora + cap + K] attention scratch (blk_mla_query) */
    int have;                    /* positions 0..have-1 hold rows */
    float *pend;                 /* [pend_cap][ntaps * Ht] taps of positions have.. waiting */
    int npend, pend_cap;
    arena ar;                    /* scratch of one step */
    float *U;                    /* [K][V] */
    double cost_ask;             /* an ask's estimated cost in plain target passes (draft.h: cost) */
    double cost_row;             /* making one context row, the same */
} dspark;

static int cfg_int_of(const json_t *c, const char *key, int *out, const char *where, errbuf *err)
{
    const json_t *v = json_object_get(c, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 26))
        return errbuf_set(err, "%s: field '%s' must be a positive integer", where, key);
    *out = (int)json_integer_value(v);
    return 0;
}

static float *scratch(dspark *x, size_t n, errbuf *err)
{
    float *p = arena_alloc(&x->ar, n * sizeof(float));
    if (!p)
        errbuf_set(err, "DSpark: step scratch exhausted");
    return p;
}

static blk blk_of(dspark *x, errbuf *err)
{
    return (blk){&x->m, &x->hp, x->e->k, x->e->pool, &x->ar, err, NULL, NULL};
}

/* room for context rows below `need` */
static int grow(dspark *x, int need, errbuf *err)
{
    if (need <= x->cap)
        return 0;
    int cap = x->cap ? x->cap : 1024;
    while (cap < need)
        cap *= 2;
    size_t W = (size_t)x->hp.kv_lora_rank + x->hp.qk_rope;
    for (int l = 0; l < x->L; l++) {
        float *c = realloc(x->lay[l].cache, sizeof(float) * W * (size_t)cap);
        if (!c)
            return errbuf_set(err, "DSpark: out of memory for %d context positions", cap);
        x->lay[l].cache = c;
    }
    float *sc = realloc(x->sc, sizeof(float) * (2 * (size_t)x->hp.kv_lora_rank + (size_t)cap + (size_t)x->K));
    if (!sc)
        return errbuf_set(err, "DSpark: out of memory for %d context positions", cap);
    x->sc = sc;
    x->cap = cap;
    mem_populate(x->sc, sizeof(float) * (2 * (size_t)x->hp.kv_lora_rank + (size_t)cap + (size_t)x->K));
    return 0;
}

/* Positions ready .. upto-1 (upto <= cap) of buf [cap][width] faulted in before they are
 * written, DS_READY_AHEAD positions ahead: rows and waiting taps are written a few positions a
 * step, and a page first written inside a step costs it a fault (base/mem.h). Returns the new
 * mark. (Rows a realloc moved were written by its copy.) */
static int ready_ahead(float *buf, size_t width, int ready, int upto, int cap)
{
    assert(upto <= cap && ready <= cap);
    if (upto <= ready)
        return ready;
    int to = upto + DS_READY_AHEAD < cap ? upto + DS_READY_AHEAD : cap;
    mem_populate(buf + (size_t)ready * width, sizeof(float) * width * (size_t)(to - ready));
    return to;
}

/* [c ; k_pe] of rows xs [n][H] at positions pos0.. into out [n][kv_lora + rope]: kv_a, the norm of
 * c, RoPE of k_pe */
static void kv_rows(dspark *x, blk *b, const ds_layer *ly, const float *xs, int n, int pos0, float *out, float *cs)
{
    const hparams *hp = &x->hp;
    int r = hp->kv_lora_rank, W = r + hp->qk_rope;
    blk_matmul(b, &ly->kv_a, xs, n, out);
    for (int t = 0; t < n; t++) {
        float *row = out + (size_t)t * W;
        blk_rmsnorm(b, row, ly->kv_a_norm, 1, r, hp->rms_eps, row);
        blk_rope_table(hp, pos0 + t, cs);
        blk_rope_apply(hp, row + r, cs);
    }
}

/* taps [n][ntaps][Ht] of positions pos0 .. pos0+n-1 (pos0 == have, room grown) become context
 * rows, DS_TAP_CHUNK positions at a time; have follows what was made */
static void project(dspark *x, const float *taps, int pos0, int n_all)
{
    errbuf err;
    int H = x->hp.hidden;
    size_t W = (size_t)x->hp.kv_lora_rank + x->hp.qk_rope, in = (size_t)x->ntaps * x->Ht;
    assert(pos0 == x->have);
    for (int t0 = 0; t0 < n_all; t0 += DS_TAP_CHUNK) {
        int n = n_all - t0 < DS_TAP_CHUNK ? n_all - t0 : DS_TAP_CHUNK;
        size_t mark = arena_mark(&x->ar);
        blk b = blk_of(x, &err);
        float *ctx = scratch(x, (size_t)n * H, &err), *cs = scratch(x, (size_t)x->hp.rope_dim, &err);
        if (!ctx || !cs) {
            arena_rewind(&x->ar, mark);
            return;
        }
        blk_matmul(&b, &x->ctx_proj, taps + (size_t)t0 * in, n, ctx);
        blk_rmsnorm(&b, ctx, x->ctx_norm, n, H, x->hp.rms_eps, ctx);
        int ready = x->rows_ready;
        for (int l = 0; l < x->L; l++)
            ready = ready_ahead(x->lay[l].cache, W, x->rows_ready, pos0 + t0 + n, x->cap);
        x->rows_ready = ready;
        for (int l = 0; l < x->L; l++)
            kv_rows(x, &b, &x->lay[l], ctx, n, pos0 + t0, x->lay[l].cache + (size_t)(pos0 + t0) * W, cs);
        arena_rewind(&x->ar, mark);
        x->have = pos0 + t0 + n;
    }
}

/* the waiting taps become rows (a failure leaves them dropped: no context past `have`) */
static void flush(dspark *x)
{
    int n = x->npend;
    x->npend = 0;
    if (n > 0)
        project(x, x->pend, x->have, n);
}

/* the target's taps of positions pos0 .. pos0+T-1 [T][ntaps][Ht] (the concatenation, in
 * target_layer_ids order) wait in pend; a pass with more than pend holds makes its rows now */
static void ds_on_taps(void *ud, int pos0, int T, const float *taps)
{
    dspark *x = ud;
    errbuf err;
    if (pos0 > x->have + x->npend)
        return; /* a gap (positions run before this drafter was attached): no context past it */
    if (pos0 < x->have) { /* rows from pos0 on are rewritten: until then this drafter knows nothing past it */
        x->have = pos0;
        x->npend = 0;
    } else {
        x->npend = pos0 - x->have;
    }
    if (grow(x, pos0 + T, &err) != 0) {
        x->npend = 0;
        return;
    }
    if (x->npend + T > x->pend_cap)
        flush(x);
    if (x->have + x->npend != pos0)
        return; /* a flush failed: no context past it */
    if (T > x->pend_cap) {
        project(x, taps, pos0, T);
        return;
    }
    size_t in = (size_t)x->ntaps * x->Ht;
    x->pend_ready = ready_ahead(x->pend, in, x->pend_ready, x->npend + T, x->pend_cap);
    memcpy(x->pend + (size_t)x->npend * in, taps, sizeof(float) * in * (size_t)T);
    x->npend += T;
}

/* the rows a block attends to: the context rows t < p, then the block's own */
struct ds_rows {
    const float *cache, *kb;
    int p;
    size_t W;
};

static const float *ds_row(const void *ud, int s)
{
    const struct ds_rows *r = ud;
    return s < r->p ? r->cache + (size_t)s * r->W : r->kb + (size_t)(s - r->p) * r->W;
}

/* One layer's attention for the K block rows q [K][nh][nope+rope] over the context rows t < p and
 * the block's own rows kb [K][kv_lora + rope], in absorbed form (blk_mla_query): every block row
 * sees every context row and every block row. */
static int attend(dspark *x, const ds_layer *ly, const float *q, const float *kb, int p, float *o, errbuf *err)
{
    const hparams *hp = &x->hp;
    const kern_ops *k = x->e->k;
    int nh = hp->n_heads, nope = hp->qk_nope, rope = hp->qk_rope, r = hp->kv_lora_rank, vd = hp->v_head;
    int K = x->K, n = p + K;
    float *wk = scratch(x, (size_t)nope * r, err), *wv = scratch(x, (size_t)vd * r, err);
    float *sc = x->sc; /* [2 r + cap + K]: grows with the context rows */
    assert(n <= x->cap + K); /* ds_block drafts only within the rows it has */
    if (!wk || !wv)
        return -1;
    struct ds_rows rows = {ly->cache, kb, p, (size_t)r + rope};
    for (int h = 0; h < nh; h++) {
        int row = h * (nope + vd);
        k->decode_rows(&ly->kv_b, row, row + nope, wk);
        k->decode_rows(&ly->kv_b, row + nope, row + nope + vd, wv);
        for (int t = 0; t < K; t++)
            blk_mla_query(k, hp, x->scale, q + ((size_t)t * nh + h) * (nope + rope), wk, wv, n, ds_row, &rows, sc,
                          o + ((size_t)t * nh + h) * vd);
    }
    return 0;
}

/* The block for seq[0..n): m drafts into out (and, when logits is not NULL, each one's logits
 * [m][vocab]); the count, 0 without context, -1 on error. */
static int ds_block(dspark *x, const int32_t *seq, int n, int k, int32_t *out, float *logits, errbuf *err)
{
    int p = n - 1; /* the anchor's position: context is every position before it */
    flush(x);
    if (p < 1 || x->have < p)
        return 0; /* the target has not handed over its taps up to here */
    const hparams *hp = &x->hp;
    const model *tm = x->e->m;
    int H = hp->hidden, K = x->K, nh = hp->n_heads, qd = hp->qk_nope + hp->qk_rope, W = hp->kv_lora_rank + hp->qk_rope;
    size_t mark = arena_mark(&x->ar);
    blk b = blk_of(x, err);
    int rc = -1;
    float *h = scratch(x, (size_t)K * H, err), *y = scratch(x, (size_t)K * H, err), *a = scratch(x, (size_t)K * H, err);
    float *cq = scratch(x, (size_t)K * hp->q_lora_rank, err), *qq = scratch(x, (size_t)K * nh * qd, err);
    float *kb = scratch(x, (size_t)K * W, err), *o = scratch(x, (size_t)K * nh * hp->v_head, err);
    float *g = scratch(x, (size_t)K * x->inter, err), *u = scratch(x, (size_t)K * x->inter, err);
    float *cs = scratch(x, (size_t)hp->rope_dim, err), *bias = scratch(x, (size_t)x->vocab, err);
    float *m1 = scratch(x, (size_t)x->R, err);
    if (!h || !y || !a || !cq || !qq || !kb || !o || !g || !u || !cs || !bias || !m1)
        goto out;
    for (int t = 0; t < K; t++) {
        int32_t id = t == 0 ? seq[p] : x->mask_id;
        x->e->k->decode_rows(&tm->embed, id, id + 1, h + (size_t)t * H);
    }
    for (int l = 0; l < x->L; l++) {
        const ds_layer *ly = &x->lay[l];
        blk_rmsnorm(&b, h, ly->in_norm, K, H, hp->rms_eps, y);
        blk_matmul(&b, &ly->q_a, y, K, cq);
        blk_rmsnorm(&b, cq, ly->q_a_norm, K, hp->q_lora_rank, hp->rms_eps, cq);
        blk_matmul(&b, &ly->q_b, cq, K, qq);
        for (int t = 0; t < K; t++) {
            blk_rope_table(hp, p + t, cs);
            for (int hh = 0; hh < nh; hh++)
                blk_rope_apply(hp, qq + ((size_t)t * nh + hh) * qd + hp->qk_nope, cs);
        }
        kv_rows(x, &b, ly, y, K, p, kb, cs);
        if (attend(x, ly, qq, kb, p, o, err) != 0)
            goto out;
        blk_matmul(&b, &ly->o, o, K, a);
        for (size_t i = 0; i < (size_t)K * H; i++)
            h[i] += a[i];
        blk_rmsnorm(&b, h, ly->post_norm, K, H, hp->rms_eps, y);
        blk_matmul(&b, &ly->gate, y, K, g);
        blk_matmul(&b, &ly->up, y, K, u);
        blk_glu(&b, g, u, (size_t)K * x->inter); /* hp.act = SiLU */
        blk_matmul(&b, &ly->down, g, K, a);
        for (size_t i = 0; i < (size_t)K * H; i++)
            h[i] += a[i];
    }
    int m = k < K ? k : K; /* every row shaped the block; only the m drafted need the lm_head */
    blk_rmsnorm(&b, h, x->final_norm, m, H, hp->rms_eps, h);
    blk_matmul(&b, &tm->lm_head, h, m, x->U);
    int32_t prev = seq[p];
    for (int t = 0; t < m; t++) { /* the Markov bias, in order: each draft is the next one's prev */
        x->e->k->decode_rows(&x->mw1, prev, prev + 1, m1);
        blk_matmul(&b, &x->mw2, m1, 1, bias);
        float *lg = x->U + (size_t)t * x->vocab;
        for (int v = 0; v < x->vocab; v++)
            lg[v] += bias[v];
        out[t] = prev = sampler_argmax(lg, x->vocab);
        if (logits)
            memcpy(logits + (size_t)t * x->vocab, lg, sizeof(float) * (size_t)x->vocab);
    }
    rc = m;
out:
    arena_rewind(&x->ar, mark);
    return rc;
}

/* whatever k, a block; its context rows are made from taps the target's passes hand over */
static double ds_cost(drafter *d, int n, int k, double *once)
{
    const dspark *x = (const dspark *)d;
    (void)n;
    (void)k;
    *once = x->npend * x->cost_row; /* the waiting rows */
    return x->cost_ask;
}

static int ds_propose(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **q, errbuf *err)
{
    *q = NULL;
    return ds_block((dspark *)d, seq, n, k, out, NULL, err);
}

int draft_dspark_logits(drafter *d, const int32_t *seq, int n, float *logits, int32_t *ids, errbuf *err)
{
    dspark *x = (dspark *)d;
    return ds_block(x, seq, n, x->K, ids, logits, err);
}

static void ds_feedback(drafter *d, int proposed, int accepted)
{
    (void)d;
    (void)proposed;
    (void)accepted;
}

static void ds_reset(drafter *d)
{
    dspark *x = (dspark *)d;
    x->have = x->npend = 0;
}

static void ds_free(drafter *d)
{
    dspark *x = (dspark *)d;
    if (!x)
        return;
    for (int l = 0; l < x->L; l++)
        free(x->lay[l].cache);
    free(x->U);
    free(x->pend);
    free(x->sc);
    arena_free(&x->ar);
    model_free(&x->m);
    free(x);
}

static int bind(dspark *x, errbuf *err)
{
    model *m = &x->m;
    const hparams *hp = &x->hp;
    int H = hp->hidden, nh = hp->n_heads, qd = hp->qk_nope + hp->qk_rope;
    if (model_mat(m, &x->ctx_proj, H, x->ntaps * x->Ht, err, "context_proj") ||
        model_vec(m, &x->ctx_norm, H, 0, err, "context_norm.weight") ||
        model_vec(m, &x->final_norm, H, 0, err, "final_norm.weight") ||
        model_mat(m, &x->mw1, x->vocab, x->R, err, "markov_head.markov_w1") ||
        model_mat(m, &x->mw2, x->vocab, x->R, err, "markov_head.markov_w2"))
        return -1;
    for (int l = 0; l < x->L; l++) {
        ds_layer *ly = &x->lay[l];
        char p[64], a[80];
        snprintf(p, sizeof p, "layers.%d.", l);
        snprintf(a, sizeof a, "%sself_attn.", p);
        if (model_vec(m, &ly->in_norm, H, 0, err, "%sinput_layernorm.weight", p) ||
            model_vec(m, &ly->post_norm, H, 0, err, "%spost_attention_layernorm.weight", p) ||
            model_mat(m, &ly->q_a, hp->q_lora_rank, H, err, "%sq_a_proj", a) ||
            model_vec(m, &ly->q_a_norm, hp->q_lora_rank, 0, err, "%sq_a_layernorm.weight", a) ||
            model_mat(m, &ly->q_b, nh * qd, hp->q_lora_rank, err, "%sq_b_proj", a) ||
            model_mat(m, &ly->kv_a, hp->kv_lora_rank + hp->qk_rope, H, err, "%skv_a_proj_with_mqa", a) ||
            model_vec(m, &ly->kv_a_norm, hp->kv_lora_rank, 0, err, "%skv_a_layernorm.weight", a) ||
            model_mat(m, &ly->kv_b, nh * (hp->qk_nope + hp->v_head), hp->kv_lora_rank, err, "%skv_b_proj", a) ||
            model_mat(m, &ly->o, H, nh * hp->v_head, err, "%so_proj", a) ||
            model_mat(m, &ly->gate, x->inter, H, err, "%smlp.gate_proj", p) ||
            model_mat(m, &ly->up, x->inter, H, err, "%smlp.up_proj", p) ||
            model_mat(m, &ly->down, H, x->inter, err, "%smlp.down_proj", p))
            return -1;
    }
    return 0;
}

/* The config: widths, the target it reads (its hidden size, its layers), RoPE; checked against
 * the target. */
static int configure(dspark *x, const json_t *c, const char *where, const hparams *target, errbuf *err)
{
    hparams *hp = &x->hp;
    memset(hp, 0, sizeof *hp);
    const json_t *tl = json_object_get(c, "target_layer_ids");
    if (cfg_int_of(c, "hidden_size", &hp->hidden, where, err) ||
        cfg_int_of(c, "intermediate_size", &x->inter, where, err) ||
        cfg_int_of(c, "num_hidden_layers", &x->L, where, err) ||
        cfg_int_of(c, "num_attention_heads", &hp->n_heads, where, err) ||
        cfg_int_of(c, "q_lora_rank", &hp->q_lora_rank, where, err) ||
        cfg_int_of(c, "kv_lora_rank", &hp->kv_lora_rank, where, err) ||
        cfg_int_of(c, "qk_nope_head_dim", &hp->qk_nope, where, err) ||
        cfg_int_of(c, "qk_rope_head_dim", &hp->qk_rope, where, err) ||
        cfg_int_of(c, "v_head_dim", &hp->v_head, where, err) ||
        cfg_int_of(c, "mask_token_id", &x->mask_id, where, err) || cfg_int_of(c, "markov_rank", &x->R, where, err) ||
        cfg_int_of(c, json_object_get(c, "draft_vocab_size") ? "draft_vocab_size" : "vocab_size", &x->vocab, where,
                   err) ||
        cfg_int_of(c, "target_hidden_size", &x->Ht, where, err))
        return -1;
    /* the release names no block size: it drafts 7 (num_speculative_tokens where given) */
    const char *bk = json_object_get(c, "block_size") ? "block_size" : "num_speculative_tokens";
    x->K = 7;
    if (json_object_get(c, bk) && cfg_int_of(c, bk, &x->K, where, err))
        return -1;
    /* what this file computes: MLA with RoPE, no output gate, SiLU */
    const json_t *act = json_object_get(c, "hidden_act");
    if (json_is_true(json_object_get(c, "mla_use_nope")))
        return errbuf_set(err, "%s: mla_use_nope true (attention without RoPE) is not what DSpark drafters here run", where);
    if (json_is_true(json_object_get(c, "mla_use_output_gate")))
        return errbuf_set(err, "%s: mla_use_output_gate true is not what DSpark drafters here run", where);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return errbuf_set(err, "%s: hidden_act must be \"silu\"", where);
    const json_t *eps = json_object_get(c, "rms_norm_eps");
    hp->rms_eps = json_is_number(eps) ? (float)json_number_value(eps) : 1e-5f;
    if (x->L > DS_MAX_LAYERS || x->K > DS_MAX_BLOCK || x->K < 2 || !json_is_array(tl) || json_array_size(tl) < 1 ||
        json_array_size(tl) > DS_MAX_TAPS)
        return errbuf_set(err, "%s: at most %d layers, a block of 2..%d, 1..%d target_layer_ids", where,
                          DS_MAX_LAYERS, DS_MAX_BLOCK, DS_MAX_TAPS);
    x->ntaps = (int)json_array_size(tl);
    for (int j = 0; j < x->ntaps; j++) {
        const json_t *v = json_array_get(tl, (size_t)j);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= target->n_layers)
            return errbuf_set(err, "%s: target_layer_ids[%d] is not a layer of the target (0..%d)", where, j,
                              target->n_layers - 1);
        x->taps[j] = (int)json_integer_value(v);
    }
    if (x->Ht != target->hidden || x->vocab != target->vocab || x->mask_id >= target->vocab)
        return errbuf_set(err, "%s: drafts for a model of hidden size %d and vocabulary %d; the target has %d and %d",
                          where, x->Ht, x->vocab, target->hidden, target->vocab);
    if (hp->hidden != target->hidden)
        return errbuf_set(err, "%s: hidden_size %d differs from the target's %d (their embedding is shared)", where,
                          hp->hidden, target->hidden);
    hp->n_layers = x->L;
    hp->vocab = x->vocab;
    hp->act = ACT_SILU;
    hp->rope = ROPE_INTERLEAVED;
    hp->rope_dim = hp->qk_rope;
    /* the table in float32 as the drafter's own code computes it: no dtype rounding */
    json_t *rc = json_pack("{s:O}", "rope_parameters", json_object_get(c, "rope_parameters"));
    double mscale2 = 1.0;
    int r = rc ? model_rope(hp, rc, where, &mscale2, err) : errbuf_set(err, "%s: out of memory", where);
    json_decref(rc);
    if (r != 0)
        return -1;
    x->scale = (float)(mscale2 / sqrt((double)(hp->qk_nope + hp->qk_rope)));
    return 0;
}

int draft_dspark_new(const draft_ctx *c, const char *dir, drafter **out, errbuf *err)
{
    *out = NULL;
    char where[4200];
    snprintf(where, sizeof where, "%s/config.json", dir);
    json_t *cfg = jsonr_load_file(where, err);
    if (!cfg)
        return -1;
    dspark *x = calloc(1, sizeof *x);
    if (!x) {
        json_decref(cfg);
        return errbuf_set(err, "DSpark: out of memory");
    }
    x->e = c->target;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    int rc = -1;
    if (!mt || strcmp(mt, "k3_dspark") != 0) {
        errbuf_set(err, "%s: model_type '%s' is not k3_dspark", where, mt ? mt : "");
        goto out;
    }
    if (configure(x, cfg, where, engine_hparams(c->target), err) != 0)
        goto out;
    memset(&x->m, 0, sizeof x->m);
    snprintf(x->m.dir, sizeof x->m.dir, "%s", dir);
    model_scope(&x->m, MODEL_PART_GLOBAL, -1, -1, MODEL_ROLE_OTHER);
    if (st_open_dir(&x->m.st, dir, err) != 0 || bind(x, err) != 0)
        goto out;
    x->m.hp = x->hp;
    size_t W = (size_t)x->hp.kv_lora_rank + x->hp.qk_rope, H = (size_t)x->hp.hidden, K = (size_t)x->K;
    size_t nh = (size_t)x->hp.n_heads, qd = (size_t)x->hp.qk_nope + x->hp.qk_rope;
    size_t step = K * (3 * H + (size_t)x->hp.q_lora_rank + nh * qd + W + nh * (size_t)x->hp.v_head + 2 * (size_t)x->inter) +
                  (size_t)x->hp.qk_nope * x->hp.kv_lora_rank + (size_t)x->hp.v_head * x->hp.kv_lora_rank +
                  (size_t)x->vocab + (size_t)x->R + (size_t)x->hp.rope_dim;
    size_t taps = DS_TAP_CHUNK * ((size_t)x->hp.hidden + (size_t)x->hp.rope_dim); /* context rows of a chunk */
    x->U = malloc(sizeof(float) * K * (size_t)x->vocab);
    size_t in = (size_t)x->ntaps * x->Ht, cap = DS_PEND_BYTES / (sizeof(float) * in);
    if (c->context > 0 && cap > (size_t)c->context)
        cap = (size_t)c->context;
    x->pend_cap = cap > DS_TAP_CHUNK ? (int)cap : DS_TAP_CHUNK;
    x->pend = malloc(sizeof(float) * (size_t)x->pend_cap * in);
    if (!x->U || !x->pend || arena_init(&x->ar, (step + taps + 64 * 32) * sizeof(float) + (1u << 20)) != 0) {
        errbuf_set(err, "DSpark: out of memory");
        goto out;
    }
    mem_populate(x->U, sizeof(float) * K * (size_t)x->vocab); /* an ask's first write is not its cost */
    mem_populate(x->ar.base, x->ar.cap);
    /* rows for the session's context up front (a decode step then allocates nothing), up to
     * DS_RESERVE positions; a longer context grows its rows as the attention caches do */
    if (c->context > 0 && grow(x, c->context < DS_RESERVE ? c->context : DS_RESERVE, err) != 0)
        goto out;
    size_t cols = x->m.max_cols > (size_t)x->ntaps * x->Ht ? x->m.max_cols : (size_t)x->ntaps * x->Ht;
    if (pool_reserve(x->e->pool, kern_scratch_floats(cols) * sizeof(float), err) != 0)
        goto out;
    /* a block runs its K positions through its weights and the target's lm_head (BF16 taken), what
     * a plain target pass runs one position through */
    double own = 0;
    for (int i = 0; i < x->m.n_bind; i++)
        own += (double)x->m.bind[i].len;
    const hparams *th = engine_hparams(c->target);
    x->cost_ask = (double)K * (own + 2.0 * th->vocab * th->hidden) / (double)(engine_active_bytes(c->target) + 1);
    double row = (double)x->ctx_proj.rows * x->ctx_proj.cols * 2.0; /* (BF16 taken) */
    for (int l = 0; l < x->L; l++)
        row += (double)x->lay[l].kv_a.rows * x->lay[l].kv_a.cols * 2.0;
    x->cost_row = row / (double)(engine_active_bytes(c->target) + 1);
    x->d = (drafter){.name = "dspark",
                     .cost = ds_cost,
                     .propose = ds_propose,
                     .feedback = ds_feedback,
                     .taps = x->taps,
                     .n_taps = x->ntaps,
                     .on_taps = ds_on_taps,
                     .reset = ds_reset,
                     .free = ds_free};
    *out = &x->d;
    rc = 0;
out:
    json_decref(cfg);
    if (rc)
        ds_free(&x->d);
    return rc;
}
