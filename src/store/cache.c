/* cache.c — the store's slots and its weight_src (see store.h): the expert cache and the
 * streamed spines.
 *
 * Slots 0 .. nx-1 hold experts, nx .. nx+ns-1 streamed layer spines; both kinds share the reading,
 * checking and failure paths. Slot states: EMPTY -> LOADING (reads in flight) -> READY. A request
 * (one layer of one pass) lists its experts; each item is READY (handed over on the next call to
 * next()), LOADING, or waiting for a slot (when every slot is pinned, items are issued as earlier
 * ones are released). A pass holds at most one spine slot (the layer it is in); the other spine
 * slots hold the next streamed layers, read ahead with prefetch on.
 * Only the engine's compute thread calls into the store.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/timer.h"
#include "store/store.h"

enum { S_EMPTY, S_LOADING, S_READY };
_Static_assert(STORE_MAX_COPIES <= 8, "verified[] keeps one bit per copy in a byte");
enum { R_WAIT, R_LOADING, R_READY, R_RETURNED };
enum { BAD_NONE, BAD_READ, BAD_SUM, BAD_QUEUE };

typedef struct slot {
    int blob;        /* -1 when empty */
    int state;
    int pins;
    int reads_left;
    int bad;         /* BAD_*: why the load failed (reported to the request that needs it) */
    int copy;        /* the DFSP copy it was read from (mirrors: any of them), -1 for a Hugging Face
                        folder */
    uint64_t got;    /* the checksum computed, when BAD_SUM */
    int prefetched;  /* loaded by prefetch and not yet requested */
    int pf_layer;    /* the layer it was guessed for: after that layer's request, a wrong guess */
    uint64_t stamp;  /* last use */
} slot;

struct store {
    const model *m;
    blob_table bt;
    int dfsp;
    io_engine *io;
    int file_id[STORE_MAX_PACKS > 256 ? STORE_MAX_PACKS : 256]; /* io file per pack / safetensors file */
    char file_path[256][1024];
    int pack_drive[STORE_MAX_PACKS];
    int ndrives;
    uint64_t drive_issued[IO_MAX_DRIVES]; /* bytes of blob reads sent to each drive (mirror ties) */
    store_cfg cfg;
    char heat_path[1024]; /* cfg.heat_path points here */
    /* slots: nx experts of slot_bytes, then ns spines of spine_bytes */
    store_plan plan;
    int nslots, nx, ns;
    uint64_t slot_bytes, spine_bytes;
    uint8_t *mem;    /* [nx * slot_bytes + ns * spine_bytes], mmap'd */
    size_t mem_bytes;
    slot *sl;
    int *blob_slot;  /* [nblobs] */
    uint8_t *verified;  /* [nblobs] bit c: copy c matched its checksum once (each copy is checked, since
                           any of them may be the one read) */
    uint8_t *bad_copy;  /* [nblobs] bit c: a read of copy c failed or mismatched: reads avoid it */
    uint32_t *heat;  /* [nblobs] routing counts */
    uint8_t *held;   /* [nblobs] 1: a device backend holds its own copy (weight_src.held) */
    XXH3_state_t *sum; /* a streamed blob's check (cfg.fetch): made at open, so a pass allocates nothing */
    layer_w *spine_L; /* [ns] each spine slot's layer, bound to the slot's image */
    int *spine_bound;  /* [ns] the blob spine_L[k - nx] is bound to (-1: none yet): bound once a load */
    int spine_pf_after; /* a layer whose next streamed spines are still to be read ahead, or -1 */
    uint64_t clock;
    char io_note[300];  /* how reads are done (store_io_note) */
    /* the current request */
    int layer, n, returned;
    int *ids, *items_blob, *items_state;
    /* statistics */
    store_stats st;
    uint64_t pass;
    uint64_t *read_pass;  /* [nblobs] pass of the last read */
    uint32_t *reads_in_pass;
    weight_src xs;
};

int store_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || !(v * mul < 18446744073709551616.0)) /* also rejects nan and inf */
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

uint64_t store_physical_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* every copy of blob b has failed a read or its checksum, or sits on a pack that is missing
 * (bad_copy starts with the dead copies set: issue() still never reads those) */
static int all_copies_bad(const store *s, int b)
{
    return s->bad_copy[b] == (uint8_t)((1u << s->bt.b[b].ncopies) - 1);
}

static uint8_t *slot_mem(const store *s, int k)
{
    if (k < s->nx)
        return s->mem + (size_t)k * s->slot_bytes;
    return s->mem + (size_t)s->nx * s->slot_bytes + (size_t)(k - s->nx) * s->spine_bytes;
}

static void heat_load(store *s)
{
    if (!s->cfg.heat_path)
        return;
    FILE *f = fopen(s->cfg.heat_path, "rb");
    if (!f)
        return;
    uint32_t n = 0;
    if (fread(&n, 4, 1, f) == 1 && n == (uint32_t)s->bt.n && fread(s->heat, 4, n, f) == n) {
        fclose(f);
        return;
    }
    memset(s->heat, 0, sizeof(uint32_t) * (size_t)s->bt.n); /* another model's file: start afresh */
    fclose(f);
}

int store_heat_save(const store *s, errbuf *err)
{
    if (!s->cfg.heat_path || !s->heat || !s->bt.n)
        return 0;
    size_t len = 4 + 4 * (size_t)s->bt.n;
    uint8_t *buf = malloc(len);
    if (!buf)
        return errbuf_set(err, "%s: out of memory", s->cfg.heat_path);
    uint32_t n = (uint32_t)s->bt.n;
    memcpy(buf, &n, 4);
    memcpy(buf + 4, s->heat, 4 * (size_t)s->bt.n);
    int rc = file_write_atomic(s->cfg.heat_path, buf, len, err);
    free(buf);
    return rc;
}

