/* store.h — the weight store: what does not fit in RAM streams from one or more drives, so a
 * model far larger than RAM runs exactly as if it were resident.
 *
 * Sources: a Hugging Face folder (a blob is read tensor by tensor from the safetensors files) or
 * a DFSP store (dfsp.h: one aligned O_DIRECT read per blob, copies on several drives).
 *
 * The plan (plan.c): the RAM budget keeps the globals resident (mapped), then the expert slots a
 * pass works with, then as many layer spines as fit; layers whose spine does not fit stream
 * through two spine slots; the expert cache gets the rest. A pass takes each layer's weights with
 * weight_src.layer (the model's own for a resident layer, else a copy of the layer bound to the
 * slot its spine blob was read into) and gives them back before taking the next; with prefetch
 * on, the next streamed layer's spine is read while the layers before it compute (behind the
 * current layer's expert reads, which are needed first).
 *
 * The expert cache: fixed slots of the largest expert's size, carved from one allocation at open
 * (with the spine slots after them).
 * A pass asks for the union of a layer's experts (weight_src.begin); hits are handed over at once,
 * misses as their reads land (the MoE block computes in arrival order and sums in a fixed order,
 * so logits are bit-identical to the all-resident run). Slots in use are pinned; eviction takes the
 * unpinned slot whose expert is least often routed (routing counts are kept across runs in the
 * heat file), then the least recently used. Each blob is read at most once per pass. With
 * prefetch on, a layer's router applied to the residual stream before its attention (session.c)
 * predicts experts whose reads start early, into slots not used by the current request;
 * prediction never decides anything, and a guess the layer did not ask for is a plain cached
 * expert from that layer's request on.
 * Each copy of a DFSP blob is checked against its xxh3 the first time it is read into a slot: a
 * flipped byte is an error naming the blob and the pack of the copy read, never silent garbage;
 * with mirrors, a copy that fails is read again from another copy (and avoided from then on),
 * counted in copy_failures so the CLI can say a copy wants repair.
 */
#ifndef DF_STORE_STORE_H
#define DF_STORE_STORE_H

#include <stdint.h>

#include "base/err.h"
#include "model/blk.h"
#include "model/model.h"
#include "store/blobs.h"
#include "store/dfsp.h"
#include "store/io.h"

enum { STORE_SPINE_SLOTS = 2, STORE_MIN_EXPERT_SLOTS = 2 };

/* What a RAM budget keeps resident and what streams (store_plan_make). */
typedef struct store_plan {
    uint64_t budget;
    uint64_t resident_bytes;   /* globals and the spines kept resident (mapped) */
    int spine_streamed;        /* layers whose spine streams */
    uint8_t streamed[MODEL_MAX_LAYERS]; /* [n_layers] 1: that layer's spine streams */
    int spine_slots;           /* slots for streamed spines (0 when none streams) */
    uint64_t spine_slot_bytes;
    int expert_slots;          /* before store_open caps it at the number of experts */
    int working;               /* expert slots kept before any spine (<= 2 x top_k) */
    uint64_t expert_slot_bytes;
    uint64_t device_bytes;     /* STORE_PLAN_DEVICE: the layer spines a device holds, mapped but not
                                  charged to the budget (store_spines_release drops them from RAM) */
} store_plan;

enum {
    STORE_PLAN_STREAM_ALL = 1, /* every layer's spine streams, however much RAM is left (the least
                                  RAM a model runs in) */
    STORE_PLAN_DEVICE = 2,     /* a device backend keeps every layer's spine in its own memory after
                                  open: RAM holds the globals and the expert cache, no spine streams */
};

/* Plans budget bytes of RAM over bt's blobs, keeping up to `working` expert slots (as many as the
 * budget affords, at least STORE_MIN_EXPERT_SLOTS) before any spine; flags: STORE_PLAN_*. An error
 * names what the budget cannot cover. */
int store_plan_make(const blob_table *bt, uint64_t budget, unsigned flags, int working, store_plan *p,
                    errbuf *err);

/* Where the bytes of a Hugging Face source's blobs come from when they may not be on the drive
 * yet (an install that streams its experts from the hub): fetch makes blob b's parts present in
 * the model's safetensors files (blocking) before they are read; present says whether they are,
 * without fetching (a prefetch guess never fetches); sum gives the xxh3 recorded when b was fetched,
 * of its parts' bytes in order, which the first read of b into a slot in each run is checked
 * against. */
