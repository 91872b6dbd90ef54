/* cuda_blk.cu — see cuda_blk.h. Built with cuda_kern.cu's flags (-fmad=false, IEEE division and
 * square root), so each expression rounds as the CPU's C does.
 *
 * A dot (a norm's sum of squares, an attention score) is one half-warp (cuda_warp.cuh). Sequential
 * loops of the CPU code (a softmax's max and its sum over keys in order) run in one thread, in the
 * same order. At decode these kernels are a few blocks each, so a thread that waits on one read at
 * a time costs a memory latency per element: each reads a batch of elements before it uses any
 * (bench/results/cuda.md, 2026-12-04). */
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

/* v[0] + v[1] + ... + v[n - 1] left to right (the CPU's order) by thread 0, for every thread of the
 * block; red: a shared float. The whole block calls. */
__device__ float block_sum_in_order(const float *v, int n, float *red)
{
    if (threadIdx.x == 0) {
        float sum = 0.0f;
#pragma unroll 8
        for (int k = 0; k < n; k++)
            sum += v[k];
        *red = sum;
    }
    __syncthreads();
    float sum = *red;
    __syncthreads(); /* every thread has it before red is written again */
    return sum;
}

/* One block per row: a half-warp's sum of squares, then every thread's share of the row (y may be
 * x: a thread writes only elements it has read). A row of at most RMS_HOLD elements a thread (K3's
 * 7168 at 256 threads, every head's norm) is read into registers by every thread, and into shared
 * memory, from which a half-warp makes the sum, reading RMS_SQ a lane at a time (half_dot16): its
 * 16 lanes alone would wait for n / (16 RMS_SQ) memory latencies. Longer rows take RMS_BATCH
 * elements a thread per round after the sum. One warp writing the whole row one element at a time
 * took 38-46 us at 3584 (the compiler cannot hoist a read above a write that may alias it); reads
 * of eight at a time after a sum reading eight at a time, 7.3 us; this, 5.0 us (measured
 * with a warp's sum, bench/results/cuda.md). */
enum { RMS_THREADS = 256, RMS_BATCH = 8, RMS_HOLD = 28, RMS_SQ = 32 };

__global__ void __launch_bounds__(RMS_THREADS) k_rmsnorm(const float *x, const float *w, int n, size_t ld, float eps,
                                                         float *y)
{
    __shared__ float rs;
    extern __shared__ float row[]; /* [n] where the row is held, else none */
    const float *xt = x + (size_t)blockIdx.x * ld;
    float *yt = y + (size_t)blockIdx.x * ld;
    const int nt = blockDim.x;
    auto get = [&](int i, float &xv, float &wv) { /* element i and its weight (0 past n) */
        xv = i < n ? xt[i] : 0.0f;
        wv = w && i < n ? w[i] : 0.0f;
    };
    auto put = [&](int i, float xv, float wv, float r) {
        if (i < n)
            yt[i] = w ? xv * r * wv : xv * r;
    };
    auto scale = [&](const float *v) { /* 1 / RMS of v (the row), for every thread */
        if (threadIdx.x < 16) {
            float ss = half_dot16<RMS_SQ, true>(v, v, n);
            if (threadIdx.x == 0)
                rs = 1.0f / sqrtf(ss / (float)n + eps);
        }
        __syncthreads();
        return rs;
    };
    if (n <= RMS_HOLD * nt) {
        float xv[RMS_HOLD], wv[RMS_HOLD];
#pragma unroll
        for (int m = 0; m < RMS_HOLD; m++)
            get(threadIdx.x + m * nt, xv[m], wv[m]);
#pragma unroll
        for (int m = 0; m < RMS_HOLD; m++) /* after every read: a store may alias a later read */
            if (threadIdx.x + m * nt < n)
                row[threadIdx.x + m * nt] = xv[m];
        __syncthreads();
        float r = scale(row);
#pragma unroll
        for (int m = 0; m < RMS_HOLD; m++)
            put(threadIdx.x + m * nt, xv[m], wv[m], r);
        return;
    }
    float r = scale(xt);
    for (int i0 = threadIdx.x; i0 < n; i0 += RMS_BATCH * nt) {
        float xv[RMS_BATCH], wv[RMS_BATCH];
#pragma unroll
        for (int m = 0; m < RMS_BATCH; m++)
            get(i0 + m * nt, xv[m], wv[m]);
#pragma unroll
        for (int m = 0; m < RMS_BATCH; m++)
            put(i0 + m * nt, xv[m], wv[m], r);
    }
}

