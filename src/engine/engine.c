/* engine.c — opening a model with its weight store, pool, kernels and tokenizer (engine.h).
 *
 * What streams: with a DFSP store or a Hugging Face folder, the experts (and the layer spines
 * that do not fit) stream through the store when --ram-budget is given, or when the weights do
 * not fit in 80% of physical memory; otherwise everything stays mapped and no store is opened.
 */
#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/timer.h"
#include "engine/engine_int.h"
#include "engine/stream.h"
#include "hub/hub.h"
#include "store/store.h"

int engine_enter(engine *e, errbuf *err)
{
    int was = 0;
    if (!atomic_compare_exchange_strong(&e->busy, &was, 1))
        return errbuf_set(err, "engine: called while another thread is inside it (an engine and its sessions are "
                               "driven from one thread at a time)");
    return 0;
}

void engine_leave(engine *e) { atomic_store(&e->busy, 0); }

int engine_default_model(char *out, size_t cap, errbuf *err)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        static const char *const rel[] = {"models/default", "../models/default", "../../models/default"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(out, cap, "%s/%s", exe, rel[i]);
            if (file_is_dir(out))
                return 0;
        }
    }
    if (file_is_dir("models/default")) {
        snprintf(out, cap, "models/default");
        return 0;
    }
    return errbuf_set(err, "no --model given and the bundled model (models/default) was not found");
}

static engine *engine_alloc(const engine_opts *o, errbuf *err)
{
    const kern_ops *k = kern_select(o->kernels);
    if (!k) {
        errbuf_set(err, "--kernels %s: not available on this CPU or build", o->kernels);
        return NULL;
    }
    int index;
    const backend_ops *be = backend_select(o->device, &index, err);
    if (!be)
        return NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) {
        errbuf_set(err, "engine: out of memory");
        return NULL;
    }
    e->k = k;
    e->be = be;
    e->be_index = index;
    atomic_init(&e->busy, 0);
    atomic_init(&e->sessions, 0);
    return e;
}

static int engine_start_pool(engine *e, const engine_opts *o, errbuf *err)
{
    if (o->pool_of) {
        e->pool = o->pool_of->pool;
        return 0;
    }
    e->pool = pool_new(o->threads > 0 ? o->threads : pool_ncpu(), err);
    e->own_pool = e->pool != NULL;
    return e->pool ? 0 : -1;
}

/* Opens the store for e->own when its weights stream (--ram-budget, or more than 80% of RAM);
 * takes bt. e->store stays NULL when everything is mapped. */
static int open_store(engine *e, const engine_opts *o, const char *model_dir, blob_table *bt, const dfsp_info *info,
                      errbuf *err)
{
    uint64_t budget = 0, ram = store_physical_ram();
    /* a streamed install always streams: its experts may not be on the drive yet */
    int stream = o->ram_budget > 0 || o->min_cache || e->stream ||
                 (ram && bt->spine_bytes + bt->expert_bytes > ram / 10 * 8);
    if (o->min_cache)
        budget = bt->spine_bytes + 2 * blob_padded(bt->max_expert);
    else if (o->ram_budget)
        budget = o->ram_budget;
    else
        budget = ram / 10 * 8;
    if (!stream || bt->expert_bytes == 0) /* with no routed experts there is nothing to stream */
        return 0;
    store_cfg sc;
    memset(&sc, 0, sizeof sc);
    io_cfg_default(&sc.io);
    sc.ram_budget = budget;
    sc.prefetch = o->prefetch;
    sc.verify = o->verify;
    sc.spines_on_device = e->be->open != NULL; /* a device keeps them (store_spines_release) */
    if (o->io != ENGINE_IO_AUTO)
        sc.io.backend = o->io == ENGINE_IO_URING ? IO_URING : IO_PREAD;
    if (o->emulate && io_parse_emulation(&sc.io, o->emulate, err) != 0)
        return -1;
    char heat[4200];
    if (e->dfsp || e->stream) {
        snprintf(heat, sizeof heat, "%s/heat.bin", model_dir);
        sc.heat_path = heat;
    }
    if (e->stream)
        sc.fetch = stream_fetcher(e->stream);
    if (store_open(&e->store, &e->own, bt, e->dfsp ? info : NULL, &sc, err) != 0)
        return -1;
    e->xs = store_weights(e->store);
    return 0;
}

static void say_warnings(const char *text)
{
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        int n = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(stderr, "deltafin: warning: %.*s; its blobs are read from their other copies\n", n, p);
        p += n + (nl != NULL);
    }
}

