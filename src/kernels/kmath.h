/* kmath.h — Deltafin's own float32 exp, tanh, sigmoid and log1p: the definition every
 * instruction set computes, so that activations and softmaxes have the same bits on every
 * machine.
 *
 * Why not libm: expf and tanhf differ between C libraries (glibc, musl, Apple's) and between
 * versions of one, so logits computed with them could differ from machine to machine although the
 * kernels (kern.h) are bit-identical everywhere; and a libm call per element cannot be vectorised
 * without changing its bits. These functions use only IEEE basic operations (+ - * / and
 * comparisons, each rounded on its own: the tree is compiled with -ffp-contract=off) and integer
 * operations on the bits, in the order written here. The SIMD tables (kern_avx512.c, kern_avx2.c)
 * evaluate exactly these operations lane by lane, and the tests compare them with memcmp.
 *
 * Accuracy against the exact value, worst case over every float32 input (measured once, and over a
 * sweep by tests/test_kernels.c's kmath_accuracy): km_expf 0.96 ulp, km_tanhf 1.44, km_sigmoidf
 * 2.48 for x > -87 (below about -88.72, where exp(-x) overflows, it returns +0 instead of a
 * subnormal), km_log1pf 2.47. Special values: exp(-inf) = +0, exp(+inf) = +inf, subnormal results
 * rounded (not flushed), tanh(+-0) = +-0, tanh(+-inf) = +-1, tanh odd to the bit, NaN in gives a
 * NaN out (which NaN is not part of the contract, as for the kernels). kmath_bits_pinned hashes
 * their bits over a sweep, on x86 and on AArch64 alike.
 *
 * The polynomial coefficients are printed by src/kernels/kmath_fit.py (Chebyshev fits rounded to
 * float32).
 */
#ifndef DF_KERNELS_KMATH_H
#define DF_KERNELS_KMATH_H

#include <math.h> /* INFINITY, NAN: no libm function is called */
#include <stdint.h>
#include <string.h>

/* The CUDA backend compiles these same functions for the GPU (with -fmad=false, so that no
 * multiply and add fuse there either): one source for every device. */
#ifdef __CUDACC__
#define KM_FN static inline __host__ __device__
#else
#define KM_FN static inline
#endif

/* exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 in two steps (KM_LN2_HI has 9
 * significant bits, so k * KM_LN2_HI is exact for |k| <= 150 and x - k * KM_LN2_HI is exact by
 * Sterbenz); exp(r) = 1 + (r + r^2 q(r)) on |r| <= ln2 / 2. x is first clamped to
 * [KM_EXP_LO, KM_EXP_HI], where the result is already 0 or inf; 2^k is applied as two factors
 * 2^(k >> 1) and 2^(k - (k >> 1)) so that each is a normal float and the result rounds once,
 * subnormals included. */
#define KM_EXP_LO (-104.0f)
#define KM_EXP_HI 89.0f
#define KM_LOG2E 0x1.715476p+0f
#define KM_ROUND 0x1.8p+23f /* (t + KM_ROUND) - KM_ROUND rounds t to an integer, |t| < 2^22 */
#define KM_LN2_HI 0x1.63p-1f
#define KM_LN2_LO (-0x1.bd0106p-13f)
#define KM_EXP_Q5 0x1.a12516p-13f
#define KM_EXP_Q4 0x1.6d434ep-10f
#define KM_EXP_Q3 0x1.1110ep-7f
#define KM_EXP_Q2 0x1.5554e8p-5f
#define KM_EXP_Q1 0x1.555556p-3f
#define KM_EXP_Q0 0x1p-1f

/* tanh(a), a = |x|: below KM_TANH_SMALL (where tanh < 1/2) a + (a z) p(z) with z = a^2; above it
 * 1 - 2 / (exp(2a) + 1), which never cancels more than one bit there. Then x's sign. */
#define KM_TANH_SMALL 0.55f
#define KM_TANH_P5 0x1.4b239ap-9f
#define KM_TANH_P4 (-0x1.17641p-7f)
#define KM_TANH_P3 0x1.657936p-6f
#define KM_TANH_P2 (-0x1.ba142ep-5f)
#define KM_TANH_P1 0x1.111104p-3f
#define KM_TANH_P0 (-0x1.555556p-2f)

/* log(u), u > 0 normal: u = m 2^e with m in [sqrt(1/2), sqrt(2)) and f = m - 1 (exact);
 * log(1 + f) = f - (f^2/2 - s (f^2/2 + R)) with s = f / (2 + f), R = z q(z), z = s^2 (the
 * identity of fdlibm's log: f is exact and the correction is small beside it), plus e ln 2 in
 * the two parts of km_expf. log1p(y) = log(u) (y / (u - 1)) with u = 1 + y (Kahan's correction
 * for the rounding of u), or y itself when u rounds to 1. */
