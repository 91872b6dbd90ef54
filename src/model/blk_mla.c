/* blk_mla.c — multi-head latent attention (DeepSeek-V3, Kimi K2, Kimi-Linear, Kimi K3).
 *
 * Cached per token: the RMS-normed latent c (kv_lora) and the key's rope part k_pe (qk_rope,
 * rotated when the family has RoPE, raw for NoPE). Attention runs in absorbed form, per head:
 *   qa = Wk_h^T q_nope                 (kv_lora)
 *   score(s) = (qa . c_s + q_pe . k_pe_s) * scale,   s <= position
 *   ol = sum_s softmax(score)_s c_s    (kv_lora)
 *   o_h = Wv_h ol                      (v_head)
 * with Wk_h / Wv_h the head's rows of kv_b_proj. K3 multiplies o by sigmoid(x g^T) before
 * o_proj. Work items are blocks of heads x tokens run in parallel, each reading the cache a run of
 * rows at a time for all its query rows (every head reads the same latent rows); each query still
 * visits its keys in position order with blk_mla_query's steps, so its result does not depend on
 * how the prompt was chunked or which rows shared its item.
 */
#include <assert.h>
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
    k->axpy_rows(qa, (size_t)r, qh, (size_t)nope, 1, wk, (size_t)r, nope, r); /* the nope axpys in turn */
    for (int s = 0; s < n; s++) {
        const float *cs = row(ud, s);
        float v = k->dot(qa, cs, r);
        if (rope)
            v += k->dot(qh + nope, cs + r, rope);
        sc[s] = v;
    }
    k->softmax_rows(sc, 0, &n, 1, scale);
    for (int i = 0; i < r; i++)
        ol[i] = 0.0f;
    for (int s = 0; s < n; s++)
        k->axpy(ol, row(ud, s), sc[s], r);
    k->dot_rows(ol, wv, (size_t)r, vd, r, oh); /* the vd dots */
}

struct mla_job {
    const blk *b;
    const mla_w *w;
    const float *q;   /* [T][nh][nope + rope] */
    const layer_state *st; /* the cache: rows of kv_lora + rope */
    float *o;         /* [T][nh][v] */
    int T, pos0;
    int tb, hb, tper; /* an item's tokens and heads (at most), token blocks per block of heads */
};

/* The matmuls' scratch at the head of an item's (their longest rows: the latent's or the rope's) */
static size_t mla_mm_floats(const hparams *hp)
{
    return kern_scratch_floats((size_t)(hp->kv_lora_rank > hp->qk_rope ? hp->kv_lora_rank : hp->qk_rope));
}

size_t blk_mla_scratch_floats(const hparams *hp, int context)
{
    size_t r = (size_t)hp->kv_lora_rank, wide = (size_t)(hp->qk_nope > hp->v_head ? hp->qk_nope : hp->v_head);
    size_t R = BLK_ATT_ROWS, rope = (size_t)hp->qk_rope;
    return mla_mm_floats(hp) + wide * r + 2 * R * r + R * rope + R * BLK_KV_CHUNK + blk_att_score_floats(context);
}

/* Work item i: heads [h0, h1) x tokens [t0, t1), every query row of which is blk_mla_query's
 * steps in its order (qa, the scores, the softmax, ol, o), with the steps over the cache taken for
 * all the item's rows at once: all heads read the same latent rows, and so do a head's tokens. Row
 * rho is head h0 + rho / nt, token t0 + rho % nt, so one decode of a head's Wk (then its Wv)
 * serves its tokens. A dot is an F32 matrix row's product (kern.h), so the scores are matmuls of
 * a cache chunk's rows (latent, then rope parts) against the rows' qa (then q_pe), and o is one of
 * the head's Wv against its rows' ol: register tiles of several keys times several rows, where a
 * dot at a time reloaded the query for every key. A row's scores past its own position are
 * computed and never read. The weighted sums go a run of BLK_ATT_KEYS rows at a time. */
