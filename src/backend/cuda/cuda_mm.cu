/* cuda_mm.cu — the CUDA matrix products of passes over many tokens (prefill), and of matrices the
 * decode kernels do not take, in kern.h's seq16 order (cuda_mat.cuh's cuda_mm_tiles).
 *
 * Compiled as cuda_kern.cu: -fmad=false, no fast math; every product is one __fmaf_rn.
 *
 * Each output's seq16 sums are 16 threads ("lanes"), each holding its lane's partial sums for
 * every row and token of its register tile, and each summing its own columns in increasing order
 * with one FMA per column, as kern_scalar.c's row_dot does. The columns are staged through shared
 * memory: a block's weights are decoded there exactly (cuda_mat.cuh's decoders, dtype.c's) and
 * its activations copied there, both in lane order, so that lane l's s-th column of a stage is at
 * 16 s + l (the 4-bit formats' nibble order is a permutation inside each group of 32). After the
 * last stage the 16 lanes are added in seq16's tree (h = 8, 4, 2, 1): acc[j] + acc[j + h] for
 * j < h. k_mmx (prefill, aligned rows) holds all 16 lanes of a tile in one block and adds them
 * through shared memory; k_matmul (the rest) holds them in one warp and adds them by shuffles.
 *
 * Invariant: a lane adds exactly its own columns < cols, in order, and nothing else. The tail
 * skips the columns past the row's end rather than adding zeros, because a sum can be -0 (a tiny
 * negative product rounded away) and -0 + +0 is +0.
 */
#include <assert.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_mat.cuh"

enum { MM_C = 128 };

/* A block of threads computes BR = RG x RT rows times BT = TGN x TT tokens: thread (lane, rg, tg)
 * holds the lane's sums of rows rg*RT .. +RT and tokens tg*TT .. +TT. Shared rows are padded so
 * that the two row groups of a warp read different banks. */
template <int FMT, int RT, int TT, int RG, int TGN>
__global__ void __launch_bounds__(16 * RG * TGN)
    k_matmul(kmat w, int r0, int r1, const float *__restrict__ x, size_t ldx, int T, float *__restrict__ y,
             size_t ldy)
{
    constexpr int BR = RG * RT, BT = TGN * TT, NT = 16 * RG * TGN, WS = MM_C + (RT == 1 ? 16 : 4), XS = MM_C + 4;
    __shared__ float Ws[BR * WS];
    __shared__ float Xs[BT * XS];
    const int tid = threadIdx.x, lane = tid & 15, rg = (tid >> 4) % RG, tg = (tid >> 4) / RG;
    const int rbase = r0 + blockIdx.x * BR, tbase = blockIdx.y * BT, cols = w.cols;
    float acc[RT][TT];
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
        for (int k = 0; k < TT; k++)
            acc[j][k] = 0.0f;
    for (int c0 = 0; c0 < cols; c0 += MM_C) {
        __syncthreads();
        for (int e = tid; e < BR * MM_C; e += NT) {
            int rr = e / MM_C, cc = e % MM_C, r = rbase + rr, c = c0 + cc;
            Ws[rr * WS + lane_pos<FMT>(cc)] = r < r1 && c < cols ? d_elem<FMT>(w, r, c) : 0.0f;
        }
        for (int e = tid; e < BT * MM_C; e += NT) {
            int tt = e / MM_C, cc = e % MM_C, t = tbase + tt, c = c0 + cc;
            Xs[tt * XS + lane_pos<FMT>(cc)] = t < T && c < cols ? x[(size_t)t * ldx + c] : 0.0f;
        }
        __syncthreads();
        const float *wp = Ws + rg * RT * WS + lane, *xp = Xs + tg * TT * XS + lane;
        if (c0 + MM_C <= cols) {
#pragma unroll 8
            for (int s = 0; s < MM_C / 16; s++) {
                float wv[RT], xv[TT];
#pragma unroll
                for (int j = 0; j < RT; j++)
                    wv[j] = wp[j * WS + 16 * s];
#pragma unroll
                for (int k = 0; k < TT; k++)
                    xv[k] = xp[k * XS + 16 * s];
#pragma unroll
                for (int j = 0; j < RT; j++)
#pragma unroll
                    for (int k = 0; k < TT; k++)
                        acc[j][k] = __fmaf_rn(wv[j], xv[k], acc[j][k]);
            }
        } else { /* the row's last, partial block: only this lane's columns before the end */
            for (int s = 0; s < MM_C / 16 && c0 + lane_col<FMT>(lane, s) < cols; s++) {
#pragma unroll
                for (int j = 0; j < RT; j++)
#pragma unroll
                    for (int k = 0; k < TT; k++)
                        acc[j][k] = __fmaf_rn(wp[j * WS + 16 * s], xp[k * XS + 16 * s], acc[j][k]);
            }
        }
    }
    tile_store<RT, TT>(acc, rbase + rg * RT, tbase + tg * TT, r0, r1, T, y, ldy);
}

