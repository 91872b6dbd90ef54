/* bench_dot_rows.c — kern_ops.dot_rows, one query against runs of 8 cached rows in L1, as GQA
 * and MLA took their scores until the twentieth session (they now take them as matmuls; DSpark's
 * lone queries still call dot_rows). MLA's latent and rope parts are dots of 64 and 32 at a row
 * stride of 96 floats in the bundled model; Qwen3's keys are 128 at a stride of 2048. Prints ns a
 * dot and the ratio to the FMA peak this same run measures on one thread: a dot of n takes
 * n / 16 zmm FMAs (n / 8 ymm on AVX2), so the ratio says how much of a dot's time its FMAs are;
 * the rest is kern.h's tree and the loads. Best of many repetitions, alternated with the
 * peak loop. usage: bench_dot_rows [--kernels auto|scalar|avx2|avx512] [--reps R]
 * Timing only; never part of a pass/fail test.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "kernels/kern.h"

enum { CHAINS = 12, CHAIN_ITERS = 1 << 16, ROWS = 8, CALLS = 200 };

/* CHAINS independent FMA chains, n steps (named variables: in an array gcc kept them on the
 * stack); the caller turns the time into ns a vector FMA at the peak */
#define CHAINS_FN(NAME, TARGET, VEC, SET1, FMADD, CVT, CONSTRAINT)                                                 \
    __attribute__((target(TARGET), noinline)) static float NAME(long n)                                           \
    {                                                                                                              \
        VEC m = SET1(0.999999f), c = SET1(1e-7f), a0 = SET1(0.0f), a1 = SET1(1.0f), a2 = SET1(2.0f);               \
        VEC a3 = SET1(3.0f), a4 = SET1(4.0f), a5 = SET1(5.0f), a6 = SET1(6.0f), a7 = SET1(7.0f);                    \
        VEC a8 = SET1(8.0f), a9 = SET1(9.0f), a10 = SET1(10.0f), a11 = SET1(11.0f);                                \
        for (long i = 0; i < n; i++) {                                                                             \
            a0 = FMADD(a0, m, c), a1 = FMADD(a1, m, c), a2 = FMADD(a2, m, c), a3 = FMADD(a3, m, c);                 \
            a4 = FMADD(a4, m, c), a5 = FMADD(a5, m, c), a6 = FMADD(a6, m, c), a7 = FMADD(a7, m, c);                 \
            a8 = FMADD(a8, m, c), a9 = FMADD(a9, m, c), a10 = FMADD(a10, m, c), a11 = FMADD(a11, m, c);             \
            __asm__ volatile("" : "+" CONSTRAINT(a0), "+" CONSTRAINT(a1), "+" CONSTRAINT(a2), "+" CONSTRAINT(a3)); \
        }                                                                                                          \
        return CVT(a0) + CVT(a1) + CVT(a2) + CVT(a3) + CVT(a4) + CVT(a5) + CVT(a6) + CVT(a7) + CVT(a8) +           \
               CVT(a9) + CVT(a10) + CVT(a11);                                                                      \
    }
CHAINS_FN(chains512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_cvtss_f32, "v")
CHAINS_FN(chains256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_cvtss_f32, "x")

int main(int argc, char **argv)
{
    const char *kn = "auto";
    int reps = 300;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            kn = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_dot_rows [--kernels auto|scalar|avx2|avx512] [--reps R]\n");
            return 2;
        }
    }
    const kern_ops *k = kern_select(kn);
    if (!k) {
        fprintf(stderr, "bench_dot_rows: kernels '%s' not available on this CPU or build\n", kn);
        return 1;
    }
    int wide = !strcmp(k->name, "avx512"), lanes = wide ? 16 : 8;
    static const int lens[] = {32, 64, 128}, lds[] = {96, 96, 2048};
    float *x = aligned_alloc(64, sizeof(float) * ROWS * 2048), *q = aligned_alloc(64, sizeof(float) * 128), out[ROWS];
    for (int i = 0; i < ROWS * 2048; i++)
        x[i] = (float)(i % 13) * 0.1f - 0.6f;
    for (int i = 0; i < 128; i++)
        q[i] = (float)(i % 7) * 0.3f - 0.9f;
    volatile float sink = 0.0f;
    printf("kernels %s, one thread, %d rows a call\n\n", k->name, ROWS);
    printf("| n | row stride | ns a dot | FMA peak ns a vector FMA | ratio to the FMA peak |\n|---|---|---|---|---|\n");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        double best = 1e30, peak = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = timer_now();
            sink = sink + (wide ? chains512(CHAIN_ITERS) : chains256(CHAIN_ITERS));
            double t1 = timer_now();
            for (int c = 0; c < CALLS; c++)
                k->dot_rows(q, x, (size_t)lds[li], ROWS, lens[li], out);
            double t2 = timer_now();
            sink = sink + out[0];
            double p = (t1 - t0) * 1e9 / ((double)CHAIN_ITERS * CHAINS), d = (t2 - t1) * 1e9 / (CALLS * ROWS);
            peak = p < peak ? p : peak;
            best = d < best ? d : best;
        }
        double ideal = (double)(lens[li] / lanes) * peak; /* the dot's FMAs at the peak */
        printf("| %d | %d | %.2f | %.3f | %.2f |\n", lens[li], lds[li], best, peak, ideal / best);
    }
    return 0;
}
