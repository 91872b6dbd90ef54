/* econ.h — the decode loop's economics (generate.h states the model): what it has measured of pass
 * times and of each drafter's acceptance, and the choices it makes from them. generate.c drives
 * it step by step; it reads no clock and runs no pass, so a test can drive it with costs and
 * rulings of its own (tests/test_econ.c).
 *
 * Before the first step, econ_prefilled: what the prompt's passes took. A step, in order:
 *   econ_choose      the drafter (-1: none) and the k to ask it for;
 *   econ_asked       what the ask cost and returned (for every drafter asked in the step);
 *   econ_verify      how many of the m guesses the pass verifies: as far as their class pays, none
 *                    of plain guesses during a warm-up, a probe, an exploring ask or a class's
 *                    first rulings;
 *   econ_unverified  the plain guesses it did not verify, to be ruled on as their positions are
 *                    decided (each ruling what a verify would have given, for the cost of asking);
 *   econ_passed      the pass's measured time and the part of it spent stalled on reads;
 *   econ_ruled       each verified guess's ruling, in order, up to the first refused;
 *   econ_decided     each token the step emitted, in order of position.
 * Invariants: 0 <= d < n_drafters wherever a drafter is named; 1 <= T <= GEN_MAX_DRAFT + 1. */
#ifndef DF_ENGINE_ECON_H
#define DF_ENGINE_ECON_H

#include "engine/draft.h"
#include "engine/generate.h"

/* Warm-up: each drafter is asked for one guess (a block drafter, whose estimate says more cost no
 * more, for all kmax) until ECON_WARMUP steps had guesses from it, or it was asked
 * ECON_WARMUP_ASKS times (a drafter that seldom guesses, as the n-gram one on new text,
 * costs nothing when it has none). A class's guesses are verified once ECON_WARMUP of its first
 * guesses were ruled on. */
enum { ECON_WARMUP = 2, ECON_WARMUP_ASKS = 64, ECON_PROBE_MAX = 512 };

/* A block of a drafter's plain guesses that a pass did not verify in full: g[0 .. n) guessed for
 * positions p0 .. p0 + n - 1, the first nver verified (ruled on by the pass). As the target decides
 * those positions, guess j (j >= nver) is ruled kept when it is the token decided there, as long
 * as the ones before it were: exactly what a verify pass would have ruled, greedy or sampled (a
 * plain guess is kept when it is the target's token at its position). Every step's block is ruled
 * on, as a verified one would be: a block lives at most GEN_MAX_DRAFT decided tokens, and a step
 * decides at least one, so ECON_SHADOWS blocks a drafter always suffice. */
enum { ECON_SHADOWS = GEN_MAX_DRAFT + 1 };
typedef struct econ_shadow {
    int active, cls, n, nver, j; /* j: the next guess to compare */
    int probe;                   /* a probe's: its first ruling sets how soon the next comes */
    int64_t p0;
    int32_t g[GEN_MAX_DRAFT];
} econ_shadow;

