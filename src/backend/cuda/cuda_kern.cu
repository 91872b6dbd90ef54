/* cuda_kern.cu — kern.h's operations on the GPU (cuda_kern.h), in kern.h's reduction orders.
 *
 * Compiled with -fmad=false -prec-div=true -prec-sqrt=true and without fast math: a * b + c rounds
 * twice unless the code says __fmaf_rn, which is what the CPU's -ffp-contract=off does.
 *
 * Matrix products: passes of T <= 8 tokens (decode, verify) take k_gemv, k_gvx and k_gvt below,
 * which read each weight once for every token; longer passes take the tiles of cuda_mm.cu. Both
 * use the exact element decoders and seq16's lane order of cuda_mat.cuh.
 */
#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes through the runtime */
#include <cudaTypedefs.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_kern.h"
#include "kernels/kern.h"
}
#include "backend/cuda/cuda_mat.cuh"
#include "backend/cuda/cuda_warp.cuh"
#include "kernels/kmath.h"

/* Passes of T <= 8 tokens are bound by reading the weights once (decode, verify): k_gemv keeps as
 * many bytes in flight as it can. A block of gv_warps<FMT>() warps walks its rows in blocks of
 * gv_cols<FMT>() columns. Each warp owns gv_rw<FMT>() rows: it loads the next column block's raw
 * bytes with 16-byte loads into registers (and the block's scales, decoded, beside them) while it
 * reduces the current one from shared memory, decoding exactly, in seq16's lane order. Mostly each
 * half-warp holds half the rows, one lane of seq16 per thread, and a thread reads its columns'
 * values one by one. The 4-bit formats at T <= 2 (gv_nib: a pass bound by its decoding) give a
 * row to a quad of threads instead: thread q holds lanes 4q .. 4q + 3, whose bytes are word q of
 * each 16-byte group, so that it reads eight codes as one word and decodes them with shifts and
 * masks (d_nib), and its eight columns' activations as two 16-byte reads. MXFP4 took 0.27 -> 0.35
 * of the HBM bandwidth at T = 1 for 16 experts in one launch; at T = 4 and 8 the wider reads of
 * the activations cost more than they saved (bench/results/cuda.md). (INT4 at T = 1 now takes
 * k_gvx below wherever it fits, MXFP4 at T <= 4 k_gvt, and the unscaled formats k_gemv_st, whose
 * weights go to shared memory without registers, several blocks ahead: the same lanes.) The block's
 * warps share the activations of the column block, copied asynchronously into a second shared
 * buffer one block ahead. One launch may cover several matrices (gv_set: a MoE layer's experts),
 * each block working on one of them. Rows must be 16-byte aligned and a whole number of column
 * blocks long (K3's and the usual shapes are); other matrices take k_matmul, which gives the same
 * bits. */

template <int FMT> __host__ __device__ constexpr int gv_cols()
{
    return FMT == WF_F32 ? 128 : FMT == WF_MXFP4 || FMT == WF_INT4G32 ? 512 : 256;
}

/* a row's bytes in one column block: 512 for 32- and 16-bit values, 256 for 8- and 4-bit ones */
template <int FMT> __host__ __device__ constexpr int gv_row_bytes()
{
    return FMT == WF_F32 ? 4 * gv_cols<FMT>() : FMT == WF_F16 || FMT == WF_BF16 ? 2 * gv_cols<FMT>()
                         : FMT == WF_MXFP4 || FMT == WF_INT4G32 ? gv_cols<FMT>() / 2 : gv_cols<FMT>();
}

/* element c of a block whose raw bytes are rp, before its scale (dtype.c multiplies the code's
 * value by the scale once, as the caller does); e2m1: MXFP4's value table in shared memory */
template <int FMT> __device__ __forceinline__ float d_code(const uint8_t *rp, int c, const float *e2m1)
{
    if (FMT == WF_F32)
        return ((const float *)rp)[c];
    if (FMT == WF_F16)
        return d_f16(((const uint16_t *)rp)[c]);
    if (FMT == WF_BF16)
        return d_bf16(((const uint16_t *)rp)[c]);
    if (FMT == WF_MXFP4)
        return e2m1[(rp[c / 2] >> ((c & 1) * 4)) & 0xFu];
    if (FMT == WF_INT4G32)
        return (float)((int)((rp[c / 2] >> ((c & 1) * 4)) & 0xFu) - 8);
    if (FMT == WF_INT8G32)
        return (float)(int8_t)rp[c];
    return d_e4m3(rp[c]);
}

/* Rows per warp and warps per block, measured (bench/results/cuda.md): 8 rows and 2 warps where a
 * row's column block is 512 bytes (the 16- and 32-bit formats), 8 rows and 4 warps where it is 256
 * (the 4- and 8-bit ones, measured faster with more warps). */
template <int FMT> __host__ __device__ constexpr int gv_rw() { return 8; }
template <int FMT> __host__ __device__ constexpr int gv_warps() { return gv_row_bytes<FMT>() == 512 ? 2 : 4; }

/* whether k_gemv's threads each hold four lanes of seq16 (the 4-bit formats at T <= 2; see there) */
template <int FMT, int TT> __host__ __device__ constexpr bool gv_nib()
{
    return (FMT == WF_MXFP4 || FMT == WF_INT4G32) && TT <= 2;
}

template <int FMT> __host__ __device__ constexpr bool has_scale()
{
    return FMT == WF_MXFP4 || FMT == WF_INT4G32 || FMT == WF_INT8G32 || FMT == WF_FP8B128;
}

/* The 4-bit formats' end of k_gemv: thread q of a quad holds lanes 4q .. 4q + 3 of its row for
 * each token, so seq16's tree is two shuffles within the quad (h = 8: from thread q + 2, h = 4:
 * from q + 1) and then the thread's own h = 2 and h = 1; thread 0 of the quad stores row r. The
 * whole warp calls. */
template <int TT>
__device__ __forceinline__ void quad_store(float (&acc)[4][TT], int r, int r0, int r1, int T, float *y, size_t ldy)
{
#pragma unroll
    for (int k = 0; k < TT; k++) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = acc[i][k];
            v[i] = v[i] + __shfl_down_sync(0xFFFFFFFFu, v[i], 2, 4);
            v[i] = v[i] + __shfl_down_sync(0xFFFFFFFFu, v[i], 1, 4);
        }
        float sum = (v[0] + v[2]) + (v[1] + v[3]);
        if ((threadIdx.x & 3) == 0 && r < r1 && k < T)
            y[(size_t)k * ldy + (size_t)(r - r0)] = sum;
    }
}

/* the eight activations at xp of each token, token k's at xp + k * stride (two 16-byte reads a
 * token) */
