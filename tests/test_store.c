/* test_store.c — the weight store computes exactly what the resident model computes: logits are
 * bit-identical between all resident, streamed with a budget so small nearly every expert is
 * read from disk, with every layer's spine (or half of them) streamed too, a Hugging Face folder
 * and a DFSP store, 1 and 3 drive folders, with and without mirrors, prefetch on and off,
 * emulated drives. Each needed blob is read at most once per pass. The planner spends a budget
 * spine first. A flipped byte (expert or spine) is an error naming the blob and pack; a
 * truncated pack is an error; prepare interrupted midway completes on a rerun and verifies; a
 * store refuses another model; a failed load is recoverable; doctor checks mirrors; the router
 * lookahead's guesses are mostly used and credited only to the layer they were for;
 * each drive is read with the depth and request size doctor measured for it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "model/st_write.h"
#include "store/dfsp.h"
#include "store/store.h"
#include "test.h"
#include "test_util.h"

static const int32_t IDS[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
enum { NIDS = 12 };

/* logits of IDS through `m` with experts from st (NULL: resident), in passes of `chunk` */
static float *run(const model *m, store *st, int chunk, errbuf *err)
{
    engine *e = tu_engine(m, st, 2, NULL, err);
    if (!e)
        return NULL;
    float *out = tu_eval_engine(e, IDS, NIDS, chunk, err);
    engine_free(e);
    return out;
}

/* RAM budgets: the spine and `slots` experts (the planner may still stream some spines to keep
 * more expert slots when `slots` is below its working set); or the least a store opens with (the
 * globals, two spine slots, two experts: every layer's spine streams, forced for models so small
 * that two slots hold more than their spine); or halfway between */
enum { ALL_SPINE = 0, LEAST = -1, HALF_SPINE = -2 };

static uint64_t budget_of(const blob_table *bt, int slots)
{
    uint64_t X = blob_padded(bt->max_expert), spine = 0, globals = bt->b[bt->global_blob].size;
    for (int i = 0; i < bt->n_layers; i++) {
        uint64_t sz = blob_padded(bt->b[bt->layer_blob[i]].size);
        spine = sz > spine ? sz : spine;
    }
    uint64_t least = globals + STORE_SPINE_SLOTS * spine + STORE_MIN_EXPERT_SLOTS * X;
    if (slots == LEAST)
        return least;
    if (slots == HALF_SPINE)
        return (least + bt->spine_bytes) / 2;
    return bt->spine_bytes + (uint64_t)slots * X;
}

/* a store over m (HF folder when info is NULL) with one of the budgets above */
static store *open_store(model *m, const dfsp_info *info, blob_table *bt_in, int slots, int prefetch,
                         const char *emulate, errbuf *err)
{
    blob_table bt;
    if (bt_in) {
        bt = *bt_in;
        memset(bt_in, 0, sizeof *bt_in);
    } else if (blob_table_build(&bt, m, err) != 0) {
        return NULL;
    }
    store_cfg c;
    memset(&c, 0, sizeof c);
    io_cfg_default(&c.io);
    c.io.depth = 4;
    c.ram_budget = budget_of(&bt, slots);
    c.spine_stream_all = slots == LEAST;
    c.prefetch = prefetch;
    c.verify = 1;
    if (emulate && io_parse_emulation(&c.io, emulate, err) != 0) {
        blob_table_free(&bt);
        return NULL;
    }
    store *s;
    return store_open(&s, m, &bt, info, &c, err) == 0 ? s : NULL;
}

static char *dir_in_tmp(const char *name)
{
    static char d[8][4096];
    static int k;
    char *p = d[k++ % 8];
    snprintf(p, 4096, "%s/%s", test_tmpdir(), name);
    return p;
}

static int prepare(const char *src, const char *dst, int ndrives, int mirrors, errbuf *err)
{
    const char *drives[4];
    char buf[4][4096];
    for (int i = 0; i < ndrives; i++) {
        snprintf(buf[i], sizeof buf[i], "%s-drive%d", dst, i);
        mkdir(buf[i], 0755);
        drives[i] = buf[i];
    }
    dfsp_prepare_opts o = {drives, ndrives, mirrors, 0};
    dfsp_prepare_stats st;
    return dfsp_prepare(src, dst, &o, &st, err);
}

/* the streamed spines' bookkeeping after `passes` passes: every streamed layer taken once per pass,
 * each take a read on demand, a read ahead or a hit; a read ahead goes unused only at the end */
static void check_spine_counts(const store *st, uint64_t passes, int prefetch, const char *what)
{
    const store_plan *pl = store_plan_get(st);
    store_stats ss;
    store_stats_get(st, &ss);
    uint64_t demand = ss.spine_reads - ss.spine_prefetch_reads;
    CHECKF(ss.spine_requests == passes * (uint64_t)pl->spine_streamed, "%s: %llu layers taken in %llu passes of %d",
           what, (unsigned long long)ss.spine_requests, (unsigned long long)passes, pl->spine_streamed);
    CHECKF(demand + ss.spine_prefetch_hits + ss.spine_hits == ss.spine_requests,
           "%s: %llu demand reads + %llu read ahead and used + %llu hits != %llu taken", what,
           (unsigned long long)demand, (unsigned long long)ss.spine_prefetch_hits, (unsigned long long)ss.spine_hits,
           (unsigned long long)ss.spine_requests);
    if (!prefetch)
        CHECKF(ss.spine_prefetch_reads == 0, "%s: spines read ahead with prefetch off", what);
    else
        CHECKF(ss.spine_prefetch_hits > 0 &&
                   ss.spine_prefetch_reads - ss.spine_prefetch_hits <= (uint64_t)pl->spine_slots,
               "%s: %llu spines read ahead, %llu used", what, (unsigned long long)ss.spine_prefetch_reads,
               (unsigned long long)ss.spine_prefetch_hits);
    CHECKF(ss.max_reads_blob_pass <= 1, "%s: a blob was read %llu times in one pass", what,
           (unsigned long long)ss.max_reads_blob_pass);
}

/* a streamed layer as the store hands it over: every matrix moved off the model's own mapping onto
 * a slot, holding the same bytes (so equal logits cannot come from the pass reading the mapping) */
static void check_streamed_layers(store *st, const model *m, const char *what)
{
    const weight_src *xs = store_weights(st);
    const store_plan *pl = store_plan_get(st);
    errbuf err;
    for (int i = 0; i < m->hp.n_layers; i++) {
        const layer_w *L;
        CHECKF(xs->layer(xs->ctx, i, &L, &err) == 0, "%s: layer %d: %s", what, i, err.msg);
        layer_w a = *L, b = m->L[i];
        kmat *ma[MODEL_LAYER_MATS], *mb[MODEL_LAYER_MATS];
        int n = model_layer_mats(&a, ma);
        CHECK(n == model_layer_mats(&b, mb) && n > 0);
        for (int k = 0; k < n; k++) {
            CHECKF((ma[k]->data != mb[k]->data) == pl->streamed[i], "%s: layer %d matrix %d: streamed %d, moved %d",
                   what, i, k, pl->streamed[i], ma[k]->data != mb[k]->data);
            CHECK(memcmp(ma[k]->data, mb[k]->data, (size_t)ma[k]->rows * ma[k]->row_bytes) == 0);
            if (ma[k]->scale) { /* FP8: one scale row per 128 weight rows */
                size_t srows = ma[k]->fmt == WF_FP8B128 ? ((size_t)ma[k]->rows + 127) / 128 : (size_t)ma[k]->rows;
                CHECK((ma[k]->scale != mb[k]->scale) == pl->streamed[i]);
                CHECK(memcmp(ma[k]->scale, mb[k]->scale, srows * ma[k]->scale_stride) == 0);
            }
        }
        xs->layer_release(xs->ctx, i);
    }
}

/* Makes the model's own mapping of every streamed layer's tensors unreadable (prot PROT_NONE), or
 * readable again (PROT_READ): while it is not, a pass that read a streamed layer from the mapping
 * instead of its slot would crash, so equal logits prove the slots are what was computed on. Only
 * whole pages inside each tensor (a page at an edge may hold a neighbour's bytes). */
static void protect_streamed(const store *st, const model *m, int prot)
{
    const blob_table *bt = store_blobs(st);
    const store_plan *pl = store_plan_get(st);
    long pg = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < m->hp.n_layers; i++) {
        if (!pl->streamed[i])
            continue;
        const blob *x = &bt->b[bt->layer_blob[i]];
        for (int k = 0; k < x->nparts; k++) {
            const st_tensor *t = &m->st.t[bt->part[x->first_part + k].tensor];
            uintptr_t a = ((uintptr_t)t->data + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
            uintptr_t e = ((uintptr_t)t->data + (t->end - t->begin)) & ~(uintptr_t)(pg - 1);
            if (e > a)
                CHECKF(mprotect((void *)a, e - a, prot) == 0, "mprotect layer %d", i);
        }
    }
}

/* logits through a store over `dir` (a DFSP store when dfsp, else a Hugging Face folder) opened
 * with `slots` (a budget of the enum above), prefetch on or off, in passes of `chunk`, equal to ref
 * bit for bit; the spines stream as planned */