/* "blob 'layer 3 spine' in PACK" (the copy read), or for a Hugging Face folder the safetensors
 * file(s) its tensors come from */
static void name_of(const store *s, int b, int copy, char *buf, size_t cap)
{
    char nm[64];
    blob_name(&s->bt.b[b], nm, sizeof nm);
    const blob *x = &s->bt.b[b];
    if (x->ncopies > 0) {
        snprintf(buf, cap, "blob '%s' in %s", nm, s->file_path[x->copy[copy >= 0 ? copy : 0].file]);
        return;
    }
    int f0 = s->m->st.t[s->bt.part[x->first_part].tensor].file, others = 0;
    for (int i = 1; i < x->nparts; i++)
        others += s->m->st.t[s->bt.part[x->first_part + i].tensor].file != f0;
    if (others)
        snprintf(buf, cap, "blob '%s' in %s and other files", nm, s->m->st.files[f0].path);
    else
        snprintf(buf, cap, "blob '%s' in %s", nm, s->m->st.files[f0].path);
}

/* slot k no longer holds anything (a failed read or checksum): a later request reads again */
static void slot_drop(store *s, int k)
{
    slot *sl = &s->sl[k];
    if (sl->blob >= 0)
        s->blob_slot[sl->blob] = -1;
    sl->blob = -1;
    sl->state = S_EMPTY;
    sl->bad = 0;
    sl->prefetched = 0;
}

/* issue() failed after `submitted` of its reads went out: with none out the slot empties; else
 * it stays LOADING, marked bad, until those land (their buffers are the slot's) */
static int unissue(store *s, int k, int submitted)
{
    if (submitted == 0) {
        slot_drop(s, k);
        return -1;
    }
    s->sl[k].reads_left = submitted;
    s->sl[k].bad = BAD_QUEUE;
    return -1;
}

/* starts the reads of blob b into slot k, for pass `for_pass` (the current one, or the next for a
 * spine read ahead across the end of a pass) */
static int issue(store *s, int k, int b, uint64_t for_pass, errbuf *err)
{
    const blob *x = &s->bt.b[b];
    slot *sl = &s->sl[k];
    if (sl->blob >= 0)
        s->blob_slot[sl->blob] = -1;
    sl->blob = b;
    sl->state = S_LOADING;
    sl->bad = 0;
    sl->prefetched = 0;
    s->blob_slot[b] = k;
    uint8_t *dst = slot_mem(s, k);
    if (s->read_pass[b] == for_pass) {
        if (++s->reads_in_pass[b] > s->st.max_reads_blob_pass)
            s->st.max_reads_blob_pass = s->reads_in_pass[b];
    } else {
        s->read_pass[b] = for_pass;
        s->reads_in_pass[b] = 1;
        if (s->st.max_reads_blob_pass < 1)
            s->st.max_reads_blob_pass = 1;
    }
    int spine = x->kind != BLOB_EXPERT;
    uint64_t *bytes = spine ? &s->st.spine_bytes_read : &s->st.bytes_read;
    *(spine ? &s->st.spine_reads : &s->st.reads) += 1;
    if (x->ncopies > 0) { /* DFSP: one read of the whole image, from the copy expected first; when
                              two are expected within 50 us of each other (idle drives: the estimate
                              is no finer), the drive sent the fewest bytes so far */
        int best = -1, all_bad = all_copies_bad(s, b);
        double bt = 0;
        for (int c = 0; c < x->ncopies; c++) {
            if (x->dead >> c & 1)
                continue; /* its pack is missing or truncated (dfsp_open left a live copy) */
            if (!all_bad && (s->bad_copy[b] >> c & 1))
                continue; /* it failed before: another copy while there is one */
            int d = s->pack_drive[x->copy[c].file];
            double t = io_expected(s->io, d, blob_padded(x->size));
            int tie = best >= 0 && fabs(t - bt) <= 50e-6;
            if (best < 0 || (tie ? s->drive_issued[d] < s->drive_issued[s->pack_drive[x->copy[best].file]] : t < bt)) {
                bt = t;
                best = c;
            }
        }
        s->drive_issued[s->pack_drive[x->copy[best].file]] += blob_padded(x->size);
        sl->reads_left = 1;
        sl->copy = best;
        *bytes += blob_padded(x->size);
        if (io_read(s->io, s->file_id[x->copy[best].file], x->copy[best].off, blob_padded(x->size), dst, (uint64_t)k,
                    err) != 0)
            return unissue(s, k, 0);
        return 0;
    }
    if (s->cfg.fetch && s->cfg.fetch->fetch(s->cfg.fetch->ctx, b, err) != 0)
        return unissue(s, k, 0); /* not on the drive, and it could not be fetched */
    sl->reads_left = x->nparts; /* Hugging Face folder: tensor by tensor */
    sl->copy = -1;
    for (int i = 0; i < x->nparts; i++) {
        const blob_part *pt = &s->bt.part[x->first_part + i];
        const st_tensor *t = &s->m->st.t[pt->tensor];
        *bytes += pt->len;
        if (io_read(s->io, s->file_id[t->file], t->file_off + pt->src, pt->len, dst + pt->off, (uint64_t)k, err) !=
            0)
            return unissue(s, k, i);
    }
    return 0;
}

/* an unpinned, not loading slot to reuse: empty first, then one a device backend holds a copy of
 * (this one is redundant), then the least routed expert, then the least recently used. Experts
 * prefetched and not yet asked for are kept while anything else can go (evicting one would read
 * it twice in a pass); prefetch itself never takes them. Slots an earlier layer of this pass used
 * may go: no pass asks for a blob twice. */
