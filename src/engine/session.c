/* session.c — session state, scratch sizing, and the layer-major pass (see session.h).
 *
 * Residual wiring: plain pre-norm residual (h += attn(norm h); h += ffn(norm h)) for every
 * family but K3, whose Block AttnRes keeps a stack of block sums and mixes them before each
 * sub-layer (spec: kimi-k3.md §5):
 *   x = mix(stack + [prefix]) unless the stack is empty; at a block boundary the raw prefix is
 *   pushed and the running sum restarts from the attention output; the FFN input is
 *   mix(stack + [prefix]); after the last layer h = mix(stack + [prefix]) before the final norm.
 */
#include "engine/session.h"

#include <stdlib.h>
#include <string.h>

static size_t kda_floats(const hparams *hp)
{
    size_t P = (size_t)hp->kda_heads * hp->kda_dim;
    return (size_t)hp->kda_heads * hp->kda_dim * hp->kda_dim + 3 * (size_t)(hp->conv_k - 1) * P;
}

static size_t cache_width(const hparams *hp, int kind)
{
    if (kind == ATTN_MLA)
        return (size_t)hp->kv_lora_rank + hp->qk_rope;
    if (kind == ATTN_GQA)
        return 2 * (size_t)hp->n_kv_heads * hp->head_dim;
    return 0;
}

static int n_stack_max(const hparams *hp)
{
    return hp->attnres_block > 0 ? (hp->n_layers + hp->attnres_block - 1) / hp->attnres_block : 0;
}

/* An upper bound on the floats one pass of T tokens takes from the arena: the pass's own
 * buffers plus the sum of every buffer any block kind allocates (only one block's scratch is
 * live at a time, so summing over kinds over-approximates), plus alignment slack. */
static size_t pass_floats(const hparams *hp, const model *m, int T)
{
    size_t H = (size_t)hp->hidden, P = (size_t)hp->kda_heads * hp->kda_dim, per = 0;
    per += H * (8 + (size_t)n_stack_max(hp));
    int has_kda = 0, has_mla = 0, has_gqa = 0, has_dense = 0, has_moe = 0;
    for (int i = 0; i < hp->n_layers; i++) {
        has_kda |= hp->attn_kind[i] == ATTN_KDA;
        has_mla |= hp->attn_kind[i] == ATTN_MLA;
        has_gqa |= hp->attn_kind[i] == ATTN_GQA;
        has_dense |= hp->ffn_kind[i] == FFN_DENSE;
        has_moe |= hp->ffn_kind[i] == FFN_MOE;
    }
    size_t rmax = 0;
    for (int i = 0; i < hp->n_layers; i++)
        if (hp->attn_kind[i] == ATTN_KDA) {
            rmax = rmax > (size_t)m->L[i].kda.f_a.rows ? rmax : (size_t)m->L[i].kda.f_a.rows;
            rmax = rmax > (size_t)m->L[i].kda.g_a.rows ? rmax : (size_t)m->L[i].kda.g_a.rows;
        }
    if (has_kda)
        per += 8 * P + 2 * rmax + (size_t)hp->kda_heads + 1;
    if (has_mla)
        per += (size_t)hp->n_heads * (hp->qk_nope + hp->qk_rope) + cache_width(hp, ATTN_MLA) +
               2 * (size_t)hp->n_heads * hp->v_head + (size_t)hp->q_lora_rank;
    if (has_gqa)
        per += 4 * (size_t)hp->n_heads * hp->head_dim;
    if (has_dense)
        per += 2 * (size_t)hp->dense_inter;
    if (has_moe) {
        size_t D = hp->latent ? (size_t)hp->latent : H, K = (size_t)hp->top_k;
        per += (size_t)hp->n_experts + 3 * K + K * D + 4 * D + 2 * (size_t)hp->moe_inter + H +
               2 * (size_t)hp->shared_inter;
    }
    /* router scores, the expert union and counting-sort starts, the lookahead's choices; the
     * last term covers each allocation's alignment */
    size_t E = (size_t)hp->n_experts, moe_fixed = has_moe ? 4 * E + 2 + 2 * (size_t)hp->top_k : 0;
    size_t fixed = moe_fixed + (size_t)hp->conv_k + (size_t)(hp->rope_dim + hp->head_dim) + 64 * 48;
    return per * (size_t)T + fixed + (size_t)T * 64;
}

