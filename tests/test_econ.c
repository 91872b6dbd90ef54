/* test_econ.c — the drafting economics (src/engine/econ.h) driven with costs and rulings of the
 * test's own, so that what it decides is a count, not a timing: the same inputs give the same
 * choices on any machine. The passes cost what a store-bound decode measures: a pass of T
 * positions 1 + 0.6 (T - 1) plain ones (pass_seconds), or a loop's, whose positions read the same
 * experts again (loop_seconds), 85% of a plain one stalled on reads. */
#include <string.h>

#include "engine/econ.h"
#include "test.h"

static int silent_propose(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **q, errbuf *err)
{
    (void)d, (void)seq, (void)n, (void)k, (void)out, (void)q, (void)err;
    return 0; /* never called: the test plays the drafter */
}

static double pass_seconds(int T) { return 0.010 * (1 + 0.6 * (T - 1)); }

/* A loop's verify passes (a repeated line of code) read the same experts again: a pass of T
 * positions costs 1 + 3.2 (1 - 0.8^(T - 1)) plain ones, 4.2 at T = 16 (what the bundled model's
 * code1 measured from the store, bench/results/drafting.md, 2026-12-05). */
static double loop_seconds(int T)
{
    double x = 1;
    for (int t = 1; t < T; t++)
        x *= 0.8;
    return 0.010 * (1 + 3.2 * (1 - x));
}

typedef struct sim {
    int steps, kmax, after;
    double noise; /* each pass's time off by up to +-noise/2 of it, the same sequence every run */
    double (*cost)(int T);
    int (*keep)(int i, int j); /* the ruling on guess j of the i-th verified step */
    int verified, late;        /* steps that verified guesses, those after the first `after` */
    int tokens;                /* tokens the steps emitted */
    double seconds;            /* in passes */
} sim;

/* Runs x->steps steps with one free drafter that always has the guesses of class 0 asked of it. */
static void simulate_sim(sim *x)
{
    drafter dr = {.name = "free", .propose = silent_propose};
    drafter *use[1] = {&dr};
    econ e;
    econ_init(&e, use, 1, 8, 64, 1);
    x->verified = x->late = x->tokens = 0;
    x->seconds = 0;
    for (int s = 0; s < x->steps; s++) {
        int d, k;
        econ_step es;
        econ_choose(&e, x->kmax, 100 + s, x->steps - s, &d, &k, &es);
        int m = 0;
        if (d == 0 && k > 0) {
            econ_asked(&e, 0, 1e-7, 0, k, 0); /* what it was asked for, in next to no time */
            m = econ_verify(&e, 0, 0, k, &es);
        }
        double took = x->cost(m + 1) * (1 + x->noise * (((s * 2654435761u) >> 7) % 1000 / 1000.0 - 0.5));
        econ_passed(&e, m + 1, took, m == 0 ? 0.85 * took : 0);
        x->seconds += took;
        int kept = 0;
        for (int j = 0; j < m; j++) {
            int ok = x->keep(x->verified, j);
            econ_ruled(&e, 0, 0, j, ok);
            if (!ok)
                break;
            kept++;
        }
        econ_step_done(&e, d, 0, m, kept, &es);
        x->tokens += kept + 1;
        if (m > 0) {
            x->late += x->verified >= x->after;
            x->verified++;
        }
    }
}

static int simulate(int steps, int (*keep)(int i, int j), int after, int *late)
{
    sim x = {.steps = steps, .kmax = 7, .after = after, .cost = pass_seconds, .keep = keep};
    simulate_sim(&x);
    *late = x.late;
    return x.verified;
}

/* refused the first two times, then kept nine times in ten */
static int unlucky_start(int i, int j) { return i >= 2 && (i * 7 + j) % 10 != 0; }
static int never(int i, int j) { (void)i, (void)j; return 0; }
static int always(int i, int j) { (void)i, (void)j; return 1; }

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

/* A loop whose every guess is kept, at a loop's pass costs (loop_seconds) and draft-max 15: the
 * economics verifies blocks of 15, where a pass of 16 positions costs 4.2 plain ones. 60 steps then
 * emit tokens at 3.88 times a plain decode's rate; blocks of 7 at most would give 2.27. */
TEST(econ_a_loop_is_verified_in_long_blocks)
{
    sim x = {.steps = 60, .kmax = 15, .cost = loop_seconds, .keep = always};
    simulate_sim(&x);
    double rate = x.tokens * x.cost(1) / x.seconds;
    CHECKF(rate >= 3.5, "%d tokens at %.2f times a plain decode's rate", x.tokens, rate);
}

/* The same loop costs, a class refused twice and then kept nine times in ten (unlucky_start: the
 * first refusal falls anywhere in a block): the economics must learn that blocks pay again. 60
 * steps run at 1.30 times a plain decode's rate. When it judged a position never ruled on by the
 * acceptance before it without the optimism it gives a free drafter's ruled ones, and extrapolated
 * a pass's cost by the model's ratio from the largest measured one (before 35f639b), they ran at
 * 1.07. */
TEST(econ_an_unlucky_start_pays_again)
{
    sim x = {.steps = 60, .kmax = 15, .cost = loop_seconds, .keep = unlucky_start, .noise = 0.3};
    simulate_sim(&x);
    double rate = x.tokens * x.cost(1) / x.seconds;
    CHECKF(rate >= 1.2, "%d tokens at %.2f times a plain decode's rate", x.tokens, rate);
}

/* A model drafter's warm-up (one guess verified) does not take a step from a free drafter whose
 * guesses were seen to pay: in a loop, each such step would trade a block of 15 kept guesses for one
 * guess. The model drafter (proposing costs a fifth of a pass, its one guess always kept) gets the
 * first of its two warm-up steps in turn, before the free drafter's class has two rulings; the
 * second waits for a step where the free one does not pay, which in this loop never comes. */
TEST(econ_warm_up_waits_while_a_free_drafter_pays)
{
    drafter fr = {.name = "free", .propose = silent_propose}, md = {.name = "model", .propose = silent_propose};
    drafter *use[2] = {&fr, &md};
    econ e;
    econ_init(&e, use, 2, 8, 64, 1);
    int model_steps = 0;
    for (int s = 0; s < 60; s++) {
        int d, k;
        econ_step es;
        econ_choose(&e, 15, 100 + s, 60 - s, &d, &k, &es);
        int m = 0;
        if (d >= 0 && k > 0) {
            econ_asked(&e, d, d == 0 ? 1e-7 : 0.2 * loop_seconds(1), 0, d == 0 ? k : 1, 0);
            m = econ_verify(&e, d, 0, d == 0 ? k : 1, &es);
        }
        econ_passed(&e, m + 1, loop_seconds(m + 1), m == 0 ? 0.85 * loop_seconds(1) : 0);
        for (int j = 0; j < m; j++)
            econ_ruled(&e, d, 0, j, 1);
        econ_step_done(&e, d, 0, m, m, &es);
        model_steps += d == 1 && m > 0;
    }
    CHECKF(model_steps == 1, "the model drafter's guesses were verified on %d steps of a loop", model_steps);
}
