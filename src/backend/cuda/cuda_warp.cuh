/* cuda_warp.cuh — kern.h's seq64 dot product as one warp, for the CUDA kernels (cuda_kern.cu's
 * dot_rows, cuda_blk.cu's norms and attention scores). Thread j holds the partial sums of lanes j
 * and j + 32, each adding its elements in order with one FMA each; their add is the tree's first
 * step (h = 32) and shuffles do the rest (h = 16 .. 1), so the result is the scalar table's. */
#ifndef DF_BACKEND_CUDA_CUDA_WARP_CUH
#define DF_BACKEND_CUDA_CUDA_WARP_CUH

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

#endif
