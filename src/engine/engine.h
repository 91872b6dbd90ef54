/* engine.h — the one way in to a model: open it, then run sessions on it.
 *
 *     engine_opts o;  engine_opts_default(&o);
 *     for each argv option:  engine_opts_parse(&o, argc, argv, &i, &err);   // --model, --threads, ...
 *     engine *e;  engine_open(&o, &e, &err);        // model + weight store + pool + kernels
 *     session_opts so;  session_opts_default(&so);  so.context = 4096;
 *     session *s;  session_new(e, &so, &s, &err);
 *     session_sync(s, prompt, n, &err);             // reuses what it already holds
 *     const float *lg = session_last_logits(s);     // [vocab], bit-identical to a cold run
 *     ... session_run(s, &pass, &err); session_commit(s, n_keep, &err); ...
 *     session_free(s);  engine_free(e);
 *
 * The engine owns the model (a Hugging Face folder or a DFSP store), the weight store when
 * weights stream, the thread pool, the kernel table and the tokenizer with its chat format.
 * Subcommands (run, eval, bench io, serve) open a model only through engine_open, with the
 * options engine_opts_parse reads; nothing above this header assembles those parts itself.
 *
 * Threading: an engine and its sessions are driven from one thread at a time. A call that finds
 * another thread inside the engine fails with an error saying so, instead of racing. The pool's
 * worker threads are the engine's own business.
 *
 * Exactness: a session's logits and taps for a position depend only on the tokens up to it: not
 * on how they were split into passes, on which were reused, checkpointed, committed in part or
 * recomputed, on the thread count, the kernel table, the RAM budget or the drive layout
 * (docs/exactness.md).
 *
 * Memory: session_new reserves everything its passes need (state for `context` positions, pass
 * scratch, logits, the commit log, taps are the caller's); passes and commits allocate nothing.
 * Checkpoints are taken within a byte budget and are the only memory a sync may allocate.
 */
#ifndef DF_ENGINE_ENGINE_H
#define DF_ENGINE_ENGINE_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "model/model.h"
#include "tokenizer/tok.h"

typedef struct engine engine;
typedef struct session session;
struct store;
struct hub_opts;

/* ---- opening a model ---- */

enum engine_io { ENGINE_IO_AUTO, ENGINE_IO_URING, ENGINE_IO_PREAD };

typedef struct engine_opts {
    const char *model;     /* a Hugging Face folder or a DFSP store; NULL: the bundled default model */
    uint64_t ram_budget;   /* bytes for weights; 0: everything stays mapped when it fits in 80% of
                              physical memory, otherwise 80% of it */
    const char *drives;    /* comma-separated folders replacing a DFSP store's drive folders */
    const char *emulate;   /* "MBps:latency_us,..." one per drive: reads paced as such drives */
    int io;                /* enum engine_io */
    int prefetch;          /* router lookahead and spine read-ahead (default 1) */
    int verify;            /* check each blob's checksum on first load (default 1) */
    int min_cache;         /* stream with the least cache: the spine and two experts */
    int threads;           /* 0: every CPU this process may run on */
    const char *kernels;   /* "auto" (or NULL), "scalar", "avx2", "avx512", "neon" */
    const char *device;    /* where passes run (backend.h): "cpu" (or NULL); "cuda[:N]" in a CUDA build */
    uint64_t vram_budget;  /* a device's bytes for weights: every spine, then a cache of streamed
                              experts (0: its free memory less a reserve) */
    const struct hub_opts *hub; /* where a streamed install (setup --stream) fetches the experts it
                              does not hold yet; NULL: offline (such an expert is an error) */
    engine *pool_of;       /* run on this engine's threads (a drafter model beside its target: one
                              set of threads, never two spinning against each other); NULL: own */
} engine_opts;

void engine_opts_default(engine_opts *o);
/* Consumes argv[*i] (and its value, advancing *i) when it is one of the options above:
 * --model, --ram-budget, --drives, --emulate-drives, --io, --prefetch, --no-verify, --threads,
 * --kernels, --device, --vram-budget. Returns 1 when consumed, 0 when it is not an engine option, -1 when its value is
 * bad or missing (err names the option). */
