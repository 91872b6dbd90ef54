/* kern_neon.c — AArch64 NEON kernels, bit-identical to kern_scalar.c.
 *
 * An output's 16 seq16 partial sums, a dot's or a matrix row's, live in four float32x4 registers
 * (lanes 4k..4k+3 in register k). vfmaq_f32 is a fused multiply-add, like fmaf.
 * Rows are decoded exactly with the scalar decoder a block of KERN_KC columns at a time (NEON has
 * no cheap 16-entry float table lookup; the decode is exact either way), put in lane order and
 * reduced against each token in seq16 order, the sums carried from block to block. The GLU
 * activation, exp_sub and softmax_rows are the reference loops (kmath.h's functions, compiled as
 * plain C).
 */
#include "kernels/kern.h"

#include <math.h>

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

static void neon_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    for (int r = r0; r < r1; r++)
        wfmt_table[w->fmt].decode(w, r, 0, w->cols, out + (size_t)(r - r0) * (size_t)w->cols);
}

/* Reorders v[0..n) into the format's lane order (kern.h): identity, or per 32-column group the
 * even columns then the odd ones. */
static void to_lane_order(int fmt, const float *v, int n, float *o)
{
    if (!wfmt_nibble(fmt)) {
        memcpy(o, v, sizeof(float) * (size_t)n);
        return;
    }
    for (int i = 0; i < n; i += 32)
        for (int j = 0; j < 16; j++) {
            o[i + j] = v[i + 2 * j];
            o[i + 16 + j] = v[i + 2 * j + 1];
        }
}

/* Adds w[0..len) times x[0..len) (both in lane order) to the 16 sums at s, in seq16 order. */
static void sums16_add(float *s, const float *w, const float *x, int len)
{
    float32x4_t a[4];
    for (int k = 0; k < 4; k++)
        a[k] = vld1q_f32(s + 4 * k);
    int i = 0;
    for (; i + 16 <= len; i += 16)
        for (int k = 0; k < 4; k++)
            a[k] = vfmaq_f32(a[k], vld1q_f32(w + i + 4 * k), vld1q_f32(x + i + 4 * k));
    if (i < len) { /* +0 x -0 padding adds nothing (see kern_matmul.inc) */
        float tw[16] = {0}, tx[16];
        for (int j = 0; j < 16; j++)
            tx[j] = -0.0f;
        memcpy(tw, w + i, sizeof(float) * (size_t)(len - i));
        memcpy(tx, x + i, sizeof(float) * (size_t)(len - i));
        for (int k = 0; k < 4; k++)
            a[k] = vfmaq_f32(a[k], vld1q_f32(tw + 4 * k), vld1q_f32(tx + 4 * k));
    }
    for (int k = 0; k < 4; k++)
        vst1q_f32(s + 4 * k, a[k]);
}

/* the seq16 tree over 16 sums: h = 8, 4 in registers, then 2, 1 */
static float sums16_reduce(const float *s)
{
    float32x4_t a = vaddq_f32(vld1q_f32(s), vld1q_f32(s + 8)), b = vaddq_f32(vld1q_f32(s + 4), vld1q_f32(s + 12));
    float c[4];
    vst1q_f32(c, vaddq_f32(a, b));
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* A dot is a plain row's product (kern.h): the matmul's own sums and tree. */
static float neon_dot(const float *a, const float *b, int n)
{
    float s[16] = {0};
    sums16_add(s, a, b, n);
    return sums16_reduce(s);
}

static void neon_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out)
{
    for (int s = 0; s < rows; s++)
        out[s] = neon_dot(a, x + (size_t)s * ldx, n);
}

/* scratch: the group's lane-ordered activations (kern_scratch_xfloats), a decoded block and its
 * lane-ordered copy, and each token's 16 sums for the current row */
static void neon_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                        float *scratch)
{
    int n = w->cols;
    size_t xf = kern_scratch_xfloats((size_t)n);
    int tgmax = xf / (size_t)n < KERN_TG ? (int)(xf / (size_t)n) : KERN_TG;
    float *dec = scratch + xf, *row = dec + KERN_KC, *st = dec + (size_t)KERN_RB * KERN_KC;
    for (int t0 = 0; t0 < T; t0 += tgmax) {
        int tg = T - t0 < tgmax ? T - t0 : tgmax;
        for (int t = 0; t < tg; t++)
            to_lane_order(w->fmt, x + (size_t)(t0 + t) * ldx, n, scratch + (size_t)t * n);
        for (int r = r0; r < r1; r++) {
            memset(st, 0, sizeof(float) * 16 * (size_t)tg);
            for (int c0 = 0; c0 < n; c0 += KERN_KC) {
                int len = n - c0 < KERN_KC ? n - c0 : KERN_KC;
                wfmt_table[w->fmt].decode(w, r, c0, c0 + len, dec);
                to_lane_order(w->fmt, dec, len, row);
                for (int t = 0; t < tg; t++)
                    sums16_add(st + 16 * (size_t)t, row, scratch + (size_t)t * n + c0, len);
            }
            for (int t = 0; t < tg; t++)
                y[(size_t)(t0 + t) * ldy + (size_t)(r - r0)] = sums16_reduce(st + 16 * (size_t)t);
        }
    }
}

static void neon_axpy(float *y, const float *x, float a, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

static void neon_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx, int n,
                           int len)
{
    for (int j = 0; j < ny; j++)
        for (int s = 0; s < n; s++)
            neon_axpy(y + (size_t)j * ldy, x + (size_t)s * ldx, a[(size_t)j * lda + s], len);
}

/* The KDA step uses the reference loop: fmaf is one fused instruction on AArch64. */
static const kern_ops ops = {
    .name = "neon",
    .matmul = neon_matmul,
    .dot = neon_dot,
    .dot_rows = neon_dot_rows,
    .decode_rows = neon_decode_rows,
    .axpy = neon_axpy,
    .axpy_rows = neon_axpy_rows,
    .kda_step = kern_scalar_kda_step,
    .glu = kern_scalar_glu,
    .exp_sub = kern_scalar_exp_sub,
    .softmax_rows = kern_scalar_softmax_rows,
};
const kern_ops *kern_neon(void) { return &ops; }
#else
const kern_ops *kern_neon(void) { return NULL; }
#endif