/* the bytes of 8 columns of a row in FMT (F32: 32, 16-bit: 16, 8-bit: 8, 4-bit: 4) */
template <int FMT> __host__ __device__ constexpr int mx_piece()
{
    return FMT == WF_F32 ? 32 : FMT == WF_F16 || FMT == WF_BF16 ? 16 : FMT == WF_MXFP4 || FMT == WF_INT4G32 ? 4 : 8;
}

/* 8 columns of a row from their bytes p (mx_piece<FMT>() of them, aligned to their size) and
 * their group's scale s (d_scale32's), exactly as d_elem gives them (MXFP4 by nib_pairs where the
 * scale is at most 1, as nearly every trained weight's is: sc x 2^126 is then a float, exact) */
template <int FMT> __device__ __forceinline__ void d_piece8(const uint8_t *p, float s, float (&v)[8])
{
    if (FMT == WF_F32) {
        float4 a = *(const float4 *)p, b = *(const float4 *)(p + 16);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if (FMT == WF_BF16 || FMT == WF_F16) {
        uint4 q = *(const uint4 *)p;
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = FMT == WF_BF16 ? d_bf16(u[i] & 0xFFFFu) : d_f16(u[i] & 0xFFFFu);
            v[2 * i + 1] = FMT == WF_BF16 ? d_bf16(u[i] >> 16) : d_f16(u[i] >> 16);
        }
    } else if (FMT == WF_MXFP4 || FMT == WF_INT4G32) {
        uint32_t q = *(const uint32_t *)p; /* column i: nibble i */
        if (FMT == WF_MXFP4 && s <= 1.0f) { /* d_nib's one-multiply case, two codes at a time */
            nib_pairs(q, __float_as_uint(s * 0x1p126f), v);
            return;
        }
        v[0] = d_nib<FMT, 0, false>(q, s, 0.0f), v[1] = d_nib<FMT, 4, false>(q, s, 0.0f);
        v[2] = d_nib<FMT, 8, false>(q, s, 0.0f), v[3] = d_nib<FMT, 12, false>(q, s, 0.0f);
        v[4] = d_nib<FMT, 16, false>(q, s, 0.0f), v[5] = d_nib<FMT, 20, false>(q, s, 0.0f);
        v[6] = d_nib<FMT, 24, false>(q, s, 0.0f), v[7] = d_nib<FMT, 28, false>(q, s, 0.0f);
    } else {
        uint2 q = *(const uint2 *)p;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t b = ((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xFFu;
            v[i] = FMT == WF_INT8G32 ? (float)(int8_t)b * s : d_e4m3(b) * s;
        }
    }
}

/* Prefill passes (T > 8): k_mmx computes BR = 8 RGN rows x BT (16 or 32) tokens a block, all 16
 * lanes of seq16 in it, so that each weight and activation staged serves every lane's thread that
 * needs it. A launch takes a set of products (one, or a MoE layer's experts, each of a few tokens,
 * which alone would leave most SMs idle), each block one product's, row blocks first. A lane's
 * TPL = TG RGN threads each hold 8 rows x 8 tokens (sub: RGN row groups x TG = BT / 8 token
 * groups), 64 sums; the lanes are the slow index (a warp holds 32 / TPL of them) so
 * that a warp's threads read few distinct shared words and most reads are broadcasts. Row group g
 * is rows 4g .. 4g + 3 and BR / 2 + 4g .. + 3, so that the groups' 16-byte reads of a stage line
 * fall in distinct banks (with 8 consecutive rows a group, two groups shared every bank: ncu
 * counted 40% of the shared wavefronts as conflicts, and BF16 at T = 512 went 0.23 -> 0.26 of the
 * FMA peak without them). Columns go in stages of MX_KC, decoded and transposed into shared memory
 * (column-major in lane order: lane l's s-th column of a stage is line 16 s + l, the block's rows
 * side by side, swizzled by mx_swz), two stages in turn. The activations of the next stage come by
 * asynchronous copies straight to their places while this one is reduced; each thread's piece of
 * the weights comes raw, two stages ahead, by an asynchronous copy into a slot of its own, and the
 * thread decodes it from there into the next stage after reducing this one. A warp reads pieces of
 * 4 rows (tokens) from memory, 4 lines a read: when it read one 16-byte piece of each of 32 rows,
 * and 32 tokens a float at a time, each read touched 32 lines and the L1 bound the kernel; and when
 * the weights came a stage ahead through registers, the warps waited on them (BF16 at T = 512 on
 * the H100: 0.26, then 0.38-0.40, now 0.46-0.48 of the FMA peak, bench/results/cuda.md). A step
 * reads a thread's 8 weights and 8 activations as four 16-byte words and makes 64 FMAs. At the end
 * the lanes are added in seq16's tree through shared memory (lanes h .. 2h - 1 give their sums to
 * lanes 0 .. h - 1, h = 8, 4, 2, 1) and lane 0 stores. Same invariant as k_matmul: a lane adds its
 * own columns < cols, in order. */
enum { MX_KC = 64 };
template <int RGN, int BT> struct mx_dims {
    static constexpr int TG = BT / 8, BR = 8 * RGN, TPL = TG * RGN, NT = 16 * TPL;
    static constexpr int WLD = BR, XLD = 32, XOFF = MX_KC * WLD;         /* stage lines, floats */
    static constexpr int STAGE = MX_KC * (WLD + XLD);                     /* one stage's floats */
    static constexpr int RED = 64 * TPL + 16;                              /* a lane's sums in the tree */
    static constexpr int RAW = 32 * 8 * BR; /* a raw weight buffer, bytes (8 F32 columns a piece) */
    static constexpr int FLOATS = 2 * STAGE + RAW / 2 > 8 * RED ? 2 * STAGE + RAW / 2 : 8 * RED;
    static constexpr int WP = BR * MX_KC / 8 / NT, XN = BT * MX_KC / NT; /* staged per thread */
    static constexpr int XH = MX_KC / XN / 8;                              /* warps a token's columns take */
    static_assert((WP == 1 || WP == 2) && (XN == 8 || XN == 4) && BT <= XLD, "staging in whole pieces");
};

/* The stages' swizzle: row (or token) p of line l is stored at p ^ mx_swz(l) of the line. It flips
 * bits 2-4 only, so each 16-byte group of 4 rows (tokens) a step reads stays whole. Without it the
 * transposed stores of a warp's 4 rows x 8 column pieces (4 tokens x 8 pieces) would put up to 8
 * words in one bank; with it every staging store is one wavefront and a step's reads are as before,
 * for every format and block size (checked by enumerating the warps' addresses). mx_swz is linear
 * over bits (mx_swz(a | b) = mx_swz(a) ^ mx_swz(b) where a & b = 0), and the lines are multiples of
 * 32 floats long, so mx_at(a | b, p, ld) = (mx_at(a, p, ld) ^ mx_swz(b)) + b * ld: a thread's part
 * of an address is computed once and the rest is constants. */
__device__ __forceinline__ int mx_swz(int l) { return 4 * ((l ^ (l >> 3) ^ (l >> 4)) & 7); }

/* where row (token) p of line l is, in floats from its array's start (lines of ld floats) */
__device__ __forceinline__ int mx_at(int l, int p, int ld) { return l * ld + (p ^ mx_swz(l)); }

typedef gv_set<CUDAK_SET> mx_set; /* k_mmx's products (one, or a MoE layer's experts) */

template <int FMT, int RGN, int BT>
__global__ void __launch_bounds__(mx_dims<RGN, BT>::NT, 512 / mx_dims<RGN, BT>::NT)
    k_mmx(const __grid_constant__ mx_set set)
{
    using D = mx_dims<RGN, BT>;
    extern __shared__ __align__(16) float sm[];
    /* the block's product, and its place there: row blocks first, then token blocks */
    const gv_one g1 = gv_entry(set);
    const kmat w = g1.m.w;
    const float *__restrict__ x = g1.m.x;
    float *__restrict__ y = g1.m.y;
    const size_t ldx = g1.m.ldx, ldy = g1.m.ldy;
    const int r0 = g1.m.r0, r1 = g1.m.r1, T = g1.m.T, nrb = (r1 - r0 + D::BR - 1) / D::BR;
    const int tid = threadIdx.x, lane = tid / D::TPL, sub = tid % D::TPL, rg = sub % RGN, tg = sub / RGN;
    const int rbase = r0 + g1.bx % nrb * D::BR, tbase = g1.bx / nrb * BT, cols = w.cols;
    /* staging: row tid / 8 (and BR / 2 + tid / 8 where WP is 2), columns 8 (tid % 8) .. + 7, so that
     * a warp reads whole 128-byte lines of 4 BF16 rows (32 rows before: a line each); a warp's tokens
     * are 4, each read as 8 (tid % 8) pieces of XN columns (the 64 columns when XN is 8, half of them
     * when it is 4) */
    const int wr = tid / 8, wc = tid % 8 * 8;
    const int xt = (tid >> 5) / D::XH * 4 + (tid & 31) / 8, xc = ((tid >> 5) % D::XH * 8 + tid % 8) * D::XN;
    float acc[8][8];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[j][k] = 0.0f;
    /* the weights: each thread copies its own pieces of a stage (8 columns of rows wr and wr + BR/2)
     * into slots of its own of a raw buffer, two stages ahead, asynchronously, and decodes them from
     * there into the stage a stage ahead; a piece's group scale is read one stage ahead into a
     * register */
    constexpr int PB = mx_piece<FMT>(), CH = PB < 16 ? PB : 16;
    const uint8_t *wrow = w.data + (size_t)(rbase + wr) * w.row_bytes + (size_t)wc * PB / 8;
    uint8_t *raw = (uint8_t *)(sm + 2 * D::STAGE) + tid * PB; /* slots side by side: no bank conflicts */
    auto win = [&](int k, int c0) { return rbase + wr + k * D::BR / 2 < r1 && c0 + wc < cols; };
    auto wcopy = [&](int rb, int c0) {
#pragma unroll
        for (int k = 0; k < D::WP; k++) {
            const bool in = win(k, c0);
            const uint8_t *src = in ? wrow + (size_t)k * (D::BR / 2) * w.row_bytes + (size_t)c0 * PB / 8 : w.data;
#pragma unroll
            for (int b = 0; b < PB; b += CH)
                __pipeline_memcpy_async(raw + rb * D::RAW + k * D::NT * PB + b, src + b, CH, in ? 0 : CH);
        }
        __pipeline_commit();
    };
    float sc[D::WP];
    auto scale = [&](int c0) {
#pragma unroll
        for (int k = 0; k < D::WP; k++)
            sc[k] = win(k, c0) ? d_scale32<FMT>(w, rbase + wr + k * D::BR / 2, c0 + wc) : 1.0f;
    };
    /* the activations go straight to their places in the stage, 4-byte asynchronous copies (no
     * registers held over the steps), zeros past T and cols */
    const float *xrow = x + (size_t)(tbase + xt < T ? tbase + xt : 0) * ldx + xc;
    const bool xin = tbase + xt < T;
    /* Stage addresses (floats from a stage's start) by mx_at's split: the thread's part once here,
     * each index's constant part at its use. Staging: element i of the thread's piece goes to line
     * lane_pos(wc) | lane_pos(i) (so for XN's pieces). Steps: line 16 s | lane. */
    const int sw = mx_at(lane_pos<FMT>(wc), wr, D::WLD), sx = D::XOFF + mx_at(lane_pos<FMT>(xc), xt, D::XLD);
    const int rw = mx_at(lane, rg * 4, D::WLD), rx = D::XOFF + mx_at(lane, tg * 8, D::XLD);
    /* A stage's addresses are the thread's part plus the stage's start (STAGE floats apart, a
     * multiple of 32, so the sum keeps the XORs' bits), passed through an empty asm so that the
     * compiler computes each where it is used rather than holding them all over the loop in
     * registers (which made the 128-register kernel spill). */
    auto opaque = [](int v) {
        asm("" : "+r"(v));
        return v;
    };
    /* raw buffer rb's pieces, decoded with their scales sc, into stage b (piece k's row is wr | k
     * BR/2: its place is sw's with that bit flipped) */
    auto store = [&](int b, int rb) {
        const int a = opaque(sw + b * D::STAGE);
#pragma unroll
        for (int k = 0; k < D::WP; k++) {
            float v[8];
            d_piece8<FMT>(raw + rb * D::RAW + k * D::NT * PB, sc[k], v);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int l = lane_pos<FMT>(i);
                sm[(a ^ mx_swz(l) ^ k * D::BR / 2) + l * D::WLD] = v[i];
            }
        }
    };
    auto xcopy = [&](int b, int c0) {
        const int a = opaque(sx + b * D::STAGE);
        const bool in = xin && c0 + xc < cols;
#pragma unroll
        for (int i = 0; i < D::XN; i++) {
            const int l = lane_pos<FMT>(i);
            __pipeline_memcpy_async(sm + (a ^ mx_swz(l)) + l * D::XLD, in ? xrow + c0 + i : x, 4, in ? 0 : 4);
        }
        __pipeline_commit();
    };
    /* The copies are committed in groups in the order W0, X0, W1, then each stage st: X(st + 1),
     * W(st + 2) (empty groups past the end), so that waiting for all but the newest group leaves
     * only W(st + 2) in flight. A thread's raw slot is read by itself only: no barrier for it. */
    /* step s of the stage whose addresses are aw, ax (rw, rx and the stage): the thread's rows
     * rg*4 .. + 3 and BR/2 + rg*4 .. + 3, and tokens tg*8 .. + 7, of its lane's s-th column (the
     * second groups' bit, BR/2 or 4, is clear in rw and rx: one XOR) */
    auto step = [&](int aw, int ax, int s) {
        const int z = mx_swz(16 * s);
        float4 w0 = *(const float4 *)(sm + (aw ^ z) + 16 * s * D::WLD);
        float4 w1 = *(const float4 *)(sm + (aw ^ z ^ D::BR / 2) + 16 * s * D::WLD);
        float4 x0 = *(const float4 *)(sm + (ax ^ z) + 16 * s * D::XLD);
        float4 x1 = *(const float4 *)(sm + (ax ^ z ^ 4) + 16 * s * D::XLD);
        float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[j][k] = __fmaf_rn(wv[j], xv[k], acc[j][k]);
    };
    const int nst = (cols + MX_KC - 1) / MX_KC;
    wcopy(0, 0);
    xcopy(0, 0);
    wcopy(1, MX_KC); /* zeros past the end */
    scale(0);
    __pipeline_wait_prior(1);
    store(0, 0);
    __syncthreads();
    for (int st = 0; st < nst; st++) {
        int c0 = st * MX_KC;
        if (st + 1 < nst) {
            xcopy((st + 1) & 1, c0 + MX_KC);
            scale(c0 + MX_KC);
        } else
            __pipeline_commit();
        if (st + 2 < nst)
            wcopy(st & 1, c0 + 2 * MX_KC);
        else
            __pipeline_commit();
        const int aw = opaque(rw + (st & 1) * D::STAGE), ax = opaque(rx + (st & 1) * D::STAGE);
        if (c0 + MX_KC <= cols) {
#pragma unroll
            for (int s = 0; s < MX_KC / 16; s++)
                step(aw, ax, s);
        } else { /* the row's last, partial stage: only this lane's columns before the end */
            for (int s = 0; s < MX_KC / 16 && c0 + lane_col<FMT>(lane, s) < cols; s++)
                step(aw, ax, s);
        }
        if (st + 1 < nst) {
            __pipeline_wait_prior(1);
            store((st + 1) & 1, (st + 1) & 1);
        }
        __syncthreads();
    }
    __pipeline_wait_prior(0); /* a copy of zeros past the end may be in flight over the tree's memory */
    __syncthreads();
    for (int h = 8; h >= 1; h >>= 1) { /* seq16's tree: acc[l] + acc[l + h] */
        if (lane >= h && lane < 2 * h) {
            float *rp = sm + (lane - h) * D::RED + sub;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    rp[(j * 8 + k) * D::TPL] = acc[j][k];
        }
        __syncthreads();
        if (lane < h) {
            const float *rp = sm + lane * D::RED + sub;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    acc[j][k] = acc[j][k] + rp[(j * 8 + k) * D::TPL];
        }
        __syncthreads();
    }
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int r = rbase + rg * 4 + (j & 3) + (j >> 2) * (D::BR / 2), t = tbase + tg * 8 + k;
                if (r < r1 && t < T)
                    y[(size_t)t * ldy + (size_t)(r - r0)] = acc[j][k];
            }
}

