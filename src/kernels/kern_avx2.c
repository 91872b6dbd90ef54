/* kern_avx2.c — AVX2 + FMA + F16C kernels, bit-identical to kern_scalar.c.
 *
 * An output's 16 partial sums (kern.h's seq16), a dot's or a matrix row's, live in two ymm
 * registers (lanes 0-7 and 8-15); dot_v8 with kern_dot8.inc, and reduce16, are the kern.h tree
 * step by step. Tails are decoded exactly by the scalar decoder and added with blended
 * FMAs (lanes past the end are left untouched). 4-bit codes use the nibble lane order
 * of kern.h and 8-entry vpermps tables: INT4 two of them (code bit 3 picks the table),
 * MXFP4 one of magnitudes with code bit 3 as the sign (nib_sel_sm), so -0 and every scale multiply
 * match the scalar decoder's bits. T > 1 decodes a block of rows once into scratch and reduces it
 * in 4-row x 3-token register tiles of half-sums (kern_matmul.inc).
 */
#include "kernels/kern.h"
#include "kernels/kmath.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#define INLINE static inline __attribute__((always_inline))
/* Loops over a row's accumulator registers are unrolled by the compiler on request: at -O2 gcc
 * left them rolled, which kept the 64 partial sums in memory (a store and a reload per FMA) and
 * held AVX2 MXFP4 to 7 GFLOPS and BF16 to 9 GB/s on one core with the rows in L2 (15 and 26
 * unrolled, on the Xeon host of 2026-12-01). */
#define UNROLL _Pragma("GCC unroll 8")

static float mx_tab[256][16] __attribute__((aligned(64))); /* e2m1[c] * e8m0[s] */
static const float lut_int4[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_init(void)
{
    for (int s = 0; s < 256; s++)
        for (int c = 0; c < 16; c++)
            mx_tab[s][c] = e2m1_table[c] * e8m0_to_f32((uint8_t)s);
}

INLINE __m256 lane_mask(int c) /* lanes 0..c-1 set, c in 0..8 */
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c), idx));
}

/* A dot's columns past its last whole 16: nf whole vectors (0 or 1), then one of c lanes (mask m,
 * c = 0 for none). Worked out once per dot_rows call: every row has the same length. */
typedef struct {
    int nf, c;
    __m256 m;
} dot_tail;

INLINE dot_tail dot_tail_of(int rem)
{
    dot_tail t = {rem / 8, rem % 8, lane_mask(rem % 8)};
    return t;
}

/* Adds w[0..rem) x[0..rem) (rem < 16, as t gives it) to lanes 0..rem-1 of r[0..1], lanes past the
 * end untouched. The last vector is read by a masked load (lanes past the end read as zeros, never
 * touched in memory) and blended in; a whole vector goes straight in. Unrolled with constant
 * indices so that r stays in registers (rolled, gcc kept a dot's sums on the stack:
 * bench/results/engine.md, nineteenth session). */
INLINE void tail_fma(const float *w, const float *x, dot_tail t, __m256 *r)
{
    UNROLL
    for (int k = 0; k < 2; k++) {
        if (k < t.nf) {
            r[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 8 * k), _mm256_loadu_ps(x + 8 * k), r[k]);
        } else if (k == t.nf && t.c) {
            __m256i mi = _mm256_castps_si256(t.m);
            __m256 f = _mm256_fmadd_ps(_mm256_maskload_ps(w + 8 * k, mi), _mm256_maskload_ps(x + 8 * k, mi), r[k]);
            r[k] = _mm256_blendv_ps(r[k], f, t.m);
        }
    }
}

/* A dot's 16 partial sums in r[0] (lanes 0-7) and r[1] (8-15), and the tree's step h = 8: the 8
 * sums that kern_dot8.inc finishes. */
INLINE __m256 dot_v8(const float *a, const float *b, int n)
{
    __m256 r[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        r[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), r[0]);
        r[1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), r[1]);
    }
    if (i < n)
        tail_fma(a + i, b + i, dot_tail_of(n - i), r);
    return _mm256_add_ps(r[0], r[1]); /* h = 8 */
}