static int victim_pass(store *s, int spare_prefetched)
{
    int best = -1;
    for (int k = 0; k < s->nx; k++) {
        slot *sl = &s->sl[k];
        if (sl->pins > 0 || sl->state == S_LOADING)
            continue;
        if (sl->blob < 0)
            return k;
        if (spare_prefetched && sl->prefetched)
            continue;
        if (best < 0)
            best = k;
        else {
            int db = s->held[s->sl[best].blob], dk = s->held[sl->blob];
            uint32_t hb = s->heat[s->sl[best].blob], hk = s->heat[sl->blob];
            if (dk > db || (dk == db && (hk < hb || (hk == hb && sl->stamp < s->sl[best].stamp))))
                best = k;
        }
    }
    return best;
}

static int victim(store *s, int for_prefetch)
{
    int k = victim_pass(s, 1);
    return k >= 0 || for_prefetch ? k : victim_pass(s, 0);
}

/* a finished read: the slot becomes ready once all its reads are in (and, the first time a
 * DFSP blob enters the cache, its checksum matched) */
static void landed(store *s, int k, int ok)
{
    slot *sl = &s->sl[k];
    if (!ok && !sl->bad)
        sl->bad = BAD_READ;
    if (--sl->reads_left > 0)
        return;
    sl->state = S_READY;
    int b = sl->blob;
    const blob *x = &s->bt.b[b];
    if (!sl->bad && s->cfg.verify && x->ncopies > 0 && !(s->verified[b] >> sl->copy & 1)) {
        sl->got = XXH3_64bits(slot_mem(s, k), x->size);
        if (sl->got != x->xxh3)
            sl->bad = BAD_SUM;
        else
            s->verified[b] |= (uint8_t)(1u << sl->copy);
    }
    uint64_t want;
    if (!sl->bad && s->cfg.verify && x->ncopies == 0 && s->cfg.fetch && !(s->verified[b] & 1) &&
        s->cfg.fetch->sum(s->cfg.fetch->ctx, b, &want)) { /* a streamed blob: the sum of its fetch */
        XXH3_64bits_reset(s->sum);
        for (int i = 0; i < x->nparts; i++) {
            const blob_part *pt = &s->bt.part[x->first_part + i];
            XXH3_64bits_update(s->sum, slot_mem(s, k) + pt->off, pt->len);
        }
        sl->got = XXH3_64bits_digest(s->sum);
        if (sl->got != want)
            sl->bad = BAD_SUM;
        else
            s->verified[b] |= 1;
    }
    if ((sl->bad == BAD_READ || sl->bad == BAD_SUM) && sl->copy >= 0) {
        s->bad_copy[b] |= (uint8_t)(1u << sl->copy);
        if (!all_copies_bad(s, b))
            s->st.copy_failures++; /* another copy is left to read instead */
    }
    for (int i = 0; i < s->n; i++)
        if (s->items_blob[i] == b && s->items_state[i] == R_LOADING)
            s->items_state[i] = R_READY;
}

static int reap(store *s, int wait, errbuf *err)
{
    uint64_t tag;
    int ok, r = io_reap(s->io, &tag, &ok, wait, err);
    if (r == 1)
        landed(s, (int)tag, ok);
    return r;
}

static int bad_report(const store *s, int k, errbuf *err)
{
    const slot *sl = &s->sl[k];
    char nm[1200];
    name_of(s, sl->blob, sl->copy, nm, sizeof nm);
    uint64_t fetched = 0;
    if (sl->bad == BAD_SUM && sl->copy < 0 && s->cfg.fetch && s->cfg.fetch->sum(s->cfg.fetch->ctx, sl->blob, &fetched))
        errbuf_set(err, "%s failed its checksum (xxh3 %016llx, %016llx when it was fetched)", nm,
                   (unsigned long long)sl->got, (unsigned long long)fetched);
    else if (sl->bad == BAD_SUM)
        errbuf_set(err, "%s failed its checksum (xxh3 %016llx, manifest %016llx)", nm, (unsigned long long)sl->got,
                   (unsigned long long)s->bt.b[sl->blob].xxh3);
    else if (sl->bad == BAD_QUEUE)
        errbuf_set(err, "%s: its reads could not all be queued", nm);
    else
        errbuf_set(err, "%s: read failed or came up short", nm);
    return -1;
}

/* unpins what the current request holds and did not hand over */
static void request_close(store *s)
{
    for (int i = 0; i < s->n; i++) {
        int k = s->items_state[i] == R_LOADING || s->items_state[i] == R_READY ? s->blob_slot[s->items_blob[i]] : -1;
        if (k >= 0 && s->sl[k].pins > 0)
            s->sl[k].pins--;
        s->items_state[i] = R_RETURNED;
    }
    s->n = s->returned = 0;
}

/* after a failed load: the request is over, reads still in flight land, and every slot whose
 * load failed is forgotten, so the next request reads those blobs again */
static void request_abandon(store *s)
{
    request_close(s);
    s->spine_pf_after = -1;
    errbuf ignored;
    while (io_pending(s->io) > 0 && reap(s, 1, &ignored) == 1) {
    }
    for (int k = 0; k < s->nslots; k++)
        if (s->sl[k].bad && s->sl[k].state == S_READY && s->sl[k].pins == 0)
            slot_drop(s, k);
}

/* gives waiting item i a slot and starts its read: 1 started, 0 no slot free yet, -1 error */
static int start_item(store *s, int i, errbuf *err)
{
    int v = victim(s, 0);
    if (v < 0)
        return 0;
    if (issue(s, v, s->items_blob[i], s->pass, err) != 0) {
        if (s->sl[v].blob == s->items_blob[i]) { /* reads in flight: the slot is this item's */
            s->sl[v].pins++;
            s->items_state[i] = R_LOADING;
        }
        return -1;
    }
    s->sl[v].pins++;
    s->items_state[i] = R_LOADING;
    return 1;
}

