/* kern.h — the compute kernels, one table per instruction set, chosen at run time.
 *
 * THE EXACTNESS CONTRACT LIVES HERE. Every kernel computes each output element in one fixed,
 * documented order, so the bits of a result never depend on T (how many tokens a pass
 * carries), on the chunk or thread that computed it, or on the instruction set. There is one
 * order ("seq16") for every reduction, a matrix row against an activation vector and two
 * activation vectors alike:
 *
 *   y = w . x over n elements uses 16 float32 partial sums acc[0..15], all +0 at the start; for
 *   i = 0, 1, ..., n-1 in order, acc[lane(i)] = fma(w[i], x[i], acc[lane(i)]); then a fixed
 *   tree: for h = 8, 4, 2, 1: acc[j] = acc[j] + acc[j + h] for j < h. The result is acc[0].
 *   lane(i) = i % 16, for two vectors and for the plain formats. The 4-bit formats (MXFP4, INT4)
 *   use the "nibble" order lane(i) = (i % 32) / 2, because a byte holds an even column in its
 *   low nibble and the next odd column in its high nibble: a 32-column group's even columns (one
 *   vector of low nibbles) and then its odd columns (one of high nibbles) go to the same 16
 *   lanes, and within each lane the columns still come in increasing i. SIMD code then indexes a
 *   16-entry value table straight from the nibbles, about twice as fast as restoring column order.
 *
 * Sixteen sums, not more, so that one output owns one AVX-512 vector (two AVX2, four NEON) and a
 * register tile holds several rows times several tokens (AVX-512: 4 x 6 vectors), reusing each
 * load: with 64 sums a tile held one row and four tokens, 20 loads per 16 FMAs, and prefill ran at
 * 0.3 of the FMA peak. Two vectors once had 64 sums ("seq64"); since the twentieth session they
 * share the matrix order, so a dot of two float32 vectors is the F32 matrix row's product, an
 * attention score over many query rows is a matmul, and a short dot ends in one vector add
 * rather than a tree of seven (bench/results/engine.md). A lone long dot is one FMA chain per
 * lane; the multi-row kernels interleave rows to hide its latency.
 *
 * A matrix row is first dequantized exactly (dtype.h) and then reduced with seq16, so a
 * row-times-vector product has one defined value for every format. The scalar table is the
 * definition (it spells the order out literally); the AVX2, AVX-512 and NEON tables must and do
 * produce the same bits (tests/test_kernels.c compares them with memcmp), which also makes
 * logits identical across machines. The CUDA kernels (src/backend/cuda/cuda_kern.cu and
 * cuda_mm.cu) compute the same order and are held to the scalar table by the same tests; no
 * operation is exempt on the GPU (tensor cores are not used: their accumulation order is not
 * seq16's). The one exception is which NaN: a result that is NaN (a NaN
 * weight, such as MXFP4's scale byte 255, or inf - inf) is NaN on every table and path, but its
 * sign and payload are not part of the contract (x86 passes on the first NaN operand, and the
 * kernels order FMA operands differently); the tests accept any NaN for a NaN.
 */
#ifndef DF_KERNELS_KERN_H
#define DF_KERNELS_KERN_H

#include <stddef.h>

#include "kernels/dtype.h"

typedef struct kern_ops {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    /* y[t*ldy + (r - r0)] = dot(W[r, :], x[t*ldx + :]) for r in [r0, r1), t in [0, T).
     * scratch: kern_scratch_floats(w->cols) floats, 64-byte aligned, owned by the calling thread. */
    void (*matmul)(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                   float *scratch);
    /* seq16 dot product of two float32 vectors (the F32 matrix row's product). */
    float (*dot)(const float *a, const float *b, int n);
    /* out[s] = dot(a, x + s * ldx, n) for s < rows, each the dot above: one query's scores over
     * a run of key rows (DSpark's; the SIMD matmuls' short F32 rows, ISA_DOTS in
     * kern_matmul.inc). SIMD tables finish eight trees at once. */
    void (*dot_rows)(const float *a, const float *x, size_t ldx, int rows, int n, float *out);
    /* Exact dequantization of rows [r0, r1) into out[(r - r0) * cols + i]. */
    void (*decode_rows)(const kmat *w, int r0, int r1, float *out);
    /* y[i] = fma(a, x[i], y[i]) for i < n (element-wise: the same bits on every ISA). */
    void (*axpy)(float *y, const float *x, float a, int n);
    /* For each of ny outputs j (y_j = y + j ldy, a_j = a + j lda): n axpys in turn, y_j[i] =
     * fma(a_j[s], x[s * ldx + i], y_j[i]) for s = 0 .. n - 1 and i < len. Each element's chain runs
     * over s in order, so this is the bits of n axpy calls a row, with y held in registers across
     * them; the outputs share each x row's loads (attention's weighted sums of value rows for
     * several query rows, the MoE's weighted sum of expert outputs). */
    void (*axpy_rows)(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx, int n,
                      int len);
    /* One token of the KDA delta rule for one head, S[d][d] (rows = key dim), in place:
     *   for each row r:  S[r][:] *= alpha[r];  u[:] = fma(S[r][:], k[r], u[:])   (u from 0)
     *   u[:] = beta * (v[:] - u[:])
     *   for each row r:  S[r][:] = fma(k[r], u[:], S[r][:]);  o[:] = fma(S[r][:], q[r], o[:])  (o from 0)
     * Rows are visited in order and every operation is element-wise across columns, so every
     * ISA gives the same bits. u is scratch of d floats. */
    void (*kda_step)(float *S, int d, const float *k, const float *v, const float *q, const float *alpha, float beta,
                     float *o, float *u);
    /* A gated linear unit's activation in place, element by element: gate[i] = km_swiglu or
     * km_situ (kmath.h) of gate[i] and up[i] for i < n; bt, bl: SiTU's betas (unused by SwiGLU).
     * kmath.h's functions are the definition, so every ISA gives the same bits. */
    void (*glu)(int act, float *gate, const float *up, int n, float bt, float bl);
    /* x[i] = km_expf(x[i] - m) for i < n: a softmax's numerators (element-wise, as glu). */
    void (*exp_sub)(float *x, int n, float m);
    /* Softmaxes in place (attention's and AttnRes's weights), each row in one fixed order. Row r
     * is x = s + r * ld, of n[r] >= 1 values: x[i] = x[i] * scale; m = their largest (NaNs
     * ignored; -inf if all are NaN); x[i] = km_expf(x[i] - m); sum = x[0] + x[1] + ... in that
     * order from +0; x[i] = x[i] / sum. Which of +0 and -0 is m does not change a bit (every
     * difference with it is the same, and exp(+-0) = 1), so m may be found in any order; rows are
     * independent, so a table may interleave their sums (the sum is the serial part). */
    void (*softmax_rows)(float *s, size_t ld, const int *n, int rows, float scale);
} kern_ops;