/* dot_v8 of a against eight rows of x (ldx apart), four rows at a time: eight FMA chains, as many
 * as two FMA units of four cycles' latency keep busy, and each vector of a loaded once for four
 * rows. */
INLINE void dot_v8_run(const float *a, const float *x, size_t ldx, int n, __m256 *v)
{
    int i0 = n / 16 * 16;
    dot_tail t = dot_tail_of(n - i0);
    for (int j = 0; j < 8; j += 4) {
        const float *xj = x + (size_t)j * ldx;
        __m256 r[4][2];
        UNROLL
        for (int b = 0; b < 4; b++)
            r[b][0] = r[b][1] = _mm256_setzero_ps();
        for (int i = 0; i < i0; i += 16) {
            __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
            UNROLL
            for (int b = 0; b < 4; b++) {
                r[b][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(xj + (size_t)b * ldx + i), r[b][0]);
                r[b][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(xj + (size_t)b * ldx + i + 8), r[b][1]);
            }
        }
        if (i0 < n)
            UNROLL
            for (int b = 0; b < 4; b++)
                tail_fma(a + i0, xj + (size_t)b * ldx + i0, t, r[b]);
        UNROLL
        for (int b = 0; b < 4; b++)
            v[j + b] = _mm256_add_ps(r[b][0], r[b][1]); /* h = 8 */
    }
}

#include "kernels/kern_dot8.inc"

/* ---- plain formats: 8 elements per load ---- */

INLINE __m256 ld_plain(int fmt, const uint8_t *row, int i, __m256 s256)
{
    switch (fmt) {
    case WF_F32:
        return _mm256_loadu_ps((const float *)row + i);
    case WF_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i))), 16));
    case WF_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i)));
    case WF_INT8G32: /* q * scale: the decoder's one rounding multiply (exact: see dtype.h) */
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i)))),
                             s256);
    default: {
        __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + (size_t)i)));
        __m128i m7 = _mm_and_si128(h, _mm_set1_epi16(0x7F));
        __m128i bits = _mm_or_si128(_mm_slli_epi16(m7, 7), _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
        __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(bits), s256);
        __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(m7, _mm_set1_epi16(0x7F)));
        return _mm256_blendv_ps(f, _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
    }
    }
}

INLINE __m256 fp8_s256(const kmat *w, int r, int i)
{
    float sc;
    memcpy(&sc, w->scale + (size_t)(r / 128) * w->scale_stride + 4 * (size_t)(i / 128), 4);
    return _mm256_set1_ps(sc * 256.0f);
}

/* The multiplier ld_plain takes for the 8 columns from i of row r: FP8's tile scale (x 256),
 * INT8's group scale, 1 for the float formats. */
INLINE __m256 plain_scale(int fmt, const kmat *w, int r, int i)
{
    if (fmt == WF_FP8B128)
        return fp8_s256(w, r, i);
    return _mm256_set1_ps(fmt == WF_INT8G32 ? kmat_group_scale(w, r, i / 32) : 1.0f);
}

/* ---- the matmul driver's vectors (kern_matmul.inc): an output's 16 partial sums in two ymm ---- */

#define ISA_VEC __m256
#define ISA_LANES 8
INLINE __m256 vzero(void) { return _mm256_setzero_ps(); }
INLINE __m256 vload(const float *p) { return _mm256_loadu_ps(p); }
/* lanes past n are not read (vmaskmovps does not fault on them) and come out -0 */
INLINE __m256 vload_n(const float *p, int n)
{
    __m256 m = lane_mask(n);
    return _mm256_or_ps(_mm256_maskload_ps(p, _mm256_castps_si256(m)), _mm256_andnot_ps(m, _mm256_set1_ps(-0.0f)));
}
INLINE void vstore(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
INLINE __m256 vfma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }

/* the seq16 tree over lanes 0-7 (r[0]) and 8-15 (r[1]): h = 8, 4, 2, 1 */
INLINE float reduce16(const __m256 *r)
{
    __m256 a = _mm256_add_ps(r[0], r[1]);                                               /* h = 8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));      /* h = 4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                      /* h = 2 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                       /* h = 1 */
    return _mm_cvtss_f32(d);
}