template <int TT> __device__ __forceinline__ void load_xv8(const float *xp, int stride, float (&xv)[TT][8])
{
#pragma unroll
    for (int k = 0; k < TT; k++) {
        float4 a = *(const float4 *)(xp + k * stride);
        float4 c = *(const float4 *)(xp + k * stride + 4);
        xv[k][0] = a.x, xv[k][1] = a.y, xv[k][2] = a.z, xv[k][3] = a.w;
        xv[k][4] = c.x, xv[k][5] = c.y, xv[k][6] = c.z, xv[k][7] = c.w;
    }
}

/* nib_group's element-by-element decode (d_nib) */
template <int FMT, bool FAST, int TT>
__device__ __forceinline__ void nib_one(uint32_t word, float sc, float s126, const float (&xv)[TT][8],
                                        float (&acc)[4][TT])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lo, hi;
        if (i == 0) {
            lo = d_nib<FMT, 0, FAST>(word, sc, s126);
            hi = d_nib<FMT, 4, FAST>(word, sc, s126);
        } else if (i == 1) {
            lo = d_nib<FMT, 8, FAST>(word, sc, s126);
            hi = d_nib<FMT, 12, FAST>(word, sc, s126);
        } else if (i == 2) {
            lo = d_nib<FMT, 16, FAST>(word, sc, s126);
            hi = d_nib<FMT, 20, FAST>(word, sc, s126);
        } else {
            lo = d_nib<FMT, 24, FAST>(word, sc, s126);
            hi = d_nib<FMT, 28, FAST>(word, sc, s126);
        }
#pragma unroll
        for (int k = 0; k < TT; k++) {
            acc[i][k] = __fmaf_rn(lo, xv[k][2 * i], acc[i][k]);
            acc[i][k] = __fmaf_rn(hi, xv[k][2 * i + 1], acc[i][k]);
        }
    }
}

/* nib_group for MXFP4 in d_nib's one-multiply case, by pairs: s0, sc x 2^126 as a BF16 in the
 * high half and +0 in the low (a power of two's float bits) */
template <int TT>
__device__ __forceinline__ void nib_group_pairs(uint32_t word, uint32_t s0, const float (&xv)[TT][8], float (&acc)[4][TT])
{
    float v[8];
    nib_pairs(word, s0, v);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int k = 0; k < TT; k++) {
            acc[i][k] = __fmaf_rn(v[2 * i], xv[k][2 * i], acc[i][k]);
            acc[i][k] = __fmaf_rn(v[2 * i + 1], xv[k][2 * i + 1], acc[i][k]);
        }
}

/* One row's 32-column group for a thread of four lanes: lane 4q + i adds its even column
 * (byte i's low nibble) and then its odd one, for every token. */
template <int FMT, bool FAST, int TT>
__device__ __forceinline__ void nib_group(uint32_t word, float sc, float s126, const float (&xv)[TT][8],
                                          float (&acc)[4][TT])
{
    if constexpr (FMT == WF_MXFP4 && FAST)
        nib_group_pairs<TT>(word, __float_as_uint(s126), xv, acc);
    else
        nib_one<FMT, FAST, TT>(word, sc, s126, xv, acc);
}

/* Column block blk's activations of every token, [TT][C], into dst by asynchronous copies (the
 * caller commits them), tokens past T as +0; the block's NT threads call. */
template <int TT, int C, int NT>
__device__ __forceinline__ void gv_copy_x(float *dst, const float *x, size_t ldx, int T, int blk)
{
    for (int e = threadIdx.x; e < TT * C; e += NT) {
        int k = e / C, c = e % C;
        if (k < T)
            __pipeline_memcpy_async(dst + e, x + (size_t)k * ldx + (size_t)blk * C + c, 4);
        else
            dst[e] = 0.0f;
    }
}

/* One column block of C columns for a thread of one lane (k_gemv's 8- to 32-bit formats and
 * k_gemv_st): lane `lane` of the warp's rows half * RT .. + RT, whose raw bytes are at
 * rw + row_at(row), each element decoded exactly and multiplied by its group's scale (scale(row,
 * group); the unscaled formats have none), then added into every token's sum: acc[j][k] is row
 * j's lane for token k, the block's activations xb [TT][C]. */
template <int FMT, int TT, int RT, int C, typename RowAt, typename Scale>
__device__ __forceinline__ void gv_lanes(const uint4 *rw, RowAt row_at, const float *xb, int half, int lane,
                                         const float *e2m1, Scale scale, float (&acc)[RT][TT])
{
#pragma unroll 2
    for (int g = 0; g < C / 32; g++) {
        float sc[RT];
#pragma unroll
        for (int j = 0; j < RT; j++)
            sc[j] = has_scale<FMT>() ? scale(half * RT + j, g) : 1.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int c = lane_col<FMT>(lane, 2 * g + h);
            float xv[TT];
#pragma unroll
            for (int k = 0; k < TT; k++)
                xv[k] = xb[k * C + c];
#pragma unroll
            for (int j = 0; j < RT; j++) {
                float wv = d_code<FMT>((const uint8_t *)&rw[row_at(half * RT + j)], c, e2m1);
                if (has_scale<FMT>())
                    wv = wv * sc[j];
#pragma unroll
                for (int k = 0; k < TT; k++)
                    acc[j][k] = __fmaf_rn(wv, xv[k], acc[j][k]);
            }
        }
    }
}

