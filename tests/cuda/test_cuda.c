/* test_cuda.c — the GPU's kernels (src/backend/cuda/cuda_kern.h) against the scalar reference,
 * bit for bit, through test_kernels.c's own checks: a kern_ops table whose entries copy their
 * host operands to the device, run the CUDA kernel and copy the results back. Built and run only
 * by `make test-cuda` (a machine with an NVIDIA GPU); the table is a test adapter, not a way to
 * run the engine, whose GPU path keeps its operands on the device. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kern.h"
#include "test.h"
#include "test_kern.h"

/* A device copy of n bytes of host memory (n may be 0); aborts the test binary on a CUDA error,
 * since every later check would fail for the same reason. */
static void *dput(const void *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 4) != cudaSuccess || (n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess)) {
        fprintf(stderr, "test_cuda: cudaMalloc/cudaMemcpy of %zu bytes failed: %s\n", n,
                cudaGetErrorString(cudaGetLastError()));
        abort();
    }
    return d;
}

/* waits for the kernels, copies n bytes of d back into h and frees d */
static void dget(void *h, void *d, size_t n)
{
    errbuf err;
    if (cudak_sync(NULL, "test_cuda", &err) || (n && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    cudaFree(d);
}

/* the device copy of a host matrix view (rows of data, and its scales) */
static kmat dmat(const kmat *w)
{
    kmat d = *w;
    d.data = dput(w->data, wfmt_data_bytes(w->fmt, w->rows, w->cols));
    size_t sb = wfmt_scale_bytes(w->fmt, w->rows, w->cols);
    d.scale = sb ? dput(w->scale, sb) : NULL;
    return d;
}

static void dmat_free(kmat *d)
{
    cudaFree((void *)d->data);
    cudaFree((void *)d->scale);
}

static void c_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                     float *scratch)
{
    (void)scratch;
    kmat d = dmat(w);
    size_t nx = ((size_t)(T - 1) * ldx + (size_t)w->cols) * 4, ny = ((size_t)(T - 1) * ldy + (size_t)(r1 - r0)) * 4;
    float *dx = dput(x, nx), *dy = dput(y, ny); /* y's gaps go up and come back: they must stay */
    cudak_matmul(&d, r0, r1, dx, ldx, T, dy, ldy, NULL);
    dget(y, dy, ny);
    cudaFree(dx);
    dmat_free(&d);
}

static void c_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out)
{
    size_t nx = rows ? ((size_t)(rows - 1) * ldx + (size_t)n) * 4 : 0;
    float *da = dput(a, (size_t)n * 4), *dx = dput(x, nx), *dout = dput(out, (size_t)rows * 4);
    cudak_dot_rows(da, dx, ldx, rows, n, dout, NULL);
    dget(out, dout, (size_t)rows * 4);
    cudaFree(da);
    cudaFree(dx);
}

static float c_dot(const float *a, const float *b, int n)
{
    float out = 0.0f;
    c_dot_rows(a, b, (size_t)n, 1, n, &out);
    return out;
}

static void c_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    kmat d = dmat(w);
    size_t n = (size_t)(r1 - r0) * (size_t)w->cols * 4;
    float *dout = dput(out, n);
    cudak_decode_rows(&d, r0, r1, dout, NULL);
    dget(out, dout, n);
    dmat_free(&d);
}

static void c_axpy_rows(float *y, const float *x, size_t ldx, const float *a, int n, int len)
{
    size_t nx = n ? ((size_t)(n - 1) * ldx + (size_t)len) * 4 : 0;
    float *dy = dput(y, (size_t)len * 4), *dx = dput(x, nx), *da = dput(a, (size_t)n * 4);
    cudak_axpy_rows(dy, dx, ldx, da, n, len, NULL);
    dget(y, dy, (size_t)len * 4);
    cudaFree(dx);
    cudaFree(da);
}

static void c_axpy(float *y, const float *x, float a, int n) { c_axpy_rows(y, x, (size_t)n, &a, 1, n); }

static void c_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                       float beta, float *o, float *u)
{
    (void)u;
    size_t nd = (size_t)d * 4;
    float *dS = dput(S, nd * (size_t)d), *dk = dput(k, nd), *dv = dput(v, nd), *dq = dput(q, nd);
    float *dal = dput(alpha, nd), *dout = dput(o, nd);
    cudak_kda_step(dS, d, dk, dv, dq, dal, beta, dout, NULL);
    dget(o, dout, nd);
    dget(S, dS, nd * (size_t)d);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dq);
    cudaFree(dal);
}

static void c_glu(int act, float *gate, const float *up, int n, float bt, float bl)
{
    float *dg = dput(gate, (size_t)n * 4), *du = dput(up, (size_t)n * 4);
    cudak_glu(act, dg, du, n, bt, bl, NULL);
    dget(gate, dg, (size_t)n * 4);
    cudaFree(du);
}

static void c_exp_sub(float *x, int n, float m)
{
    float *dx = dput(x, (size_t)n * 4);
    cudak_exp_sub(dx, n, m, NULL);
    dget(x, dx, (size_t)n * 4);
}

static const kern_ops cuda_host_ops = {
    .name = "cuda",
    .matmul = c_matmul,
    .dot = c_dot,
    .dot_rows = c_dot_rows,
    .decode_rows = c_decode_rows,
    .axpy = c_axpy,
    .axpy_rows = c_axpy_rows,
    .kda_step = c_kda_step,
    .glu = c_glu,
    .exp_sub = c_exp_sub,
};

static const kern_ops *cuda_ops(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? &cuda_host_ops : NULL;
}

TEST(kern_cuda_matches_scalar) { kern_test_matches_scalar(cuda_ops()); }
TEST(kern_cuda_elementwise) { kern_test_elementwise(cuda_ops()); }
