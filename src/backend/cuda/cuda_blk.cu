/* cuda_blk.cu — see cuda_blk.h. Built with cuda_kern.cu's flags (-fmad=false, IEEE division and
 * square root), so each expression rounds as the CPU's C does.
 *
 * A seq64 dot (a norm's sum of squares, an attention score) is one warp (cuda_warp.cuh). Sequential loops of the CPU code (a softmax's max and its sum over
 * keys in order) run in one thread, in the same order. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_blk.h"
#include "model/model.h"
}
#include "backend/cuda/cuda_warp.cuh"
#include "kernels/kmath.h"
#include "model/moe_route.h"

enum { KV_CHUNK = 256 }; /* blk.h's BLK_KV_CHUNK */

/* one warp per row; every lane has read its x before the shuffles, so y may be x */
__global__ void k_rmsnorm(const float *x, const float *w, int T, int n, size_t ld, float eps, float *y)
{
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= T)
        return;
    const float *xt = x + (size_t)t * ld;
    float *yt = y + (size_t)t * ld;
    float ss = warp_dot64(xt, xt, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x & 31; i < n; i += 32)
        yt[i] = w ? xt[i] * r * w[i] : xt[i] * r;
}

extern "C" void cudab_rmsnorm(const float *x, const float *w, int T, int n, size_t ld, float eps, float *y,
                              void *stream)
{
    if (T > 0)
        k_rmsnorm<<<(unsigned)((T + 7) / 8), 256, 0, (cudaStream_t)stream>>>(x, w, T, n, ld, eps, y);
}

__global__ void k_add(float *y, const float *a, size_t n)
{
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n)
        y[j] = y[j] + a[j];
}

extern "C" void cudab_add(float *y, const float *a, size_t n, void *stream)
{
    if (n)
        k_add<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(y, a, n);
}

/* one thread per rotated pair */
__global__ void k_rope(float *v, int rows, int heads, int hd, int off, int rope_dim, int interleaved, const float *cs)
{
    int h = rope_dim / 2;
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)rows * h)
        return;
    int row = (int)(e / h), i = (int)(e % h), t = row / heads;
    float *vr = v + (size_t)row * hd + off;
    const float *c = cs + (size_t)t * rope_dim, *s = c + h;
    int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + h;
    float a = vr[ia], b = vr[ib];
    vr[ia] = a * c[i] - b * s[i];
    vr[ib] = b * c[i] + a * s[i];
}

extern "C" void cudab_rope(float *v, int T, int heads, int hd, int off, int rope_dim, int interleaved,
                           const float *cs, void *stream)
{
    size_t n = (size_t)T * heads * (rope_dim / 2);
    if (n)
        k_rope<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(v, T * heads, heads, hd, off,
                                                                              rope_dim, interleaved, cs);
}

__global__ void k_gqa_store(float *const *chunks, int pos0, int T, const float *k, const float *v, int nkv, int hd)
{
    size_t KV = (size_t)nkv * hd, e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)T * 2 * KV)
        return;
    int t = (int)(e / (2 * KV)), p = pos0 + t;
    size_t i = e % (2 * KV);
    float *row = chunks[p / KV_CHUNK] + (size_t)(p % KV_CHUNK) * 2 * KV;
    row[i] = i < KV ? k[(size_t)t * KV + i] : v[(size_t)t * KV + i - KV];
}

extern "C" void cudab_gqa_store(float *const *chunks, int pos0, int T, const float *k, const float *v, int nkv,
                                int hd, void *stream)
{
    size_t n = (size_t)T * 2 * nkv * hd;
    if (n)
        k_gqa_store<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(chunks, pos0, T, k, v, nkv, hd);
}

/* One block per (query t, head h), as blk_gqa.c's gqa_heads: scores (one warp per key), the scale,
 * the max and the sum in key order by one thread, the exponentials and divisions element by
 * element, then each output element's weighted sum over the value rows in order. */
__global__ void k_gqa_attend(const float *q, float *const *chunks, int pos0, int nh, int nkv, int hd, float scale,
                             float *sc, float *o)
{
    __shared__ float red;
    int t = blockIdx.x / nh, h = blockIdx.x % nh, kvh = h / (nh / nkv), n = pos0 + t + 1;
    size_t W = 2 * (size_t)nkv * hd;
    const float *qh = q + ((size_t)t * nh + h) * hd;
    float *s = sc + (size_t)blockIdx.x * (size_t)(gridDim.x / nh + pos0);
    int warps = blockDim.x / 32, wi = threadIdx.x / 32;
    for (int k = wi; k < n; k += warps) {
        float d = warp_dot64(qh, chunks[k / KV_CHUNK] + (size_t)(k % KV_CHUNK) * W + (size_t)kvh * hd, hd);
        if ((threadIdx.x & 31) == 0)
            s[k] = d;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int k = 0; k < n; k++) {
            s[k] = s[k] * scale;
            mx = s[k] > mx ? s[k] : mx;
        }
        red = mx;
    }
    __syncthreads();
    float mx = red;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s[k] = km_expf(s[k] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int k = 0; k < n; k++)
            sum += s[k];
        red = sum;
    }
    __syncthreads();
    float sum = red;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s[k] = s[k] / sum;
    __syncthreads();
    float *oh = o + ((size_t)t * nh + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++)
            acc = __fmaf_rn(s[k], chunks[k / KV_CHUNK][(size_t)(k % KV_CHUNK) * W + (size_t)(nkv + kvh) * hd + i], acc);
        oh[i] = acc;
    }
}