static int begin_request(store *s, int layer, const int *ids, int n, errbuf *err)
{
    request_close(s); /* a request abandoned part-way (its pass failed) still pins some slots */
    s->layer = layer;
    s->n = 0;
    s->returned = 0;
    for (int i = 0; i < n; i++) {
        int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + ids[i]];
        if (b < 0)
            return errbuf_set(err, "layer %d expert %d is not in the store", layer, ids[i]);
        s->ids[i] = ids[i];
        s->items_blob[i] = b;
        s->items_state[i] = R_WAIT;
        s->n = i + 1;
        s->heat[b]++;
        s->st.requests++;
        int k = s->blob_slot[b];
        if (k >= 0 && s->sl[k].state == S_READY && s->sl[k].bad && s->sl[k].pins == 0) {
            slot_drop(s, k); /* a load that failed earlier (never handed over): read it again */
            k = -1;
        }
        if (k >= 0) {
            slot *sl = &s->sl[k];
            sl->pins++;
            if (sl->prefetched) { /* its read was needed after all */
                s->st.prefetch_hits++;
                s->st.bytes_needed += s->bt.b[b].size;
                sl->prefetched = 0;
            }
            s->items_state[i] = sl->state == S_READY ? R_READY : R_LOADING;
            if (sl->state == S_READY)
                s->st.hits++;
            else
                s->st.misses++;
            continue;
        }
        s->st.misses++;
        s->st.bytes_needed += s->bt.b[b].size;
    }
    /* the misses' slots, once every cached item is pinned: a slot taken now is never one of this
     * request's own guesses, whatever their order in ids */
    for (int i = 0; i < n; i++)
        if (s->items_state[i] == R_WAIT && start_item(s, i, err) < 0)
            return -1;
    /* guesses for this layer that it did not ask for were wrong: from now on plain cached experts
     * (kept from eviction no longer, and never counted as used by a later pass) */
    for (int k = 0; k < s->nx; k++)
        if (s->sl[k].prefetched && s->sl[k].pf_layer == layer)
            s->sl[k].prefetched = 0;
    return 0;
}

/* Slot k (pinned, READY) failed its read or checksum: when the blob has a copy that has not
 * failed (landed() counted the failure in copy_failures), reads it from there into the same slot:
 * the run goes on with the right bytes, and the CLI says a copy is bad. 1 re-read started, 0 no
 * other copy, -1 error. */
static int reread_other_copy(store *s, int k, errbuf *err)
{
    slot *sl = &s->sl[k];
    int b = sl->blob;
    const blob *x = &s->bt.b[b];
    if (sl->bad == BAD_QUEUE || x->ncopies < 2 || all_copies_bad(s, b))
        return 0;
    return issue(s, k, b, s->pass, err) == 0 ? 1 : -1;
}

static int next_item(store *s, int *id, mlp_w *mats, errbuf *err)
{
    for (;;) {
        if (s->returned == s->n)
            return 0;
        for (int i = 0; i < s->n; i++) {
            if (s->items_state[i] != R_READY)
                continue;
            int k = s->blob_slot[s->items_blob[i]];
            if (s->sl[k].bad) {
                int r = reread_other_copy(s, k, err);
                if (r < 0)
                    return -1;
                if (r == 1) { /* the item waits for the other copy */
                    s->items_state[i] = R_LOADING;
                    continue;
                }
                return bad_report(s, k, err); /* the caller forgets the slot so a later request reads again */
            }
            s->items_state[i] = R_RETURNED;
            s->returned++;
            *id = s->ids[i];
            blob_bind_expert(&s->bt, s->m, s->items_blob[i], slot_mem(s, k), mats);
            return 1;
        }
        for (int i = 0; i < s->n; i++) { /* items waiting for a slot */
            if (s->items_state[i] != R_WAIT)
                continue;
            int r = start_item(s, i, err);
            if (r < 0)
                return -1;
            if (r == 0)
                break;
        }
        double t0 = timer_now();
        int r = reap(s, 1, err);
        s->st.stall_s += timer_now() - t0;
        if (r < 0)
            return -1;
        if (r == 0 && io_pending(s->io) == 0) {
            int waiting = 0, loading = 0;
            for (int i = 0; i < s->n; i++) {
                waiting += s->items_state[i] == R_WAIT;
                loading += s->items_state[i] == R_LOADING;
            }
            if (loading) /* nothing in flight can finish them: a bookkeeping fault, not a hang */
                return errbuf_set(err, "expert cache: layer %d has %d experts loading with no read in flight",
                                  s->layer, loading);
            if (waiting)
                return errbuf_set(err, "expert cache: %d slots are all pinned; the RAM budget is too small for "
                                       "this pass",
                                  s->nx);
        }
    }
}

/* ---- streamed spines ---- */

/* how many layers after `from` (cyclically: the next pass starts again at layer 0) layer `to` runs */
static int layers_ahead(const store *s, int from, int to)
{
    int n = s->m->hp.n_layers;
    return ((to - from) % n + n) % n;
}

/* a spine slot to read layer `want` into while the pass is at layer `at`: empty first, else the
 * unpinned, settled slot whose layer runs furthest ahead, and only if that is after `want` (a
 * read ahead never displaces a layer needed sooner than its own) */
static int spine_victim(store *s, int at, int want)
{
    int best = -1, best_ahead = -1;
    for (int k = s->nx; k < s->nslots; k++) {
        slot *sl = &s->sl[k];
        if (sl->pins > 0 || sl->state == S_LOADING)
            continue;
        if (sl->blob < 0)
            return k;
        int ahead = layers_ahead(s, at, s->bt.b[sl->blob].layer);
        if (ahead > best_ahead) {
            best = k;
            best_ahead = ahead;
        }
    }
    return best >= 0 && best_ahead > layers_ahead(s, at, want) ? best : -1;
}

