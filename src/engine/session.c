/* session.c — a sequence the engine holds: its tokens, state, logits, partial commits and the
 * prefix reuse of session_sync (engine.h; invariants in engine_int.h).
 *
 * Reuse: the attention caches are indexed by position, so after any prefix of the history they
 * are simply "the first p rows". KDA's recurrent state cannot be rewound, so going back to
 * position p needs a copy of it taken at p: a checkpoint. session_sync keeps checkpoints where
 * each sync ends (the end of a prompt, where a conversation continues) and every ckpt_every
 * positions of a long sync, within ckpt_budget bytes; when the budget is spent, the checkpoint
 * closest to its predecessor goes (the survivors stay spread over the history). A model without
 * KDA needs none: every position is a checkpoint for free.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "engine/engine_int.h"

void session_opts_default(session_opts *o)
{
    memset(o, 0, sizeof *o);
    o->context = 4096;
    o->max_pass = 256;
    o->max_logits = 16;
    o->max_commit = 16;
    o->ckpt_budget = 256ull << 20;
    o->ckpt_every = 1024;
}

static size_t kda_floats(const hparams *hp)
{
    size_t P = (size_t)hp->kda_heads * hp->kda_dim;
    return (size_t)hp->kda_heads * hp->kda_dim * hp->kda_dim + 3 * (size_t)(hp->conv_k - 1) * P;
}

/* Host memory, faulted in now: the decode writes it row by row, or first at a verify pass, and a
 * page first written there costs that step a fault (base/mem.h). */
static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) != 0)
        return NULL;
    mem_populate(p, (n ? n : 1) * sizeof(float));
    return p;
}

/* Memory the passes read and write: the backend's (a device's), or the host's. */
static float *session_mem(session *s, size_t n)
{
    const backend_ops *be = s->e->be;
    return be->mem_alloc ? be->mem_alloc(s->e->be_dev, (n ? n : 1) * sizeof(float)) : alloc_floats(n);
}

static void session_mem_free(session *s, void *p)
{
    const backend_ops *be = s->e->be;
    if (be->mem_alloc) {
        if (p)
            be->mem_free(s->e->be_dev, p);
    } else {
        free(p);
    }
}