int engine_opts_parse(engine_opts *o, int argc, char **argv, int *i, errbuf *err);
extern const char ENGINE_OPTS_HELP[];

int engine_open(const engine_opts *o, engine **out, errbuf *err);
/* A streamed install's fetch layer (engine/stream.h: counts, fetching ahead), NULL for any other
 * model. */
struct stream *engine_stream(engine *e);
/* The bundled default model's folder (models/default beside the binary, or in the working
 * folder), for engine_open without --model. */
int engine_default_model(char *out, size_t cap, errbuf *err);
/* An engine over a model and weight store the caller loaded and keeps (tests and tools that
 * assemble unusual stores): m and st (NULL: every weight resident) are borrowed and must outlive
 * the engine; of o only threads, kernels and device are used. */
int engine_wrap(const model *m, struct store *st, const engine_opts *o, engine **out, errbuf *err);
/* Every session must have been freed. Saves the routing counts of a store (heat file). */
void engine_free(engine *e);

const hparams *engine_hparams(const engine *e);
/* Bytes of weights one position's pass uses: every bound tensor, routed experts weighted by
 * top_k / n_experts (what a drafter's cost estimate compares; not a measurement). */
uint64_t engine_active_bytes(const engine *e);
const model *engine_model(const engine *e);
const char *engine_model_dir(const engine *e);
const char *engine_kernels(const engine *e); /* the table's name */
int engine_threads(const engine *e);
/* The model folder's tokenizer, loaded on first use; NULL (err set) when it has none. */
const tok *engine_tok(engine *e, errbuf *err);
/* The weight store, NULL when every weight is resident: for statistics and `bench io`. */
struct store *engine_store(engine *e);
/* One line naming what runs: model type, device (when not the CPU), kernels, threads. */
void engine_describe(const engine *e, char *buf, size_t cap);
/* --stats lines on the weights (resident, or the store's figures over `tokens` in `seconds`);
 * engine_mark_decode notes the store's counters at the first generated token, and
 * engine_report_decode prints the reads of the `tokens` decoded since, per drive. */
void engine_report(engine *e, FILE *f, int tokens, double seconds);
void engine_mark_decode(engine *e);
void engine_report_decode(engine *e, FILE *f, int tokens);

/* ---- sessions ---- */

typedef struct session_opts {
    int context;          /* positions the session holds */
    int max_pass;         /* the largest pass (prefill chunk or verify); <= context */
    int max_logits;       /* positions of one pass that may get logits */
    int max_commit;       /* passes of up to this many positions log their recurrence inputs, so
                             that session_commit keeps part of them without reading a weight again;
                             a longer pass kept in part is recomputed */
    uint64_t ckpt_budget; /* bytes of recurrent-state checkpoints session_sync may keep (each also
                             keeps the logits of its last position: a sync that ends where one ended
                             before runs nothing) */
    int ckpt_every;       /* a long sync also checkpoints every this many positions (0: only where
                             each sync ends) */
    int prefill_chunk;    /* the passes session_sync runs a prompt in (0: max_pass; at most max_pass) */
} session_opts;

/* context 4096, max_pass 256, max_logits 16, max_commit 16, ckpt_budget 256 MiB, ckpt_every 1024,
 * prefill_chunk 0 */
void session_opts_default(session_opts *o);
int session_new(engine *e, const session_opts *o, session **out, errbuf *err);
void session_free(session *s);
/* Forgets every token and checkpoint: position 0, zero state. */
void session_reset(session *s);

int session_len(const session *s);              /* tokens held, the last pass included */
const int32_t *session_tokens(const session *s); /* [session_len] */
int session_context(const session *s);