extern "C" void cudab_gqa_attend(const float *q, float *const *chunks, int pos0, int T, int nh, int nkv, int hd,
                                 float scale, float *sc, float *o, void *stream)
{
    if (T > 0)
        k_gqa_attend<<<(unsigned)(T * nh), 128, 0, (cudaStream_t)stream>>>(q, chunks, pos0, nh, nkv, hd, scale, sc,
                                                                          o);
}

/* one thread per position: moe_route.h's own code */
__global__ void k_route(hparams hp, const float *bias, const float *logit, int T, float *tmp, int *sel, float *wt)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T)
        return;
    size_t E = (size_t)hp.n_experts, K = (size_t)hp.top_k;
    moe_route(&hp, bias, logit + t * E, tmp + t * 2 * E, sel + t * K, wt + t * K);
}

extern "C" void cudab_route(const hparams *hp, const float *bias, const float *logit, int T, float *tmp, int *sel,
                            float *wt, void *stream)
{
    if (T > 0)
        k_route<<<(unsigned)((T + 63) / 64), 64, 0, (cudaStream_t)stream>>>(*hp, bias, logit, T, tmp, sel, wt);
}

__global__ void k_gather(const float *x, const int *order, int n, int K, int D, float *gx)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < (size_t)n * D)
        gx[e] = x[(size_t)(order[e / D] / K) * D + e % D];
}

extern "C" void cudab_gather(const float *x, const int *order, int n, int K, int D, float *gx, void *stream)
{
    size_t m = (size_t)n * D;
    if (m)
        k_gather<<<(unsigned)((m + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, order, n, K, D, gx);
}

__global__ void k_scatter(const float *gy, const int *order, int n, int D, float *slots)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < (size_t)n * D)
        slots[(size_t)order[e / D] * D + e % D] = gy[e];
}

extern "C" void cudab_scatter(const float *gy, const int *order, int n, int D, float *slots, void *stream)
{
    size_t m = (size_t)n * D;
    if (m)
        k_scatter<<<(unsigned)((m + 255) / 256), 256, 0, (cudaStream_t)stream>>>(gy, order, n, D, slots);
}

__global__ void k_moe_sum(const float *slots, const float *wt, int T, int K, int D, float *r)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)T * D)
        return;
    size_t t = e / D, i = e % D;
    float acc = 0.0f;
    for (int s = 0; s < K; s++)
        acc = __fmaf_rn(wt[t * K + s], slots[(t * K + s) * D + i], acc);
    r[e] = acc;
}

extern "C" void cudab_moe_sum(const float *slots, const float *wt, int T, int K, int D, float *r, void *stream)
{
    size_t m = (size_t)T * D;
    if (m)
        k_moe_sum<<<(unsigned)((m + 255) / 256), 256, 0, (cudaStream_t)stream>>>(slots, wt, T, K, D, r);
}

enum { MIX_MAX = 64 };
struct mix_src {
    float *p[MIX_MAX]; /* the stack's blocks, then the prefix */
};

/* One block per position, as blk_attnres_mix: each source's RMS and score (one warp per source),
 * the softmax by one thread in source order, then each element's weighted sum in source order. */
__global__ void k_attnres_mix(mix_src src, int n, const float *u, int H, float eps, float *out)
{
    __shared__ float s[MIX_MAX];
    size_t t = blockIdx.x;
    int wi = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int j = wi; j < n; j += warps) {
        const float *v = src.p[j] + t * H;
        float ss = warp_dot64(v, v, H);
        float r = 1.0f / sqrtf(ss / (float)H + eps);
        float d = warp_dot64(v, u, H);
        if ((threadIdx.x & 31) == 0)
            s[j] = d * r;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++)
            mx = s[j] > mx ? s[j] : mx;
        for (int j = 0; j < n; j++)
            s[j] = km_expf(s[j] - mx);
        for (int j = 0; j < n; j++)
            sum += s[j];
        for (int j = 0; j < n; j++)
            s[j] = s[j] / sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++)
            acc = __fmaf_rn(s[j], src.p[j][t * H + i], acc);
        out[t * H + i] = acc;
    }
}