extern "C" void cudab_rmsnorm(const float *x, const float *w, int T, int n, size_t ld, float eps, float *y,
                              void *stream)
{
    /* a head's norm of a few dozen elements: a warp or a few */
    unsigned threads = n >= (int)RMS_THREADS ? (unsigned)RMS_THREADS : (unsigned)(n + 31) / 32 * 32;
    size_t held = n <= RMS_HOLD * (int)threads ? (size_t)n * sizeof(float) : 0;
    if (T > 0 && n > 0)
        k_rmsnorm<<<(unsigned)T, threads, held, (cudaStream_t)stream>>>(x, w, n, ld, eps, y);
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

/* One block per (query t, head h), as blk_gqa.c's gqa_heads: scores (one half-warp per key), the
 * scale, the max and the sum in key order by one thread, the exponentials and divisions element by
 * element, then each output element's weighted sum over the value rows in order. */
__global__ void k_gqa_attend(const float *q, float *const *chunks, int pos0, int nh, int nkv, int hd, float scale,
                             float *sc, float *o)
{
    __shared__ float red;
    int t = blockIdx.x / nh, h = blockIdx.x % nh, kvh = h / (nh / nkv), n = pos0 + t + 1;
    size_t W = 2 * (size_t)nkv * hd;
    const float *qh = q + ((size_t)t * nh + h) * hd;
    float *s = sc + (size_t)blockIdx.x * (size_t)(gridDim.x / nh + pos0);
    int halves = blockDim.x / 16, hi = threadIdx.x / 16;
    for (int k = hi; k < n; k += halves) {
        float d = half_dot16(qh, chunks[k / KV_CHUNK] + (size_t)(k % KV_CHUNK) * W + (size_t)kvh * hd, hd);
        if ((threadIdx.x & 15) == 0)
            s[k] = d;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
#pragma unroll 8
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
    float sum = block_sum_in_order(s, n, &red);
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s[k] = s[k] / sum;
    __syncthreads();
    float *oh = o + ((size_t)t * nh + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
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

/* One block per position, moe_route's steps (moe_route.h) with the element-wise ones spread over
 * the block: the scores and choices in tmp (2E floats a position), the softmax's sum and the
 * grouped routing's group picks in one thread in moe_route's order, then each expert's rank in
 * moe_before's order over the choices; the experts of rank below K, ascending, are moe_topk's
 * pick sorted by id. A choice that is NaN (compares false both ways) sends the position to
 * moe_topk itself, in one thread. Shared memory: a ballot word per 32 experts, then the K ids and
 * their weights. The serial router took 48 us a position on the H200 at 64 experts. */
enum { ROUTE_THREADS = 256 };

__global__ void k_route(hparams hp, const float *bias, const float *logit, float *tmp, int *sel, float *wt)
{
    extern __shared__ int rt_sh[];
    __shared__ float red;
    __shared__ float gscore[MODEL_MAX_GROUPS];
    __shared__ int gsel[MODEL_MAX_GROUPS];
    int t = blockIdx.x, E = hp.n_experts, K = hp.top_k, nw = (E + 31) / 32, lane = threadIdx.x & 31;
    const float *lg = logit + (size_t)t * E;
    float *score = tmp + (size_t)t * 2 * E, *choice = score + E;
    unsigned *mask = (unsigned *)rt_sh;
    int *sel_s = rt_sh + nw;
    float *wt_s = (float *)(sel_s + K);
    float mx = -INFINITY;
    if (hp.router == ROUTER_SOFTMAX) {
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            mx = moe_max_step(mx, lg[e]);
        for (int h = 16; h >= 1; h /= 2)
            mx = moe_max_step(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, h));
        if (threadIdx.x == 0)
            red = -INFINITY;
        __syncthreads();
        for (int w = 0; w < (int)blockDim.x / 32; w++) { /* the warps' maxima in turn (no float atomics) */
            if ((int)threadIdx.x == 32 * w)
                red = moe_max_step(red, mx);
            __syncthreads();
        }
        mx = red;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        score[e] = moe_score(&hp, lg, e, mx);
    __syncthreads();
    if (hp.router == ROUTER_SOFTMAX) {
        float sum = block_sum_in_order(score, E, &red);
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            score[e] /= sum;
        __syncthreads();
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        choice[e] = moe_choice(score, bias, e);
    __syncthreads();
    if (hp.n_group > 1) {
        int G = hp.n_group, per = E / G;
        for (int g = threadIdx.x; g < G; g += blockDim.x)
            gscore[g] = moe_group_score(choice, g, per);
        __syncthreads();
        if (threadIdx.x == 0)
            moe_topk(gscore, G, hp.topk_group, gsel);
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (!moe_group_kept(gsel, hp.topk_group, e / per))
                choice[e] = -INFINITY;
        __syncthreads();
    }
    int nan = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        nan |= choice[e] != choice[e];
    if (__syncthreads_or(nan)) {
        if (threadIdx.x == 0) {
            moe_topk(choice, E, K, sel_s);
            moe_sort_ids(sel_s, K);
        }
    } else {
        for (int c = threadIdx.x / 32; c < nw; c += blockDim.x / 32) {
            int e = 32 * c + lane, rank = 0;
            if (e < E)
                for (int i = 0; i < E && rank < K; i++)
                    rank += moe_before(choice, i, e);
            unsigned m = __ballot_sync(0xFFFFFFFFu, e < E && rank < K);
            if (lane == 0)
                mask[c] = m;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int c = 0, j = 0; c < nw; c++)
                for (unsigned m = mask[c]; m; m &= m - 1)
                    sel_s[j++] = 32 * c + __ffs((int)m) - 1;
    }
    if (threadIdx.x == 0)
        moe_weights(&hp, score, sel_s, wt_s);
    __syncthreads();
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        sel[(size_t)t * K + j] = sel_s[j];
        wt[(size_t)t * K + j] = wt_s[j];
    }
}

extern "C" void cudab_route(const hparams *hp, const float *bias, const float *logit, int T, float *tmp, int *sel,
                            float *wt, void *stream)
{
    size_t sh = sizeof(int) * ((size_t)(hp->n_experts + 31) / 32 + 2 * (size_t)hp->top_k);
    if (T > 0)
        k_route<<<(unsigned)T, ROUTE_THREADS, sh, (cudaStream_t)stream>>>(*hp, bias, logit, tmp, sel, wt);
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

enum { MIX_MAX = 64, MIX_THREADS = 512, MIX_BATCH = 8, MIX_SQ = 32 };
struct mix_src {
    float *p[MIX_MAX]; /* the stack's blocks, then the prefix */
};

/* One block per position, as blk_attnres_mix: each source's RMS and score (one warp per source, a
 * half-warp each for its sum of squares and its score, reads MIX_SQ at a time: half_dot16), the
 * softmax by one thread in source order, then each element's weighted sum in source order, a
 * thread's MIX_BATCH elements of four sources read before it adds any. The block first asks the L2
 * for every source row (they were written layers ago, and a MoE layer's experts have since passed
 * through the cache), so that the dots' reads wait on the L2 rather than on memory. At decode this
 * is a lone block bound by its dots' latency: 256 threads with eight reads a lane in flight took
 * 18.2 us on k3-wide, this 10.7 us (bench/results/cuda.md). */
__global__ void __launch_bounds__(MIX_THREADS) k_attnres_mix(mix_src src, int n, const float *u, int H, float eps,
                                                             float *out)
{
    __shared__ float s[MIX_MAX];
    size_t t = blockIdx.x;
    int wi = threadIdx.x / 32, warps = blockDim.x / 32, lines = (H + 31) / 32;
    for (int e = threadIdx.x; e < n * lines; e += blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(src.p[e / lines] + t * H + (size_t)(e % lines) * 32));
    for (int j = wi; j < n; j += warps) {
        const float *v = src.p[j] + t * H;
        float hv = threadIdx.x & 16 ? half_dot16<MIX_SQ>(v, u, H) : half_dot16<MIX_SQ, true>(v, v, H);
        float ss = __shfl_sync(0xFFFFFFFFu, hv, 0), d = __shfl_sync(0xFFFFFFFFu, hv, 16);
        float r = 1.0f / sqrtf(ss / (float)H + eps);
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
    for (int i0 = threadIdx.x; i0 < H; i0 += MIX_BATCH * blockDim.x) { /* MIX_BATCH elements a thread at once */
        float acc[MIX_BATCH];
#pragma unroll
        for (int m = 0; m < MIX_BATCH; m++)
            acc[m] = 0.0f;
#pragma unroll 4
        for (int j = 0; j < n; j++) {
            float vv[MIX_BATCH];
#pragma unroll
            for (int m = 0; m < MIX_BATCH; m++)
                vv[m] = i0 + m * (int)blockDim.x < H ? src.p[j][t * H + i0 + m * blockDim.x] : 0.0f;
#pragma unroll
            for (int m = 0; m < MIX_BATCH; m++)
                acc[m] = __fmaf_rn(s[j], vv[m], acc[m]);
        }
#pragma unroll
        for (int m = 0; m < MIX_BATCH; m++)
            if (i0 + m * (int)blockDim.x < H)
                out[t * H + i0 + m * blockDim.x] = acc[m];
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
        k_attnres_mix<<<(unsigned)T, MIX_THREADS, 0, (cudaStream_t)stream>>>(src, ns + 1, u, H, eps, out);
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
 * weighted by q_nope; each key's score as a dot over the latent plus one over the rope part (one
 * half-warp per key); the softmax's max and sum by one thread in key order; ol = the axpys of the
 * latent rows weighted by score / sum; then each output as a dot of a Wv row with ol (a half-warp
 * each). A thread's axpy chains (qa, ol) load MLA_UNROLL operands before adding any, and a dot's
 * lane MLA_DOT (a 512-wide latent in two rounds of reads). At decode, where the heads alone leave
 * most SMs empty, a block has MLA_WIDE threads, four times the warps to share the keys and
 * outputs: 113.7 -> 21.7 us a k3-wide layer (bench/results/cuda.md). */
enum { MLA_UNROLL = 32, MLA_WIDE = 1024, MLA_DOT = 16 };
__global__ void __launch_bounds__(MLA_WIDE)
    k_mla_attend(const float *q, const float *wkv, float *const *chunks, int pos0, int nh, int nope, int rope, int r,
                 int vd, float scale, float *sc, float *o)
{
    __shared__ float qa[MLA_MAX_R], ol[MLA_MAX_R];
    __shared__ float red[2];
    int t = blockIdx.x / nh, h = blockIdx.x % nh, n = pos0 + t + 1, W = r + rope;
    int halves = blockDim.x / 16, hi = threadIdx.x / 16, lane = threadIdx.x & 15;
    const float *qh = q + ((size_t)t * nh + h) * (nope + rope);
    const float *wk = wkv + (size_t)h * (nope + vd) * r, *wv = wk + (size_t)nope * r;
    float *s = sc + (size_t)blockIdx.x * (size_t)(gridDim.x / nh + pos0);
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        float a = 0.0f;
#pragma unroll MLA_UNROLL
        for (int d = 0; d < nope; d++)
            a = __fmaf_rn(qh[d], wk[(size_t)d * r + i], a);
        qa[i] = a;
    }
    __syncthreads();
    for (int k = hi; k < n; k += halves) {
        const float *cs = chunks[k / KV_CHUNK] + (size_t)(k % KV_CHUNK) * W;
        float v = half_dot16<MLA_DOT>(qa, cs, r);
        if (rope)
            v = v + half_dot16<MLA_DOT>(qh + nope, cs + r, rope);
        if (lane == 0)
            s[k] = v * scale;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
#pragma unroll 8
        for (int k = 0; k < n; k++)
            mx = s[k] > mx ? s[k] : mx;
        red[0] = mx;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s[k] = km_expf(s[k] - red[0]);
    __syncthreads();
    float sum = block_sum_in_order(s, n, &red[1]);
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        float a = 0.0f;
#pragma unroll MLA_UNROLL
        for (int k = 0; k < n; k++)
            a = __fmaf_rn(s[k] / sum, chunks[k / KV_CHUNK][(size_t)(k % KV_CHUNK) * W + i], a);
        ol[i] = a;
    }
    __syncthreads();
    float *oh = o + ((size_t)t * nh + h) * vd;
    for (int e = hi; e < vd; e += halves) {
        float v = half_dot16<MLA_DOT>(ol, wv + (size_t)e * r, r);
        if (lane == 0)
            oh[e] = v;
    }
}

extern "C" void cudab_mla_attend(const float *q, const float *wkv, float *const *chunks, int pos0, int T, int nh,
                                 int nope, int rope, int r, int vd, float scale, float *sc, float *o, void *stream)
{
    unsigned threads = T * nh <= 256 ? MLA_WIDE : 256;
    if (T > 0)
        k_mla_attend<<<(unsigned)(T * nh), threads, 0, (cudaStream_t)stream>>>(q, wkv, chunks, pos0, nh, nope, rope, r,
                                                                              vd, scale, sc, o);
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

enum { KDA_MAX_D = 256, KDA_BATCH = 16 };

/* One block of d threads per head, its positions in order. Threads 0 and 32 do the sums the CPU
 * does left to right (the norms of q and k, from shared memory), thread 0 the output's sum of
 * squares; thread i the element-wise rest of element i; kda_step goes a column per thread, as
 * cuda_kern.cu's k_kda_step, reading KDA_BATCH rows of its column before it uses any (the loads
 * then overlap instead of each waiting out the last). */
__global__ void k_kda_heads(hparams hp, const float *S_in, float *S, const float *q, const float *k, const float *v,
                            const float *f, const float *beta, const float *gate, const float *A, const float *dt_bias,
                            const float *o_norm, float *o, int T)
{
    __shared__ float qs[KDA_MAX_D], ks[KDA_MAX_D], al[KDA_MAX_D], os[KDA_MAX_D], red[3];
    int h = blockIdx.x, d = hp.kda_dim, P = hp.kda_heads * d, i = threadIdx.x;
    float *Sh = S + (size_t)h * d * d;
    if (S_in != S) /* (KDA_BATCH rows read before any is written: the reads overlap) */
        for (int r0 = 0; r0 < d; r0 += KDA_BATCH) {
            float sv[KDA_BATCH];
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                sv[m] = r0 + m < d ? S_in[(size_t)h * d * d + (size_t)(r0 + m) * d + i] : 0.0f;
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                if (r0 + m < d)
                    Sh[(size_t)(r0 + m) * d + i] = sv[m];
        }
    float qscale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) {
        size_t base = (size_t)t * P + (size_t)h * d;
        __syncthreads(); /* the last position's reads of the shared rows are done */
        qs[i] = q[base + i];
        ks[i] = k[base + i];
        __syncthreads();
        if (i == 0) {
            float qn = 0.0f;
            for (int j = 0; j < d; j++)
                qn += qs[j] * qs[j];
            red[0] = 1.0f / sqrtf(qn + 1e-6f);
        }
        if (i == (d > 32 ? 32 : 0)) {
            float kn = 0.0f;
            for (int j = 0; j < d; j++)
                kn += ks[j] * ks[j];
            red[1] = 1.0f / sqrtf(kn + 1e-6f);
        }
        __syncthreads();
        qs[i] = qs[i] * red[0] * qscale;
        ks[i] = ks[i] * red[1];
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
        for (int r0 = 0; r0 < d; r0 += KDA_BATCH) {
            float sv[KDA_BATCH];
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                sv[m] = r0 + m < d ? Sh[(size_t)(r0 + m) * d + i] : 0.0f;
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                if (r0 + m < d) {
                    float x = sv[m] * al[r0 + m];
                    Sh[(size_t)(r0 + m) * d + i] = x;
                    u = __fmaf_rn(x, ks[r0 + m], u);
                }
        }
        u = bt * (v[base + i] - u);
        float oc = 0.0f;
        for (int r0 = 0; r0 < d; r0 += KDA_BATCH) {
            float sv[KDA_BATCH];
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                sv[m] = r0 + m < d ? Sh[(size_t)(r0 + m) * d + i] : 0.0f;
#pragma unroll
            for (int m = 0; m < KDA_BATCH; m++)
                if (r0 + m < d) {
                    float x = __fmaf_rn(ks[r0 + m], u, sv[m]);
                    Sh[(size_t)(r0 + m) * d + i] = x;
                    oc = __fmaf_rn(x, qs[r0 + m], oc);
                }
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
