/* kern_avx512.c — AVX-512 (F, BW, VL, DQ) kernels, bit-identical to kern_scalar.c.
 *
 * An output's 16 partial sums (kern.h's seq16), a dot's or a matrix row's, live in one zmm;
 * dot_v8 with kern_dot8.inc, dot_rows8 (eight dots, their trees transposed) and reduce16 are the
 * kern.h tree step by step. A dot's tail shorter than 16 is added with a masked FMA, so lanes past
 * the end are left untouched.
 *
 * T = 1 (decode) runs fused decode + FMA, four rows at a time (four FMA chains, one activation
 * load for four FMAs), long rows in passes of kern_matmul.inc's span so the activations stay in
 * L1. 4-bit formats use the nibble lane order of kern.h: a 32-column group's even columns (low
 * nibbles) and then its odd columns (high nibbles) go to the same zmm of sums, so one
 * zero-extension and one shift index a 16-entry table, with the activations permuted to match
 * once per call. MXFP4 tables (E2M1 x 2^(s-127)) are precomputed for all 256 scale bytes.
 * T <= 6 (verify passes) fuses decode and FMA for every token in 4-row x T-token register tiles;
 * T > 6 decodes a block of rows once into scratch (exactly, in lane order) and reduces it in
 * 4-row x 6-token register tiles (kern_matmul.inc): the same bits as T = 1.
 *
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; called only after
 * kern_select has checked the CPU.
 */
#include "kernels/kern.h"
#include "kernels/kmath.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#define INLINE static inline __attribute__((always_inline))

static float mx_tab[256][16] __attribute__((aligned(64))); /* e2m1[c] * e8m0[s] */
static const float lut_int4[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_init(void)
{
    for (int s = 0; s < 256; s++)
        for (int c = 0; c < 16; c++)
            mx_tab[s][c] = e2m1_table[c] * e8m0_to_f32((uint8_t)s);
}

/* The lanes of a dot's last vector that a tail of rem < 16 columns reaches (none past the end) */
INLINE __mmask16 tail_mask(int rem) { return (__mmask16)((1u << rem) - 1); }

/* A dot's 16 partial sums in one zmm, and the tree's step h = 8: the 8 sums that kern_dot8.inc
 * finishes. The tail goes in by a masked FMA, so lanes past the end are left untouched. */
INLINE __m256 dot_v8(const float *a, const float *b, int n)
{
    __m512 z = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        z = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), z);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        z = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), z, m);
    }
    return _mm256_add_ps(_mm512_castps512_ps256(z), _mm512_extractf32x8_ps(z, 1)); /* h = 8 */
}

/* Eight dots of a against rows of x (ldx apart) at once: eight FMA chains, as many as two FMA
 * units of four cycles' latency keep busy, each vector of a loaded once for the eight. v[j]: dot
 * j's 16 sums. */
INLINE void dot_v16_run(const float *a, const float *x, size_t ldx, int n, __m512 *v)
{
    int i0 = n / 16 * 16;
    _Pragma("GCC unroll 8") for (int b = 0; b < 8; b++) v[b] = _mm512_setzero_ps();
    for (int i = 0; i < i0; i += 16) {
        __m512 va = _mm512_loadu_ps(a + i);
        _Pragma("GCC unroll 8") for (int b = 0; b < 8; b++) v[b] =
            _mm512_fmadd_ps(va, _mm512_loadu_ps(x + (size_t)b * ldx + i), v[b]);
    }
    if (i0 < n) {
        __mmask16 m = tail_mask(n - i0);
        __m512 va = _mm512_maskz_loadu_ps(m, a + i0);
        _Pragma("GCC unroll 8") for (int b = 0; b < 8; b++) v[b] =
            _mm512_mask3_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + (size_t)b * ldx + i0), v[b], m);
    }
}

/* The tree's steps h = 8, 4, 2 and 1 for eight dots at once, v[j] dot j's 16 sums: the vectors
 * are transposed as they are added (kern_dot8.inc's way, in zmm: 26 instructions for the eight
 * where eight h = 8 steps and dot8_finish took 38), and every add has the lone dot's two
 * operands, so the bits are its own. */
INLINE void dot16_finish8(const __m512 *v, float *out)
{
    __m512 b[4], c[2];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) /* h = 8: [dot 2j's 8 | dot 2j+1's 8] */
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) /* h = 4: 128-bit lane q holds dot 4j + q's 4 */
        c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
    /* h = 2: lane q [dot q's 2 | dot 4 + q's 2]; h = 1: lane q [dot q, dot 4 + q, (the same)] */
    __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));
    __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d, d, 0x88), _mm512_shuffle_ps(d, d, 0xDD));
    __m512 o = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), e);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(o));
}