/* Reads ahead the streamed spines that follow layer spine_pf_after, as many as there are spine
 * slots besides the one in use. Called once the current layer's expert reads are queued (they
 * are needed first), or when the layer has none. A hint: failures surface on demand. */
static void spine_read_ahead(store *s)
{
    int at = s->spine_pf_after, n = s->m->hp.n_layers, want = 0;
    s->spine_pf_after = -1;
    if (at < 0 || !s->cfg.prefetch)
        return;
    for (int k = s->nx; k < s->nslots; k++)
        want += s->sl[k].pins == 0;
    errbuf err;
    for (int d = 1; d < n && want > 0; d++) {
        int j = (at + d) % n;
        if (!s->plan.streamed[j])
            continue;
        want--;
        int b = s->bt.layer_blob[j];
        if (s->blob_slot[b] >= 0)
            continue; /* in a slot or on its way */
        int v = spine_victim(s, at, j);
        if (v < 0 || issue(s, v, b, j > at ? s->pass : s->pass + 1, &err) != 0)
            return;
        s->sl[v].prefetched = 1;
        s->st.spine_prefetch_reads++;
    }
}

/* Pins a spine slot holding layer `layer`'s blob b and waits until its reads are in: the slot it
 * is in or on its way to, else a free one read now; a copy that fails is read again from another
 * copy while there is one. 0 with *k ready, 1 with *k pinned but bad (its read or checksum
 * failed on every copy tried), -1 on an engine error (nothing pinned). */
static int spine_take(store *s, int layer, int b, int *k, errbuf *err)
{
    *k = s->blob_slot[b];
    if (*k >= 0 && s->sl[*k].state == S_READY && s->sl[*k].bad && s->sl[*k].pins == 0) {
        slot_drop(s, *k); /* a read that failed earlier: read it again */
        *k = -1;
    }
    if (*k < 0) {
        while ((*k = spine_victim(s, layer, layer)) < 0) /* every free slot is still loading */
            if (reap(s, 1, err) != 1)
                return errbuf_set(err, "store: no spine slot frees up for layer %d", layer);
        if (issue(s, *k, b, s->pass, err) != 0)
            return -1;
    } else if (s->sl[*k].prefetched) {
        s->st.spine_prefetch_hits++;
    } else if (s->sl[*k].state == S_READY) {
        s->st.spine_hits++;
    }
    slot *sl = &s->sl[*k];
    sl->prefetched = 0;
    sl->pins++;
    for (;;) {
        while (sl->state == S_LOADING) {
            int r = reap(s, 1, err);
            if (r < 0 || (r == 0 && io_pending(s->io) == 0)) {
                if (r == 0)
                    errbuf_set(err, "store: layer %d's spine is loading with no read in flight", layer);
                sl->pins--;
                return -1;
            }
        }
        if (!sl->bad)
            return 0;
        int r = reread_other_copy(s, *k, err);
        if (r == 0)
            return 1;
        if (r < 0) {
            sl->pins--;
            return -1;
        }
    }
}

/* the layer's weights: the model's own when its spine is resident; else its spine blob in a
 * spine slot (read now unless it is there or on its way), the layer bound to it */
static int xs_layer(void *ctx, int layer, const layer_w **out, errbuf *err)
{
    store *s = ctx;
    *out = NULL;
    if (s->ns == 0) {
        *out = &s->m->L[layer];
        return 0;
    }
    if (!s->plan.streamed[layer]) { /* resident: the streamed layers after it can load meanwhile */
        *out = &s->m->L[layer];
        s->spine_pf_after = layer;
        if (s->m->hp.ffn_kind[layer] != FFN_MOE)
            spine_read_ahead(s);
        return 0;
    }
    int b = s->bt.layer_blob[layer], k;
    s->st.spine_requests++;
    double t0 = timer_now();
    int r = spine_take(s, layer, b, &k, err);
    s->st.spine_stall_s += timer_now() - t0;
    if (r != 0) {
        if (r == 1) {
            bad_report(s, k, err);
            s->sl[k].pins--;
        }
        request_abandon(s);
        return -1;
    }
    layer_w *L = &s->spine_L[k - s->nx];
    if (s->spine_bound[k - s->nx] != b) { /* a new load: bind once, not every pass the slot keeps it */
        blob_bind_layer(&s->bt, s->m, b, slot_mem(s, k), L); /* checked for every streamed layer at open */
        s->spine_bound[k - s->nx] = b;
    }
    *out = L;
    s->spine_pf_after = layer;
    if (s->m->hp.ffn_kind[layer] != FFN_MOE) /* no expert reads to let go first */
        spine_read_ahead(s);
    return 0;
}

static void xs_layer_release(void *ctx, int layer)
{
    store *s = ctx;
    if (s->plan.streamed[layer]) {
        int k = s->blob_slot[s->bt.layer_blob[layer]];
        if (k >= 0 && s->sl[k].pins > 0) {
            s->sl[k].pins--;
            s->sl[k].stamp = ++s->clock;
        }
    }
    spine_read_ahead(s); /* if the layer never asked for experts */
}

/* Any failure ends the request: see request_abandon. Once the misses are queued, the next streamed
 * spines may be read ahead behind them. */
static int xs_begin(void *ctx, int layer, const int *ids, int n, errbuf *err)
{
    store *s = ctx;
    if (begin_request(s, layer, ids, n, err) == 0) {
        spine_read_ahead(s);
        return 0;
    }
    request_abandon(s);
    return -1;
}

