/* kern_scalar.c — the reference kernels: kern.h's seq16 order written out literally.
 * Compiled without any SIMD flags and with -ffp-contract=off, so fmaf() is the only fused
 * operation and every other + and * rounds on its own, as the contract says. */
#include <math.h>

#include "kernels/kern.h"
#include "kernels/kmath.h"

float kern_seq16_reduce(float acc[16])
{
    for (int h = 8; h >= 1; h /= 2)
        for (int j = 0; j < h; j++)
            acc[j] = acc[j] + acc[j + h];
    return acc[0];
}

static float scalar_dot(const float *a, const float *b, int n)
{
    float acc[16] = {0};
    for (int i = 0; i < n; i++)
        acc[i & 15] = fmaf(a[i], b[i], acc[i & 15]);
    return kern_seq16_reduce(acc);
}

static void scalar_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out)
{
    for (int s = 0; s < rows; s++)
        out[s] = scalar_dot(a, x + (size_t)s * ldx, n);
}

static void scalar_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    const wfmt_info *f = &wfmt_table[w->fmt];
    for (int r = r0; r < r1; r++)
        f->decode(w, r, 0, w->cols, out + (size_t)(r - r0) * (size_t)w->cols);
}

/* A matrix row against one activation vector: seq16 in the format's lane order (kern.h). */
static float row_dot(int fmt, const float *w, const float *x, int n)
{
    float acc[16] = {0};
    for (int i = 0; i < n; i++) {
        int l = kern_lane(fmt, i);
        acc[l] = fmaf(w[i], x[i], acc[l]);
    }
    return kern_seq16_reduce(acc);
}

static void scalar_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                          float *scratch)
{
    const wfmt_info *f = &wfmt_table[w->fmt];
    for (int r = r0; r < r1; r++) {
        f->decode(w, r, 0, w->cols, scratch);
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + (size_t)(r - r0)] = row_dot(w->fmt, scratch, x + (size_t)t * ldx, w->cols);
    }
}

static void scalar_axpy(float *y, const float *x, float a, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

static void scalar_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx,
                             int n, int len)
{
    for (int j = 0; j < ny; j++)
        for (int s = 0; s < n; s++)
            scalar_axpy(y + (size_t)j * ldy, x + (size_t)s * ldx, a[(size_t)j * lda + s], len);
}

void kern_scalar_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                          float beta, float *o, float *u)
{
    for (int c = 0; c < d; c++)
        u[c] = 0.0f;
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        for (int c = 0; c < d; c++) {
            Sr[c] = Sr[c] * alpha[r];
            u[c] = fmaf(Sr[c], k[r], u[c]);
        }
    }
    for (int c = 0; c < d; c++) {
        u[c] = beta * (v[c] - u[c]);
        o[c] = 0.0f;
    }
    for (int r = 0; r < d; r++) {
        float *Sr = S + (size_t)r * d;
        for (int c = 0; c < d; c++) {
            Sr[c] = fmaf(k[r], u[c], Sr[c]);
            o[c] = fmaf(Sr[c], q[r], o[c]);
        }
    }
}

void kern_scalar_glu(int act, float *gate, const float *up, int n, float bt, float bl)
{
    if (act == KERN_GLU_SITU)
        for (int i = 0; i < n; i++)
            gate[i] = km_situ(gate[i], up[i], bt, bl);
    else
        for (int i = 0; i < n; i++)
            gate[i] = km_swiglu(gate[i], up[i]);
}

void kern_scalar_exp_sub(float *x, int n, float m)
{
    for (int i = 0; i < n; i++)
        x[i] = km_expf(x[i] - m);
}

void kern_scalar_softmax_rows(float *s, size_t ld, const int *n, int rows, float scale)
{
    for (int r = 0; r < rows; r++) {
        float *x = s + (size_t)r * ld, m = -INFINITY, sum = 0.0f;
        for (int i = 0; i < n[r]; i++)
            x[i] = x[i] * scale;
        for (int i = 0; i < n[r]; i++)
            m = x[i] > m ? x[i] : m;
        kern_scalar_exp_sub(x, n[r], m);
        for (int i = 0; i < n[r]; i++)
            sum += x[i];
        for (int i = 0; i < n[r]; i++)
            x[i] = x[i] / sum;
    }
}

const kern_ops kern_scalar = {
    .name = "scalar",
    .matmul = scalar_matmul,
    .dot = scalar_dot,
    .dot_rows = scalar_dot_rows,
    .decode_rows = scalar_decode_rows,
    .axpy = scalar_axpy,
    .axpy_rows = scalar_axpy_rows,
    .kda_step = kern_scalar_kda_step,
    .glu = kern_scalar_glu,
    .exp_sub = kern_scalar_exp_sub,
    .softmax_rows = kern_scalar_softmax_rows,
};