template <int FMT, int TT, int N>
__global__ void __launch_bounds__(32 * gv_warps<FMT>()) k_gemv(const gv_set<N> set)
{
    const gv_one g1 = gv_entry(set);
    const kmat w = g1.m.w;
    const float *__restrict__ x = g1.m.x;
    float *__restrict__ y = g1.m.y;
    const size_t ldx = g1.m.ldx, ldy = g1.m.ldy;
    const int r0 = g1.m.r0, r1 = g1.m.r1, T = g1.m.T, bx = g1.bx;
    constexpr bool NIB = gv_nib<FMT, TT>();
    constexpr int C = gv_cols<FMT>(), RB = gv_row_bytes<FMT>(), RW = gv_rw<FMT>(), V = RB / 16,
                  VS = NIB ? V + 1 : V + 4, NV = RW * V / 32, RT = RW / 2, NW = gv_warps<FMT>(), NT = 32 * NW;
    static_assert(RW * V % 32 == 0, "a warp's loads cover its rows' block");
    static_assert(!NIB || (RW == 8 && RT == 4), "a quad of threads per row, four lanes to a thread");
    /* The warp's rows in shared memory. One lane per thread: each 64 bytes beyond its length apart,
     * and the second half-warp's a further 64 bytes on (row_at), so that the two half-warps,
     * reading the same offsets of rows RT apart, read different banks. Four lanes per thread: 16
     * bytes beyond, so that the eight rows a warp reads at once start four banks apart and its 32
     * words fall in 32 banks. */
    __shared__ uint4 raw[NW][RW * VS + 4];
    auto row_at = [&](int rr) { return rr * VS + (!NIB && rr >= RT ? 4 : 0); };
    __shared__ __align__(16) float xs[2][TT * C];
    __shared__ float e2m1[16];
    constexpr int NG = C / 32, NS = has_scale<FMT>() ? (RW * NG + 31) / 32 : 1;
    __shared__ float scs[NW][RW * NG]; /* the warp's rows' scales of the block, decoded */
    const int warp = threadIdx.x / 32, tl = threadIdx.x & 31, half = tl >> 4, lane = tl & 15;
    const int rbase = r0 + (bx * NW + warp) * RW, nblk = w.cols / C;
    if (!NIB && threadIdx.x < 16)
        e2m1[threadIdx.x] = d_e2m1(threadIdx.x);
    /* a warp past r1 still takes part in the block's copies and barriers; its loads repeat the
     * last row, as do the rows of a partial warp, and nothing of theirs is stored */
    uint4 buf[NV];
    float sbuf[NS]; /* this thread's share of the next block's scales (read while its bytes arrive) */
    auto load_w = [&](int blk) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            int idx = tl + 32 * v, rr = idx / V, r = rbase + rr < r1 ? rbase + rr : r1 - 1;
            buf[v] = __ldg((const uint4 *)(w.data + (size_t)r * w.row_bytes + (size_t)blk * RB) + idx % V);
        }
        if (has_scale<FMT>())
#pragma unroll
            for (int v = 0; v < NS; v++) {
                int e = tl + 32 * v, rr = e / NG, r = rbase + rr < r1 ? rbase + rr : r1 - 1;
                if (e < RW * NG)
                    sbuf[v] = d_scale32<FMT>(w, r, blk * C + 32 * (e % NG));
            }
    };
    auto load_x = [&](int blk) {
        gv_copy_x<TT, C, NT>(xs[blk & 1], x, ldx, T, blk);
        __pipeline_commit();
    };
    load_x(0);
    load_w(0);
    /* one lane per thread: thread (half, lane) holds lane `lane` of rows half * RT .. + RT; four:
     * thread (rs, q) holds lanes 4q .. 4q + 3 of row rs (acc[i] lane 4q + i) */
    const int rs = tl >> 2, q = tl & 3;
    float acc[RT][TT] = {}; /* +0 */
    for (int b = 0; b < nblk; b++) {
        __syncwarp();
#pragma unroll
        for (int v = 0; v < NV; v++) {
            int idx = tl + 32 * v;
            raw[warp][row_at(idx / V) + idx % V] = buf[v];
        }
        if (has_scale<FMT>())
#pragma unroll
            for (int v = 0; v < NS; v++)
                if (tl + 32 * v < RW * NG)
                    scs[warp][tl + 32 * v] = sbuf[v];
        if (b + 1 < nblk) {
            load_x(b + 1);
            load_w(b + 1);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads(); /* block b's activations and this warp's raw rows are in place */
        const float *xb = xs[b & 1];
        if constexpr (NIB) {
            const uint32_t *rw32 = (const uint32_t *)&raw[warp][0] + 4 * row_at(rs) + q;
            const float *xq = xb + 8 * q;
            float sc[NG]; /* the row's scales of the block, and whether every one takes d_nib's one multiply */
            bool fast = true;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                sc[g] = scs[warp][rs * NG + g];
                fast = fast && (FMT != WF_MXFP4 || sc[g] <= 2.0f); /* (false for NaN) */
            }
            /* the block's 16 groups in straight-line code, one branch per block */
            auto groups = [&](auto fast_c) {
#pragma unroll
                for (int g = 0; g < NG; g++) {
                    float xv[TT][8]; /* columns 32 g + 8 q .. + 8 of every token */
                    load_xv8<TT>(xq + 32 * g, C, xv);
                    nib_group<FMT, decltype(fast_c)::value, TT>(rw32[4 * g], sc[g], sc[g] * 0x1p126f, xv, acc);
                }
            };
            if (fast)
                groups(std::true_type());
            else /* some sc x 2^126 is no float (or sc is NaN) */
                groups(std::false_type());
        } else {
            gv_lanes<FMT, TT, RT, C>(raw[warp], row_at, xb, half, lane, e2m1,
                                     [&](int rr, int g) { return scs[warp][rr * NG + g]; }, acc);
        }
        __syncthreads(); /* every warp is done with xs[b & 1] before block b + 2 is copied there */
    }
    if constexpr (NIB)
        quad_store<TT>(acc, rbase + rs, r0, r1, T, y, ldy);
    else
        tile_store<RT, TT>(acc, rbase + half * RT, 0, r0, r1, T, y, ldy);
}

/* k_gemv for the unscaled formats (F32, F16, BF16: one lane of seq16 per thread, no scales to
 * decode on the way), its weights not through registers: each column block's weights and
 * activations go straight into shared memory by asynchronous copies, one stage per block, and
 * gs_stages() - 1 blocks are in flight while one is reduced. A lone matrix of a few thousand rows
 * fills the GPU with one wave of blocks, so what it takes is a block's chain of column blocks, a
 * memory latency per block in flight: k_gemv, one block ahead in registers, read 3584 x 3072 BF16
 * at T = 1 at 0.48 of the copy bandwidth on the H100, two blocks ahead in registers 0.52, these
 * three stages 0.63-0.65 (four: 0.65, but 12288 x 7168 fell from 0.91 to 0.77, the shared memory
 * a block takes leaving too few blocks an SM; bench/results/cuda.md, eleventh session). Four and
 * eight tokens' activations leave room for two stages. The same lanes, values and order as k_gemv. */
template <int TT> __host__ __device__ constexpr int gs_stages() { return TT <= 2 ? 3 : 2; }