static void compare_streamed(const char *dir, int dfsp, int slots, int pf, int chunk, const float *ref,
                             const char *what)
{
    errbuf err;
    model mm, *m = &mm;
    blob_table bt;
    dfsp_info info;
    if (dfsp)
        CHECKF(dfsp_open(dir, NULL, m, &bt, &info, &err) == 0, "%s", err.msg);
    else
        CHECKF(model_load(m, dir, &err) == 0, "%s", err.msg);
    store *st = open_store(m, dfsp ? &info : NULL, dfsp ? &bt : NULL, slots, pf,
                           dfsp && info.ndrives == 3 ? "400:50,800:20,200:100" : NULL, &err);
    CHECKF(st, "%s: %s", what, err.msg);
    const store_plan *pl = store_plan_get(st);
    int n = m->hp.n_layers;
    if (slots == LEAST)
        CHECKF(pl->spine_streamed == n, "%s: the least budget streams %d of %d spines", what, pl->spine_streamed, n);
    if (slots == HALF_SPINE)
        CHECKF(pl->spine_streamed > 0 && pl->spine_streamed < n, "%s: half the spine budget streams %d of %d", what,
               pl->spine_streamed, n);
    protect_streamed(st, m, PROT_NONE);
    float *got = run(m, st, chunk, &err);
    protect_streamed(st, m, PROT_READ);
    CHECKF(got, "%s: %s", what, err.msg);
    int same = memcmp(got, ref, sizeof(float) * NIDS * (size_t)m->hp.vocab) == 0;
    free(got);
    CHECKF(same, "%s (prefetch %d, chunk %d, %d spines streamed): logits differ from resident", what, pf, chunk,
           pl->spine_streamed);
    check_spine_counts(st, (uint64_t)((NIDS + chunk - 1) / chunk), pf, what);
    check_streamed_layers(st, m, what);
    store_free(st);
    model_free(m);
}

static void compare_all(const char *src)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, src, &err) == 0, "%s", err.msg);
    size_t bytes = sizeof(float) * NIDS * (size_t)m.hp.vocab;
    float *ref = run(&m, NULL, NIDS, &err);
    CHECKF(ref, "%s", err.msg);
    /* Hugging Face folder with every layer's spine streamed (and half of them), T = 1 and T = 12 */
    blob_table bt0;
    CHECKF(blob_table_build(&bt0, &m, &err) == 0, "%s", err.msg);
    int half = budget_of(&bt0, HALF_SPINE) > budget_of(&bt0, LEAST); /* else the model is too small */
    blob_table_free(&bt0);
    for (int pf = 0; pf <= 1; pf++)
        for (int chunk = 1; chunk <= NIDS; chunk += NIDS - 1)
            for (int h = 0; h <= half; h++)
                compare_streamed(src, 0, h ? HALF_SPINE : LEAST, pf, chunk, ref, "HF spine streamed");
    /* Hugging Face folder, streamed through 2 slots (nearly everything is read), T = 12 and T = 1 */
    for (int pf = 0; pf <= 1; pf++)
        for (int chunk = 1; chunk <= NIDS; chunk += NIDS - 1) {
            store *st = open_store(&m, NULL, NULL, 2, pf, NULL, &err);
            CHECKF(st, "%s", err.msg);
            float *got = run(&m, st, chunk, &err);
            store_stats ss;
            store_stats_get(st, &ss);
            store_free(st);
            CHECKF(got, "%s", err.msg);
            int same = memcmp(got, ref, bytes) == 0;
            free(got);
            CHECKF(same, "%s: streamed (HF, prefetch %d, chunk %d) logits differ from resident", src, pf, chunk);
            CHECKF(ss.max_reads_blob_pass <= 1, "a blob was read %llu times in one pass",
                   (unsigned long long)ss.max_reads_blob_pass);
            /* most experts come from disk (with prefetch, read ahead by the lookahead: hits) */
            CHECKF(ss.reads * 2 > ss.hits + ss.misses,
                   "with 2 slots most requests should be read (reads %llu, hits %llu misses %llu)",
                   (unsigned long long)ss.reads, (unsigned long long)ss.hits, (unsigned long long)ss.misses);
            if (!pf)
                CHECKF(ss.reads == ss.misses, "reads %llu != misses %llu without prefetch",
                       (unsigned long long)ss.reads, (unsigned long long)ss.misses);
        }
    /* DFSP stores: 1 drive; 3 drives; 3 drives with 2 mirrors; mapped and streamed */
    static const int layouts[][2] = {{1, 1}, {3, 1}, {3, 2}};
    for (size_t l = 0; l < 3; l++) {
        char name[64];
        snprintf(name, sizeof name, "store-%s-%d-%d", strrchr(src, '/') + 1, layouts[l][0], layouts[l][1]);
        char *dst = dir_in_tmp(name);
        CHECKF(prepare(src, dst, layouts[l][0], layouts[l][1], &err) == 0, "%s", err.msg);
        model dm;
        blob_table bt;
        dfsp_info info;
        CHECKF(dfsp_open(dst, NULL, &dm, &bt, &info, &err) == 0, "%s", err.msg);
        CHECK(info.npacks == layouts[l][0]);
        float *mapped = run(&dm, NULL, NIDS, &err);
        /* every spine streamed, then half of them: prefetch on and off */
        for (int pf = 0; pf <= 1; pf++)
            for (int h = 0; h <= half; h++)
                compare_streamed(dst, 1, h ? HALF_SPINE : LEAST, pf, 1 + 4 * pf, ref, name);
        store *st = open_store(&dm, &info, &bt, 3, 1, l == 2 ? "400:50,800:20,200:100" : NULL, &err);
        CHECKF(st, "%s", err.msg);
        float *streamed = run(&dm, st, 5, &err);
        store_stats ss;
        store_stats_get(st, &ss);
        /* registered slot memory (when the kernel allowed it) is what the reads went into */
        const char *note = store_io_note(st);
        CHECKF(!strstr(note, "registered") || strstr(note, "unregistered") || io_fixed_reads(store_io(st)) > 0,
               "%s, yet no read used it", note);
        store_free(st);
        model_free(&dm);
        int ok = mapped && streamed && memcmp(mapped, ref, bytes) == 0 && memcmp(streamed, ref, bytes) == 0;
        free(mapped);
        free(streamed);
        CHECKF(ok, "%s: DFSP %d drives %d mirrors: logits differ from resident", src, layouts[l][0], layouts[l][1]);
        CHECK(ss.max_reads_blob_pass <= 1);
    }
    free(ref);
    model_free(&m);
}

TEST(store_exact_default_model) { compare_all("models/default"); }
TEST(store_exact_kimi_k3) { compare_all(test_data("oracle/kimi_k3-b")); }
TEST(store_exact_deepseek_int4) { compare_all(test_data("oracle/kimi_k2-int4")); }

static void copy_file(const char *a, const char *b)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", a, b);
    if (system(cmd) != 0)
        test_fail(__FILE__, __LINE__, "cp failed");
}

/* flips the byte at `off` of `path` (again to restore it) */
static void flip_byte(const char *path, uint64_t off)
{
    FILE *f = fopen(path, "r+b");
    CHECKF(f, "%s", path);
    fseek(f, (long)off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* models/default prepared into a fresh store *dst (in the test folder, named `name`) and opened */
static void prepare_open(char **dst, const char *name, int ndrives, int mirrors, model *dm, blob_table *bt,
                         dfsp_info *info)
{
    errbuf err;
    *dst = dir_in_tmp(name);
    CHECKF(prepare("models/default", *dst, ndrives, mirrors, &err) == 0, "%s", err.msg);
    CHECKF(dfsp_open(*dst, NULL, dm, bt, info, &err) == 0, "%s", err.msg);
}

TEST(store_flipped_byte_is_named)
{
    model dm;
    blob_table bt;
    dfsp_info info;
    char *dst;
    prepare_open(&dst, "flip", 1, 1, &dm, &bt, &info);
    /* flip one byte in the middle of layer 1's expert 0 */
    int b = bt.expert_blob[1 * bt.n_experts + 0];
    uint64_t off = bt.b[b].copy[0].off + bt.b[b].size / 2;
    char pack[1024];
    snprintf(pack, sizeof pack, "%s", info.pack_path[bt.b[b].copy[0].file]);
    blob_table_free(&bt);
    model_free(&dm);
    flip_byte(pack, off);
    /* every expert of every layer is requested over a few tokens with 2 slots: the bad one too */
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s eval --model %s --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --logits-out %s/x.f32 "
             "--ram-budget 100M",
             tu_bin(), dst, test_tmpdir());
    /* the budget covers everything: experts still stream (--ram-budget given) */
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1 && strstr(out, "layer 1 expert 0") && strstr(out, "checksum") && strstr(out, ".pack"),
           "status %d: %s", st, out);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), dst);
    st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1 && strstr(out, "layer 1 expert 0") && strstr(out, "checksum"), "doctor: status %d: %s", st, out);
}

/* A session over st (a store of models/default's prepared copy dm) whose first pass meets the bad
 * bytes at off[0..n) of pack: it fails naming `want` and the checksum and leaves the session
 * empty, and so does the next; with the bytes flipped back, the same session computes exactly
 * what the resident model does. Frees st. */
