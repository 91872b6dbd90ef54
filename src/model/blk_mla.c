/* blk_mla.c — multi-head latent attention (DeepSeek-V3, Kimi K2, Kimi-Linear, Kimi K3).
 *
 * Cached per token: the RMS-normed latent c (kv_lora) and the key's rope part k_pe (qk_rope,
 * rotated when the family has RoPE, raw for NoPE). Attention runs in absorbed form, per head:
 *   qa = Wk_h^T q_nope                 (kv_lora)
 *   score(s) = (qa . c_s + q_pe . k_pe_s) * scale,   s <= position
 *   ol = sum_s softmax(score)_s c_s    (kv_lora)
 *   o_h = Wv_h ol                      (v_head)
 * with Wk_h / Wv_h the head's rows of kv_b_proj. K3 multiplies o by sigmoid(x g^T) before
 * o_proj. Heads run in parallel; keys are visited in position order, so a query's result does
 * not depend on how the prompt was chunked.
 */
#include <math.h>
#include <string.h>

#include "model/blk.h"

void blk_mla_query(const kern_ops *k, const hparams *hp, float scale, const float *qh, const float *wk,
                   const float *wv, int n, blk_row_fn row, const void *ud, float *scratch, float *oh)
{
    int nope = hp->qk_nope, rope = hp->qk_rope, r = hp->kv_lora_rank, vd = hp->v_head;
    float *qa = scratch, *ol = qa + r, *sc = ol + r;
    for (int i = 0; i < r; i++)
        qa[i] = 0.0f;
    for (int d = 0; d < nope; d++)
        k->axpy(qa, wk + (size_t)d * r, qh[d], r);
    float mx = -INFINITY, sum = 0.0f;
    for (int s = 0; s < n; s++) {
        const float *cs = row(ud, s);
        float v = k->dot(qa, cs, r);
        if (rope)
            v += k->dot(qh + nope, cs + r, rope);
        sc[s] = v * scale;
        mx = sc[s] > mx ? sc[s] : mx;
    }
    k->exp_sub(sc, n, mx);
    for (int s = 0; s < n; s++)
        sum += sc[s];
    for (int i = 0; i < r; i++)
        ol[i] = 0.0f;
    for (int s = 0; s < n; s++)
        k->axpy(ol, row(ud, s), sc[s] / sum, r);
    for (int e = 0; e < vd; e++)
        oh[e] = k->dot(wv + (size_t)e * r, ol, r);
}

struct mla_job {
    const blk *b;
    const mla_w *w;
    const float *q;   /* [T][nh][nope + rope] */
    const layer_state *st; /* the cache: rows of kv_lora + rope */
    float *o;         /* [T][nh][v] */
    int T, pos0;
};

struct kv_rows {
    const layer_state *st;
    size_t width;
};

static const float *kv_row(const void *ud, int s)
{
    const struct kv_rows *c = ud;
    return blk_kv_row(c->st, s, c->width);
}

static void mla_heads(void *ctx, int h0, int h1, int tid)
{
    struct mla_job *j = ctx;
    const hparams *hp = j->b->hp;
    const kern_ops *k = j->b->k;
    int nope = hp->qk_nope, rope = hp->qk_rope, r = hp->kv_lora_rank, vd = hp->v_head;
    float *wk = pool_scratch(j->b->pool, tid); /* [nope][r] */
    float *wv = wk + (size_t)nope * r;         /* [vd][r] */
    float *sc = wv + (size_t)vd * r;           /* blk_mla_query's: [2 r + pos0 + T] */
    struct kv_rows rows = {j->st, (size_t)r + rope};
    for (int h = h0; h < h1; h++) {
        int row = h * (nope + vd);
        k->decode_rows(&j->w->kv_b, row, row + nope, wk);
        k->decode_rows(&j->w->kv_b, row + nope, row + nope + vd, wv);
        for (int t = 0; t < j->T; t++)
            blk_mla_query(k, hp, hp->attn_scale, j->q + ((size_t)t * hp->n_heads + h) * (nope + rope), wk, wv,
                          j->pos0 + t + 1, kv_row, &rows, sc, j->o + ((size_t)t * hp->n_heads + h) * vd);
    }
}

int blk_mla(const blk *b, const mla_w *w, layer_state *st, int pos0, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    int nh = hp->n_heads, qd = hp->qk_nope + hp->qk_rope, r = hp->kv_lora_rank, rope = hp->qk_rope;
    int W = r + rope, ov = nh * hp->v_head;
    float *q = blk_alloc(b, (size_t)T * nh * qd), *kv = blk_alloc(b, (size_t)T * W);
    float *o = blk_alloc(b, (size_t)T * ov), *cs = blk_alloc(b, (size_t)(rope ? rope : 1));
    if (!q || !kv || !o || !cs)
        return -1;
    if (hp->q_lora_rank > 0) {
        float *cq = blk_alloc(b, (size_t)T * hp->q_lora_rank);
        if (!cq)
            return -1;
        blk_matmul(b, &w->q_a, x, T, cq);
        blk_rmsnorm(b, cq, w->q_a_norm, T, hp->q_lora_rank, hp->mla_norm_eps, cq);
        blk_matmul(b, &w->q_b, cq, T, q);
    } else {
        blk_matmul(b, &w->q, x, T, q);
    }
    blk_matmul(b, &w->kv_a, x, T, kv);
    for (int t = 0; t < T; t++) {
        float *row = kv + (size_t)t * W;
        blk_rmsnorm(b, row, w->kv_a_norm, 1, r, hp->mla_norm_eps, row);
        if (hp->rope != ROPE_NONE) {
            blk_rope_table(hp, pos0 + t, cs);
            blk_rope_apply(hp, row + r, cs);
            for (int h = 0; h < nh; h++)
                blk_rope_apply(hp, q + ((size_t)t * nh + h) * qd + hp->qk_nope, cs);
        }
        memcpy(blk_kv_row(st, pos0 + t, (size_t)W), row, sizeof(float) * (size_t)W);
    }
    struct mla_job j = {b, w, q, st, o, T, pos0};
    pool_for(b->pool, nh, mla_heads, &j);
    if (hp->mla_out_gate) {
        float *g = blk_alloc(b, (size_t)T * ov);
        if (!g)
            return -1;
        blk_matmul(b, &w->g, x, T, g);
        for (size_t i = 0; i < (size_t)T * ov; i++)
            o[i] *= blk_sigmoid(g[i]);
    }
    blk_matmul(b, &w->o, o, T, out);
    return 0;
}