template <int FMT, int TT, int N>
__global__ void __launch_bounds__(32 * gv_warps<FMT>()) k_gemv_st(const gv_set<N> set)
{
    const gv_one g1 = gv_entry(set);
    const kmat w = g1.m.w;
    const float *__restrict__ x = g1.m.x;
    float *__restrict__ y = g1.m.y;
    const size_t ldx = g1.m.ldx, ldy = g1.m.ldy;
    const int r0 = g1.m.r0, r1 = g1.m.r1, T = g1.m.T, bx = g1.bx;
    constexpr int C = gv_cols<FMT>(), RB = gv_row_bytes<FMT>(), RW = gv_rw<FMT>(), V = RB / 16, VS = V + 4,
                  NV = RW * V / 32, RT = RW / 2, NW = gv_warps<FMT>(), NT = 32 * NW, S = gs_stages<TT>();
    static_assert(!has_scale<FMT>() && RW * V % 32 == 0, "unscaled rows, a warp's copies cover its rows' block");
    __shared__ uint4 raw[S][NW][RW * VS + 4]; /* k_gemv's layout, a copy per stage */
    auto row_at = [&](int rr) { return rr * VS + (rr >= RT ? 4 : 0); };
    __shared__ __align__(16) float xs[S][TT * C];
    const int warp = threadIdx.x / 32, tl = threadIdx.x & 31, half = tl >> 4, lane = tl & 15;
    const int rbase = r0 + (bx * NW + warp) * RW, nblk = w.cols / C;
    /* column block blk's weights (this warp's rows) and activations, one commit group (an empty
     * one past the last block, so that every step waits on the same count) */
    auto load = [&](int blk) {
        if (blk < nblk) {
            uint4 *rs = raw[blk % S][warp];
#pragma unroll
            for (int v = 0; v < NV; v++) {
                int idx = tl + 32 * v, rr = idx / V, r = rbase + rr < r1 ? rbase + rr : r1 - 1;
                __pipeline_memcpy_async(rs + row_at(rr) + idx % V,
                                        (const uint4 *)(w.data + (size_t)r * w.row_bytes + (size_t)blk * RB) + idx % V,
                                        16);
            }
            gv_copy_x<TT, C, NT>(xs[blk % S], x, ldx, T, blk);
        }
        __pipeline_commit();
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        load(s);
    float acc[RT][TT] = {}; /* +0 */
    for (int b = 0; b < nblk; b++) {
        load(b + S - 1); /* into the stage block b - 1 left (every warp was done with it) */
        __pipeline_wait_prior(S - 1);
        __syncthreads(); /* block b's weights and activations are in place */
        gv_lanes<FMT, TT, RT, C>(raw[b % S][warp], row_at, xs[b % S], half, lane, nullptr,
                                 [](int, int) { return 1.0f; }, acc);
        __syncthreads(); /* every warp is done with stage b % S before block b + S is copied there */
    }
    tile_store<RT, TT>(acc, rbase + half * RT, 0, r0, r1, T, y, ldy);
}

/* whether k_gemv takes w: rows 16-byte aligned and a whole number of column blocks long (K3's and
 * the usual shapes are; other matrices take k_matmul, which gives the same bits) */
template <int FMT> static bool gv_fits(const kmat *w)
{
    return w->cols % gv_cols<FMT>() == 0 && w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0;
}

template <int FMT> static int gv_blocks(const cudak_mm *m)
{
    constexpr int per = gv_rw<FMT>() * gv_warps<FMT>();
    return (m->r1 - m->r0 + per - 1) / per;
}

template <int FMT, int TT, int N> static void launch_gemv(const cudak_mm *m, int n, cudaStream_t st)
{
    gv_set<N> set;
    const int nb = gv_fill(set, m, n, [](const cudak_mm &e) { return gv_blocks<FMT>(&e); });
    if constexpr (has_scale<FMT>())
        k_gemv<FMT, TT, N><<<(unsigned)nb, 32 * gv_warps<FMT>(), 0, st>>>(set);
    else
        k_gemv_st<FMT, TT, N><<<(unsigned)nb, 32 * gv_warps<FMT>(), 0, st>>>(set);
}

/* INT4 at T = 1, rows streamed (k_gvx; MXFP4 at T <= 2 took it until k_gvt below, which fits the
 * same matrices). The same lanes and order as k_gemv's
 * four-lane path, without its shared-memory staging of the weights: a row belongs to GX_TPR
 * threads, thread h holding seq16's lanes LPT h .. LPT h + LPT - 1 (LPT = 16 / GX_TPR), whose bytes
 * are bytes LPT h .. of each 16-byte group of 32 columns, so that it loads them straight from
 * global memory, one column block (512 columns, 16 groups) ahead, with the block's scales (a BF16 a
 * group) in two 16-byte reads. The activations of the whole
 * row (T x cols floats) are copied into shared memory once, so that the loop over column blocks
 * has no barrier. A block of GX_WARPS warps covers GX_WARPS x 32 / GX_TPR rows. Matrices it does
 * not fit (gx_fits, k_gvt's test too) take k_gemv.
 * Measured (bench/results/cuda.md, 2026-12-03): four threads to a row, four warps to a block and at
 * most 96 registers (GX_MINB = 5 blocks to an SM) beat two threads to a row, eight warps, 64
 * registers, and the 233 that ptxas takes unbounded (80 measured the same at T = 1, slower at
 * T = 2); an L2 prefetch two blocks ahead changed nothing. GX_XMAX: the most activation floats
 * (T x cols) a block holds, 64 KB. */
enum { GX_TPR = 4, GX_WARPS = 4, GX_MINB = 5, GX_XMAX = 16384 };

template <int TT>
static bool gx_fits(const cudak_mm *m)
{
    const kmat *w = &m->w;
    return (w->fmt == WF_MXFP4 || w->fmt == WF_INT4G32) && w->cols % 512 == 0 &&
           (size_t)TT * (size_t)w->cols <= GX_XMAX &&
           w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0 && w->scale_stride % 16 == 0 &&
           (uintptr_t)w->scale % 16 == 0 && (uintptr_t)m->x % 16 == 0 && (m->T == 1 || m->ldx % 4 == 0);
}

/* the words of one group a thread reads: LPT bytes at byte LPT h of the group's 16 */
template <int WPG> struct gx_words {
    uint32_t v[WPG];
};

template <int WPG> __device__ __forceinline__ gx_words<WPG> gx_load(const uint8_t *p)
{
    gx_words<WPG> r;
    if constexpr (WPG == 1) {
        r.v[0] = __ldg((const uint32_t *)p);
    } else if constexpr (WPG == 2) {
        uint2 u = __ldg((const uint2 *)p);
        r.v[0] = u.x, r.v[1] = u.y;
    } else {
        uint4 u = __ldg((const uint4 *)p);
        r.v[0] = u.x, r.v[1] = u.y, r.v[2] = u.z, r.v[3] = u.w;
    }
    return r;
}

/* k_gvx's and k_gvt's activations: the whole rows of the TT tokens (TT x cols floats, tokens past
 * T zero) copied into shared xs once, so that the loop over column blocks has no barrier. The
 * block calls. */
template <int TT>
__device__ __forceinline__ void gx_stage_x(float *xs, const float *x, size_t ldx, int T, int cols)
{
    constexpr int NT = 32 * GX_WARPS; /* the block's threads */
#pragma unroll
    for (int k = 0; k < TT; k++)
        for (int c = 4 * (int)threadIdx.x; c < cols; c += 4 * NT) {
            if (k < T)
                __pipeline_memcpy_async(xs + (size_t)k * cols + c, x + (size_t)k * ldx + c, 16);
            else
                *(float4 *)(xs + (size_t)k * cols + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
}

template <int FMT, int TT, int N>
__global__ void __launch_bounds__(32 * GX_WARPS, GX_MINB) k_gvx(const gv_set<N> set)
{
    extern __shared__ __align__(16) float gx_xs[]; /* [TT][cols] */
    const gv_one g1 = gv_entry(set);
    const kmat w = g1.m.w;
    const float *__restrict__ x = g1.m.x;
    float *__restrict__ y = g1.m.y;
    const size_t ldx = g1.m.ldx, ldy = g1.m.ldy;
    const int r0 = g1.m.r0, r1 = g1.m.r1, T = g1.m.T, bx = g1.bx;
    constexpr int TPR = GX_TPR, LPT = 16 / TPR, WPG = LPT / 4, RPW = 32 / TPR, NG = 16;
    constexpr int SW = 2; /* 16-byte reads of a column block's scales, a BF16 a group */
    static_assert(FMT == WF_INT4G32, "INT4 (MXFP4 takes k_gvt)");
    const int cols = w.cols, nblk = cols / 512, tl = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = tl % TPR, r = r0 + (bx * GX_WARPS + warp) * RPW + tl / TPR, rl = r < r1 ? r : r1 - 1;
    const uint8_t *rowp = w.data + (size_t)rl * w.row_bytes + LPT * h;
    const uint8_t *scp = w.scale + (size_t)rl * w.scale_stride;
    gx_words<WPG> wa[NG], wb[NG];
    uint4 sa[SW], sb[SW];
    auto load = [&](int blk, gx_words<WPG>(&buf)[NG], uint4(&s)[SW]) {
#pragma unroll
        for (int g = 0; g < NG; g++)
            buf[g] = gx_load<WPG>(rowp + (size_t)blk * 256 + 16 * g);
#pragma unroll
        for (int v = 0; v < SW; v++)
            s[v] = __ldg((const uint4 *)(scp + (size_t)blk * 16 * SW) + v);
    };
    load(0, wa, sa);
    gx_stage_x<TT>(gx_xs, x, ldx, T, cols);
    float acc[WPG][4][TT] = {}; /* +0 */
    /* block blk's 16 groups, its scales s: each group's BF16 */
    auto compute = [&](int blk, const gx_words<WPG>(&buf)[NG], const uint4(&s)[SW]) {
        const float *xb = gx_xs + (size_t)blk * 512 + 2 * LPT * h;
        uint32_t sw[4 * SW];
#pragma unroll
        for (int v = 0; v < SW; v++)
            sw[4 * v] = s[v].x, sw[4 * v + 1] = s[v].y, sw[4 * v + 2] = s[v].z, sw[4 * v + 3] = s[v].w;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            float sc = d_bf16((sw[g / 2] >> (16 * (g % 2))) & 0xFFFFu);
#pragma unroll
            for (int j = 0; j < WPG; j++) {
                float xv[TT][8];
                load_xv8<TT>(xb + 32 * g + 8 * j, cols, xv);
                nib_group<FMT, false, TT>(buf[g].v[j], sc, 0.0f, xv, acc[j]);
            }
        }
    };
    int b = 0;
    for (; b + 2 <= nblk; b += 2) {
        load(b + 1, wb, sb);
        compute(b, wa, sa);
        if (b + 2 < nblk)
            load(b + 2, wa, sa);
        compute(b + 1, wb, sb);
    }
    if (b < nblk)
        compute(b, wa, sa);
    /* seq16's tree: step hh adds lane j + hh to lane j (j < hh): from thread h + hh / LPT while
     * hh >= LPT, then within the thread */
#pragma unroll
    for (int k = 0; k < TT; k++) {
        float v[LPT];
#pragma unroll
        for (int j = 0; j < WPG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * j + i] = acc[j][i][k];
#pragma unroll
        for (int hh = 8; hh >= 1; hh /= 2) {
            if (hh >= LPT) {
#pragma unroll
                for (int i = 0; i < LPT; i++)
                    v[i] = v[i] + __shfl_down_sync(0xFFFFFFFFu, v[i], hh / LPT, TPR);
            } else {
#pragma unroll
                for (int i = 0; i < hh; i++)
                    v[i] = v[i] + v[i + hh];
            }
        }
        if (h == 0 && r < r1 && k < T)
            y[(size_t)k * ldy + (size_t)(r - r0)] = v[0];
    }
}

/* One launch of k_gvx or k_gvt over the n products m, `per` rows a block, with `fixed` bytes of
 * dynamic shared memory besides the activations (TT x the widest row's floats); set is the
 * kernel's parameter (a gv_set<N>, or one with more fields, which the caller fills); raised, the
 * kernel's record for smem_raise. */
template <int N, typename S, typename K>
static void gx_launch(K kernel, unsigned *raised, int per, size_t fixed, int TT, const cudak_mm *m, int n,
                      cudaStream_t st, S &set)
{
    smem_raise(kernel, raised, (int)(fixed + GX_XMAX * 4));
    const int nb = gv_fill<N>(set, m, n, [per](const cudak_mm &e) { return (e.r1 - e.r0 + per - 1) / per; });
    int cols = 0;
    for (int i = 0; i < n; i++)
        cols = m[i].w.cols > cols ? m[i].w.cols : cols;
    kernel<<<(unsigned)nb, 32 * GX_WARPS, fixed + (size_t)TT * (size_t)cols * 4, st>>>(set);
}

template <int FMT, int TT, int N> static void launch_gvx(const cudak_mm *m, int n, cudaStream_t st)
{
    static unsigned raised;
    gv_set<N> set;
    gx_launch<N>(k_gvx<FMT, TT, N>, &raised, GX_WARPS * 32 / GX_TPR, 0, TT, m, n, st, set);
}

/* MXFP4 at T <= 4, the weights staged by the copy engine (k_gvt): k_gvx's lanes and order, but a
 * warp's eight rows of a column block (256 bytes each) come into shared memory by two tensor copies
 * (cp.async.bulk.tensor, 128 bytes x 8 rows each, through the matrix's tensor map), the next
 * block's while this one is reduced (GT_S stages a warp, each with its own mbarrier; a warp's
 * stages and barriers are its own, so the loop has no block-wide barrier). The copies swizzle
 * 128 bytes (16-byte chunk c of row r lands at chunk c ^ r), so a thread's 4-byte read of its
 * word of a group puts the warp's 32 words in 32 banks. In k_gvx each 4-byte global read of a warp
 * touches eight rows: eight L1 wavefronts for 128 bytes, which with the activations' reads kept the
 * L1's data pipe 91% busy; here it is 50%, and the decode's instructions bind instead (hence
 * nib_pairs, and two tensor copies where eight row copies took about 16 instructions each).
 * Measured on the H100 (bench/results/cuda.md, 2026-12-06): two stages beat three and four. Rows
 * past the matrix arrive as zeros and past r1 as they are; neither is stored. */
enum { GT_S = 2, GT_STAGE = 2048 };

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* k_gvt's parameter: the products and each one's tensor map (gt_map) */
template <int N> struct gt_set : gv_set<N> {
    CUtensorMap map[N];
};

/* Block copy into a stage (at shared address dst): the warp's eight rows from row y, bytes
 * x .. x + 255, arriving on the mbarrier at shared address bar as two swizzled halves of 8 x 128
 * bytes, 1024 bytes apart; one thread calls. */
__device__ __forceinline__ void gt_issue(uint32_t bar, uint32_t dst, const CUtensorMap *map, int x, int y)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(GT_STAGE) : "memory");
#pragma unroll
    for (int half = 0; half < 2; half++)
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                         dst + half * 1024),
                     "l"((uint64_t)map), "r"(x + 128 * half), "r"(y), "r"(bar)
                     : "memory");
}

