/* blk.h — the building blocks of a forward pass over T positions of one sequence.
 *
 * One file per block kind (blk_kda.c, blk_mla.c, blk_gqa.c, blk_ffn.c, blk_moe.c) plus the
 * shared pieces in blk_common.c (matmul over the thread pool, RMSNorm, activations, RoPE,
 * AttnRes mixing). Every block reads x[T][H] and writes out[T][H]; what it keeps across
 * passes lives in its layer_state.
 *
 * Batch invariance: every value a block computes for position t depends only on position t's
 * inputs, the state before the pass, and positions before t, each combined in one fixed order
 * (kern.h for reductions; plain left-to-right loops elsewhere). So splitting a prompt into
 * chunks, or running with more threads, never changes a bit.
 *
 * Scratch comes from the pass arena (ar) and the pool's per-thread buffers; blocks never call
 * malloc.
 */
#ifndef DF_MODEL_BLK_H
#define DF_MODEL_BLK_H

#include <math.h>

#include "base/arena.h"
#include "base/err.h"
#include "base/pool.h"
#include "kernels/kern.h"
#include "kernels/kmath.h"
#include "model/model.h"

/* Per-layer decode state of one sequence.
 *
 * KDA's recurrent state is read from S_in / conv_in and the state after the pass is written to
 * S / conv: the session keeps two copies and flips between them when a pass is kept, so a pass
 * that fails or is only partly kept never disturbs the state before it (the pointers may also be
 * equal: in place). MLA and GQA caches are indexed by position: a pass writes its positions'
 * rows and a shorter history simply leaves later rows unused. */
typedef struct layer_state {
    const float *S_in; /* KDA: [kda_heads][kda_dim (k)][kda_dim (v)] recurrent state before the pass */
    float *S;          /* KDA: the same shape, the state after the pass */
    const float *conv_in; /* KDA: [3 (q,k,v)][conv_k - 1][P] last pre-conv inputs, oldest first */
    float *conv;       /* KDA: the same, after the pass */
    float *log;        /* KDA: [T][blk_kda_log_floats] the pass's recurrence inputs (raw q, k, v
                          projections, forget-gate input f, beta logits), for blk_kda_replay; NULL:
                          not logged */
    float **kv;        /* MLA: rows of kv_lora + qk_rope (normed latent, key rope part)
                          GQA: rows of [2][n_kv_heads * head_dim] (k after norm and rope, v)
                          one row per position, in chunks of BLK_KV_CHUNK rows: blk_kv_row */
} layer_state;

/* Positions per attention-cache chunk: a session's caches grow a chunk at a time, so its memory
 * follows the positions it holds, never its context ceiling. */
enum { BLK_KV_CHUNK = 256 };
static inline float *blk_kv_row(const layer_state *st, int pos, size_t width)
{
    return st->kv[pos / BLK_KV_CHUNK] + (size_t)(pos % BLK_KV_CHUNK) * width;
}

/* Where a pass's weights come from when they do not all sit in RAM (the weight store implements
 * this). NULL in blk means the model's own views: everything resident.
 *
 * Layers: the pass takes each layer's weights with layer() before using them and gives them back
 * with layer_release() when done (at most one layer held at a time); *out is the model's own
 * layer when it is resident, else a copy whose matrices lie in a streamed image of the layer's
 * spine blob (the same bytes: the same bits).
 * Experts: the MoE block asks for the union of its positions' experts with begin(), computes each
 * expert as next() hands it over (in whatever order the bytes arrive: results are summed in a
 * fixed order afterwards, so the order never changes a bit), and release()s it. */
