/* test_session.c — the session API keeps the exactness contract through everything it does
 * besides a plain pass:
 *   - session_sync to random prefixes with random points of divergence gives the logits of a cold
 *     run (memcmp), reusing checkpoints kept within their byte budget (counted);
 *   - session_commit(n_keep) of a T = 8 pass leaves the next pass's logits and the whole recurrent
 *     state equal to those of a session that only ever ran the kept tokens, for every n_keep, both
 *     from the commit log and by recomputing a pass longer than the log;
 *   - taps are bit-identical whatever the chunking and thread count, are what the pass uses
 *     (the logits follow from them), and match Moonshot's code on the K3 cases within 1e-3;
 *   - sampling keyed by position gives the same ids whatever the prefill chunk, and the same ids
 *     again when every position is sampled from one pass over the whole sequence;
 *   - an engine driven from two threads at once refuses the second caller instead of racing.
 * On the K3, Kimi-Linear, DeepSeek-V3 and Qwen3 oracle cases (and the bundled model). */
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/rng.h"
#include "base/timer.h"
#include "engine/generate.h"
#include "model/blk.h"
#include "test.h"
#include "test_util.h"

static const char *case_dir(const char *name)
{
    static char d[4096];
    snprintf(d, sizeof d, "%s/%s", test_data("oracle"), name);
    return d;
}

/* an oracle case's model (into *m) and an engine over it on 2 threads; NULL with err set (and
 * nothing left to free) when either fails */
static engine *case_engine(const char *name, model *m, errbuf *err)
{
    if (model_load(m, case_dir(name), err) != 0)
        return NULL;
    engine *e = tu_engine(m, NULL, 2, NULL, err);
    if (!e)
        model_free(m);
    return e;
}

/* logits of the last of ids[0..n) from a cold session */
static float *cold_last(const model *m, const int32_t *ids, int n, errbuf *err)
{
    float *all = tu_eval(m, ids, n, n, 2, NULL, err);
    if (!all)
        return NULL;
    size_t V = (size_t)m->hp.vocab;
    memmove(all, all + (size_t)(n - 1) * V, V * sizeof(float));
    return all;
}

static void sync_case(const char *name)
{
    errbuf err;
    model m;
    engine *e = case_engine(name, &m, &err);
    CHECKF(e, "%s", err.msg);
    int V = m.hp.vocab;
    size_t ckpt = 0;
    session_opts so;
    session_opts_default(&so);
    so.context = 64;
    so.max_pass = 5;
    so.ckpt_every = 4;
    session *s = NULL;
    CHECK(session_new(e, &so, &s, &err) == 0);
    session_recurrent(s, &ckpt);
    session_free(s);
    so.ckpt_budget = 3 * ((uint64_t)ckpt + sizeof(float) * (uint64_t)V); /* room for three: eviction happens */
    CHECK(session_new(e, &so, &s, &err) == 0);
    rng r;
    rng_seed(&r, 7);
    int32_t cur[64], next[64];
    int ncur = 0, rounds = 14;
    for (int k = 0; k < rounds && !test_failed(); k++) {
        /* diverge from the current ids at a random point (or extend, or shorten them) */
        int d = ncur ? (int)(rng_next(&r) % (uint64_t)(ncur + 1)) : 0;
        int n = d + 1 + (int)(rng_next(&r) % 20);
        if (k % 5 == 4)
            n = d > 0 ? d : 1; /* a prefix of what the session holds */
        if (n > 60)
            n = 60;
        memcpy(next, cur, sizeof *cur * (size_t)(d < n ? d : n));
        for (int i = d; i < n; i++)
            next[i] = (int32_t)(rng_next(&r) % (uint64_t)V);
        CHECKF(session_sync(s, next, n, &err) == 0, "%s round %d: %s", name, k, err.msg);
        float *want = cold_last(&m, next, n, &err);
        CHECKF(want, "%s", err.msg);
        const float *got = session_last_logits(s);
        int same = got && memcmp(got, want, sizeof(float) * (size_t)V) == 0;
        free(want);
        CHECKF(same, "%s round %d: logits after a sync to %d ids (diverging at %d) differ from a cold run", name, k,
               n, d);
        CHECKF(session_len(s) == n && !memcmp(session_tokens(s), next, sizeof *next * (size_t)n), "%s: history", name);
        memcpy(cur, next, sizeof *next * (size_t)n);
        ncur = n;
    }
    session_stats st;
    session_stats_get(s, &st);
    if (!test_failed()) {
        CHECKF(st.reused > 0, "%s: no sync reused anything", name);
        CHECKF(st.ckpt_peak <= so.ckpt_budget && st.ckpts <= 3, "%s: %d checkpoints, peak %llu bytes over a budget of %llu",
               name, st.ckpts, (unsigned long long)st.ckpt_peak, (unsigned long long)so.ckpt_budget);
        CHECKF(ckpt == 0 || st.ckpt_peak > 0, "%s: no checkpoint was kept", name);
    }
    session_free(s);
    engine_free(e);
    model_free(&m);
}