/* kern_dot8.inc's dot_rows, eight rows at a time */
#define ISA_DOT_ROWS8 1
INLINE void dot_rows8(const float *a, const float *x, size_t ldx, int n, float *out)
{
    __m512 v[8];
    dot_v16_run(a, x, ldx, n, v);
    dot16_finish8(v, out);
}

#include "kernels/kern_dot8.inc"

/* ---- plain formats: 16 elements per load ---- */

INLINE __m512 ld_plain(int fmt, const uint8_t *row, int i, __m512 s256)
{
    switch (fmt) {
    case WF_F32:
        return _mm512_loadu_ps((const float *)row + i);
    case WF_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)i))), 16));
    case WF_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)i)));
    case WF_INT8G32: /* q * scale: the decoder's one rounding multiply (exact: see dtype.h) */
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i)))),
                             s256);
    default: { /* FP8 e4m3 -> f16 bits (value / 256), one rounding multiply by 256*scale; NaN patched */
        __m128i v = _mm_loadu_si128((const __m128i *)(row + (size_t)i));
        __m256i h = _mm256_cvtepu8_epi16(v);
        __m256i mag = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7);
        __m256i sgn = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
        __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(mag, sgn)), s256);
        __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(v, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
        return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
    }
    }
}

INLINE __m512 fp8_s256(const kmat *w, int r, int i)
{
    float sc;
    memcpy(&sc, w->scale + (size_t)(r / 128) * w->scale_stride + 4 * (size_t)(i / 128), 4);
    return _mm512_set1_ps(sc * 256.0f);
}

/* The multiplier ld_plain takes for the 16 columns from i of row r: FP8's tile scale (x 256),
 * INT8's group scale, 1 for the float formats. */
INLINE __m512 plain_scale(int fmt, const kmat *w, int r, int i)
{
    if (fmt == WF_FP8B128)
        return fp8_s256(w, r, i);
    return _mm512_set1_ps(fmt == WF_INT8G32 ? kmat_group_scale(w, r, i / 32) : 1.0f);
}

/* ---- the matmul driver's vectors (kern_matmul.inc): one zmm holds an output's 16 partial sums ---- */

#define ISA_VEC __m512
#define ISA_LANES 16
INLINE __m512 vzero(void) { return _mm512_setzero_ps(); }
INLINE __m512 vload(const float *p) { return _mm512_loadu_ps(p); }
/* lanes past n are not read and come out -0 */
INLINE __m512 vload_n(const float *p, int n)
{
    return _mm512_mask_loadu_ps(_mm512_set1_ps(-0.0f), (__mmask16)((1u << n) - 1), p);
}
INLINE void vstore(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
INLINE __m512 vfma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }

/* the seq16 tree: h = 8, 4, 2, 1 */
INLINE float reduce16(const __m512 *z)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(z[0]), _mm512_extractf32x8_ps(z[0], 1)); /* h = 8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));          /* h = 4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                          /* h = 2 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                           /* h = 1 */
    return _mm_cvtss_f32(d);
}

/* reduce16 of eight outputs at once, z[j] output j's sums, into out[0..7]: dot_rows' transposed
 * finish, the same adds */
INLINE void reduce16_x8(const __m512 *z, float *out) { dot16_finish8(z, out); }

/* ---- 4-bit formats in nibble lane order ---- */

/* xp = x with every 32-column group reordered to [even columns, odd columns] */
static void permute_nib(const float *x, int n, float *xp)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int i = 0; i < n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        _mm512_storeu_ps(xp + i, _mm512_permutex2var_ps(a, ev, b));
        _mm512_storeu_ps(xp + i + 16, _mm512_permutex2var_ps(a, od, b));
    }
}

INLINE __m512 nib_table(int fmt, const uint8_t *srow, int g)
{
    if (fmt == WF_MXFP4)
        return _mm512_load_ps(mx_tab[srow[g]]);
    float s = bf16_to_f32((uint16_t)(srow[2 * g] | (srow[2 * g + 1] << 8)));
    return _mm512_mul_ps(_mm512_loadu_ps(lut_int4), _mm512_set1_ps(s));
}

/* Column group g of a 4-bit row (its 16 bytes at row + 16 g, its scale in srow) in lane order:
 * v[0] the even columns (low nibbles: vpermps reads bits 0-3), v[1] the odd ones. */
INLINE void nib_group(int fmt, const uint8_t *row, const uint8_t *srow, int g, __m512 *v)
{
    __m512 tab = nib_table(fmt, srow, g);
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * (size_t)g)));
    v[0] = _mm512_permutexvar_ps(c, tab);
    v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), tab);
}