#define KM_SQRT2 0x1.6a09e6p+0f
#define KM_LOG_Q3 0x1.ddcf72p-3f
#define KM_LOG_Q2 0x1.245c4p-2f
#define KM_LOG_Q1 0x1.9999ecp-2f
#define KM_LOG_Q0 0x1.555556p-1f

KM_FN uint32_t km_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

KM_FN float km_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

KM_FN float km_expf(float x)
{
    /* a NaN x becomes KM_EXP_LO here (as VMAX gives in kern_vmath.inc), so that no NaN reaches the
     * float-to-int conversion below, which C leaves undefined; the last line returns x */
    float xc = x > KM_EXP_HI ? KM_EXP_HI : x >= KM_EXP_LO ? x : KM_EXP_LO;
    float k = (xc * KM_LOG2E + KM_ROUND) - KM_ROUND;
    float r = xc - k * KM_LN2_HI;
    r = r - k * KM_LN2_LO;
    float q = KM_EXP_Q5;
    q = q * r + KM_EXP_Q4;
    q = q * r + KM_EXP_Q3;
    q = q * r + KM_EXP_Q2;
    q = q * r + KM_EXP_Q1;
    q = q * r + KM_EXP_Q0;
    float p = 1.0f + (r + (r * r) * q);
    int32_t ki = (int32_t)k, k1 = (ki - (ki & 1)) / 2, k2 = ki - k1; /* k1 = floor(k / 2) */
    float y = (p * km_float((uint32_t)(k1 + 127) << 23)) * km_float((uint32_t)(k2 + 127) << 23);
    return x != x ? x : y;
}

KM_FN float km_tanhf(float x)
{
    uint32_t sign = km_bits(x) & 0x80000000u;
    float a = km_float(km_bits(x) & 0x7FFFFFFFu), t;
    if (a < KM_TANH_SMALL) {
        float z = a * a, p = KM_TANH_P5;
        p = p * z + KM_TANH_P4;
        p = p * z + KM_TANH_P3;
        p = p * z + KM_TANH_P2;
        p = p * z + KM_TANH_P1;
        p = p * z + KM_TANH_P0;
        t = a + (a * z) * p;
    } else {
        t = 1.0f - 2.0f / (km_expf(a + a) + 1.0f);
    }
    return km_float(km_bits(t) | sign);
}

KM_FN float km_sigmoidf(float x) { return 1.0f / (1.0f + km_expf(-x)); }

/* The gated linear units' activations (g: the gate projection, u: the up projection). */
KM_FN float km_swiglu(float g, float u) { return (g * km_sigmoidf(g)) * u; }
KM_FN float km_situ(float g, float u, float bt, float bl)
{
    return ((bt * km_tanhf(g / bt)) * km_sigmoidf(g)) * (bl * km_tanhf(u / bl));
}

/* log(u) for a positive, normal, finite u (km_log1pf's u always is) */
KM_FN float km_log_normal(float u)
{
    uint32_t b = km_bits(u);
    int32_t e = (int32_t)(b >> 23) - 127;
    float m = km_float((b & 0x7FFFFFu) | 0x3F800000u);
    if (m > KM_SQRT2) {
        m = m * 0.5f;
        e = e + 1;
    }
    float f = m - 1.0f, hfsq = 0.5f * (f * f), s = f / (2.0f + f), z = s * s, q = KM_LOG_Q3;
    q = q * z + KM_LOG_Q2;
    q = q * z + KM_LOG_Q1;
    q = q * z + KM_LOG_Q0;
    float ef = (float)e;
    return ef * KM_LN2_HI + (f - (hfsq - (s * (hfsq + z * q) + ef * KM_LN2_LO)));
}

KM_FN float km_log1pf(float y)
{
    float u = 1.0f + y;
    if (u == 1.0f) /* |y| < 2^-24: log1p(y) rounds to y */
        return y;
    if (!(u > 0.0f)) /* y <= -1, or NaN */
        return u == 0.0f ? -INFINITY : NAN;
    if (u == INFINITY)
        return u;
    return km_log_normal(u) * (y / (u - 1.0f));
}

/* softplus(x) = log(1 + exp(x)), and x itself above 20 (where the two round alike) */
KM_FN float km_softplusf(float x) { return x > 20.0f ? x : km_log1pf(km_expf(x)); }

#endif