static int xs_next(void *ctx, int *id, mlp_w *mats, errbuf *err)
{
    store *s = ctx;
    int r = next_item(s, id, mats, err);
    if (r < 0)
        request_abandon(s);
    return r;
}

static void xs_memory(void *ctx, void **base, size_t *bytes)
{
    store *s = ctx;
    *base = s->mem;
    *bytes = s->mem_bytes;
}

static void xs_release(void *ctx, int layer, int id)
{
    store *s = ctx;
    int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + id];
    int k = b >= 0 ? s->blob_slot[b] : -1;
    if (k >= 0 && s->sl[k].pins > 0) {
        s->sl[k].pins--;
        s->sl[k].stamp = ++s->clock;
    }
}

static void xs_prefetch(void *ctx, int layer, const int *ids, int n)
{
    store *s = ctx;
    errbuf err;
    for (int i = 0; i < n; i++) {
        int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + ids[i]];
        if (b < 0 || s->blob_slot[b] >= 0)
            continue;
        if (s->cfg.fetch && !s->cfg.fetch->present(s->cfg.fetch->ctx, b))
            continue; /* a guess never fetches from the hub */
        if (io_pending(s->io) >= io_total_depth(s->io) * 2)
            return; /* keep demand reads first in line */
        int v = victim(s, 1);
        if (v < 0)
            return;
        if (s->sl[v].blob >= 0 && !s->held[s->sl[v].blob] && s->heat[s->sl[v].blob] > 2 * s->heat[b] + 2)
            continue; /* a guess does not displace an expert routed more often than it */
        if (issue(s, v, b, s->pass, &err) != 0)
            return; /* a hint: the demand path will report real errors */
        s->sl[v].prefetched = 1;
        s->sl[v].pf_layer = layer;
        s->st.prefetch_reads++;
    }
    while (reap(s, 0, &err) == 1) { /* collect what already landed */
    }
}

static void xs_held(void *ctx, int layer, int id, int on)
{
    store *s = ctx;
    int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + id];
    if (b >= 0)
        s->held[b] = (uint8_t)(on != 0);
}

/* A device backend's dropped expert into a slot of its own (a redundant or cold one), its bytes
 * copied back by the backend: no read. Never while an item of the request waits for a slot (the
 * slot is that item's), nor over a guess in flight or ready (prefetched slots are kept). The
 * image's bytes between its matrices are not restored: nothing reads them, and the blob was
 * checked when it first entered the cache (its bits come from that copy). */
static int xs_adopt(void *ctx, int layer, int id, mlp_w *mats)
{
    store *s = ctx;
    int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + id];
    if (b < 0 || s->blob_slot[b] >= 0)
        return 0;
    for (int i = 0; i < s->n; i++)
        if (s->items_state[i] == R_WAIT)
            return 0;
    int v = victim(s, 1);
    if (v < 0)
        return 0;
    slot *sl = &s->sl[v];
    if (sl->blob >= 0)
        s->blob_slot[sl->blob] = -1;
    sl->blob = b;
    sl->state = S_LOADING; /* until adopted: no request can be handed it (none runs meanwhile) */
    sl->reads_left = 0;
    sl->bad = 0;
    sl->copy = -1;
    sl->prefetched = 0;
    sl->stamp = ++s->clock;
    s->blob_slot[b] = v;
    blob_bind_expert(&s->bt, s->m, b, slot_mem(s, v), mats);
    return 1;
}

static void xs_adopted(void *ctx, int layer, int id, int ok)
{
    store *s = ctx;
    int b = s->bt.expert_blob[(size_t)layer * s->bt.n_experts + id];
    int k = b >= 0 ? s->blob_slot[b] : -1;
    assert(k >= 0 && s->sl[k].state == S_LOADING && s->sl[k].reads_left == 0);
    if (!ok) {
        slot_drop(s, k);
        return;
    }
    s->sl[k].state = S_READY;
    s->st.adopted++;
}

static void xs_pass_begin(void *ctx, int tokens)
{
    store *s = ctx;
    s->pass++;
    s->st.passes++;
    s->st.tokens += (uint64_t)tokens;
}

