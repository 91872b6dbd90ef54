/* bench_act.c — the GLU activations (SiTU, SwiGLU): ns per element of each kernel table's glu
 * (kmath.h's functions; kern_vmath.inc on AVX2 / AVX-512), against the same formula written with
 * libm's expf and tanhf, as blk_common.c computed it before kmath.h. One thread, a decode expert's
 * 2048 elements (in L1); each figure is the best call of --reps rounds, a round timing every code
 * 10 times in turn (so a burst of noise from other tenants does not land on one code only). Every
 * table's output is checked against the scalar one with memcmp before it is timed.
 *
 *   build/bench/bench_act [--n N] [--reps R]
 * Prints a Markdown table. Timing only; never part of a pass/fail test.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/timer.h"
#include "kernels/kern.h"

static void libm_glu(int act, float *gate, const float *up, int n, float bt, float bl)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        gate[i] = act == KERN_GLU_SITU ? (bt * tanhf(g / bt) * s) * (bl * tanhf(up[i] / bl)) : g * s * up[i];
    }
}

typedef void (*glu_fn)(int act, float *gate, const float *up, int n, float bt, float bl);

static double best_ns(glu_fn f, int act, const float *g, const float *u, float *w, int n, double best)
{
    for (int r = 0; r < 10; r++) {
        memcpy(w, g, sizeof(float) * (size_t)n);
        double t = timer_now();
        f(act, w, u, n, 1.4f, 3.0f);
        t = timer_now() - t;
        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int n = 2048, reps = 40;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_act [--n N] [--reps R]\n");
            return 2;
        }
    }
    float *g = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
    float *w = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    if (!g || !u || !w || !ref) {
        fprintf(stderr, "bench_act: out of memory\n");
        return 1;
    }
    rng r;
    rng_seed(&r, 5);
    for (int i = 0; i < n; i++) { /* the spread of a trained expert's projections */
        g[i] = 2.0f * (float)rng_normal(&r);
        u[i] = 2.0f * (float)rng_normal(&r);
    }
    static const char *tables[] = {"scalar", "avx2", "avx512", "neon"};
    enum { NT = sizeof tables / sizeof tables[0] };
    glu_fn code[NT + 1] = {libm_glu};
    const char *name[NT + 1] = {"libm expf/tanhf"};
    int nc = 1;
    for (int act = KERN_GLU_SWIGLU; act <= KERN_GLU_SITU; act++) {
        memcpy(ref, g, sizeof(float) * (size_t)n);
        kern_scalar.glu(act, ref, u, n, 1.4f, 3.0f);
        for (int t = 0; t < NT; t++) {
            const kern_ops *k = kern_select(tables[t]);
            if (!k)
                continue;
            memcpy(w, g, sizeof(float) * (size_t)n);
            k->glu(act, w, u, n, 1.4f, 3.0f);
            if (memcmp(w, ref, sizeof(float) * (size_t)n)) {
                fprintf(stderr, "bench_act: %s glu differs from scalar\n", k->name);
                return 1;
            }
            if (act == KERN_GLU_SWIGLU) {
                code[nc] = k->glu;
                name[nc++] = tables[t];
            }
        }
    }
    printf("| activation | code | ns / element | speed vs libm |\n|---|---|---|---|\n");
    for (int act = KERN_GLU_SWIGLU; act <= KERN_GLU_SITU; act++) {
        double best[NT + 1];
        for (int c = 0; c < nc; c++)
            best[c] = 1e30;
        for (int round = 0; round < reps; round++)
            for (int c = 0; c < nc; c++)
                best[c] = best_ns(code[c], act, g, u, w, n, best[c]);
        for (int c = 0; c < nc; c++)
            printf("| %s | %s%s | %.2f | %.1fx |\n", act == KERN_GLU_SITU ? "SiTU" : "SwiGLU", c ? "kmath, table " : "",
                   name[c], best[c] / n * 1e9, best[0] / best[c]);
    }
    free(g);
    free(u);
    free(w);
    free(ref);
    return 0;
}
