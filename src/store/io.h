/* io.h — the read engine of the weight store: many reads in flight on every drive.
 *
 * Backends: io_uring (Linux; liburing) or a portable pool of pread threads per drive. Files opened
 * `direct` use O_DIRECT where the system allows it (buffers, offsets and lengths must then be
 * 4096-aligned); after a buffered read, either backend drops the range from the page cache
 * (posix_fadvise(DONTNEED)) so streamed weights do not crowd out what stays resident. A read
 * larger than `chunk` bytes is split into chunk-sized requests so one blob keeps a drive's queue
 * full; its tag completes once, when the last piece has landed.
 *
 * Drive emulation (--emulate-drives "MBps:latency_us,...") models each drive as a queue served
 * at MBps with a fixed latency per request, and holds each completion until that model says the
 * drive would have finished it: many drives can be studied on one disk.
 *
 * One thread submits and reaps (the engine's compute thread). Not thread-safe otherwise.
 */
#ifndef DF_STORE_IO_H
#define DF_STORE_IO_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"

enum { IO_MAX_DRIVES = 16, IO_MAX_FILES = 256 };

typedef enum { IO_AUTO, IO_URING, IO_PREAD } io_backend;

typedef struct io_cfg {
    int backend;              /* io_backend */
    int depth;                /* requests in flight per drive */
    uint64_t chunk;           /* bytes per request */
    int drive_depth[IO_MAX_DRIVES];       /* per drive, from its tuning file; 0: `depth` */
    uint64_t drive_chunk[IO_MAX_DRIVES];  /* per drive, from its tuning file; 0: `chunk` */
    double drive_best_gbps[IO_MAX_DRIVES]; /* doctor's best O_DIRECT read of the drive (tuning
                                              file); 0: never measured */
    double drive_cold_gbps[IO_MAX_DRIVES]; /* doctor's random reads of a store's pack on the
                                              drive: cold model data; 0: not measured */
    double drive_sustained_gbps[IO_MAX_DRIVES]; /* doctor's tuning held for seconds (reads
                                                   in order); 0: not measured */
    int ndrives;
    double emu_mbps[IO_MAX_DRIVES];   /* 0: no emulation for that drive */
    double emu_lat_us[IO_MAX_DRIVES];
} io_cfg;

typedef struct io_drive_stats {
    uint64_t bytes, reqs;
    double busy_s;            /* wall time with at least one request in flight */
    double depth_s;           /* integral of requests in flight over time: / busy_s = mean depth */
    uint32_t lat_hist[32];    /* request latency histogram, bucket k = [2^k, 2^(k+1)) us */
} io_drive_stats;

typedef struct io_engine io_engine;

void io_cfg_default(io_cfg *c);
/* "MBps:latency_us,MBps:latency_us" -> c->emu_* for drives 0.. ; sets ndrives if larger. */
int io_parse_emulation(io_cfg *c, const char *spec, errbuf *err);
/* Per-drive tuning measured by `deltafin doctor --drives`: IO_TUNE_FILE in the drive's folder holds
 * {"request_bytes": R, "depth": D, "gbps": G, "best_gbps": B, "cold_gbps": C, "sustained_gbps": S}:
 * of the request sizes and queue depths doctor tried on that drive, the one with the least data in
 * flight that reached 95% of the best rate B (G: its own rate); C, when the folder held a DFSP
 * pack, the rate of random reads of it with R x D (cold model data, which on some drives reads
 * slower than doctor's just-written file); S, R x D's reads in order kept up for seconds, where B
 * and C are bursts of under a second each (a virtual disk can serve those faster than it sustains).
 * io_tune_load sets c->drive_chunk[d] / drive_depth[d] (and drive_best_gbps[d] /
 * drive_cold_gbps[d] / drive_sustained_gbps[d] when the file has them: older files do not) from
 * dir's file: 1 if it did, 0 if there is no file, -1 (naming the file and field) if it is
 * malformed or out of range. io_tune_save writes it atomically (temp + rename); cold_gbps or
 * sustained_gbps 0 leaves that field out. */