template <int FMT, int RT, int TT, int RG, int TGN>
static void launch_mm(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                      cudaStream_t st)
{
    constexpr int BR = RG * RT, BT = TGN * TT;
    dim3 grid((unsigned)((r1 - r0 + BR - 1) / BR), (unsigned)((T + BT - 1) / BT));
    k_matmul<FMT, RT, TT, RG, TGN><<<grid, 16 * RG * TGN, 0, st>>>(*w, r0, r1, x, ldx, T, y, ldy);
}

/* whether k_mmx takes w: rows 16-byte aligned (its pieces' copies) and whole 32-column groups */
static bool mx_fits(const kmat *w)
{
    return (uintptr_t)w->data % 16 == 0 && w->row_bytes % 16 == 0 && w->cols % 32 == 0;
}

/* the current device's SM count, asked once a device */
static int cuda_sms(void)
{
    static int sms[32];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev >= 32 || !sms[dev]) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (dev >= 32)
            return n;
        sms[dev] = n;
    }
    return sms[dev];
}

/* one launch of k_mmx over the n <= CUDAK_SET products m */
template <int FMT, int RGN, int BT> static void launch_mmx(const cudak_mm *m, int n, cudaStream_t st)
{
    using D = mx_dims<RGN, BT>;
    static unsigned raised;
    smem_raise(k_mmx<FMT, RGN, BT>, &raised, D::FLOATS * 4);
    mx_set set;
    const int nb = gv_fill(set, m, n, [](const cudak_mm &e) {
        return (e.r1 - e.r0 + D::BR - 1) / D::BR * ((e.T + BT - 1) / BT);
    });
    k_mmx<FMT, RGN, BT><<<(unsigned)nb, D::NT, D::FLOATS * 4, st>>>(set);
}