/* A sync back to where an earlier sync ended (a regenerated reply, another sample of the same
 * prompt) restores that checkpoint's state and logits: no pass runs, and the logits are a cold
 * run's bits. */
static void sync_back_case(const char *name)
{
    errbuf err;
    model m;
    engine *e = case_engine(name, &m, &err);
    CHECKF(e, "%s", err.msg);
    int V = m.hp.vocab;
    session_opts so;
    session_opts_default(&so);
    so.context = 64;
    so.max_pass = 8;
    session *s = NULL;
    CHECK(session_new(e, &so, &s, &err) == 0);
    int32_t ids[24];
    for (int i = 0; i < 24; i++)
        ids[i] = (int32_t)((i * 37 + 5) % V);
    float *cold = cold_last(&m, ids, 20, &err);
    CHECKF(cold, "%s", err.msg);
    CHECK(session_sync(s, ids, 20, &err) == 0 && session_sync(s, ids, 24, &err) == 0); /* on past it */
    session_stats a, b;
    session_stats_get(s, &a);
    CHECK(session_sync(s, ids, 20, &err) == 0);
    session_stats_get(s, &b);
    const float *lg = session_last_logits(s);
    size_t rec;
    session_recurrent(s, &rec);
    CHECKF(rec == 0 || b.positions_run == a.positions_run, "%s: %llu positions run to come back", name,
           (unsigned long long)(b.positions_run - a.positions_run));
    CHECKF(lg && !memcmp(lg, cold, sizeof(float) * (size_t)V), "%s: the logits back at 20 are not a cold run's", name);
    free(cold);
    session_free(s);
    engine_free(e);
    model_free(&m);
}

/* A saved session loaded into a fresh one is the same session: its state and logits memcmp-equal,
 * every sync from it (extending it, or parting from it before its end, where its saved checkpoints
 * serve) a cold run's bits, with positions reused. A damaged, cut-short or foreign file is refused
 * with a message and leaves the session as it was. */