/* half h of nib_group: the even columns (0) or the odd ones (1) */
INLINE __m512 nib_half(int fmt, const uint8_t *row, const uint8_t *srow, int g, int h)
{
    __m512 tab = nib_table(fmt, srow, g);
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * (size_t)g)));
    return _mm512_permutexvar_ps(h ? _mm512_srli_epi32(c, 4) : c, tab);
}

/* the T > 1 register tile: 4 rows x 6 tokens = 24 accumulators, 4 weight vectors, 1 activation;
 * small groups' tiles decode their weights in registers (kern_matmul.inc's tile_src), the 4-bit
 * formats' 5 tokens at a time: at 6 the decode's table and indices no longer fit beside the sums
 * (MXFP4, T = 12 in two tiles of 6: 0.60 of the FMA peak; T = 10 in two of 5: 0.68) */
#define TILE_MR 4
#define TILE_NR 6
#define TILE_DIRECT 1
#define TILE_NR_NIB 5

/* ---- the GLU activation (kern_vmath.inc) ---- */

#define VF __m512
#define VI __m512i
#define VLANES 16
#define VSET _mm512_set1_ps
#define VSETI _mm512_set1_epi32
#define VLOAD _mm512_loadu_ps
#define VSTOREF _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMIN _mm512_min_ps
#define VMAX _mm512_max_ps
#define VCVTT _mm512_cvttps_epi32
#define VSRAI1(i) _mm512_srai_epi32(i, 1)
#define VSLLI23(i) _mm512_slli_epi32(i, 23)
#define VADDI _mm512_add_epi32
#define VSUBI _mm512_sub_epi32
#define VANDI _mm512_and_si512
#define VORI _mm512_or_si512
#define VXORI _mm512_xor_si512
#define VASI _mm512_castps_si512
#define VASF _mm512_castsi512_ps
#define VSEL_LT(a, b, yes, no) _mm512_mask_mov_ps(no, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), yes)
#define VSEL_NAN(x, yes, no) _mm512_mask_mov_ps(no, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), yes)
#include "kernels/kern_vmath.inc"

/* ---- entry points ---- */

/* T <= 6 fuses decode and FMA for every token: 4 rows x up to 6 tokens = 24 accumulators, one
 * weight vector and one activation live beside them. A verify pass of 5 or 6 tokens then reads
 * its weights at close to T = 1's rate where the blocked path decoded them into scratch first
 * (bench/results/engine.md, 2026-12-03 on Zen 5); 7 or 8 tokens need 28-32 accumulators, which
 * the 32 zmm cannot hold beside them, and 3 rows x 8 was slower than the blocked path. */
#define FUSED_NT 6
/* dot_rows beat the matmul for F32 rows of 32 at any T, of 64 in the fused path's T <= 6, of 128
 * at T <= 2 and of 512 at T = 1 (keys in L2, 256 rows, a throwaway harness;
 * bench/results/engine.md) */
#define ISA_DOTS(T, n) \
    ((n) <= 32 || ((n) <= 64 && (T) <= FUSED_NT) || ((n) <= 128 && (T) <= 2) || ((n) <= 1024 && (T) == 1))
#include "kernels/kern_matmul.inc"

static void avx512_axpy(float *y, const float *x, float a, int n)
{
    __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* Columns [0, 16 NV) of RB outputs of axpy_rows (RB <= 2), the sums in RB x NV zmm across all n
 * rows; `last` masks the last vector's columns (lanes past it are loaded as zeros and never
 * stored) */
INLINE void axpy_rows_nv(float *y, size_t ldy, const float *a, size_t lda, const int RB, const float *x, size_t ldx,
                         int n, const int NV, __mmask16 last)
{
    __m512 acc[2][8], va[2];
    _Pragma("GCC unroll 2") for (int q = 0; q < RB; q++) {
        _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) acc[q][k] =
            _mm512_maskz_loadu_ps(k == NV - 1 ? last : (__mmask16)0xFFFF, y + q * ldy + 16 * k);
    }
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * ldx;
        _Pragma("GCC unroll 2") for (int q = 0; q < RB; q++) va[q] = _mm512_set1_ps(a[q * lda + s]);
        _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) {
            __m512 xv = _mm512_maskz_loadu_ps(k == NV - 1 ? last : (__mmask16)0xFFFF, xs + 16 * k);
            if (RB > 1) /* one load for both: gcc would fold it into each FMA as a memory operand */
                __asm__("" : "+v"(xv));
            _Pragma("GCC unroll 2") for (int q = 0; q < RB; q++) acc[q][k] = _mm512_fmadd_ps(va[q], xv, acc[q][k]);
        }
    }
    _Pragma("GCC unroll 2") for (int q = 0; q < RB; q++) {
        _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++)
            _mm512_mask_storeu_ps(y + q * ldy + 16 * k, k == NV - 1 ? last : (__mmask16)0xFFFF, acc[q][k]);
    }
}

