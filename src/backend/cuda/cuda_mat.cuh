/* cuda_mat.cuh — what the CUDA matrix kernels share (cuda_kern.cu's decode and verify passes,
 * cuda_mm.cu's prefill tiles): the exact element decoders (dtype.c's, for the device), seq16's
 * lane order of a block's columns, the end of a tile (its lanes' tree by shuffles), the dispatch of
 * a format as a compile-time constant, a launch's set of products, and the tiles' entry points. */
#ifndef DF_BACKEND_CUDA_CUDA_MAT_CUH
#define DF_BACKEND_CUDA_CUDA_MAT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/cuda_kern.h"
extern "C" {
#include "kernels/kern.h"
}

/* ---- exact element decoders: dtype.c's, for the device ---- */

__device__ __forceinline__ float d_bf16(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float d_f16(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F)
        return __uint_as_float(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        float v = (float)man * 5.9604644775390625e-8f; /* 2^-24: exact */
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

__device__ __forceinline__ float d_e8m0(uint32_t s)
{
    if (s == 255)
        return __uint_as_float(0x7FC00000u);
    if (s == 0)
        return __uint_as_float(0x00400000u); /* 2^-127, subnormal */
    return __uint_as_float(s << 23);
}

__device__ __forceinline__ float d_e4m3(uint32_t b)
{
    uint32_t sign = b >> 7, exp = (b >> 3) & 0xFu, man = b & 7u;
    float v;
    if (exp == 0xF && man == 7)
        return __uint_as_float(0x7FC00000u);
    if (exp == 0)
        v = (float)man * 0.001953125f; /* m/8 * 2^-6 */
    else
        v = __uint_as_float(((exp + 120) << 23) | (man << 20)); /* (1 + m/8) 2^(exp-7), exact */
    return sign ? -v : v;
}

__device__ __forceinline__ float d_e2m1(uint32_t code)
{
    /* 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (8 is -0) */
    uint32_t m = code & 7u;
    float v = m < 4 ? 0.5f * (float)m : m < 6 ? (float)(m - 2) : m == 6 ? 4.0f : 6.0f;
    return (code & 8u) ? -v : v;
}

/* A 4-bit code of a word of codes, decoded in registers, times its group's scale sc: the nibble at
 * bit P. MXFP4: the code's three low bits placed at bits 22-24 and its sign at 31 are exactly its
 * E2M1 value times 2^-126 (a subnormal for 0 and 0.5), so (that x 2^126) x sc is dtype.c's one
 * rounding of value x scale, and so is that x (sc x 2^126) in one multiply whenever sc x 2^126 is
 * a float (sc <= 2: s126, passed by the caller, and FAST). INT4: 2^23 + q - (2^23 + 8) is q - 8
 * exactly. */
template <int FMT, int P, bool FAST>
__device__ __forceinline__ float d_nib(uint32_t word, float sc, float s126)
{
    if (FMT == WF_MXFP4) {
        uint32_t t = word << (28 - P); /* the sign at bit 31, the magnitude at 28-30 */
        float f = __uint_as_float((uint32_t)((int32_t)t >> 6) & 0x81C00000u);
        return FAST ? f * s126 : (f * 0x1p126f) * sc;
    }
    float q = __uint_as_float(0x4B000000u | ((word >> P) & 0xFu)) - 8388616.0f;
    return q * sc;
}

/* (-0, +0) as a BF16 pair, nib_pairs' addend, read from constant memory: given as a literal,
 * ptxas rebuilt it for every FMA (an HFMA2 and a PRMT each, and MXFP4 at T = 1 fell from 0.62 to
 * 0.42 of the copy bandwidth; bench/results/cuda.md, 2026-12-06) */
static __constant__ uint32_t nib_addend = 0x80000000u;

/* MXFP4's codes of one word two at a time, for d_nib's one-multiply case (FAST): nibbles n and
 * n + 4 (bits 4n and 4n + 16) become the two halves of a BF16 pair, each its code's value times
 * 2^-126 as in d_nib but at BF16's bits (the magnitude at 6-8, the sign at 15). Masking the two
 * nibbles and one product by 2^a + 2^(a + 6) places both copies without carries (the magnitude's
 * copy at 6-9, the sign's at 12-15). Then one BF16 FMA an element gives its float: the pair (or
 * its low half twice) times s0 (sc x 2^126 in the high half, +0 in the low) plus (-0, +0). The
 * high half is the value times sc, exact as d_nib's (two significant bits, at least 2^-128: a
 * BF16, subnormal or not, which the FMA keeps; adding -0 keeps a -0), and the low half is
 * +-0 + +0 = +0, so the register is that value as a float. Five instructions a pair and a shift a
 * word, where d_nib takes four an element: it pays where the issue slots bind (k_gvt, and k_mmx's
 * staging through d_piece8). v[n]: nibble n's value times sc. */
__device__ __forceinline__ void nib_pairs(uint32_t word, uint32_t s0, float (&v)[8])
{
    const uint32_t w8 = word >> 8;
#pragma unroll
    for (int n = 0; n < 4; n++) {
        uint32_t a = (n < 2 ? word : w8) & (n % 2 ? 0x00F000F0u : 0x000F000Fu);
        uint32_t p = a * (n % 2 ? 0x104u : 0x1040u) & 0x81C081C0u, lo, hi;
        asm("{ .reg .b16 l, h; .reg .b32 ll;\n\t"
            "mov.b32 {l, h}, %2;\n\t"
            "mov.b32 ll, {l, l};\n\t"
            "fma.rn.bf16x2 %0, ll, %3, %4;\n\t"
            "fma.rn.bf16x2 %1, %2, %3, %4; }"
            : "=r"(lo), "=r"(hi)
            : "r"(p), "r"(s0), "r"(nib_addend));
        v[n] = __uint_as_float(lo);
        v[n + 4] = __uint_as_float(hi);
    }
}

__device__ __forceinline__ float d_group_scale(const kmat &w, int r, int g)
{
    const uint8_t *s = w.scale + (size_t)r * w.scale_stride + 2 * (size_t)g;
    return d_bf16((uint32_t)s[0] | ((uint32_t)s[1] << 8));
}

/* the scale of row r's columns col .. col + 31 (1.0 unused for the plain formats) */
template <int FMT> __device__ __forceinline__ float d_scale32(const kmat &w, int r, int col)
{
    if (FMT == WF_MXFP4)
        return d_e8m0(__ldg(w.scale + (size_t)r * w.scale_stride + (size_t)(col / 32)));
    if (FMT == WF_INT4G32 || FMT == WF_INT8G32)
        return d_group_scale(w, r, col / 32);
    if (FMT == WF_FP8B128)
        return __ldg((const float *)(w.scale + (size_t)(r / 128) * w.scale_stride) + col / 128);
    return 1.0f;
}

/* W[r][i], exactly as dtype.c's decoder for FMT gives it */
template <int FMT> __device__ __forceinline__ float d_elem(const kmat &w, int r, int i)
{
    const uint8_t *p = w.data + (size_t)r * w.row_bytes;
    if (FMT == WF_F32)
        return ((const float *)p)[i];
    if (FMT == WF_F16)
        return d_f16(((const uint16_t *)p)[i]);
    if (FMT == WF_BF16)
        return d_bf16(((const uint16_t *)p)[i]);
    if (FMT == WF_MXFP4) {
        uint32_t code = (p[i / 2] >> ((i & 1) * 4)) & 0xFu;
        return d_e2m1(code) * d_e8m0(w.scale[(size_t)r * w.scale_stride + (size_t)(i / 32)]);
    }
    if (FMT == WF_INT4G32) {
        int q = (int)((p[i / 2] >> ((i & 1) * 4)) & 0xFu) - 8;
        return (float)q * d_group_scale(w, r, i / 32);
    }
    if (FMT == WF_INT8G32)
        return (float)((const int8_t *)p)[i] * d_group_scale(w, r, i / 32);
    /* WF_FP8B128 */
    const float *srow = (const float *)(w.scale + (size_t)(r / 128) * w.scale_stride);
    return d_e4m3(p[i]) * srow[i / 128];
}

/* where column c of a block goes in lane order: lane l's s-th column lands at 16 s + l */
template <int FMT> __device__ __forceinline__ int lane_pos(int c)
{
    if (FMT == WF_MXFP4 || FMT == WF_INT4G32)
        return (c & ~31) | ((c & 1) << 4) | ((c & 31) >> 1);
    return c;
}

/* the block column that lane l adds at its step s (the inverse of lane_pos) */
template <int FMT> __device__ __forceinline__ int lane_col(int l, int s)
{
    if (FMT == WF_MXFP4 || FMT == WF_INT4G32)
        return 32 * (s >> 1) + 2 * l + (s & 1);
    return 16 * s + l;
}

/* ---- matrix products ---- */

/* The end of every matrix kernel: each (row, token) of a thread's tile adds its 16 lanes' sums in
 * seq16's tree (h = 8, 4, 2, 1: acc[j] + acc[j + h], by shuffles within the 16 lanes) and lane 0
 * stores rows ra .. ra + RT and tokens ta .. ta + TT of them that exist. The whole warp calls. */
template <int RT, int TT>
__device__ __forceinline__ void tile_store(float (&acc)[RT][TT], int ra, int ta, int r0, int r1, int T, float *y,
                                           size_t ldy)
{
    int lane = threadIdx.x & 15;
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
        for (int k = 0; k < TT; k++) {
            float v = acc[j][k];
#pragma unroll
            for (int h = 8; h >= 1; h /= 2)
                v = v + __shfl_down_sync(0xFFFFFFFFu, v, h, 16);
            int r = ra + j, t = ta + k;
            if (lane == 0 && r < r1 && t < T)
                y[(size_t)t * ldy + (size_t)(r - r0)] = v;
        }
}

/* Calls f with the format as a compile-time constant (std::integral_constant), so that each
 * format's kernels are instantiated once and chosen here. */
template <typename F> static void by_format(int fmt, F f)
{
    switch (fmt) {
    case WF_F32:
        return f(std::integral_constant<int, WF_F32>());
    case WF_F16:
        return f(std::integral_constant<int, WF_F16>());
    case WF_BF16:
        return f(std::integral_constant<int, WF_BF16>());
    case WF_MXFP4:
        return f(std::integral_constant<int, WF_MXFP4>());
    case WF_INT4G32:
        return f(std::integral_constant<int, WF_INT4G32>());
    case WF_FP8B128:
        return f(std::integral_constant<int, WF_FP8B128>());
    case WF_INT8G32:
        return f(std::integral_constant<int, WF_INT8G32>());
    }
}

/* A launch's products (cudak_matmul_set): block b of the grid works on the entry whose blocks
 * [nb0, next nb0) hold b; the entries' blocks in order. */
template <int N> struct gv_set {
    int n;
    struct {
        cudak_mm m;
        int nb0; /* the entry's first block */
    } e[N];
};

/* The entry of a set that block blockIdx.x works on, and the block's index within it. With one
 * matrix its fields are read at fixed offsets, not copied out to be indexed. */
struct gv_one {
    cudak_mm m;
    int bx;
    int ei; /* the entry's index in the set */
};

template <int N> __device__ __forceinline__ gv_one gv_entry(const gv_set<N> &set)
{
    int ei = 0;
    if constexpr (N > 1)
        while (ei + 1 < set.n && (int)blockIdx.x >= set.e[ei + 1].nb0)
            ei++;
    return gv_one{set.e[ei].m, (int)blockIdx.x - set.e[ei].nb0, ei};
}

/* Fills set with the n <= N products m, blocks(m[i]) blocks each, and returns the launch's blocks */
template <int N, typename B> static int gv_fill(gv_set<N> &set, const cudak_mm *m, int n, B blocks)
{
    set.n = n;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        set.e[i].m = m[i];
        set.e[i].nb0 = nb;
        nb += blocks(m[i]);
    }
    return nb;
}

/* Raises kernel's limit on dynamic shared memory to bytes, once per device: the limit is an
 * attribute of the function in the current device's context (beyond 32 devices, at every call).
 * raised: the caller's record of the devices done, one per kernel instantiation. */
template <typename K> static void smem_raise(K kernel, unsigned *raised, int bytes)
{
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev >= 32 || !(*raised & 1u << dev)) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (dev < 32)
            *raised |= 1u << dev;
    }
}

/* cudak_matmul for what k_gemv does not take: T > 8, or rows it cannot read (cuda_mm.cu) */
void cuda_mm_tiles(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                   cudaStream_t st);
/* whether cuda_mm_set takes m: T > 8 and rows k_mmx reads (16-byte aligned, whole 32-column groups) */
bool cuda_mm_set_fits(const cudak_mm *m);
/* n <= CUDAK_SET products of one format that cuda_mm_set_fits takes, each as cuda_mm_tiles
 * computes it (the same bits), in one launch of k_mmx (cuda_mm.cu) */
void cuda_mm_set(const cudak_mm *m, int n, cudaStream_t st);

#endif