static void fail_then_recover(const model *dm, store *st, const char *want, const char *pack, const uint64_t *off,
                              int n)
{
    errbuf err;
    model ref_m;
    CHECKF(model_load(&ref_m, "models/default", &err) == 0, "%s", err.msg);
    float *ref = run(&ref_m, NULL, NIDS, &err);
    CHECKF(ref, "%s", err.msg);
    engine *e = tu_engine(dm, st, 1, NULL, &err);
    CHECKF(e, "%s", err.msg);
    session *s = tu_session(e, NIDS, NIDS, &err);
    CHECKF(s, "%s", err.msg);
    session_pass one = {.tokens = IDS, .T = 1, .n_logits = 1}, all = {.tokens = IDS, .T = NIDS, .n_logits = NIDS};
    CHECK(session_run(s, &one, &err) != 0);
    CHECKF(strstr(err.msg, want) && strstr(err.msg, "checksum"), "%s", err.msg);
    CHECKF(store_pinned(st) == 0, "%d slots still pinned after the failed pass", store_pinned(st));
    CHECKF(session_len(s) == 0, "a failed pass left %d positions", session_len(s));
    CHECK(session_run(s, &one, &err) != 0 && strstr(err.msg, "checksum")); /* still bad, still refused */
    for (int i = 0; i < n; i++)
        flip_byte(pack, off[i]);
    /* the same session, untouched by the failures: no reset needed */
    CHECKF(session_run(s, &all, &err) == 0, "%s", err.msg);
    for (int t = 0; t < NIDS; t++)
        CHECK(memcmp(session_logits(s, t), ref + (size_t)t * dm->hp.vocab, sizeof(float) * dm->hp.vocab) == 0);
    session_free(s);
    engine_free(e);
    store_free(st);
    model_free(&ref_m);
    free(ref);
}

/* a failed expert load leaves the session as it was before the pass (the pass wrote only the
 * state it would have committed), releases the failed request's pins (and the streamed spine of
 * the layer it failed in) and forgets the bad slot: with the pack repaired, the same session and
 * store compute exactly what the resident model does */
TEST(store_recovers_after_a_failed_load)
{
    errbuf err;
    model dm;
    blob_table bt;
    dfsp_info info;
    char *dst;
    prepare_open(&dst, "recover", 1, 1, &dm, &bt, &info);
    /* one flipped byte in every expert of layer 1: the first token fails there; with 2 expert slots'
     * worth of budget beyond the spine, then with every spine streamed (the failure comes while
     * layer 1's spine is held) */
    for (int budget = 2; budget >= LEAST; budget -= 3) {
        if (budget == LEAST)
            CHECKF(dfsp_open(dst, NULL, &dm, &bt, &info, &err) == 0, "%s", err.msg);
        char pack[1024];
        uint64_t off[512];
        int ne = bt.n_experts < 512 ? bt.n_experts : 512;
        snprintf(pack, sizeof pack, "%s", info.pack_path[0]);
        for (int e = 0; e < ne; e++) {
            const blob *x = &bt.b[bt.expert_blob[1 * bt.n_experts + e]];
            off[e] = x->copy[0].off + x->size / 2;
            flip_byte(pack, off[e]);
        }
        store *st = open_store(&dm, &info, &bt, budget, 0, NULL, &err);
        CHECKF(st, "%s", err.msg);
        CHECK(budget != LEAST || store_plan_get(st)->spine_streamed == dm.hp.n_layers);
        fail_then_recover(&dm, st, "layer 1 expert", pack, off, ne);
        model_free(&dm);
    }
}

/* The planner spends the budget spine first, except for the working set of expert slots: within
 * the budget, every layer spine resident when it fits with 2 x top_k experts; else as large a
 * working set as fits (never smaller as the budget grows), and once it is whole the fewest layers
 * streamed (never more as the budget grows; the last layer among them); the budget used to within
 * one expert; a budget far beyond the model still a valid plan; below the least, an error naming
 * the globals, spine slots and experts. */
TEST(store_plan_spine_first)
{
    errbuf err;
    model m;
    blob_table bt;
    CHECKF(model_load(&m, "models/default", &err) == 0, "%s", err.msg);
    CHECKF(blob_table_build(&bt, &m, &err) == 0, "%s", err.msg);
    int n = m.hp.n_layers, work = 2 * m.hp.top_k;
    uint64_t X = blob_padded(bt.max_expert);
    store_plan p;
    CHECK(store_plan_make(&bt, bt.spine_bytes + 100 * X, 0, work, &p, &err) == 0);
    CHECK(p.spine_streamed == 0 && p.spine_slots == 0 && p.expert_slots == 100 && p.resident_bytes == bt.spine_bytes);
    /* the spine fits with 4 experts but not with the working set: layers stream to make room */
    CHECK(store_plan_make(&bt, bt.spine_bytes + 4 * X, 0, work, &p, &err) == 0);
    CHECKF(p.spine_streamed > 0 && p.expert_slots >= work && p.working == work, "%d streamed, %d expert slots",
           p.spine_streamed, p.expert_slots);
    int last = n + 1, last_work = 0;
    for (uint64_t b = budget_of(&bt, LEAST); b < bt.spine_bytes + (uint64_t)work * X; b += 16384) {
        CHECKF(store_plan_make(&bt, b, 0, work, &p, &err) == 0, "%llu: %s", (unsigned long long)b, err.msg);
        CHECKF(p.working >= last_work && p.working <= work && p.expert_slots >= p.working,
               "budget %llu keeps a working set of %d (%d slots), a smaller one %d", (unsigned long long)b, p.working,
               p.expert_slots, last_work);
        if (p.working > last_work)
            last = n + 1;
        last_work = p.working;
        CHECKF(p.spine_streamed <= last, "budget %llu streams %d, a smaller one %d", (unsigned long long)b,
               p.spine_streamed, last);
        last = p.spine_streamed;
        uint64_t used = p.resident_bytes + (uint64_t)p.spine_slots * p.spine_slot_bytes + (uint64_t)p.expert_slots * X;
        CHECKF(used <= b && b - used < X, "budget %llu: plan uses %llu", (unsigned long long)b,
               (unsigned long long)used);
        CHECK(p.expert_slots >= STORE_MIN_EXPERT_SLOTS);
        if (p.spine_streamed > 0)
            CHECK(p.streamed[n - 1] && p.spine_slots == STORE_SPINE_SLOTS);
        int cnt = 0;
        for (int i = 0; i < n; i++)
            cnt += p.streamed[i];
        CHECK(cnt == p.spine_streamed);
    }
    CHECKF(last_work == work, "the sweep never reached the whole working set (%d of %d)", last_work, work);
    /* far more than the model: every spine resident, the slot count clamped, not wrapped */
    CHECK(store_plan_make(&bt, (uint64_t)1 << 62, 0, work, &p, &err) == 0 && p.spine_streamed == 0 &&
          p.expert_slots >= STORE_MIN_EXPERT_SLOTS);
    CHECK(store_plan_make(&bt, bt.spine_bytes * 4, STORE_PLAN_STREAM_ALL, work, &p, &err) == 0 && p.spine_streamed == n);
    CHECK(store_plan_make(&bt, budget_of(&bt, LEAST) - 1, STORE_PLAN_STREAM_ALL, work, &p, &err) != 0);
    CHECKF(strstr(err.msg, "below the least") && strstr(err.msg, "globals") && strstr(err.msg, "spine slots") &&
               strstr(err.msg, "experts"),
           "%s", err.msg);
    blob_table_free(&bt);
    model_free(&m);
}

/* A streamed spine is checked like an expert: a flipped byte in the last layer's spine blob (the
 * last layer streams in every plan that streams any) is an error naming the blob and pack, from
 * the CLI and from doctor; through a session, the failed load leaves it untouched, and with the
 * pack repaired the same session computes exactly what the resident model does. */
TEST(store_spine_flipped_byte_is_named)
{
    errbuf err;
    model dm;
    blob_table bt;
    dfsp_info info;
    char *dst, pack[1024], cmd[8192], out[4096];
    prepare_open(&dst, "spine-flip", 1, 1, &dm, &bt, &info);
    int last = dm.hp.n_layers - 1, b = bt.layer_blob[last];
    /* the middle of the blob's largest part: a matrix, not a vector the model copied at load */
    const blob *x = &bt.b[b];
    const blob_part *big = &bt.part[x->first_part];
    for (int i = 1; i < x->nparts; i++)
        if (bt.part[x->first_part + i].len > big->len)
            big = &bt.part[x->first_part + i];
    uint64_t off = x->copy[0].off + big->off + big->len / 2;
    snprintf(pack, sizeof pack, "%s", info.pack_path[x->copy[0].file]);
    flip_byte(pack, off);
    snprintf(cmd, sizeof cmd, "%s eval --model %s --tokens 1,2,3 --logits-out %s/x.f32 --ram-budget 6M", tu_bin(), dst,
             test_tmpdir());
    int st = tu_run(cmd, out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "layer %d spine", last);
    CHECKF(st == 1 && strstr(out, want) && strstr(out, "checksum") && strstr(out, ".pack"), "status %d: %s", st, out);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), dst);
    st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1 && strstr(out, want) && strstr(out, "checksum"), "doctor: status %d: %s", st, out);
    /* the same through a session, then repaired */
    store *sto = open_store(&dm, &info, &bt, LEAST, 1, NULL, &err);
    CHECKF(sto, "%s", err.msg);
    fail_then_recover(&dm, sto, want, pack, &off, 1);
    model_free(&dm);
}

/* Mirrors: each copy is checked the first time it is read (checking a blob once, whichever copy,
 * let a corrupt second copy through once the first had been checked), and a copy that fails is
 * read again from the other one. With the second copy of every spine corrupted, streamed spines
 * read from both copies of two equal (emulated, so fast that every choice is a tie, which goes
 * to the drive sent fewer bytes) drives: the logits are the resident ones, the failures are
 * counted, the CLI warns and points at doctor, which names the bad copy. */
