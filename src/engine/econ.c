/* econ.c — see econ.h; the model it weighs is generate.h's (docs/drafting.md). */
#include "engine/econ.h"

#include <assert.h>
#include <math.h>
#include <string.h>

static const double EMA = 0.25;    /* weight of a new measurement */
static const double ACC_PRIOR = 0.5, ACC_DECAY = 0.9, COMPUTE_PER_POS = 0.15;
/* the fewest prompt positions whose compute says what a position adds to a pass (econ_prefilled) */
static const int PREFILL_MIN = 16;
/* a drafter whose proposing costs less than this share of a plain pass is free: it is asked every
 * step, and its guesses are verified when their class pays (a plain pass when none come). Its
 * optimism: 0.5 kept verifying n-gram guesses on chat from RAM that cost more than they saved
 * (0.89-0.90x of no drafting, 0.93-0.94x at 0.25); none, now that its guesses are ruled on
 * unverified, cost code1 and code3 from a store 11-15% (bench/results/drafting.md, 2026-12-06) */
static const double FREE_SHARE = 0.01, ACC_OPTIMISM = 0.25;
/* the most of a request's plain decode that learning whether a model drafter pays may cost */
static const double EXPLORE_SHARE = 0.02;
/* how much more a second a free drafter's guesses must bring than a plain pass to be verified. Its
 * class's estimate, from a few rulings, is highest exactly when a step bets on it: from RAM on chat,
 * classes judged 0.83-0.88 kept were verified at 1.84 plain passes for a pass of 2 (a percent or two
 * to gain) and refused. With the margin, chat from RAM paired 0.976 -> 0.985 and 0.974 -> 0.980 of no
 * drafting, the store unchanged; applied to model drafters too, DSpark's store chat lost 1.33x ->
 * 1.32x (bench/results/drafting.md, 2026-12-06, twelfth session). */
static const double VERIFY_MARGIN = 0.05;

static void ema(double *x, double v) { *x = *x > 0 ? (1 - EMA) * *x + EMA * v : v; }

/* A pass of T positions' compute in one position's: T^a, the power through a plain pass (1, its
 * compute) and the prompt's passes (prefill_T positions each, in their measured compute), at least
 * 1 + COMPUTE_PER_POS (T - 1) and at most T. A small pass costs nearly a plain pass a position and
 * a large one far less: from RAM on the bundled model a pass of 2 cost 1.84 plain ones, 3: 2.7-3.1,
 * 10: 7.4, 32: 18.4, and the prompt's 144 positions 78 (a = 0.88 gives 1.84, 2.62, 7.5 and 20.8);
 * a straight line through the prompt's compute per position (0.55 of a plain pass) judged a pass
 * of 2 at 1.55 and 3 at 2.1, too cheap, so each chat reply's first n-gram guess was verified at
 * that price and refused (bench/results/drafting.md, 2026-12-06, twelfth session). Once two sizes
 * are measured, the slope between them corrects the curve (cost_judged). A prompt run a position
 * a pass says nothing of batching: a = 1. */
static void compute_shapes(econ *e)
{
    double c1 = e->pass_s[1] * (1 - e->io_frac), a = 0;
    if (c1 > 0 && e->prefill_pos_s > 0) {
        double r = e->prefill_pos_s * e->prefill_T / c1; /* a prompt pass, in plain passes' compute */
        a = e->prefill_T < 2 ? 1 : r > 1 ? log(r) / log(e->prefill_T) : 0;
        a = a < 1 ? a : 1;
    }
    if (e->comp[1] > 0 && fabs(a - e->comp_a) < 2e-3)
        return; /* (a pass of 32 then moves by under 0.7%: 32 exponentials a step spared) */
    e->comp_a = a;
    for (int T = 1; T <= GEN_MAX_DRAFT + 1; T++) {
        double lin = 1 + COMPUTE_PER_POS * (T - 1), p = a > 0 ? exp(a * log((double)T)) : 0;
        e->comp[T] = p > lin ? p : lin;
    }
}

/* a pass of T positions relative to one, by the model of generate.h: compute grows with T as the
 * prompt showed (compute_shapes), reads with the union of the experts the positions route to */
static double shape(const econ *e, int T)
{
    return (1 - e->io_frac) * e->comp[T] + e->io_frac * e->union_ratio[T];
}

