/* blk_gqa.c — grouped-query attention (Qwen3, Qwen3-MoE): per-head RMSNorm on q and k before
 * half-rotation RoPE, a k/v cache, causal softmax attention with query head h reading key head
 * h / (n_heads / n_kv_heads). Heads run in parallel; keys are visited in position order. */
#include <string.h>

#include "model/blk.h"

struct gqa_job {
    const blk *b;
    const float *q;   /* [T][nh][hd] */
    const layer_state *st; /* the cache: rows of [2][nkv][hd] */
    float *o;         /* [T][nh][hd] */
    int T, pos0;
};

static void gqa_heads(void *ctx, int h0, int h1, int tid)
{
    struct gqa_job *j = ctx;
    const hparams *hp = j->b->hp;
    int hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads, group = nh / nkv;
    size_t W = 2 * (size_t)nkv * hd;
    float *sc = pool_scratch(j->b->pool, tid);
    for (int h = h0; h < h1; h++) {
        int kvh = h / group;
        for (int t = 0; t < j->T; t++) {
            const float *qh = j->q + ((size_t)t * nh + h) * hd;
            int n = j->pos0 + t + 1;
            float mx = -INFINITY, sum = 0.0f;
            for (int s0 = 0; s0 < n; s0 += BLK_KV_CHUNK) { /* rows W apart inside a KV chunk */
                int m = n - s0 < BLK_KV_CHUNK ? n - s0 : BLK_KV_CHUNK;
                j->b->k->dot_rows(qh, blk_kv_row(j->st, s0, W) + (size_t)kvh * hd, W, m, hd, sc + s0);
            }
            for (int s = 0; s < n; s++) {
                sc[s] *= hp->attn_scale;
                mx = sc[s] > mx ? sc[s] : mx;
            }
            j->b->k->exp_sub(sc, n, mx);
            for (int s = 0; s < n; s++)
                sum += sc[s];
            float *oh = j->o + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < hd; i++)
                oh[i] = 0.0f;
            for (int s = 0; s < n; s++)
                sc[s] = sc[s] / sum;
            /* the value rows in order, a KV chunk at a time (rows W apart inside a chunk) */
            for (int s0 = 0; s0 < n; s0 += BLK_KV_CHUNK) {
                int m = n - s0 < BLK_KV_CHUNK ? n - s0 : BLK_KV_CHUNK;
                j->b->k->axpy_rows(oh, blk_kv_row(j->st, s0, W) + (size_t)(nkv + kvh) * hd, W, sc + s0, m, hd);
            }
        }
    }
}

int blk_gqa(const blk *b, const gqa_w *w, layer_state *st, int pos0, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    int hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    size_t W = 2 * (size_t)nkv * hd;
    float *q = blk_alloc(b, (size_t)T * nh * hd), *k = blk_alloc(b, (size_t)T * nkv * hd);
    float *v = blk_alloc(b, (size_t)T * nkv * hd), *o = blk_alloc(b, (size_t)T * nh * hd);
    float *cs = blk_alloc(b, (size_t)hd);
    if (!q || !k || !v || !o || !cs)
        return -1;
    blk_matmul(b, &w->q, x, T, q);
    blk_matmul(b, &w->k, x, T, k);
    blk_matmul(b, &w->v, x, T, v);
    if (w->q_norm) {
        blk_rmsnorm(b, q, w->q_norm, T * nh, hd, hp->rms_eps, q);
        blk_rmsnorm(b, k, w->k_norm, T * nkv, hd, hp->rms_eps, k);
    }
    for (int t = 0; t < T; t++) {
        blk_rope_table(hp, pos0 + t, cs);
        for (int h = 0; h < nh; h++)
            blk_rope_apply(hp, q + ((size_t)t * nh + h) * hd, cs);
        float *row = blk_kv_row(st, pos0 + t, W);
        for (int h = 0; h < nkv; h++) {
            float *kh = k + ((size_t)t * nkv + h) * hd;
            blk_rope_apply(hp, kh, cs);
            memcpy(row + (size_t)h * hd, kh, sizeof(float) * (size_t)hd);
            memcpy(row + (size_t)(nkv + h) * hd, v + ((size_t)t * nkv + h) * hd, sizeof(float) * (size_t)hd);
        }
    }
    struct gqa_job j = {b, q, st, o, T, pos0};
    pool_for(b->pool, nh, gqa_heads, &j);
    blk_matmul(b, &w->o, o, T, out);
    return 0;
}
