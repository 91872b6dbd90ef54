/* engine_int.h — the engine's and the session's structures, shared by the files of src/engine
 * only (engine.h is the interface; nothing outside this folder sees these fields).
 *
 * Session invariants:
 *   - rec[cur] is the recurrent state (every KDA layer's S and conv window, rec_floats floats)
 *     after the n committed positions; hist[0..n) are their tokens.
 *   - A pass runs positions n .. n+T-1: it reads rec[cur], writes the state after it into
 *     rec[!cur] and the attention caches' rows n .. n+T-1, and leaves T in pend_T. Committing it
 *     whole flips cur; in part, replays the kept positions onto rec[cur] from the log (pend_logged)
 *     or recomputes them. A failed pass leaves pend_T 0 and rec[cur] untouched.
 *   - Checkpoints (ck, sorted by pos) hold rec after ck[i].pos positions of the current history;
 *     one whose position lies past a change of the history is dropped.
 *   - lg holds the logits of lg_n consecutive positions starting at absolute position lg_pos.
 *   - cap <= context; positions below cap have their cache rows and history slots allocated
 *     (cap grows a chunk of BLK_KV_CHUNK at a time, before the pass that needs it).
 */
#ifndef DF_ENGINE_ENGINE_INT_H
#define DF_ENGINE_ENGINE_INT_H

#include <stdatomic.h>

#include "base/arena.h"
#include "backend/backend.h"
#include "base/pool.h"
#include "engine/engine.h"
#include "kernels/kern.h"
#include "model/blk.h"

/* floats one position of an attention layer of this kind caches (ATTN_MLA: latent + key rope
 * part; ATTN_GQA: k and v; others none) */
static inline size_t engine_cache_width(const hparams *hp, int kind)
{
    if (kind == ATTN_MLA)
        return (size_t)hp->kv_lora_rank + hp->qk_rope;
    if (kind == ATTN_GQA)
        return 2 * (size_t)hp->n_kv_heads * hp->head_dim;
    return 0;
}

struct engine {
    model own;              /* the model engine_open loaded (unused by engine_wrap) */
    const model *m;
    struct store *store;    /* NULL: every weight resident */
    struct stream *stream;  /* a streamed install's fetch layer (stream.h), NULL otherwise */
    struct hub *hub;        /* the hub it fetches from, NULL: offline */
    const weight_src *xs;   /* the store's weight source, NULL with it */
    int own_parts;          /* 1: m and store belong to the engine */
    pool *pool;
    int own_pool;           /* 0: borrowed from engine_opts.pool_of */
    const kern_ops *k;
    const backend_ops *be;  /* where passes run (backend.h) */
    void *be_dev;           /* its state for the model (be->open), NULL for the CPU */
    uint64_t spines_released; /* with a store: the spine bytes RAM let go once the device held them */
    int be_index;           /* which device of its kind (--device cuda:N) */
    tok *tk;                /* loaded on first use */
    int dfsp, spine_int8;
    atomic_int sessions;    /* alive; engine_free asserts none */
    atomic_int busy;        /* a thread is inside the engine */
    char identity[65];      /* engine_identity, computed on first use ("" until then) */
    uint64_t verified_bytes; /* blobs checked from the mapping at open, and how long it took */
    int verified_blobs;
    double verify_s;
    /* engine_mark_decode */
    double mark_t;
    uint64_t mark_bytes, mark_drive[16];
};

/* Each call from outside that runs, reads or changes a session or the engine brackets itself
 * with these: a second thread finds `busy` set and gets an error instead of a race. */
int engine_enter(engine *e, errbuf *err);
void engine_leave(engine *e);

typedef struct session_ckpt {
    int pos;
    float *rec; /* [rec_floats + vocab]: the recurrent state at pos, then the logits of pos - 1 */
    int has_lg; /* the logits were there to keep (the end of a sync) */
} session_ckpt;

struct session {
    engine *e;
    const model *m;
    const hparams *hp;
    session_opts o;
    int32_t *hist;          /* [cap] */
    int n;                  /* committed positions */
    int pass_pos;           /* position of the last pass's first token */
    int pend_T;             /* the last pass, not yet committed (0: none) */
    int pend_logged;        /* it logged its recurrence inputs */
    layer_state *L;         /* [n_layers] */
    float *rec[2];          /* [rec_floats] each */
    int cur;
    size_t rec_floats;
    size_t *rec_off;        /* [n_layers] offset of a KDA layer's S in rec (its conv follows) */
    int cap;                /* positions the caches and hist hold now (grown in chunks to context) */
    int nchunks, chunk_cap; /* chunks allocated, and room in the pointer arrays */
    float **chunk_mem;      /* [chunk_cap] one block per chunk: every MLA/GQA layer's rows of it */
    size_t chunk_floats;    /* floats of one such block */
    size_t *chunk_off;      /* [n_layers] a layer's offset in a block (attention layers) */
    float *log;             /* [max_commit][n_kda][log_floats] */
    int n_kda;
    size_t log_floats;      /* per position per KDA layer */
    float *lg;              /* [max_logits][vocab] */
    int lg_pos, lg_n;
    arena ar;               /* pass scratch */
    session_ckpt *ck;
    int nck, cap_ck;
    int *sink_layers;       /* [sink_n] the tap sink's layers */
    int sink_n;
    float *sink_buf;        /* [max_pass][sink_n][hidden] */
    session_tap_fn sink_fn;
    void *sink_ud;
    session_stats st;
};

/* For session_file.c: room for positions below need (<= context); the pending pass kept whole. */
int session_grow(session *s, int need, errbuf *err);
int session_keep_pending(session *s, errbuf *err);
/* a checkpoint of rec[cur] at position n (with the logits session_last_logits has), in budget */
void session_ckpt_take(session *s);

/* The layer-major pass (pass.c): runs tokens[0..T) at positions s->n .. s->n+T-1 as session.h
 * describes (reads rec[cur], writes rec[!cur] and the caches; `logged`: the commit log too), the
 * last n_logits positions' logits into s->lg, taps into tap_out. Changes nothing else of s. */
int pass_run(session *s, const int32_t *tokens, int T, int n_logits, const int *taps, int n_taps, float *tap_out,
             int logged, errbuf *err);
/* The pass arena's size for passes of T tokens, in floats. */
size_t pass_floats(const model *m, int T);
/* The pool scratch each thread needs for a session of `context` positions, in floats. */
size_t pass_thread_floats(const model *m, int context);

#endif