/* the time of a pass of T positions: measured; or, between two measured sizes t2 < T < t3,
 * interpolated between them along the model's shape; or, above the largest measured, extrapolated
 * from the two largest measured t1 < t2. Without the larger neighbour, from RAM, every size between
 * a measured 2 and a measured 32 was judged from 2 alone, too cheap, so each was verified once at
 * about twice the predicted cost before it was known: on chat1, 2 runs in 11 drafted 176-223
 * guesses in 10 steps and ran at 677-895 tok/s against 1074-1458 in the other nine
 * (bench/results/drafting.md, 2026-12-06).
 * Extrapolated, the slope between t1 and t2 carries what the model does not know (the routing's
 * locality, the cache's hits, kernels whose cost per position in a small pass differs from the
 * prompt's).
 * Scaling t2's whole time by the model would charge a loop's verify passes (the same experts
 * again) about twice what they cost; a slope from the one-position pass would charge every further
 * position the jump from the one-row kernels to the many-row ones (bench/results/drafting.md,
 * 2026-12-05). A slope measured below zero (noise) counts as zero: the size is then tried, and
 * measured. Nor is the slope trusted beyond t2's time scaled by the model (whichever is less is
 * taken): between two small sizes it is noisy and steep, and from RAM a noisy 3-position pass (2.6
 * plain ones, against 1.5 for 2) extrapolated 32 positions to 33 plain passes where they cost 13,
 * so no block over 1 guess was ever tried again and a loop was verified one guess a step
 * (bench/results/drafting.md, 2026-12-06). A size judged too cheap costs one pass, which is then
 * measured. */
static double cost_judged(const econ *e, int T)
{
    assert(T >= 1 && T <= GEN_MAX_DRAFT + 1);
    if (e->pass_s[T] > 0)
        return e->pass_s[T];
    int t2 = T - 1, t1, t3 = T + 1;
    while (t2 >= 1 && e->pass_s[t2] <= 0)
        t2--;
    while (t3 <= GEN_MAX_DRAFT + 1 && e->pass_s[t3] <= 0)
        t3++;
    if (t3 <= GEN_MAX_DRAFT + 1) {
        if (t2 < 1)
            return e->pass_s[t3] * shape(e, T) / shape(e, t3);
        double f = (shape(e, T) - shape(e, t2)) / (shape(e, t3) - shape(e, t2));
        return e->pass_s[t2] + f * (e->pass_s[t3] - e->pass_s[t2]);
    }
    if (t2 < 1)
        return 1e-3 * shape(e, T);
    for (t1 = t2 - 1; t1 >= 1 && e->pass_s[t1] <= 0; t1--)
        ;
    double by_model = e->pass_s[t2] * shape(e, T) / shape(e, t2);
    if (t1 < 1)
        return by_model;
    double slope = (e->pass_s[t2] - e->pass_s[t1]) / (shape(e, t2) - shape(e, t1));
    double by_slope = e->pass_s[t2] + (slope > 0 ? slope : 0) * (shape(e, T) - shape(e, t2));
    return by_slope < by_model ? by_slope : by_model;
}

/* the judged costs change only with a measurement: a step reads them from the table (judging them
 * in each of its 31 x drafters lookups took 0.7% of a decode from RAM: bench/results/drafting.md,
 * 2026-12-06, later) */
static void costs_update(econ *e)
{
    compute_shapes(e);
    for (int T = 1; T <= GEN_MAX_DRAFT + 1; T++)
        e->cost[T] = cost_judged(e, T);
}

static double pass_cost(const econ *e, int T)
{
    assert(T >= 1 && T <= GEN_MAX_DRAFT + 1);
    return e->cost[T];
}

int econ_is_free(const econ *e, int d) { return e->asked[d] > 0 && e->propose_s[d] < FREE_SHARE * pass_cost(e, 1); }

/* How acc_at judges a drafter's positions: as measured; optimistically past the first (a free
 * drafter's); or at the upper end of what its few rulings allow, every position (an exploring ask). */
