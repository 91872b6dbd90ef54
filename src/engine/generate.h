/* generate.h — the decode loop: bring the session to the prompt (session_sync: reusing what it
 * holds), then pick, emit, and feed one token at a time until max_new tokens or a stop id.
 * Speculative decoding will slot in here (a drafter proposes, one verify pass, session_commit);
 * today every token costs one pass. */
#ifndef DF_ENGINE_GENERATE_H
#define DF_ENGINE_GENERATE_H

#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"

typedef struct gen_stats {
    int n_prompt, n_gen;
    int n_reused;       /* prompt positions session_sync did not recompute */
    double t_prefill;   /* seconds spent on the prompt */
    double t_first;     /* seconds from start to the first generated token */
    double t_decode;    /* seconds spent generating after the first token */
} gen_stats;

typedef struct gen_req {
    const int32_t *prompt;
    int n_prompt;
    int max_new;
    const int32_t *stop; /* generation ends after emitting one of these */
    int n_stop;
} gen_req;

/* Called for each generated token; a non-zero return stops generation (that is not an error). */
typedef int (*gen_token_fn)(void *ud, int32_t id);

int gen_run(session *s, sampler *sm, const gen_req *rq, gen_token_fn cb, void *ud, gen_stats *st, errbuf *err);

#endif