/* reduce16 of eight outputs at once, r[2j] and r[2j + 1] output j's, into out[0..7]: the step
 * h = 8, then kern_dot8.inc's transposed finish, the same adds */
INLINE void reduce16_x8(const __m256 *r, float *out)
{
    __m256 v[8];
    UNROLL
    for (int j = 0; j < 8; j++)
        v[j] = _mm256_add_ps(r[2 * j], r[2 * j + 1]);
    dot8_finish(v, out);
}

/* ---- 4-bit formats in nibble lane order ---- */

/* a 32-column group's even columns, then its odd ones: shufps picks evens (or odds) of two
 * vectors per 128-bit half, vpermpd puts the halves in order */
static void permute_nib(const float *x, int n, float *xp)
{
    for (int i = 0; i < n; i += 32) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
#define NIB_HALF(u, v, sel) \
    _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(u, v, sel)), 0xD8))
        _mm256_storeu_ps(xp + i, NIB_HALF(a, b, 0x88));      /* columns 0, 2, .., 14 */
        _mm256_storeu_ps(xp + i + 8, NIB_HALF(c, d, 0x88));  /* 16, .., 30 */
        _mm256_storeu_ps(xp + i + 16, NIB_HALF(a, b, 0xDD)); /* 1, 3, .., 15 */
        _mm256_storeu_ps(xp + i + 24, NIB_HALF(c, d, 0xDD)); /* 17, .., 31 */
#undef NIB_HALF
    }
}

INLINE __m256 nib_sel(__m256i idx, __m256 tlo, __m256 thi)
{
    __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* code bit 3 -> sign bit */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, idx), _mm256_permutevar8x32_ps(thi, idx), sel);
}

/* MXFP4 codes are sign-magnitude (code c + 8 is -(code c), -0 included, at every scale), so one
 * 8-entry table of magnitudes and code bit 3 xor-ed in as the sign give the table's bits with one
 * vpermps and no blend: on Intel cores vblendvps is 3 uops and vpermps has one port; on the Xeon
 * host of 2026-12-01 this took AVX2 MXFP4 from 10-14 to 17-19 GFLOPS on one core with the rows in
 * L2 (a NaN may come out with the other sign: kern.h leaves which NaN out of the contract). */
INLINE __m256 nib_sel_sm(__m256i idx, __m256 tmag)
{
    __m256i sgn = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(tmag, idx), _mm256_castsi256_ps(sgn));
}

INLINE void nib_tables(int fmt, const uint8_t *srow, int g, __m256 *tlo, __m256 *thi)
{
    if (fmt == WF_MXFP4) {
        *tlo = _mm256_load_ps(mx_tab[srow[g]]);
        *thi = _mm256_load_ps(mx_tab[srow[g]] + 8);
        return;
    }
    __m256 s = _mm256_set1_ps(bf16_to_f32((uint16_t)(srow[2 * g] | (srow[2 * g + 1] << 8))));
    *tlo = _mm256_mul_ps(_mm256_loadu_ps(lut_int4), s);
    *thi = _mm256_mul_ps(_mm256_loadu_ps(lut_int4 + 8), s);
}

/* the 32 values of column group g in lane order: v[0..1] even columns, v[2..3] odd */
INLINE void nib_group(int fmt, const uint8_t *row, const uint8_t *srow, int g, __m256 *v)
{
    __m256 tlo, thi;
    nib_tables(fmt, srow, g, &tlo, &thi);
    const uint8_t *p = row + 16 * (size_t)g;
    __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    if (fmt == WF_MXFP4) {
        v[0] = nib_sel_sm(c0, tlo);
        v[1] = nib_sel_sm(c1, tlo);
        v[2] = nib_sel_sm(_mm256_srli_epi32(c0, 4), tlo);
        v[3] = nib_sel_sm(_mm256_srli_epi32(c1, 4), tlo);
        return;
    }
    v[0] = nib_sel(c0, tlo, thi);
    v[1] = nib_sel(c1, tlo, thi);
    v[2] = nib_sel(_mm256_srli_epi32(c0, 4), tlo, thi);
    v[3] = nib_sel(_mm256_srli_epi32(c1, 4), tlo, thi);
}