enum { ACC_MEASURED, ACC_FREE, ACC_BOUND };
/* A bound's width: ACC_BOUND_WIDTH / sqrt(rulings + 1), counting at most EMA_SAMPLES rulings (what
 * an EMA of weight EMA is worth: it forgets the rest). Hoeffding's one-sided bound holds with 70%
 * at 0.78 / sqrt(n), with 90% at 1.07 / sqrt(n): this is a likely bound, not a safe one, because
 * an ask it wrongly allows costs a tenth of a pass, within EXPLORE_SHARE. The free drafter's
 * optimism (0.25 at that scale) kept a drafter refused once in its first two offers (0.5 kept by
 * the running mean) from looking worth an ask where a 2-position pass costs 1.77 plain ones (it
 * needs about 0.87). */
static const double ACC_BOUND_WIDTH = 0.8, EMA_SAMPLES = 7;

/* The acceptance of guess j of drafter d's class c, given the guesses before it kept (b: guess
 * j - 1's, as this returned it). A position never ruled on is taken as a little less likely than
 * the one before it (as likely, for a free drafter or a bound). A free drafter's positions past the
 * first are judged optimistically (an upper bound that tightens as rulings come): trying its
 * guesses costs only a wider pass, and they are ruled on less often than the first, which every
 * step's block rules on, verified or not. Its first position is judged as measured: with the
 * bonus, a class kept twice (0.83) looked like 0.98, and a block of 31 was verified on it and
 * refused at its first guess. Without it there, chat from a store ran at 0.98-1.00x of no drafting
 * against 0.96-0.98x, code the same (bench/results/drafting.md, 2026-12-06). */
static double acc_at(const econ *e, int d, int c, int j, int opt, double b)
{
    int n = e->ruled[d][c][j];
    /* a position never ruled on, optimistically, is judged as the one before it: a block's far
     * positions are ruled on only once the text has come that far */
    double a = n ? e->acc[d][c][j] : j ? b * (opt != ACC_MEASURED ? 1.0 : ACC_DECAY) : ACC_PRIOR;
    double seen = n < EMA_SAMPLES ? n : EMA_SAMPLES;
    if (n && opt == ACC_BOUND)
        a += ACC_BOUND_WIDTH / sqrt(seen + 1.0);
    else if (n && j && opt == ACC_FREE)
        a += ACC_OPTIMISM / sqrt(n + 1.0);
    return a < 1 ? a : 1;
}

/* the k <= kmax (0: none) with the most tokens per second for drafter d's guesses of class c, judged
 * as opt says (ACC_MEASURED: as a free drafter's are, ACC_FREE, when d is one), proposing costing
 * `extra`: k guesses bring E(k) = 1 + sum_i prod_{j<=i} acc_at(j) tokens, summed here as k grows;
 * a free drafter's k must beat a plain pass by VERIFY_MARGIN */
static int best_k(const econ *e, int d, int c, int kmax, double extra, int opt, double *rate)
{
    int best = 0;
    double E = 1, run = 1, b = ACC_PRIOR;
    if (opt == ACC_MEASURED && econ_is_free(e, d))
        opt = ACC_FREE;
    *rate = 1.0 / pass_cost(e, 1);
    const double need = opt == ACC_FREE ? (1 + VERIFY_MARGIN) * *rate : *rate;
    for (int k = 1; k <= kmax; k++) {
        b = acc_at(e, d, c, k - 1, opt, b);
        run *= b;
        E += run;
        double r = E / (pass_cost(e, k + 1) + extra);
        if (r > *rate && r > need) {
            *rate = r;
            best = k;
        }
    }
    return best;
}

/* Before drafter d's first ask, from its own estimate of the cost: is learning whether it pays
 * cheap (the first ask's catch-up, a model drafter prefilling the prompt, and the warm-up's asks,
 * at most EXPLORE_SHARE of the plain decode still wanted; its guesses are ruled on unverified, so
 * no pass), and could it pay at all, every guess kept, for some k? Judged instead as a good
 * drafter (0.8 of its guesses kept), DSpark was never asked on chat from a store, where it keeps
 * 0.87-0.98 of its first guesses and, made to draft 6 a step, runs at 1.04-1.63x of no drafting;
 * judged as a perfect one without the bound, both model drafters were warmed up from RAM, where an
 * ask costs one to twenty passes, and chat ran at 0.84x (bench/results/drafting.md, 2026-12-06). */