/* One pass over T new tokens at positions len .. len+T-1. */
typedef struct session_pass {
    const int32_t *tokens; /* [T] */
    int T;                 /* 1 .. max_pass */
    int n_logits;          /* the last n_logits positions get logits (0: none), <= max_logits */
    const int *taps;       /* layers whose output is returned, any order, or NULL */
    int n_taps;
    float *tap_out;        /* [T][n_taps][hidden], the caller's: for K3 (AttnRes) the raw running
                              block sum ("prefix") leaving the layer, for other families the residual
                              stream after it */
} session_pass;

/* Runs a pass and appends its tokens. An earlier pass not yet committed is kept whole first.
 * Errors (a token outside the vocabulary, the context full, an expert read failing) leave the
 * session as it was before the pass. */
int session_run(session *s, const session_pass *p, errbuf *err);
/* Logits [vocab] of position t (0 .. T-1) of the last pass; NULL when it got none. */
const float *session_logits(const session *s, int t);
/* Keeps the first n_keep (0..T) positions of the last pass and forgets the rest, as if only they
 * had ever been run: KDA state replayed from the pass's log (or the kept part recomputed when the
 * pass was longer than max_commit), attention caches truncated. */
int session_commit(session *s, int n_keep, errbuf *err);

/* Brings the session to exactly ids[0..n): reuses the longest prefix it holds, from its history
 * or from a checkpoint at or before the first difference, and runs only the rest. Afterwards
 * session_last_logits are those of a cold run of the same ids, bit for bit. */
int session_sync(session *s, const int32_t *ids, int n, errbuf *err);
/* Logits [vocab] of position len-1, NULL when the last operation did not produce them. */
const float *session_last_logits(const session *s);

/* A tap sink: every pass of s, a sync's too, computes the taps of layers[0..n) and hands them to
 * fn(ud, pos0, T, taps [T][n][hidden]) for its positions pos0 .. pos0+T-1 before it returns, so a
 * drafter reading the target's hidden states (DSpark) sees every position the session computes
 * (the positions of a pass kept only in part are handed over again when they are next run).
 * n = 0 removes it. A pass asking for taps of its own while a sink is set is refused. */
typedef void (*session_tap_fn)(void *ud, int pos0, int T, const float *taps);
int session_set_tap_sink(session *s, const int *layers, int n, session_tap_fn fn, void *ud, errbuf *err);
/* The most positions one pass may carry and keep in part without recomputing (session_opts). */
int session_max_pass(const session *s);
int session_max_commit(const session *s);

typedef struct session_stats {
    uint64_t passes, positions_run;  /* passes run, and positions they computed */
    uint64_t syncs, reused;          /* session_sync calls, and positions they did not recompute */
    uint64_t recomputed;             /* positions run again by commits of long passes */
    int ckpts;                       /* checkpoints held now */
    uint64_t ckpt_bytes, ckpt_peak;  /* their bytes now, and the most ever held at once */
    uint64_t log_bytes;              /* the commit log reserved */
} session_stats;
void session_stats_get(const session *s, session_stats *out);

/* ---- a session on disk (session_file.c) ---- */

/* What makes the model's logits, as 64 hex digits (SHA-256 of config.json and the weights' manifest
 * or safetensors headers with samples of their data): a saved state is only loaded by an engine
 * with the same identity. */
int engine_identity(engine *e, char out[65], errbuf *err);
/* Writes what the session holds (its tokens, recurrent state, attention rows, last logits and
 * checkpoints; a pending pass is kept whole first) to path atomically, with the engine's identity
 * and a checksum. */
int session_save(session *s, const char *path, errbuf *err);
/* Replaces what the session holds by a saved state, once its identity, sizes, length and checksum
 * are checked (a bad file leaves the session as it was). Afterwards the session is the saved one:
 * its logits are the bits the saved session would have given. */
int session_load(session *s, const char *path, errbuf *err);
/* The tokens a saved state holds (malloc'd), its identity checked but not its checksum: for
 * choosing which state to load. */
int session_file_tokens(engine *e, const char *path, int32_t **ids, int *n, errbuf *err);

/* The recurrent state (KDA S and conv windows of every KDA layer), as the next pass will read it,
 * for tests that compare sessions: *bytes gets its size. */
const void *session_recurrent(const session *s, size_t *bytes);

#endif