typedef struct store_fetcher {
    void *ctx;
    int (*fetch)(void *ctx, int b, errbuf *err);
    int (*present)(void *ctx, int b);
    int (*sum)(void *ctx, int b, uint64_t *xxh3); /* 1: recorded */
} store_fetcher;

typedef struct store_cfg {
    uint64_t ram_budget; /* bytes for weights: resident spine, spine slots and the expert cache */
    int prefetch;        /* router lookahead reads, and streamed spines read ahead */
    int spine_stream_all; /* every layer's spine streams, whatever the budget (store_plan_make) */
    int spines_on_device; /* a device backend holds the layer spines after open (STORE_PLAN_DEVICE,
                             store_spines_release); never with spine_stream_all */
    int verify;          /* xxh3 of DFSP blobs on first load */
    io_cfg io;
    const char *heat_path; /* routing counts kept across runs (NULL: none) */
    const store_fetcher *fetch; /* a Hugging Face source whose blobs may not be fetched yet (NULL:
                                   every byte is on the drive) */
} store_cfg;

typedef struct store_stats {
    uint64_t passes, tokens;
    uint64_t requests, hits, misses;  /* expert requests of passes */
    uint64_t reads, bytes_read;       /* every read, prefetch included */
    uint64_t bytes_needed;            /* images of the blobs passes missed or used from prefetch */
    uint64_t prefetch_reads, prefetch_hits;
    uint64_t max_reads_blob_pass;     /* most reads of one blob within one pass (spines too) */
    double stall_s;                   /* time passes waited for expert reads */
    uint64_t copy_failures;           /* reads that failed or mismatched their checksum and were read
                                         again from another copy (mirrors): a bad copy to repair */
    uint64_t adopted;                 /* experts a device backend dropped and copied back into RAM
                                         (weight_src.adopt) instead of losing them */
    /* streamed spines */
    uint64_t spine_requests, spine_hits;  /* layers taken, and how many were already in a slot */
    uint64_t spine_reads, spine_bytes_read, spine_prefetch_reads, spine_prefetch_hits;
    double spine_stall_s;             /* time passes waited for spine reads */
} store_stats;

typedef struct store store;

/* Opens the store for m: plans cfg->ram_budget (store_plan_make), then the slots. bt is taken over
 * (also on failure). info: the DFSP packs, or NULL for a Hugging Face folder (m's safetensors
 * files). */
int store_open(store **out, const model *m, blob_table *bt, const dfsp_info *info, const store_cfg *cfg,
               errbuf *err);
void store_free(store *s);
/* Writes the routing counts to cfg.heat_path (temp + rename), when one was given, so the next
 * run's eviction starts from them. */
int store_heat_save(const store *s, errbuf *err);
const weight_src *store_weights(store *s);
/* The plan the store runs (expert_slots as opened). */
const store_plan *store_plan_get(const store *s);
/* With store_cfg.spines_on_device, once the device has copied every layer spine: drops the pages of
 * their mapped bytes from RAM (the budget never counted them). The host still may read them: the
 * bytes come back from the drive, the same ones. Returns the bytes let go. */
uint64_t store_spines_release(store *s);
int store_slots(const store *s); /* expert slots */
/* 1 if blob b (of store_blobs) is used straight from the model's mapping (the globals, the
 * spines kept resident), 0 if it is read into a slot (experts, streamed spines: checked there). */
int store_is_mapped(const store *s, int b);
int store_pinned(const store *s); /* slots a pass holds now (0 between passes) */
uint64_t store_slot_bytes(const store *s);
const blob_table *store_blobs(const store *s);
void store_stats_get(const store *s, store_stats *out);
void store_stats_reset(store *s);
io_engine *store_io(store *s);
int store_ndrives(const store *s);
/* How reads are done: the backend, and whether the slot memory is registered with io_uring. */
const char *store_io_note(const store *s);
/* Reads every copy of every blob and checks its xxh3 (DFSP; doctor). Returns -1 naming the first
 * bad one. */
int store_verify_all(store *s, errbuf *err);

/* "1.23 GB", "45.6 MB", "789 KB" into buf; returns buf. */
const char *store_fmt_bytes(double bytes, char *buf, size_t cap);
/* Parses "64G", "512M", "1.5T", "123456" into bytes. */
int store_parse_bytes(const char *s, uint64_t *out);
/* Physical memory in bytes (0 if unknown). */
uint64_t store_physical_ram(void);

#endif