/* k_mmx's tile for the products m: 64-row blocks where they are enough to fill half the SMs, else
 * 32-row ones (on the H100 at T = 16, 3072 rows ran in 87 us in 96 blocks of 32 and 120 us in 48
 * of 64; at T = 64 or 12288 rows the 64-row blocks won), of 16 tokens where every T fits them (a
 * MoE layer's experts at prefill see a few tokens each), else 32 (bench/results/cuda.md) */
template <int FMT> static void mmx_set(const cudak_mm *m, int n, cudaStream_t st)
{
    int tmax = 0;
    for (int i = 0; i < n; i++)
        tmax = m[i].T > tmax ? m[i].T : tmax;
    const int bt = tmax <= 16 ? 16 : 32;
    long b64 = 0;
    for (int i = 0; i < n; i++)
        b64 += (long)((m[i].r1 - m[i].r0 + 63) / 64) * ((m[i].T + bt - 1) / bt);
    const bool wide = b64 >= cuda_sms() / 2;
    if (bt == 16)
        (wide ? launch_mmx<FMT, 8, 16> : launch_mmx<FMT, 4, 16>)(m, n, st);
    else
        (wide ? launch_mmx<FMT, 8, 32> : launch_mmx<FMT, 4, 32>)(m, n, st);
}

