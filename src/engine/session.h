/* session.h — one sequence being decoded: its position, per-layer state (KDA recurrent and conv
 * state, MLA latent cache, GQA k/v cache), and the pass that advances it.
 *
 * session_forward runs the model over T new tokens (1 = decode, >1 = prefill or verification)
 * in one layer-major pass and writes logits. Its result for a position never depends on how the
 * tokens were split into passes, on T, or on the thread count (blk.h, kern.h).
 *
 * Memory: everything a pass needs is reserved by session_init (the state for `cap` positions,
 * a scratch arena sized for passes of up to max_T tokens, per-thread kernel scratch), so
 * session_forward allocates nothing.
 *
 * Checkpoints: session_checkpoint copies the recurrent state (KDA S and conv windows) and the
 * position; session_rollback restores it. Caches indexed by position (MLA, GQA) need no copy:
 * rolling back the position makes later entries unused, and they are overwritten.
 */
#ifndef DF_ENGINE_SESSION_H
#define DF_ENGINE_SESSION_H

#include <stdint.h>

#include "base/arena.h"
#include "base/pool.h"
#include "kernels/kern.h"
#include "model/blk.h"
#include "model/model.h"

typedef struct session {
    const model *m;    /* borrowed; outlives the session */
    const kern_ops *k; /* borrowed */
    pool *pool;        /* borrowed */
    int cap;           /* positions the caches can hold */
    int max_T;         /* largest pass */
    int n_pos;         /* positions processed so far */
    layer_state *L;    /* [n_layers] */
    float *state_mem;  /* one block holding every layer's state */
    size_t rec_floats; /* recurrent part (KDA S + conv) at the start of state_mem */
    arena ar;          /* pass scratch */
    const weight_src *xs; /* borrowed; NULL = the model's own views (all resident) */
    int poisoned;      /* a pass failed part-way: state is inconsistent until reset/rollback */
} session;

typedef struct session_ckpt {
    int n_pos;
    float *rec; /* [rec_floats] copy of the recurrent state */
} session_ckpt;

int session_init(session *s, const model *m, const kern_ops *k, pool *p, int cap, int max_T, errbuf *err);
void session_free(session *s);
/* Routes expert reads through a source (the weight store); NULL restores the model's views. */
static inline void session_set_weights(session *s, const weight_src *xs) { s->xs = xs; }
/* Back to position 0 with zero state. */
void session_reset(session *s);

/* Runs T tokens at positions n_pos .. n_pos+T-1 and advances n_pos. logits: [T][vocab] when
 * all_logits, else [vocab] for the last token; may be NULL. Errors: a token id outside the
 * vocabulary, T > max_T, or the context full (state untouched); a failure inside the pass (an
 * expert read, scratch) leaves the session poisoned: later passes are refused until
 * session_reset or session_rollback. */
int session_forward(session *s, const int32_t *tokens, int T, float *logits, int all_logits, errbuf *err);

int session_ckpt_init(const session *s, session_ckpt *c, errbuf *err);
void session_ckpt_free(session_ckpt *c);
void session_checkpoint(const session *s, session_ckpt *c);
void session_rollback(session *s, const session_ckpt *c);

#endif