typedef struct econ {
    double pass_s[GEN_MAX_DRAFT + 2]; /* EMA of a pass's seconds by its size T, 0: not measured */
    double cost[GEN_MAX_DRAFT + 2];   /* a pass's judged seconds by T (econ.c: cost_judged) */
    double io_frac;                   /* share of a one-position pass spent waiting on reads */
    double prefill_pos_s;             /* the prompt's compute seconds per position (0: not measured) */
    double prefill_T;                 /* the prompt's positions per pass */
    double comp[GEN_MAX_DRAFT + 2];   /* a pass's compute by T, in one position's (econ.c: compute_shapes) */
    double comp_a;                    /* the power comp was made with */
    double union_ratio[GEN_MAX_DRAFT + 2]; /* experts T positions read / those one reads (uniform routing) */
    /* by drafter, class of its guesses (draft.h: cls) and block position j: */
    double acc[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT]; /* EMA of keeping guess j, given the ones before */
    int ruled[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT];  /* guesses at position j ruled on */
    econ_shadow sh[GEN_MAX_DRAFTERS][ECON_SHADOWS]; /* by drafter: its blocks being ruled unverified */
    int shadow_ruled[GEN_MAX_DRAFTERS]; /* rulings made that way */
    int last_cls[GEN_MAX_DRAFTERS];                 /* the class of its latest guesses */
    double propose_s[GEN_MAX_DRAFTERS];
    int asked[GEN_MAX_DRAFTERS], guessed[GEN_MAX_DRAFTERS]; /* steps that asked it, and that got guesses */
    drafter *const *dr; /* the request's drafters (their cost estimates) */
    int nd;
    int n_seq, remaining; /* this step's sequence length, and the tokens still wanted */
    int turn;             /* the next drafter to warm up */
    int probe_turn;       /* the next drafter to probe */
    int since_probe, probe_every;
    double spent_s;   /* the request's passes and asks so far */
    double explore_s; /* of which asks made to explore (econ_step.explore) */
    int explore_d;    /* the drafter this step asks to explore, or -1 */
    int step;         /* steps chosen */
    int asked_at[GEN_MAX_DRAFTERS]; /* the step of each drafter's latest ask */
} econ;

/* What a step decided beyond the drafter and k. */
typedef struct econ_step {
    int probe; /* a probe of a drafter that does not pay */
    int warm;  /* the drafter's warm-up */
    int explore; /* an ask of a drafter that does not pay by its estimate but might by its bound */
} econ_step;

/* top_k of n_experts routed per position; streaming: the experts come from a store (a pass's
 * reads then grow with the union of its positions' experts) */
void econ_init(econ *e, drafter *const *dr, int nd, int top_k, int n_experts, int streaming);
/* this step's drafter (-1: none) and k, for a sequence of n_seq tokens with `remaining` wanted */
void econ_choose(econ *e, int kmax, int n_seq, int remaining, int *d, int *k, econ_step *st);
int econ_is_free(const econ *e, int d);
/* the seconds an ask now spends catching up with what the drafter has not seen, by the drafter's
 * estimate (a model drafter's first ask prefills the prompt, an ask after a gap the tokens decided
 * since; DSpark makes its waiting context rows); 0 when it was asked a step ago, whose catch-up is
 * part of what every ask costs */
double econ_ask_extra(const econ *e, int d, int n, int k);
/* drafter d's ask took dt seconds (once of them its catch-up) and returned m guesses of class cls */
void econ_asked(econ *e, int d, double dt, double once, int m, int cls);
/* how many of drafter d's m guesses of class cls the pass verifies (0: a plain pass); plain: they
 * are plain guesses (no distribution), which econ_unverified can rule on without a pass */
int econ_verify(econ *e, int d, int cls, int m, int plain, const econ_step *st);
/* drafter d's plain guesses g[0 .. n) of class cls for positions p0 .., of which the pass verifies
 * the first nver: the rest are ruled on by econ_decided */
void econ_unverified(econ *e, int d, int cls, int64_t p0, const int32_t *g, int n, int nver, const econ_step *st);
/* the prompt's `passes` ran `positions` in `seconds`, `stalled` of them waiting on reads: how their
 * compute compares with a plain pass's judges a pass of a size not yet run (from RAM on the bundled
 * model a pass of 3 cost 2.7-3.1 plain ones, where the fixed COMPUTE_PER_POS said 1.3) */
void econ_prefilled(econ *e, int positions, int passes, double seconds, double stalled);
/* the predicted seconds of a pass of T positions */
double econ_pass_cost(const econ *e, int T);
void econ_passed(econ *e, int T, double took, double stalled);
void econ_ruled(econ *e, int d, int cls, int j, int kept);
/* the target decided token tok at position pos (every emitted token, in order) */
void econ_decided(econ *e, int64_t pos, int32_t tok);

#endif
