/* pass.c — the layer-major pass over T positions of one session (engine_int.h: pass_run).
 *
 * Residual wiring: plain pre-norm residual (h += attn(norm h); h += ffn(norm h)) for every
 * family but K3, whose Block AttnRes keeps a stack of block sums and mixes them before each
 * sub-layer (docs/model.md, "Block AttnRes"):
 *   x = mix(stack + [prefix]) unless the stack is empty; at a block boundary the raw prefix is
 *   pushed and the running sum restarts from the attention output; the FFN input is
 *   mix(stack + [prefix]); after the last layer h = mix(stack + [prefix]) before the final norm.
 * A tap of layer i is the prefix leaving it (K3) or the residual stream h after it (others):
 * exactly the values the next layer reads.
 *
 * Every computation goes through the engine's backend (backend.h): this file only wires blocks
 * together, allocates their buffers from the pass arena (the backend's memory) and moves the
 * stored layers in and out; it never touches an activation itself.
 */
#include <math.h>
#include <string.h>

#include "engine/engine_int.h"

static int n_stack_max(const hparams *hp)
{
    return hp->attnres_block > 0 ? (hp->n_layers + hp->attnres_block - 1) / hp->attnres_block : 0;
}

/* An upper bound on the floats one pass of T tokens takes from the arena: the pass's own
 * buffers plus the sum of every buffer any block kind allocates (only one block's scratch is
 * live at a time, so summing over kinds over-approximates), plus alignment slack. A commit's
 * replay of up to T positions takes less than the KDA block does. */
size_t pass_floats(const model *m, int T)
{
    const hparams *hp = &m->hp;
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
        per += 8 * P + 2 * rmax + (size_t)hp->kda_heads;
    if (has_mla)
        per += (size_t)hp->n_heads * (hp->qk_nope + hp->qk_rope) + engine_cache_width(hp, ATTN_MLA) +
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
    size_t kda_fixed = has_kda ? blk_kda_conv_floats(hp->conv_k, (int)P) : 0;
    size_t fixed = moe_fixed + kda_fixed + (size_t)(hp->rope_dim + hp->head_dim) + 64 * 48;
    return per * (size_t)T + fixed + (size_t)T * 64;
}