static int first_ask_pays(const econ *e, int d, int kmax)
{
    drafter *dr = e->dr[d];
    /* its estimate is in the target's passes from RAM: the reads a pass waits on are the target's */
    double p1 = pass_cost(e, 1), compute = p1 * (1 - e->io_frac);
    for (int k = 1; k <= kmax; k++) {
        double once, step = dr->cost(dr, e->n_seq, k, &once);
        double per_token = (pass_cost(e, k + 1) + step * compute) / (k + 1);
        if (per_token < p1 && (once + ECON_WARMUP * step) * compute <= EXPLORE_SHARE * e->remaining * p1)
            return 1;
    }
    return 0;
}

/* Whether drafter d could pay at all: even if every guess were kept, does some k beat a plain
 * pass, its proposing costing what it did? Before it was asked: its own estimate when it gives one
 * (first_ask_pays), else yes. A drafter that cannot is neither warmed up nor probed: its asks are
 * pure cost. */
static int can_pay(const econ *e, int d, int kmax)
{
    if (e->asked[d] == 0)
        return e->dr[d]->cost ? first_ask_pays(e, d, kmax) : 1;
    double plain = 1.0 / pass_cost(e, 1);
    for (int k = 1; k <= kmax; k++)
        if ((k + 1) / (pass_cost(e, k + 1) + e->propose_s[d]) > plain)
            return 1;
    return 0;
}

/* How many guesses to ask drafter d for when k are wanted: all kmax when its estimate says they cost
 * no more (a block drafter makes its block whatever k). The pass verifies what pays of them; the
 * others are ruled on unverified, so every position's acceptance is learnt for the one ask. Asked
 * for one guess while warming up and then for the k its first position's rulings chose, DSpark's
 * later positions stayed at their prior: on chat2 from a store it was verified one guess a step,
 * 1.04x of no drafting, where 6 make 1.34x (bench/results/drafting.md, 2026-12-06). */
static int ask_k(const econ *e, int d, int k, int kmax)
{
    drafter *dr = e->dr[d];
    double once;
    if (k > 0 && k < kmax && dr->cost && dr->cost(dr, e->n_seq, kmax, &once) <= dr->cost(dr, e->n_seq, k, &once))
        return kmax;
    return k;
}

void econ_choose(econ *e, int kmax, int n_seq, int remaining, int *best_d, int *best_k_out, econ_step *st)
{
    const int nd = e->nd;
    *st = (econ_step){0};
    e->step++;
    e->explore_d = -1;
    e->n_seq = n_seq;
    e->remaining = remaining;
    *best_d = -1;
    *best_k_out = 0;
    /* each drafter's best k for its latest class, and its rate. While a free drafter's ruled
     * class pays, a model drafter's warm-up waits: in a loop its asks would be paid for on every
     * step (its guess is ruled on unverified, and generate.c still verifies the free drafter's
     * guesses in that step; before guesses were ruled on unverified, each warm-up step traded a
     * loop's block for one guess: bench/results/drafting.md, 2026-12-05). */
    int kd[GEN_MAX_DRAFTERS], free_pays = 0;
    double rd[GEN_MAX_DRAFTERS];
    for (int d = 0; d < nd; d++) {
        int c = e->last_cls[d];
        kd[d] = best_k(e, d, c, kmax, e->propose_s[d], ACC_MEASURED, &rd[d]);
        free_pays |= econ_is_free(e, d) && e->ruled[d][c][0] >= ECON_WARMUP && kd[d] > 0;
    }
    for (int i = 0; i < nd && !free_pays; i++) { /* warm-up, in turn (a free drafter needs none) */
        int d = (e->turn + i) % nd;
        if (!econ_is_free(e, d) && e->guessed[d] < ECON_WARMUP && e->asked[d] < ECON_WARMUP_ASKS &&
            can_pay(e, d, kmax)) {
            e->turn = d + 1;
            *best_d = d;
            *best_k_out = ask_k(e, d, 1, kmax);
            st->warm = 1;
            return;
        }
    }
    double best = 1.0 / pass_cost(e, 1);
    for (int d = 0; d < nd; d++) {
        if (!can_pay(e, d, kmax)) /* (before its first ask, its propose_s is not known yet) */
            continue;
        int k = kd[d];
        double r = rd[d];
        if (k > 0 && r > best) {
            best = r;
            *best_d = d;
            /* a free drafter is asked for all it has: econ_verify weighs its guesses by the class
             * they turn out to be, not by the last one's */
            *best_k_out = econ_is_free(e, d) ? kmax : ask_k(e, d, k, kmax);
        }
    }
    /* Nothing pays by its estimate: a drafter that might, by the bound of its few rulings, is
     * asked, its guesses ruled on unverified, while such asks cost at most EXPLORE_SHARE of the
     * request so far. An estimate learnt from a few refusals otherwise stood until the next probe,
     * 32 plain steps on: on chat2 from a store DSpark, kept 0.9 of the time, left 15-23 of 128
     * tokens to plain passes (bench/results/drafting.md, 2026-12-06). */
    double bound = best;
    int explore = -1, kx = 0;
    for (int d = 0; d < nd && *best_d < 0; d++) { /* (only when nothing pays) */
        double r;
        int k;
        if (econ_is_free(e, d) || e->asked[d] == 0 || !can_pay(e, d, kmax) ||
            e->explore_s + e->propose_s[d] > EXPLORE_SHARE * e->spent_s)
            continue;
        k = best_k(e, d, e->last_cls[d], kmax, e->propose_s[d], ACC_BOUND, &r);
        if (k > 0 && r > bound) {
            bound = r;
            explore = d;
            kx = k;
        }
    }
    e->explore_d = explore;
    if (explore >= 0) {
        *best_d = explore;
        *best_k_out = ask_k(e, explore, kx, kmax);
        st->explore = 1;
    }
    if (*best_d < 0 && nd > 0 && ++e->since_probe >= e->probe_every) { /* keep acceptance measured, */
        e->since_probe = 0;                                                /* of each drafter in turn */
        for (int i = 0; i < nd && *best_d < 0; i++) {
            int d = (e->probe_turn + i) % nd;
            if (!econ_is_free(e, d) && can_pay(e, d, kmax)) { /* (a free one is asked every step) */
                e->probe_turn = d + 1;
                *best_d = d;
                *best_k_out = ask_k(e, d, 1, kmax);
                st->probe = 1;
            }
        }
    }
    for (int d = 0; d < nd && *best_d < 0; d++) /* nothing else this step: a free drafter's guesses */
        if (econ_is_free(e, d)) {
            *best_d = d;
            *best_k_out = kmax;
        }
    if (*best_d >= 0 && e->guessed[*best_d] < ECON_WARMUP)
        st->warm = 1;
}