static void mla_rows(void *ctx, int i0, int i1, int tid)
{
    struct mla_job *j = ctx;
    const hparams *hp = j->b->hp;
    const kern_ops *k = j->b->k;
    int nh = hp->n_heads, nope = hp->qk_nope, rope = hp->qk_rope, r = hp->kv_lora_rank, vd = hp->v_head;
    size_t W = (size_t)r + rope, qd = (size_t)nope + rope;
    float *mm = pool_scratch(j->b->pool, tid);                  /* the matmuls' (kern.h) */
    float *wkv = mm + mla_mm_floats(hp);                        /* a head's Wk [nope][r], then Wv [vd][r] */
    float *qa = wkv + (size_t)(nope > vd ? nope : vd) * r;      /* [R][r] */
    float *ol = qa + (size_t)BLK_ATT_ROWS * r;                  /* [R][r] */
    float *qp = ol + (size_t)BLK_ATT_ROWS * r;                  /* [R][rope] the rows' q_pe */
    float *pe = qp + (size_t)BLK_ATT_ROWS * rope;               /* [R][BLK_KV_CHUNK] a chunk's rope scores */
    float *sc = pe + (size_t)BLK_ATT_ROWS * BLK_KV_CHUNK;       /* [R][ld] */
    for (int i = i0; i < i1; i++) {
        int h0 = i / j->tper * j->hb, t0 = i % j->tper * j->tb;
        int h1 = h0 + j->hb < nh ? h0 + j->hb : nh, t1 = t0 + j->tb < j->T ? t0 + j->tb : j->T;
        int nt = t1 - t0, R = (h1 - h0) * nt, nmax = j->pos0 + t1;
        size_t ld = ((size_t)nmax + 15) / 16 * 16;
        assert(R <= BLK_ATT_ROWS);
        for (int h = h0; h < h1; h++) {
            int row = h * (nope + vd);
            k->decode_rows(&j->w->kv_b, row, row + nope, wkv);
            float *a = qa + (size_t)(h - h0) * nt * r; /* the head's rows, t0 .. t1 - 1 */
            for (size_t e = 0; e < (size_t)nt * r; e++)
                a[e] = 0.0f;
            k->axpy_rows(a, (size_t)r, j->q + ((size_t)t0 * nh + h) * qd, (size_t)nh * qd, nt, wkv, (size_t)r, nope,
                         r); /* each row's nope axpys in turn */
        }
        for (int rho = 0; rho < R && rope; rho++)
            memcpy(qp + (size_t)rho * rope, j->q + ((size_t)(t0 + rho % nt) * nh + h0 + rho / nt) * qd + nope,
                   sizeof(float) * (size_t)rope);
        for (int s0 = 0; s0 < nmax; s0 += BLK_KV_CHUNK) { /* a chunk's rows are W floats apart */
            int m = nmax - s0 < BLK_KV_CHUNK ? nmax - s0 : BLK_KV_CHUNK;
            const float *c = blk_kv_row(j->st, s0, W);
            kmat lat = {.fmt = WF_F32, .rows = m, .cols = r, .data = (const uint8_t *)c,
                        .row_bytes = W * sizeof(float)};
            k->matmul(&lat, 0, m, qa, (size_t)r, R, sc + s0, ld, mm);
            if (rope) {
                kmat kpe = lat;
                kpe.cols = rope;
                kpe.data = (const uint8_t *)(c + r);
                k->matmul(&kpe, 0, m, qp, (size_t)rope, R, pe, BLK_KV_CHUNK, mm);
                for (int rho = 0; rho < R; rho++)
                    for (int s = 0; s < m; s++)
                        sc[(size_t)rho * ld + s0 + s] += pe[(size_t)rho * BLK_KV_CHUNK + s];
            }
        }
        int n[BLK_ATT_ROWS];
        for (int rho = 0; rho < R; rho++) {
            float *o = ol + (size_t)rho * r;
            n[rho] = j->pos0 + t0 + rho % nt + 1;
            for (int e = 0; e < r; e++)
                o[e] = 0.0f;
        }
        k->softmax_rows(sc, ld, n, R, hp->attn_scale);
        for (int s0 = 0; s0 < nmax; s0 += BLK_ATT_KEYS)
            blk_att_sums(k, ol, (size_t)r, sc, ld, n, R, s0, blk_kv_row(j->st, s0, W), W, r);
        for (int h = h0; h < h1; h++) {
            int row = h * (nope + vd);
            k->decode_rows(&j->w->kv_b, row + nope, row + nope + vd, wkv);
            kmat wv;
            kmat_init(&wv, WF_F32, vd, r, wkv, NULL);
            k->matmul(&wv, 0, vd, ol + (size_t)(h - h0) * nt * r, (size_t)r, nt, j->o + ((size_t)t0 * nh + h) * vd,
                      (size_t)nh * vd, mm); /* the vd dots of each token */
        }
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
    /* an item's rows: a head's tokens first (one decode of its Wk and Wv serves them), then more
     * heads while the rows allow (decode's one token: a run of the cache serves several heads) */
    int rows = blk_att_item_rows(nh * T / (4 * pool_size(b->pool)), pos0 + T);
    int tb = T < rows ? T : rows, hb = rows / tb;
    struct mla_job j = {b, w, q, st, o, T, pos0, tb, hb, (T + tb - 1) / tb};
    pool_for(b->pool, (nh + hb - 1) / hb * j.tper, mla_rows, &j);
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
