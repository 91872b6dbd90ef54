/* moe_route.h — a router's choice for one position: which top_k experts, in ascending id (the
 * order their outputs are summed in), and with what weights (blk_moe.c's header says how). One
 * source for the CPU's MoE block and the GPU's (src/backend/cuda), compiled for each, as kmath.h
 * is: the same operations in the same order, so both devices choose the same experts with the
 * same weight bits. moe_route runs the steps one after another; the GPU runs each element-wise
 * step (moe_score, moe_choice) across threads, the sums in order in one thread (moe_weights), and
 * picks the top k by rank (moe_before), which is moe_topk's choice whenever no value is NaN. */
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

/* Whether v[a] comes before v[b] in moe_topk's order: descending, ties to the lower index. Without
 * NaNs this is a total order, and moe_topk keeps exactly the elements that fewer than k others
 * come before (its insertion is a stable sort); a NaN compares false both ways, and moe_topk's
 * choice is then its own. */
MR_FN int moe_before(const float *v, int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

/* The softmax router's first step: the largest logit, NaNs passed over (any order gives it). */
MR_FN float moe_max_step(float mx, float logit) { return logit > mx ? logit : mx; }

/* expert e's score before the softmax's division by the sum of every score (mx: moe_max_step over
 * all logits; the sigmoid router has no division) */
MR_FN float moe_score(const hparams *hp, const float *logit, int e, float mx)
{
    return hp->router == ROUTER_SOFTMAX ? km_expf(logit[e] - mx) : km_sigmoidf(logit[e]);
}

/* expert e's selection value: its score plus the selection bias */
MR_FN float moe_choice(const float *score, const float *bias, int e) { return score[e] + (bias ? bias[e] : 0.0f); }

/* group g's value in grouped routing: the sum of its two best choices (per experts a group) */
MR_FN float moe_group_score(const float *choice, int g, int per)
{
    int top2[2];
    moe_topk(choice + g * per, per, 2, top2);
    return choice[g * per + top2[0]] + choice[g * per + top2[1]];
}

/* whether group g is among gsel's n kept groups */
MR_FN int moe_group_kept(const int *gsel, int n, int g)
{
    int keep = 0;
    for (int j = 0; j < n; j++)
        keep |= gsel[j] == g;
    return keep;
}

/* sel's K chosen experts in ascending id: the summation order of this position's experts */
MR_FN void moe_sort_ids(int *sel, int K)
{
    for (int a = 1; a < K; a++)
        for (int c = a; c > 0 && sel[c] < sel[c - 1]; c--) {
            int t = sel[c];
            sel[c] = sel[c - 1];
            sel[c - 1] = t;
        }
}

/* the weights of the K experts sel (ascending) from their scores: normalized, then scaled */
MR_FN void moe_weights(const hparams *hp, const float *score, const int *sel, float *wt)
{
    int K = hp->top_k;
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

MR_FN void moe_route(const hparams *hp, const float *bias, const float *logit, float *tmp, int *sel, float *wt)
{
    int E = hp->n_experts, K = hp->top_k;
    float *score = tmp, *choice = tmp + E, mx = -INFINITY;
    if (hp->router == ROUTER_SOFTMAX)
        for (int e = 0; e < E; e++)
            mx = moe_max_step(mx, logit[e]);
    for (int e = 0; e < E; e++)
        score[e] = moe_score(hp, logit, e, mx);
    if (hp->router == ROUTER_SOFTMAX) {
        float sum = 0.0f;
        for (int e = 0; e < E; e++)
            sum += score[e];
        for (int e = 0; e < E; e++)
            score[e] /= sum;
    }
    for (int e = 0; e < E; e++)
        choice[e] = moe_choice(score, bias, e);
    if (hp->n_group > 1) { /* keep the topk_group groups with the best top-2 sums */
        int G = hp->n_group, per = E / G, gsel[MODEL_MAX_GROUPS];
        float gscore[MODEL_MAX_GROUPS]; /* G <= MAX_GROUPS (cfg_validate) */
        for (int g = 0; g < G; g++)
            gscore[g] = moe_group_score(choice, g, per);
        moe_topk(gscore, G, hp->topk_group, gsel);
        for (int g = 0; g < G; g++)
            if (!moe_group_kept(gsel, hp->topk_group, g))
                for (int e = g * per; e < (g + 1) * per; e++)
                    choice[e] = -INFINITY;
    }
    moe_topk(choice, E, K, sel);
    moe_sort_ids(sel, K);
    moe_weights(hp, score, sel, wt);
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