/* A DFSP store: packs found (--drives), the store opened over them, and every blob served from
 * the mapping checked against its xxh3 before use (the others are checked as they are read into
 * slots); a copy that fails while a mirror holds good bytes is replaced by the mirror (reopened
 * with it). */
static int open_dfsp(engine *e, const engine_opts *o, const char *dir, errbuf *err)
{
    signed char *copy = NULL;
    uint8_t *mapped = NULL;
    blob_table bt;
    dfsp_info *info = calloc(1, sizeof *info);
    int rc = -1;
    if (!info)
        return errbuf_set(err, "out of memory");
    for (int attempt = 0;; attempt++) {
        dfsp_open_opts oo = {.drives = o->drives, .copy = copy};
        if (dfsp_open(dir, &oo, &e->own, &bt, info, err) != 0)
            goto out;
        if (attempt == 0 && info->warning[0])
            say_warnings(info->warning);
        e->spine_int8 = info->spine_int8;
        int nb = bt.n;
        if (open_store(e, o, dir, &bt, info, err) != 0) { /* takes bt */
            model_free(&e->own);
            goto out;
        }
        if (!o->verify)
            break;
        const blob_table *t = e->store ? store_blobs(e->store) : &bt;
        if (!copy && (!(copy = malloc((size_t)nb + 1)) || !(mapped = malloc((size_t)nb + 1)))) {
            errbuf_set(err, "out of memory");
            goto undo;
        }
        if (attempt == 0)
            memset(copy, -1, (size_t)nb + 1);
        e->verified_bytes = 0;
        e->verified_blobs = 0;
        for (int b = 0; b < nb; b++) {
            mapped[b] = e->store ? (uint8_t)store_is_mapped(e->store, b) : 1;
            e->verified_bytes += mapped[b] ? t->b[b].size : 0;
            e->verified_blobs += mapped[b];
        }
        double t0 = timer_now();
        int r = dfsp_verify_mapped(&e->own, t, info, mapped, e->pool, copy, err);
        e->verify_s = timer_now() - t0;
        if (r == 0)
            break;
        if (r > 0 && attempt == 0) {
            fprintf(stderr, "deltafin: warning: a copy of a blob in %s failed its checksum; using its mirror "
                            "(`deltafin doctor --model %s` names the bad copy)\n",
                    dir, dir);
            store_free(e->store); /* bt is the store's, or still ours: freed either way */
            e->store = NULL;
            e->xs = NULL;
            blob_table_free(&bt);
            model_free(&e->own);
            continue;
        }
        if (r > 0)
            errbuf_set(err, "%s: a mirror that matched its checksum no longer does", dir);
    undo:
        store_free(e->store);
        e->store = NULL;
        e->xs = NULL;
        blob_table_free(&bt);
        model_free(&e->own);
        goto out;
    }
    blob_table_free(&bt); /* the store took it, or nothing streams */
    rc = 0;
out:
    free(copy);
    free(mapped);
    free(info);
    return rc;
}

/* The backend's state for the model (its copies of the weights). With a weight store, a device
 * backend holds every layer's spine and caches the routed experts the store hands it, so the
 * store must keep every spine mapped until open() has copied them (open_store plans it so:
 * STORE_PLAN_DEVICE), and lets their pages go after. */
static int engine_start_backend(engine *e, uint64_t vram_budget, errbuf *err)
{
    if (!e->be->open)
        return vram_budget ? errbuf_set(err, "--vram-budget applies to a device (--device cuda), not to the %s",
                                        e->be->name)
                           : 0;
    const store_plan *p = e->store ? store_plan_get(e->store) : NULL;
    if (p && p->spine_streamed > 0)
        return errbuf_set(err, "--device %s: %d layers' spines stream through RAM; the device needs every spine "
                               "resident (a larger --ram-budget)", e->be->name, p->spine_streamed);
    backend_cfg c = {.index = e->be_index, .vram_budget = vram_budget, .experts_streamed = e->store != NULL};
    e->be_dev = e->be->open(e->m, &c, err);
    if (!e->be_dev)
        return -1;
    if (e->store) /* the device has its copies now: RAM keeps the experts */
        e->spines_released = store_spines_release(e->store);
    return 0;
}

