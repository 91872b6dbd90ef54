/* kern_avx2.c — AVX2 + FMA + F16C kernels, bit-identical to kern_scalar.c.
 *
 * The 64 seq64 partial sums live in eight ymm registers (lanes 8k..8k+7 in register k);
 * element i of a row goes to lane i % 64. reduce8 is the kern.h tree step by step. Tails are
 * decoded exactly by the scalar decoder and added with blended FMAs (lanes past the end are
 * left untouched). 4-bit codes are decoded with two 8-entry vpermps tables (code bit 3 picks
 * the table), so -0 and every scale multiply match the scalar decoder's bits.
 */
#include "kernels/kern.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>

static inline float reduce8(__m256 *r)
{
    for (int k = 0; k < 4; k++) /* h = 32 */
        r[k] = _mm256_add_ps(r[k], r[k + 4]);
    r[0] = _mm256_add_ps(r[0], r[2]); /* h = 16 */
    r[1] = _mm256_add_ps(r[1], r[3]);
    r[0] = _mm256_add_ps(r[0], r[1]); /* h = 8 */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(r[0]), _mm256_extractf128_ps(r[0], 1)); /* h = 4 */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                      /* h = 2 */
    __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));                                       /* h = 1 */
    return _mm_cvtss_f32(d);
}

static inline __m256 lane_mask(int c) /* lanes 0..c-1 set, c in 1..8 */
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c), idx));
}

static inline void tail_fma(const float *w, const float *x, int rem, __m256 *r)
{
    float tw[64] = {0}, tx[64] = {0};
    memcpy(tw, w, (size_t)rem * 4);
    memcpy(tx, x, (size_t)rem * 4);
    for (int k = 0; k < 8 && rem > 8 * k; k++) {
        int c = rem - 8 * k;
        __m256 f = _mm256_fmadd_ps(_mm256_loadu_ps(tw + 8 * k), _mm256_loadu_ps(tx + 8 * k), r[k]);
        r[k] = c >= 8 ? f : _mm256_blendv_ps(r[k], f, lane_mask(c));
    }
}

static float avx2_dot(const float *a, const float *b, int n)
{
    __m256 r[8];
    for (int k = 0; k < 8; k++)
        r[k] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 8; k++)
            r[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), r[k]);
    if (i < n)
        tail_fma(a + i, b + i, n - i, r);
    return reduce8(r);
}

static inline __m256 ld_bf16(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline __m256 ld_fp8(const uint8_t *p, __m256 s256)
{
    __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i m7 = _mm_and_si128(h, _mm_set1_epi16(0x7F));
    __m128i bits = _mm_or_si128(_mm_slli_epi16(m7, 7), _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
    __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(bits), s256);
    __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(m7, _mm_set1_epi16(0x7F)));
    return _mm256_blendv_ps(f, _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
}

/* 8 code bytes (low nibble significant) -> values: lo table for codes 0-7, hi for 8-15. */
static inline __m256 nib8(__m128i codes, __m256 tlo, __m256 thi)
{
    __m256i idx = _mm256_cvtepu8_epi32(codes);
    __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* bit 3 -> sign bit */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, idx), _mm256_permutevar8x32_ps(thi, idx), sel);
}

static const float lut_int4[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

static inline float group_scale(const kmat *w, const uint8_t *srow, int g)
{
    if (w->fmt == WF_MXFP4)
        return e8m0_to_f32(srow[g]);
    return bf16_to_f32((uint16_t)(srow[2 * g] | (srow[2 * g + 1] << 8)));
}

/* Decodes elements [i, i+64) into eight ymm. */
static inline void decode64(const kmat *w, const uint8_t *row, const uint8_t *srow, int i, __m256 *v)
{
    switch (w->fmt) {
    case WF_F32:
        for (int k = 0; k < 8; k++)
            v[k] = _mm256_loadu_ps((const float *)row + i + 8 * k);
        break;
    case WF_BF16:
        for (int k = 0; k < 8; k++)
            v[k] = ld_bf16(row + 2 * (size_t)(i + 8 * k));
        break;
    case WF_F16:
        for (int k = 0; k < 8; k++)
            v[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)(i + 8 * k))));
        break;
    case WF_FP8B128: {
        float sc;
        memcpy(&sc, srow + 4 * (size_t)(i / 128), 4);
        __m256 s256 = _mm256_set1_ps(sc * 256.0f);
        for (int k = 0; k < 8; k++)
            v[k] = ld_fp8(row + (size_t)(i + 8 * k), s256);
        break;
    }
    default: {
        const float *lut = w->fmt == WF_MXFP4 ? e2m1_table : lut_int4;
        __m256 lo = _mm256_loadu_ps(lut), hi = _mm256_loadu_ps(lut + 8);
        for (int g = 0; g < 2; g++) {
            __m256 s = _mm256_set1_ps(group_scale(w, srow, i / 32 + g));
            __m256 tlo = _mm256_mul_ps(lo, s), thi = _mm256_mul_ps(hi, s);
            __m128i b = _mm_loadu_si128((const __m128i *)(row + (size_t)(i + 32 * g) / 2));
            __m128i h = _mm_srli_epi16(b, 4);
            __m128i a0 = _mm_unpacklo_epi8(b, h), a1 = _mm_unpackhi_epi8(b, h);
            v[4 * g + 0] = nib8(a0, tlo, thi);
            v[4 * g + 1] = nib8(_mm_srli_si128(a0, 8), tlo, thi);
            v[4 * g + 2] = nib8(a1, tlo, thi);
            v[4 * g + 3] = nib8(_mm_srli_si128(a1, 8), tlo, thi);
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
    __m256 acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = _mm256_setzero_ps();
    int n = w->cols, i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256 v[8];
        decode64(w, row, srow, i, v);
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(x + i + 8 * k), acc[k]);
    }
    if (i < n) {
        float tw[64];
        wfmt_table[w->fmt].decode(w, r, i, n, tw);
        tail_fma(tw, x + i, n - i, acc);
    }
    return reduce8(acc);
}

static void avx2_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    int n = w->cols;
    for (int r = r0; r < r1; r++) {
        float *o = out + (size_t)(r - r0) * (size_t)n;
        const uint8_t *row = w->data + (size_t)r * w->row_bytes, *srow = scale_row(w, r);
        int i = 0;
        for (; i + 64 <= n; i += 64) {
            __m256 v[8];
            decode64(w, row, srow, i, v);
            for (int k = 0; k < 8; k++)
                _mm256_storeu_ps(o + i + 8 * k, v[k]);
        }
        if (i < n)
            wfmt_table[w->fmt].decode(w, r, i, n, o + i);
    }
}

static void avx2_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                        float *scratch)
{
    if (T == 1) {
        for (int r = r0; r < r1; r++)
            y[r - r0] = row_dot(w, r, x);
        return;
    }
    for (int r = r0; r < r1; r++) {
        avx2_decode_rows(w, r, r + 1, scratch);
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + (size_t)(r - r0)] = avx2_dot(scratch, x + (size_t)t * ldx, w->cols);
    }
}

static const kern_ops ops = {"avx2", avx2_matmul, avx2_dot, avx2_decode_rows};

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