/* until the mbarrier at shared address bar has completed its phase of the given parity (the
 * thread suspended meanwhile) */
__device__ __forceinline__ void gt_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity), "r"(0x989680u)
                     : "memory");
}

/* PTX's prmt: bytes of {b, a} by the selector's nibbles, a nibble's top bit replicating the chosen
 * byte's sign (which __byte_perm does not promise) */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

template <int TT, int N>
__global__ void __launch_bounds__(32 * GX_WARPS, GX_MINB) k_gvt(const __grid_constant__ gt_set<N> set)
{
    /* from the first 1024-byte boundary (the swizzle's): [GX_WARPS][GT_S][2][8][128] bytes of
     * weights, then [TT][cols] floats */
    extern __shared__ __align__(128) uint8_t gt_sm[];
    __shared__ __align__(8) uint64_t bars[GX_WARPS][GT_S];
    const gv_one g1 = gv_entry(set);
    const kmat w = g1.m.w;
    const CUtensorMap *map = &set.map[g1.ei];
    const float *__restrict__ x = g1.m.x;
    float *__restrict__ y = g1.m.y;
    const size_t ldx = g1.m.ldx, ldy = g1.m.ldy;
    const int r0 = g1.m.r0, r1 = g1.m.r1, T = g1.m.T, bx = g1.bx;
    constexpr int NG = 16;
    /* the warp's index broadcast from lane 0, so that the compiler knows it uniform across the warp
     * and keeps the copies' operands in uniform registers, where a bulk copy takes them */
    const int cols = w.cols, nblk = cols / 512, tl = threadIdx.x & 31;
    const int warp = __shfl_sync(0xFFFFFFFFu, (int)threadIdx.x >> 5, 0);
    const int h = tl & 3, rw = tl >> 2, rbase = r0 + (bx * GX_WARPS + warp) * 8, r = rbase + rw;
    uint8_t *sm = gt_sm + ((1024u - (smem_u32(gt_sm) & 1023u)) & 1023u);
    uint8_t *stg = sm + (size_t)warp * GT_S * GT_STAGE;
    float *xs = (float *)(sm + (size_t)GX_WARPS * GT_S * GT_STAGE);
    const uint8_t *scp = w.scale + (size_t)(r < r1 ? r : r1 - 1) * w.scale_stride;
    /* shared addresses: the warp's mbarriers and stages, and wq0, the thread's word h of row rw in
     * stage 0 with rw in bits 4-6 (the row's address has them clear), so that its word of chunk c,
     * swizzled to chunk c ^ rw, is at wq0 ^ c << 4: one instruction a group */
    const uint32_t bar0 = smem_u32(&bars[warp][0]), stg0 = smem_u32(stg);
    const uint32_t wq0 = (stg0 + rw * 128 + 4 * h) | (uint32_t)rw << 4;
    if (tl == 0) {
#pragma unroll
        for (int s = 0; s < GT_S; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int s = 0; s < GT_S && s < nblk; s++)
            gt_issue(bar0 + 8 * s, stg0 + s * GT_STAGE, map, 256 * s, rbase);
    }
    gx_stage_x<TT>(xs, x, ldx, T, cols);
    float acc[4][TT] = {}; /* +0 */
    uint4 sc_next = __ldg((const uint4 *)scp); /* the row's scales of the next block, a byte a group */
    /* block b's stage (b % 2) as its mbarrier, its copy's destination and the thread's word there,
     * and the next stage's, swapped after each block: carried through the loop, they are not
     * recomputed from the shared window's base at every block (ptxas did, 0.2 instructions an
     * element); parity, the stage's phase */
    static_assert(GT_S == 2, "the stages alternate");
    uint32_t bar = bar0, dst = stg0, wq = wq0, bar_n = bar0 + 8, dst_n = stg0 + GT_STAGE, wq_n = wq0 + GT_STAGE;
    uint32_t parity = 0;
    const float *xb = xs + 8 * h; /* the thread's activations of block b */
    for (int b = 0; b < nblk; b++, xb += 512) {
        const uint4 s = sc_next;
        if (b + 1 < nblk)
            sc_next = __ldg((const uint4 *)(scp + (size_t)(b + 1) * 16));
        gt_wait(bar, parity);
        const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
        /* FAST: group g's scale byte e + 126 is below 254 (no carry between the bytes); nib_pairs'
         * s0, the float bits (e + 126) << 23, is one byte permute of these: bit 0 of each byte
         * moved to bit 7 (blo) and the rest shifted down (bhi), whose top bits are clear, so that
         * replicating one's sign gives the low half's zero bytes. */
        uint32_t blo[4], bhi[4];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            uint32_t e = sw[v] + 0x7E7E7E7Eu;
            bhi[v] = (e >> 1) & 0x7F7F7F7Fu;
            blo[v] = (e << 7) & 0x80808080u;
        }
        /* as k_gvx: d_nib's one multiply (nib_pairs) when every scale byte of the block is below 128 */
        auto groups = [&](auto fast_c) {
            constexpr bool FAST = decltype(fast_c)::value;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                float xv[TT][8];
                load_xv8<TT>(xb + 32 * g, cols, xv);
                const uint32_t word =
                    *(const uint32_t *)((const uint8_t *)__cvta_shared_to_generic(wq ^ (g % 8) << 4) + (g / 8) * 1024);
                if constexpr (FAST) {
                    const uint32_t j = g % 4;
                    nib_group_pairs<TT>(word, prmt(blo[g / 4], bhi[g / 4], 0xCCu | j << 8 | (4 + j) << 12), xv, acc);
                } else {
                    uint32_t sb8 = (sw[g / 4] >> (8 * (g % 4))) & 0xFFu;
                    nib_group<WF_MXFP4, false, TT>(word, d_e8m0(sb8), 0.0f, xv, acc);
                }
            }
        };
        if (((s.x | s.y | s.z | s.w) & 0x80808080u) == 0)
            groups(std::true_type());
        else
            groups(std::false_type());
        __syncwarp(); /* every lane is done with the stage before the copy engine refills it */
        if (tl == 0 && b + GT_S < nblk)
            gt_issue(bar, dst, map, 256 * (b + GT_S), rbase);
        uint32_t t;
        t = bar, bar = bar_n, bar_n = t;
        t = dst, dst = dst_n, dst_n = t;
        t = wq, wq = wq_n, wq_n = t;
        parity ^= (uint32_t)b & 1u;
    }
    quad_store<TT>(acc, r, r0, r1, T, y, ldy);
}

