/* cuda_blk.cu — see cuda_blk.h. Built with cuda_kern.cu's flags (-fmad=false, IEEE division and
 * square root), so each expression rounds as the CPU's C does.
 *
 * A seq64 dot (a norm's sum of squares, an attention score) is one warp: thread j holds the sums
 * of lanes j and j + 32, whose add is the tree's first step, and shuffles do the rest, as
 * cuda_kern.cu's k_dot_rows. Sequential loops of the CPU code (a softmax's max and its sum over
 * keys in order) run in one thread, in the same order. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_blk.h"
}
#include "kernels/kmath.h"

enum { KV_CHUNK = 256 }; /* blk.h's BLK_KV_CHUNK */

/* seq64 dot of a and b over n, the whole warp calling; every lane gets the result */
__device__ __forceinline__ float warp_dot64(const float *a, const float *b, int n)
{
    int j = threadIdx.x & 31;
    float a0 = 0.0f, a1 = 0.0f;
    for (int i = j; i < n; i += 64) {
        a0 = __fmaf_rn(a[i], b[i], a0);
        if (i + 32 < n)
            a1 = __fmaf_rn(a[i + 32], b[i + 32], a1);
    }
    float v = a0 + a1;
    for (int h = 16; h >= 1; h /= 2)
        v = v + __shfl_down_sync(0xFFFFFFFFu, v, h);
    return __shfl_sync(0xFFFFFFFFu, v, 0);
}

/* one warp per row; every lane has read its x before the shuffles, so y may be x */
__global__ void k_rmsnorm(const float *x, const float *w, int T, int n, float eps, float *y)
{
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= T)
        return;
    const float *xt = x + (size_t)t * n;
    float *yt = y + (size_t)t * n;
    float ss = warp_dot64(xt, xt, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x & 31; i < n; i += 32)
        yt[i] = w ? xt[i] * r * w[i] : xt[i] * r;
}

extern "C" void cudab_rmsnorm(const float *x, const float *w, int T, int n, float eps, float *y, void *stream)
{
    if (T > 0)
        k_rmsnorm<<<(unsigned)((T + 7) / 8), 256, 0, (cudaStream_t)stream>>>(x, w, T, n, eps, y);
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
__global__ void k_rope(float *v, int rows, int heads, int hd, int rope_dim, int interleaved, const float *cs)
{
    int h = rope_dim / 2;
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)rows * h)
        return;
    int row = (int)(e / h), i = (int)(e % h), t = row / heads;
    float *vr = v + (size_t)row * hd;
    const float *c = cs + (size_t)t * rope_dim, *s = c + h;
    int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + h;
    float a = vr[ia], b = vr[ib];
    vr[ia] = a * c[i] - b * s[i];
    vr[ib] = b * c[i] + a * s[i];
}

extern "C" void cudab_rope(float *v, int T, int heads, int hd, int rope_dim, int interleaved, const float *cs,
                           void *stream)
{
    size_t n = (size_t)T * heads * (rope_dim / 2);
    if (n)
        k_rope<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(v, T * heads, heads, hd, rope_dim,
                                                                              interleaved, cs);
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
