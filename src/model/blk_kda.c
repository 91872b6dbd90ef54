/* blk_kda.c — Kimi Delta Attention over T positions: projections, short causal conv with its
 * state, then per head the exact recurrence (never chunked, so prefill and decode compute the
 * same numbers):
 *
 *   S <- diag(alpha) S            decay the key rows first
 *   u  = S^T k                    predict with the decayed state
 *   S <- S + k (beta (v - u))^T   delta-rule write
 *   o  = S^T q                    read the updated state
 *
 * then per head RMSNorm(o) * o_norm * sigmoid(gate) and o_proj. alpha = exp(g) with
 * g = lb * sigmoid(A (f + dt_bias)) (K3, lower-bound gate) or -A softplus(f + dt_bias)
 * (Kimi-Linear). q and k are L2-normalised (eps 1e-6 inside the root), q scaled by dk^-1/2.
 * Heads run in parallel; each head's loop over t is sequential.
 */
#include <string.h>

#include "model/blk.h"

/* Causal depthwise conv + SiLU over T positions for one of q/k/v, in place in u[T][P]. For each
 * position t and channel c: acc = 0, then acc = acc + w[c][j] * raw(t + j - (K-1), c) for
 * j = 0 .. K-1 (the multiply and the add each rounded), raw positions below 0 coming from win_in
 * (the last K-1 raw inputs, oldest first); then u = acc * sigmoid(acc), which is kern's SwiGLU
 * against ones (times 1 is exact), so a whole row goes through glu's vectors. Positions run last
 * to first, so each still finds the raw inputs below it, and a row runs channel-minor (the taps
 * transposed once), so its loads are rows of u rather than one channel down the T positions (the
 * scalar sigmoids and the strided loads were 8% of the bundled model's long prompt,
 * bench/results/engine.md). The window after the T positions goes to win_out (which may be
 * win_in) from a copy taken first. scratch: blk_kda_conv_floats(K, P). */
static void short_conv(const kern_ops *k, const float *wt, int K, int P, const float *win_in, float *win_out,
                       float *u, int T, float *scratch)
{
    float *wtr = scratch, *nw = wtr + (size_t)K * P, *ones = nw + (size_t)(K - 1) * P, *acc = ones + P;
    for (int c = 0; c < P; c++) {
        ones[c] = 1.0f;
        for (int j = 0; j < K; j++)
            wtr[(size_t)j * P + c] = wt[(size_t)c * K + j];
    }
    for (int j = 0; j < K - 1; j++) { /* the new window's row j: raw position T - (K-1) + j */
        int s = T - (K - 1) + j;
        memcpy(nw + (size_t)j * P, s < 0 ? win_in + (size_t)(s + K - 1) * P : u + (size_t)s * P,
               sizeof(float) * (size_t)P);
    }
    for (int t = T - 1; t >= 0; t--) {
        for (int c = 0; c < P; c++)
            acc[c] = 0.0f;
        for (int j = 0; j < K; j++) {
            int s = t + j - (K - 1);
            const float *raw = s < 0 ? win_in + (size_t)(s + K - 1) * P : u + (size_t)s * P, *w = wtr + (size_t)j * P;
            for (int c = 0; c < P; c++)
                acc[c] = acc[c] + w[c] * raw[c];
        }
        k->glu(KERN_GLU_SWIGLU, acc, ones, P, 0.0f, 0.0f);
        memcpy(u + (size_t)t * P, acc, sizeof(float) * (size_t)P);
    }
    memcpy(win_out, nw, sizeof(float) * (size_t)(K - 1) * P);
}

/* v[i] = km_sigmoidf(v[i]) for i < n, that is 1 / (1 + km_expf(-v[i])), the exponentials in kern's
 * vectors: exp_sub's km_expf(x - +0) is km_expf(x), -0 included. */
static void kda_sigmoids(const kern_ops *k, float *v, int n)
{
    for (int i = 0; i < n; i++)
        v[i] = -v[i];
    k->exp_sub(v, n, 0.0f);
    for (int i = 0; i < n; i++)
        v[i] = 1.0f / (1.0f + v[i]);
}