#define IO_TUNE_FILE "deltafin-drive.json"
int io_tune_load(io_cfg *c, int d, const char *dir, errbuf *err);
/* The same from a parsed file (`where` names it in errors): 1 set, -1 malformed or out of range. */
int io_tune_parse(io_cfg *c, int d, const json_t *j, const char *where, errbuf *err);
/* Each drive d < c->ndrives tuned from the folder of the first of paths[0..n) on it (drive[i]):
 * drives never measured keep the defaults; -1 when a tuning file is malformed. */
int io_tune_files(io_cfg *c, const char *const *paths, const int *drive, int n, errbuf *err);
int io_tune_save(const char *dir, uint64_t request_bytes, int depth, double gbps, double best_gbps, double cold_gbps,
                 double sustained_gbps, errbuf *err);

io_engine *io_new(const io_cfg *c, errbuf *err);
void io_free(io_engine *e);
const char *io_backend_name(const io_engine *e);

/* Registers [base, base + len) with io_uring (in regions of at most IO_REG_MAX bytes) so reads
 * into it skip per-request page pinning. Optional: -1 with the reason (another backend, a
 * memlock limit) leaves every read working as before. */
#define IO_REG_MAX ((uint64_t)1 << 30)
int io_register_memory(io_engine *e, void *base, uint64_t len, errbuf *err);
/* Requests that used registered memory so far. */
uint64_t io_fixed_reads(const io_engine *e);

/* Opens path for reading on drive d; returns a file id (>= 0) or -1. */
int io_open(io_engine *e, const char *path, int drive, int direct, errbuf *err);
int io_is_direct(const io_engine *e, int file);
/* Queues a read of len bytes at off into buf; `tag` comes back from io_reap. -1 only when nothing
 * was queued (a bad file id, no room for the whole read); once queued, the read completes through
 * io_reap (which reports a lasting submission failure). */
int io_read(io_engine *e, int file, uint64_t off, uint64_t len, void *buf, uint64_t tag, errbuf *err);
/* Reaps one finished read: returns 1 and fills *tag (and *ok = 0 if it failed or came up
 * short), 0 if none is ready (wait = 0) or none is in flight, -1 on an engine error.
 * wait = 1 blocks until one finishes. */
int io_reap(io_engine *e, uint64_t *tag, int *ok, int wait, errbuf *err);
/* Reads in flight (tags not yet reaped). */
int io_pending(const io_engine *e);
/* Drive d's queue depth and request size as the engine uses them, and the depths' sum. */
int io_drive_depth(const io_engine *e, int d);
/* doctor's best O_DIRECT read rate of drive d (GB/s), 0 if it was never measured */
double io_drive_best_gbps(const io_engine *e, int d);
/* doctor's rate of random reads of a store's pack on drive d (GB/s), 0 if not measured */
double io_drive_cold_gbps(const io_engine *e, int d);
/* doctor's rate of its tuning's reads in order kept up for seconds on drive d (GB/s), 0 if not measured */
double io_drive_sustained_gbps(const io_engine *e, int d);
/* drive d's emulated speed (--emulate-drives), GB/s; 0 when it is not emulated */
double io_drive_emulated_gbps(const io_engine *e, int d);
uint64_t io_drive_chunk(const io_engine *e, int d);
int io_total_depth(const io_engine *e);
/* When a read of len bytes queued now on drive d would be expected to finish (seconds from now),
 * from the drive's backlog and its measured or emulated speed: picks the mirror to read. */
double io_expected(const io_engine *e, int drive, uint64_t len);
void io_stats(const io_engine *e, int drive, io_drive_stats *out);
void io_stats_reset(io_engine *e);
/* Latency percentile (0..1) of drive d's requests, in microseconds. */
double io_latency_pct(const io_drive_stats *s, double p);

#endif