static void save_load_case(const char *name)
{
    errbuf err;
    model m;
    engine *e = case_engine(name, &m, &err);
    CHECKF(e, "%s", err.msg);
    int V = m.hp.vocab;
    session_opts so;
    session_opts_default(&so);
    so.context = 64;
    so.max_pass = 7;
    so.ckpt_every = 8;
    session *a = NULL, *b = NULL;
    CHECK(session_new(e, &so, &a, &err) == 0 && session_new(e, &so, &b, &err) == 0);
    int32_t ids[48];
    for (int i = 0; i < 48; i++)
        ids[i] = (int32_t)((i * 53 + 11) % V);
    char path[4200], bad[4300];
    snprintf(path, sizeof path, "%s/state-%s.bin", test_tmpdir(), name);
    snprintf(bad, sizeof bad, "%s.bad", path);
    CHECKF(session_sync(a, ids, 30, &err) == 0 && session_save(a, path, &err) == 0, "%s: %s", name, err.msg);
    CHECKF(session_load(b, path, &err) == 0, "%s: %s", name, err.msg);
    size_t ra, rb;
    const void *sa = session_recurrent(a, &ra), *sb = session_recurrent(b, &rb);
    CHECKF(session_len(b) == 30 && !memcmp(session_tokens(b), ids, 30 * sizeof *ids), "%s: tokens", name);
    CHECKF(ra == rb && !memcmp(sa, sb, ra), "%s: the loaded recurrent state differs", name);
    CHECKF(session_last_logits(b) && !memcmp(session_last_logits(a), session_last_logits(b), sizeof(float) * (size_t)V),
           "%s: the loaded last logits differ", name);
    static const int to[][2] = {{48, 30}, {20, 16}}; /* sync to n ids, parting from the saved at d */
    for (int k = 0; k < 2 && !test_failed(); k++) {
        session *c = NULL;
        CHECK(session_new(e, &so, &c, &err) == 0 && session_load(c, path, &err) == 0);
        int32_t want_ids[48];
        memcpy(want_ids, ids, sizeof ids);
        for (int i = to[k][1]; i < to[k][0]; i++)
            want_ids[i] = (int32_t)((i * 7 + 3 + 97 * k) % V);
        session_stats s0, s1;
        session_stats_get(c, &s0);
        CHECKF(session_sync(c, want_ids, to[k][0], &err) == 0, "%s: %s", name, err.msg);
        session_stats_get(c, &s1);
        float *cold = cold_last(&m, want_ids, to[k][0], &err);
        CHECKF(cold, "%s", err.msg);
        CHECKF(!memcmp(session_last_logits(c), cold, sizeof(float) * (size_t)V),
               "%s: a sync to %d ids from the loaded state is not a cold run's bits", name, to[k][0]);
        CHECKF(s1.reused > s0.reused, "%s: the sync to %d ids reused nothing of the loaded state", name, to[k][0]);
        free(cold);
        session_free(c);
    }
    /* bad files: one byte flipped, cut short, not a state; b holds the saved state throughout */
    char *data = NULL;
    size_t n = 0;
    CHECKF(file_read_all(path, &data, &n, &err) == 0, "%s", err.msg);
    CHECK(session_sync(b, ids, 10, &err) == 0);
    for (int k = 0; k < 4 && !test_failed(); k++) {
        char *copy = malloc(n);
        CHECK(copy != NULL);
        memcpy(copy, data, n);
        size_t len = n;
        if (k == 0)
            copy[n / 2] ^= 0x40;
        else if (k == 1)
            len = n - 100;
        else if (k == 2)
            memcpy(copy, "NOTSTATE", 8);
        else { /* sizes that would wrap the length the header implies round to the file's own */
            int32_t big = 1 << 30;
            uint64_t huge = (uint64_t)-1 / 4 - 7;
            int32_t chunks = (big + BLK_KV_CHUNK - 1) / BLK_KV_CHUNK; /* consistent with n */
            memcpy(copy + 72, &big, 4);  /* n */
            memcpy(copy + 88, &chunks, 4);
            memcpy(copy + 96, &huge, 8); /* rec_floats */
        }
        CHECK(file_write_atomic(bad, copy, len, &err) == 0);
        free(copy);
        CHECKF(session_load(b, bad, &err) != 0 && strstr(err.msg, bad), "%s: bad file %d was loaded", name, k);
        CHECKF(strstr(err.msg, k == 0 ? "checksum" : k == 1 || k == 3 ? "cut short" : "not a Deltafin session state"),
               "%s: bad file %d: %s", name, k, err.msg);
        int32_t *peek = NULL;
        int npeek = 0;
        CHECKF(k == 0 || session_file_tokens(e, bad, &peek, &npeek, &err) != 0, "%s: bad file %d: its tokens were read",
               name, k);
        free(peek);
        CHECKF(session_len(b) == 10 && !memcmp(session_tokens(b), ids, 10 * sizeof *ids),
               "%s: a refused load changed the session", name);
    }
    free(data);
    remove(path);
    remove(bad);
    session_free(a);
    session_free(b);
    engine_free(e);
    model_free(&m);
}