typedef struct weight_src {
    void *ctx;
    int (*layer)(void *ctx, int layer, const layer_w **out, errbuf *err);
    void (*layer_release)(void *ctx, int layer);
    int (*begin)(void *ctx, int layer, const int *ids, int n, errbuf *err);
    /* 1 with *id and its matrices (valid until release), 0 when all were handed over, -1 error */
    int (*next)(void *ctx, int *id, mlp_w *mats, errbuf *err);
    void (*release)(void *ctx, int layer, int id);
    /* optional: `layer` will probably need these soon (router lookahead); only starts reads */
    void (*prefetch)(void *ctx, int layer, const int *ids, int n);
    /* optional: a new pass begins (for per-pass statistics) */
    void (*pass_begin)(void *ctx, int tokens);
    /* optional: the one host range every matrix next() hands over lies in, for as long as the
     * source lives (a device backend registers it, so that its copies to the device run
     * asynchronously from pinned memory) */
    void (*memory)(void *ctx, void **base, size_t *bytes);
    /* optional, for a device backend's own expert cache, so that device memory and the source's
     * RAM hold different experts (a hierarchy: device, RAM, drive):
     *   held: the backend now keeps (on = 1) or no longer keeps (0) a copy of expert (layer, id);
     *     the source's copy of a held expert is the first to make room for another;
     *   adopt: the backend is dropping (layer, id): 1 with *mats, host matrices of the source's
     *     own for the backend to copy the expert's bytes into before it calls adopted (ok = 1: the
     *     copy landed; 0: it failed, and the source forgets them), so that the expert stays in
     *     RAM and is not read from the drive again; 0 when the source has it already or no room */
    void (*held)(void *ctx, int layer, int id, int on);
    int (*adopt)(void *ctx, int layer, int id, mlp_w *mats);
    void (*adopted)(void *ctx, int layer, int id, int ok);
} weight_src;

typedef struct blk {
    const model *m;
    const hparams *hp;
    const kern_ops *k;
    pool *pool;
    arena *ar;       /* pass scratch */
    errbuf *err;
    const weight_src *xs; /* NULL: every weight from the model's views */
    void *dev;       /* the backend's state for this model (backend.h), NULL for the CPU */
} blk;

/* Float scratch from the pass arena; NULL (with b->err set) if the arena is exhausted. */
float *blk_alloc(const blk *b, size_t nfloats);

/* y[t][r] = W[r] . x[t] for T rows of x (contiguous [T][cols]) into y [T][rows], rows split
 * over the pool. */
void blk_matmul(const blk *b, const kmat *w, const float *x, int T, float *y);
/* y = x / sqrt(mean(x^2) + eps) * w, row by row ([T][n]); y may alias x. w may be NULL. */
void blk_rmsnorm(const blk *b, const float *x, const float *w, int T, int n, float eps, float *y);
/* a[i] = act(gate[i], up[i]) (SiLU-GLU or SiTU-GLU per hp), in place into gate; long vectors split
 * over the pool (each element on its own: the same bits). */
void blk_glu(const blk *b, float *gate, const float *up, size_t n);
/* RoPE: cs[0 .. d/2) = cos, cs[d/2 .. d) = sin of position pos (yarn amplitude included);
 * apply rotates one vector of hp->rope_dim values in place (interleaved or half pairs). */
void blk_rope_table(const hparams *hp, int pos, float *cs);
void blk_rope_apply(const hparams *hp, float *v, const float *cs);
/* AttnRes: out = sum_j softmax_j(u . v_j / rms(v_j)) v_j over sources src[0..n), n >= 1. */
void blk_attnres_mix(const blk *b, const float *const *src, int n, const float *u, int H, float *out);

/* exp, tanh, sigmoid and log1p are kmath.h's (not libm's: the same bits on every machine) */
static inline float blk_sigmoid(float x) { return km_sigmoidf(x); }

int blk_kda(const blk *b, const kda_w *w, layer_state *st, const float *x, int T, float *out);
/* Floats of the arena a KDA layer's short convolutions take (K taps, P channels), whatever T. */
static inline size_t blk_kda_conv_floats(int K, int P) { return (2 * (size_t)K + 1) * (size_t)P; }
/* The per-thread scratch floats a KDA head's recurrence takes (six vectors of kda_dim). */
static inline size_t blk_kda_scratch_floats(const hparams *hp) { return 6 * (size_t)hp->kda_dim; }
/* Floats one position of one KDA layer logs (4P + kda_heads). */
size_t blk_kda_log_floats(const hparams *hp);
/* Advances st (S and conv, in place: S_in and conv_in are ignored) over the first n positions of
 * a logged pass, exactly as the pass did for them: the same operations in the same order, from
 * the logged inputs, so no weight matrix is read. w supplies only the small vectors (conv taps,
 * gate constants). */
int blk_kda_replay(const blk *b, const kda_w *w, layer_state *st, const float *log, int n);
int blk_mla(const blk *b, const mla_w *w, layer_state *st, int pos0, const float *x, int T, float *out);
/* Query rows an attention work item (GQA, MLA) scores together, so that each run of cached rows
 * is read from memory once for all of them: at most BLK_ATT_ROWS, and at long contexts as many as
 * keep their scores (a float per position, each row padded to 16) within BLK_ATT_SCORES floats.
 * blk_att_score_floats bounds the scores' floats for any n <= context. No bit depends on these. */