size_t pass_thread_floats(const model *m, int context)
{
    const hparams *hp = &m->hp;
    size_t need = kern_scratch_floats(m->max_cols);
    size_t mla = blk_mla_scratch_floats(hp, context);
    size_t kda = blk_kda_scratch_floats(hp), gqa = blk_gqa_scratch_floats(hp, context);
    if (mla > need)
        need = mla;
    if (kda > need)
        need = kda;
    if (gqa > need)
        need = gqa;
    return need + 64;
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

static void guess_next(const backend_ops *be, const blk *b, int i, const layer_w *L, const float *in, int T, float *x)
{
    if (!be->guess)
        return;
    be->rmsnorm(b, in, L->post_norm, T, b->hp->hidden, b->hp->rms_eps, x);
    be->guess(b, i, L, x, T);
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

/* Copies the stream `v` [T][H] leaving layer i into every tap that asks for layer i. */
static void tap_layer(const backend_ops *be, const blk *b, int i, const float *v, int T, const int *taps, int n_taps,
                      float *tap_out)
{
    int H = b->hp->hidden;
    for (int j = 0; j < n_taps; j++)
        if (taps[j] == i)
            for (int t = 0; t < T; t++)
                be->read(b, tap_out + ((size_t)t * n_taps + j) * H, v + (size_t)t * H, (size_t)H);
}

/* Points each layer's state at the session's buffers for this pass. */
static void bind_states(session *s, int logged)
{
    const hparams *hp = s->hp;
    int kda = 0;
    size_t S_floats = (size_t)hp->kda_heads * hp->kda_dim * hp->kda_dim;
    for (int i = 0; i < hp->n_layers; i++) {
        if (hp->attn_kind[i] != ATTN_KDA)
            continue;
        layer_state *st = &s->L[i];
        st->S_in = s->rec[s->cur] + s->rec_off[i];
        st->S = s->rec[!s->cur] + s->rec_off[i];
        st->conv_in = st->S_in + S_floats;
        st->conv = st->S + S_floats;
        st->log = logged ? s->log + (size_t)kda * s->o.max_commit * s->log_floats : NULL;
        kda++;
    }
}

int pass_run(session *s, const int32_t *tokens, int T, int n_logits, const int *taps, int n_taps, float *tap_out,
             int logged, errbuf *err)
{
    const model *m = s->m;
    const hparams *hp = &m->hp;
    int H = hp->hidden, pos0 = s->n;
    size_t mark = arena_mark(&s->ar);
    blk b = {m, hp, s->e->k, s->e->pool, &s->ar, err, s->e->xs, s->e->be_dev};
    const backend_ops *be = s->e->be;
    bind_states(s, logged);
    if (b.xs && b.xs->pass_begin)
        b.xs->pass_begin(b.xs->ctx, T);
    size_t TH = (size_t)T * H;
    float *h = blk_alloc(&b, TH), *x = blk_alloc(&b, TH), *a = blk_alloc(&b, TH);
    const layer_w *L = NULL; /* layer `li`'s weights, held from before its lookahead to its end */
    int rc = -1, li = 0;
    if (!h || !x || !a)
        goto out;
    be->embed(&b, tokens, T, h);
    if (layer_get(&b, 0, &L))
        goto out;
    if (guess_wanted(&b, 0)) /* layer 0's FFN input, less its attention: the embedding */
        guess_next(be, &b, 0, L, h, T, x);
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
                be->mix(&b, stack, ns, prefix, L->res_u[0], T, mixed);
                in = mixed;
            }
            int restart = i % B == 0;
            if (restart) { /* push the raw prefix; the running sum restarts below */
                stack[ns] = stack_mem + (size_t)ns * TH;
                be->copy(&b, stack[ns++], prefix, TH);
            }
            be->rmsnorm(&b, in, L->in_norm, T, H, hp->rms_eps, x);
            if (be->attn(&b, i, L, &s->L[i], pos0, x, T, a))
                goto out;
            if (restart)
                be->copy(&b, prefix, a, TH);
            else
                be->add(&b, prefix, a, TH);
            be->mix(&b, stack, ns, prefix, L->res_u[1], T, mixed);
            be->rmsnorm(&b, mixed, L->post_norm, T, H, hp->rms_eps, x);
            if (be->ffn(&b, i, L, x, T, a))
                goto out;
            be->add(&b, prefix, a, TH);
            tap_layer(be, &b, i, prefix, T, taps, n_taps, tap_out);
            layer_put(&b, li, &L);
            if (i + 1 == hp->n_layers)
                break;
            if (layer_get(&b, li = i + 1, &L))
                goto out;
            if (guess_wanted(&b, i + 1)) { /* layer i+1's FFN input, less its attention */
                be->mix(&b, stack, ns, prefix, L->res_u[1], T, mixed);
                guess_next(be, &b, i + 1, L, mixed, T, x);
            }
        }
        be->mix(&b, stack, ns, prefix, m->out_res_u, T, x);
        be->copy(&b, h, x, TH);
    } else {
        for (int i = 0; i < hp->n_layers; i++) {
            be->rmsnorm(&b, h, L->in_norm, T, H, hp->rms_eps, x);
            if (be->attn(&b, i, L, &s->L[i], pos0, x, T, a))
                goto out;
            be->add(&b, h, a, TH);
            be->rmsnorm(&b, h, L->post_norm, T, H, hp->rms_eps, x);
            if (be->ffn(&b, i, L, x, T, a))
                goto out;
            be->add(&b, h, a, TH);
            tap_layer(be, &b, i, h, T, taps, n_taps, tap_out);
            layer_put(&b, li, &L);
            if (i + 1 == hp->n_layers)
                break;
            if (layer_get(&b, li = i + 1, &L))
                goto out;
            if (guess_wanted(&b, i + 1))
                guess_next(be, &b, i + 1, L, h, T, x);
        }
    }
    if (n_logits > 0) {
        int first = T - n_logits;
        be->rmsnorm(&b, h + (size_t)first * H, m->final_norm, n_logits, H, hp->rms_eps, x);
        if (be->head(&b, &m->lm_head, x, n_logits, s->lg))
            goto out;
        for (int t = 0; t < n_logits; t++) { /* garbage in the weights is an error, not a token */
            const float *lg = s->lg + (size_t)t * hp->vocab;
            for (int v = 0; v < hp->vocab; v++)
                if (!isfinite(lg[v])) {
                    errbuf_set(err, "the model produced %s logits at position %d (check the checkpoint: doctor --model)",
                               isnan(lg[v]) ? "NaN" : "infinite", pos0 + first + t);
                    s->lg_n = 0;
                    goto out;
                }
        }
        s->lg_pos = pos0 + first;
        s->lg_n = n_logits;
    }
    rc = 0;
out:
    layer_put(&b, li, &L); /* a pass that failed part-way still gives its layer back */
    arena_rewind(&s->ar, mark);
    return rc;
}
