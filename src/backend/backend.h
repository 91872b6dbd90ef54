/* backend.h — the seam between a pass's layer loop (engine/pass.c) and the device that runs its
 * blocks: the embedding, norms, attention blocks, feed-forward blocks (dense or MoE), the AttnRes
 * mix, the residual adds and the head.
 *
 * A backend owns the memory its operations read and write: every float buffer the pass hands it
 * (the residual stream, the normed input, block outputs, the AttnRes stack) comes from the pass
 * arena, b->ar, which for a device backend is an arena over device memory; the layer states'
 * caches, recurrent state and commit log are the backend's too (mem_*). Through the seam only three
 * things cross to the host: the token ids going in (embed), the logits coming out (head) and the
 * taps a caller asked for (read); what a backend moves inside an operation is its own business
 * (the CUDA one brings a MoE layer's choices back to group them, and takes the RoPE rows up).
 *
 * Exactness: every backend computes every value in kern.h's reduction orders and with kmath.h's
 * element-wise functions, so that a pass's logits are the same bits on every backend (a backend
 * that cannot make an operation bit-equal says so in kern.h, with why). The CPU backend
 * (backend_cpu.c, the blk_* blocks over kern.h's tables) is the definition.
 *
 * Weights: each block takes its matrices from the layer_w it is given (the model's own, or a
 * weight store's streamed copy, b->xs); a device backend maps them onto its own copies, and keeps
 * the routed experts a store hands over in a cache of its own (backend_cfg.experts_streamed),
 * telling the store which it holds and handing back those it drops (weight_src.held, adopt).
 */
#ifndef DF_BACKEND_BACKEND_H
#define DF_BACKEND_BACKEND_H

#include <stdint.h>

#include "model/blk.h"

/* What a device backend is opened with. */
typedef struct backend_cfg {
    int index;            /* which device of the kind (--device cuda:N) */
    uint64_t vram_budget; /* bytes of device memory for weights (--vram-budget; 0: what the device
                             has free, less a reserve for sessions) */
    int experts_streamed; /* 1: the routed experts come through the weight source (b->xs) pass by
                             pass (a weight store): the backend copies everything else at open and
                             keeps the experts in a cache of what the budget leaves; 0: all at open */
} backend_cfg;

typedef struct backend_ops {
    const char *name; /* "cpu", "cuda" */
    /* A device's state for one model (its copies of the weights, its queues): opened with the
     * engine, passed to every operation as b->dev, closed with it. NULL open: none needed. */
    void *(*open)(const model *m, const backend_cfg *cfg, errbuf *err);
    void (*close)(void *dev);
    /* The memory a session's passes read and write (the pass arena's block, the attention caches):
     * bytes aligned to 64, NULL when out of memory. NULL mem_alloc: host memory (malloc). */
    void *(*mem_alloc)(void *dev, size_t bytes);
    void (*mem_free)(void *dev, void *p);
    /* copies between that memory and the host's, either way, and zeroes it (NULL: memcpy, memset) */
    void (*mem_copy)(void *dev, void *dst, const void *src, size_t bytes);
    void (*mem_zero)(void *dev, void *p, size_t bytes);
    /* h[t][:] = the embedding row of tokens[t] (host ids), t < T */
    void (*embed)(const blk *b, const int32_t *tokens, int T, float *h);
    /* y[t] = rmsnorm(x[t]) * w, t < T, rows of n (blk_rmsnorm); y may alias x */
    void (*rmsnorm)(const blk *b, const float *x, const float *w, int T, int n, float eps, float *y);
    /* layer i's attention block (its kind from hp->attn_kind[i]) over x [T][H] into out [T][H],
     * reading and extending st (positions pos0 .. pos0+T-1) */
    int (*attn)(const blk *b, int i, const layer_w *L, layer_state *st, int pos0, const float *x, int T, float *out);
    /* layer i's feed-forward block (dense MLP or MoE) over x [T][H] into out [T][H] */
    int (*ffn)(const blk *b, int i, const layer_w *L, const float *x, int T, float *out);
    /* AttnRes: out[t] = mix(stack[0..ns)[t], prefix[t]) with score vector u, t < T */
    void (*mix)(const blk *b, float *const *stack, int ns, const float *prefix, const float *u, int T, float *out);
    /* y[j] += a[j], j < n (the residual adds: element-wise, one rounding each) */
    void (*add)(const blk *b, float *y, const float *a, size_t n);
    /* dst[j] = src[j], j < n, both the backend's buffers */
    void (*copy)(const blk *b, float *dst, const float *src, size_t n);
    /* host[t * vocab + v] = lm_head[v] . x[t], t < T: the logits, into host memory; -1 (b->err)
     * when the device failed anywhere in the pass (a device backend reports its errors here, where
     * the pass waits for it) */
    int (*head)(const blk *b, const kmat *lm_head, const float *x, int T, float *host);
    /* host[j] = buf[j], j < n (taps) */
    void (*read)(const blk *b, float *host, const float *buf, size_t n);
    /* blk_kda_replay: advances KDA layer i's state st (S and conv, in place) over the first n
     * positions of a pass from its log (a commit keeping part of a pass) */
    int (*replay)(const blk *b, int i, const kda_w *w, layer_state *st, const float *log, int n);
    /* router lookahead for layer i from a stand-in of its FFN input x [T][H] (blk_moe_guess):
     * starts reads, decides nothing; NULL: none */
    void (*guess)(const blk *b, int i, const layer_w *L, const float *x, int T);
} backend_ops;

extern const backend_ops backend_cpu;
/* In a build with CUDA (make CUDA=1): src/backend/cuda/backend_cuda.c. */
extern const backend_ops backend_cuda;

/* The backend named by `device` ("cpu"; "cuda" or "cuda:N" in a build with CUDA), *index the
 * device's number (N, else 0); NULL with err set when this build has none such. */
const backend_ops *backend_select(const char *device, int *index, errbuf *err);

#endif