enum { BLK_ATT_ROWS = 16, BLK_ATT_SCORES = 1 << 21 };
/* Cached rows an item's weighted sums read for all its rows before moving on: cache rows are KBs
 * apart (GQA's share L1 sets; K3's latent rows are 2.3 KB), and eight of them stay in L1 across
 * the item's rows. It divides BLK_KV_CHUNK, so a run never crosses a cache chunk. (The scores are
 * matmuls over a whole chunk, whose tiles keep their own rows in L1.) */
enum { BLK_ATT_KEYS = 8 };
_Static_assert(BLK_KV_CHUNK % BLK_ATT_KEYS == 0, "a run of cached rows stays in one cache chunk");
/* A work item's weighted sums over one run of cached rows from s0 (x: the run's first row, rows
 * ldx floats apart, len wide): row rho's output y + rho ldy takes the first min(n[rho] - s0,
 * BLK_ATT_KEYS) of them, weighted by its scores sc + rho ld + s0. Neighbouring rows that take as
 * many go to axpy_rows together, to share the loads of x. */
static inline int blk_att_run_keys(int n, int s0) { return n - s0 < BLK_ATT_KEYS ? n - s0 : BLK_ATT_KEYS; }
static inline void blk_att_sums(const kern_ops *k, float *y, size_t ldy, const float *sc, size_t ld, const int *n,
                                int R, int s0, const float *x, size_t ldx, int len)
{
    for (int rho = 0, c; rho < R; rho += c) {
        int m = blk_att_run_keys(n[rho], s0);
        for (c = 1; rho + c < R && blk_att_run_keys(n[rho + c], s0) == m; c++)
            ;
        if (m > 0)
            k->axpy_rows(y + (size_t)rho * ldy, ldy, sc + (size_t)rho * ld + s0, ld, c, x, ldx, m, len);
    }
}
static inline int blk_att_rows(int n)
{
    size_t r = BLK_ATT_SCORES / ((size_t)n + 16);
    return r < 1 ? 1 : r > BLK_ATT_ROWS ? BLK_ATT_ROWS : (int)r;
}
static inline size_t blk_att_score_floats(int context)
{
    size_t all = (size_t)BLK_ATT_ROWS * ((size_t)context + 16), one = (size_t)context + 16;
    size_t cap = one > BLK_ATT_SCORES ? one : BLK_ATT_SCORES;
    return all < cap ? all : cap;
}
/* An item's rows: at most `rows` (by the thread count) and blk_att_rows(n) (by the scratch). */
static inline int blk_att_item_rows(int rows, int n)
{
    int cap = blk_att_rows(n);
    rows = rows < cap ? rows : cap;
    return rows < 1 ? 1 : rows;
}
/* The per-thread scratch floats MLA's and GQA's work items take at a context of `context`
 * positions (their scores, their matmuls' kern_scratch_floats, their rows' vectors). */
size_t blk_mla_scratch_floats(const hparams *hp, int context);
size_t blk_gqa_scratch_floats(const hparams *hp, int context);
/* One head's absorbed MLA attention for one query (blk_mla.c): qh [nope + rope]; wk [nope][r] and
 * wv [v_head][r], the head's rows of kv_b_proj decoded; the n latent rows [r + rope] row(ud, s),
 * visited in order s = 0 .. n-1; out oh [v_head]. scratch: [2 r + n] floats. */
typedef const float *(*blk_row_fn)(const void *ud, int s);
void blk_mla_query(const kern_ops *k, const hparams *hp, float scale, const float *qh, const float *wk,
                   const float *wv, int n, blk_row_fn row, const void *ud, float *scratch, float *oh);
int blk_gqa(const blk *b, const gqa_w *w, layer_state *st, int pos0, const float *x, int T, float *out);
int blk_mlp(const blk *b, const mlp_w *w, int inter, const float *x, int T, float *out);
/* w: layer `layer`'s MoE weights (its routed experts come from b->xs when there is one) */
int blk_moe(const blk *b, int layer, const moe_w *w, const float *x, int T, float *out);
/* Router lookahead: prefetches (b->xs) the experts `layer`'s router (in w) picks for x [T][hidden];
 * a hint that changes no result. No-op without a weight source with prefetch, or for a dense layer. */
void blk_moe_guess(const blk *b, int layer, const moe_w *w, const float *x, int T);

#endif