TEST(session_save_load_kimi_k3) { save_load_case("kimi_k3-b"); }
TEST(session_save_load_kimi_linear) { save_load_case("kimi_linear-a"); }
TEST(session_save_load_deepseek) { save_load_case("deepseek_v3-a"); }
TEST(session_save_load_qwen3) { save_load_case("qwen3-a"); }

TEST(session_sync_back_runs_nothing_kimi_k3) { sync_back_case("kimi_k3-b"); }
TEST(session_sync_back_runs_nothing_kimi_linear) { sync_back_case("kimi_linear-a"); }
TEST(session_sync_back_runs_nothing_qwen3) { sync_back_case("qwen3-a"); }

TEST(session_sync_kimi_k3) { sync_case("kimi_k3-b"); }
TEST(session_sync_kimi_linear) { sync_case("kimi_linear-a"); }
TEST(session_sync_deepseek) { sync_case("deepseek_v3-a"); }
TEST(session_sync_qwen3) { sync_case("qwen3-a"); }

/* Commit: prompt P (10 ids), a pass D of 8, keep n_keep, then a pass X of 3 with logits; against a
 * session that synced to P + D[0..n_keep) and ran X. max_commit 16 keeps from the log, 4 makes
 * the T = 8 pass too long to log (recomputed). */
static void commit_case(const char *name)
{
    errbuf err;
    model m;
    engine *e = case_engine(name, &m, &err);
    CHECKF(e, "%s", err.msg);
    int V = m.hp.vocab;
    size_t VB = sizeof(float) * (size_t)V;
    int32_t P[10], D[8], X[3], kept[18];
    for (int i = 0; i < 10; i++)
        P[i] = (int32_t)((i * 37 + 11) % V);
    for (int i = 0; i < 8; i++)
        D[i] = (int32_t)((i * 53 + 5) % V);
    for (int i = 0; i < 3; i++)
        X[i] = (int32_t)((i * 71 + 2) % V);
    for (int logged = 1; logged >= 0 && !test_failed(); logged--) {
        session_opts so;
        session_opts_default(&so);
        so.context = 32;
        so.max_pass = 10;
        so.max_logits = 10;
        so.max_commit = logged ? 16 : 4;
        so.ckpt_budget = 0;
        for (int keep = 0; keep <= 8 && !test_failed(); keep++) {
            session *a = NULL, *b = NULL;
            CHECK(session_new(e, &so, &a, &err) == 0 && session_new(e, &so, &b, &err) == 0);
            session_pass pd = {.tokens = D, .T = 8, .n_logits = 8}, px = {.tokens = X, .T = 3, .n_logits = 3};
            memcpy(kept, P, sizeof P);
            memcpy(kept + 10, D, sizeof *D * (size_t)keep);
            int ok = session_sync(a, P, 10, &err) == 0 && session_run(a, &pd, &err) == 0 &&
                     session_commit(a, keep, &err) == 0;
            ok = ok && session_len(a) == 10 + keep && session_sync(b, kept, 10 + keep, &err) == 0;
            if (ok && keep > 0) /* the kept positions' logits survive the commit */
                ok = !memcmp(session_logits(a, keep - 1), session_last_logits(b), VB) ||
                     !errbuf_set(&err, "the logits of the last kept position changed");
            size_t na, nb;
            const void *ra = session_recurrent(a, &na), *rb = session_recurrent(b, &nb);
            if (ok && (na != nb || memcmp(ra, rb, na) != 0))
                ok = !errbuf_set(&err, "recurrent state differs after the commit");
            ok = ok && session_run(a, &px, &err) == 0 && session_run(b, &px, &err) == 0;
            for (int t = 0; ok && t < 3; t++)
                if (memcmp(session_logits(a, t), session_logits(b, t), VB) != 0)
                    ok = !errbuf_set(&err, "the next pass's logits differ at its position %d", t);
            ok = ok && session_commit(a, 3, &err) == 0 && session_commit(b, 3, &err) == 0;
            ra = session_recurrent(a, &na);
            rb = session_recurrent(b, &nb);
            if (ok && memcmp(ra, rb, na) != 0)
                ok = !errbuf_set(&err, "recurrent state differs after the next pass");
            session_stats st;
            session_stats_get(a, &st);
            if (ok && !logged && keep > 0 && keep < 8 && m.hp.kda_heads > 0 && st.recomputed != (uint64_t)keep)
                ok = !errbuf_set(&err, "recomputed %llu positions, expected %d", (unsigned long long)st.recomputed,
                                 keep);
            session_free(a);
            session_free(b);
            CHECKF(ok, "%s, keep %d of 8 (%s): %s", name, keep, logged ? "from the log" : "recomputed", err.msg);
        }
    }
    engine_free(e);
    model_free(&m);
}

