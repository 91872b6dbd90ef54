/* kern_avx512.c — AVX-512 (F, BW, VL, DQ) kernels, bit-identical to kern_scalar.c.
 *
 * The 64 seq64 partial sums live in four zmm registers z0..z3 (lanes 0-15, 16-31, 32-47,
 * 48-63); element i of a row goes to lane i % 64, accumulated with one FMA in row order, and
 * reduce4 is the kern.h tree step by step. A tail shorter than 64 is decoded with the exact
 * scalar decoder into a zero-padded block and added with masked FMAs, so lanes past the end
 * are left untouched (not even +0 is added: that could flip the sign of a zero).
 *
 * Decoding a block to floats is exact for every format, so the matrix kernel for T = 1 fuses
 * decode and FMA, and for T > 1 decodes a row once into scratch and runs seq64 per token: the
 * bits are the same either way.
 *
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; called only after
 * kern_select has checked the CPU.
 */
#include "kernels/kern.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#include <immintrin.h>
#include <math.h>

static inline float reduce4(__m512 z0, __m512 z1, __m512 z2, __m512 z3)
{
    z0 = _mm512_add_ps(z0, z2); /* h = 32 */
    z1 = _mm512_add_ps(z1, z3);
    z0 = _mm512_add_ps(z0, z1); /* h = 16 */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(z0), _mm512_extractf32x8_ps(z0, 1)); /* h = 8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));       /* h = 4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                       /* h = 2 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                        /* h = 1 */
    return _mm_cvtss_f32(d);
}

/* Adds the tail w[0..rem) x[0..rem) (rem < 64, w already decoded) to the lanes 0..rem-1. */
static inline void tail_fma(const float *w, const float *x, int rem, __m512 *z)
{
    for (int k = 0; k < 4 && rem > 16 * k; k++) {
        int c = rem - 16 * k;
        __mmask16 m = c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << c) - 1);
        __m512 vw = _mm512_maskz_loadu_ps(m, w + 16 * k);
        __m512 vx = _mm512_maskz_loadu_ps(m, x + 16 * k);
        z[k] = _mm512_mask3_fmadd_ps(vw, vx, z[k], m);
    }
}

static float avx512_dot(const float *a, const float *b, int n)
{
    __m512 z[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; k++)
            z[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * k), _mm512_loadu_ps(b + i + 16 * k), z[k]);
    if (i < n)
        tail_fma(a + i, b + i, n - i, z);
    return reduce4(z[0], z[1], z[2], z[3]);
}

/* ---- per-format decoders of 16 (plain, fp8) or 32 (4-bit) elements ---- */

static inline __m512 ld_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }
static inline __m512 ld_bf16(const uint8_t *p)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline __m512 ld_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* fp8 e4m3 -> f16 bit pattern (same mantissa, exponent bias 7 vs 15, so value/256), then one
 * rounding multiply by 256*scale == the scalar e4m3 * scale. NaN codes are patched in. */
static inline __m512 ld_fp8(const uint8_t *p, __m512 s256)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m256i h = _mm256_cvtepu8_epi16(v);
    __m256i mag = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7);
    __m256i sgn = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
    __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(mag, sgn)), s256);
    __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(v, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
}

/* 32 4-bit codes (16 bytes, element 2j in the low nibble of byte j) -> two zmm of values
 * table[code]; vpermps only looks at the low 4 bits of each index. */
static inline void ld_nib32(const uint8_t *p, __m512 table, __m512 *w0, __m512 *w1)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i hi = _mm_srli_epi16(v, 4);
    *w0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, hi)), table);
    *w1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(v, hi)), table);
}