TEST(store_mirror_copies_are_each_checked)
{
    errbuf err;
    model dm, ref_m;
    blob_table bt;
    dfsp_info info;
    char *dst;
    CHECKF(model_load(&ref_m, "models/default", &err) == 0, "%s", err.msg);
    float *ref = run(&ref_m, NULL, NIDS, &err);
    CHECKF(ref, "%s", err.msg);
    prepare_open(&dst, "mirror-each", 2, 2, &dm, &bt, &info);
    for (int i = 0; i < dm.hp.n_layers; i++) {
        const blob *x = &bt.b[bt.layer_blob[i]];
        CHECK(x->ncopies == 2);
        flip_byte(info.pack_path[x->copy[1].file], x->copy[1].off + x->size / 2);
    }
    store *st = open_store(&dm, &info, &bt, LEAST, 1, "1000000:0,1000000:0", &err);
    CHECKF(st, "%s", err.msg);
    float *out = run(&dm, st, 1, &err);
    CHECKF(out, "%s", err.msg);
    int same = memcmp(out, ref, sizeof(float) * NIDS * (size_t)dm.hp.vocab) == 0;
    store_stats ss;
    store_stats_get(st, &ss);
    CHECKF(same && ss.copy_failures > 0, "logits %s, %llu reads of a bad copy noticed", same ? "right" : "WRONG",
           (unsigned long long)ss.copy_failures);
    CHECK(store_pinned(st) == 0);
    free(out);
    free(ref);
    store_free(st);
    model_free(&dm);
    model_free(&ref_m);
    char cmd[8192], txt[8192];
    snprintf(cmd, sizeof cmd, "%s eval --model %s --tokens 1,2,3,4,5,6 --logits-out %s/m.f32 --ram-budget 6M "
             "--emulate-drives 1000000:0,1000000:0 --prefill-chunk 1", tu_bin(), dst, test_tmpdir());
    CHECKF(tu_run(cmd, txt, sizeof txt) == 0 && strstr(txt, "warning") && strstr(txt, "doctor --model"), "%s", txt);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), dst);
    CHECKF(tu_run(cmd, txt, sizeof txt) == 1 && strstr(txt, "spine") && strstr(txt, "copy 1") &&
               strstr(txt, "checksum"),
           "%s", txt);
}

/* run with a budget below the spine: from a DFSP store and from the Hugging Face folder, the ids of
 * the resident run, --stats saying what streamed; eval's logits bit-identical to resident; a
 * budget below the least is a one-line error */
TEST(store_spine_streams_from_the_cli)
{
    char cmd[8192], resident[8192], out[8192];
    errbuf err;
    char *dst = dir_in_tmp("spine-cli");
    CHECKF(prepare("models/default", dst, 2, 1, &err) == 0, "%s", err.msg);
    snprintf(cmd, sizeof cmd, "%s run --model models/default --tokens 5,6,7 --max-new 12 --print-ids", tu_bin());
    CHECK(tu_run(cmd, resident, sizeof resident) == 0);
    resident[strcspn(resident, "\n")] = 0;
    const char *models[2] = {dst, "models/default"}, *pf[2] = {"on", "off"};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "%s run --model %s --tokens 5,6,7 --max-new 12 --print-ids --ram-budget 6M --prefetch %s --stats",
                 tu_bin(), models[k], pf[k]);
        CHECKF(tu_run(cmd, out, sizeof out) == 0, "%s", out);
        CHECKF(strstr(out, "[stats] spine: 7 layers streamed through 2 slots") && strstr(out, "1 of 8 layer spines"),
               "%s", out);
        out[strcspn(out, "\n")] = 0;
        CHECKF(strcmp(out, resident) == 0, "%s: %s vs %s", models[k], out, resident);
    }
    /* eval's logits at every position: the same bits streamed as resident */
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/spine-resident.f32", test_tmpdir());
    snprintf(b, sizeof b, "%s/spine-streamed.f32", test_tmpdir());
    snprintf(cmd, sizeof cmd,
             "%s eval --tokens 3,1,4,1,5,9,2,6 --logits-out %s && %s eval --model %s --tokens 3,1,4,1,5,9,2,6 "
             "--logits-out %s --ram-budget 6M --prefill-chunk 3",
             tu_bin(), a, tu_bin(), dst, b);
    CHECKF(tu_run(cmd, out, sizeof out) == 0, "%s", out);
    size_t na, nb;
    float *la = tu_read_f32(a, &na), *lb = tu_read_f32(b, &nb);
    int same = la && lb && na == nb && na > 0 && memcmp(la, lb, na * sizeof(float)) == 0;
    free(la);
    free(lb);
    CHECKF(same, "eval logits differ streamed (%zu floats) and resident (%zu)", nb, na);
    snprintf(cmd, sizeof cmd, "%s run --model %s --tokens 5 --max-new 2 --ram-budget 3M", tu_bin(), dst);
    int st = tu_run(cmd, out, sizeof out);
    const char *nl = strchr(out, '\n');
    CHECKF(st == 1 && strstr(out, "below the least") && strstr(out, "globals") && nl && !nl[1], "%s", out);
}

/* doctor reads every copy: a flipped byte in the second copy of a spine blob is found */
TEST(store_doctor_checks_mirrors)
{
    model dm;
    blob_table bt;
    dfsp_info info;
    char *dst;
    prepare_open(&dst, "mirror", 2, 2, &dm, &bt, &info);
    int b = -1;
    for (int i = 0; i < bt.n && b < 0; i++)
        if (bt.b[i].kind == BLOB_SPINE && bt.b[i].ncopies == 2)
            b = i;
    CHECKF(b >= 0, "no mirrored spine blob");
    char pack[1024], cmd[8192], out[4096], nm[64];
    snprintf(pack, sizeof pack, "%s", info.pack_path[bt.b[b].copy[1].file]);
    uint64_t off = bt.b[b].copy[1].off + bt.b[b].size - 1;
    blob_name(&bt.b[b], nm, sizeof nm);
    blob_table_free(&bt);
    model_free(&dm);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), dst);
    CHECKF(tu_run(cmd, out, sizeof out) == 0, "%s", out);
    flip_byte(pack, off);
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1 && strstr(out, nm) && strstr(out, "copy 1") && strstr(out, "checksum"), "status %d: %s", st, out);
}

/* Router lookahead on the trained default model, decoding a real prompt through a cache of about
 * a third of its experts (`run --stats`): guesses are read, at least 3 in 4 are used by the layer
 * they were for (a wrong guess is never credited to a later pass), fewer experts are read on
 * demand, and the generated ids are those without lookahead. Counts, not timing. */
static void lookahead_run(const char *store_dir, const char *pf, char *ids, size_t cap, unsigned long long *reads,
                          unsigned long long *used, unsigned long long *demand)
{
    char cmd[8192], out[16384];
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --prompt 'def fibonacci(n):' --max-new 48 --print-ids --ram-budget 10M "
             "--prefetch %s --stats",
             tu_bin(), store_dir, pf);
    CHECKF(tu_run(cmd, out, sizeof out) == 0, "%s", out);
    const char *p = strstr(out, "[stats] prefetch: ");
    CHECKF(p && sscanf(p, "[stats] prefetch: %llu reads, %llu of them used by the layer they were for; %llu", reads,
                       used, demand) == 3,
           "%s", out);
    snprintf(ids, cap, "%.*s", (int)strcspn(out, "\n"), out);
}

TEST(store_lookahead_guesses_are_used)
{
    model dm;
    blob_table bt;
    dfsp_info info;
    char *dst;
    prepare_open(&dst, "lookahead", 1, 1, &dm, &bt, &info);
    blob_table_free(&bt);
    model_free(&dm);
    char ids_off[4096], ids_on[4096];
    unsigned long long r0, u0, d0, r1, u1, d1;
    lookahead_run(dst, "off", ids_off, sizeof ids_off, &r0, &u0, &d0);
    lookahead_run(dst, "on", ids_on, sizeof ids_on, &r1, &u1, &d1);
    CHECKF(strcmp(ids_off, ids_on) == 0, "ids differ: %s vs %s", ids_off, ids_on);
    CHECKF(r0 == 0 && r1 > 0 && u1 * 4 >= r1 * 3, "lookahead: %llu guesses read, %llu used", r1, u1);
    CHECKF(d1 < d0, "lookahead did not lower the reads on demand (%llu vs %llu without)", d1, d0);
}

/* The lookahead's bookkeeping, through the weight source itself: a guess its layer asks for is
 * credited once; a guess its layer does not ask for is never credited, even when a later pass
 * asks for that expert (it is an ordinary cached expert by then). */
static void request_one(const weight_src *xs, int layer, int id)
{
    errbuf err;
    mlp_w mats;
    int got;
    CHECKF(xs->begin(xs->ctx, layer, &id, 1, &err) == 0, "%s", err.msg);
    CHECKF(xs->next(xs->ctx, &got, &mats, &err) == 1 && got == id, "%s", err.msg);
    xs->release(xs->ctx, layer, id);
    CHECKF(xs->next(xs->ctx, &got, &mats, &err) == 0, "a second expert was handed over");
}

TEST(store_guesses_are_credited_to_their_layer)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, "models/default", &err) == 0, "%s", err.msg);
    int layer = 0;
    while (layer < m.hp.n_layers && m.hp.ffn_kind[layer] != FFN_MOE)
        layer++;
    CHECK(layer < m.hp.n_layers);
    store *st = open_store(&m, NULL, NULL, 8, 1, NULL, &err);
    CHECKF(st, "%s", err.msg);
    const weight_src *xs = store_weights(st);
    int right = 2, wrong = 5, other = 7;
    xs->pass_begin(xs->ctx, 1);
    xs->prefetch(xs->ctx, layer, &right, 1);
    request_one(xs, layer, right);
    xs->pass_begin(xs->ctx, 1);
    xs->prefetch(xs->ctx, layer, &wrong, 1);
    request_one(xs, layer, other);
    xs->pass_begin(xs->ctx, 1);
    request_one(xs, layer, wrong); /* cached, but no longer a guess */
    store_stats ss;
    store_stats_get(st, &ss);
    store_free(st);
    model_free(&m);
    CHECKF(ss.prefetch_reads == 2 && ss.prefetch_hits == 1, "%llu guesses read, %llu credited (want 2, 1)",
           (unsigned long long)ss.prefetch_reads, (unsigned long long)ss.prefetch_hits);
    CHECKF(ss.reads == 3 && ss.requests == 3, "%llu reads for %llu requests (want 3, 3)", (unsigned long long)ss.reads,
           (unsigned long long)ss.requests);
}

