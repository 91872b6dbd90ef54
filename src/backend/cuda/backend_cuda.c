/* backend_cuda.c — the CUDA backend (backend.h): a pass's blocks on the GPU, with the CPU's bits.
 *
 * What runs here so far: models whose attention is GQA or MLA, with dense gated MLPs or MoE
 * (routed, latent and shared experts), a plain residual stream or Block AttnRes (Qwen3, Qwen3-MoE,
 * DeepSeek-V3, Kimi K2 and K2.5), and KDA (Kimi-Linear, K3) with its commit log replayed on the
 * GPU, every weight format, all of it on the GPU but the RoPE table (computed on the host by
 * blk_rope_table, the CPU's own code, and copied up through a pinned ring that never waits for
 * the GPU: up_take) and the grouping of a MoE layer's choices by expert (the router runs on the
 * GPU; its choices come back while the shared experts run, and a layer's experts then go in a few
 * grouped launches). Session files are refused by session_file.c.
 *
 * Memory. open() copies every tensor range the model bound, and every small vector a block reads,
 * to the device once (cuda_dev.sp, sorted by host address); a block translates a kmat or a vector
 * by looking its host address up there. With a weight store (every spine resident in RAM: engine.c
 * refuses one that streams spines) the routed experts are left out: those a layer needs that are
 * not in a least-recently-used cache of device slots (sized by --vram-budget) come through the
 * store, copied on a stream of their own from its registered slot memory while the GPU computes
 * (moe_streamed), and the router lookahead (cuda_guess) starts the store's reads a layer ahead.
 * The two caches hold different experts: the store is told which experts VRAM holds (its RAM copies
 * of those make room first), and an expert VRAM drops is copied back into the store's RAM
 * (slot_give_back) instead of being read from the drive again.
 * The session's pass arena, caches, recurrent state and commit log are device memory (mem_alloc).
 * The host buffers here and the device buffers beyond the arena grow only when a pass needs more
 * than any before, so a decode step allocates nothing.
 *
 * Exactness: matmuls, norms, activations and attention are cuda_kern.h's and cuda_blk.h's, each
 * the CPU code's operations in its order; tests/cuda/test_cuda.c compares whole passes' logits with
 * the CPU backend's with memcmp.
 */
#include <assert.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_blk.h"
#include "backend/cuda/cuda_kern.h"
#include "model/moe_route.h"

typedef struct dev_span {
    const uint8_t *h; /* host bytes [len] */
    size_t len;
    uint8_t *d;       /* their device copy */
} dev_span;

typedef struct cuda_dev {
    int index;    /* the GPU (cudaSetDevice), made current by every entry that runs or allocates */
    dev_span *sp; /* [n], sorted by h, disjoint */
    int n, cap;
    size_t bytes;
    float *sc;    /* device: [sc_cap] attention scores */
    size_t sc_cap;
    float *wkv;   /* device: [wkv_cap] an MLA layer's kv_b, decoded */
    size_t wkv_cap;
    /* device buffers a pass needs beyond what the CPU's blocks take from the pass arena (whose
     * size pass_floats counts): the RoPE rows, the cache's chunk pointers, the router's scratch,
     * the logits before they go to the host */
    float *cs_dev, *chunks_dev, *route_dev, *lg_dev;
    size_t cs_dev_cap, chunks_dev_cap, route_dev_cap, lg_dev_cap;
    /* streamed experts (backend_cfg.experts_streamed): a cache of nslot device slots of slot_bytes,
     * slot_of[layer * n_experts + e] the slot holding (layer, e) or -1 */
    int nslot, n_experts;
    size_t slot_bytes;
    uint8_t *slots;
    struct xslot {
        int key;        /* layer * n_experts + expert, -1: empty */
        uint64_t used;  /* the tick of its last use (least recently used goes first) */
        mlp_w mats;     /* its matrices, device pointers */
        cudaEvent_t filled; /* on cp: its latest fill has landed (the pass stream waits for it) */
        cudaEvent_t done;   /* on the pass stream: the kernels that read it have run (a refill waits) */
        int queued;     /* 1: read by the MoE layer's group not yet launched (moe_flush) */
    } *xs;
    int *slot_of;
    uint64_t tick, hits, misses;
    cudaStream_t cp;  /* the fills' stream (non-blocking: it runs beside the pass's) */
    void *reg;        /* the weight source's host range, registered (pinned) for asynchronous fills */
    const void *reg_ctx; /* the source it belongs to */
    /* the experts next() handed over whose fills are still in flight: (id, slot), given back to
     * the source once the fill has landed */
    int *pend_id, *pend_slot, npend;
    float *moe_dev;   /* device: [moe_dev_cap] a MoE layer's gathered inputs, gate, up and outputs */
    size_t moe_dev_cap;
    int *guess;       /* host: [guess_cap] the router lookahead's choices */
    size_t guess_cap;
    int *sel;     /* host, pinned: [2 * moe_cap + 3 * n_experts + 1] a MoE layer's choices, its order, its
                     union (moe_route.h's moe_group), the union's VRAM misses and its starts */
    size_t moe_cap;
    cudaEvent_t sel_ready; /* the choices' copy into sel has landed */
    /* host, pinned: [up_cap] a ring of what a pass uploads (RoPE rows, cache chunk pointers, a MoE
     * layer's order), copied asynchronously (up_take); up_done[h]: the copies from half h queued
     * before the ring last left it have run, so that it may be written again */
    uint8_t *up;
    size_t up_cap, up_at;
    cudaEvent_t up_done[2];
    int up_rec[2]; /* 1: up_done[h] was recorded */
    int up_h;      /* the half being written, from offset up_at */
} cuda_dev;

static int cu_err(errbuf *err, const char *what, cudaError_t e)
{
    return errbuf_set(err, "--device cuda: %s: %s", what, cudaGetErrorString(e));
}

/* records host range [h, h + len) for upload (duplicates and ranges inside another are merged
 * at upload) */
static int span_add(cuda_dev *d, const void *h, size_t len, errbuf *err)
{
    if (!h || !len)
        return 0;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 256;
        dev_span *sp = realloc(d->sp, sizeof *sp * (size_t)cap);
        if (!sp)
            return errbuf_set(err, "--device cuda: out of memory");
        d->sp = sp;
        d->cap = cap;
    }
    d->sp[d->n++] = (dev_span){.h = h, .len = len};
    return 0;
}

static int span_cmp(const void *a, const void *b)
{
    const dev_span *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h ? 1 : (x->len > y->len ? -1 : x->len < y->len);
}

