/* bench_first_touch.c — what a page costs the first time a decode writes it, and what
 * mem_populate (base/mem.h) takes off: 4 KiB copied page after page (as a drafter's waiting taps
 * or an attention cache fill) into a fresh 16 MiB mapping, one faulted in beforehand by
 * mem_populate, the same with transparent huge pages asked for (MADV_HUGEPAGE, 2 MiB aligned),
 * one written beforehand page by page, and the same mapping again (warm). Prints ns per 4 KiB
 * page of the copy and of the preparation. One thread; each figure is the median of --reps
 * rounds.
 *
 *   build/bench/bench_first_touch [--reps R]
 * Timing only; never part of a pass/fail test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/mem.h"
#include "base/timer.h"

enum { PAGE = 4096, HUGE = 2 << 20, MAPPED = 16 << 20, MAX_REPS = 64 };

/* ns per page of copying `src` into every page of dst */
static double copy_pages(unsigned char *dst, const unsigned char *src)
{
    double t = timer_now();
    for (size_t off = 0; off < MAPPED; off += PAGE)
        memcpy(dst + off, src, PAGE);
    return (timer_now() - t) * 1e9 / (MAPPED / PAGE);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_first_touch [--reps R]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_first_touch: --reps must be 1..%d\n", MAX_REPS);
        return 2;
    }
    static unsigned char src[PAGE];
    memset(src, 1, sizeof src);
    double fresh[MAX_REPS], pop_prep[MAX_REPS], pop[MAX_REPS], thp_prep[MAX_REPS], thp[MAX_REPS],
        touch_prep[MAX_REPS], touch[MAX_REPS], warm[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        unsigned char *m[4];
        for (int i = 0; i < 4; i++) {
            m[i] = mmap(NULL, MAPPED, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m[i] == MAP_FAILED) {
                fprintf(stderr, "bench_first_touch: cannot map %d bytes\n", MAPPED);
                return 1;
            }
        }
        /* m[3]: a 2 MiB-aligned mapping for huge pages (the slack before and after unmapped) */
        munmap(m[3], MAPPED);
        unsigned char *raw = mmap(NULL, MAPPED + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) {
            fprintf(stderr, "bench_first_touch: cannot map %d bytes\n", MAPPED + HUGE);
            return 1;
        }
        m[3] = raw + ((HUGE - (uintptr_t)raw % HUGE) % HUGE);
        if (m[3] > raw)
            munmap(raw, (size_t)(m[3] - raw));
        munmap(m[3] + MAPPED, (size_t)(raw + MAPPED + HUGE - (m[3] + MAPPED)));
        madvise(m[3], MAPPED, MADV_HUGEPAGE);
        fresh[r] = copy_pages(m[0], src);
        double t = timer_now();
        mem_populate(m[1], MAPPED);
        pop_prep[r] = (timer_now() - t) * 1e9 / (MAPPED / PAGE);
        pop[r] = copy_pages(m[1], src);
        t = timer_now();
        mem_populate(m[3], MAPPED);
        thp_prep[r] = (timer_now() - t) * 1e9 / (MAPPED / PAGE);
        thp[r] = copy_pages(m[3], src);
        t = timer_now();
        for (size_t off = 0; off < MAPPED; off += PAGE)
            ((volatile unsigned char *)m[2])[off] = 0;
        touch_prep[r] = (timer_now() - t) * 1e9 / (MAPPED / PAGE);
        touch[r] = copy_pages(m[2], src);
        warm[r] = copy_pages(m[2], src);
        for (int i = 0; i < 4; i++)
            munmap(m[i], MAPPED);
    }
    printf("| 16 MiB, 4 KiB a page, ns per page (median of %d) | beforehand | the copy |\n|---|---|---|\n", reps);
    printf("| fresh | | %.0f |\n", median(fresh, reps));
    printf("| mem_populate | %.0f | %.0f |\n", median(pop_prep, reps), median(pop, reps));
    printf("| mem_populate, huge pages asked for | %.0f | %.0f |\n", median(thp_prep, reps), median(thp, reps));
    printf("| written page by page | %.0f | %.0f |\n", median(touch_prep, reps), median(touch, reps));
    printf("| warm (copied before) | | %.0f |\n", median(warm, reps));
    return 0;
}