/* the T > 1 register tile, one ymm of each output's two at a time: 4 rows x 3 tokens = 12
 * accumulators and four weight vectors, the 16 ymm (activations come as FMA memory operands).
 * In an L1-resident loop on the Zen host of 2026-12-02 it ran 57-73 GFLOPS against 45-51 for
 * 2 x 6 (14 loads per 12 FMAs) of an FMA peak near 90. */
#define TILE_MR 4
#define TILE_NR 3
/* Its block: 8 rows of 512 columns (16 KB, as 16 x 256) halve the tiles' loads and stores of
 * their sums per FMA, and rows 2080 bytes apart keep a tile's four weight loads off one L1 bank;
 * with the prefetch cursor's division gone, bench_gemv's 3584 x 3072 BF16 at T = 16 went from
 * 0.39-0.43 to 0.46-0.54 of the FMA peak on one core of the Zen host of 2026-12-03
 * (bench/results/matmul-avx2-block8x512-2026-12-03.log). */
#define BLK_RB 8
#define BLK_KC 512
#define BLK_PAD 8

/* T <= 6 fuses decode and FMA: 4 rows x 1 token, 2 x 2, then one row x 3 to 6 tokens, each output
 * two ymm (8 to 12 accumulators of the 16 ymm). Each is at least eight independent FMA chains, as
 * T = 1's four rows, and the weights stream once for all T tokens. At 5 tokens this is 8-19%
 * faster than the blocked path, at 6 within noise (bench/results/engine.md, 2026-12-03 night); 7
 * and 8 would need 14 and 16 accumulators. */
#define FUSED_NT 6
#define FUSED_RT(NT) ((NT) >= 3 ? 1 : (NT) == 2 ? 2 : 4)
/* dot_rows beat the matmul for F32 rows of up to 64 at any T, of 128 at T <= 2 and of 512 at
 * T = 1 (keys in L2, 256 rows, a throwaway harness; bench/results/engine.md) */
#define ISA_DOTS(T, n) ((n) <= 64 || ((n) <= 128 && (T) <= 2) || ((n) <= 1024 && (T) == 1))
#include "kernels/kern_matmul.inc"

static void avx2_axpy(float *y, const float *x, float a, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

/* 8 NV columns of RB outputs in RB x NV ymm across all n rows (RB NV <= 8) */
INLINE void axpy_rows_blk(float *y, size_t ldy, const float *a, size_t lda, const int RB, const int NV,
                          const float *x, size_t ldx, int n)
{
    __m256 acc[2][8], va[2];
    UNROLL
    for (int q = 0; q < RB; q++) {
        UNROLL
        for (int k = 0; k < NV; k++)
            acc[q][k] = _mm256_loadu_ps(y + q * ldy + 8 * k);
    }
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * ldx;
        UNROLL
        for (int q = 0; q < RB; q++)
            va[q] = _mm256_set1_ps(a[q * lda + s]);
        UNROLL
        for (int k = 0; k < NV; k++) {
            __m256 xv = _mm256_loadu_ps(xs + 8 * k);
            if (RB > 1) /* one load for both: gcc would fold it into each FMA as a memory operand */
                __asm__("" : "+v"(xv));
            UNROLL
            for (int q = 0; q < RB; q++)
                acc[q][k] = _mm256_fmadd_ps(va[q], xv, acc[q][k]);
        }
    }
    UNROLL
    for (int q = 0; q < RB; q++) {
        UNROLL
        for (int k = 0; k < NV; k++)
            _mm256_storeu_ps(y + q * ldy + 8 * k, acc[q][k]);
    }
}

/* Two outputs at a time, 32 columns in eight ymm, and a lone output 64 columns at a time: eight FMA
 * chains either way, and a pair takes two FMAs for each load of x (1.3-1.6x a pair at 64 to 512
 * columns, bench/results/engine.md). (A row-by-row axpy stores and reloads y for every row: 10% of
 * a Qwen3-0.6B prompt went to attention's axpys.) The last columns go as axpys. */