/* sorts, merges overlapping ranges and copies each to the device */
static int span_upload(cuda_dev *d, errbuf *err)
{
    qsort(d->sp, (size_t)d->n, sizeof *d->sp, span_cmp);
    int k = 0;
    for (int i = 0; i < d->n; i++) {
        if (k > 0 && d->sp[i].h < d->sp[k - 1].h + d->sp[k - 1].len) {
            const uint8_t *end = d->sp[i].h + d->sp[i].len, *kend = d->sp[k - 1].h + d->sp[k - 1].len;
            if (end > kend)
                d->sp[k - 1].len = (size_t)(end - d->sp[k - 1].h);
            continue;
        }
        d->sp[k++] = d->sp[i];
    }
    d->n = k;
    for (int i = 0; i < d->n; i++) {
        dev_span *s = &d->sp[i];
        cudaError_t e = cudaMalloc((void **)&s->d, s->len);
        if (e != cudaSuccess)
            return cu_err(err, "the weights do not fit the device", e);
        e = cudaMemcpy(s->d, s->h, s->len, cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            return cu_err(err, "copying the weights", e);
        d->bytes += s->len;
    }
    return 0;
}

/* Room for `bytes` in the pinned upload ring (up_send then copies it up). The ring's two halves
 * alternate: before the host writes a half again it waits for the copies queued from it before it
 * was left: at decode (a few KB a pass) many passes ago, in a long prompt's pass some layers
 * earlier, the layers since still queued. So a pass's uploads do not drain the GPU, as a
 * cudaMemcpy from pageable memory does: it waits for every kernel queued before it, and the GPU
 * then idles while the host queues the next ones. NULL with err set if the ring cannot grow. */
static void *up_take(cuda_dev *d, size_t bytes, errbuf *err)
{
    size_t need = (bytes + 255) & ~(size_t)255; /* each upload 256-byte aligned */
    cudaError_t e;
    if (2 * need > d->up_cap) { /* larger than any before: a new ring, once the old one's copies ran */
        size_t cap = d->up_cap ? 2 * d->up_cap : (size_t)1 << 20;
        while (2 * need > cap)
            cap *= 2;
        if ((e = cudaStreamSynchronize(NULL)) != cudaSuccess) {
            cu_err(err, "the upload ring", e);
            return NULL;
        }
        cudaFreeHost(d->up);
        d->up = NULL;
        d->up_cap = d->up_at = 0;
        d->up_h = d->up_rec[0] = d->up_rec[1] = 0;
        if ((e = cudaHostAlloc((void **)&d->up, cap, cudaHostAllocDefault)) != cudaSuccess) {
            cu_err(err, "the upload ring", e);
            return NULL;
        }
        d->up_cap = cap;
    }
    size_t half = d->up_cap / 2;
    if (d->up_at + need > half) {
        cudaEventRecord(d->up_done[d->up_h], NULL);
        d->up_rec[d->up_h] = 1;
        d->up_h ^= 1;
        d->up_at = 0;
        if (d->up_rec[d->up_h] && (e = cudaEventSynchronize(d->up_done[d->up_h])) != cudaSuccess) {
            cu_err(err, "the upload ring", e);
            return NULL;
        }
    }
    uint8_t *p = d->up + (size_t)d->up_h * half + d->up_at;
    d->up_at += need;
    assert(d->up_at <= half);
    return p;
}

/* copies what up_take gave (p, bytes) to device address dst, in order with the pass's kernels */
static int up_send(void *dst, const void *p, size_t bytes, errbuf *err)
{
    cudaError_t e = cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, NULL);
    return e == cudaSuccess ? 0 : cu_err(err, "an upload", e);
}

/* up_take and up_send of host bytes src */
static int up_copy(cuda_dev *d, void *dst, const void *src, size_t bytes, errbuf *err)
{
    void *p = up_take(d, bytes, err);
    if (!p)
        return -1;
    memcpy(p, src, bytes);
    return up_send(dst, p, bytes, err);
}

/* the device address of host address p, which open() uploaded */
static const void *dev_ptr(const cuda_dev *d, const void *p)
{
    if (!p)
        return NULL;
    const uint8_t *h = p;
    int lo = 0, hi = d->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const dev_span *s = &d->sp[mid];
        if (h < s->h)
            hi = mid - 1;
        else if (h >= s->h + s->len)
            lo = mid + 1;
        else
            return s->d + (h - s->h);
    }
    return NULL; /* not uploaded: open() missed a weight (caught by the tests as a CUDA error) */
}

static kmat dev_mat(const cuda_dev *d, const kmat *w)
{
    kmat m = *w;
    m.data = dev_ptr(d, w->data);
    m.scale = dev_ptr(d, w->scale);
    return m;
}

static const float *dev_vec(const blk *b, const float *v) { return dev_ptr(b->dev, v); }

static void cu_matmul(const blk *b, const kmat *w, const float *x, int T, float *y)
{
    kmat m = dev_mat(b->dev, w);
    cudak_matmul(&m, 0, w->rows, x, (size_t)w->cols, T, y, (size_t)w->rows, NULL);
}

/* Products that read nothing another writes, y[i] = w[i] x[i], in one cudak_matmul_set: at decode a
 * projection of a few thousand rows leaves most of the GPU idle, and a block's projections of one
 * input together fill it (the same bits as one cu_matmul each). w[i] may be NULL: skipped. */
enum { MM_N = 6 };
static void cu_matmul_n(const blk *b, int n, const kmat *const w[], const float *const x[], int T, float *const y[])
{
    cudak_mm mm[MM_N];
    int k = 0;
    assert(n <= MM_N);
    for (int i = 0; i < n; i++)
        if (w[i])
            mm[k++] = (cudak_mm){.w = dev_mat(b->dev, w[i]), .x = x[i], .ldx = (size_t)w[i]->cols, .y = y[i],
                                 .ldy = (size_t)w[i]->rows, .r0 = 0, .r1 = w[i]->rows, .T = T};
    cudak_matmul_set(mm, k, NULL);
}

static int mat_add(cuda_dev *d, const kmat *w, errbuf *err)
{
    if (!w->data)
        return 0;
    return span_add(d, w->data, wfmt_data_bytes(w->fmt, w->rows, w->cols), err) ||
           span_add(d, w->scale, wfmt_scale_bytes(w->fmt, w->rows, w->cols), err);
}

static void cuda_close(void *p)
{
    cuda_dev *d = p;
    if (!d)
        return;
    cudaSetDevice(d->index);
    for (int i = 0; i < d->n; i++)
        cudaFree(d->sp[i].d);
    cudaFree(d->sc);
    cudaFree(d->wkv);
    cudaFree(d->cs_dev);
    cudaFree(d->chunks_dev);
    cudaFree(d->route_dev);
    cudaFree(d->lg_dev);
    cudaFree(d->slots);
    cudaFree(d->moe_dev);
    for (int k = 0; d->xs && k < d->nslot; k++) {
        if (d->xs[k].filled)
            cudaEventDestroy(d->xs[k].filled);
        if (d->xs[k].done)
            cudaEventDestroy(d->xs[k].done);
    }
    if (d->cp)
        cudaStreamDestroy(d->cp);
    if (d->reg)
        cudaHostUnregister(d->reg);
    free(d->guess);
    free(d->pend_id);
    free(d->pend_slot);
    free(d->xs);
    free(d->slot_of);
    cudaFreeHost(d->sel);
    cudaFreeHost(d->up);
    for (int h = 0; h < 2; h++)
        if (d->up_done[h])
            cudaEventDestroy(d->up_done[h]);
    if (d->sel_ready)
        cudaEventDestroy(d->sel_ready);
    free(d->sp);
    free(d);
}

static int mlp_add(cuda_dev *d, const mlp_w *w, errbuf *err)
{
    return mat_add(d, &w->gate, err) || mat_add(d, &w->up, err) || mat_add(d, &w->down, err);
}

/* a layer's feed-forward weights: the dense MLP, or the MoE's router, latent projections, experts and
 * shared experts */
static int ffn_add(cuda_dev *d, const hparams *hp, int i, const layer_w *L, int streamed, errbuf *err)
{
    if (hp->ffn_kind[i] == FFN_DENSE)
        return mlp_add(d, &L->mlp, err);
    const moe_w *w = &L->moe;
    size_t E = (size_t)hp->n_experts;
    int bad = mat_add(d, &w->router, err) || span_add(d, w->bias, E * sizeof(float), err) ||
              mat_add(d, &w->lat_down, err) || mat_add(d, &w->lat_up, err) ||
              span_add(d, w->lat_norm, (size_t)hp->latent * sizeof(float), err) ||
              (hp->n_shared > 0 && mlp_add(d, &w->shared, err));
    for (size_t e = 0; e < E && !bad && !streamed; e++)
        bad = mlp_add(d, &w->experts[e], err);
    return bad;
}