static const float lut_int4[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

static inline float group_scale(const kmat *w, const uint8_t *srow, int g)
{
    if (w->fmt == WF_MXFP4)
        return e8m0_to_f32(srow[g]);
    return bf16_to_f32((uint16_t)(srow[2 * g] | (srow[2 * g + 1] << 8)));
}

/* Decodes elements [i, i+64) of row r into four zmm (i is a multiple of 64, i+64 <= cols). */
static inline void decode64(const kmat *w, const uint8_t *row, const uint8_t *srow, int i, __m512 *v)
{
    switch (w->fmt) {
    case WF_F32:
        for (int k = 0; k < 4; k++)
            v[k] = ld_f32(row + 4 * (size_t)(i + 16 * k));
        break;
    case WF_BF16:
        for (int k = 0; k < 4; k++)
            v[k] = ld_bf16(row + 2 * (size_t)(i + 16 * k));
        break;
    case WF_F16:
        for (int k = 0; k < 4; k++)
            v[k] = ld_f16(row + 2 * (size_t)(i + 16 * k));
        break;
    case WF_FP8B128: {
        float sc;
        memcpy(&sc, srow + 4 * (size_t)(i / 128), 4);
        __m512 s256 = _mm512_set1_ps(sc * 256.0f);
        for (int k = 0; k < 4; k++)
            v[k] = ld_fp8(row + (size_t)(i + 16 * k), s256);
        break;
    }
    default: { /* MXFP4, INT4: two 32-element groups */
        __m512 lut = _mm512_loadu_ps(w->fmt == WF_MXFP4 ? e2m1_table : lut_int4);
        for (int g = 0; g < 2; g++) {
            __m512 t = _mm512_mul_ps(lut, _mm512_set1_ps(group_scale(w, srow, i / 32 + g)));
            ld_nib32(row + (size_t)(i + 32 * g) / 2, t, &v[2 * g], &v[2 * g + 1]);
        }
    }
    }
}

static inline const uint8_t *scale_row(const kmat *w, int r)
{
    if (!w->scale)
        return NULL;
    return w->scale + (size_t)(w->fmt == WF_FP8B128 ? r / 128 : r) * w->scale_stride;
}

static float row_dot(const kmat *w, int r, const float *x)
{
    const uint8_t *row = w->data + (size_t)r * w->row_bytes, *srow = scale_row(w, r);
    __m512 z[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int n = w->cols, i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 v[4];
        decode64(w, row, srow, i, v);
        for (int k = 0; k < 4; k++)
            z[k] = _mm512_fmadd_ps(v[k], _mm512_loadu_ps(x + i + 16 * k), z[k]);
    }
    if (i < n) { /* tail: exact scalar decode into a zero-padded block, masked FMAs */
        float tw[64], tx[64];
        wfmt_table[w->fmt].decode(w, r, i, n, tw);
        memcpy(tx, x + i, (size_t)(n - i) * 4);
        tail_fma(tw, tx, n - i, z);
    }
    return reduce4(z[0], z[1], z[2], z[3]);
}

static void avx512_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    int n = w->cols;
    for (int r = r0; r < r1; r++) {
        float *o = out + (size_t)(r - r0) * (size_t)n;
        const uint8_t *row = w->data + (size_t)r * w->row_bytes, *srow = scale_row(w, r);
        int i = 0;
        for (; i + 64 <= n; i += 64) {
            __m512 v[4];
            decode64(w, row, srow, i, v);
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(o + i + 16 * k, v[k]);
        }
        if (i < n)
            wfmt_table[w->fmt].decode(w, r, i, n, o + i);
    }
}

static void avx512_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                          float *scratch)
{
    if (T == 1) {
        for (int r = r0; r < r1; r++)
            y[r - r0] = row_dot(w, r, x);
        return;
    }
    for (int r = r0; r < r1; r++) {
        avx512_decode_rows(w, r, r + 1, scratch);
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + (size_t)(r - r0)] = avx512_dot(scratch, x + (size_t)t * ldx, w->cols);
    }
}

static const kern_ops ops = {"avx512", avx512_matmul, avx512_dot, avx512_decode_rows};

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
