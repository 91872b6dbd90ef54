/* moe_route.h — a router's choice for one position: which top_k experts, in ascending id (the
 * order their outputs are summed in), and with what weights (blk_moe.c's header says how). One
 * source for the CPU's MoE block and the GPU's (src/backend/cuda), compiled for each, as kmath.h
 * is: the same operations in the same order, so both devices choose the same experts with the
 * same weight bits. */
#ifndef DF_MODEL_MOE_ROUTE_H
#define DF_MODEL_MOE_ROUTE_H

#include <math.h>
#include <string.h>

#include "kernels/kmath.h"
#include "model/model.h"

#ifdef __CUDACC__
#define MR_FN static inline __host__ __device__
#else
#define MR_FN static inline
#endif

/* Top-k of v[0..n) (descending; ties keep the lower index), k <= n. */
MR_FN void moe_topk(const float *v, int n, int k, int *idx)
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
        for (int q = k - 1; q > pos; q--) /* (a memmove, written out for the device) */
            idx[q] = idx[q - 1];
        idx[pos] = i;
    }
}

MR_FN void moe_route(const hparams *hp, const float *bias, const float *logit, float *tmp, int *sel, float *wt)
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
            score[e] = km_sigmoidf(logit[e]);
    }
    for (int e = 0; e < E; e++)
        choice[e] = score[e] + (bias ? bias[e] : 0.0f);
    if (hp->n_group > 1) { /* keep the topk_group groups with the best top-2 sums */
        int G = hp->n_group, per = E / G, gsel[MODEL_MAX_GROUPS], top2[2];
        float gscore[MODEL_MAX_GROUPS]; /* G <= MAX_GROUPS (cfg_validate) */
        for (int g = 0; g < G; g++) {
            moe_topk(choice + g * per, per, 2, top2);
            gscore[g] = choice[g * per + top2[0]] + choice[g * per + top2[1]];
        }
        moe_topk(gscore, G, hp->topk_group, gsel);
        for (int g = 0; g < G; g++) {
            int keep = 0;
            for (int j = 0; j < hp->topk_group; j++)
                keep |= gsel[j] == g;
            if (!keep)
                for (int e = g * per; e < (g + 1) * per; e++)
                    choice[e] = -INFINITY;
        }
    }
    moe_topk(choice, E, K, sel);
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

/* Groups the n = T * K choices sel[j] (j = t * K + slot) by expert, by counting sort:
 * order[start[e] .. start[e + 1]) lists, in position order, the choices that picked expert e;
 * uni[0 .. return) is the union of the experts chosen, ascending (each computed once over the
 * positions that chose it). start has E + 1 entries, uni E, order n. */
static inline int moe_group(const int *sel, int n, int E, int *start, int *order, int *uni)
{
    memset(start, 0, sizeof(int) * ((size_t)E + 1));
    for (int j = 0; j < n; j++)
        start[sel[j] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    int *cursor = uni; /* borrowed until the union is listed */
    memcpy(cursor, start, sizeof(int) * (size_t)E);
    for (int j = 0; j < n; j++)
        order[cursor[sel[j]]++] = j;
    int nu = 0;
    for (int e = 0; e < E; e++)
        if (start[e + 1] > start[e])
            uni[nu++] = e;
    return nu;
}

#endif