TEST(session_commit_kimi_k3) { commit_case("kimi_k3-b"); }
TEST(session_commit_kimi_linear) { commit_case("kimi_linear-a"); }
TEST(session_commit_deepseek) { commit_case("deepseek_v3-a"); }
TEST(session_commit_qwen3) { commit_case("qwen3-a"); }

/* taps of every layer for ids, in passes of chunk on `threads` threads: [n][L][H] */
static float *all_taps(const model *m, const int32_t *ids, int n, int chunk, int threads, float *logits_last,
                       errbuf *err)
{
    int L = m->hp.n_layers, H = m->hp.hidden, *layers = malloc(sizeof(int) * (size_t)L);
    float *taps = malloc(sizeof(float) * (size_t)n * L * H);
    engine *e = tu_engine(m, NULL, threads, NULL, err);
    session *s = e ? tu_session(e, n, chunk, err) : NULL;
    int ok = s && layers && taps;
    for (int i = 0; i < L && ok; i++)
        layers[L - 1 - i] = i; /* any order */
    for (int i = 0; i < n && ok; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        session_pass p = {ids + i, c, c, layers, L, taps + (size_t)i * L * H};
        ok = session_run(s, &p, err) == 0;
        if (ok && i + c == n && logits_last)
            memcpy(logits_last, session_logits(s, c - 1), sizeof(float) * (size_t)m->hp.vocab);
    }
    session_free(s);
    engine_free(e);
    free(layers);
    if (!ok) {
        free(taps);
        return NULL;
    }
    return taps; /* [t][j] with layer L-1-j */
}