/* A device backend's side of the weight source (weight_src.held / adopt): the RAM copy of an
 * expert the device holds is the first to make room, even before older ones; and an expert the
 * device drops comes back into RAM with the bytes the backend copies in, so that asking for it
 * again reads nothing. */
static void copy_mat(const kmat *dst, const kmat *src)
{
    memcpy((void *)dst->data, src->data, wfmt_data_bytes(src->fmt, src->rows, src->cols));
    if (wfmt_scale_bytes(src->fmt, src->rows, src->cols))
        memcpy((void *)dst->scale, src->scale, wfmt_scale_bytes(src->fmt, src->rows, src->cols));
}

static int same_mat(const kmat *a, const kmat *b)
{
    size_t sb = wfmt_scale_bytes(a->fmt, a->rows, a->cols);
    return !memcmp(a->data, b->data, wfmt_data_bytes(a->fmt, a->rows, a->cols)) &&
           (!sb || !memcmp(a->scale, b->scale, sb));
}

/* the k-th routed expert of m, counted layer by layer: its id, and its layer in *layer */
static int nth_expert(const model *m, int k, int *layer)
{
    for (int i = 0; i < m->hp.n_layers; i++) {
        if (m->hp.ffn_kind[i] != FFN_MOE)
            continue;
        if (k < m->hp.n_experts) {
            *layer = i;
            return k;
        }
        k -= m->hp.n_experts;
    }
    return -1;
}

/* a pass asking for the k-th expert alone */
static void request_nth(const model *m, const weight_src *xs, int k)
{
    int layer = 0, id = nth_expert(m, k, &layer);
    CHECKF(id >= 0, "the model has fewer than %d experts", k + 1);
    xs->pass_begin(xs->ctx, 1);
    request_one(xs, layer, id);
}

TEST(store_device_held_experts_make_room_first)
{
    errbuf err;
    model m;
    CHECKF(model_load(&m, "models/default", &err) == 0, "%s", err.msg);
    store *st = open_store(&m, NULL, NULL, 8, 0, NULL, &err);
    CHECKF(st, "%s", err.msg);
    const weight_src *xs = store_weights(st);
    int nx = store_slots(st), h = nx / 2, layer = 0, id;
    CHECKF(nx >= 4, "%d slots", nx);
    for (int k = 0; k < nx; k++) /* every slot full, expert nx - 1 the most recent */
        request_nth(&m, xs, k);
    for (int k = nx - h; k < nx; k++) { /* the device holds the newest h */
        id = nth_expert(&m, k, &layer);
        xs->held(xs->ctx, layer, id, 1);
    }
    for (int k = nx; k < nx + h; k++) /* h new ones take the held ones' slots, not the oldest */
        request_nth(&m, xs, k);
    store_stats_reset(st);
    for (int k = 0; k < nx - h; k++)
        request_nth(&m, xs, k);
    store_stats ss;
    store_stats_get(st, &ss);
    CHECKF(ss.reads == 0 && ss.hits == (uint64_t)(nx - h), "%llu reads, %llu of %d hits (want 0 reads)",
           (unsigned long long)ss.reads, (unsigned long long)ss.hits, nx - h);
    /* the device drops expert nx - 1 (no longer in RAM): adopted with its own bytes, it is a hit */
    mlp_w host, got;
    int g;
    store_stats_reset(st);
    id = nth_expert(&m, 0, &layer);
    CHECK(xs->adopt(xs->ctx, layer, id, &host) == 0); /* in RAM already: nothing to do */
    int gone = nth_expert(&m, nx - 1, &layer);
    xs->held(xs->ctx, layer, gone, 0);
    CHECK(xs->adopt(xs->ctx, layer, gone, &host) == 1);
    const mlp_w *src = &m.L[layer].moe.experts[gone];
    copy_mat(&host.gate, &src->gate);
    copy_mat(&host.up, &src->up);
    copy_mat(&host.down, &src->down);
    xs->adopted(xs->ctx, layer, gone, 1);
    xs->pass_begin(xs->ctx, 1);
    CHECKF(xs->begin(xs->ctx, layer, &gone, 1, &err) == 0, "%s", err.msg);
    CHECKF(xs->next(xs->ctx, &g, &got, &err) == 1 && g == gone, "%s", err.msg);
    CHECK(same_mat(&got.gate, &src->gate) && same_mat(&got.up, &src->up) && same_mat(&got.down, &src->down));
    xs->release(xs->ctx, layer, gone);
    /* an adoption whose copy failed leaves nothing behind: the expert is read again */
    int lost = nth_expert(&m, nx + h, &layer);
    CHECK(xs->adopt(xs->ctx, layer, lost, &host) == 1);
    xs->adopted(xs->ctx, layer, lost, 0);
    request_nth(&m, xs, nx + h);
    store_stats_get(st, &ss);
    store_free(st);
    model_free(&m);
    CHECKF(ss.reads == 1 && ss.hits == 1 && ss.adopted == 1, "%llu reads, %llu hits, %llu adopted (want 1, 1, 1)",
           (unsigned long long)ss.reads, (unsigned long long)ss.hits, (unsigned long long)ss.adopted);
}

/* With a device backend the spines live in its memory once it has copied them (STORE_PLAN_DEVICE):
 * a budget of the globals and ten experts keeps ten expert slots and streams no spine, where the RAM
 * plan streams spines; below the globals and the least experts it is an error naming both. The
 * spines' pages then go (store_spines_release), and a host that reads them anyway gets the same
 * bytes back from the drive: the logits of the resident model, bit for bit. */
TEST(store_device_spines_cost_no_ram)
{
    errbuf err;
    model m;
    blob_table bt;
    CHECKF(model_load(&m, "models/default", &err) == 0, "%s", err.msg);
    CHECKF(blob_table_build(&bt, &m, &err) == 0, "%s", err.msg);
    uint64_t X = blob_padded(bt.max_expert), globals = bt.b[bt.global_blob].size, layers = 0;
    for (int i = 0; i < bt.n_layers; i++)
        layers += bt.b[bt.layer_blob[i]].size;
    int work = 2 * m.hp.top_k;
    store_plan p;
    CHECKF(store_plan_make(&bt, globals + 10 * X, STORE_PLAN_DEVICE, work, &p, &err) == 0, "%s", err.msg);
    CHECKF(p.spine_streamed == 0 && p.expert_slots == 10 && p.device_bytes == layers &&
               p.resident_bytes == globals + layers,
           "%d streamed, %d slots, %llu device bytes", p.spine_streamed, p.expert_slots,
           (unsigned long long)p.device_bytes);
    store_plan q;
    if (store_plan_make(&bt, globals + 10 * X, 0, work, &q, &err) == 0) /* RAM keeps the spines itself */
        CHECKF(q.spine_streamed > 0 && q.expert_slots < 10, "RAM plan: %d streamed, %d slots", q.spine_streamed,
               q.expert_slots);
    CHECK(store_plan_make(&bt, globals + (STORE_MIN_EXPERT_SLOTS - 1) * X, STORE_PLAN_DEVICE, work, &p, &err) != 0);
    CHECKF(strstr(err.msg, "device") && strstr(err.msg, "globals") && strstr(err.msg, "experts"), "%s", err.msg);
    float *ref = run(&m, NULL, NIDS, &err);
    CHECKF(ref, "%s", err.msg);
    store_cfg c;
    memset(&c, 0, sizeof c);
    io_cfg_default(&c.io);
    c.ram_budget = globals + 10 * X;
    c.spines_on_device = 1;
    store *st;
    CHECKF(store_open(&st, &m, &bt, NULL, &c, &err) == 0, "%s", err.msg);
    CHECK(store_plan_get(st)->spine_streamed == 0 && store_slots(st) == 10);
    uint64_t gone = store_spines_release(st);
    CHECKF(gone > layers / 2 && gone <= layers, "%llu of %llu spine bytes let go", (unsigned long long)gone,
           (unsigned long long)layers);
    float *got = run(&m, st, 5, &err);
    CHECKF(got, "%s", err.msg);
    CHECK(memcmp(ref, got, sizeof(float) * (size_t)NIDS * (size_t)m.hp.vocab) == 0);
    free(ref);
    free(got);
    store_free(st);
    model_free(&m);
}

TEST(store_truncated_pack)
{
    errbuf err;
    char *dst = dir_in_tmp("trunc");
    CHECKF(prepare("models/default", dst, 1, 1, &err) == 0, "%s", err.msg);
    model dm;
    blob_table bt;
    dfsp_info info;
    CHECK(dfsp_open(dst, NULL, &dm, &bt, &info, &err) == 0);
    char pack[1024];
    snprintf(pack, sizeof pack, "%s", info.pack_path[0]);
    blob_table_free(&bt);
    model_free(&dm);
    CHECK(truncate(pack, 4096 * 10) == 0);
    CHECK(dfsp_open(dst, NULL, &dm, &bt, &info, &err) != 0);
    CHECKF(strstr(err.msg, "truncated") && strstr(err.msg, ".pack"), "%s", err.msg);
}

