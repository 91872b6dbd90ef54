/* stream.h — a streamed install (`deltafin setup --stream`): a Hugging Face folder whose
 * safetensors shards are sparse files of their full size, holding their headers and the spine as
 * setup fetched them, and each routed expert once the router first asks for it, fetched by HTTP
 * Range from the hub (hub.h) into its place in the shard and read from there afterwards.
 *
 * The folder holds stream.json ({"format": "deltafin-stream", "version": 1, "repo", "commit",
 * "files": {NAME: {"size", "sha256"}}}) and stream.journal, one line per event, appended and synced
 * after the bytes it speaks of:
 *     B XXH3 TENSOR     a blob is present: its parts' bytes in order hash to XXH3 (TENSOR: its
 *                       first part's tensor, which names the blob in any build)
 *     V SHARD           every byte of SHARD is present and its sha256 is the hub's
 *     R SHARD           SHARD failed its sha256: what was recorded for it is forgotten (refetched)
 * A torn last line (a crash) is ignored. The hub gives one sha256 per file, so a blob is
 * "unverified" until its whole shard has been fetched and hashed; its xxh3 is checked on the
 * first read of every run (store.h's fetcher) from the start. One thread (the engine's).
 */
#ifndef DF_ENGINE_STREAM_H
#define DF_ENGINE_STREAM_H

#include <stdint.h>

#include "base/err.h"
#include "hub/hub.h"
#include "model/model.h"
#include "store/blobs.h"
#include "store/store.h"

#define STREAM_JSON "stream.json"

typedef struct stream stream;

typedef struct stream_counts {
    int experts, experts_present, experts_unverified; /* routed experts: all, on the drive, of those
                                                          in shards not yet hashed whole */
    int shards, shards_verified;
    int fetched;                  /* blobs fetched by this process */
    uint64_t bytes_fetched;
    double fetch_s;               /* time spent fetching */
} stream_counts;

/* 1 if dir is a streamed install. */
int stream_is_install(const char *dir);
/* Opens dir's install for m (loaded from dir) and its blob table (copied: the store takes bt).
 * h: the hub to fetch from (borrowed), or NULL: offline, a blob not yet present is an error.
 * need_spine: refuse an install whose spine (every blob but the routed experts, which the model
 * maps rather than reads through the store) is not all present, as a setup stopped part-way
 * leaves it: what was never fetched would be computed with as zeros. */
int stream_open(stream **out, const char *dir, const model *m, const blob_table *bt, hub *h, int need_spine,
                errbuf *err);
void stream_free(stream *s);
/* What the store calls (store_cfg.fetch). */
const store_fetcher *stream_fetcher(stream *s);
/* Makes blob b present (fetching it when it is not), then, when that completes its shard, fetches
 * the shard's remaining bytes and checks the shard's sha256. */
int stream_fetch(stream *s, int b, errbuf *err);
int stream_present(const stream *s, int b);
void stream_counts_get(const stream *s, stream_counts *out);
/* Re-reads every present blob against the xxh3 of its fetch and every verified shard against the
 * hub's sha256, offline: 0, or -1 naming the first that differs. */
int stream_check(const stream *s, errbuf *err);

/* The journal's lines, in order: on(ctx, kind, xxh3, name) for each well-formed one, kind 'B' (a
 * blob: name its key, xxh3 its sum), 'V' or 'R' (name a shard); torn and unknown lines are skipped.
 * (stream_open's reader; fuzzed.) */
void stream_journal_scan(const char *txt, size_t len, void (*on)(void *ctx, char kind, uint64_t xxh3, const char *name),
                         void *ctx);

/* Writes dir/stream.json for repo r's safetensors files (atomically). */
int stream_json_write(const char *dir, const hub_repo *r, errbuf *err);

#endif