static void taps_case(const char *dir)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    const hparams *hp = &m.hp;
    int n = 13, L = hp->n_layers, H = hp->hidden, V = hp->vocab;
    int32_t ids[13];
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 101 + 7) % V);
    float *last = malloc(sizeof(float) * (size_t)V);
    float *ref = all_taps(&m, ids, n, n, 2, last, &err);
    CHECKF(ref, "%s: %s", dir, err.msg);
    size_t bytes = sizeof(float) * (size_t)n * L * H;
    int chunks[3] = {1, 3, 5}, threads[3] = {2, 1, 3};
    for (int k = 0; k < 3 && !test_failed(); k++) {
        float *got = all_taps(&m, ids, n, chunks[k], threads[k], NULL, &err);
        int same = got && memcmp(got, ref, bytes) == 0;
        free(got);
        CHECKF(same, "%s: taps in chunks of %d on %d threads differ from one pass", dir, chunks[k], threads[k]);
    }
    /* the logits follow from the taps: the last layer's stream (mixed with the block sums leaving
     * each block's last layer and the embedding, for AttnRes), normed, through the head */
    engine *e = tu_engine(&m, NULL, 1, NULL, &err);
    pool *p = pool_new(1, &err);
    arena ar;
    CHECK(e && p && arena_init(&ar, sizeof(float) * 4 * (size_t)(H + V)) == 0);
    CHECK(pool_reserve(p, sizeof(float) * kern_scratch_floats(m.max_cols), &err) == 0);
    blk b = {&m, hp, kern_select(NULL), p, &ar, &err, NULL, NULL};
    float *h = malloc(sizeof(float) * (size_t)H), *x = malloc(sizeof(float) * (size_t)H);
    float *lg = malloc(sizeof(float) * (size_t)V);
    const float *tap_last = ref + (size_t)(n - 1) * L * H; /* position n-1: [j] is layer L-1-j */
    if (hp->attnres_block > 0) {
        const float *src[MODEL_MAX_BLOCKS + 1];
        int ns = 0;
        kern_select(NULL)->decode_rows(&m.embed, ids[n - 1], ids[n - 1] + 1, x);
        src[ns++] = x;
        for (int i = hp->attnres_block - 1; i < L - 1; i += hp->attnres_block)
            src[ns++] = tap_last + (size_t)(L - 1 - i) * H;
        src[ns++] = tap_last; /* layer L-1: the current prefix */
        blk_attnres_mix(&b, src, ns, m.out_res_u, H, h);
    } else {
        memcpy(h, tap_last, sizeof(float) * (size_t)H);
    }
    blk_rmsnorm(&b, h, m.final_norm, 1, H, hp->rms_eps, h);
    blk_matmul(&b, &m.lm_head, h, 1, lg);
    int same = memcmp(lg, last, sizeof(float) * (size_t)V) == 0;
    free(h);
    free(x);
    free(lg);
    free(last);
    free(ref);
    arena_free(&ar);
    pool_free(p);
    engine_free(e);
    model_free(&m);
    CHECKF(same, "%s: the logits do not follow from the taps", dir);
}

TEST(session_taps_kimi_k3) { taps_case(case_dir("kimi_k3-b")); }
TEST(session_taps_kimi_k3_attnres2) { taps_case(case_dir("kimi_k3-a")); }
TEST(session_taps_kimi_linear) { taps_case(case_dir("kimi_linear-a")); }
TEST(session_taps_qwen3) { taps_case(case_dir("qwen3-a")); }
TEST(session_taps_default_model) { taps_case("models/default"); }

/* The taps against Moonshot's own code: taps_pN.f32 in a K3 case ([n][layers][hidden], float32)
 * are the prefixes its decoder layers return, in float64, for the case's prompts
 * (tools/oracle/gen_k3_taps.py); each position and layer within 1e-3 relative (L2, as the
 * oracle's logits). The case's logits are checked against that same run when the taps are made. */
static void taps_moonshot_case(const char *name)
{
    errbuf err;
    model m;
    char path[4096];
    const char *dir = case_dir(name);
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/taps.json", dir);
    json_t *meta = json_load_file(path, 0, NULL), *prompts = json_object_get(meta, "prompts");
    CHECKF(json_array_size(prompts) > 0, "%s: no reference taps", path);
    int L = m.hp.n_layers, H = m.hp.hidden;
    CHECKF(json_integer_value(json_object_get(meta, "layers")) == L &&
               json_integer_value(json_object_get(meta, "hidden")) == H,
           "%s: taps of another shape", path);
    double worst = 0;
    for (size_t pi = 0; pi < json_array_size(prompts) && !test_failed(); pi++) {
        json_t *pr = json_array_get(prompts, pi), *jids = json_object_get(pr, "ids");
        int n = (int)json_array_size(jids);
        int32_t *ids = malloc(sizeof *ids * (size_t)n);
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(pr, "taps_file")));
        size_t nref = 0;
        float *ref = tu_read_f32(path, &nref);
        float *got = all_taps(&m, ids, n, n, 2, NULL, &err); /* [t][j] is layer L-1-j */
        CHECKF(ref && nref == (size_t)n * L * H, "%s: missing or of the wrong size", path);
        CHECKF(got, "%s: %s", name, err.msg);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < L; i++) {
                double e = tu_rel_err(got + ((size_t)t * L + (size_t)(L - 1 - i)) * H,
                                      ref + ((size_t)t * L + (size_t)i) * H, (size_t)H);
                worst = e > worst ? e : worst;
                CHECKF(e <= 1e-3, "%s prompt %zu: layer %d's tap at position %d is %.2e from Moonshot's", name,
                       pi, i, t, e);
            }
        free(got);
        free(ref);
        free(ids);
    }
    json_decref(meta);
    model_free(&m);
    printf("     taps   %-22s worst rel err %.1e against Moonshot's\n", name, worst);
}