TEST(store_prepare_resumes)
{
    char *dst = dir_in_tmp("resume"), cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "DELTAFIN_PREPARE_STOP_AFTER=20 %s prepare --model models/default --out %s", tu_bin(),
             dst);
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 3, "the interrupted prepare exited %d: %s", st, out);
    char man[4200];
    snprintf(man, sizeof man, "%s/manifest.json", dst);
    FILE *f = fopen(man, "r");
    CHECKF(!f, "an interrupted prepare left a manifest");
    snprintf(cmd, sizeof cmd, "%s prepare --model models/default --out %s", tu_bin(), dst);
    st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 0 && strstr(out, "20 verified from an earlier run"), "status %d: %s", st, out);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), dst);
    st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 0 && strstr(out, "every copy of every blob matches"), "status %d: %s", st, out);
    /* and it computes what the source computes */
    errbuf err;
    model a, b;
    blob_table bt;
    dfsp_info info;
    CHECK(model_load(&a, "models/default", &err) == 0);
    CHECKF(dfsp_open(dst, NULL, &b, &bt, &info, &err) == 0, "%s", err.msg);
    blob_table_free(&bt);
    float *la = run(&a, NULL, NIDS, &err), *lb = run(&b, NULL, NIDS, &err);
    int same = la && lb && memcmp(la, lb, sizeof(float) * NIDS * (size_t)a.hp.vocab) == 0;
    free(la);
    free(lb);
    model_free(&a);
    model_free(&b);
    CHECK(same);
}

TEST(store_refuses_another_model)
{
    errbuf err;
    char *dst = dir_in_tmp("mix");
    CHECKF(prepare("models/default", dst, 1, 1, &err) == 0, "%s", err.msg);
    CHECK(prepare(test_data("oracle/kimi_k3-b"), dst, 1, 1, &err) != 0);
    CHECKF(strstr(err.msg, "another model"), "%s", err.msg);
    /* an unfinished prepare of another model is refused too */
    char *dst2 = dir_in_tmp("mix2"), cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "DELTAFIN_PREPARE_STOP_AFTER=5 %s prepare --model models/default --out %s", tu_bin(),
             dst2);
    CHECK(tu_run(cmd, out, sizeof out) == 3);
    CHECK(prepare(test_data("oracle/kimi_k3-b"), dst2, 1, 1, &err) != 0);
    CHECKF(strstr(err.msg, "another model") && strstr(err.msg, "journal"), "%s", err.msg);
    /* the same model again is fine */
    CHECKF(prepare("models/default", dst, 1, 1, &err) == 0, "%s", err.msg);
    (void)copy_file;
}

TEST(store_cli_options)
{
    char cmd[8192], out[8192];
    char *dst = dir_in_tmp("cli");
    errbuf err;
    CHECKF(prepare("models/default", dst, 2, 2, &err) == 0, "%s", err.msg);
    /* the run command with streaming and stats, vs resident: same ids */
    char resident[8192], streamed[8192];
    snprintf(cmd, sizeof cmd, "%s run --model models/default --tokens 5,6,7 --max-new 12 --print-ids", tu_bin());
    CHECK(tu_run(cmd, resident, sizeof resident) == 0);
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --tokens 5,6,7 --max-new 12 --print-ids --ram-budget 10M --emulate-drives "
             "500:100,300:200 --prefetch off --io pread --stats",
             tu_bin(), dst);
    CHECK(tu_run(cmd, streamed, sizeof streamed) == 0);
    CHECKF(strstr(streamed, "[stats] store: DFSP") && strstr(streamed, "drive 1 (pread, depth "), "%s", streamed);
    /* an emulated drive's rates are against its emulated speed */
    CHECKF(strstr(streamed, " of its emulated 0.50 GB/s)") && strstr(streamed, " of its emulated 0.30 GB/s)"), "%s",
           streamed);
    /* the routing counts are kept for the next run's eviction: a count per blob */
    char heat[4200];
    snprintf(heat, sizeof heat, "%s/heat.bin", dst);
    struct stat hs;
    CHECKF(stat(heat, &hs) == 0 && hs.st_size > 4 && (hs.st_size - 4) % 4 == 0, "%s", heat);
    streamed[strcspn(streamed, "\n")] = 0; /* the ids line; --stats lines follow */
    resident[strcspn(resident, "\n")] = 0;
    CHECKF(strcmp(resident, streamed) == 0, "%s vs %s", resident, streamed);
    snprintf(cmd, sizeof cmd, "%s run --tokens 5 --max-new 2 --ram-budget lots", tu_bin());
    CHECKF(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "--ram-budget"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run --model %s --tokens 5 --max-new 2 --ram-budget 10M --emulate-drives 5x", tu_bin(),
             dst);
    CHECKF(tu_run(cmd, out, sizeof out) == 1 && strstr(out, "--emulate-drives"), "%s", out);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECKF(f && fputs(text, f) >= 0, "%s", path);
    fclose(f);
}

/* each drive is read with its own request size and depth, from the tuning file doctor leaves in
 * its folder; a malformed file is an error naming it; the logits do not change */
TEST(store_drive_tuning_is_used)
{
    errbuf err;
    char *dst, d0[4200], d1[4200], tf[4300];
    model dm;
    blob_table bt;
    dfsp_info info;
    prepare_open(&dst, "store-tuned", 2, 1, &dm, &bt, &info);
    snprintf(d0, sizeof d0, "%s-drive0", dst);
    snprintf(d1, sizeof d1, "%s-drive1", dst);
    io_cfg c;
    io_cfg_default(&c);
    CHECK(io_tune_load(&c, 1, d1, &err) == 0); /* never measured: the defaults */
    snprintf(tf, sizeof tf, "%s/%s", d1, IO_TUNE_FILE);
    write_text(tf, "{\"request_bytes\": 5000, \"depth\": 2}");
    CHECKF(io_tune_load(&c, 1, d1, &err) == -1 && strstr(err.msg, tf) && strstr(err.msg, "request_bytes"), "%s",
           err.msg);
    write_text(tf, "{\"request_bytes\": 65536, \"depth\": 0}");
    CHECKF(io_tune_load(&c, 1, d1, &err) == -1 && strstr(err.msg, "'depth'"), "%s", err.msg);
    write_text(tf, "{\"request_bytes\": 65536, \"depth\": 2, \"best_gbps\": -1}");
    CHECKF(io_tune_load(&c, 1, d1, &err) == -1 && strstr(err.msg, "'best_gbps'"), "%s", err.msg);
    write_text(tf, "{\"request_bytes\": 65536, \"depth\": 2, \"sustained_gbps\": \"fast\"}");
    CHECKF(io_tune_load(&c, 1, d1, &err) == -1 && strstr(err.msg, "'sustained_gbps'"), "%s", err.msg);
    write_text(tf, "{\"request_bytes\": 65536,");
    CHECKF(io_tune_load(&c, 1, d1, &err) == -1 && strstr(err.msg, tf), "%s", err.msg);
    /* a store whose drive folder holds a malformed tuning file does not open */
    blob_table bt2;
    CHECKF(blob_table_build(&bt2, &dm, &err) == 0, "%s", err.msg);
    store *bad = open_store(&dm, &info, &bt2, 3, 0, NULL, &err);
    CHECKF(!bad && strstr(err.msg, IO_TUNE_FILE), "opened with a malformed %s (%s)", tf, bad ? "" : err.msg);
    store_free(bad);
    unlink(tf);
    CHECKF(io_tune_save(d0, 8192, 2, 1.0, 2.5, 0, 0, &err) == 0, "%s", err.msg); /* drive 0: 8 KiB x 2 */
    float *ref = run(&dm, NULL, NIDS, &err);
    store *st = open_store(&dm, &info, &bt, 3, 0, NULL, &err);
    CHECKF(ref && st, "%s", err.msg);
    io_engine *io = store_io(st);
    CHECKF(io_drive_depth(io, 0) == 2 && io_drive_chunk(io, 0) == 8192, "drive 0: depth %d x %llu",
           io_drive_depth(io, 0), (unsigned long long)io_drive_chunk(io, 0));
    CHECKF(io_drive_depth(io, 1) == 4 && io_drive_chunk(io, 1) == (4u << 20), "drive 1: depth %d x %llu",
           io_drive_depth(io, 1), (unsigned long long)io_drive_chunk(io, 1));
    CHECKF(io_drive_best_gbps(io, 0) == 2.5 && io_drive_best_gbps(io, 1) == 0, "doctor's rates %g %g",
           io_drive_best_gbps(io, 0), io_drive_best_gbps(io, 1));
    float *got = run(&dm, st, 4, &err);
    io_drive_stats s0, s1;
    io_stats(io, 0, &s0);
    io_stats(io, 1, &s1);
    store_free(st);
    model_free(&dm);
    CHECKF(got, "%s", err.msg);
    int same = memcmp(got, ref, sizeof(float) * NIDS * 4096) == 0;
    free(got);
    free(ref);
    CHECK(same);
    /* every request on drive 0 was at most 8 KiB; drive 1's blobs went in one request each */
    CHECKF(s0.bytes > 0 && s1.bytes > 0, "drive bytes %llu %llu", (unsigned long long)s0.bytes,
           (unsigned long long)s1.bytes);
    CHECKF(s0.reqs >= (s0.bytes + 8191) / 8192, "drive 0: %llu requests for %llu bytes", (unsigned long long)s0.reqs,
           (unsigned long long)s0.bytes);
    CHECKF(s1.reqs * 8192 < s1.bytes, "drive 1: %llu requests for %llu bytes", (unsigned long long)s1.reqs,
           (unsigned long long)s1.bytes);
    /* the mean depth --stats prints: some requests in flight while busy, never more than drive 0's 2 */
    double d0m = s0.busy_s > 0 ? s0.depth_s / s0.busy_s : 0;
    CHECKF(d0m >= 1.0 && d0m <= 2.0 + 1e-9, "drive 0: mean depth %.3f with a depth of 2", d0m);
}