/* RB outputs' columns, 128 at a time in 8 RB zmm, and the last 1 to 127 the same way in as many zmm
 * as they fill (the bundled model's latent rows are 64 wide, and row-by-row axpys for them took 14%
 * of its 4000-token prompt) */
INLINE void axpy_rows_cols(float *y, size_t ldy, const float *a, size_t lda, const int RB, const float *x,
                           size_t ldx, int n, int len)
{
    int i = 0;
    for (; i + 128 <= len; i += 128)
        axpy_rows_nv(y + i, ldy, a, lda, RB, x + i, ldx, n, 8, (__mmask16)0xFFFF);
    int rem = len - i, nv = (rem + 15) / 16;
    __mmask16 last = rem % 16 ? (__mmask16)((1u << (rem % 16)) - 1) : (__mmask16)0xFFFF;
    switch (nv) {
    case 0:
        return;
#define AXPY_ROWS_CASE(v)                                                                                          \
    case v:                                                                                                        \
        axpy_rows_nv(y + i, ldy, a, lda, RB, x + i, ldx, n, v, last);                                              \
        return;
        AXPY_ROWS_CASE(1)
        AXPY_ROWS_CASE(2)
        AXPY_ROWS_CASE(3)
        AXPY_ROWS_CASE(4)
        AXPY_ROWS_CASE(5)
        AXPY_ROWS_CASE(6)
        AXPY_ROWS_CASE(7)
    default:
        axpy_rows_nv(y + i, ldy, a, lda, RB, x + i, ldx, n, 8, last);
#undef AXPY_ROWS_CASE
    }
}

/* Outputs two at a time: one load of x feeds two FMAs, where a lone output's FMAs wait on its loads
 * at wide rows (K3's 512-wide latent) and on four chains' latency at 64 (1.2-1.6x a pair,
 * bench/results/engine.md) */
static void avx512_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx,
                             int n, int len)
{
    int j = 0;
    for (; j + 2 <= ny; j += 2)
        axpy_rows_cols(y + (size_t)j * ldy, ldy, a + (size_t)j * lda, lda, 2, x, ldx, n, len);
    if (j < ny)
        axpy_rows_cols(y + (size_t)j * ldy, ldy, a + (size_t)j * lda, lda, 1, x, ldx, n, len);
}

static void avx512_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                            float beta, float *o, float *u)
{
    if (d % 16) { /* odd head sizes: the reference loop */
        kern_scalar_kda_step(S, d, k, v, q, alpha, beta, o, u);
        return;
    }
    for (int c = 0; c < d; c += 16)
        _mm512_storeu_ps(u + c, _mm512_setzero_ps());
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        __m512 a = _mm512_set1_ps(alpha[r]), kr = _mm512_set1_ps(k[r]);
        for (int c = 0; c < d; c += 16) {
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(Sr + c), a);
            _mm512_storeu_ps(Sr + c, s);
            _mm512_storeu_ps(u + c, _mm512_fmadd_ps(s, kr, _mm512_loadu_ps(u + c)));
        }
    }
    __m512 b = _mm512_set1_ps(beta);
    for (int c = 0; c < d; c += 16) {
        _mm512_storeu_ps(u + c, _mm512_mul_ps(b, _mm512_sub_ps(_mm512_loadu_ps(v + c), _mm512_loadu_ps(u + c))));
        _mm512_storeu_ps(o + c, _mm512_setzero_ps());
    }
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        __m512 kr = _mm512_set1_ps(k[r]), qr = _mm512_set1_ps(q[r]);
        for (int c = 0; c < d; c += 16) {
            __m512 s = _mm512_fmadd_ps(kr, _mm512_loadu_ps(u + c), _mm512_loadu_ps(Sr + c));
            _mm512_storeu_ps(Sr + c, s);
            _mm512_storeu_ps(o + c, _mm512_fmadd_ps(s, qr, _mm512_loadu_ps(o + c)));
        }
    }
}

static const kern_ops ops = {
    .name = "avx512",
    .matmul = isa_matmul,
    .dot = isa_dot,
    .dot_rows = isa_dot_rows,
    .decode_rows = isa_decode_rows,
    .axpy = avx512_axpy,
    .axpy_rows = avx512_axpy_rows,
    .kda_step = avx512_kda_step,
    .glu = isa_glu,
    .exp_sub = isa_exp_sub,
    .softmax_rows = isa_softmax_rows,
};

const kern_ops *kern_avx512(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        return &ops;
    return NULL;
}
#else
const kern_ops *kern_avx512(void) { return NULL; }
#endif