struct kda_job {
    const blk *b;
    const kda_w *w;
    layer_state *st;
    const float *q, *k, *v, *f, *beta, *gate;
    float *o; /* NULL: only the state is wanted (replay) */
    int T;
};

static void kda_heads(void *ctx, int h0, int h1, int tid)
{
    struct kda_job *j = ctx;
    const hparams *hp = j->b->hp;
    int d = hp->kda_dim, P = hp->kda_heads * d;
    float *scr = pool_scratch(j->b->pool, tid); /* blk_kda_scratch_floats */
    float *q = scr, *k = q + d, *alpha = k + d, *u = alpha + d, *o = u + d, *sg = o + d;
    int lower = hp->kda_gate == KDA_GATE_LOWER_BOUND;
    float qscale = 1.0f / sqrtf((float)d);
    for (int h = h0; h < h1; h++) {
        float *S = j->st->S + (size_t)h * d * d;
        if (j->st->S_in != j->st->S)
            memcpy(S, j->st->S_in + (size_t)h * d * d, sizeof(float) * (size_t)d * d);
        for (int t = 0; t < j->T; t++) {
            size_t base = (size_t)t * P + (size_t)h * d;
            const float *v = j->v + base;
            float qn = 0.0f, kn = 0.0f;
            for (int i = 0; i < d; i++) {
                qn += j->q[base + i] * j->q[base + i];
                kn += j->k[base + i] * j->k[base + i];
            }
            float qr = 1.0f / sqrtf(qn + 1e-6f), kr = 1.0f / sqrtf(kn + 1e-6f);
            for (int i = 0; i < d; i++) {
                q[i] = j->q[base + i] * qr * qscale;
                k[i] = j->k[base + i] * kr;
                float z = j->f[base + i] + j->w->dt_bias[h * d + i];
                alpha[i] = lower ? j->w->A[h] * z : -j->w->A[h] * km_softplusf(z);
            }
            if (lower) {
                kda_sigmoids(j->b->k, alpha, d);
                for (int i = 0; i < d; i++)
                    alpha[i] = hp->kda_lower_bound * alpha[i];
            }
            j->b->k->exp_sub(alpha, d, 0.0f); /* alpha = exp(g), as km_expf(g - +0) */
            float beta = blk_sigmoid(j->beta[(size_t)t * hp->kda_heads + h]);
            j->b->k->kda_step(S, d, k, v, q, alpha, beta, o, u);
            if (!j->o)
                continue;
            /* gated RMSNorm over the head, norm before gate */
            float ss = 0.0f;
            for (int c = 0; c < d; c++)
                ss += o[c] * o[c];
            float rn = 1.0f / sqrtf(ss / (float)d + hp->rms_eps);
            float *out = j->o + base;
            memcpy(sg, j->gate + base, sizeof(float) * (size_t)d);
            kda_sigmoids(j->b->k, sg, d);
            for (int c = 0; c < d; c++)
                out[c] = o[c] * rn * j->w->o_norm[c] * sg[c];
        }
    }
}

size_t blk_kda_log_floats(const hparams *hp) { return 4 * (size_t)hp->kda_heads * hp->kda_dim + hp->kda_heads; }

/* The recurrence from the raw projections q, k, v [T][P] (conv'd in place), f [T][P] and beta
 * logits [T][heads]: the one code path of both the pass and its replay, so their states agree to
 * the bit. */
static int kda_recur(const blk *b, const kda_w *w, layer_state *st, float *q, float *k, float *v, const float *f,
                     const float *beta, const float *gate, float *o, int T)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim, K = hp->conv_k;
    float *tmp = blk_alloc(b, blk_kda_conv_floats(K, P));
    if (!tmp)
        return -1;
    float *proj[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        short_conv(b->k, w->conv[i], K, P, st->conv_in + (size_t)i * (K - 1) * P,
                   st->conv + (size_t)i * (K - 1) * P, proj[i], T, tmp);
    struct kda_job j = {b, w, st, q, k, v, f, beta, gate, o, T};
    pool_for(b->pool, hp->kda_heads, kda_heads, &j);
    return 0;
}