/* doctor --drives measures and leaves the tuning that store_drive_tuning_is_used reads (with the
 * rate its reads in order keep up, unless --sustain 0); --no-save leaves nothing */
TEST(store_doctor_saves_drive_tuning)
{
    char cmd[9000], out[8192], tf[4300];
    errbuf err;
    char *a = dir_in_tmp("doctor-a"), *b = dir_in_tmp("doctor-b");
    mkdir(a, 0755);
    mkdir(b, 0755);
    snprintf(cmd, sizeof cmd,
             "%s doctor --drives %s --size 64M --sustain 0 && %s doctor --drives %s --size 64M --sustain 0.3 --no-save",
             tu_bin(), a, tu_bin(), b);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "GB/s"), "%s", out);
    io_cfg c;
    io_cfg_default(&c);
    CHECKF(io_tune_load(&c, 0, a, &err) == 1, "%s", err.msg);
    CHECKF(c.drive_depth[0] >= 1 && c.drive_chunk[0] >= 4096, "depth %d request %llu", c.drive_depth[0],
           (unsigned long long)c.drive_chunk[0]);
    CHECKF(c.drive_best_gbps[0] > 0, "no best rate saved");
    CHECKF(c.drive_sustained_gbps[0] == 0, "a sustained rate %g saved after --sustain 0", c.drive_sustained_gbps[0]);
    snprintf(tf, sizeof tf, "%s/%s", b, IO_TUNE_FILE);
    CHECKF(access(tf, F_OK) != 0, "%s exists after --no-save", tf);
    /* a store on the measured drive: --stats puts each drive's rate over the run against doctor's */
    char *st = dir_in_tmp("doctor-store");
    snprintf(cmd, sizeof cmd,
             "%s prepare --model models/default --out %s --drives %s >/dev/null && %s run --model %s --tokens 3,4,5 "
             "--max-new 4 --ram-budget 10M --stats 2>&1",
             tu_bin(), st, a, tu_bin(), st);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, " of doctor's "), "%s", out);
    /* measured again with the store's pack in the folder: random reads of it (cold model data) are
     * reported, saved, and --stats puts decode's rate against them too */
    snprintf(cmd, sizeof cmd, "%s doctor --drives %s --size 64M --sustain 0.3 && %s run --model %s --tokens 3,4,5 "
             "--max-new 4 --ram-budget 10M --stats 2>&1", tu_bin(), a, tu_bin(), st);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, " GB/s |\n") &&
               strstr(out, "doctor read the store's pack at") && strstr(out, "GB/s doctor sustained)"),
           "%s", out);
    CHECKF(io_tune_load(&c, 0, a, &err) == 1 && c.drive_cold_gbps[0] > 0, "cold rate %g (%s)", c.drive_cold_gbps[0],
           err.msg);
    /* and the tuning's reads of the pack in order kept up for --sustain seconds */
    CHECKF(c.drive_sustained_gbps[0] > 0, "no sustained rate saved");
    /* the tuning was picked from the pack's grid: its own rate is within 5% of that grid's best */
    char tfa[4300];
    snprintf(tfa, sizeof tfa, "%s/%s", a, IO_TUNE_FILE);
    json_t *j = jsonr_load_file(tfa, &err);
    double g = 0;
    CHECKF(j && jsonr_num(j, "gbps", &g, 0, tfa, &err) == 0, "%s", err.msg);
    json_decref(j);
    CHECKF(g >= 0.95 * c.drive_cold_gbps[0] - 1e-3 && g <= c.drive_cold_gbps[0] + 1e-3,
           "tuning's rate %.3f against the pack grid's best %.3f", g, c.drive_cold_gbps[0]);
}

/* ---- prepare --spine int8 ---- */

/* Every layer matrix of the int8 store against the source's: the router and the non-plain ones
 * as released (same bytes), every other plain matrix with 32k columns as INT8 whose codes are
 * within half a step of the source and whose scale is the least BF16 >= max|w| / 127. */
static void check_int8_layers(const model *src, const model *q8)
{
    int nq = 0;
    for (int l = 0; l < src->hp.n_layers; l++) {
        layer_w a = src->L[l], b = q8->L[l];
        kmat *ma[MODEL_LAYER_MATS], *mb[MODEL_LAYER_MATS];
        int n = model_layer_mats(&a, ma);
        CHECK(n == model_layer_mats(&b, mb));
        for (int k = 0; k < n; k++) {
            int plain = ma[k]->fmt == WF_BF16 || ma[k]->fmt == WF_F16 || ma[k]->fmt == WF_F32;
            int want = plain && ma[k]->cols % 32 == 0 && ma[k] != &a.moe.router;
            CHECKF(mb[k]->fmt == (want ? WF_INT8G32 : ma[k]->fmt), "layer %d matrix %d: %s, source %s", l, k,
                   wfmt_table[mb[k]->fmt].name, wfmt_table[ma[k]->fmt].name);
            if (!want) {
                CHECK(memcmp(ma[k]->data, mb[k]->data, (size_t)ma[k]->rows * ma[k]->row_bytes) == 0);
                continue;
            }
            nq++;
            int cols = ma[k]->cols;
            float *w = malloc(sizeof(float) * (size_t)cols), *d = malloc(sizeof(float) * (size_t)cols);
            for (int r = 0; r < ma[k]->rows && !test_failed(); r++) {
                wfmt_table[ma[k]->fmt].decode(ma[k], r, 0, cols, w);
                wfmt_table[WF_INT8G32].decode(mb[k], r, 0, cols, d);
                const uint8_t *sp = mb[k]->scale + (size_t)r * mb[k]->scale_stride;
                for (int g = 0; g < cols / 32; g++) {
                    uint16_t h = (uint16_t)(sp[2 * g] | (sp[2 * g + 1] << 8));
                    float s = bf16_to_f32(h), amax = 0;
                    for (int j = 0; j < 32; j++)
                        amax = fabsf(w[32 * g + j]) > amax ? fabsf(w[32 * g + j]) : amax;
                    float step = amax / 127.0f;
                    CHECKF(s >= step && (h == 0 || bf16_to_f32((uint16_t)(h - 1)) < step),
                           "layer %d matrix %d row %d group %d: scale %g for max %g", l, k, r, g, s, amax);
                    for (int j = 0; j < 32; j++)
                        CHECKF(fabsf(w[32 * g + j] - d[32 * g + j]) <= 0.5f * s * 1.0001f,
                               "layer %d matrix %d row %d col %d: %g coded as %g (step %g)", l, k, r, 32 * g + j,
                               w[32 * g + j], d[32 * g + j], s);
                }
            }
            free(w);
            free(d);
        }
    }
    CHECK(nq > 0);
}

/* An int8 store is its own model: the matrices coded as spineq.h says; its logits the same bits
 * resident, with its spines streamed, on 1 or 2 threads, in chunks of 1, 3 or 12; near the
 * source's but not equal. It never shares a pack with the as-released store of the same model,
 * and neither a finished nor an unfinished store is completed the other way. */