TEST(session_taps_match_moonshot_kimi_k3_a) { taps_moonshot_case("kimi_k3-a"); }
TEST(session_taps_match_moonshot_kimi_k3_b) { taps_moonshot_case("kimi_k3-b"); }
TEST(session_taps_match_moonshot_kimi_k3_h) { taps_moonshot_case("kimi_k3-h"); }
TEST(session_taps_match_moonshot_default_model) { taps_moonshot_case("default-k3"); }

/* ids sampled at temperature 0.8 with seed 11 after `prompt`, the prompt synced in passes of chunk */
static int sampled(engine *e, const int32_t *prompt, int n, int chunk, int32_t *out, int G, errbuf *err)
{
    session_opts so;
    session_opts_default(&so);
    so.context = n + G;
    so.max_pass = chunk;
    session *s = NULL;
    sampler sm;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = 0.8f;
    sc.seed = 11;
    if (session_new(e, &so, &s, err) != 0 || sampler_init(&sm, &sc, engine_hparams(e)->vocab, err) != 0) {
        session_free(s);
        return -1;
    }
    int rc = session_sync(s, prompt, n, err);
    const float *lg = session_last_logits(s);
    for (int g = 0; g < G && rc == 0; g++) {
        out[g] = sampler_pick(&sm, lg, session_len(s));
        session_pass p = {.tokens = &out[g], .T = 1, .n_logits = 1};
        rc = session_run(s, &p, err);
        lg = session_logits(s, 0);
    }
    sampler_free(&sm);
    session_free(s);
    return rc;
}

TEST(session_sampling_keyed_by_position)
{
    errbuf err;
    engine_opts o;
    engine_opts_default(&o);
    o.model = "models/default";
    o.threads = 2;
    engine *e;
    CHECKF(engine_open(&o, &e, &err) == 0, "%s", err.msg);
    int V = engine_hparams(e)->vocab;
    enum { N = 20, G = 24 };
    int32_t prompt[N], ref[G], got[G], seq[N + G];
    for (int i = 0; i < N; i++)
        prompt[i] = (int32_t)((i * 389 + 17) % V);
    CHECKF(sampled(e, prompt, N, N, ref, G, &err) == 0, "%s", err.msg);
    int distinct = 0;
    for (int g = 1; g < G; g++)
        distinct += ref[g] != ref[0];
    CHECKF(distinct > 0, "the sampled ids are all one token: the test cannot tell anything");
    int chunks[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        CHECKF(sampled(e, prompt, N, chunks[k], got, G, &err) == 0, "%s", err.msg);
        CHECKF(!memcmp(got, ref, sizeof ref), "prefill in chunks of %d sampled other ids", chunks[k]);
    }
    /* every position from one pass over prompt + the sampled ids */
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + N, ref, sizeof ref);
    session *s = tu_session(e, N + G, N + G, &err);
    sampler sm;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = 0.8f;
    sc.seed = 11;
    CHECK(s && sampler_init(&sm, &sc, V, &err) == 0);
    session_pass p = {.tokens = seq, .T = N + G - 1, .n_logits = N + G - 1};
    CHECKF(session_run(s, &p, &err) == 0, "%s", err.msg);
    for (int g = 0; g < G; g++)
        got[g] = sampler_pick(&sm, session_logits(s, N - 1 + g), N + g);
    sampler_free(&sm);
    session_free(s);
    engine_free(e);
    CHECKF(!memcmp(got, ref, sizeof ref), "sampling every position of one pass gave other ids");
}