static int kda_add(cuda_dev *d, const hparams *hp, const kda_w *w, errbuf *err)
{
    size_t P = (size_t)hp->kda_heads * hp->kda_dim, F = sizeof(float);
    int bad = mat_add(d, &w->q, err) || mat_add(d, &w->k, err) || mat_add(d, &w->v, err) ||
              mat_add(d, &w->f_a, err) || mat_add(d, &w->f_b, err) || mat_add(d, &w->b, err) ||
              mat_add(d, &w->g, err) || mat_add(d, &w->g_a, err) || mat_add(d, &w->g_b, err) ||
              mat_add(d, &w->o, err) || span_add(d, w->A, (size_t)hp->kda_heads * F, err) ||
              span_add(d, w->dt_bias, P * F, err) || span_add(d, w->o_norm, (size_t)hp->kda_dim * F, err);
    for (int i = 0; i < 3 && !bad; i++)
        bad = span_add(d, w->conv[i], P * (size_t)hp->conv_k * F, err);
    return bad;
}

/* device bytes of a matrix's data and its scales, each rounded up to 256 (an expert slot's parts) */
static size_t mat_dev_bytes(const kmat *w)
{
    size_t a = (wfmt_data_bytes(w->fmt, w->rows, w->cols) + 255) & ~(size_t)255;
    return a + ((wfmt_scale_bytes(w->fmt, w->rows, w->cols) + 255) & ~(size_t)255);
}

/* The VRAM expert cache: what the budget leaves after the spine (by default the device's free
 * memory less a quarter of it, kept for sessions), in slots of the largest expert. */
static int slots_init(cuda_dev *d, const model *m, uint64_t budget, errbuf *err)
{
    const hparams *hp = &m->hp;
    d->n_experts = hp->n_experts;
    for (int i = 0; i < hp->n_layers; i++)
        if (hp->ffn_kind[i] == FFN_MOE)
            for (int e = 0; e < hp->n_experts; e++) {
                const mlp_w *x = &m->L[i].moe.experts[e];
                size_t b = mat_dev_bytes(&x->gate) + mat_dev_bytes(&x->up) + mat_dev_bytes(&x->down);
                d->slot_bytes = b > d->slot_bytes ? b : d->slot_bytes;
            }
    if (d->slot_bytes == 0)
        return 0; /* no MoE layer: nothing streams */
    size_t free_b = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total);
    if (e != cudaSuccess)
        return cu_err(err, "reading the device's free memory", e);
    uint64_t room = budget ? (budget > d->bytes ? budget - d->bytes : 0) : free_b - free_b / 4;
    if (room > free_b)
        room = free_b;
    uint64_t want = (uint64_t)hp->n_layers * hp->n_experts, n = room / d->slot_bytes;
    if (n > want)
        n = want;
    if (n < 2)
        return errbuf_set(err, "--device cuda: --vram-budget leaves room for %llu experts after the %llu MB spine; "
                               "it needs at least 2 (%llu MB each)",
                          (unsigned long long)n, (unsigned long long)(d->bytes >> 20),
                          (unsigned long long)(d->slot_bytes >> 20));
    d->nslot = (int)n;
    d->xs = calloc((size_t)n, sizeof *d->xs);
    d->slot_of = malloc(sizeof(int) * (size_t)want);
    if (!d->xs || !d->slot_of)
        return errbuf_set(err, "--device cuda: out of memory");
    for (uint64_t k = 0; k < want; k++)
        d->slot_of[k] = -1;
    for (int k = 0; k < d->nslot; k++)
        d->xs[k].key = -1;
    d->pend_id = malloc(sizeof(int) * (size_t)hp->n_experts);
    d->pend_slot = malloc(sizeof(int) * (size_t)hp->n_experts);
    if (!d->pend_id || !d->pend_slot)
        return errbuf_set(err, "--device cuda: out of memory");
    if ((e = cudaMalloc((void **)&d->slots, (size_t)n * d->slot_bytes)) != cudaSuccess)
        return cu_err(err, "the expert cache", e);
    if ((e = cudaStreamCreateWithFlags(&d->cp, cudaStreamNonBlocking)) != cudaSuccess)
        return cu_err(err, "the expert copies' stream", e);
    for (int k = 0; k < d->nslot; k++)
        if ((e = cudaEventCreateWithFlags(&d->xs[k].filled, cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&d->xs[k].done, cudaEventDisableTiming)) != cudaSuccess)
            return cu_err(err, "the expert cache's events", e);
    return 0;
}

/* copies host matrix w to the device at *at on stream st, advancing *at; the device view */
static kmat mat_put_async(const kmat *w, uint8_t **at, cudaStream_t st)
{
    kmat m = *w;
    size_t db = wfmt_data_bytes(w->fmt, w->rows, w->cols), sb = wfmt_scale_bytes(w->fmt, w->rows, w->cols);
    cudaMemcpyAsync(*at, w->data, db, cudaMemcpyHostToDevice, st);
    m.data = *at;
    *at += (db + 255) & ~(size_t)255;
    if (sb) {
        cudaMemcpyAsync(*at, w->scale, sb, cudaMemcpyHostToDevice, st);
        m.scale = *at;
        *at += (sb + 255) & ~(size_t)255;
    }
    return m;
}

/* the VRAM slot holding expert (layer, e), or -1; a hit counts as a use */
static int slot_find(cuda_dev *d, int layer, int e)
{
    int k = d->slot_of[layer * d->n_experts + e];
    if (k >= 0) {
        d->hits++;
        d->xs[k].used = ++d->tick;
    }
    return k;
}

/* Gives back to the source the first n experts whose fills are in flight, once they have landed
 * (their host bytes may then be reused). */
static void pend_release(cuda_dev *d, const blk *b, int layer, int n)
{
    assert(n >= 0 && n <= d->npend);
    for (int i = 0; i < n; i++) {
        cudaEventSynchronize(d->xs[d->pend_slot[i]].filled);
        b->xs->release(b->xs->ctx, layer, d->pend_id[i]);
    }
    memmove(d->pend_id, d->pend_id + n, sizeof(int) * (size_t)(d->npend - n));
    memmove(d->pend_slot, d->pend_slot + n, sizeof(int) * (size_t)(d->npend - n));
    d->npend -= n;
}
void backend_cuda_stats(const void *dev, uint64_t *hits, uint64_t *misses, int *slots, int *pinned)
{
    const cuda_dev *d = dev;
    *hits = d->hits;
    *misses = d->misses;
    *slots = d->nslot;
    *pinned = d->reg != NULL;
}

