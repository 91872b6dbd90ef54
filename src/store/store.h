/* store.h — the weight store: routed experts stream from one or more drives through a RAM
 * cache, so a model far larger than RAM runs exactly as if it were resident.
 *
 * Sources: a Hugging Face folder (an expert blob is read tensor by tensor from the safetensors
 * files) or a DFSP store (dfsp.h: one aligned O_DIRECT read per blob, copies on several drives).
 * The spine (every non-expert tensor) stays mapped and resident; the expert cache gets what the
 * RAM budget leaves.
 *
 * The cache: fixed slots of the largest expert's size, carved from one allocation at open.
 * A pass asks for the union of a layer's experts (expert_src.begin); hits are handed over at once,
 * misses as their reads land (the MoE block computes in arrival order and sums in a fixed order,
 * so logits are bit-identical to the all-resident run). Slots in use are pinned; eviction takes the
 * unpinned slot whose expert is least often routed (routing counts are kept across runs in the
 * heat file), then the least recently used. Each blob is read at most once per pass. With
 * prefetch on, a layer's router applied to the residual stream before its attention (session.c)
 * predicts experts whose reads start early, into slots not used by the current request;
 * prediction never decides anything, and a guess the layer did not ask for is a plain cached
 * expert from that layer's request on.
 * A DFSP blob is checked against its xxh3 the first time it enters the cache: a flipped byte is
 * an error naming the blob and pack, never silent garbage.
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

typedef struct store_cfg {
    uint64_t ram_budget; /* bytes for the expert cache */
    int prefetch;        /* router lookahead reads */
    int verify;          /* xxh3 of DFSP blobs on first load */
    io_cfg io;
    const char *heat_path; /* routing counts kept across runs (NULL: none) */
} store_cfg;

typedef struct store_stats {
    uint64_t passes, tokens;
    uint64_t requests, hits, misses;  /* expert requests of passes */
    uint64_t reads, bytes_read;       /* every read, prefetch included */
    uint64_t bytes_needed;            /* images of the blobs passes missed or used from prefetch */
    uint64_t prefetch_reads, prefetch_hits;
    uint64_t max_reads_blob_pass;     /* most reads of one blob within one pass */
    double stall_s;                   /* time passes waited for reads */
} store_stats;

typedef struct store store;

/* Opens the cache for m's experts. bt is taken over (also on failure). info: the DFSP packs, or
 * NULL for a Hugging Face folder (m's safetensors files). */
int store_open(store **out, const model *m, blob_table *bt, const dfsp_info *info, const store_cfg *cfg,
               errbuf *err);
void store_free(store *s);
/* Writes the routing counts to cfg.heat_path (temp + rename), when one was given, so the next
 * run's eviction starts from them. */
int store_heat_save(const store *s, errbuf *err);
const expert_src *store_experts(store *s);
int store_slots(const store *s);
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

/* Parses "64G", "512M", "1.5T", "123456" into bytes. */
int store_parse_bytes(const char *s, uint64_t *out);
/* Physical memory in bytes (0 if unknown). */
uint64_t store_physical_ram(void);

#endif
