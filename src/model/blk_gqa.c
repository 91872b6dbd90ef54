/* blk_gqa.c — grouped-query attention (Qwen3, Qwen3-MoE): per-head RMSNorm on q and k before
 * half-rotation RoPE, a k/v cache, causal softmax attention with query head h reading key head
 * h / (n_heads / n_kv_heads). Blocks of the query rows that read one key head run in parallel;
 * each row visits its keys in position order. */
#include <string.h>

#include "model/blk.h"

struct gqa_job {
    const blk *b;
    const float *q;   /* [T][nh][hd] */
    const layer_state *st; /* the cache: rows of [2][nkv][hd] */
    float *o;         /* [T][nh][hd] */
    int T, pos0;
    int rows, per; /* query rows per work item (blk_att_item_rows), items per key head */
};

/* Work item i: key head i / per, and up to j->rows of its (token, head) query rows, row rho =
 * token rho / group, head kvh * group + rho % group, in order of tokens. Every row's
 * scores, softmax and weighted sum of values are those of the row alone (keys in position
 * order, kern.h's dot and axpy), whichever rows share its item. A dot is an F32 matrix row's
 * product (kern.h), so the scores are a matmul of a cache chunk's keys against the item's
 * queries, in register tiles of several keys times several rows; a row's scores past its own
 * position are computed and never read. */
size_t blk_gqa_scratch_floats(const hparams *hp, int context)
{
    return kern_scratch_floats((size_t)hp->head_dim) + 2 * (size_t)BLK_ATT_ROWS * hp->head_dim +
           blk_att_score_floats(context);
}

static void gqa_rows(void *ctx, int i0, int i1, int tid)
{
    struct gqa_job *j = ctx;
    const hparams *hp = j->b->hp;
    const kern_ops *k = j->b->k;
    int hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads, group = nh / nkv;
    size_t W = 2 * (size_t)nkv * hd;
    float *mm = pool_scratch(j->b->pool, tid);            /* the matmul's (kern.h) */
    float *qr = mm + kern_scratch_floats((size_t)hd);     /* [R][hd] the rows' queries */
    float *ol = qr + (size_t)BLK_ATT_ROWS * hd;           /* [R][hd] their outputs */
    float *sc = ol + (size_t)BLK_ATT_ROWS * hd;           /* [R][ld] */
    for (int i = i0; i < i1; i++) {
        int kvh = i / j->per, r0 = i % j->per * j->rows, r1 = r0 + j->rows;
        r1 = r1 < group * j->T ? r1 : group * j->T;
        int R = r1 - r0, nmax = j->pos0 + (r1 - 1) / group + 1, n[BLK_ATT_ROWS];
        size_t ld = ((size_t)nmax + 15) / 16 * 16;
        float *o[BLK_ATT_ROWS];
        for (int r = 0; r < R; r++) {
            int t = (r0 + r) / group, h = kvh * group + (r0 + r) % group;
            n[r] = j->pos0 + t + 1;
            memcpy(qr + (size_t)r * hd, j->q + ((size_t)t * nh + h) * hd, sizeof(float) * (size_t)hd);
            o[r] = j->o + ((size_t)t * nh + h) * hd;
        }
        for (int s0 = 0; s0 < nmax; s0 += BLK_KV_CHUNK) { /* a chunk's rows are W floats apart */
            int m = nmax - s0 < BLK_KV_CHUNK ? nmax - s0 : BLK_KV_CHUNK;
            kmat keys = {.fmt = WF_F32, .rows = m, .cols = hd,
                         .data = (const uint8_t *)(blk_kv_row(j->st, s0, W) + (size_t)kvh * hd),
                         .row_bytes = W * sizeof(float)};
            k->matmul(&keys, 0, m, qr, (size_t)hd, R, sc + s0, ld, mm);
        }
        k->softmax_rows(sc, ld, n, R, hp->attn_scale);
        for (size_t e = 0; e < (size_t)R * hd; e++)
            ol[e] = 0.0f;
        for (int s0 = 0; s0 < nmax; s0 += BLK_ATT_KEYS)
            blk_att_sums(k, ol, (size_t)hd, sc, ld, n, R, s0, blk_kv_row(j->st, s0, W) + (size_t)(nkv + kvh) * hd, W,
                         hd);
        for (int r = 0; r < R; r++)
            memcpy(o[r], ol + (size_t)r * hd, sizeof(float) * (size_t)hd);
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
    /* as many rows an item as leave each thread about four items (so that decode's few rows
     * still spread over many threads), within what the scratch holds */
    int rows = blk_att_item_rows(nh * T / (4 * pool_size(b->pool)), pos0 + T);
    int per = (nh / nkv * T + rows - 1) / rows;
    struct gqa_job j = {b, q, st, o, T, pos0, rows, per};
    pool_for(b->pool, nkv * per, gqa_rows, &j);
    blk_matmul(b, &w->o, o, T, out);
    return 0;
}