int store_open(store **out, const model *m, blob_table *bt, const dfsp_info *info, const store_cfg *cfg,
               errbuf *err)
{
    *out = NULL;
    store *s = calloc(1, sizeof *s);
    if (!s) {
        blob_table_free(bt);
        return errbuf_set(err, "store: out of memory");
    }
    s->m = m;
    s->bt = *bt;
    memset(bt, 0, sizeof *bt);
    s->cfg = *cfg;
    if (cfg->heat_path) {
        snprintf(s->heat_path, sizeof s->heat_path, "%s", cfg->heat_path);
        s->cfg.heat_path = s->heat_path;
    }
    s->dfsp = info != NULL;
    if (s->bt.max_expert == 0) {
        store_free(s);
        return errbuf_set(err, "%s: the model has no routed experts to stream", m->dir);
    }
    s->spine_pf_after = -1;
    /* a MoE layer's experts in use and the next layer's guesses */
    int working = 2 * m->hp.top_k;
    unsigned plan_flags =
        (cfg->spine_stream_all ? STORE_PLAN_STREAM_ALL : 0) | (cfg->spines_on_device ? STORE_PLAN_DEVICE : 0);
    if (store_plan_make(&s->bt, cfg->ram_budget, plan_flags, working, &s->plan, err) != 0) {
        store_free(s);
        return -1;
    }
    s->slot_bytes = s->plan.expert_slot_bytes;
    s->spine_bytes = s->plan.spine_slot_bytes;
    uint64_t slots = (uint64_t)s->plan.expert_slots, all = 0;
    for (int b = 0; b < s->bt.n; b++)
        all += s->bt.b[b].kind == BLOB_EXPERT;
    if (slots > all)
        slots = all;
    s->plan.expert_slots = s->nx = (int)slots;
    s->ns = s->plan.spine_slots;
    s->nslots = s->nx + s->ns;
    int nb = s->bt.n, ne = m->hp.n_experts > 0 ? m->hp.n_experts : 1;
    s->sl = calloc((size_t)s->nslots, sizeof *s->sl);
    s->spine_L = calloc((size_t)(s->ns ? s->ns : 1), sizeof *s->spine_L);
    s->spine_bound = malloc(sizeof(int) * (size_t)(s->ns ? s->ns : 1));
    s->blob_slot = malloc(sizeof(int) * (size_t)nb);
    s->verified = calloc((size_t)nb, 1);
    s->bad_copy = calloc((size_t)nb, 1);
    s->heat = calloc((size_t)nb, sizeof *s->heat);
    s->held = calloc((size_t)nb, 1);
    s->read_pass = calloc((size_t)nb, sizeof *s->read_pass);
    s->reads_in_pass = calloc((size_t)nb, sizeof *s->reads_in_pass);
    s->ids = malloc(sizeof(int) * (size_t)ne);
    s->items_blob = malloc(sizeof(int) * (size_t)ne);
    s->items_state = malloc(sizeof(int) * (size_t)ne);
    s->mem_bytes = (size_t)s->nx * s->slot_bytes + (size_t)s->ns * s->spine_bytes;
    /* slot memory: huge pages where the kernel gives them, touched now so that reads never wait
     * for the kernel to find and zero pages (measured: page faults were a third of the read
     * path's CPU time) */
    void *mem = mmap(NULL, s->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
        madvise(mem, s->mem_bytes, MADV_HUGEPAGE);
#endif
        memset(mem, 0, s->mem_bytes);
        s->mem = mem;
    }
    if (s->cfg.fetch)
        s->sum = XXH3_createState();
    if (!s->sl || !s->spine_L || !s->spine_bound || !s->blob_slot || !s->verified || !s->bad_copy || !s->heat || !s->held || !s->read_pass ||
        !s->reads_in_pass || !s->ids || !s->items_blob || !s->items_state || !s->mem || (s->cfg.fetch && !s->sum)) {
        store_free(s);
        return errbuf_set(err, "store: out of memory for %d expert and %d spine slots", s->nx, s->ns);
    }
    for (int i = 0; i < m->hp.n_layers; i++) /* a streamed layer's matrices all lie in its spine blob */
        if (s->plan.streamed[i] && blob_bind_layer(&s->bt, m, s->bt.layer_blob[i], slot_mem(s, s->nx), s->spine_L)) {
            store_free(s);
            return errbuf_set(err, "%s: layer %d has a matrix outside its own tensors; its spine cannot stream",
                              m->dir, i);
        }
    for (int k = 0; k < s->ns; k++)
        s->spine_bound[k] = -1;
    for (int b = 0; b < nb; b++) {
        s->blob_slot[b] = -1;
        s->bad_copy[b] = s->bt.b[b].dead; /* copies on packs that are not there are never read */
    }
    for (int k = 0; k < s->nslots; k++)
        s->sl[k].blob = -1;
    heat_load(s);
    io_cfg ic = cfg->io;
    if (s->dfsp) {
        s->ndrives = info->ndrives > ic.ndrives ? info->ndrives : ic.ndrives;
        ic.ndrives = s->ndrives;
    } else {
        s->ndrives = ic.ndrives < 1 ? 1 : ic.ndrives;
    }
    /* each drive's queue depth and request size, as doctor --drives measured them in its folder
     * (the folder of the first file on that drive); drives never measured keep the defaults */
    int nfiles = s->dfsp ? info->npacks : m->st.nfiles;
    const char *paths[256];
    int drives[256];
    for (int i = 0; i < nfiles && i < 256; i++) {
        paths[i] = s->dfsp ? info->pack_path[i] : m->st.files[i].path;
        drives[i] = s->dfsp ? info->pack_drive[i] : 0;
    }
    if (io_tune_files(&ic, paths, drives, nfiles < 256 ? nfiles : 256, err) != 0) {
        store_free(s);
        return -1;
    }
    if (!(s->io = io_new(&ic, err))) {
        store_free(s);
        return -1;
    }
    errbuf why;
    if (strcmp(io_backend_name(s->io), "io_uring") != 0)
        snprintf(s->io_note, sizeof s->io_note, "pread threads");
    else if (io_register_memory(s->io, s->mem, s->mem_bytes, &why) == 0)
        snprintf(s->io_note, sizeof s->io_note, "io_uring, slot memory registered");
    else /* optional: reads work without it */
        snprintf(s->io_note, sizeof s->io_note, "io_uring, unregistered buffers: %s", why.msg);
    for (int i = 0; i < nfiles && i < 256; i++) {
        const char *p = s->dfsp ? info->pack_path[i] : m->st.files[i].path;
        int drive = s->dfsp ? info->pack_drive[i] : 0;
        snprintf(s->file_path[i], sizeof s->file_path[i], "%s", p);
        s->pack_drive[i < STORE_MAX_PACKS ? i : 0] = drive;
        if (s->dfsp && !info->pack_ok[i]) { /* missing: its copies are dead (bad_copy) */
            s->file_id[i] = -1;
            continue;
        }
        if ((s->file_id[i] = io_open(s->io, p, drive, s->dfsp, err)) < 0) {
            store_free(s);
            return -1;
        }
    }
    s->xs = (weight_src){.ctx = s,
                         .layer = xs_layer,
                         .layer_release = xs_layer_release,
                         .begin = xs_begin,
                         .next = xs_next,
                         .release = xs_release,
                         .prefetch = cfg->prefetch ? xs_prefetch : NULL,
                         .pass_begin = xs_pass_begin,
                         .memory = xs_memory,
                         .held = xs_held,
                         .adopt = xs_adopt,
                         .adopted = xs_adopted};
    *out = s;
    return 0;
}