bool cuda_mm_set_fits(const cudak_mm *m) { return m->T > 8 && m->r1 > m->r0 && mx_fits(&m->w); }

void cuda_mm_set(const cudak_mm *m, int n, cudaStream_t st)
{
    assert(n >= 1 && n <= CUDAK_SET);
    by_format(m[0].w.fmt, [&](auto fmt) { mmx_set<decltype(fmt)::value>(m, n, st); });
}

/* k_mmx where the rows allow it (T > 8), else k_matmul's tile for T */
template <int FMT>
static void tiles_fmt(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                      cudaStream_t st)
{
    const cudak_mm one = {.w = *w, .x = x, .ldx = ldx, .y = y, .ldy = ldy, .r0 = r0, .r1 = r1, .T = T};
    if (cuda_mm_set_fits(&one))
        mmx_set<FMT>(&one, 1, st);
    else if (T == 1)
        launch_mm<FMT, 1, 1, 16, 1>(w, r0, r1, x, ldx, T, y, ldy, st);
    else if (T == 2)
        launch_mm<FMT, 1, 2, 16, 1>(w, r0, r1, x, ldx, T, y, ldy, st);
    else if (T <= 4)
        launch_mm<FMT, 1, 4, 16, 1>(w, r0, r1, x, ldx, T, y, ldy, st);
    else if (T <= 8)
        launch_mm<FMT, 1, 8, 16, 1>(w, r0, r1, x, ldx, T, y, ldy, st);
    else
        launch_mm<FMT, 4, 8, 8, 4>(w, r0, r1, x, ldx, T, y, ldy, st);
}

void cuda_mm_tiles(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                   cudaStream_t st)
{
    by_format(w->fmt, [&](auto fmt) { tiles_fmt<decltype(fmt)::value>(w, r0, r1, x, ldx, T, y, ldy, st); });
}