/* glu's activations */
enum { KERN_GLU_SWIGLU, KERN_GLU_SITU };

/* The T > 1 matrix path's blocking (kern_matmul.inc), shared by every table because it sizes the
 * caller's scratch: rows go in blocks of KERN_RB and columns in blocks of KERN_KC, each block's
 * weights decoded once into scratch (or, for small groups on AVX-512, decoded in registers by the
 * tiles that read them) and reduced against up to KERN_TG tokens, whose seq16 partial
 * sums (KERN_RB x KERN_TG vectors of 16) are carried from one column block to the next. A table
 * may choose a block of fewer rows and longer, padded rows (AVX2: 8 x 512, rows 2080 bytes apart),
 * within KERN_KC_MAX columns and KERN_BLOCK floats. A group's
 * activations are first copied into column-block panels (4-bit formats: in lane order),
 * KERN_XF floats of them (fewer tokens per group for long rows, never fewer than 8 rows of
 * activations, rounded up to whole column blocks). */
enum { KERN_RB = 16, KERN_KC = 256, KERN_TG = 64, KERN_XF = 1 << 19, KERN_KC_MAX = 512, KERN_BLOCK = 16 * 320 };
static inline size_t kern_scratch_xfloats(size_t cols)
{
    size_t c8 = (cols + KERN_KC_MAX - 1) / KERN_KC_MAX * KERN_KC_MAX * 8;
    return c8 > (size_t)KERN_XF ? c8 : (size_t)KERN_XF;
}
/* The per-thread scratch a matmul needs for a matrix of `cols` columns (64-byte aligned): the
 * reordered activations, one decoded block and the partial sums (the scalar table uses the
 * first `cols` floats for a decoded row). */
static inline size_t kern_scratch_floats(size_t cols)
{
    return kern_scratch_xfloats(cols) + (size_t)KERN_BLOCK + (size_t)KERN_RB * KERN_TG * 16 + 64;
}

extern const kern_ops kern_scalar;
/* The reference KDA step (also used by SIMD tables for head sizes they do not vectorise). */
void kern_scalar_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                          float beta, float *o, float *u);
/* The reference activation and exponentials (also used by SIMD tables for their tails, and by NEON). */
void kern_scalar_glu(int act, float *gate, const float *up, int n, float bt, float bl);
void kern_scalar_exp_sub(float *x, int n, float m);
void kern_scalar_softmax_rows(float *s, size_t ld, const int *n, int rows, float scale);
/* NULL when this build or this CPU cannot run them. */
const kern_ops *kern_avx2(void);
const kern_ops *kern_avx512(void);
const kern_ops *kern_neon(void);

/* The fastest table this CPU supports, or the one named by `name` ("scalar", "avx2", ...;
 * NULL or "auto" = fastest). Returns NULL if the named table is not available here. */
const kern_ops *kern_select(const char *name);

/* The seq16 reduction tree over acc[16] (shared by the scalar kernels and by tests). */
float kern_seq16_reduce(float acc[16]);
/* seq16's lane of element i in a matrix row of format fmt (i % 16, or the nibble order). */
static inline int kern_lane(int fmt, int i)
{
    if (wfmt_nibble(fmt))
        return (i & 31) >> 1;
    return i & 15;
}

#endif