void store_free(store *s)
{
    if (!s)
        return;
    /* reads still in flight land in slot memory: wait for them before it goes */
    errbuf err;
    uint64_t tag;
    int ok;
    while (s->io && io_pending(s->io) > 0 && io_reap(s->io, &tag, &ok, 1, &err) >= 0) {
    }
    io_free(s->io);
    if (s->mem)
        munmap(s->mem, s->mem_bytes);
    free(s->sl);
    free(s->spine_L);
    free(s->spine_bound);
    free(s->blob_slot);
    free(s->verified);
    XXH3_freeState(s->sum);
    free(s->bad_copy);
    free(s->heat);
    free(s->held);
    free(s->read_pass);
    free(s->reads_in_pass);
    free(s->ids);
    free(s->items_blob);
    free(s->items_state);
    blob_table_free(&s->bt);
    free(s);
}

const weight_src *store_weights(store *s) { return &s->xs; }
const store_plan *store_plan_get(const store *s) { return &s->plan; }

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21 /* Linux 5.4: reclaim the range's pages now */
#endif

/* Each spine part's whole pages inside its tensor's mapped bytes: a page shared with a neighbour
 * stays (it may be a global's). MADV_PAGEOUT gives the clean file pages back to the kernel; where
 * it is refused, MADV_DONTNEED at least takes them out of this process. */
uint64_t store_spines_release(store *s)
{
    if (!s->cfg.spines_on_device)
        return 0;
    const long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uint64_t let_go = 0;
    for (int i = 0; i < s->bt.n_layers; i++) {
        int b = s->bt.layer_blob[i];
        if (b < 0)
            continue;
        assert(!s->plan.streamed[i]);
        const blob *x = &s->bt.b[b];
        for (int j = x->first_part; j < x->first_part + x->nparts; j++) {
            const blob_part *pt = &s->bt.part[j];
            const uint8_t *at = s->m->st.t[pt->tensor].data + pt->src;
            uintptr_t a = ((uintptr_t)at + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
            uintptr_t e = ((uintptr_t)at + pt->len) & ~(uintptr_t)(pg - 1);
            if (e <= a)
                continue;
            if (madvise((void *)a, e - a, MADV_PAGEOUT) != 0)
                madvise((void *)a, e - a, MADV_DONTNEED);
            let_go += e - a;
        }
    }
    return let_go;
}
int store_slots(const store *s) { return s->nx; }

int store_pinned(const store *s)
{
    int n = 0;
    for (int k = 0; k < s->nslots; k++)
        n += s->sl[k].pins > 0;
    return n;
}
uint64_t store_slot_bytes(const store *s) { return s->slot_bytes; }
const blob_table *store_blobs(const store *s) { return &s->bt; }
void store_stats_get(const store *s, store_stats *out) { *out = s->st; }
io_engine *store_io(store *s) { return s->io; }
const char *store_io_note(const store *s) { return s->io_note; }

int store_ndrives(const store *s) { return s->ndrives; }

void store_stats_reset(store *s)
{
    memset(&s->st, 0, sizeof s->st);
    io_stats_reset(s->io);
}

int store_is_mapped(const store *s, int b)
{
    const blob *x = &s->bt.b[b];
    if (x->kind == BLOB_GLOBAL)
        return 1;
    return x->kind == BLOB_SPINE && !s->plan.streamed[x->layer];
}

int store_verify_all(store *s, errbuf *err)
{
    /* every copy of every blob, read through slot k in slot-sized pieces (spine blobs can be
     * larger than a slot) and hashed as a stream */
    int k = victim(s, 0), rc = -1;
    if (k < 0)
        return errbuf_set(err, "verify: no free slot");
    slot_drop(s, k);
    s->sl[k].pins++; /* keep it out of victim() while it is borrowed */
    XXH3_state_t *h = XXH3_createState();
    if (!h) {
        errbuf_set(err, "verify: out of memory");
        goto out;
    }
    for (int b = 0; b < s->bt.n; b++) {
        const blob *x = &s->bt.b[b];
        for (int c = 0; c < x->ncopies; c++) {
            if (x->dead >> c & 1) {
                char nm[64];
                blob_name(x, nm, sizeof nm);
                errbuf_set(err, "blob '%s' copy %d cannot be read: its pack %s is missing or truncated", nm, c,
                           s->file_path[x->copy[c].file]);
                goto out;
            }
            XXH3_64bits_reset(h);
            for (uint64_t off = 0; off < x->size; off += s->slot_bytes) {
                uint64_t len = x->size - off < s->slot_bytes ? x->size - off : s->slot_bytes;
                uint64_t tag;
                int ok;
                if (io_read(s->io, s->file_id[x->copy[c].file], x->copy[c].off + off, blob_padded(len), slot_mem(s, k),
                            (uint64_t)k, err) != 0)
                    goto out;
                if (io_reap(s->io, &tag, &ok, 1, err) != 1 || !ok) {
                    errbuf_set(err, "verify: read of %s at byte %llu failed", s->file_path[x->copy[c].file],
                               (unsigned long long)(x->copy[c].off + off));
                    goto out;
                }
                XXH3_64bits_update(h, slot_mem(s, k), len);
            }
            if (XXH3_64bits_digest(h) != x->xxh3) {
                char nm[64];
                blob_name(x, nm, sizeof nm);
                errbuf_set(err, "blob '%s' copy %d in %s failed its checksum", nm, c, s->file_path[x->copy[c].file]);
                goto out;
            }
        }
    }
    rc = 0;
out:
    XXH3_freeState(h);
    s->sl[k].pins--;
    return rc;
}