int blk_kda(const blk *b, const kda_w *w, layer_state *st, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim;
    float *q = blk_alloc(b, (size_t)T * P), *k = blk_alloc(b, (size_t)T * P), *v = blk_alloc(b, (size_t)T * P);
    float *fa = blk_alloc(b, (size_t)T * w->f_a.rows), *f = blk_alloc(b, (size_t)T * P);
    float *beta = blk_alloc(b, (size_t)T * hp->kda_heads), *gate = blk_alloc(b, (size_t)T * P);
    float *o = blk_alloc(b, (size_t)T * P);
    float *ga = hp->kda_full_gate ? NULL : blk_alloc(b, (size_t)T * w->g_a.rows);
    if (!q || !k || !v || !fa || !f || !beta || !gate || !o || (!hp->kda_full_gate && !ga))
        return -1;
    blk_matmul(b, &w->q, x, T, q);
    blk_matmul(b, &w->k, x, T, k);
    blk_matmul(b, &w->v, x, T, v);
    blk_matmul(b, &w->f_a, x, T, fa);
    blk_matmul(b, &w->f_b, fa, T, f);
    blk_matmul(b, &w->b, x, T, beta);
    if (hp->kda_full_gate) {
        blk_matmul(b, &w->g, x, T, gate);
    } else {
        blk_matmul(b, &w->g_a, x, T, ga);
        blk_matmul(b, &w->g_b, ga, T, gate);
    }
    if (st->log) { /* [t]: raw q, k, v, f, beta */
        size_t L = blk_kda_log_floats(hp), PB = sizeof(float) * (size_t)P;
        for (int t = 0; t < T; t++) {
            float *lg = st->log + (size_t)t * L;
            memcpy(lg, q + (size_t)t * P, PB);
            memcpy(lg + P, k + (size_t)t * P, PB);
            memcpy(lg + 2 * (size_t)P, v + (size_t)t * P, PB);
            memcpy(lg + 3 * (size_t)P, f + (size_t)t * P, PB);
            memcpy(lg + 4 * (size_t)P, beta + (size_t)t * hp->kda_heads, sizeof(float) * (size_t)hp->kda_heads);
        }
    }
    if (kda_recur(b, w, st, q, k, v, f, beta, gate, o, T))
        return -1;
    blk_matmul(b, &w->o, o, T, out);
    return 0;
}

int blk_kda_replay(const blk *b, const kda_w *w, layer_state *st, const float *log, int n)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim, nh = hp->kda_heads;
    if (n < 1)
        return 0;
    float *q = blk_alloc(b, (size_t)n * P), *k = blk_alloc(b, (size_t)n * P), *v = blk_alloc(b, (size_t)n * P);
    float *f = blk_alloc(b, (size_t)n * P), *beta = blk_alloc(b, (size_t)n * nh);
    if (!q || !k || !v || !f || !beta)
        return -1;
    size_t L = blk_kda_log_floats(hp), PB = sizeof(float) * (size_t)P;
    for (int t = 0; t < n; t++) {
        const float *lg = log + (size_t)t * L;
        memcpy(q + (size_t)t * P, lg, PB);
        memcpy(k + (size_t)t * P, lg + P, PB);
        memcpy(v + (size_t)t * P, lg + 2 * (size_t)P, PB);
        memcpy(f + (size_t)t * P, lg + 3 * (size_t)P, PB);
        memcpy(beta + (size_t)t * nh, lg + 4 * (size_t)P, sizeof(float) * (size_t)nh);
    }
    layer_state in_place = *st;
    in_place.S_in = st->S;
    in_place.conv_in = st->conv;
    return kda_recur(b, w, &in_place, q, k, v, f, beta, NULL, NULL, n);
}
