/* cuda_warp.cuh — kern.h's seq64 dot product as one warp, for the CUDA kernels (cuda_kern.cu's
 * dot_rows, cuda_blk.cu's norms and attention scores). Thread j holds the partial sums of lanes j
 * and j + 32, each adding its elements in order with one FMA each; their add is the tree's first
 * step (h = 32) and shuffles do the rest (h = 16 .. 1), so the result is the scalar table's.
 * A thread loads WD_BATCH of its elements of each operand before it adds any of them: the loads
 * do not wait for one another, so a row costs about n / (64 WD_BATCH) memory latencies rather than
 * n / 32 (an RMSNorm of 3584 floats at decode: 42 -> a few us, bench/results/cuda.md). */
#ifndef DF_BACKEND_CUDA_CUDA_WARP_CUH
#define DF_BACKEND_CUDA_CUDA_WARP_CUH

enum { WD_BATCH = 8 };

/* seq64 dot of a and b over n, the whole warp calling; every lane gets the result */
__device__ __forceinline__ float warp_dot64(const float *a, const float *b, int n)
{
    int j = threadIdx.x & 31, i = j;
    float a0 = 0.0f, a1 = 0.0f;
    /* whole batches: both lanes' WD_BATCH elements exist (the last is i + 64 (WD_BATCH - 1) + 32) */
    for (; i + 64 * (WD_BATCH - 1) + 32 < n; i += 64 * WD_BATCH) {
        float x0[WD_BATCH], y0[WD_BATCH], x1[WD_BATCH], y1[WD_BATCH];
#pragma unroll
        for (int m = 0; m < WD_BATCH; m++) {
            x0[m] = a[i + 64 * m], y0[m] = b[i + 64 * m];
            x1[m] = a[i + 64 * m + 32], y1[m] = b[i + 64 * m + 32];
        }
#pragma unroll
        for (int m = 0; m < WD_BATCH; m++) {
            a0 = __fmaf_rn(x0[m], y0[m], a0);
            a1 = __fmaf_rn(x1[m], y1[m], a1);
        }
    }
    for (; i < n; i += 64) {
        a0 = __fmaf_rn(a[i], b[i], a0);
        if (i + 32 < n)
            a1 = __fmaf_rn(a[i + 32], b[i + 32], a1);
    }
    float v = a0 + a1;
    for (int h = 16; h >= 1; h /= 2)
        v = v + __shfl_down_sync(0xFFFFFFFFu, v, h);
    return __shfl_sync(0xFFFFFFFFu, v, 0);
}

/* warp_dot64(a, b, n) and warp_dot64(a, c, n) in one pass over a (their loads overlap) */
__device__ __forceinline__ void warp_dot64_2(const float *a, const float *b, const float *c, int n, float *ab,
                                             float *ac)
{
    int j = threadIdx.x & 31, i = j;
    float p0 = 0.0f, p1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
    for (; i + 64 * (WD_BATCH - 1) + 32 < n; i += 64 * WD_BATCH) {
        float x0[WD_BATCH], x1[WD_BATCH], y0[WD_BATCH], y1[WD_BATCH], z0[WD_BATCH], z1[WD_BATCH];
#pragma unroll
        for (int m = 0; m < WD_BATCH; m++) {
            x0[m] = a[i + 64 * m], y0[m] = b[i + 64 * m], z0[m] = c[i + 64 * m];
            x1[m] = a[i + 64 * m + 32], y1[m] = b[i + 64 * m + 32], z1[m] = c[i + 64 * m + 32];
        }
#pragma unroll
        for (int m = 0; m < WD_BATCH; m++) {
            p0 = __fmaf_rn(x0[m], y0[m], p0), p1 = __fmaf_rn(x1[m], y1[m], p1);
            q0 = __fmaf_rn(x0[m], z0[m], q0), q1 = __fmaf_rn(x1[m], z1[m], q1);
        }
    }
    for (; i < n; i += 64) {
        p0 = __fmaf_rn(a[i], b[i], p0), q0 = __fmaf_rn(a[i], c[i], q0);
        if (i + 32 < n)
            p1 = __fmaf_rn(a[i + 32], b[i + 32], p1), q1 = __fmaf_rn(a[i + 32], c[i + 32], q1);
    }
    float v = p0 + p1, u = q0 + q1;
    for (int h = 16; h >= 1; h /= 2) {
        v = v + __shfl_down_sync(0xFFFFFFFFu, v, h);
        u = u + __shfl_down_sync(0xFFFFFFFFu, u, h);
    }
    *ab = __shfl_sync(0xFFFFFFFFu, v, 0);
    *ac = __shfl_sync(0xFFFFFFFFu, u, 0);
}

/* warp_dot64(a, a, n) into *aa and, when C, warp_dot64(a, c, n) into *ac, a's elements loaded once
 * (a norm's sum of squares, an AttnRes score beside it), NB of each lane's at a time: a lone block
 * at decode waits a memory latency per batch, where warp_dot64 reads 8 of each operand at a time.
 * The same FMAs in the same order as warp_dot64. */
template <int NB, bool C>
__device__ __forceinline__ void warp_sq64(const float *a, const float *c, int n, float *aa, float *ac)
{
    int i = threadIdx.x & 31;
    float p0 = 0.0f, p1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
    for (; i + 64 * (NB - 1) + 32 < n; i += 64 * NB) {
        float x0[NB], x1[NB], z0[NB], z1[NB];
#pragma unroll
        for (int m = 0; m < NB; m++) {
            x0[m] = a[i + 64 * m], x1[m] = a[i + 64 * m + 32];
            if (C)
                z0[m] = c[i + 64 * m], z1[m] = c[i + 64 * m + 32];
        }
#pragma unroll
        for (int m = 0; m < NB; m++) {
            p0 = __fmaf_rn(x0[m], x0[m], p0), p1 = __fmaf_rn(x1[m], x1[m], p1);
            if (C)
                q0 = __fmaf_rn(x0[m], z0[m], q0), q1 = __fmaf_rn(x1[m], z1[m], q1);
        }
    }
    for (; i < n; i += 64) {
        float x = a[i], y = i + 32 < n ? a[i + 32] : 0.0f;
        p0 = __fmaf_rn(x, x, p0);
        if (C)
            q0 = __fmaf_rn(x, c[i], q0);
        if (i + 32 < n) {
            p1 = __fmaf_rn(y, y, p1);
            if (C)
                q1 = __fmaf_rn(y, c[i + 32], q1);
        }
    }
    float v = p0 + p1, u = q0 + q1;
    for (int h = 16; h >= 1; h /= 2) {
        v = v + __shfl_down_sync(0xFFFFFFFFu, v, h);
        if (C)
            u = u + __shfl_down_sync(0xFFFFFFFFu, u, h);
    }
    *aa = __shfl_sync(0xFFFFFFFFu, v, 0);
    if (C)
        *ac = __shfl_sync(0xFFFFFFFFu, u, 0);
}

#endif