void econ_init(econ *e, drafter *const *dr, int nd, int top_k, int n_experts, int streaming)
{
    assert(nd >= 0 && nd <= GEN_MAX_DRAFTERS);
    memset(e, 0, sizeof *e);
    e->dr = dr;
    e->nd = nd;
    for (int T = 1; T <= GEN_MAX_DRAFT + 1; T++) { /* experts a pass of T positions reads, uniform routing */
        double K = top_k, E = n_experts > 0 ? n_experts : 1;
        e->union_ratio[T] = streaming && n_experts > 0 ? E * (1 - pow(1 - K / E, T)) / K : 1.0;
    }
    for (int d = 0; d < nd; d++)
        for (int c = 0; c < DRAFT_CLASSES; c++)
            for (int j = 0; j < GEN_MAX_DRAFT; j++)
                e->acc[d][c][j] = ACC_PRIOR;
    e->probe_every = GEN_PROBE_EVERY;
    e->explore_d = -1;
    costs_update(e);
}

double econ_ask_extra(const econ *e, int d, int n, int k)
{
    assert(d >= 0 && d < e->nd);
    drafter *dr = e->dr[d];
    double once = 0;
    if (e->asked[d] > 0 && e->asked_at[d] >= e->step - 1)
        return 0; /* asked a step ago: catching up with one step is part of what each ask costs */
    if (dr->cost)
        dr->cost(dr, n, k, &once);
    return once * pass_cost(e, 1) * (1 - e->io_frac);
}

void econ_asked(econ *e, int d, double dt, double once, int m, int cls)
{
    assert(d >= 0 && d < e->nd && m >= 0 && cls >= 0 && cls < DRAFT_CLASSES);
    e->spent_s += dt;
    if (d == e->explore_d)
        e->explore_s += dt;
    e->asked_at[d] = e->step;
    ema(&e->propose_s[d], dt - once > 0.25 * dt ? dt - once : 0.25 * dt);
    e->asked[d]++;
    e->guessed[d] += m > 0;
    if (m > 0)
        e->last_cls[d] = cls;
}

