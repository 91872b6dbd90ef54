/* cuda_kern.h — kern.h's operations on the GPU, over device memory, in kern.h's reduction orders.
 *
 * Every function here computes exactly what the kern_ops entry of the same name computes on the
 * CPU, bit for bit: matmul and dot_rows reduce each output in seq16 (a matrix row in its format's
 * lane order), and the element-wise operations (axpy, kda_step, glu, exp_sub) are kmath.h's and kern.h's
 * formulas compiled for the device with -fmad=false, so that only explicit fmaf() fuses, as on the
 * CPU (tests/cuda/test_cuda.c compares every one with the scalar table with memcmp).
 *
 * All pointers are device pointers, a kmat's data and scale included (its rows, cols, strides and
 * format as on the host). Calls are queued on `stream` (a cudaStream_t; NULL: the default stream)
 * and return at once; cudak_sync waits and reports the first error. Nothing here allocates.
 */
#ifndef DF_BACKEND_CUDA_CUDA_KERN_H
#define DF_BACKEND_CUDA_CUDA_KERN_H

#include <stddef.h>

#include "base/err.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[t*ldy + (r - r0)] = seq16 dot(W[r, :], x[t*ldx + :]) for r in [r0, r1), t in [0, T). */
void cudak_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                  void *stream);
/* One product of a set: y[t*ldy + (r - r0)] = seq16 dot(W[r, :], x[t*ldx + :]), r in [r0, r1),
 * t < T (w's data and scale device pointers). */
typedef struct cudak_mm {
    kmat w;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    int r0, r1, T;
} cudak_mm;
enum { CUDAK_SET = 32 }; /* the products one launch of cudak_matmul_set takes at most */
/* Each m[i] as cudak_matmul computes it (the same bits), those of one format and a like number of
 * tokens in launches of up to CUDAK_SET products (a MoE layer's experts: one launch fills the GPU
 * where each alone would not). The products must not write what another reads. */
void cudak_matmul_set(const cudak_mm *m, int n, void *stream);
/* out[(r - r0) * cols + i] = W[r][i], the exact decode. */
void cudak_decode_rows(const kmat *w, int r0, int r1, float *out, void *stream);
/* out[s] = dot(a, x + s * ldx, n) for s < rows. */
void cudak_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out, void *stream);
/* kern.h's axpy_rows: for each of ny outputs j, y_j = y + j ldy and a_j = a + j lda (device floats). */
void cudak_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx, int n,
                     int len, void *stream);
/* kern.h's kda_step for one head: S [d][d] in place, k, v, q, alpha [d], o [d] out. */
void cudak_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha, float beta,
                    float *o, void *stream);
/* gate[i] = km_swiglu or km_situ of gate[i], up[i] (act: KERN_GLU_*). */
void cudak_glu(int act, float *gate, const float *up, int n, float bt, float bl, void *stream);
/* cudak_glu over the n spans gate[off[j] .. off[j] + len[j]) (with up's same elements), in
 * launches of up to CUDAK_SET spans. */
void cudak_glu_set(int act, float *gate, const float *up, const int *off, const int *len, int n, float bt, float bl,
                   void *stream);
/* x[i] = km_expf(x[i] - m). */
void cudak_exp_sub(float *x, int n, float m, void *stream);

/* Waits for `stream` and returns -1 with the first CUDA error (naming `what`), else 0. */
int cudak_sync(void *stream, const char *what, errbuf *err);

#ifdef __cplusplus
}
#endif

#endif