/* The tensor map of w for k_gvt: its rows as a 2D tensor of bytes (row_bytes x rows), read in
 * boxes of 128 bytes x 8 rows with the 128-byte swizzle. Encoding is host work, 48 ns a map on the
 * H100's host (bench/results/cuda.md), so a launch encodes its products' maps afresh rather than
 * keeping them anywhere. False where the driver refuses (the caller then takes k_gemv). */
static PFN_cuTensorMapEncodeTiled_v12000 gt_encoder(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

static bool gt_map(const kmat *w, CUtensorMap *out)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = gt_encoder(); /* once, thread-safe */
    const cuuint64_t dim[2] = {w->row_bytes, (cuuint64_t)w->rows}, stride[1] = {w->row_bytes};
    const cuuint32_t box[2] = {128, 8}, step[2] = {1, 1};
    return encode && encode(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)w->data, dim, stride, box, step,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int TT, int N> static void launch_gvt(const cudak_mm *m, int n, cudaStream_t st)
{
    static unsigned raised;
    gt_set<N> set;
    for (int i = 0; i < n; i++)
        if (!gt_map(&m[i].w, &set.map[i])) {
            launch_gemv<WF_MXFP4, TT, N>(m, n, st);
            return;
        }
    gx_launch<N>(k_gvt<TT, N>, &raised, GX_WARPS * 8, (size_t)GX_WARPS * GT_S * GT_STAGE + 1024, TT, m, n, st, set);
}

/* one launch of k_gemv (or k_gvx, k_gvt) for n <= CUDAK_SET products of T <= 8, its token tile the
 * largest T's */
template <int FMT, int N> static void gemv_tt(const cudak_mm *m, int n, int T, cudaStream_t st)
{
    if constexpr (FMT == WF_MXFP4 || FMT == WF_INT4G32) {
        /* INT4 at T = 2 measured slower in k_gvx on one expert shape; MXFP4 at T = 3 and 4 takes
         * k_gvt where four tokens' activations fit, the expert shapes (bench/results/cuda.md) */
        bool fits = T == 1 || (FMT == WF_MXFP4 && T <= 4);
        for (int i = 0; i < n && fits; i++)
            fits = T == 1 ? gx_fits<1>(&m[i]) : T == 2 ? gx_fits<2>(&m[i]) : gx_fits<4>(&m[i]);
        if (fits) {
            if constexpr (FMT == WF_MXFP4) {
                if (T == 1)
                    launch_gvt<1, N>(m, n, st);
                else if (T == 2)
                    launch_gvt<2, N>(m, n, st);
                else
                    launch_gvt<4, N>(m, n, st);
            } else {
                launch_gvx<FMT, 1, N>(m, n, st);
            }
            return;
        }
    }
    if (T == 1)
        launch_gemv<FMT, 1, N>(m, n, st);
    else if (T == 2)
        launch_gemv<FMT, 2, N>(m, n, st);
    else if (T <= 4)
        launch_gemv<FMT, 4, N>(m, n, st);
    else
        launch_gemv<FMT, 8, N>(m, n, st);
}

/* T <= 8 reads each weight once for every token (a memory-bound pass: decode or verify); longer
 * passes, and matrices k_gemv does not take, go to the tiles of cuda_mm.cu. */
template <int FMT>
static void matmul_fmt(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                       cudaStream_t st)
{
    if (T <= 8 && gv_fits<FMT>(w)) {
        cudak_mm m = {.w = *w, .x = x, .ldx = ldx, .y = y, .ldy = ldy, .r0 = r0, .r1 = r1, .T = T};
        gemv_tt<FMT, 1>(&m, 1, T, st);
    } else {
        cuda_mm_tiles(w, r0, r1, x, ldx, T, y, ldy, st);
    }
}

extern "C" void cudak_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y,
                             size_t ldy, void *stream)
{
    if (r1 <= r0 || T <= 0)
        return;
    cudaStream_t st = (cudaStream_t)stream;
    by_format(w->fmt, [&](auto fmt) { matmul_fmt<decltype(fmt)::value>(w, r0, r1, x, ldx, T, y, ldy, st); });
}