/* Per-thread scratch for kernels and attention heads, in floats. */
static size_t thread_floats(const hparams *hp, const model *m, int cap)
{
    size_t need = kern_scratch_floats(m->max_cols);
    size_t r = (size_t)hp->kv_lora_rank, mla = (size_t)hp->qk_nope * r + (size_t)hp->v_head * r + 2 * r + (size_t)cap;
    size_t kda = 5 * (size_t)hp->kda_dim, gqa = (size_t)cap;
    if (mla > need)
        need = mla;
    if (kda > need)
        need = kda;
    if (gqa > need)
        need = gqa;
    return need + 64;
}

int session_init(session *s, const model *m, const kern_ops *k, pool *p, int cap, int max_T, errbuf *err)
{
    memset(s, 0, sizeof *s);
    const hparams *hp = &m->hp;
    if (cap < 1 || max_T < 1)
        return errbuf_set(err, "session: context %d and pass size %d must be positive", cap, max_T);
    if (max_T > cap)
        max_T = cap;
    s->m = m;
    s->k = k;
    s->pool = p;
    s->cap = cap;
    s->max_T = max_T;
    s->L = calloc((size_t)hp->n_layers, sizeof *s->L);
    size_t rec = 0, cache = 0;
    for (int i = 0; i < hp->n_layers; i++) {
        if (hp->attn_kind[i] == ATTN_KDA)
            rec += kda_floats(hp);
        else
            cache += cache_width(hp, hp->attn_kind[i]) * (size_t)cap;
    }
    s->rec_floats = rec;
    if (!s->L || posix_memalign((void **)&s->state_mem, 64, (rec + cache + 16) * sizeof(float)) != 0) {
        session_free(s);
        return errbuf_set(err, "session: out of memory for the state of %d positions (%zu MiB)", cap,
                          (rec + cache) * 4 >> 20);
    }
    float *rp = s->state_mem, *cp = s->state_mem + rec;
    for (int i = 0; i < hp->n_layers; i++) {
        if (hp->attn_kind[i] == ATTN_KDA) {
            s->L[i].S = rp;
            s->L[i].conv = rp + (size_t)hp->kda_heads * hp->kda_dim * hp->kda_dim;
            rp += kda_floats(hp);
        } else {
            s->L[i].kv = cp;
            cp += cache_width(hp, hp->attn_kind[i]) * (size_t)cap;
        }
    }
    if (arena_init(&s->ar, pass_floats(hp, m, max_T) * sizeof(float)) != 0) {
        session_free(s);
        return errbuf_set(err, "session: out of memory for pass scratch (%d tokens)", max_T);
    }
    if (pool_reserve(p, thread_floats(hp, m, cap) * sizeof(float), err) != 0) {
        session_free(s);
        return -1;
    }
    session_reset(s);
    return 0;
}

void session_free(session *s)
{
    free(s->L);
    free(s->state_mem);
    arena_free(&s->ar);
    memset(s, 0, sizeof *s);
}

void session_reset(session *s)
{
    s->n_pos = 0;
    s->poisoned = 0;
    memset(s->state_mem, 0, s->rec_floats * sizeof(float));
}

int session_ckpt_init(const session *s, session_ckpt *c, errbuf *err)
{
    c->n_pos = 0;
    c->rec = malloc((s->rec_floats ? s->rec_floats : 1) * sizeof(float));
    if (!c->rec)
        return errbuf_set(err, "checkpoint: out of memory (%zu MiB)", s->rec_floats * 4 >> 20);
    return 0;
}

void session_ckpt_free(session_ckpt *c)
{
    free(c->rec);
    c->rec = NULL;
}

void session_checkpoint(const session *s, session_ckpt *c)
{
    c->n_pos = s->n_pos;
    memcpy(c->rec, s->state_mem, s->rec_floats * sizeof(float));
}

void session_rollback(session *s, const session_ckpt *c)
{
    s->n_pos = c->n_pos;
    s->poisoned = 0;
    memcpy(s->state_mem, c->rec, s->rec_floats * sizeof(float));
}

