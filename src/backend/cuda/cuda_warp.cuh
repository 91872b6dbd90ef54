/* cuda_warp.cuh — kern.h's seq16 dot product as one half-warp, for the CUDA kernels (cuda_kern.cu's
 * dot_rows, cuda_blk.cu's norms, AttnRes scores and attention scores). Thread j of a half holds
 * lane j's partial sum, adding its elements (j, j + 16, ...) in order with one FMA each, and
 * shuffles within the half do the tree (h = 8 .. 1), so the result is the scalar table's. A
 * warp's two halves take two dots (two keys, two rows, or a norm's sum of squares beside an
 * AttnRes score); each half's shuffles name only its own threads, so one half may take a dot
 * the other does not. A thread loads NB of its elements of each operand before it adds any of
 * them: the loads do not wait for one another, so a row costs about n / (16 NB) memory latencies
 * rather than n / 16 (an RMSNorm of 3584 floats at decode: 42 -> a few us, bench/results/cuda.md);
 * the elements past the last whole batch are one more batch, its reads guarded.
 * SQ: b is a (a sum of squares), each element loaded once. */
#ifndef DF_BACKEND_CUDA_CUDA_WARP_CUH
#define DF_BACKEND_CUDA_CUDA_WARP_CUH

enum { WD_BATCH = 8 };

/* seq16 dot of a and b over n, the calling thread's half-warp (all 16 of its threads calling);
 * every thread of the half gets the result */
template <int NB = WD_BATCH, bool SQ = false>
__device__ __forceinline__ float half_dot16(const float *a, const float *b, int n)
{
    const unsigned mask = 0xFFFFu << (threadIdx.x & 16);
    int i = threadIdx.x & 15;
    float acc = 0.0f;
    for (; i + 16 * (NB - 1) < n; i += 16 * NB) { /* whole batches */
        float x[NB], y[NB];
#pragma unroll
        for (int m = 0; m < NB; m++) {
            x[m] = a[i + 16 * m];
            y[m] = SQ ? x[m] : b[i + 16 * m];
        }
#pragma unroll
        for (int m = 0; m < NB; m++)
            acc = __fmaf_rn(x[m], y[m], acc);
    }
    if (i < n) { /* the last, partial batch: its loads too are issued before any add */
        float x[NB], y[NB];
#pragma unroll
        for (int m = 0; m < NB; m++) {
            x[m] = i + 16 * m < n ? a[i + 16 * m] : 0.0f;
            y[m] = SQ ? x[m] : i + 16 * m < n ? b[i + 16 * m] : 0.0f;
        }
#pragma unroll
        for (int m = 0; m < NB; m++)
            if (i + 16 * m < n) /* not an add of 0: that would turn an acc of -0 into +0 */
                acc = __fmaf_rn(x[m], y[m], acc);
    }
    for (int h = 8; h >= 1; h /= 2)
        acc = acc + __shfl_down_sync(mask, acc, h, 16);
    return __shfl_sync(mask, acc, 0, 16);
}

#endif