/* The products of a set by class and format, each class's products of a format in launches of up
 * to CUDAK_SET: T <= 8 where k_gemv's family takes them (gemv_tt), T of 9 to 16 and above 16 where
 * k_mmx does (cuda_mm_set: a MoE layer's experts at prefill, each of a few tokens, fill the GPU
 * together where each alone would not); the rest one by one. No product reads what another
 * writes, so the launches' order changes no value. */
extern "C" void cudak_matmul_set(const cudak_mm *m, int n, void *stream)
{
    enum { S_GEMV, S_MX16, S_MX32, S_ONE, S_NONE };
    enum { CHUNK = 2 * CUDAK_SET }; /* products sorted at a time (cls on the stack) */
    cudaStream_t st = (cudaStream_t)stream;
    uint8_t cls[CHUNK];
    for (int i0 = 0; i0 < n; i0 += CHUNK) {
        const int n1 = n - i0 < CHUNK ? n - i0 : CHUNK;
        const cudak_mm *p = m + i0;
        for (int i = 0; i < n1; i++)
            by_format(p[i].w.fmt, [&](auto f) {
                constexpr int FMT = decltype(f)::value;
                cls[i] = p[i].T <= 0 || p[i].r1 <= p[i].r0 ? S_NONE
                         : p[i].T <= 8 && gv_fits<FMT>(&p[i].w) ? S_GEMV
                         : cuda_mm_set_fits(&p[i])               ? (p[i].T <= 16 ? S_MX16 : S_MX32)
                                                                 : S_ONE;
            });
        cudak_mm run[CUDAK_SET];
        for (int c = S_GEMV; c < S_ONE; c++)
            for (int fmt = 0; fmt < WF_COUNT; fmt++) {
                int k = 0, T = 0;
                for (int i = 0; i <= n1; i++) {
                    if (i < n1 && cls[i] == c && p[i].w.fmt == fmt) {
                        run[k++] = p[i];
                        T = p[i].T > T ? p[i].T : T;
                    }
                    if (k > 0 && (k == CUDAK_SET || i == n1)) {
                        if (c == S_GEMV)
                            by_format(fmt, [&](auto f) { gemv_tt<decltype(f)::value, CUDAK_SET>(run, k, T, st); });
                        else
                            cuda_mm_set(run, k, st);
                        k = T = 0;
                    }
                }
            }
        for (int i = 0; i < n1; i++)
            if (cls[i] == S_ONE)
                cudak_matmul(&p[i].w, p[i].r0, p[i].r1, p[i].x, p[i].ldx, p[i].T, p[i].y, p[i].ldy, stream);
    }
}