static void *cuda_open(const model *m, const backend_cfg *cfg, errbuf *err)
{
    int index = cfg->index;
    const hparams *hp = &m->hp;
    for (int i = 0; i < hp->n_layers; i++)
        if (hp->attn_kind[i] == ATTN_KDA && (hp->kda_dim > 256 || hp->conv_k > 16)) {
            errbuf_set(err, "--device cuda: %s: KDA heads of %d (conv %d) are wider than the GPU's kernel takes "
                            "(256, 16)",
                       m->dir, hp->kda_dim, hp->conv_k);
            return NULL;
        }
    if (hp->kv_lora_rank > 1024) {
        errbuf_set(err, "--device cuda: %s: an MLA latent of %d is wider than the GPU's kernel takes (1024)", m->dir,
                   hp->kv_lora_rank);
        return NULL;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        errbuf_set(err, "--device cuda: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return NULL;
    }
    if (index >= ndev || (e = cudaSetDevice(index)) != cudaSuccess) {
        errbuf_set(err, "--device cuda:%d: this machine has %d CUDA device%s", index, ndev, ndev == 1 ? "" : "s");
        return NULL;
    }
    cuda_dev *d = calloc(1, sizeof *d);
    if (!d) {
        errbuf_set(err, "--device cuda: out of memory");
        return NULL;
    }
    d->index = index;
    if ((e = cudaEventCreateWithFlags(&d->sel_ready, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->up_done[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->up_done[1], cudaEventDisableTiming)) != cudaSuccess) {
        cu_err(err, "events", e);
        cuda_close(d);
        return NULL;
    }
    size_t H = (size_t)hp->hidden, hd = (size_t)hp->head_dim;
    int bad = mat_add(d, &m->embed, err) || mat_add(d, &m->lm_head, err) ||
              span_add(d, m->final_norm, H * sizeof(float), err) || span_add(d, m->out_res_u, H * sizeof(float), err);
    for (int i = 0; i < hp->n_layers && !bad; i++) {
        const layer_w *L = &m->L[i];
        bad = span_add(d, L->in_norm, H * sizeof(float), err) || span_add(d, L->post_norm, H * sizeof(float), err) ||
              span_add(d, L->res_u[0], H * sizeof(float), err) || span_add(d, L->res_u[1], H * sizeof(float), err) ||
              mat_add(d, &L->gqa.q, err) || mat_add(d, &L->gqa.k, err) || mat_add(d, &L->gqa.v, err) ||
              mat_add(d, &L->gqa.o, err) || span_add(d, L->gqa.q_norm, hd * sizeof(float), err) ||
              span_add(d, L->gqa.k_norm, hd * sizeof(float), err) || mat_add(d, &L->mla.q, err) ||
              mat_add(d, &L->mla.q_a, err) || mat_add(d, &L->mla.q_b, err) ||
              span_add(d, L->mla.q_a_norm, (size_t)hp->q_lora_rank * sizeof(float), err) ||
              mat_add(d, &L->mla.kv_a, err) ||
              span_add(d, L->mla.kv_a_norm, (size_t)hp->kv_lora_rank * sizeof(float), err) ||
              mat_add(d, &L->mla.kv_b, err) || mat_add(d, &L->mla.g, err) || mat_add(d, &L->mla.o, err) ||
              kda_add(d, hp, &L->kda, err) || ffn_add(d, hp, i, L, cfg->experts_streamed, err);
    }
    if (bad || span_upload(d, err) != 0 || (cfg->experts_streamed && slots_init(d, m, cfg->vram_budget, err))) {
        cuda_close(d);
        return NULL;
    }
    return d;
}

/* the engine's GPU, current on this thread (a server's threads take turns with one engine) */
static void dev_use(const cuda_dev *d) { cudaSetDevice(d->index); }

static void *cuda_mem_alloc(void *dev, size_t bytes)
{
    dev_use(dev);
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void cuda_mem_free(void *dev, void *p)
{
    dev_use(dev);
    cudaFree(p);
}

static void cuda_mem_copy(void *dev, void *dst, const void *src, size_t bytes)
{
    dev_use(dev);
    cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); /* either way: unified addressing tells */
}

static void cuda_mem_zero(void *dev, void *p, size_t bytes)
{
    dev_use(dev);
    cudaMemset(p, 0, bytes);
}

static void cuda_embed(const blk *b, const int32_t *tokens, int T, float *h)
{
    dev_use(b->dev); /* a pass's first entry: the rest of it runs on this thread */
    kmat m = dev_mat(b->dev, &b->m->embed);
    int H = b->hp->hidden;
    for (int t = 0; t < T; t++)
        cudak_decode_rows(&m, tokens[t], tokens[t] + 1, h + (size_t)t * H, NULL);
}

static void cuda_rmsnorm(const blk *b, const float *x, const float *w, int T, int n, float eps, float *y)
{
    cudab_rmsnorm(x, dev_vec(b, w), T, n, (size_t)n, eps, y, NULL);
}

/* a device buffer of at least `need` floats in *p (*cap now), grown only when a pass needs more
 * than any before; what it held is not kept */
static int dev_grow(float **p, size_t *cap, size_t need, const char *what, errbuf *err)
{
    if (need <= *cap)
        return 0;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc((void **)p, need * sizeof(float));
    if (e != cudaSuccess)
        return cu_err(err, what, e);
    *cap = need;
    return 0;
}

/* What an attention block's kernels need besides its buffers, on the device: the RoPE rows of
 * positions pos0 .. pos0+T-1 (*cs, from blk_rope_table), the cache's chunk pointers (*chunks), and
 * room for T x heads x (pos0 + T) scores (d->sc). The host-side and score buffers grow only for a
 * pass longer than any before. */
static int attn_tables(const blk *b, layer_state *st, int pos0, int T, int heads, float **cs, float ***chunks)
{
    const hparams *hp = b->hp;
    cuda_dev *d = b->dev;
    int rd = hp->rope_dim > 0 ? hp->rope_dim : 1, n = pos0 + T, nchunks = (n + BLK_KV_CHUNK - 1) / BLK_KV_CHUNK;
    size_t need_cs = (size_t)T * rd, need_sc = (size_t)T * heads * n;
    if (dev_grow(&d->cs_dev, &d->cs_dev_cap, need_cs, "RoPE rows", b->err) ||
        dev_grow(&d->chunks_dev, &d->chunks_dev_cap, (size_t)nchunks * sizeof(float *) / sizeof(float) + 1,
                 "cache chunk pointers", b->err))
        return -1;
    *cs = d->cs_dev;
    *chunks = (float **)d->chunks_dev;
    if (dev_grow(&d->sc, &d->sc_cap, need_sc, "attention scores", b->err))
        return -1;
    if (hp->rope != ROPE_NONE) {
        float *h = up_take(d, need_cs * sizeof(float), b->err);
        if (!h)
            return -1;
        for (int t = 0; t < T; t++)
            blk_rope_table(hp, pos0 + t, h + (size_t)t * rd);
        if (up_send(*cs, h, need_cs * sizeof(float), b->err))
            return -1;
    }
    return up_copy(d, *chunks, st->kv, (size_t)nchunks * sizeof(float *), b->err);
}

/* blk_gqa's steps, in its order */
static int cuda_gqa(const blk *b, const gqa_w *w, layer_state *st, int pos0, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    cuda_dev *d = b->dev;
    int hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads, rd = hp->rope_dim;
    float *q = blk_alloc(b, (size_t)T * nh * hd), *k = blk_alloc(b, (size_t)T * nkv * hd);
    float *v = blk_alloc(b, (size_t)T * nkv * hd), *o = blk_alloc(b, (size_t)T * nh * hd), *cs;
    float **chunks;
    if (!q || !k || !v || !o || attn_tables(b, st, pos0, T, nh, &cs, &chunks))
        return -1;
    const kmat *pw[3] = {&w->q, &w->k, &w->v};
    const float *px[3] = {x, x, x};
    float *py[3] = {q, k, v};
    cu_matmul_n(b, 3, pw, px, T, py);
    if (w->q_norm) {
        cudab_rmsnorm(q, dev_vec(b, w->q_norm), T * nh, hd, (size_t)hd, hp->rms_eps, q, NULL);
        cudab_rmsnorm(k, dev_vec(b, w->k_norm), T * nkv, hd, (size_t)hd, hp->rms_eps, k, NULL);
    }
    int inter = hp->rope == ROPE_INTERLEAVED;
    cudab_rope(q, T, nh, hd, 0, rd, inter, cs, NULL);
    cudab_rope(k, T, nkv, hd, 0, rd, inter, cs, NULL);
    cudab_gqa_store(chunks, pos0, T, k, v, nkv, hd, NULL);
    cudab_gqa_attend(q, chunks, pos0, T, nh, nkv, hd, hp->attn_scale, d->sc, o, NULL);
    cu_matmul(b, &w->o, o, T, out);
    return 0;
}

/* blk_mla's steps, in its order; each head's rows of kv_b are decoded once per pass for all heads
 * (d->wkv), as the CPU decodes them per head */
static int cuda_mla(const blk *b, const mla_w *w, layer_state *st, int pos0, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    cuda_dev *d = b->dev;
    int nh = hp->n_heads, nope = hp->qk_nope, rope = hp->qk_rope, qd = nope + rope, r = hp->kv_lora_rank;
    int W = r + rope, vd = hp->v_head, ov = nh * vd;
    float *q = blk_alloc(b, (size_t)T * nh * qd), *kv = blk_alloc(b, (size_t)T * W), *o = blk_alloc(b, (size_t)T * ov);
    float *cs, **chunks;
    if (!q || !kv || !o || attn_tables(b, st, pos0, T, nh, &cs, &chunks))
        return -1;
    if (dev_grow(&d->wkv, &d->wkv_cap, (size_t)w->kv_b.rows * w->kv_b.cols, "MLA's decoded kv_b", b->err))
        return -1;
    float *cq = hp->q_lora_rank > 0 ? blk_alloc(b, (size_t)T * hp->q_lora_rank) : NULL;
    float *g = hp->mla_out_gate ? blk_alloc(b, (size_t)T * ov) : NULL;
    if ((hp->q_lora_rank > 0 && !cq) || (hp->mla_out_gate && !g))
        return -1;
    /* the products of x (the output gate's too, which blk_mla computes later: none reads another) */
    const kmat *pw[3] = {hp->q_lora_rank > 0 ? &w->q_a : &w->q, &w->kv_a, g ? &w->g : NULL};
    const float *px[3] = {x, x, x};
    float *py[3] = {cq ? cq : q, kv, g};
    cu_matmul_n(b, 3, pw, px, T, py);
    if (cq) {
        cudab_rmsnorm(cq, dev_vec(b, w->q_a_norm), T, hp->q_lora_rank, (size_t)hp->q_lora_rank, hp->mla_norm_eps, cq,
                      NULL);
        cu_matmul(b, &w->q_b, cq, T, q);
    }
    cudab_rmsnorm(kv, dev_vec(b, w->kv_a_norm), T, r, (size_t)W, hp->mla_norm_eps, kv, NULL);
    if (hp->rope != ROPE_NONE) {
        int inter = hp->rope == ROPE_INTERLEAVED;
        cudab_rope(kv, T, 1, W, r, hp->rope_dim, inter, cs, NULL);
        cudab_rope(q, T, nh, qd, nope, hp->rope_dim, inter, cs, NULL);
    }
    cudab_cache_store(chunks, pos0, T, kv, W, NULL);
    kmat kvb = dev_mat(d, &w->kv_b);
    cudak_decode_rows(&kvb, 0, w->kv_b.rows, d->wkv, NULL);
    cudab_mla_attend(q, d->wkv, chunks, pos0, T, nh, nope, rope, r, vd, hp->attn_scale, d->sc, o, NULL);
    if (g)
        cudab_gate(o, g, (size_t)T * ov, NULL);
    cu_matmul(b, &w->o, o, T, out);
    return 0;
}

/* the three short convolutions and every head's recurrence (blk_kda.c's kda_recur) */
static void kda_recur(const blk *b, const kda_w *w, const layer_state *st, float *q, float *k, float *v,
                      const float *f, const float *beta, const float *gate, float *o, int T)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim, K = hp->conv_k;
    float *proj[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        cudab_short_conv(dev_vec(b, w->conv[i]), K, P, st->conv_in + (size_t)i * (K - 1) * P,
                         st->conv + (size_t)i * (K - 1) * P, proj[i], T, NULL);
    cudab_kda_heads(hp, st->S_in, st->S, q, k, v, f, beta, gate, dev_vec(b, w->A), dev_vec(b, w->dt_bias),
                    dev_vec(b, w->o_norm), o, T, NULL);
}

/* the pass's recurrence inputs into (to_log) or out of the commit log: rows of
 * blk_kda_log_floats, raw q, k, v, f [P] then beta [heads] */
static void kda_log_copy(const hparams *hp, float *log, float *const part[5], int T, int to_log)
{
    size_t L = blk_kda_log_floats(hp), P = (size_t)hp->kda_heads * hp->kda_dim, F = sizeof(float);
    for (int j = 0; j < 5; j++) {
        size_t w = j < 4 ? P : (size_t)hp->kda_heads;
        float *lg = log + (size_t)j * P;
        if (to_log)
            cudaMemcpy2DAsync(lg, L * F, part[j], w * F, w * F, (size_t)T, cudaMemcpyDeviceToDevice, NULL);
        else
            cudaMemcpy2DAsync(part[j], w * F, lg, L * F, w * F, (size_t)T, cudaMemcpyDeviceToDevice, NULL);
    }
}

/* blk_kda's steps, in its order */
static int cuda_kda(const blk *b, const kda_w *w, layer_state *st, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim;
    float *q = blk_alloc(b, (size_t)T * P), *k = blk_alloc(b, (size_t)T * P), *v = blk_alloc(b, (size_t)T * P);
    float *fa = blk_alloc(b, (size_t)T * w->f_a.rows), *f = blk_alloc(b, (size_t)T * P);
    float *beta = blk_alloc(b, (size_t)T * hp->kda_heads), *gate = blk_alloc(b, (size_t)T * P);
    float *o = blk_alloc(b, (size_t)T * P);
    float *ga = hp->kda_full_gate ? NULL : blk_alloc(b, (size_t)T * w->g_a.rows);
    if (!q || !k || !v || !fa || !f || !beta || !gate || !o || (!hp->kda_full_gate && !ga))
        return -1;
    int full = hp->kda_full_gate;
    const kmat *pw[6] = {&w->q, &w->k, &w->v, &w->f_a, &w->b, full ? &w->g : &w->g_a};
    const float *px[6] = {x, x, x, x, x, x};
    float *py[6] = {q, k, v, fa, beta, full ? gate : ga};
    cu_matmul_n(b, 6, pw, px, T, py);
    const kmat *pw2[2] = {&w->f_b, full ? NULL : &w->g_b}; /* the low-rank gates' second halves */
    const float *px2[2] = {fa, ga};
    float *py2[2] = {f, gate};
    cu_matmul_n(b, 2, pw2, px2, T, py2);
    if (st->log) {
        float *part[5] = {q, k, v, f, beta};
        kda_log_copy(hp, st->log, part, T, 1);
    }
    kda_recur(b, w, st, q, k, v, f, beta, gate, o, T);
    cu_matmul(b, &w->o, o, T, out);
    return 0;
}

/* blk_kda_replay: the state advanced in place over n logged positions */
static int cuda_replay(const blk *b, int i, const kda_w *w, layer_state *st, const float *log, int n)
{
    const hparams *hp = b->hp;
    int P = hp->kda_heads * hp->kda_dim;
    (void)i;
    if (n < 1)
        return 0;
    dev_use(b->dev);
    size_t mark = arena_mark(b->ar);
    float *q = blk_alloc(b, (size_t)n * P), *k = blk_alloc(b, (size_t)n * P), *v = blk_alloc(b, (size_t)n * P);
    float *f = blk_alloc(b, (size_t)n * P), *beta = blk_alloc(b, (size_t)n * hp->kda_heads);
    int rc = -1;
    if (q && k && v && f && beta) {
        float *part[5] = {q, k, v, f, beta};
        kda_log_copy(hp, (float *)log, part, n, 0);
        layer_state in_place = *st;
        in_place.S_in = st->S;
        in_place.conv_in = st->conv;
        kda_recur(b, w, &in_place, q, k, v, f, beta, NULL, NULL, n);
        rc = cudak_sync(NULL, "--device cuda: a commit's replay", b->err);
    }
    arena_rewind(b->ar, mark);
    return rc;
}

/* Each block's scratch is released when it returns (the kernels queued on it run before any
 * later use of the memory: one stream). */
static int cuda_attn(const blk *b, int i, const layer_w *L, layer_state *st, int pos0, const float *x, int T,
                     float *out)
{
    size_t mark = arena_mark(b->ar);
    int kind = b->hp->attn_kind[i];
    int rc = kind == ATTN_KDA   ? cuda_kda(b, &L->kda, st, x, T, out)
             : kind == ATTN_MLA ? cuda_mla(b, &L->mla, st, pos0, x, T, out)
                                : cuda_gqa(b, &L->gqa, st, pos0, x, T, out);
    arena_rewind(b->ar, mark);
    return rc;
}

/* blk_mlp after its gate and up products (g, u): the GLU into g, then down */
static void mlp_finish(const blk *b, const mlp_w *w, int inter, float *g, const float *u, int T, float *out)
{
    const hparams *hp = b->hp;
    cudak_glu(hp->act == ACT_SITU ? KERN_GLU_SITU : KERN_GLU_SWIGLU, g, u, T * inter, hp->situ_beta,
              hp->situ_linear_beta, NULL);
    cu_matmul(b, &w->down, g, T, out);
}

/* blk_mlp */
static int cuda_mlp(const blk *b, const mlp_w *w, int inter, const float *x, int T, float *out)
{
    size_t mark = arena_mark(b->ar);
    float *g = blk_alloc(b, (size_t)T * inter), *u = blk_alloc(b, (size_t)T * inter);
    if (!g || !u) {
        arena_rewind(b->ar, mark);
        return -1;
    }
    const kmat *pw[2] = {&w->gate, &w->up};
    const float *px[2] = {x, x};
    float *py[2] = {g, u};
    cu_matmul_n(b, 2, pw, px, T, py);
    mlp_finish(b, w, inter, g, u, T, out);
    arena_rewind(b->ar, mark);
    return 0;
}

/* A MoE layer's experts on the device, in groups of up to EX_GROUP: the gates and ups of a group
 * in one cudak_matmul_set, its GLUs in one launch, its downs in another, so that one launch fills
 * the GPU where one expert of a few positions (decode, verify, and prefill, where K3's experts see
 * about 9 positions each of a 512-token prompt) would not. Each expert reads its positions' rows
 * of the layer's buffers (grouped by expert: order, start) and writes its own rows, so the
 * grouping changes no value.
 *
 * Streamed experts: a VRAM hit joins the group at once; the misses are asked of the weight source
 * (begin/next), and each is copied on the copy stream `cp` into the least recently used slot as it
 * is handed over, from the source's registered host memory, while the GPU computes and the source
 * reads the next. Events order it: a fill waits for the kernels that read the slot's previous
 * expert (xs.done), a group's launch waits for its slots' fills (xs.filled), and the source gets an
 * expert's host bytes back once its fill has landed (pend_release). A slot still queued in the
 * unlaunched group is never refilled: the group is launched first. */
enum { EX_GROUP = CUDAK_SET / 2 };

typedef struct moe_run {
    const blk *b;
    cuda_dev *d;
    int I, D;
    const int *start;      /* host: expert e's positions are order[start[e] .. start[e + 1]) */
    float *gx, *g, *u, *gy; /* device: [TK][D], [TK][I], [TK][I], [TK][D], rows in that order */
    int n;                 /* the group not yet launched: */
    int ex[EX_GROUP], slot[EX_GROUP]; /* expert ids, their VRAM slots (-1: resident) */
    mlp_w m[EX_GROUP];     /* their matrices, device views */
} moe_run;

static void moe_glu(const moe_run *r, const int *off, const int *len, int n)
{
    const hparams *hp = r->b->hp;
    cudak_glu_set(hp->act == ACT_SITU ? KERN_GLU_SITU : KERN_GLU_SWIGLU, r->g, r->u, off, len, n, hp->situ_beta,
                  hp->situ_linear_beta, NULL);
}

/* forgets the group unlaunched (a pass that failed part way) */
static void moe_drop(moe_run *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->slot[i] >= 0)
            r->d->xs[r->slot[i]].queued = 0;
    r->n = 0;
}

/* launches the group: gate and up, GLU, down, each one launch */
static void moe_flush(moe_run *r)
{
    if (r->n == 0)
        return;
    cudak_mm mm[2 * EX_GROUP];
    int off[EX_GROUP], len[EX_GROUP];
    for (int i = 0; i < r->n; i++) {
        int s0 = r->start[r->ex[i]], n = r->start[r->ex[i] + 1] - s0;
        if (r->slot[i] >= 0)
            cudaStreamWaitEvent(NULL, r->d->xs[r->slot[i]].filled, 0);
        mm[2 * i] = (cudak_mm){.w = r->m[i].gate, .x = r->gx + (size_t)s0 * r->D, .ldx = (size_t)r->D,
                               .y = r->g + (size_t)s0 * r->I, .ldy = (size_t)r->I, .r1 = r->m[i].gate.rows, .T = n};
        mm[2 * i + 1] = mm[2 * i];
        mm[2 * i + 1].w = r->m[i].up;
        mm[2 * i + 1].y = r->u + (size_t)s0 * r->I;
        mm[2 * i + 1].r1 = r->m[i].up.rows;
        off[i] = s0 * r->I;
        len[i] = n * r->I;
    }
    cudak_matmul_set(mm, 2 * r->n, NULL);
    moe_glu(r, off, len, r->n);
    for (int i = 0; i < r->n; i++) {
        int s0 = r->start[r->ex[i]];
        mm[i] = (cudak_mm){.w = r->m[i].down, .x = r->g + (size_t)s0 * r->I, .ldx = (size_t)r->I,
                           .y = r->gy + (size_t)s0 * r->D, .ldy = (size_t)r->D, .r1 = r->m[i].down.rows,
                           .T = mm[2 * i].T};
    }
    cudak_matmul_set(mm, r->n, NULL);
    for (int i = 0; i < r->n; i++)
        if (r->slot[i] >= 0) {
            cudaEventRecord(r->d->xs[r->slot[i]].done, NULL);
            r->d->xs[r->slot[i]].queued = 0;
        }
    r->n = 0;
}

/* expert ex (its device matrices m, in VRAM slot `slot` or resident: -1) over its positions */
static void moe_add(moe_run *r, int ex, int slot, const mlp_w *m)
{
    assert(r->n < EX_GROUP && (slot < 0 || !r->d->xs[slot].queued));
    r->ex[r->n] = ex;
    r->slot[r->n] = slot;
    r->m[r->n] = *m;
    if (slot >= 0)
        r->d->xs[slot].queued = 1;
    if (++r->n == EX_GROUP)
        moe_flush(r);
}

/* copies device matrix w (on the device) back into host matrix h of the same shape, on stream st */
static void mat_get_async(const kmat *h, const kmat *w, cudaStream_t st)
{
    assert(h->fmt == w->fmt && h->rows == w->rows && h->cols == w->cols);
    size_t db = wfmt_data_bytes(w->fmt, w->rows, w->cols), sb = wfmt_scale_bytes(w->fmt, w->rows, w->cols);
    cudaMemcpyAsync((void *)h->data, w->data, db, cudaMemcpyDeviceToHost, st);
    if (sb)
        cudaMemcpyAsync((void *)h->scale, w->scale, sb, cudaMemcpyDeviceToHost, st);
}

/* Expert (layer, e) leaves VRAM slot k. The source no longer counts it as held, and takes its
 * bytes back into RAM when it has room for them (weight_src.adopt): copied on the copy stream once
 * the kernels that read the slot have run, the host waiting for that copy (the slot is refilled
 * next; the wait is one expert's PCIe transfer), so that an expert the GPU drops is not read from
 * the drive again. Device memory and RAM then hold different experts: the hierarchy the issue's
 * planner asks for (VRAM, then RAM, then the drive). */
static void slot_give_back(cuda_dev *d, const weight_src *xs, int k, int layer, int e)
{
    if (xs->held)
        xs->held(xs->ctx, layer, e, 0);
    mlp_w h;
    if (!xs->adopt || xs->adopt(xs->ctx, layer, e, &h) != 1)
        return;
    const mlp_w *dm = &d->xs[k].mats;
    cudaStreamWaitEvent(d->cp, d->xs[k].done, 0);
    mat_get_async(&h.gate, &dm->gate, d->cp);
    mat_get_async(&h.up, &dm->up, d->cp);
    mat_get_async(&h.down, &dm->down, d->cp);
    cudaError_t er = cudaEventRecord(d->xs[k].filled, d->cp); /* (the refill records it again) */
    if (er == cudaSuccess)
        er = cudaEventSynchronize(d->xs[k].filled);
    xs->adopted(xs->ctx, layer, e, er == cudaSuccess);
}

/* Copies expert (layer, e), which the source handed over in host memory, into the least recently
 * used VRAM slot, on the copy stream; the slot. */
static int slot_fill(moe_run *r, int layer, int e, const mlp_w *host)
{
    cuda_dev *d = r->d;
    int k = 0;
    for (int j = 1; j < d->nslot; j++)
        if (d->xs[j].used < d->xs[k].used)
            k = j;
    if (d->xs[k].queued)
        moe_flush(r);
    assert(!d->xs[k].queued);
    for (int i = 0; i < d->npend; i++)
        if (d->pend_slot[i] == k) { /* its previous fill's host bytes go back first */
            pend_release(d, r->b, layer, i + 1);
            break;
        }
    if (d->xs[k].key >= 0) {
        d->slot_of[d->xs[k].key] = -1;
        slot_give_back(d, r->b->xs, k, d->xs[k].key / d->n_experts, d->xs[k].key % d->n_experts);
    }
    cudaStreamWaitEvent(d->cp, d->xs[k].done, 0);
    uint8_t *at = d->slots + (size_t)k * d->slot_bytes;
    d->xs[k].mats.gate = mat_put_async(&host->gate, &at, d->cp);
    d->xs[k].mats.up = mat_put_async(&host->up, &at, d->cp);
    d->xs[k].mats.down = mat_put_async(&host->down, &at, d->cp);
    cudaEventRecord(d->xs[k].filled, d->cp);
    d->xs[k].key = layer * d->n_experts + e;
    d->xs[k].used = ++d->tick;
    d->slot_of[d->xs[k].key] = k;
    d->misses++;
    if (r->b->xs->held)
        r->b->xs->held(r->b->xs->ctx, layer, e, 1);
    return k;
}

/* Registers the weight source's host memory once (pinned: the fills then run asynchronously). A
 * source without it, or a registration refused, leaves the copies staged by the driver: slower,
 * the same bytes. */
static void source_register(cuda_dev *d, const weight_src *xs)
{
    if (d->reg_ctx == xs->ctx || cudaPeekAtLastError() != cudaSuccess) /* (a pending error is the pass's) */
        return;
    if (d->reg)
        cudaHostUnregister(d->reg);
    d->reg = NULL;
    d->reg_ctx = xs->ctx;
    void *base = NULL;
    size_t bytes = 0;
    if (xs->memory)
        xs->memory(xs->ctx, &base, &bytes);
    if (base && bytes && cudaHostRegister(base, bytes, cudaHostRegisterDefault) == cudaSuccess)
        d->reg = base;
    else if (base && bytes)
        cudaGetLastError(); /* the refusal is not an error of the pass (none was pending) */
}

/* The experts of streamed layer `layer`: the VRAM hits at once, the misses as the source hands
 * them over. */
static int moe_streamed(moe_run *r, int layer, const int *uni, int nu, int *miss)
{
    const blk *b = r->b;
    cuda_dev *d = r->d;
    source_register(d, b->xs);
    int nmiss = 0;
    for (int k = 0; k < nu; k++) {
        int slot = slot_find(d, layer, uni[k]);
        if (slot >= 0)
            moe_add(r, uni[k], slot, &d->xs[slot].mats);
        else
            miss[nmiss++] = uni[k];
    }
    if (nmiss > 0 && b->xs->begin(b->xs->ctx, layer, miss, nmiss, b->err) != 0) {
        moe_drop(r);
        return -1;
    }
    for (int k = 0; k < nmiss; k++) {
        int ex;
        mlp_w host;
        int got = b->xs->next(b->xs->ctx, &ex, &host, b->err);
        if (got <= 0) {
            moe_drop(r);
            pend_release(d, b, layer, d->npend);
            return got < 0 ? -1 : errbuf_set(b->err, "layer %d: the weight source handed over %d of %d experts",
                                             layer, k, nmiss);
        }
        int slot = slot_fill(r, layer, ex, &host);
        d->pend_id[d->npend] = ex;
        d->pend_slot[d->npend++] = slot;
        moe_add(r, ex, slot, &d->xs[slot].mats);
        if (d->npend > 2) /* the oldest fill has long landed: its source slot may go */
            pend_release(d, b, layer, 1);
    }
    moe_flush(r);
    pend_release(d, b, layer, d->npend);
    return 0;
}

/* blk_moe's steps, in its order. The router runs on the GPU; its choices come back to the host
 * (while the GPU runs the shared experts), which groups them by expert (moe_route.h, as the CPU
 * does); each chosen expert runs once over the positions that chose it. */
static int cuda_moe(const blk *b, int layer, const moe_w *w, const float *x, int T, float *out)
{
    const hparams *hp = b->hp;
    cuda_dev *d = b->dev;
    int E = hp->n_experts, K = hp->top_k, H = hp->hidden, D = hp->latent ? hp->latent : H, I = hp->moe_inter;
    size_t TK = (size_t)T * K;
    if (dev_grow(&d->route_dev, &d->route_dev_cap, (size_t)T * 2 * E, "the router's scratch", b->err) ||
        dev_grow(&d->moe_dev, &d->moe_dev_cap, TK * (2 * (size_t)D + 2 * (size_t)I), "the experts' buffers", b->err))
        return -1;
    float *logit = blk_alloc(b, (size_t)T * E), *tmp = d->route_dev, *wt = blk_alloc(b, TK);
    int *sel = (int *)blk_alloc(b, TK), *order = (int *)blk_alloc(b, TK);
    float *slots = blk_alloc(b, TK * D), *xe = hp->latent ? blk_alloc(b, (size_t)T * D) : NULL;
    float *r = blk_alloc(b, (size_t)T * D);
    float *sh = hp->n_shared > 0 ? blk_alloc(b, (size_t)T * H) : NULL;
    float *sg = sh ? blk_alloc(b, (size_t)T * hp->shared_inter) : NULL;
    float *su = sh ? blk_alloc(b, (size_t)T * hp->shared_inter) : NULL;
    if (!logit || !tmp || !wt || !sel || !order || !slots || (hp->latent && !xe) || !r ||
        (hp->n_shared > 0 && (!sh || !sg || !su)))
        return -1;
    if (TK > d->moe_cap) { /* the longest pass so far, not every step (no copy into sel is pending) */
        cudaFreeHost(d->sel);
        d->sel = NULL;
        d->moe_cap = 0;
        size_t bytes = sizeof(int) * (2 * TK + 3 * (size_t)E + 1);
        cudaError_t e = cudaHostAlloc((void **)&d->sel, bytes, cudaHostAllocDefault);
        if (e != cudaSuccess)
            return cu_err(b->err, "the routing's host memory", e);
        d->moe_cap = TK;
    }
    int *h_sel = d->sel, *h_order = h_sel + TK, *h_uni = h_order + TK, *h_miss = h_uni + E, *h_start = h_miss + E;
    /* every product of x in one launch: the router, the latent projection, the shared experts' gate and up */
    const kmat *pw[4] = {&w->router, hp->latent ? &w->lat_down : NULL, sh ? &w->shared.gate : NULL,
                         sh ? &w->shared.up : NULL};
    const float *px[4] = {x, x, x, x};
    float *py[4] = {logit, xe, sg, su};
    cu_matmul_n(b, 4, pw, px, T, py);
    cudab_route(hp, dev_vec(b, w->bias), logit, T, tmp, sel, wt, NULL);
    /* the choices come back while the GPU runs the shared experts, which need none of them */
    cudaError_t e = cudaMemcpyAsync(h_sel, sel, TK * sizeof(int), cudaMemcpyDeviceToHost, NULL);
    if (e == cudaSuccess)
        e = cudaEventRecord(d->sel_ready, NULL);
    if (sh)
        mlp_finish(b, &w->shared, hp->shared_inter, sg, su, T, sh);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(d->sel_ready);
    if (e != cudaSuccess)
        return cu_err(b->err, "the router's choices", e);
    int nu = moe_group(h_sel, (int)TK, E, h_start, h_order, h_uni);
    if (up_copy(d, order, h_order, TK * sizeof(int), b->err))
        return -1;
    moe_run run = {.b = b, .d = d, .I = I, .D = D, .start = h_start, .gx = d->moe_dev};
    run.g = run.gx + TK * D;
    run.u = run.g + TK * I;
    run.gy = run.u + TK * I;
    cudab_gather(hp->latent ? xe : x, order, (int)TK, K, D, run.gx, NULL);
    if (b->xs) {
        if (moe_streamed(&run, layer, h_uni, nu, h_miss) != 0)
            return -1;
    } else {
        for (int k = 0; k < nu; k++) {
            const mlp_w *hm = &w->experts[h_uni[k]];
            mlp_w dm = {.gate = dev_mat(d, &hm->gate), .up = dev_mat(d, &hm->up), .down = dev_mat(d, &hm->down)};
            moe_add(&run, h_uni[k], -1, &dm);
        }
        moe_flush(&run);
    }
    cudab_scatter(run.gy, order, (int)TK, D, slots, NULL);
    cudab_moe_sum(slots, wt, T, K, D, r, NULL);
    if (hp->latent) {
        cudab_rmsnorm(r, dev_vec(b, w->lat_norm), T, D, (size_t)D, hp->rms_eps, r, NULL);
        cu_matmul(b, &w->lat_up, r, T, out);
    } else {
        cudaMemcpyAsync(out, r, sizeof(float) * (size_t)T * H, cudaMemcpyDeviceToDevice, NULL);
    }
    if (sh)
        cudab_add(out, sh, (size_t)T * H, NULL);
    return 0;
}

/* Router lookahead (blk_moe_guess on the GPU): layer i's router over the stand-in x, its choices
 * brought back, and the reads started of those not already in VRAM. A hint only: nothing is
 * decided, and a failure to allocate its scratch skips it. */
static void cuda_guess(const blk *b, int i, const layer_w *L, const float *x, int T)
{
    const hparams *hp = b->hp;
    cuda_dev *d = b->dev;
    if (!b->xs || !b->xs->prefetch || i >= hp->n_layers || hp->ffn_kind[i] != FFN_MOE || !d->slot_of)
        return;
    int E = hp->n_experts, K = hp->top_k;
    size_t TK = (size_t)T * K, mark = arena_mark(b->ar);
    float *logit = blk_alloc(b, (size_t)T * E), *wt = blk_alloc(b, TK);
    int *sel = (int *)blk_alloc(b, TK);
    errbuf ignored;
    if (logit && wt && sel && !dev_grow(&d->route_dev, &d->route_dev_cap, (size_t)T * 2 * E, "", &ignored)) {
        if (TK > d->guess_cap) {
            int *h = realloc(d->guess, sizeof(int) * TK);
            if (h) {
                d->guess = h;
                d->guess_cap = TK;
            }
        }
        cu_matmul(b, &L->moe.router, x, T, logit);
        cudab_route(hp, dev_vec(b, L->moe.bias), logit, T, d->route_dev, sel, wt, NULL);
        if (TK <= d->guess_cap && cudaMemcpy(d->guess, sel, TK * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess)
            for (int t = 0; t < T; t++) {
                int *ids = d->guess + (size_t)t * K, n = 0;
                for (int j = 0; j < K; j++)
                    if (d->slot_of[i * E + ids[j]] < 0)
                        ids[n++] = ids[j];
                if (n)
                    b->xs->prefetch(b->xs->ctx, i, ids, n);
            }
    }
    arena_rewind(b->ar, mark); /* (a CUDA error here stays pending: the pass reports it at the head) */
}

static int cuda_ffn(const blk *b, int i, const layer_w *L, const float *x, int T, float *out)
{
    size_t mark = arena_mark(b->ar);
    int rc = b->hp->ffn_kind[i] == FFN_MOE ? cuda_moe(b, i, &L->moe, x, T, out)
                                           : cuda_mlp(b, &L->mlp, b->hp->dense_inter, x, T, out);
    arena_rewind(b->ar, mark);
    return rc;
}

static void cuda_mix(const blk *b, float *const *stack, int ns, const float *prefix, const float *u, int T,
                     float *out)
{
    cudab_attnres_mix(stack, ns, prefix, dev_vec(b, u), T, b->hp->hidden, b->hp->rms_eps, out, NULL);
}

static void cuda_add(const blk *b, float *y, const float *a, size_t n)
{
    (void)b;
    cudab_add(y, a, n, NULL);
}

static void cuda_copy(const blk *b, float *dst, const float *src, size_t n)
{
    (void)b;
    cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, NULL);
}

static int cuda_head(const blk *b, const kmat *lm_head, const float *x, int T, float *host)
{
    cuda_dev *d = b->dev;
    size_t n = (size_t)T * lm_head->rows;
    if (dev_grow(&d->lg_dev, &d->lg_dev_cap, n, "the logits", b->err))
        return -1;
    cu_matmul(b, lm_head, x, T, d->lg_dev);
    cudaError_t e = cudaMemcpy(host, d->lg_dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    return e != cudaSuccess ? cu_err(b->err, "the pass", e) : cudak_sync(NULL, "--device cuda: the pass", b->err);
}

static void cuda_read(const blk *b, float *host, const float *buf, size_t n)
{
    (void)b;
    cudaMemcpy(host, buf, n * sizeof(float), cudaMemcpyDeviceToHost);
}

const backend_ops backend_cuda = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_copy = cuda_mem_copy,
    .mem_zero = cuda_mem_zero,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .attn = cuda_attn,
    .ffn = cuda_ffn,
    .mix = cuda_mix,
    .add = cuda_add,
    .copy = cuda_copy,
    .head = cuda_head,
    .read = cuda_read,
    .replay = cuda_replay,
    .guess = cuda_guess,
};
