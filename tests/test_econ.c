/* test_econ.c — the drafting economics (src/engine/econ.h) driven with costs and rulings of the
 * test's own, so that what it decides is a count, not a timing: the same inputs give the same
 * choices on any machine. The passes cost what a store-bound decode measures: a pass of T
 * positions 1 + 0.6 (T - 1) plain ones, 85% of a plain one stalled on reads. */
#include <string.h>

#include "engine/econ.h"
#include "test.h"

static int silent_propose(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **q, errbuf *err)
{
    (void)d, (void)seq, (void)n, (void)k, (void)out, (void)q, (void)err;
    return 0; /* never called: the test plays the drafter */
}

static double pass_seconds(int T) { return 0.010 * (1 + 0.6 * (T - 1)); }

/* Runs `steps` steps with one free drafter that always has kmax guesses of class 0; `keep(i, j)`
 * rules on guess j of the i-th verified step. Returns the steps that verified guesses, those after
 * the first `after` such steps in *late. */
static int simulate(int steps, int (*keep)(int i, int j), int after, int *late)
{
    drafter dr = {.name = "free", .propose = silent_propose};
    drafter *use[1] = {&dr};
    econ e;
    econ_init(&e, use, 1, 8, 64, 1);
    int verified = 0;
    *late = 0;
    for (int s = 0; s < steps; s++) {
        int d, k;
        econ_step es;
        econ_choose(&e, 7, 100 + s, steps - s, &d, &k, &es);
        int m = 0;
        if (d == 0 && k > 0) {
            econ_asked(&e, 0, 1e-7, 0, k, 0); /* k guesses, next to no time */
            m = econ_verify(&e, 0, 0, k, &es);
        }
        econ_passed(&e, m + 1, pass_seconds(m + 1), m == 0 ? 0.85 * pass_seconds(1) : 0);
        int kept = 0;
        for (int j = 0; j < m; j++) {
            int ok = keep(verified, j);
            econ_ruled(&e, 0, 0, j, ok);
            if (!ok)
                break;
            kept++;
        }
        econ_step_done(&e, d, 0, m, kept, &es);
        if (m > 0) {
            *late += verified >= after;
            verified++;
        }
    }
    return verified;
}

/* refused the first two times, then kept nine times in ten */
static int unlucky_start(int i, int j) { return i >= 2 && (i * 7 + j) % 10 != 0; }
static int never(int i, int j) { (void)i, (void)j; return 0; }

/* A free drafter's class whose first two rulings were refusals looks, at a verify pass of 1.6 plain
 * ones, as if it could never pay (0.17 kept, 0.31 with its optimism). Class probes try it again
 * after 8 offers; once it shows what it keeps (0.9), its guesses are verified on most steps. Over a
 * 128-token reply: 112 of the 126 steps after the refusals verify guesses; without class probes 65
 * (the drafter's own probes, every 32 steps, find it only later, and with several drafters those
 * go to each in turn). */
TEST(econ_class_refused_early_is_tried_again)
{
    int late, n = simulate(128, unlucky_start, 2, &late);
    CHECKF(late >= 90, "after two refusals the class was verified on %d of 126 steps (%d in all)", late, n);
}

/* What the probes cost: a class that is always refused is tried after 8, 16, 32 ... offers, so over
 * 600 steps (one offer each) it is verified on its two first rulings, 6 class probes and the
 * drafter's 4 probes (every 32, 64, 128 ... steps): 12. Probes that did not back off would make
 * 80. */
TEST(econ_class_probes_are_few_when_nothing_is_kept)
{
    int late, n = simulate(600, never, 0, &late);
    CHECKF(n >= 4 && n <= 14, "a class never kept was verified on %d of 600 steps", n);
}
