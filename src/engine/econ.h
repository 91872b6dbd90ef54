/* econ.h — the decode loop's economics (generate.h states the model): what it has measured of pass
 * times and of each drafter's acceptance, and the choices it makes from them. generate.c drives
 * it step by step; it reads no clock and runs no pass, so a test can drive it with costs and
 * rulings of its own (tests/test_econ.c).
 *
 * A step, in order:
 *   econ_choose      the drafter (-1: none) and the k to ask it for;
 *   econ_asked       what the ask cost and returned (for every drafter asked in the step);
 *   econ_verify      how many of the m guesses the pass verifies: as far as their class pays;
 *                    a class of a free drafter that does not pay gets one guess tried now and then
 *                    (a class probe), since two unlucky first rulings would otherwise shut it out
 *                    for the whole reply;
 *   econ_passed      the pass's measured time and the part of it spent stalled on reads;
 *   econ_ruled       each guess's ruling, in order, up to the first refused;
 *   econ_step_done   the step's end: probes learn whether to come back soon.
 * Invariants: 0 <= d < n_drafters wherever a drafter is named; 1 <= T <= GEN_MAX_DRAFT + 1. */
#ifndef DF_ENGINE_ECON_H
#define DF_ENGINE_ECON_H

#include "engine/draft.h"
#include "engine/generate.h"

/* Warm-up: each drafter drafts one guess (the cheapest verify) until ECON_WARMUP steps had guesses
 * from it, or it was asked ECON_WARMUP_ASKS times (a drafter that seldom guesses, as the n-gram
 * one on new text, costs nothing when it has none). Class probes: after ECON_CLASS_PROBE offers of
 * a free drafter's class that did not pay, then twice as many after each probe refused. */
enum { ECON_WARMUP = 2, ECON_WARMUP_ASKS = 64, ECON_PROBE_MAX = 512, ECON_CLASS_PROBE = 8 };

typedef struct econ {
    double pass_s[GEN_MAX_DRAFT + 2]; /* EMA of a pass's seconds by its size T, 0: not measured */
    double io_frac;                   /* share of a one-position pass spent waiting on reads */
    double union_ratio[GEN_MAX_DRAFT + 2]; /* experts T positions read / those one reads (uniform routing) */
    /* by drafter, class of its guesses (draft.h: cls) and block position j: */
    double acc[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT]; /* EMA of keeping guess j, given the ones before */
    int ruled[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT];  /* guesses at position j ruled on */
    int offers[GEN_MAX_DRAFTERS][DRAFT_CLASSES];    /* a free class's offers not verified since its last probe */
    int offer_gap[GEN_MAX_DRAFTERS][DRAFT_CLASSES]; /* offers between its probes */
    int last_cls[GEN_MAX_DRAFTERS];                 /* the class of its latest guesses */
    double propose_s[GEN_MAX_DRAFTERS];
    int asked[GEN_MAX_DRAFTERS], guessed[GEN_MAX_DRAFTERS]; /* steps that asked it, and that got guesses */
    drafter *const *dr; /* the request's drafters (their cost estimates) */
    int nd;
    int n_seq, remaining; /* this step's sequence length, and the tokens still wanted */
    int turn;             /* the next drafter to warm up */
    int probe_turn;       /* the next drafter to probe */
    int since_probe, probe_every;
} econ;

/* What a step decided beyond the drafter and k: flags econ_step_done needs back. */
typedef struct econ_step {
    int probe;       /* a probe of a drafter that does not pay */
    int warm;        /* the drafter's warm-up */
    int class_probe; /* econ_verify tried one guess of a class that does not pay */
} econ_step;

/* top_k of n_experts routed per position; streaming: the experts come from a store (a pass's
 * reads then grow with the union of its positions' experts) */
void econ_init(econ *e, drafter *const *dr, int nd, int top_k, int n_experts, int streaming);
/* this step's drafter (-1: none) and k, for a sequence of n_seq tokens with `remaining` wanted */
void econ_choose(econ *e, int kmax, int n_seq, int remaining, int *d, int *k, econ_step *st);
int econ_is_free(const econ *e, int d);
/* the seconds of a first ask's catch-up, by the drafter's estimate (0 after its first ask) */
double econ_first_ask_extra(const econ *e, int d, int n, int k);
/* drafter d's ask took dt seconds (once of them its catch-up) and returned m guesses of class cls */
void econ_asked(econ *e, int d, double dt, double once, int m, int cls);
/* how many of drafter d's m guesses of class cls the pass verifies (0: a plain pass) */
int econ_verify(econ *e, int d, int cls, int m, econ_step *st);
/* the predicted seconds of a pass of T positions */
double econ_pass_cost(const econ *e, int T);
void econ_passed(econ *e, int T, double took, double stalled);
void econ_ruled(econ *e, int d, int cls, int j, int kept);
/* the step's end: m guesses verified, `kept` of them kept */
void econ_step_done(econ *e, int d, int cls, int m, int kept, const econ_step *st);

#endif
