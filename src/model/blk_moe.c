/* blk_moe.c — mixture of experts over T positions.
 *
 * Router per position (float32, moe_route.h, which the GPU compiles too): sigmoid scores with an optional selection bias and grouped
 * top-k (DeepSeek/Kimi), or softmax over all experts then top-k (Qwen3-MoE). The weights are
 * the unbiased scores, renormalised when configured (+1e-20 for sigmoid), times
 * routed_scaling_factor. Each position's chosen experts are kept sorted by expert id: that is
 * the order their outputs are summed in, whatever order the experts were computed in, so the
 * result does not depend on T or on scheduling.
 *
 * Experts run once per pass over the positions that chose them (the union over T). K3's latent
 * MoE projects h down to the latent width first, normalises the weighted sum, projects back
 * up; shared experts read the full-width h and are added unweighted.
 */
#include <string.h>

#include "model/blk.h"
#include "model/moe_route.h"

/* Router lookahead: starts the reads of the experts layer `layer` would pick for x (a stand-in for
 * its FFN input, which does not exist yet); only a hint, nothing is decided by it. Scratch from
 * the arena, given back. */
void blk_moe_guess(const blk *b, int layer, const moe_w *w, const float *x, int T)
{
    const hparams *hp = b->hp;
    if (!b->xs || !b->xs->prefetch || layer >= hp->n_layers || hp->ffn_kind[layer] != FFN_MOE)
        return;
    size_t mark = arena_mark(b->ar);
    int *sel = (int *)blk_alloc(b, (size_t)hp->top_k);
    float *wt = blk_alloc(b, (size_t)hp->top_k), *logit = blk_alloc(b, (size_t)T * hp->n_experts),
          *tmp = blk_alloc(b, 2 * (size_t)hp->n_experts);
    if (sel && wt && logit && tmp) { /* else: a hint only */
        blk_matmul(b, &w->router, x, T, logit);
        for (int t = 0; t < T; t++) {
            moe_route(hp, w->bias, logit + (size_t)t * hp->n_experts, tmp, sel, wt);
            b->xs->prefetch(b->xs->ctx, layer, sel, hp->top_k);
        }
    }
    arena_rewind(b->ar, mark);
}

int blk_moe(const blk *b, int layer, const moe_w *w, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    int E = hp->n_experts, K = hp->top_k, H = hp->hidden, D = hp->latent ? hp->latent : H, I = hp->moe_inter;
    float *logit = blk_alloc(b, (size_t)T * E), *tmp = blk_alloc(b, 2 * (size_t)E);
    float *wt = blk_alloc(b, (size_t)T * K), *slots = blk_alloc(b, (size_t)T * K * D);
    int *sel = (int *)blk_alloc(b, (size_t)T * K);
    int *uni = (int *)blk_alloc(b, (size_t)E), *start = (int *)blk_alloc(b, (size_t)E + 1);
    int *order = (int *)blk_alloc(b, (size_t)T * K);
    float *xe = hp->latent ? blk_alloc(b, (size_t)T * D) : NULL;
    float *gx = blk_alloc(b, (size_t)T * D), *gy = blk_alloc(b, (size_t)T * D);
    float *g = blk_alloc(b, (size_t)T * I), *u = blk_alloc(b, (size_t)T * I);
    float *r = blk_alloc(b, (size_t)T * D);
    if (!logit || !tmp || !wt || !slots || !sel || !uni || !start || !order || (hp->latent && !xe) || !gx || !gy ||
        !g || !u || !r)
        return -1;
    blk_matmul(b, &w->router, x, T, logit);
    for (int t = 0; t < T; t++)
        moe_route(hp, w->bias, logit + (size_t)t * E, tmp, sel + (size_t)t * K, wt + (size_t)t * K);
    if (hp->latent)
        blk_matmul(b, &w->lat_down, x, T, xe);
    const float *xin = hp->latent ? xe : x;
    int nu = moe_group(sel, T * K, E, start, order, uni);
    if (b->xs && b->xs->begin(b->xs->ctx, layer, uni, nu, b->err) != 0)
        return -1;
    /* shared experts first: they need no reads, so with streamed experts they run while the
     * routed ones load (added last, as before: the same bits) */
    float *sh = NULL;
    if (hp->n_shared > 0) {
        sh = blk_alloc(b, (size_t)T * H);
        if (!sh || blk_mlp(b, &w->shared, hp->shared_inter, x, T, sh))
            return -1;
    }
    for (int k = 0; k < nu; k++) {
        int e;
        mlp_w mats;
        const mlp_w *ex;
        if (b->xs) {
            int got = b->xs->next(b->xs->ctx, &e, &mats, b->err);
            if (got < 0)
                return -1;
            if (got == 0)
                return errbuf_set(b->err, "layer %d: the weight source handed over %d of %d experts", layer, k, nu);
            ex = &mats;
        } else {
            e = uni[k];
            ex = &w->experts[e];
        }
        const int *chose = order + start[e];
        int n = start[e + 1] - start[e];
        for (int i = 0; i < n; i++)
            memcpy(gx + (size_t)i * D, xin + (size_t)(chose[i] / K) * D, sizeof(float) * (size_t)D);
        blk_matmul(b, &ex->gate, gx, n, g);
        blk_matmul(b, &ex->up, gx, n, u);
        blk_glu(b, g, u, (size_t)n * I);
        blk_matmul(b, &ex->down, g, n, gy);
        for (int i = 0; i < n; i++)
            memcpy(slots + (size_t)chose[i] * D, gy + (size_t)i * D, sizeof(float) * (size_t)D);
        if (b->xs)
            b->xs->release(b->xs->ctx, layer, e);
    }
    for (int t = 0; t < T; t++) {
        float *rt = r + (size_t)t * D;
        for (int i = 0; i < D; i++)
            rt[i] = 0.0f;
        b->k->axpy_rows(rt, (size_t)D, wt + (size_t)t * K, (size_t)K, 1, slots + (size_t)t * K * D, (size_t)D, K, D);
    }
    if (hp->latent) {
        blk_rmsnorm(b, r, w->lat_norm, T, D, hp->rms_eps, r);
        blk_matmul(b, &w->lat_up, r, T, out);
    } else {
        memcpy(out, r, sizeof(float) * (size_t)T * H);
    }
    if (sh)
        for (size_t i = 0; i < (size_t)T * H; i++)
            out[i] += sh[i];
    return 0;
}
