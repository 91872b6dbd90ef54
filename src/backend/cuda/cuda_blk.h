/* cuda_blk.h — the GPU kernels of a pass's blocks beyond kern.h's operations (cuda_kern.h): RMSNorm,
 * residual adds, RoPE, the GQA cache rows and GQA attention, each the same operations in the same
 * order as the CPU's code it names (blk_common.c, blk_gqa.c), so the same bits. Device pointers,
 * queued on `stream` (NULL: the default stream). */
#ifndef DF_BACKEND_CUDA_CUDA_BLK_H
#define DF_BACKEND_CUDA_CUDA_BLK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* blk_rmsnorm: y[t] = x[t] * (1 / sqrt(dot(x[t], x[t]) / n + eps)) * w for the first n
 * floats of rows ld apart (x's and y's); y may be x; w NULL: no weight */
void cudab_rmsnorm(const float *x, const float *w, int T, int n, size_t ld, float eps, float *y, void *stream);
/* y[j] = y[j] + a[j] */
void cudab_add(float *y, const float *a, size_t n, void *stream);
/* blk_rope_apply to each of T x heads vectors at v + (t * heads + h) * hd + off, with row t of
 * cs [T][rope_dim] (blk_rope_table's cos then sin halves); interleaved: pairs (2i, 2i+1), else
 * (i, i + rope_dim / 2) */
void cudab_rope(float *v, int T, int heads, int hd, int off, int rope_dim, int interleaved, const float *cs,
                void *stream);
/* GQA's cache rows of positions pos0 .. pos0+T-1: row = [k (nkv x hd), v (nkv x hd)], in chunks of
 * 256 rows (chunks: a device array of the chunk pointers) */
void cudab_gqa_store(float *const *chunks, int pos0, int T, const float *k, const float *v, int nkv, int hd,
                     void *stream);
/* cache rows of positions pos0 .. pos0+T-1 from src [T][W] (MLA: latent, then the key's rope part) */
void cudab_cache_store(float *const *chunks, int pos0, int T, const float *src, int W, void *stream);
/* blk_mla_query for T queries q [T][nh][nope + rope] at positions pos0 .. with the decoded kv_b
 * rows wkv [nh][nope + v_head][r] over the cache (rows of r + rope) into o [T][nh][v_head]; sc:
 * scratch of T * nh * (pos0 + T) floats */
void cudab_mla_attend(const float *q, const float *wkv, float *const *chunks, int pos0, int T, int nh, int nope,
                      int rope, int r, int vd, float scale, float *sc, float *o, void *stream);
/* o[i] = o[i] * km_sigmoidf(g[i]) (K3's output gate) */
void cudab_gate(float *o, const float *g, size_t n, void *stream);
/* blk_kda.c's short_conv for one of q, k, v: u [T][P] in place, taps wt [P][K], the window of the
 * last K - 1 raw inputs win_in [K-1][P] -> win_out (may be win_in) */
void cudab_short_conv(const float *wt, int K, int P, const float *win_in, float *win_out, float *u, int T,
                      void *stream);
/* blk_kda.c's kda_heads for every head: S_in -> S [heads][d][d] over T positions of the conv'd q, k,
 * v and f [T][P] and beta logits [T][heads]; o [T][P] the gated, normed outputs (NULL: only the
 * state). A, dt_bias, o_norm: the layer's vectors; gate [T][P] (unused when o is NULL). */
void cudab_kda_heads(const struct hparams *hp, const float *S_in, float *S, const float *q, const float *k,
                     const float *v, const float *f, const float *beta, const float *gate, const float *A,
                     const float *dt_bias, const float *o_norm, float *o, int T, void *stream);
/* blk_gqa's attention of T queries q [T][nh][hd] at positions pos0 .. over the cache into
 * o [T][nh][hd]; sc: scratch of T * nh * (pos0 + T) floats */
void cudab_gqa_attend(const float *q, float *const *chunks, int pos0, int T, int nh, int nkv, int hd, float scale,
                      float *sc, float *o, void *stream);

struct hparams;
/* moe_route.h's choice for each of T positions of logits [T][E]: sel, wt [T][top_k]; tmp: scratch
 * of T * 2 * E floats; bias [E] or NULL */
void cudab_route(const struct hparams *hp, const float *bias, const float *logit, int T, float *tmp, int *sel,
                 float *wt, void *stream);
/* gx[i] = x[order[i] / K] for i < n (rows of D): the positions that chose one expert */
void cudab_gather(const float *x, const int *order, int n, int K, int D, float *gx, void *stream);
/* slots[order[i]] = gy[i] for i < n (rows of D) */
void cudab_scatter(const float *gy, const int *order, int n, int D, float *slots, void *stream);
/* r[t] = the axpys of slots[t * K + s] weighted wt[t * K + s] for s = 0 .. K-1, from 0 (blk_moe) */
void cudab_moe_sum(const float *slots, const float *wt, int T, int K, int D, float *r, void *stream);
/* blk_attnres_mix for each of T positions: the sources stack[0 .. ns)[t] and prefix[t] (rows of H),
 * score vector u, into out[t] (ns < 63) */
void cudab_attnres_mix(float *const *stack, int ns, const float *prefix, const float *u, int T, int H, float eps,
                       float *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