/* Each block's scratch is released when it returns: only its output survives. */
static int run_attn(const blk *b, int i, const layer_w *L, layer_state *st, int pos0, const float *x, int T,
                    float *out)
{
    size_t mark = arena_mark(b->ar);
    int rc;
    switch (b->hp->attn_kind[i]) {
    case ATTN_KDA:
        rc = blk_kda(b, &L->kda, st, x, T, out);
        break;
    case ATTN_MLA:
        rc = blk_mla(b, &L->mla, st, pos0, x, T, out);
        break;
    default:
        rc = blk_gqa(b, &L->gqa, st, pos0, x, T, out);
    }
    arena_rewind(b->ar, mark);
    return rc;
}

static int run_ffn(const blk *b, int i, const layer_w *L, const float *x, int T, float *out)
{
    size_t mark = arena_mark(b->ar);
    int rc = b->hp->ffn_kind[i] == FFN_MOE ? blk_moe(b, i, &L->moe, x, T, out)
                                           : blk_mlp(b, &L->mlp, b->hp->dense_inter, x, T, out);
    arena_rewind(b->ar, mark);
    return rc;
}

/* AttnRes mix of stack[0..ns) and prefix, for each of T positions, into out. */
static void mix_rows(const blk *b, float *const *stack, int ns, const float *prefix, const float *u, int T,
                     float *out)
{
    int H = b->hp->hidden;
    const float *src[MODEL_MAX_BLOCKS + 1]; /* blocks + the current stream (cfg_validate bounds them) */
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < ns; j++)
            src[j] = stack[j] + (size_t)t * H;
        src[ns] = prefix + (size_t)t * H;
        blk_attnres_mix(b, src, ns + 1, u, H, out + (size_t)t * H);
    }
}

/* Router lookahead (the store's prefetch): before layer i's attention runs, its router is applied
 * to what its FFN input would be without that attention, the residual stream in (normed with
 * layer i's FFN norm into scratch x, which the layer overwrites before reading it). Only reads
 * start; the real router decides. Measured against guessing from layer i-1's FFN input (one
 * sublayer earlier): 93% of guesses used instead of 45% on the random-weight 12 GB k3-mini, 80%
 * instead of about 70% on the trained default model. */
static int guess_wanted(const blk *b, int i)
{
    return b->xs && b->xs->prefetch && i < b->hp->n_layers && b->hp->ffn_kind[i] == FFN_MOE;
}

static void guess_next(const blk *b, int i, const layer_w *L, const float *in, int T, float *x)
{
    blk_rmsnorm(b, in, L->post_norm, T, b->hp->hidden, b->hp->rms_eps, x);
    blk_moe_guess(b, i, &L->moe, x, T);
}

/* Layer i's weights for this pass: the model's own, or the weight source's (a streamed spine). */
static int layer_get(const blk *b, int i, const layer_w **L)
{
    if (b->xs && b->xs->layer)
        return b->xs->layer(b->xs->ctx, i, L, b->err);
    *L = &b->m->L[i];
    return 0;
}

static void layer_put(const blk *b, int i, const layer_w **L)
{
    if (*L && b->xs && b->xs->layer_release)
        b->xs->layer_release(b->xs->ctx, i);
    *L = NULL;
}