int econ_verify(econ *e, int d, int cls, int m, int plain, const econ_step *st)
{
    assert(d >= 0 && d < e->nd && m > 0 && cls >= 0 && cls < DRAFT_CLASSES);
    /* a warm-up's or probe's guess, and a class's first ones, are for learning: plain guesses are
     * ruled on as the target decides their positions (econ_unverified), for nothing more than the
     * ask; others need the pass (one guess tried) */
    if (st->warm || st->probe)
        return plain ? 0 : m;
    if (st->explore) /* (its estimate did not pay) */
        return plain ? 0 : 1;
    if (e->ruled[d][cls][0] < ECON_WARMUP)
        return plain ? 0 : 1;
    double r;
    return best_k(e, d, cls, m, 0.0, ACC_MEASURED, &r);
}

void econ_unverified(econ *e, int d, int cls, int64_t p0, const int32_t *g, int n, int nver, const econ_step *st)
{
    assert(d >= 0 && d < e->nd && cls >= 0 && cls < DRAFT_CLASSES && n <= GEN_MAX_DRAFT && nver >= 0 && nver <= n);
    if (nver == n)
        return;
    econ_shadow *sh = e->sh[d], *end = sh + ECON_SHADOWS;
    while (sh < end && sh->active)
        sh++;
    assert(sh < end); /* (see ECON_SHADOWS) */
    if (sh == end)
        return;
    *sh = (econ_shadow){.active = 1, .cls = cls, .n = n, .nver = nver, .probe = st->probe, .p0 = p0};
    memcpy(sh->g, g, sizeof *g * (size_t)n);
}

double econ_pass_cost(const econ *e, int T)
{
    assert(T >= 1 && T <= GEN_MAX_DRAFT + 1);
    return pass_cost(e, T);
}

void econ_prefilled(econ *e, int positions, int passes, double seconds, double stalled)
{
    assert(positions >= 0 && passes >= 0 && seconds >= 0);
    if (positions >= PREFILL_MIN && passes > 0 && seconds > stalled) {
        e->prefill_pos_s = (seconds - stalled) / positions;
        e->prefill_T = (double)positions / passes;
    }
    costs_update(e);
}

void econ_passed(econ *e, int T, double took, double stalled)
{
    assert(T >= 1 && T <= GEN_MAX_DRAFT + 1);
    ema(&e->pass_s[T], took);
    e->spent_s += took;
    if (T == 1 && took > 0) /* ema's first measurement is taken as it is: averaged from 0, the first
                             * asks waited four steps for io_frac to reach what one pass had shown */
        ema(&e->io_frac, stalled / took < 1 ? stalled / took : 1);
    costs_update(e);
}

void econ_ruled(econ *e, int d, int cls, int j, int kept)
{
    assert(d >= 0 && d < e->nd && cls >= 0 && cls < DRAFT_CLASSES && j >= 0 && j < GEN_MAX_DRAFT);
    double w = 1.0 / (++e->ruled[d][cls][j] + 1); /* a running mean with the prior as one sample, */
    w = w > EMA ? w : EMA;                          /* then the EMA */
    e->acc[d][cls][j] = (1 - w) * e->acc[d][cls][j] + w * kept;
}

/* a probe's next gap: back to `first` when it found guesses kept, else twice as long (at most
 * ECON_PROBE_MAX) */
static int backoff(int gap, int first, int kept)
{
    return kept ? first : gap * 2 < ECON_PROBE_MAX ? gap * 2 : ECON_PROBE_MAX;
}

void econ_decided(econ *e, int64_t pos, int32_t tok)
{
    for (int d = 0; d < e->nd; d++)
        for (econ_shadow *sh = e->sh[d]; sh < e->sh[d] + ECON_SHADOWS; sh++) {
            if (!sh->active)
                continue;
            assert(pos == sh->p0 + sh->j && sh->j < sh->n); /* (every decided token comes, in order) */
            int kept = sh->g[sh->j] == tok;
            if (sh->j >= sh->nver) { /* (the pass ruled on the first nver) */
                econ_ruled(e, d, sh->cls, sh->j, kept);
                e->shadow_ruled[d]++;
                if (sh->probe && sh->j == sh->nver)
                    e->probe_every = backoff(e->probe_every, GEN_PROBE_EVERY, kept);
            }
            sh->j++;
            sh->active = kept && sh->j < sh->n;
        }
}
