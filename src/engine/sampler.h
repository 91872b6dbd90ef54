/* sampler.h — choosing the next token from logits.
 *
 * temperature 0 is greedy: the argmax, lowest id on ties (exact and reproducible). Otherwise
 * the logits are divided by the temperature, softmaxed, filtered by top-k, top-p (nucleus) and
 * min-p (relative to the most likely token), renormalised, and sampled. The random number for
 * the token at position p is rng_uniform_at(seed, p, 0): it depends on nothing but the seed and
 * the position, so a continuation is the same whether it was produced one position per pass,
 * several at once, or with a drafter's guesses verified in between; and the same on every
 * machine. Without filters nothing is sorted; with them, a heap keeps top-k and an in-place
 * heapsort orders the rest. Degenerate logits (NaN, infinite) fall back to the argmax.
 * Buffers are reserved at init; sampler_pick allocates nothing.
 */
#ifndef DF_ENGINE_SAMPLER_H
#define DF_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/err.h"
#include "base/rng.h"

typedef struct sampler_cfg {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
} sampler_cfg;

typedef struct sampler {
    sampler_cfg cfg;
    int vocab;
    struct sampler_cand {
        float p;
        int id;
    } *cand;    /* [vocab]; after sampler_dist, [0..n) the candidates (unnormalised: sum total) */
    int n;
    double total;
} sampler;

/* The streams of rng_uniform_at(seed, position, stream) a token's randomness comes from: the draw
 * of a plain pick, a drafted token's acceptance test, and the draw after a rejection. */
enum { SAMPLER_STREAM_PICK = 0, SAMPLER_STREAM_ACCEPT = 1, SAMPLER_STREAM_RESIDUAL = 2, SAMPLER_STREAM_DRAFT = 3 };

void sampler_cfg_default(sampler_cfg *c);
int sampler_init(sampler *s, const sampler_cfg *cfg, int vocab, errbuf *err);
void sampler_free(sampler *s);
/* The token for position pos (the index it will have in the sequence) from its logits. */
int32_t sampler_pick(sampler *s, const float *logits, int64_t pos);
/* The distribution sampler_pick draws from (temperature, filters): the candidates in s->cand[0..n),
 * greedy a single one; returns n. sampler_prob is a token's probability in it (0 when filtered
 * out). sampler_draw picks from it with a uniform number; sampler_draw_residual from
 * norm(max(p - q, 0)), q a drafter's distribution [vocab] or, when NULL, all of its mass on
 * `point` (a guess: n-gram, or a draft from another tokenizer). Speculative sampling: accept a
 * draft d when u < p(d) / q(d), else draw the residual: the result is distributed as p. */
int sampler_dist(sampler *s, const float *logits);
double sampler_prob(const sampler *s, int32_t id);
int32_t sampler_draw(const sampler *s, float u01);
int32_t sampler_draw_residual(const sampler *s, const float *q, int32_t point, float u01);
/* Index of the largest value, lowest index on ties. */
int32_t sampler_argmax(const float *v, int n);

#endif
