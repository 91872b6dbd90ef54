/* blk_moe.c — mixture of experts over T positions.
 *
 * Router per position (float32): sigmoid scores with an optional selection bias and grouped
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

/* Top-k of v[0..n) (descending; ties keep the lower index), k <= n. */
static void topk(const float *v, int n, int k, int *idx)
{
    for (int j = 0; j < k; j++)
        idx[j] = -1;
    for (int i = 0; i < n; i++) {
        if (v[i] == -INFINITY && k > 0 && idx[k - 1] >= 0)
            continue;
        int pos = k;
        while (pos > 0 && (idx[pos - 1] < 0 || v[i] > v[idx[pos - 1]]))
            pos--;
        if (pos >= k)
            continue;
        memmove(idx + pos + 1, idx + pos, sizeof(int) * (size_t)(k - 1 - pos));
        idx[pos] = i;
    }
}

static void route(const hparams *hp, const moe_w *w, const float *logit, float *tmp, int *sel, float *wt)
{
    int E = hp->n_experts, K = hp->top_k;
    float *score = tmp, *choice = tmp + E;
    if (hp->router == ROUTER_SOFTMAX) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++)
            mx = logit[e] > mx ? logit[e] : mx;
        for (int e = 0; e < E; e++) {
            score[e] = km_expf(logit[e] - mx);
            sum += score[e];
        }
        for (int e = 0; e < E; e++)
            score[e] /= sum;
    } else {
        for (int e = 0; e < E; e++)
            score[e] = blk_sigmoid(logit[e]);
    }
    for (int e = 0; e < E; e++)
        choice[e] = score[e] + (w->bias ? w->bias[e] : 0.0f);
    if (hp->n_group > 1) { /* keep the topk_group groups with the best top-2 sums */
        int G = hp->n_group, per = E / G, gsel[MODEL_MAX_GROUPS], top2[2];
        float gscore[MODEL_MAX_GROUPS]; /* G <= MAX_GROUPS (cfg_validate) */
        for (int g = 0; g < G; g++) {
            topk(choice + g * per, per, 2, top2);
            gscore[g] = choice[g * per + top2[0]] + choice[g * per + top2[1]];
        }
        topk(gscore, G, hp->topk_group, gsel);
        for (int g = 0; g < G; g++) {
            int keep = 0;
            for (int j = 0; j < hp->topk_group; j++)
                keep |= gsel[j] == g;
            if (!keep)
                for (int e = g * per; e < (g + 1) * per; e++)
                    choice[e] = -INFINITY;
        }
    }
    topk(choice, E, K, sel);
    /* ascending expert id: the summation order of this position's experts */
    for (int a = 1; a < K; a++)
        for (int c = a; c > 0 && sel[c] < sel[c - 1]; c--) {
            int t = sel[c];
            sel[c] = sel[c - 1];
            sel[c - 1] = t;
        }
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        wt[j] = score[sel[j]];
        sum += wt[j];
    }
    if (hp->norm_topk && K > 1) {
        float den = hp->router == ROUTER_SIGMOID ? sum + 1e-20f : sum;
        for (int j = 0; j < K; j++)
            wt[j] /= den;
    }
    for (int j = 0; j < K; j++)
        wt[j] *= hp->routed_scale;
}

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
            route(hp, w, logit + (size_t)t * hp->n_experts, tmp, sel, wt);
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
        route(hp, w, logit + (size_t)t * E, tmp, sel + (size_t)t * K, wt + (size_t)t * K);
    if (hp->latent)
        blk_matmul(b, &w->lat_down, x, T, xe);
    const float *xin = hp->latent ? xe : x;
    /* counting sort of the T*K choices by expert: order[start[e] .. start[e+1]) lists, in
     * position order, the choices j = t*K + slot that picked expert e; the union of the
     * positions' experts (each computed once over the positions that chose it) falls out */
    memset(start, 0, sizeof(int) * ((size_t)E + 1));
    for (int j = 0; j < T * K; j++)
        start[sel[j] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    int *cursor = uni; /* borrowed until the union is listed */
    memcpy(cursor, start, sizeof(int) * (size_t)E);
    for (int j = 0; j < T * K; j++)
        order[cursor[sel[j]]++] = j;
    int nu = 0;
    for (int e = 0; e < E; e++)
        if (start[e + 1] > start[e])
            uni[nu++] = e;
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
        b->k->axpy_rows(rt, slots + (size_t)t * K * D, (size_t)D, wt + (size_t)t * K, K, D);
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