template <int FMT> __global__ void k_decode_rows(kmat w, int r0, int r1, float *out)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)(r1 - r0) * (size_t)w.cols;
    if (e < n)
        out[e] = d_elem<FMT>(w, r0 + (int)(e / (size_t)w.cols), (int)(e % (size_t)w.cols));
}

extern "C" void cudak_decode_rows(const kmat *w, int r0, int r1, float *out, void *stream)
{
    size_t n = (size_t)(r1 - r0) * (size_t)w->cols;
    if (r1 <= r0 || n == 0)
        return;
    unsigned blocks = (unsigned)((n + 255) / 256);
    cudaStream_t st = (cudaStream_t)stream;
    by_format(w->fmt, [&](auto fmt) {
        k_decode_rows<decltype(fmt)::value><<<blocks, 256, 0, st>>>(*w, r0, r1, out);
    });
}

/* ---- vectors ---- */

/* one half-warp per row (cuda_warp.cuh's dot) */
__global__ void k_dot_rows(const float *__restrict__ a, const float *__restrict__ x, size_t ldx, int rows, int n,
                           float *__restrict__ out)
{
    int s = blockIdx.x * (blockDim.x / 16) + threadIdx.x / 16;
    if (s >= rows)
        return;
    float v = half_dot16(a, x + (size_t)s * ldx, n);
    if ((threadIdx.x & 15) == 0)
        out[s] = v;
}

extern "C" void cudak_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out, void *stream)
{
    if (rows <= 0)
        return;
    k_dot_rows<<<(unsigned)((rows + 15) / 16), 256, 0, (cudaStream_t)stream>>>(a, x, ldx, rows, n, out);
}

/* one output a grid row (blockIdx.y) */
__global__ void k_axpy_rows(float *y, size_t ldy, const float *__restrict__ a, size_t lda,
                            const float *__restrict__ x, size_t ldx, int n, int len)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len)
        return;
    y += blockIdx.y * ldy;
    a += blockIdx.y * lda;
    float v = y[i];
#pragma unroll 8
    for (int s = 0; s < n; s++)
        v = __fmaf_rn(a[s], x[(size_t)s * ldx + i], v);
    y[i] = v;
}

extern "C" void cudak_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx,
                                int n, int len, void *stream)
{
    if (len <= 0 || ny <= 0)
        return;
    dim3 grid((unsigned)((len + 255) / 256), (unsigned)ny);
    k_axpy_rows<<<grid, 256, 0, (cudaStream_t)stream>>>(y, ldy, a, lda, x, ldx, n, len);
}

/* kern_scalar_kda_step, one thread per column c: every operation is element-wise across columns
 * and the rows go in order, so column c's values are the scalar loop's. */
__global__ void k_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                           float beta, float *o)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d)
        return;
    float u = 0.0f;
    for (int r = 0; r < d; r++) {
        float s = S[(size_t)r * d + c] * alpha[r];
        S[(size_t)r * d + c] = s;
        u = __fmaf_rn(s, k[r], u);
    }
    u = beta * (v[c] - u);
    float oc = 0.0f;
    for (int r = 0; r < d; r++) {
        float s = __fmaf_rn(k[r], u, S[(size_t)r * d + c]);
        S[(size_t)r * d + c] = s;
        oc = __fmaf_rn(s, q[r], oc);
    }
    o[c] = oc;
}

extern "C" void cudak_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                               float beta, float *o, void *stream)
{
    k_kda_step<<<(unsigned)((d + 127) / 128), 128, 0, (cudaStream_t)stream>>>(S, d, k, v, q, alpha, beta, o);
}

__global__ void k_glu(int act, float *gate, const float *__restrict__ up, int n, float bt, float bl)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        gate[i] = act == KERN_GLU_SITU ? km_situ(gate[i], up[i], bt, bl) : km_swiglu(gate[i], up[i]);
}

extern "C" void cudak_glu(int act, float *gate, const float *up, int n, float bt, float bl, void *stream)
{
    if (n > 0)
        k_glu<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(act, gate, up, n, bt, bl);
}

struct glu_set {
    int n, off[CUDAK_SET], len[CUDAK_SET];
};

/* k_glu over span blockIdx.y of the set */
__global__ void k_glu_set(int act, float *gate, const float *__restrict__ up, const glu_set set, float bt, float bl)
{
    int j = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= set.len[j])
        return;
    i += set.off[j];
    gate[i] = act == KERN_GLU_SITU ? km_situ(gate[i], up[i], bt, bl) : km_swiglu(gate[i], up[i]);
}

extern "C" void cudak_glu_set(int act, float *gate, const float *up, const int *off, const int *len, int n, float bt,
                              float bl, void *stream)
{
    for (int i = 0; i < n; i += CUDAK_SET) {
        glu_set set;
        set.n = n - i < CUDAK_SET ? n - i : CUDAK_SET;
        int most = 0;
        for (int j = 0; j < set.n; j++) {
            set.off[j] = off[i + j];
            set.len[j] = len[i + j];
            most = len[i + j] > most ? len[i + j] : most;
        }
        if (most > 0)
            k_glu_set<<<dim3((unsigned)((most + 255) / 256), (unsigned)set.n), 256, 0, (cudaStream_t)stream>>>(
                act, gate, up, set, bt, bl);
    }
}

__global__ void k_exp_sub(float *x, int n, float m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = km_expf(x[i] - m);
}

extern "C" void cudak_exp_sub(float *x, int n, float m, void *stream)
{
    if (n > 0)
        k_exp_sub<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, n, m);
}

extern "C" int cudak_sync(void *stream, const char *what, errbuf *err)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e != cudaSuccess)
        return errbuf_set(err, "%s: CUDA error: %s", what, cudaGetErrorString(e));
    return 0;
}