int engine_open(const engine_opts *o, engine **out, errbuf *err)
{
    *out = NULL;
    char dir[4096];
    const char *model_dir = o->model;
    if (!model_dir) {
        if (engine_default_model(dir, sizeof dir, err) != 0)
            return -1;
        model_dir = dir;
    }
    engine *e = engine_alloc(o, err);
    if (!e)
        return -1;
    e->own_parts = 1;
    e->m = &e->own;
    if (engine_start_pool(e, o, err) != 0) /* first: verifying a store uses it */
        goto fail;
    e->dfsp = dfsp_is_store(model_dir);
    if (e->dfsp) {
        if (open_dfsp(e, o, model_dir, err) != 0)
            goto fail;
    } else {
        if (o->drives) {
            errbuf_set(err, "--drives applies to a DFSP store (deltafin prepare), not to a Hugging Face folder");
            goto fail;
        }
        if (model_load(&e->own, model_dir, err) != 0)
            goto fail;
        blob_table bt;
        int bad = blob_table_build(&bt, &e->own, err) != 0;
        if (!bad && stream_is_install(model_dir)) { /* setup --stream: experts come from the hub */
            bad = (o->hub && hub_init(&e->hub, o->hub, err) != 0) ||
                  stream_open(&e->stream, model_dir, &e->own, &bt, e->hub, 1, err) != 0;
        }
        if (bad || open_store(e, o, model_dir, &bt, NULL, err) != 0) {
            blob_table_free(&bt);
            store_free(e->store);
            stream_free(e->stream);
            hub_free(e->hub);
            model_free(&e->own);
            goto fail;
        }
        blob_table_free(&bt);
    }
    if (engine_start_backend(e, o->vram_budget, err) != 0) {
        engine_free(e);
        return -1;
    }
    *out = e;
    return 0;
fail:
    if (e->own_pool)
        pool_free(e->pool);
    free(e);
    return -1;
}

int engine_wrap(const model *m, struct store *st, const engine_opts *o, engine **out, errbuf *err)
{
    *out = NULL;
    engine *e = engine_alloc(o, err);
    if (!e)
        return -1;
    e->m = m;
    e->store = st;
    e->xs = st ? store_weights(st) : NULL;
    if (engine_start_pool(e, o, err) != 0) {
        free(e);
        return -1;
    }
    if (engine_start_backend(e, o->vram_budget, err) != 0) {
        engine_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void engine_free(engine *e)
{
    if (!e)
        return;
    assert(atomic_load(&e->sessions) == 0);
    if (e->be_dev)
        e->be->close(e->be_dev);
    if (e->own_parts) {
        errbuf err;
        if (e->store && store_heat_save(e->store, &err) != 0)
            fprintf(stderr, "deltafin: could not keep routing counts: %s\n", err.msg);
        store_stats st = {0};
        if (e->store)
            store_stats_get(e->store, &st);
        if (st.copy_failures > 0) /* the run was right, from the mirrors; a copy wants repair */
            fprintf(stderr,
                    "deltafin: warning: %llu reads failed or mismatched their checksum and were read from another "
                    "copy; `deltafin doctor --model %s` names the bad copies\n",
                    (unsigned long long)st.copy_failures, e->m->dir);
        store_free(e->store);
        stream_free(e->stream);
        hub_free(e->hub);
        model_free(&e->own);
    }
    tok_free(e->tk);
    if (e->own_pool)
        pool_free(e->pool);
    free(e);
}

const hparams *engine_hparams(const engine *e) { return &e->m->hp; }

uint64_t engine_active_bytes(const engine *e)
{
    const model *m = e->m;
    double bytes = 0, share = m->hp.n_experts > 0 ? (double)m->hp.top_k / m->hp.n_experts : 1;
    for (int i = 0; i < m->n_bind; i++)
        bytes += (double)m->bind[i].len * (m->bind[i].part == MODEL_PART_EXPERT ? share : 1);
    return (uint64_t)bytes;
}
const model *engine_model(const engine *e) { return e->m; }
const char *engine_model_dir(const engine *e) { return e->m->dir; }
const char *engine_kernels(const engine *e) { return e->k->name; }
int engine_threads(const engine *e) { return pool_size(e->pool); }
struct store *engine_store(engine *e) { return e->store; }
struct stream *engine_stream(engine *e) { return e->stream; }

const tok *engine_tok(engine *e, errbuf *err)
{
    if (engine_enter(e, err))
        return NULL;
    if (!e->tk && tok_load(&e->tk, e->m->dir, err) != 0)
        e->tk = NULL;
    const tok *t = e->tk;
    engine_leave(e);
    return t;
}

void engine_describe(const engine *e, char *buf, size_t cap)
{
    if (e->be_dev) /* the passes run on a device; the host's threads and kernels serve the rest */
        snprintf(buf, cap, "model %s, device %s:%d, host kernels %s, %d threads", e->m->hp.arch, e->be->name,
                 e->be_index, e->k->name, pool_size(e->pool));
    else
        snprintf(buf, cap, "model %s, kernels %s, %d threads", e->m->hp.arch, e->k->name, pool_size(e->pool));
}