int session_forward(session *s, const int32_t *tokens, int T, float *logits, int all_logits, errbuf *err)
{
    const model *m = s->m;
    const hparams *hp = &m->hp;
    int H = hp->hidden, pos0 = s->n_pos;
    if (T < 1)
        return 0;
    if (s->poisoned)
        return errbuf_set(err, "session: an earlier pass failed part-way; reset or roll back before the next");
    if (T > s->max_T)
        return errbuf_set(err, "pass of %d tokens exceeds the session's %d", T, s->max_T);
    if (pos0 + T > s->cap)
        return errbuf_set(err, "context full: %d + %d tokens exceed %d positions", pos0, T, s->cap);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->vocab)
            return errbuf_set(err, "token id %d at position %d is outside the vocabulary (0..%d)", tokens[t], t,
                              hp->vocab - 1);
    size_t mark = arena_mark(&s->ar);
    blk b = {m, hp, s->k, s->pool, &s->ar, err, s->xs};
    if (s->xs && s->xs->pass_begin)
        s->xs->pass_begin(s->xs->ctx, T);
    size_t TH = (size_t)T * H;
    float *h = blk_alloc(&b, TH), *x = blk_alloc(&b, TH), *a = blk_alloc(&b, TH);
    const layer_w *L = NULL; /* layer `li`'s weights, held from before its lookahead to its end */
    int rc = -1, li = 0;
    if (!h || !x || !a)
        goto out;
    for (int t = 0; t < T; t++)
        s->k->decode_rows(&m->embed, tokens[t], tokens[t] + 1, h + (size_t)t * H);
    if (layer_get(&b, 0, &L))
        goto out;
    if (guess_wanted(&b, 0)) /* layer 0's FFN input, less its attention: the embedding */
        guess_next(&b, 0, L, h, T, x);
    if (hp->attnres_block > 0) {
        int ns = 0, B = hp->attnres_block;
        float *stack[MODEL_MAX_BLOCKS];
        float *prefix = h; /* running block sum; starts as the embedding */
        float *mixed = blk_alloc(&b, TH), *stack_mem = blk_alloc(&b, TH * (size_t)n_stack_max(hp));
        if (!mixed || !stack_mem)
            goto out;
        for (int i = 0; i < hp->n_layers; i++) {
            const float *in = prefix;
            if (ns > 0) {
                mix_rows(&b, stack, ns, prefix, L->res_u[0], T, mixed);
                in = mixed;
            }
            int restart = i % B == 0;
            if (restart) { /* push the raw prefix; the running sum restarts below */
                stack[ns] = stack_mem + (size_t)ns * TH;
                memcpy(stack[ns++], prefix, TH * sizeof(float));
            }
            blk_rmsnorm(&b, in, L->in_norm, T, H, hp->rms_eps, x);
            if (run_attn(&b, i, L, &s->L[i], pos0, x, T, a))
                goto out;
            if (restart)
                memcpy(prefix, a, TH * sizeof(float));
            else
                for (size_t j = 0; j < TH; j++)
                    prefix[j] += a[j];
            mix_rows(&b, stack, ns, prefix, L->res_u[1], T, mixed);
            blk_rmsnorm(&b, mixed, L->post_norm, T, H, hp->rms_eps, x);
            if (run_ffn(&b, i, L, x, T, a))
                goto out;
            for (size_t j = 0; j < TH; j++)
                prefix[j] += a[j];
            layer_put(&b, li, &L);
            if (i + 1 == hp->n_layers)
                break;
            if (layer_get(&b, li = i + 1, &L))
                goto out;
            if (guess_wanted(&b, i + 1)) { /* layer i+1's FFN input, less its attention */
                mix_rows(&b, stack, ns, prefix, L->res_u[1], T, mixed);
                guess_next(&b, i + 1, L, mixed, T, x);
            }
        }
        mix_rows(&b, stack, ns, prefix, m->out_res_u, T, x);
        memcpy(h, x, TH * sizeof(float));
    } else {
        for (int i = 0; i < hp->n_layers; i++) {
            blk_rmsnorm(&b, h, L->in_norm, T, H, hp->rms_eps, x);
            if (run_attn(&b, i, L, &s->L[i], pos0, x, T, a))
                goto out;
            for (size_t j = 0; j < TH; j++)
                h[j] += a[j];
            blk_rmsnorm(&b, h, L->post_norm, T, H, hp->rms_eps, x);
            if (run_ffn(&b, i, L, x, T, a))
                goto out;
            for (size_t j = 0; j < TH; j++)
                h[j] += a[j];
            layer_put(&b, li, &L);
            if (i + 1 == hp->n_layers)
                break;
            if (layer_get(&b, li = i + 1, &L))
                goto out;
            if (guess_wanted(&b, i + 1))
                guess_next(&b, i + 1, L, h, T, x);
        }
    }
    if (logits) {
        int first = all_logits ? 0 : T - 1;
        blk_rmsnorm(&b, h + (size_t)first * H, m->final_norm, T - first, H, hp->rms_eps, x);
        blk_matmul(&b, &m->lm_head, x, T - first, logits);
    }
    s->n_pos += T;
    rc = 0;
out:
    layer_put(&b, li, &L); /* a pass that failed part-way still gives its layer back */
    s->poisoned = rc != 0; /* some layers may have advanced their state */
    arena_rewind(&s->ar, mark);
    return rc;
}
