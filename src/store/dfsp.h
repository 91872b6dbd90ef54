/* dfsp.h — DFSP, Deltafin's store format: a checkpoint's blobs laid out for fast streaming.
 *
 * A store is a folder holding manifest.json plus the model's small files (config.json,
 * generation_config.json, tokenizer files); the blobs live in one pack file per drive folder,
 * "<drive>/dfsp-<identity>.pack", each blob a contiguous image (tensors 64-byte aligned inside,
 * bytes exactly as released) starting on a 4 KiB boundary and padded to one, so one O_DIRECT read
 * brings a whole expert. Blobs are striped over the drives in order; with mirrors each blob is
 * on N consecutive drives. The manifest records, per blob, its kind, layer, expert, size, xxh3
 * checksum, copies (pack, offset) and tensors (name, dtype, shape, offset); and the source's
 * identity (SHA-256 over config.json and every safetensors header).
 *
 * prepare is atomic and resumable: blobs are written at planned offsets and journalled
 * (prepare.journal); a rerun re-verifies journalled blobs and continues; manifest.json appears
 * (temp + rename) only when every blob is written and synced. A store holding another model's
 * journal or manifest is refused; free space is checked before writing.
 */
#ifndef DF_STORE_DFSP_H
#define DF_STORE_DFSP_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"
#include "store/blobs.h"

typedef struct dfsp_prepare_opts {
    const char *const *drives; /* drive folders (NULL/0: the store folder itself) */
    int ndrives;
    int mirrors;               /* copies of each blob, 1..ndrives */
    int quiet;
} dfsp_prepare_opts;

int dfsp_prepare(const char *hf_dir, const char *store_dir, const dfsp_prepare_opts *o, errbuf *err);

/* 1 if dir holds a DFSP manifest */
int dfsp_is_store(const char *dir);

/* Opens a store: the model (tensors mapped from the packs) and its blob table with copies and
 * checksums. pack_paths[i] / pack_drive[i] describe the packs (caller-owned arrays of
 * STORE_MAX_PACKS); *npacks is set. */
enum { STORE_MAX_PACKS = 64 };
typedef struct dfsp_info {
    int npacks;
    char pack_path[STORE_MAX_PACKS][1024];
    int pack_drive[STORE_MAX_PACKS];
    int ndrives, mirrors;
    char identity[65];
} dfsp_info;
int dfsp_open(const char *dir, model *m, blob_table *bt, dfsp_info *info, errbuf *err);

/* SHA-256 identity of a Hugging Face folder (config.json + safetensors headers), hex. */
int dfsp_identity(const char *hf_dir, const st_set *st, char out[65], errbuf *err);

#endif