/* Copies and zeroes of that memory, which may be the device's */
static void session_copy(session *s, void *dst, const void *src, size_t bytes)
{
    const backend_ops *be = s->e->be;
    if (be->mem_copy)
        be->mem_copy(s->e->be_dev, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

static void session_zero(session *s, void *p, size_t bytes)
{
    const backend_ops *be = s->e->be;
    if (be->mem_zero)
        be->mem_zero(s->e->be_dev, p, bytes);
    else
        memset(p, 0, bytes);
}

static void ckpt_drop_all(session *s)
{
    for (int i = 0; i < s->nck; i++)
        free(s->ck[i].rec);
    s->nck = 0;
    s->st.ckpts = 0;
    s->st.ckpt_bytes = 0;
}

/* Room for positions below `need` (<= context): cache chunks, history, per-thread scratch for
 * scores over that many positions. On failure nothing the session holds changes. */
static int grow(session *s, int need, errbuf *err)
{
    const hparams *hp = s->hp;
    int old_cap = s->cap;
    while (s->cap < need) {
        if (s->nchunks == s->chunk_cap) {
            int nc = s->chunk_cap ? 2 * s->chunk_cap : 16;
            float **cm = realloc(s->chunk_mem, sizeof *cm * (size_t)nc);
            if (!cm)
                goto oom;
            s->chunk_mem = cm;
            for (int i = 0; i < hp->n_layers; i++)
                if (hp->attn_kind[i] != ATTN_KDA) {
                    float **kv = realloc(s->L[i].kv, sizeof *kv * (size_t)nc);
                    if (!kv)
                        goto oom;
                    s->L[i].kv = kv;
                }
            s->chunk_cap = nc;
        }
        float *blk = session_mem(s, s->chunk_floats);
        if (!blk)
            goto oom;
        s->chunk_mem[s->nchunks] = blk;
        for (int i = 0; i < hp->n_layers; i++)
            if (hp->attn_kind[i] != ATTN_KDA)
                s->L[i].kv[s->nchunks] = blk + s->chunk_off[i];
        s->nchunks++;
        s->cap += BLK_KV_CHUNK;
    }
    if (s->cap != old_cap || !s->hist) {
        int32_t *h = realloc(s->hist, sizeof *h * (size_t)s->cap);
        if (!h)
            goto oom;
        s->hist = h;
        if (pool_reserve(s->e->pool, pass_thread_floats(s->m, s->cap) * sizeof(float), err) != 0)
            return -1;
    }
    return 0;
oom: /* the chunks added stay (they are simply unused room); cap says what is whole */
    return errbuf_set(err, "out of memory at position %d: the session's caches could not grow past %d positions",
                      s->cap, s->cap);
}

void session_free(session *s)
{
    if (!s)
        return;
    ckpt_drop_all(s);
    free(s->ck);
    free(s->hist);
    free(s->rec_off);
    session_mem_free(s, s->rec[0]);
    session_mem_free(s, s->rec[1]);
    for (int c = 0; c < s->nchunks; c++)
        session_mem_free(s, s->chunk_mem[c]);
    free(s->chunk_mem);
    if (s->L)
        for (int i = 0; i < s->hp->n_layers; i++)
            free(s->L[i].kv);
    free(s->L);
    free(s->chunk_off);
    session_mem_free(s, s->log);
    free(s->lg);
    free(s->sink_layers);
    free(s->sink_buf);
    if (s->e->be->mem_alloc)
        session_mem_free(s, s->ar.base);
    else
        arena_free(&s->ar);
    if (s->e) {
        int was = atomic_fetch_sub(&s->e->sessions, 1);
        assert(was > 0);
        (void)was;
    }
    free(s);
}

int session_new(engine *e, const session_opts *o, session **out, errbuf *err)
{
    *out = NULL;
    const model *m = e->m;
    const hparams *hp = &m->hp;
    if (o->context < 1 || o->max_pass < 1 || o->max_logits < 1 || o->max_commit < 0 || o->ckpt_every < 0 ||
        o->prefill_chunk < 0)
        return errbuf_set(err, "session: context %d, pass size %d and logits %d must be positive", o->context,
                          o->max_pass, o->max_logits);
    if (engine_enter(e, err))
        return -1;
    session *s = calloc(1, sizeof *s);
    int rc = -1;
    if (!s) {
        errbuf_set(err, "session: out of memory");
        goto out;
    }
    s->e = e;
    atomic_fetch_add(&e->sessions, 1);
    s->m = m;
    s->hp = hp;
    s->o = *o;
    if (hp->ctx_len > 0 && s->o.context > hp->ctx_len)
        s->o.context = hp->ctx_len; /* the model's own limit */
    if (s->o.max_pass > s->o.context)
        s->o.max_pass = s->o.context;
    if (s->o.max_logits > s->o.max_pass)
        s->o.max_logits = s->o.max_pass;
    if (s->o.max_commit > s->o.max_pass)
        s->o.max_commit = s->o.max_pass;
    s->L = calloc((size_t)hp->n_layers, sizeof *s->L);
    s->rec_off = calloc((size_t)hp->n_layers, sizeof *s->rec_off);
    s->chunk_off = calloc((size_t)hp->n_layers, sizeof *s->chunk_off);
    if (!s->L || !s->rec_off || !s->chunk_off) {
        errbuf_set(err, "session: out of memory");
        goto out;
    }
    for (int i = 0; i < hp->n_layers; i++) {
        if (hp->attn_kind[i] == ATTN_KDA) {
            s->rec_off[i] = s->rec_floats;
            s->rec_floats += kda_floats(hp);
            s->n_kda++;
        } else {
            s->chunk_off[i] = s->chunk_floats;
            s->chunk_floats += engine_cache_width(hp, hp->attn_kind[i]) * BLK_KV_CHUNK;
        }
    }
    s->log_floats = s->n_kda ? blk_kda_log_floats(hp) : 0;
    size_t logn = (size_t)s->n_kda * (size_t)s->o.max_commit * s->log_floats;
    s->rec[0] = session_mem(s, s->rec_floats);
    s->rec[1] = session_mem(s, s->rec_floats);
    s->log = session_mem(s, logn);
    s->lg = alloc_floats((size_t)s->o.max_logits * hp->vocab);
    if (!s->rec[0] || !s->rec[1] || !s->log || !s->lg) {
        errbuf_set(err, "session: out of memory for its state (%zu MiB)", ((2 * s->rec_floats + logn) * 4) >> 20);
        goto out;
    }
    s->st.log_bytes = logn * sizeof(float);
    size_t ar_bytes = pass_floats(m, s->o.max_pass) * sizeof(float);
    void *ar_dev = e->be->mem_alloc ? e->be->mem_alloc(e->be_dev, ar_bytes) : NULL;
    if (ar_dev)
        arena_init_at(&s->ar, ar_dev, ar_bytes);
    if (e->be->mem_alloc ? !ar_dev : arena_init(&s->ar, ar_bytes) != 0) {
        errbuf_set(err, "session: out of memory for pass scratch (%d tokens)", s->o.max_pass);
        goto out;
    }
    if (grow(s, BLK_KV_CHUNK < s->o.context ? BLK_KV_CHUNK : s->o.context, err) != 0)
        goto out;
    session_zero(s, s->rec[0], s->rec_floats * sizeof(float));
    s->lg_pos = -1;
    *out = s;
    rc = 0;
out:
    engine_leave(e);
    if (rc)
        session_free(s);
    return rc;
}

void session_reset(session *s)
{
    ckpt_drop_all(s);
    s->n = 0;
    s->pend_T = 0;
    s->cur = 0;
    s->lg_pos = -1;
    s->lg_n = 0;
    session_zero(s, s->rec[0], s->rec_floats * sizeof(float));
}

static int commit(session *s, int n_keep, errbuf *err);
static void ckpt_take(session *s);
int session_grow(session *s, int need, errbuf *err) { return grow(s, need, err); }
void session_ckpt_take(session *s) { ckpt_take(s); }
int session_keep_pending(session *s, errbuf *err) { return commit(s, s->pend_T, err); }

int session_len(const session *s) { return s->n + s->pend_T; }
int session_max_pass(const session *s) { return s->o.max_pass; }
int session_max_commit(const session *s) { return s->o.max_commit; }

int session_set_tap_sink(session *s, const int *layers, int n, session_tap_fn fn, void *ud, errbuf *err)
{
    free(s->sink_layers);
    free(s->sink_buf);
    s->sink_layers = NULL;
    s->sink_buf = NULL;
    s->sink_n = 0;
    if (n <= 0)
        return 0;
    for (int j = 0; j < n; j++)
        if (layers[j] < 0 || layers[j] >= s->hp->n_layers)
            return errbuf_set(err, "session: tap of layer %d (the model has %d)", layers[j], s->hp->n_layers);
    s->sink_layers = malloc(sizeof(int) * (size_t)n);
    s->sink_buf = alloc_floats((size_t)s->o.max_pass * (size_t)n * (size_t)s->hp->hidden);
    if (!s->sink_layers || !s->sink_buf) {
        free(s->sink_layers);
        free(s->sink_buf);
        s->sink_layers = NULL;
        s->sink_buf = NULL;
        return errbuf_set(err, "session: out of memory for taps");
    }
    memcpy(s->sink_layers, layers, sizeof(int) * (size_t)n);
    s->sink_n = n;
    s->sink_fn = fn;
    s->sink_ud = ud;
    return 0;
}
const int32_t *session_tokens(const session *s) { return s->hist; }
int session_context(const session *s) { return s->o.context; }

void session_stats_get(const session *s, session_stats *out) { *out = s->st; }

const void *session_recurrent(const session *s, size_t *bytes)
{
    *bytes = s->rec_floats * sizeof(float);
    return s->rec[s->cur];
}

static const float *logits_at(const session *s, int pos)
{
    if (pos < 0 || pos >= session_len(s) || pos < s->lg_pos || pos >= s->lg_pos + s->lg_n)
        return NULL;
    return s->lg + (size_t)(pos - s->lg_pos) * s->hp->vocab;
}

const float *session_logits(const session *s, int t) { return t < 0 ? NULL : logits_at(s, s->pass_pos + t); }

const float *session_last_logits(const session *s) { return logits_at(s, session_len(s) - 1); }

/* A pass of T tokens at position n; nothing of s changes unless it succeeds. */
static int run_tokens(session *s, const int32_t *tokens, int T, int n_logits, const int *taps, int n_taps,
                      float *tap_out, errbuf *err)
{
    const hparams *hp = s->hp;
    if (T < 1 || T > s->o.max_pass)
        return errbuf_set(err, "session: a pass of %d tokens (this session runs 1..%d)", T, s->o.max_pass);
    if (n_logits < 0 || n_logits > T || n_logits > s->o.max_logits)
        return errbuf_set(err, "session: logits for %d of %d positions (at most %d)", n_logits, T, s->o.max_logits);
    if (s->n + T > s->o.context)
        return errbuf_set(err, "context full at position %d: the session holds %d positions%s", s->o.context,
                          s->o.context, s->o.context == s->hp->ctx_len ? " (the model's max_position_embeddings)" : "");
    if (s->n + T > s->cap && grow(s, s->n + T, err) != 0)
        return -1;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->vocab)
            return errbuf_set(err, "token id %d at position %d is outside the vocabulary (0..%d)", tokens[t],
                              s->n + t, hp->vocab - 1);
    for (int j = 0; j < n_taps; j++)
        if (taps[j] < 0 || taps[j] >= hp->n_layers)
            return errbuf_set(err, "session: tap of layer %d (the model has %d)", taps[j], hp->n_layers);
    if (n_taps > 0 && !tap_out)
        return errbuf_set(err, "session: taps asked for without a buffer");
    if (n_taps > 0 && s->sink_n > 0)
        return errbuf_set(err, "session: a pass asked for taps while a tap sink is set");
    if (s->sink_n > 0) {
        taps = s->sink_layers;
        n_taps = s->sink_n;
        tap_out = s->sink_buf;
    }
    /* a pass of one position is kept whole or not at all, so its log would never be replayed (K3's
     * would copy 4 x 12288 floats, 196 KB, a KDA layer) */
    int logged = s->n_kda > 0 && T > 1 && T <= s->o.max_commit;
    if (pass_run(s, tokens, T, n_logits, taps, n_taps, tap_out, logged, err) != 0)
        return -1;
    if (s->sink_n > 0)
        s->sink_fn(s->sink_ud, s->n, T, s->sink_buf);
    memmove(s->hist + s->n, tokens, sizeof *tokens * (size_t)T);
    s->pass_pos = s->n;
    s->pend_T = T;
    s->pend_logged = logged;
    s->st.passes++;
    s->st.positions_run += (uint64_t)T;
    return 0;
}

/* Keeps n_keep of the pending pass's T positions (see session_commit). */
static int commit(session *s, int n_keep, errbuf *err)
{
    int T = s->pend_T;
    if (n_keep < 0 || n_keep > T)
        return errbuf_set(err, "session: keep %d positions of a pass of %d", n_keep, T);
    if (T == 0)
        return 0;
    if (n_keep == T) {
        s->cur = !s->cur;
        s->n += T;
        s->pend_T = 0;
        return 0;
    }
    s->pend_T = 0; /* rec[cur] is still the state before the pass */
    if (n_keep == 0 || s->n_kda == 0) {
        s->n += n_keep;
        return 0;
    }
    assert(T > 1); /* (0 < n_keep < T) */
    if (!s->pend_logged) { /* a long pass: recompute the kept part (the same bits, weights read again) */
        if (pass_run(s, s->hist + s->n, n_keep, 0, NULL, 0, NULL, 0, err) != 0)
            return errbuf_prefix(err, "session: recomputing the %d kept positions", n_keep);
        s->cur = !s->cur;
        s->n += n_keep;
        s->st.recomputed += (uint64_t)n_keep;
        return 0;
    }
    size_t mark = arena_mark(&s->ar);
    blk b = {s->m, s->hp, s->e->k, s->e->pool, &s->ar, err, NULL, s->e->be_dev};
    const hparams *hp = s->hp;
    size_t S_floats = (size_t)hp->kda_heads * hp->kda_dim * hp->kda_dim;
    int kda = 0, rc = 0;
    for (int i = 0; i < hp->n_layers && rc == 0; i++) {
        if (hp->attn_kind[i] != ATTN_KDA)
            continue;
        layer_state st = {0};
        st.S = s->rec[s->cur] + s->rec_off[i];
        st.conv = st.S + S_floats;
        rc = s->e->be->replay(&b, i, &s->m->L[i].kda, &st,
                              s->log + (size_t)kda * s->o.max_commit * s->log_floats, n_keep);
        kda++;
    }
    arena_rewind(&s->ar, mark);
    if (rc) { /* the replay's scratch is within the pass arena's size: this cannot happen */
        session_reset(s);
        return errbuf_prefix(err, "session: commit");
    }
    s->n += n_keep;
    return 0;
}

int session_run(session *s, const session_pass *p, errbuf *err)
{
    if (engine_enter(s->e, err))
        return -1;
    int rc = commit(s, s->pend_T, err);
    if (rc == 0)
        rc = run_tokens(s, p->tokens, p->T, p->n_logits, p->taps, p->n_taps, p->tap_out, err);
    engine_leave(s->e);
    return rc;
}

int session_commit(session *s, int n_keep, errbuf *err)
{
    if (engine_enter(s->e, err))
        return -1;
    int rc = commit(s, n_keep, err);
    engine_leave(s->e);
    return rc;
}

/* ---- checkpoints ---- */

static uint64_t ckpt_size(const session *s) { return s->rec_floats * sizeof(float); }
/* what one checkpoint holds: the state, and room for the logits of its last position */
static uint64_t ckpt_bytes(const session *s) { return ckpt_size(s) + (uint64_t)s->hp->vocab * sizeof(float); }

/* Takes a checkpoint of rec[cur] at position n, within the budget. */
static void ckpt_take(session *s)
{
    uint64_t sz = ckpt_bytes(s);
    if (s->rec_floats == 0 || sz > s->o.ckpt_budget)
        return;
    for (int i = 0; i < s->nck; i++)
        if (s->ck[i].pos == s->n)
            return;
    float *buf = NULL;
    if ((uint64_t)(s->nck + 1) * sz > s->o.ckpt_budget) { /* evict: the one closest to its predecessor */
        int victim = -1, gap = 0;
        for (int i = 0; i < s->nck; i++) {
            int g = s->ck[i].pos - (i ? s->ck[i - 1].pos : 0);
            if (victim < 0 || g < gap) {
                victim = i;
                gap = g;
            }
        }
        buf = s->ck[victim].rec;
        memmove(s->ck + victim, s->ck + victim + 1, sizeof *s->ck * (size_t)(s->nck - victim - 1));
        s->nck--;
    }
    if (s->nck == s->cap_ck) {
        int cap = s->cap_ck ? 2 * s->cap_ck : 8;
        session_ckpt *nc = realloc(s->ck, sizeof *nc * (size_t)cap);
        if (!nc) {
            free(buf);
            goto count;
        }
        s->ck = nc;
        s->cap_ck = cap;
    }
    if (!buf && !(buf = alloc_floats(s->rec_floats + (size_t)s->hp->vocab)))
        goto count; /* a checkpoint is an optimisation: without memory there is none */
    session_copy(s, buf, s->rec[s->cur], ckpt_size(s));
    const float *lg = session_last_logits(s);
    if (lg)
        memcpy(buf + s->rec_floats, lg, sizeof(float) * (size_t)s->hp->vocab);
    int at = s->nck;
    while (at > 0 && s->ck[at - 1].pos > s->n)
        at--;
    memmove(s->ck + at + 1, s->ck + at, sizeof *s->ck * (size_t)(s->nck - at));
    s->ck[at] = (session_ckpt){s->n, buf, lg != NULL};
    s->nck++;
count:
    s->st.ckpts = s->nck;
    s->st.ckpt_bytes = (uint64_t)s->nck * sz;
    if (s->st.ckpt_bytes > s->st.ckpt_peak)
        s->st.ckpt_peak = s->st.ckpt_bytes;
}

/* Drops the checkpoints past position `keep` (their history changes). */
static void ckpt_drop_after(session *s, int keep)
{
    while (s->nck > 0 && s->ck[s->nck - 1].pos > keep)
        free(s->ck[--s->nck].rec);
    s->st.ckpts = s->nck;
    s->st.ckpt_bytes = (uint64_t)s->nck * ckpt_bytes(s);
}

/* Moves the state back to position p <= n: from a checkpoint at p (or position 0), or for free
 * when there is no recurrent state. */
static void rewind_to(session *s, int p)
{
    if (p == s->n)
        return;
    assert(p < s->n);
    if (s->rec_floats == 0) {
        s->n = p;
        return;
    }
    if (p == 0) {
        session_zero(s, s->rec[s->cur], s->rec_floats * sizeof(float));
    } else {
        int i = s->nck - 1;
        while (i >= 0 && s->ck[i].pos != p)
            i--;
        assert(i >= 0);
        session_copy(s, s->rec[s->cur], s->ck[i].rec, ckpt_size(s));
    }
    s->n = p;
}

int session_sync(session *s, const int32_t *ids, int n, errbuf *err)
{
    if (engine_enter(s->e, err))
        return -1;
    int rc = commit(s, s->pend_T, err);
    if (rc)
        goto out;
    if (n < 1) {
        rc = errbuf_set(err, "session: sync to an empty token list");
        goto out;
    }
    if (n > s->o.context) {
        rc = errbuf_set(err, "context full: %d tokens exceed the session's %d positions%s", n, s->o.context,
                        s->o.context == s->hp->ctx_len ? " (the model's max_position_embeddings)" : "");
        goto out;
    }
    s->st.syncs++;
    int lcp = 0;
    while (lcp < s->n && lcp < n && s->hist[lcp] == ids[lcp])
        lcp++;
    if (lcp == n && s->n == n && session_last_logits(s)) { /* already there */
        s->st.reused += (uint64_t)n;
        goto out;
    }
    if (lcp == n && s->rec_floats > 0) /* a sync that ended at n kept its logits: nothing to run */
        for (int i = 0; i < s->nck; i++)
            if (s->ck[i].pos == n && s->ck[i].has_lg) {
                ckpt_drop_after(s, n);
                rewind_to(s, n);
                memcpy(s->lg, s->ck[i].rec + s->rec_floats, sizeof(float) * (size_t)s->hp->vocab);
                s->lg_pos = n - 1;
                s->lg_n = 1;
                s->pass_pos = n - 1;
                s->st.reused += (uint64_t)n;
                goto out;
            }
    /* the latest reachable position at or before min(lcp, n - 1): the last token must run to give
     * its logits */
    int limit = lcp < n - 1 ? lcp : n - 1, p = 0; /* limit <= lcp <= s->n */
    if (s->rec_floats == 0 || s->n == limit)
        p = limit;
    else
        for (int i = 0; i < s->nck; i++)
            if (s->ck[i].pos <= limit)
                p = s->ck[i].pos;
    ckpt_drop_after(s, lcp);
    rewind_to(s, p);
    s->lg_n = 0;
    s->st.reused += (uint64_t)p;
    int every = s->o.ckpt_every;
    while (s->n < n && rc == 0) {
        int C = s->o.prefill_chunk > 0 && s->o.prefill_chunk < s->o.max_pass ? s->o.prefill_chunk : s->o.max_pass;
        int T = n - s->n < C ? n - s->n : C;
        if (every > 0 && s->rec_floats > 0) { /* end chunks on checkpoint positions */
            int next = (s->n / every + 1) * every;
            if (next < n && next - s->n < T)
                T = next - s->n;
        }
        int last = s->n + T == n;
        if ((rc = run_tokens(s, ids + s->n, T, last, NULL, 0, NULL, err)) == 0)
            rc = commit(s, T, err);
        if (rc == 0 && every > 0 && s->n % every == 0 && !last)
            ckpt_take(s);
    }
    if (rc == 0)
        ckpt_take(s);
out:
    engine_leave(s->e);
    return rc;
}
