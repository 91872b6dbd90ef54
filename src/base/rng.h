/* rng.h — a small, seedable, portable random generator (xoshiro256**, seeded by splitmix64).
 * Same seed, same sequence on every machine: sampling with --seed is reproducible. */
#ifndef DF_BASE_RNG_H
#define DF_BASE_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

void rng_seed(rng *r, uint64_t seed);
uint64_t rng_next(rng *r);
/* Uniform in [0, 1) with 24 random bits (exactly representable as float). */
float rng_uniform(rng *r);
/* A uniform in [0, 1) with 24 random bits that depends only on (seed, pos, stream): a counter-based
 * draw, so a sampled token's random number is the same however many passes produced it. */
float rng_uniform_at(uint64_t seed, uint64_t pos, uint64_t stream);
/* Standard normal (Box-Muller), for synthetic weights. */
double rng_normal(rng *r);

#endif