static void avx2_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx,
                           int n, int len)
{
    for (int j = 0; j < ny;) {
        int rb = ny - j >= 2 ? 2 : 1, w = rb == 2 ? 32 : 64, i = 0;
        float *yj = y + (size_t)j * ldy;
        const float *aj = a + (size_t)j * lda;
        for (; i + w <= len; i += w)
            if (rb == 2)
                axpy_rows_blk(yj + i, ldy, aj, lda, 2, 4, x + i, ldx, n);
            else
                axpy_rows_blk(yj + i, ldy, aj, lda, 1, 8, x + i, ldx, n);
        for (int q = 0; q < rb && i < len; q++)
            for (int s = 0; s < n; s++)
                avx2_axpy(yj + q * ldy + i, x + (size_t)s * ldx + i, aj[q * lda + s], len - i);
        j += rb;
    }
}

static void avx2_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                          float beta, float *o, float *u)
{
    if (d % 8) {
        kern_scalar_kda_step(S, d, k, v, q, alpha, beta, o, u);
        return;
    }
    for (int c = 0; c < d; c += 8)
        _mm256_storeu_ps(u + c, _mm256_setzero_ps());
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        __m256 a = _mm256_set1_ps(alpha[r]), kr = _mm256_set1_ps(k[r]);
        for (int c = 0; c < d; c += 8) {
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(Sr + c), a);
            _mm256_storeu_ps(Sr + c, s);
            _mm256_storeu_ps(u + c, _mm256_fmadd_ps(s, kr, _mm256_loadu_ps(u + c)));
        }
    }
    __m256 b = _mm256_set1_ps(beta);
    for (int c = 0; c < d; c += 8) {
        _mm256_storeu_ps(u + c, _mm256_mul_ps(b, _mm256_sub_ps(_mm256_loadu_ps(v + c), _mm256_loadu_ps(u + c))));
        _mm256_storeu_ps(o + c, _mm256_setzero_ps());
    }
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        __m256 kr = _mm256_set1_ps(k[r]), qr = _mm256_set1_ps(q[r]);
        for (int c = 0; c < d; c += 8) {
            __m256 s = _mm256_fmadd_ps(kr, _mm256_loadu_ps(u + c), _mm256_loadu_ps(Sr + c));
            _mm256_storeu_ps(Sr + c, s);
            _mm256_storeu_ps(o + c, _mm256_fmadd_ps(s, qr, _mm256_loadu_ps(o + c)));
        }
    }
}

/* the GLU activation (kern_vmath.inc) */
#define VF __m256
#define VI __m256i
#define VLANES 8
#define VSET _mm256_set1_ps
#define VSETI _mm256_set1_epi32
#define VLOAD _mm256_loadu_ps
#define VSTOREF _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMIN _mm256_min_ps
#define VMAX _mm256_max_ps
#define VCVTT _mm256_cvttps_epi32
#define VSRAI1(i) _mm256_srai_epi32(i, 1)
#define VSLLI23(i) _mm256_slli_epi32(i, 23)
#define VADDI _mm256_add_epi32
#define VSUBI _mm256_sub_epi32
#define VANDI _mm256_and_si256
#define VORI _mm256_or_si256
#define VXORI _mm256_xor_si256
#define VASI _mm256_castps_si256
#define VASF _mm256_castsi256_ps
#define VSEL_LT(a, b, yes, no) _mm256_blendv_ps(no, yes, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define VSEL_NAN(x, yes, no) _mm256_blendv_ps(no, yes, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#include "kernels/kern_vmath.inc"

static const kern_ops ops = {
    .name = "avx2",
    .matmul = isa_matmul,
    .dot = isa_dot,
    .dot_rows = isa_dot_rows,
    .decode_rows = isa_decode_rows,
    .axpy = avx2_axpy,
    .axpy_rows = avx2_axpy_rows,
    .kda_step = avx2_kda_step,
    .glu = isa_glu,
    .exp_sub = isa_exp_sub,
    .softmax_rows = isa_softmax_rows,
};

const kern_ops *kern_avx2(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &ops; /* every AVX2 CPU has F16C */
    return NULL;
}
#else
const kern_ops *kern_avx2(void) { return NULL; }
#endif
