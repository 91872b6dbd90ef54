/* test_alloc.c — the decode step allocates nothing: malloc and friends are wrapped at link time
 * for the test binary (-Wl,--wrap=...) and counted; after a session is set up and the prompt
 * prefilled, decoding tokens (forward + sampling) must not call them once. */
#include <stdatomic.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "test.h"
#include "test_util.h"

static _Atomic long n_alloc;

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t al, size_t n);
void *__real_aligned_alloc(size_t al, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t al, size_t n);
void *__wrap_aligned_alloc(size_t al, size_t n);

void *__wrap_malloc(size_t n)
{
    atomic_fetch_add(&n_alloc, 1);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t a, size_t b)
{
    atomic_fetch_add(&n_alloc, 1);
    return __real_calloc(a, b);
}
void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add(&n_alloc, 1);
    return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t al, size_t n)
{
    atomic_fetch_add(&n_alloc, 1);
    return __real_posix_memalign(p, al, n);
}
void *__wrap_aligned_alloc(size_t al, size_t n)
{
    atomic_fetch_add(&n_alloc, 1);
    return __real_aligned_alloc(al, n);
}

static void decode_allocates_nothing(const char *dir, double temperature)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    pool *p = pool_new(2, &err);
    session s;
    sampler sm;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = (float)temperature;
    sc.top_p = 0.9f;
    float *logits = malloc(sizeof(float) * (size_t)m.hp.vocab);
    int32_t prompt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    CHECK(p && logits);
    CHECKF(session_init(&s, &m, kern_select(NULL), p, 64, 8, &err) == 0, "%s", err.msg);
    CHECK(sampler_init(&sm, &sc, m.hp.vocab, &err) == 0);
    CHECK(session_forward(&s, prompt, 8, logits, 0, &err) == 0);
    long before = atomic_load(&n_alloc);
    for (int i = 0; i < 16; i++) {
        int32_t id = sampler_pick(&sm, logits);
        CHECK(session_forward(&s, &id, 1, logits, 0, &err) == 0);
    }
    long after = atomic_load(&n_alloc);
    sampler_free(&sm);
    session_free(&s);
    pool_free(p);
    free(logits);
    model_free(&m);
    CHECKF(after == before, "%s: %ld allocations during 16 decode steps", dir, after - before);
    CHECKF(before > 0, "the allocation counter is not wired in (no allocation seen at all)");
}

TEST(alloc_decode_default_model) { decode_allocates_nothing("models/default", 0.0); }
TEST(alloc_decode_sampling) { decode_allocates_nothing("models/default", 0.8); }
TEST(alloc_decode_deepseek) { decode_allocates_nothing(test_data("oracle/deepseek_v3-yarn"), 0.0); }
TEST(alloc_decode_qwen3_moe) { decode_allocates_nothing(test_data("oracle/qwen3_moe-a"), 0.0); }
