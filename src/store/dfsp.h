/* dfsp.h — DFSP, Deltafin's store format: a checkpoint's blobs laid out for fast streaming.
 *
 * A store is a folder holding manifest.json plus the model's small files (config.json,
 * generation_config.json, tokenizer files); the blobs live in one pack file per drive folder,
 * "<drive>/dfsp-<identity>.pack", each blob a contiguous image (tensors 64-byte aligned inside,
 * bytes exactly as released) starting on a 4 KiB boundary and padded to one, so one O_DIRECT read
 * brings a whole expert. Blobs are striped over the drives in order; with mirrors each blob is
 * on N consecutive drives. Each pack is recorded by its absolute path and its path relative to
 * the store folder (drives are mount points that move; dfsp_open looks in --drives first, by the
 * pack's file name). The manifest records, per blob, its kind, layer, expert, size, xxh3
 * checksum, copies (pack, offset) and tensors (name, dtype, shape, offset); and the source's
 * identity (SHA-256 over config.json and every safetensors header). A store made with
 * `--spine int8` (spineq.h) says "spine": "int8" and names its packs dfsp-<identity>-int8.pack,
 * so it never shares a pack, a journal or a folder with the as-released store of the same model.
 *
 * prepare is atomic and resumable: blobs are written at planned offsets and journalled
 * (prepare.journal); a rerun re-verifies journalled blobs and continues; manifest.json appears
 * (temp + rename) only when every blob is written and synced. A store holding another model's
 * journal or manifest is refused; free space is checked before writing.
 */
#ifndef DF_STORE_DFSP_H
#define DF_STORE_DFSP_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"
#include "base/pool.h"
#include "model/model.h"
#include "store/blobs.h"
#include "store/io.h"

/* DFSP_VERSION: the manifest "version" this build writes and the only one it opens (a change to
 * the format bumps it and adds a migration to cli_upgrade.c's table). */
enum { STORE_MAX_PACKS = IO_MAX_DRIVES, DFSP_STOPPED = -2, DFSP_VERSION = 1 };

typedef struct dfsp_prepare_opts {
    const char *const *drives; /* drive folders (NULL/0: the store folder itself) */
    int ndrives;
    int mirrors;               /* copies of each blob, 1..ndrives */
    int spine_int8;            /* layer spines' matrices as INT8 group-32 (spineq.h; opt-in) */
} dfsp_prepare_opts;

typedef struct dfsp_prepare_stats {
    int blobs, resumed;        /* blobs in the store; verified from an earlier run */
    int already;               /* the store already held this model */
    int spine_mats;            /* --spine int8: matrices quantized, and their bytes before/after */
    uint64_t spine_in, spine_out;
    uint64_t bytes;            /* written by this run */
    double seconds;
} dfsp_prepare_stats;

/* Writes (or completes) a store. Returns 0, -1 on error, or DFSP_STOPPED when the environment
 * variable DELTAFIN_PREPARE_STOP_AFTER=N made it stop after N blobs (a test aid that leaves the
 * store exactly as a crash at that point would). */
int dfsp_prepare(const char *hf_dir, const char *store_dir, const dfsp_prepare_opts *o, dfsp_prepare_stats *st,
                 errbuf *err);

/* 1 if dir holds a DFSP manifest */
int dfsp_is_store(const char *dir);

/* The manifest, parsed and checked without touching any file (fuzzed). */
typedef struct dfsp_tensor {
    char *name;
    int dtype, ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t off, len;        /* inside the blob image */
} dfsp_tensor;

typedef struct dfsp_blob {
    int kind, layer, expert;
    uint64_t size, xxh3;
    int ncopies;
    blob_copy copy[STORE_MAX_COPIES];
    int first_tensor, ntensors;
} dfsp_blob;

typedef struct dfsp_manifest {
    char identity[65];
    int ndrives, mirrors, npacks;
    int spine_int8;           /* "spine": "int8" (absent: as released) */
    char pack_path[STORE_MAX_PACKS][1024]; /* as written: absolute (relative to the store in a
                                              manifest from before "rel") */
    char pack_rel[STORE_MAX_PACKS][1024];  /* relative to the store folder ("" when not recorded) */
    char pack_file[STORE_MAX_PACKS][256];  /* the pack's file name, looked for in --drives folders */
    int pack_drive[STORE_MAX_PACKS];
    uint64_t pack_size[STORE_MAX_PACKS];
    dfsp_blob *b;
    int nb;
    dfsp_tensor *t;
    int nt;
} dfsp_manifest;

int dfsp_manifest_parse(const json_t *man, const char *where, dfsp_manifest *out, errbuf *err);
void dfsp_manifest_free(dfsp_manifest *m);

/* What a run needs to read an opened store: the packs (the paths found) and their drives. */
typedef struct dfsp_info {
    int npacks;
    char pack_path[STORE_MAX_PACKS][1024];
    int pack_drive[STORE_MAX_PACKS];
    int pack_ok[STORE_MAX_PACKS];  /* 0: missing or truncated: no copy on it is read */
    int ndrives, mirrors;
    int spine_int8;
    char identity[65];
    char warning[2048];            /* packs that could not be used while the store still opened
                                      (their blobs come from mirrors), one line each; "" if none */
} dfsp_info;

typedef struct dfsp_open_opts {
    const char *drives;       /* comma-separated folders where the drives are now (--drives): each
                                 pack is looked for there by its file name; NULL: where the manifest
                                 recorded it (relative to the store, then the absolute path) */
    const signed char *copy;  /* [blobs, manifest order] the copy whose bytes a blob's tensors map
                                 (-1 or NULL: the first copy on a pack that is there) */
} dfsp_open_opts;

/* Opens a store: the model (tensors mapped from one copy of each blob) and its blob table with
 * copies and checksums. A pack that is missing or truncated is an error unless every blob on it
 * has a copy on another pack: then it is a warning in info->warning and those copies are dead
 * (blob.dead). Errors name what was looked for. */
int dfsp_open(const char *dir, const dfsp_open_opts *o, model *m, blob_table *bt, dfsp_info *info, errbuf *err);
/* Checks the xxh3 of every blob whose mapped[b] is set (blob table ids: those a run uses straight
 * from the mapping) in the copy its tensors map: what every pass reads (globals, spines) hashed
 * from the map on the pool's threads, which leaves it in memory for the run; experts, which a run
 * reads only if it routes to them, with O_DIRECT reads on the drives' tuned queues, which leaves
 * the page cache alone. A mismatch with no good copy is an error naming the blob and pack; with a
 * good mirror, better[b's manifest index] gets that copy and the function returns 1: reopen with
 * it. */
int dfsp_verify_mapped(const model *m, const blob_table *bt, const dfsp_info *info, const uint8_t *mapped, pool *p,
                       signed char *better, errbuf *err);

/* SHA-256 identity of a Hugging Face folder (config.json + safetensors headers), hex. */
int dfsp_identity(const char *hf_dir, const st_set *st, char out[65], errbuf *err);

#endif
