/* generate.h — the decode loop: bring the session to the prompt (session_sync: reusing what it
 * holds), then decide, emit and feed tokens until max_new or a stop id, with or without drafting.
 *
 * With drafters, each step chooses one and how many tokens it guesses (k, 0: plain decode) to
 * get the most tokens per second (the economics below), runs one verify pass over the anchor (the
 * newest decided token) and the k guesses, keeps the agreeing prefix and adds the target's own
 * next token, then keeps the pass in part (session_commit). Greedy: a guess is kept while it is
 * the target's argmax. Sampling: a plain guess (no distribution: n-gram, Qwen, DSpark) is kept
 * when it is the token the target draws at its position (sample-and-match); a guess d drawn from
 * a distribution q is kept when u < p(d) / q(d), otherwise the target's token is drawn from
 * norm(max(p - q, 0)); when every guess is kept a bonus token is drawn from the last row. Each
 * token's random numbers come from (seed, its position), so the result is distributed exactly as
 * the target's; with plain guesses, sampled output is the very tokens a plain decode with the same
 * seed gives, and greedy output, with the logits of every emitted position, is bit for bit a plain
 * decode's.
 *
 * Economics: expected tokens of a step with k guesses, E(k) = 1 + sum_i prod_{j<=i} a_j, from the
 * acceptance a_j measured per drafter, per class of its guesses (draft.h: cls) and per position in
 * the block (a position not yet ruled on is taken as a little less likely than the one before,
 * as likely for a free drafter); its cost, the measured time of a pass of k + 1 positions, or,
 * before that size ran, interpolated between the measured sizes around it, or, above the largest,
 * extrapolated from the two largest measured along a model (the part spent waiting on reads grows
 * with the union of the experts the positions route to, uniform routing, the rest as the power of
 * the positions that a plain pass and the prompt's passes measured) and no dearer than the model
 * scales the largest measured one, plus
 * the drafter's own time.
 * The step takes the drafter and k with the best E(k) / cost (a free drafter's by a 5% margin over
 * a plain pass); the guesses it returns are verified only as far as their class pays. Plain guesses a pass does not verify are ruled on as the target
 * decides their positions (what a verify would have ruled), so a class's first guesses, a model
 * drafter's warm-up (one guess a step, or a block drafter's whole block, for ECON_WARMUP steps
 * that had guesses, only in steps where no free drafter's guesses pay), its asks while it might pay
 * by the bound of its few rulings (at most 2% of the request so far) and its probes (the same
 * every GEN_PROBE_EVERY steps when no drafter beats plain decode, twice as seldom after each
 * refused) cost asks, not verify passes. A drafter that could not pay even if every guess were
 * kept, or whose first asks would cost over 2% of the decode still wanted, is neither warmed up
 * nor probed; one
 * that costs next to nothing (the n-gram one) is asked for all it has every step and judged
 * optimistically (docs/drafting.md). The economics itself is econ.h's.
 */
#ifndef DF_ENGINE_GENERATE_H
#define DF_ENGINE_GENERATE_H

#include <stdint.h>

#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/sampler.h"

enum { GEN_MAX_DRAFT = 31, GEN_MAX_DRAFTERS = 4, GEN_PROBE_EVERY = 32 };

typedef struct gen_draft_stats {
    const char *name;
    uint64_t steps, proposed, accepted;
    uint64_t ruled_unverified; /* guesses not verified, ruled on as the target decided their positions */
    uint64_t by_pos_tried[GEN_MAX_DRAFT], by_pos_kept[GEN_MAX_DRAFT]; /* acceptance by position in the block */
    double propose_s;
} gen_draft_stats;

typedef struct gen_stats {
    int n_prompt, n_gen;
    int n_reused;       /* prompt positions session_sync did not recompute */
    double t_prefill;   /* seconds spent on the prompt */
    double t_first;     /* seconds from start to the first generated token */
    double t_decode;    /* seconds spent generating after the first token */
    uint64_t passes;    /* decode passes (plain and verify) */
    double predicted_s, measured_s; /* the economics' cost of the passes it chose, and their time */
    int n_drafters;
    gen_draft_stats draft[GEN_MAX_DRAFTERS];
} gen_stats;

typedef struct gen_req {
    const int32_t *prompt;
    int n_prompt;
    int max_new;
    const int32_t *stop; /* generation ends after emitting one of these */
    int n_stop;
    drafter *const *drafters; /* candidates for each step ("auto": several), or none */
    int n_drafters;
    int draft_max;       /* the most guesses a step makes (capped by the session's commit log) */
    int fixed;           /* 1: no economics: every step drafts draft_max, the drafters in turn (tests, and
                            measuring acceptance) */
    /* Optional: called after the tokens of each step are emitted (the first token is a step of its
     * own; a verify step emits its kept guesses and the target's token), so a caller can send them
     * as one piece (the server: one chunk per step). A non-zero return stops generation (not an
     * error), before another pass runs. */
    int (*step_done)(void *ud);
} gen_req;

/* Called for each generated token; a non-zero return stops generation (that is not an error). */
typedef int (*gen_token_fn)(void *ud, int32_t id);
/* Optional: the logits [vocab] that decided the token at `pos`, as each is emitted (tests). */
typedef void (*gen_logits_fn)(void *ud, int64_t pos, const float *logits);

int gen_run(session *s, sampler *sm, const gen_req *rq, gen_token_fn cb, gen_logits_fn lcb, void *ud, gen_stats *st,
            errbuf *err);

#endif