extern "C" void cudab_attnres_mix(float *const *stack, int ns, const float *prefix, const float *u, int T, int H,
                                  float eps, float *out, void *stream)
{
    mix_src src;
    for (int j = 0; j < ns; j++)
        src.p[j] = stack[j];
    src.p[ns] = (float *)prefix;
    if (T > 0)
        k_attnres_mix<<<(unsigned)T, 256, 0, (cudaStream_t)stream>>>(src, ns + 1, u, H, eps, out);
}

__global__ void k_cache_store(float *const *chunks, int pos0, int T, const float *src, int W)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)T * W)
        return;
    int t = (int)(e / W), p = pos0 + t;
    chunks[p / KV_CHUNK][(size_t)(p % KV_CHUNK) * W + e % W] = src[e];
}

extern "C" void cudab_cache_store(float *const *chunks, int pos0, int T, const float *src, int W, void *stream)
{
    size_t n = (size_t)T * W;
    if (n)
        k_cache_store<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(chunks, pos0, T, src, W);
}

enum { MLA_MAX_R = 1024 };

/* One block per (query t, head h), blk_mla_query's steps in its order: qa = the axpys of Wk's rows
 * weighted by q_nope; each key's score as a seq64 dot over the latent plus one over the rope part
 * (one warp per key); the softmax's max and sum by one thread in key order; ol = the axpys of the
 * latent rows weighted by score / sum; then each output as a seq64 dot of a Wv row with ol. */
__global__ void k_mla_attend(const float *q, const float *wkv, float *const *chunks, int pos0, int nh, int nope,
                             int rope, int r, int vd, float scale, float *sc, float *o)
{
    __shared__ float qa[MLA_MAX_R], ol[MLA_MAX_R];
    __shared__ float red[2];
    int t = blockIdx.x / nh, h = blockIdx.x % nh, n = pos0 + t + 1, W = r + rope;
    int warps = blockDim.x / 32, wi = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float *qh = q + ((size_t)t * nh + h) * (nope + rope);
    const float *wk = wkv + (size_t)h * (nope + vd) * r, *wv = wk + (size_t)nope * r;
    float *s = sc + (size_t)blockIdx.x * (size_t)(gridDim.x / nh + pos0);
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        float a = 0.0f;
        for (int d = 0; d < nope; d++)
            a = __fmaf_rn(qh[d], wk[(size_t)d * r + i], a);
        qa[i] = a;
    }
    __syncthreads();
    for (int k = wi; k < n; k += warps) {
        const float *cs = chunks[k / KV_CHUNK] + (size_t)(k % KV_CHUNK) * W;
        float v = warp_dot64(qa, cs, r);
        if (rope)
            v = v + warp_dot64(qh + nope, cs + r, rope);
        if (lane == 0)
            s[k] = v * scale;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int k = 0; k < n; k++)
            mx = s[k] > mx ? s[k] : mx;
        red[0] = mx;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s[k] = km_expf(s[k] - red[0]);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int k = 0; k < n; k++)
            sum += s[k];
        red[1] = sum;
    }
    __syncthreads();
    float sum = red[1];
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        float a = 0.0f;
        for (int k = 0; k < n; k++)
            a = __fmaf_rn(s[k] / sum, chunks[k / KV_CHUNK][(size_t)(k % KV_CHUNK) * W + i], a);
        ol[i] = a;
    }
    __syncthreads();
    float *oh = o + ((size_t)t * nh + h) * vd;
    for (int e = wi; e < vd; e += warps) {
        float v = warp_dot64(wv + (size_t)e * r, ol, r);
        if (lane == 0)
            oh[e] = v;
    }
}

extern "C" void cudab_mla_attend(const float *q, const float *wkv, float *const *chunks, int pos0, int T, int nh,
                                 int nope, int rope, int r, int vd, float scale, float *sc, float *o, void *stream)
{
    if (T > 0)
        k_mla_attend<<<(unsigned)(T * nh), 256, 0, (cudaStream_t)stream>>>(q, wkv, chunks, pos0, nh, nope, rope, r, vd,
                                                                          scale, sc, o);
}

__global__ void k_gate(float *o, const float *g, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        o[i] = o[i] * km_sigmoidf(g[i]);
}

extern "C" void cudab_gate(float *o, const float *g, size_t n, void *stream)
{
    if (n)
        k_gate<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(o, g, n);
}

enum { CONV_MAX_K = 16 };

/* One thread per channel c: the last K - 1 raw inputs ride in a ring, so u is overwritten in place
 * as the CPU's copy (tmp) would be read: acc = sum_j w[j] * x(t + j) in j order, then SiLU. */
