/* test_exact.c — the exactness matrix: logits are bit-identical (memcmp) whatever the prefill
 * chunk, the number of tokens per pass, the thread count, the instruction set, or prefix reuse
 * through a checkpoint. Runs on one case of every family (K3, Kimi-Linear, DeepSeek with
 * YaRN, Qwen3, Qwen3-MoE, the FP8 and INT4 releases) and on the bundled default model. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "model/moe_route.h"
#include "test_util.h"

/* The longest prompt of a case (its ids), or n tokens counting up for the default model. */
static int32_t *case_ids(const char *dir, int vocab, int *n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_t *exp = json_load_file(path, 0, NULL);
    int32_t *ids;
    if (!exp) {
        *n = 40;
        ids = malloc(sizeof *ids * 40);
        for (int i = 0; i < 40; i++)
            ids[i] = (int32_t)((i * 7919 + 3) % vocab);
        return ids;
    }
    json_t *best = NULL, *prompts = json_object_get(exp, "prompts");
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_object_get(json_array_get(prompts, i), "ids");
        if (!best || json_array_size(p) > json_array_size(best))
            best = p;
    }
    *n = (int)json_array_size(best);
    if (*n > 48)
        *n = 48; /* long enough to cross chunk and AttnRes-block boundaries, quick to run */
    ids = malloc(sizeof *ids * (size_t)*n);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(best, (size_t)i));
    json_decref(exp);
    return ids;
}

static void matrix(const char *dir)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    int n, V = m.hp.vocab;
    int32_t *ids = case_ids(dir, V, &n);
    size_t bytes = sizeof(float) * (size_t)n * V;
    float *ref = tu_eval(&m, ids, n, n, 2, NULL, &err);
    CHECKF(ref, "%s: %s", dir, err.msg);
    struct {
        const char *what;
        int chunk, threads;
        const kern_ops *k;
    } runs[] = {
        {"chunks of 1 (token-by-token decode)", 1, 2, NULL},
        {"chunks of 3", 3, 2, NULL},
        {"chunks of 7", 7, 2, NULL},
        {"1 thread", n, 1, NULL},
        {"3 threads, chunks of 5", 5, 3, NULL},
        {"scalar kernels", n, 2, &kern_scalar},
        {"avx2 kernels", n, 2, kern_avx2()},
        {"avx512 kernels", n, 2, kern_avx512()},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (strstr(runs[r].what, "kernels") && !runs[r].k)
            continue; /* not on this CPU */
        float *got = tu_eval(&m, ids, n, runs[r].chunk, runs[r].threads, runs[r].k, &err);
        int same = got && memcmp(got, ref, bytes) == 0;
        free(got);
        if (!same) {
            test_fail(__FILE__, __LINE__, "%s: logits with %s differ from one %d-token pass", dir, runs[r].what, n);
            break;
        }
    }
    /* prefix reuse: sync to the first half, wander off, sync to the whole: the checkpoint at n/2
     * serves the second sync, and every position's logits are those of the single pass */
    if (!test_failed()) {
        engine *e = tu_engine(&m, NULL, 2, NULL, &err);
        session_opts so;
        session_opts_default(&so);
        so.context = n;
        so.max_pass = n;
        session *s = NULL;
        int h = n / 2, ok = e && session_new(e, &so, &s, &err) == 0;
        int32_t *wander = malloc(sizeof *wander * (size_t)(h + 4));
        memcpy(wander, ids, sizeof *ids * (size_t)h);
        for (int i = 0; i < 4; i++)
            wander[h + i] = (int32_t)(1 + i);
        ok = ok && session_sync(s, ids, h, &err) == 0 && session_sync(s, wander, h + 4, &err) == 0;
        ok = ok && session_sync(s, ids, n, &err) == 0;
        session_stats st;
        if (ok)
            session_stats_get(s, &st);
        if (!ok)
            test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
        else if (memcmp(session_last_logits(s), ref + (size_t)(n - 1) * V, sizeof(float) * (size_t)V) != 0)
            test_fail(__FILE__, __LINE__, "%s: logits after a sync that reused %llu positions differ", dir,
                      (unsigned long long)st.reused);
        else if (st.reused < 2 * (uint64_t)h)
            test_fail(__FILE__, __LINE__, "%s: the syncs reused %llu positions, expected at least %d", dir,
                      (unsigned long long)st.reused, 2 * h);
        free(wander);
        session_free(s);
        engine_free(e);
    }
    free(ref);
    free(ids);
    model_free(&m);
}

static void oracle_case(const char *name)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", test_data("oracle"), name);
    matrix(dir);
}

TEST(exact_kimi_k3) { oracle_case("kimi_k3-b"); }
TEST(exact_kimi_k3_attnres2) { oracle_case("kimi_k3-a"); }
TEST(exact_kimi_linear) { oracle_case("kimi_linear-a"); }
TEST(exact_deepseek_yarn) { oracle_case("deepseek_v3-yarn"); }
TEST(exact_deepseek_fp8) { oracle_case("deepseek_v3-fp8"); }
TEST(exact_kimi_k2_int4) { oracle_case("kimi_k2-int4"); }
TEST(exact_qwen3) { oracle_case("qwen3-a"); }
TEST(exact_qwen3_moe) { oracle_case("qwen3_moe-a"); }
TEST(exact_default_model) { matrix("models/default"); }

/* The GPU router (cuda_blk.cu's k_route) keeps the experts of rank below k in moe_before's order
 * instead of running moe_topk: the same experts whenever no value is NaN. Random choices drawn from
 * a few values (ties), with -inf (grouped routing's dropped groups) and both zeros, every k. */
TEST(exact_moe_rank_pick_is_moe_topk)
{
    static const float vals[] = {0.25f, 0.5f, 0.5f, -0.0f, 0.0f, 1.0f, -INFINITY, 0.125f, 3.0f, -2.0f};
    uint32_t r = 12345;
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + trial % 97;
        float v[97];
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            v[i] = trial % 3 ? vals[(r >> 16) % 10] : (float)((r >> 8) & 0xFFFF) / 65536.0f;
        }
        for (int k = 1; k <= n; k += 1 + n / 9) {
            int ref[97], got[97], m = 0;
            moe_topk(v, n, k, ref);
            moe_sort_ids(ref, k);
            for (int e = 0; e < n; e++) {
                int rank = 0;
                for (int i = 0; i < n; i++)
                    rank += moe_before(v, i, e);
                if (rank < k)
                    got[m++] = e;
            }
            CHECKF(m == k && memcmp(ref, got, sizeof(int) * (size_t)k) == 0,
                   "trial %d, n %d, k %d: rank pick of %d experts differs from moe_topk", trial, n, k, m);
        }
    }
}