/* Two threads drive one engine: each call either runs (and computes the right logits) or is
 * refused with the engine's one-thread error; never both at once (TSan would see the race). */
struct racer {
    engine *e;
    const int32_t *ids;
    int n;
    const float *want; /* logits of the last id */
    int V;
    int runs, refused, wrong;
    char msg[256];
};

static void *race(void *arg)
{
    struct racer *r = arg;
    errbuf err;
    session *s = NULL;
    double t_end = timer_now() + 30; /* a bound, far beyond what the runs take */
    while (!s && timer_now() < t_end) {
        if (!(s = tu_session(r->e, r->n, r->n, &err)) && !strstr(err.msg, "one thread")) {
            snprintf(r->msg, sizeof r->msg, "%s", err.msg);
            break;
        }
        nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    /* until 40 runs each (or a bound on attempts); a pause after each run lets the other in */
    while (s && r->runs < 40 && timer_now() < t_end && !r->msg[0]) {
        session_reset(s);
        if (session_sync(s, r->ids, r->n, &err) != 0) {
            if (strstr(err.msg, "one thread at a time"))
                r->refused++;
            else
                snprintf(r->msg, sizeof r->msg, "%s", err.msg);
            sched_yield();
            continue;
        }
        r->runs++;
        r->wrong += memcmp(session_last_logits(s), r->want, sizeof(float) * (size_t)r->V) != 0;
        nanosleep(&(struct timespec){0, 200000}, NULL);
    }
    session_free(s);
    return NULL;
}

TEST(engine_refuses_a_second_thread)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, "models/default", &err) == 0, "%s", err.msg);
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 97 + 1) % m.hp.vocab);
    float *want = cold_last(&m, ids, N, &err);
    CHECKF(want, "%s", err.msg);
    engine *e = tu_engine(&m, NULL, 1, NULL, &err);
    CHECKF(e, "%s", err.msg);
    struct racer a = {e, ids, N, want, m.hp.vocab, 0, 0, 0, ""}, b = a;
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, race, &a) == 0 && pthread_create(&tb, NULL, race, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    engine_free(e);
    free(want);
    model_free(&m);
    CHECKF(!a.msg[0] && !b.msg[0], "%s%s", a.msg, b.msg);
    CHECKF(a.wrong + b.wrong == 0, "%d runs computed other logits", a.wrong + b.wrong);
    CHECKF(a.runs > 0 && b.runs > 0, "runs: %d and %d, refused %d and %d", a.runs, b.runs, a.refused, b.refused);
    CHECKF(a.refused + b.refused > 0, "never refused in %d + %d runs: the threads never met", a.runs, b.runs);
}

/* An attention work item's rows of scores (blk_att_rows rows of ceil16(n) floats at n positions)
 * fit the scratch reserved for a session of `context` positions at every n <= context, including
 * past the contexts where fewer than BLK_ATT_ROWS rows fit. */
TEST(attention_rows_fit_their_scratch)
{
    static const int ctx[] = {1, 17, 4096, 131055, 131056, 131057, 140000, 1 << 20, 3000000};
    for (size_t c = 0; c < sizeof ctx / sizeof ctx[0]; c++) {
        int C = ctx[c];
        size_t have = blk_att_score_floats(C);
        for (int n = C, step = C / 997 + 1; n >= 1; n -= n > step ? step : 1) {
            int rows = blk_att_item_rows(1 << 20, n);
            size_t ld = ((size_t)n + 15) / 16 * 16;
            CHECKF(rows >= 1 && rows <= BLK_ATT_ROWS, "context %d, n %d: %d rows", C, n, rows);
            CHECKF(rows * ld <= have, "context %d, n %d: %d rows of %zu floats past the %zu reserved", C, n, rows,
                   ld, have);
            if (n <= 131056)
                CHECKF(rows == BLK_ATT_ROWS, "n %d: %d rows where all fit", n, rows);
            if (test_failed())
                return;
        }
    }
    CHECK(blk_att_item_rows(0, 10) == 1 && blk_att_item_rows(5, 10) == 5);
}