TEST(store_spine_int8)
{
    errbuf err;
    char *q8 = dir_in_tmp("int8"), *plain = dir_in_tmp("int8-plain"), drive[4200], cmd[9000], out[8192];
    snprintf(drive, sizeof drive, "%s/int8-drive", test_tmpdir());
    mkdir(drive, 0755);
    snprintf(cmd, sizeof cmd, "%s prepare --model models/default --out %s --drives %s --spine int8", tu_bin(), q8,
             drive);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "prepare: spine int8: "), "%s", out);
    snprintf(cmd, sizeof cmd, "%s doctor --model %s", tu_bin(), q8);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "every copy of every blob matches"), "%s", out);
    const char *dr[1] = {drive};
    dfsp_prepare_opts o = {dr, 1, 1, 0};
    dfsp_prepare_stats ps;
    CHECKF(dfsp_prepare("models/default", plain, &o, &ps, &err) == 0, "%s", err.msg);
    model src, dm;
    blob_table bt;
    dfsp_info info;
    CHECKF(model_load(&src, "models/default", &err) == 0, "%s", err.msg);
    CHECKF(dfsp_open(q8, NULL, &dm, &bt, &info, &err) == 0, "%s", err.msg);
    blob_table_free(&bt);
    CHECKF(info.spine_int8 && strstr(info.pack_path[0], "-int8.pack"), "%d %s", info.spine_int8, info.pack_path[0]);
    char man[4300];
    snprintf(man, sizeof man, "%s/manifest.json", q8);
    json_t *j = jsonr_load_file(man, &err);
    CHECKF(j, "%s", err.msg);
    json_object_set_new(j, "spine", json_string("int4"));
    dfsp_manifest pm;
    int bad = dfsp_manifest_parse(j, man, &pm, &err);
    json_decref(j);
    CHECKF(bad != 0 && strstr(err.msg, man) && strstr(err.msg, "\"spine\""), "%s", err.msg);
    check_int8_layers(&src, &dm);
    size_t V = (size_t)src.hp.vocab, bytes = sizeof(float) * NIDS * V;
    float *ref = run(&dm, NULL, NIDS, &err), *ref0 = run(&src, NULL, NIDS, &err);
    CHECKF(ref && ref0, "%s", err.msg);
    float *t1 = tu_eval(&dm, IDS, NIDS, 3, 1, NULL, &err);
    int same = t1 && memcmp(t1, ref, bytes) == 0;
    free(t1);
    CHECKF(same, "int8 store: 1 thread in chunks of 3 differs from 2 threads in one pass");
    for (int pf = 0; pf <= 1; pf++)
        compare_streamed(q8, 1, LEAST, pf, 1 + 4 * pf, ref, "int8 store");
    /* the error the opt-in costs on the trained default model (bench/results/store.md measures it) */
    double e_all = tu_rel_err(ref, ref0, NIDS * V), e_first = tu_rel_err(ref, ref0, V);
    CHECKF(e_all > 0 && e_all < 0.15 && e_first < 0.03, "logit error %.4f (first position %.4f)", e_all, e_first);
    free(ref);
    free(ref0);
    model_free(&src);
    model_free(&dm);
    /* the as-released store of the same model beside it: its own pack and its own logits */
    CHECKF(dfsp_open(plain, NULL, &dm, &bt, &info, &err) == 0, "%s", err.msg);
    blob_table_free(&bt);
    model_free(&dm);
    CHECKF(!info.spine_int8 && !strstr(info.pack_path[0], "-int8"), "%s", info.pack_path[0]);
    CHECKF(dfsp_open(q8, NULL, &dm, &bt, &info, &err) == 0, "%s", err.msg); /* still intact */
    blob_table_free(&bt);
    model_free(&dm);
    /* neither store is completed the other way */
    CHECK(dfsp_prepare("models/default", q8, &o, &ps, &err) != 0);
    CHECKF(strstr(err.msg, "made with --spine int8"), "%s", err.msg);
    o.spine_int8 = 1;
    CHECK(dfsp_prepare("models/default", plain, &o, &ps, &err) != 0);
    CHECKF(strstr(err.msg, "made without --spine int8"), "%s", err.msg);
    char *part = dir_in_tmp("int8-part");
    snprintf(cmd, sizeof cmd, "DELTAFIN_PREPARE_STOP_AFTER=5 %s prepare --model models/default --out %s --spine int8",
             tu_bin(), part);
    CHECK(tu_run(cmd, out, sizeof out) == 3);
    CHECK(prepare("models/default", part, 0, 1, &err) != 0);
    CHECKF(strstr(err.msg, "journal") && strstr(err.msg, "with --spine int8"), "%s", err.msg);
    snprintf(cmd, sizeof cmd, "%s prepare --model models/default --out %s --spine int8", tu_bin(), part);
    CHECKF(tu_run(cmd, out, sizeof out) == 0 && strstr(out, "5 verified from an earlier run"), "%s", out);
    /* a model with nothing to code (FP8 and too-narrow matrices) is refused before anything is written */
    char *none = dir_in_tmp("int8-none");
    o.spine_int8 = 1;
    CHECK(dfsp_prepare(test_data("oracle/deepseek_v3-fp8"), none, &o, &ps, &err) != 0);
    CHECKF(strstr(err.msg, "nothing to code") && access(none, F_OK) != 0, "%s", err.msg);
    snprintf(cmd, sizeof cmd, "%s prepare --model models/default --out %s --spine int4", tu_bin(), part);
    CHECKF(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "--spine must be as-released or int8"), "%s", out);
}

/* ---- fused experts ---- */

struct fuse_ctx {
    const st_set *src;
    const st_wtensor *w;
    char (*layer_prefix)[128]; /* [n] for a fused tensor: "model.layers.L.mlp.", else "" */
    int *kind;                 /* [n] 0 copy, 1 gate_up, 2 down */
    int E;
};

static int fuse_fill(void *ud, int idx, uint8_t *buf, uint64_t n, errbuf *err)
{
    struct fuse_ctx *c = ud;
    if (c->kind[idx] == 0) {
        const st_tensor *t = st_find(c->src, c->w[idx].name);
        memcpy(buf, t->data, n);
        return 0;
    }
    uint64_t at = 0;
    for (int e = 0; e < c->E; e++) {
        static const char *const parts[2][2] = {{"gate_proj", "up_proj"}, {"down_proj", NULL}};
        for (int k = 0; k < 2 && parts[c->kind[idx] - 1][k]; k++) {
            char name[400];
            snprintf(name, sizeof name, "%sexperts.%d.%s.weight", c->layer_prefix[idx], e,
                     parts[c->kind[idx] - 1][k]);
            const st_tensor *t = st_find(c->src, name);
            if (!t)
                return errbuf_set(err, "no %s", name);
            memcpy(buf + at, t->data, t->end - t->begin);
            at += t->end - t->begin;
        }
    }
    return at == n ? 0 : errbuf_set(err, "fused tensor %d: %llu of %llu bytes", idx, (unsigned long long)at,
                                    (unsigned long long)n);
}

/* Writes dst: src (per-expert Qwen3-MoE) with each MoE layer's experts in transformers' fused
 * layout, experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I]. */
static void write_fused(const char *src, const char *dst, errbuf *err, int *ok)
{
    model m;
    *ok = 0;
    if (model_load(&m, src, err) != 0)
        return;
    mkdir(dst, 0755);
    char a[4200], b[4200];
    static const char *const small[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", src, small[i]);
        snprintf(b, sizeof b, "%s/%s", dst, small[i]);
        copy_file(a, b);
    }
    int n = 0, E = m.hp.n_experts, I = m.hp.moe_inter, H = m.hp.hidden;
    st_wtensor *w = calloc((size_t)m.st.n + 2 * (size_t)m.hp.n_layers, sizeof *w);
    struct fuse_ctx c = {&m.st, w, calloc((size_t)m.st.n + 2 * (size_t)m.hp.n_layers, 128),
                         calloc((size_t)m.st.n + 2 * (size_t)m.hp.n_layers, sizeof(int)), E};
    for (int i = 0; i < m.st.n; i++) {
        const st_tensor *t = &m.st.t[i];
        if (strstr(t->name, ".experts."))
            continue;
        snprintf(w[n].name, sizeof w[n].name, "%s", t->name);
        w[n].dtype = t->dtype;
        w[n].ndim = t->ndim;
        memcpy(w[n].shape, t->shape, sizeof t->shape);
        n++;
    }
    for (int l = 0; l < m.hp.n_layers; l++) {
        if (m.hp.ffn_kind[l] != FFN_MOE)
            continue;
        for (int k = 1; k <= 2; k++) {
            snprintf(c.layer_prefix[n], 128, "model.layers.%d.mlp.", l);
            snprintf(w[n].name, sizeof w[n].name, "model.layers.%d.mlp.experts.%s", l,
                     k == 1 ? "gate_up_proj" : "down_proj");
            w[n].dtype = ST_BF16;
            w[n].ndim = 3;
            w[n].shape[0] = E;
            w[n].shape[1] = k == 1 ? 2 * I : H;
            w[n].shape[2] = k == 1 ? H : I;
            c.kind[n++] = k;
        }
    }
    snprintf(a, sizeof a, "%s/model.safetensors", dst);
    *ok = st_write_file(a, w, n, fuse_fill, &c, err) == 0;
    free(w);
    free(c.layer_prefix);
    free(c.kind);
    model_free(&m);
}

/* Transformers' fused 3-D expert tensors are experts to the store: each expert's slices form its
 * own blob, so they stream. A Qwen3-MoE checkpoint in the fused layout gives the logits of the
 * same weights per expert: resident, from a Hugging Face folder and from DFSP stores with budgets
 * below its size (compare_all); the store keeps the slices as per-expert tensors. */
TEST(store_fused_experts_stream)
{
    errbuf err;
    const char *src = test_data("oracle/qwen3_moe-a");
    char *dst = dir_in_tmp("fused-qwen3-moe");
    int ok;
    write_fused(src, dst, &err, &ok);
    CHECKF(ok, "%s", err.msg);
    model per, fused;
    CHECKF(model_load(&per, src, &err) == 0 && model_load(&fused, dst, &err) == 0, "%s", err.msg);
    CHECKF(st_find(&fused.st, "model.layers.0.mlp.experts.gate_up_proj") &&
               !st_find(&fused.st, "model.layers.0.mlp.experts.0.gate_proj.weight"),
           "the fused copy is not fused");
    size_t bytes = sizeof(float) * NIDS * (size_t)per.hp.vocab;
    float *a = run(&per, NULL, NIDS, &err), *b = run(&fused, NULL, NIDS, &err);
    int same = a && b && memcmp(a, b, bytes) == 0;
    free(a);
    free(b);
    CHECKF(same, "fused resident logits differ from per-expert");
    /* every expert of every MoE layer is a blob of slices of the fused tensors */
    blob_table bt;
    CHECKF(blob_table_build(&bt, &fused, &err) == 0, "%s", err.msg);
    int experts = 0, slices = 0;
    for (int i = 0; i < bt.n; i++)
        if (bt.b[i].kind == BLOB_EXPERT) {
            experts++;
            for (int k = 0; k < bt.b[i].nparts; k++)
                slices += blob_part_is_slice(&bt.part[bt.b[i].first_part + k], &fused);
        }
    blob_table_free(&bt);
    CHECKF(experts == fused.hp.n_layers * fused.hp.n_experts && slices == 3 * experts,
           "%d expert blobs with %d slices", experts, slices);
    model_free(&per);
    model_free(&fused);
    compare_all(dst);
    /* the store names each expert's slices as its own tensors */
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir_in_tmp("store-fused-qwen3-moe-1-1"));
    char *txt = NULL;
    size_t len;
    CHECKF(file_read_all(path, &txt, &len, &err) == 0, "%s", err.msg);
    same = strstr(txt, "model.layers.2.mlp.experts.15.down_proj.weight") != NULL;
    free(txt);
    CHECKF(same, "the store's manifest has no per-expert tensor for a fused slice");
}
