/* test_alloc.c — the decode step allocates nothing: malloc and friends are wrapped at link time
 * for the test binary (-Wl,--wrap=...) and counted; after a session is set up and the prompt
 * prefilled, decoding tokens (forward + sampling) must not call them once — also when every
 * layer's spine and most experts stream through the weight store. */
#include <stdatomic.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "store/store.h"
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

long tu_alloc_count(void) { return atomic_load(&n_alloc); }

/* a session with room for 64 positions, passes of 8, a commit log, and checkpoints */
static const session_opts so_decode = {.context = 64, .max_pass = 8, .max_logits = 8, .max_commit = 8,
                                       .ckpt_budget = 1 << 24, .ckpt_every = 4};

/* with `stream`, through a store that streams every spine and keeps 8 expert slots */
static void decode_allocates_nothing(const char *dir, double temperature, int stream)
{
    errbuf err;
    model m;
    store *st = NULL;
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    if (stream) {
        blob_table bt;
        CHECKF(blob_table_build(&bt, &m, &err) == 0, "%s", err.msg);
        store_cfg c;
        memset(&c, 0, sizeof c);
        io_cfg_default(&c.io);
        c.prefetch = c.verify = c.spine_stream_all = 1;
        uint64_t slot = 0; /* the globals, two slots of the largest layer spine, 8 experts */
        for (int i = 0; i < bt.n_layers; i++)
            if (blob_padded(bt.b[bt.layer_blob[i]].size) > slot)
                slot = blob_padded(bt.b[bt.layer_blob[i]].size);
        c.ram_budget = bt.b[bt.global_blob].size + STORE_SPINE_SLOTS * slot + 8 * blob_padded(bt.max_expert);
        CHECKF(store_open(&st, &m, &bt, NULL, &c, &err) == 0, "%s", err.msg);
        CHECK(store_plan_get(st)->spine_streamed == m.hp.n_layers && store_slots(st) == 8);
    }
    engine *e = tu_engine(&m, st, 2, NULL, &err);
    session *s = NULL;
    sampler sm;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = (float)temperature;
    sc.top_p = 0.9f;
    int32_t prompt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    CHECKF(e, "%s", err.msg);
    CHECKF(session_new(e, &so_decode, &s, &err) == 0, "%s", err.msg);
    CHECK(sampler_init(&sm, &sc, m.hp.vocab, &err) == 0);
    CHECK(session_sync(s, prompt, 8, &err) == 0);
    const float *logits = session_last_logits(s);
    long before = atomic_load(&n_alloc);
    for (int i = 0; i < 16; i++) {
        int32_t id = sampler_pick(&sm, logits, session_len(s));
        session_pass pass = {.tokens = &id, .T = 1, .n_logits = 1};
        CHECK(session_run(s, &pass, &err) == 0);
        logits = session_logits(s, 0);
    }
    /* a verify-shaped pass kept in part, as speculative decoding does */
    int32_t three[3] = {13, 14, 15};
    session_pass vp = {.tokens = three, .T = 3, .n_logits = 3};
    CHECK(session_run(s, &vp, &err) == 0 && session_commit(s, 1, &err) == 0);
    long after = atomic_load(&n_alloc);
    store_stats ss;
    if (st)
        store_stats_get(st, &ss);
    sampler_free(&sm);
    session_free(s);
    engine_free(e);
    store_free(st);
    CHECKF(!st || (ss.spine_reads > 0 && ss.reads > 0), "nothing was streamed");
    model_free(&m);
    CHECKF(after == before, "%s: %ld allocations during 16 decode steps and a partial commit", dir, after - before);
    CHECKF(before > 0, "the allocation counter is not wired in (no allocation seen at all)");
}

TEST(alloc_decode_default_model) { decode_allocates_nothing("models/default", 0.0, 0); }
TEST(alloc_decode_sampling) { decode_allocates_nothing("models/default", 0.8, 0); }
TEST(alloc_decode_deepseek) { decode_allocates_nothing(test_data("oracle/deepseek_v3-yarn"), 0.0, 0); }
TEST(alloc_decode_qwen3_moe) { decode_allocates_nothing(test_data("oracle/qwen3_moe-a"), 0.0, 0); }
TEST(alloc_decode_streamed) { decode_allocates_nothing("models/default", 0.0, 1); }