__global__ void k_short_conv(const float *wt, int K, int P, const float *win_in, float *win_out, float *u, int T)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= P)
        return;
    float ring[CONV_MAX_K]; /* ring[j] = x(t + j) for the window ending at t + K - 1 */
    for (int j = 0; j < K - 1; j++)
        ring[j] = win_in[(size_t)j * P + c];
    const float *w = wt + (size_t)c * K;
    for (int t = 0; t < T; t++) {
        ring[K - 1] = u[(size_t)t * P + c];
        float acc = 0.0f;
        for (int j = 0; j < K; j++)
            acc += w[j] * ring[j];
        u[(size_t)t * P + c] = acc * km_sigmoidf(acc);
        for (int j = 0; j < K - 1; j++)
            ring[j] = ring[j + 1];
    }
    for (int j = 0; j < K - 1; j++)
        win_out[(size_t)j * P + c] = ring[j];
}

extern "C" void cudab_short_conv(const float *wt, int K, int P, const float *win_in, float *win_out, float *u, int T,
                                 void *stream)
{
    k_short_conv<<<(unsigned)((P + 127) / 128), 128, 0, (cudaStream_t)stream>>>(wt, K, P, win_in, win_out, u, T);
}

enum { KDA_MAX_D = 256 };

/* One block of d threads per head, its positions in order. Thread 0 does the sums the CPU does
 * left to right (the norms of q and k, the output's sum of squares); thread i the element-wise
 * rest of element i; kda_step goes a column per thread, as cuda_kern.cu's k_kda_step. */
__global__ void k_kda_heads(hparams hp, const float *S_in, float *S, const float *q, const float *k, const float *v,
                            const float *f, const float *beta, const float *gate, const float *A, const float *dt_bias,
                            const float *o_norm, float *o, int T)
{
    __shared__ float qs[KDA_MAX_D], ks[KDA_MAX_D], al[KDA_MAX_D], os[KDA_MAX_D], red[3];
    int h = blockIdx.x, d = hp.kda_dim, P = hp.kda_heads * d, i = threadIdx.x;
    float *Sh = S + (size_t)h * d * d;
    if (S_in != S)
        for (int r = 0; r < d; r++)
            Sh[(size_t)r * d + i] = S_in[(size_t)h * d * d + (size_t)r * d + i];
    float qscale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) {
        size_t base = (size_t)t * P + (size_t)h * d;
        __syncthreads(); /* the last position's reads of the shared rows are done */
        if (i == 0) {
            float qn = 0.0f, kn = 0.0f;
            for (int j = 0; j < d; j++) {
                qn += q[base + j] * q[base + j];
                kn += k[base + j] * k[base + j];
            }
            red[0] = 1.0f / sqrtf(qn + 1e-6f);
            red[1] = 1.0f / sqrtf(kn + 1e-6f);
        }
        __syncthreads();
        qs[i] = q[base + i] * red[0] * qscale;
        ks[i] = k[base + i] * red[1];
        float z = f[base + i] + dt_bias[h * d + i], g;
        if (hp.kda_gate == KDA_GATE_LOWER_BOUND)
            g = hp.kda_lower_bound * km_sigmoidf(A[h] * z);
        else
            g = -A[h] * km_softplusf(z);
        al[i] = km_expf(g);
        __syncthreads();
        float bt = km_sigmoidf(beta[(size_t)t * hp.kda_heads + h]);
        /* kda_step, column i */
        float u = 0.0f;
        for (int r = 0; r < d; r++) {
            float sv = Sh[(size_t)r * d + i] * al[r];
            Sh[(size_t)r * d + i] = sv;
            u = __fmaf_rn(sv, ks[r], u);
        }
        u = bt * (v[base + i] - u);
        float oc = 0.0f;
        for (int r = 0; r < d; r++) {
            float sv = __fmaf_rn(ks[r], u, Sh[(size_t)r * d + i]);
            Sh[(size_t)r * d + i] = sv;
            oc = __fmaf_rn(sv, qs[r], oc);
        }
        if (!o)
            continue;
        os[i] = oc;
        __syncthreads();
        if (i == 0) {
            float ss = 0.0f;
            for (int c = 0; c < d; c++)
                ss += os[c] * os[c];
            red[2] = 1.0f / sqrtf(ss / (float)d + hp.rms_eps);
        }
        __syncthreads();
        o[base + i] = os[i] * red[2] * o_norm[i] * km_sigmoidf(gate[base + i]);
    }
}

extern "C" void cudab_kda_heads(const hparams *hp, const float *S_in, float *S, const float *q, const float *k,
                                const float *v, const float *f, const float *beta, const float *gate, const float *A,
                                const float *dt_bias, const float *o_norm, float *o, int T, void *stream)
{
    k_kda_heads<<<(unsigned)hp->kda_heads, (unsigned)hp->kda_dim, 0, (cudaStream_t)stream>>>(
        *hp, S_in, S, q, k, v, f, beta, gate, A, dt_bias, o_norm, o, T);
}
