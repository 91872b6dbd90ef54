/* blk_common.c — pieces every block uses: pooled matmul, RMSNorm, GLU activations, RoPE,
 * AttnRes mixing. */
#include <assert.h>
#include <limits.h>
#include <string.h>

#include "model/blk.h"

float *blk_alloc(const blk *b, size_t n)
{
    float *p = arena_alloc(b->ar, n * sizeof(float));
    if (!p)
        errbuf_set(b->err, "pass scratch exhausted (%zu floats more; arena %zu of %zu bytes used)", n, b->ar->used,
                   b->ar->cap);
    return p;
}

struct mm_job {
    const kern_ops *k;
    const kmat *w;
    const float *x;
    int T;
    float *y;
    pool *pool;
    int unit; /* rows per pool item */
};

static void mm_run(void *ctx, int u0, int u1, int tid)
{
    struct mm_job *j = ctx;
    int r0 = u0 * j->unit, r1 = u1 * j->unit < j->w->rows ? u1 * j->unit : j->w->rows;
    j->k->matmul(j->w, r0, r1, j->x, (size_t)j->w->cols, j->T, j->y + r0, (size_t)j->w->rows,
                 pool_scratch(j->pool, tid));
}

/* Pool items per thread for T > 1: every call of the kernel copies (or reorders) its tokens'
 * activations before it reduces them, T x cols floats whatever its row range, so a T = 512 pass
 * split into pool_for's 8 chunks per thread of a 1024-row matrix spent 6% of a Qwen3-0.6B
 * prompt in that copy. Four items of whole row blocks per thread keep it near 1/(rows / 4n)
 * of the work and still let a thread that runs late take less. */
enum { MM_ITEMS_PER_THREAD = 4 };

/* Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs more.
 * Which thread computes a row never changes its bits. */
enum { MM_PARALLEL_MIN = 1 << 16 };

void blk_matmul(const blk *b, const kmat *w, const float *x, int T, float *y)
{
    struct mm_job j = {.k = b->k, .w = w, .x = x, .T = T, .y = y, .pool = b->pool, .unit = 1};
    if ((size_t)w->rows * (size_t)w->cols * (size_t)T < MM_PARALLEL_MIN || pool_size(b->pool) == 1) {
        j.unit = w->rows;
        mm_run(&j, 0, 1, 0);
        return;
    }
    if (T > 1) {
        int items = MM_ITEMS_PER_THREAD * pool_size(b->pool);
        j.unit = (w->rows + items - 1) / items;
        j.unit = (j.unit + KERN_RB - 1) / KERN_RB * KERN_RB;
    }
    pool_for(b->pool, (w->rows + j.unit - 1) / j.unit, mm_run, &j);
}

void blk_rmsnorm(const blk *b, const float *x, const float *w, int T, int n, float eps, float *y)
{
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * n;
        float *yt = y + (size_t)t * n;
        float ss = b->k->dot(xt, xt, n);
        float r = 1.0f / sqrtf(ss / (float)n + eps);
        if (w)
            for (int i = 0; i < n; i++)
                yt[i] = xt[i] * r * w[i];
        else
            for (int i = 0; i < n; i++)
                yt[i] = xt[i] * r;
    }
}

struct glu_job {
    const hparams *hp;
    const kern_ops *k;
    float *gate;
    const float *up;
};

/* elements [i0, i1): each one on its own, so the split never changes a bit. SiTU is
 * [b tanh(g/b) sigmoid(g)] [bl tanh(u/bl)] (sigmoid of the raw g); SwiGLU g sigmoid(g) u. */
static void glu_run(void *ctx, int i0, int i1, int tid)
{
    const struct glu_job *j = ctx;
    const hparams *hp = j->hp;
    (void)tid;
    j->k->glu(hp->act == ACT_SITU ? KERN_GLU_SITU : KERN_GLU_SWIGLU, j->gate + i0, j->up + i0, i1 - i0,
              hp->situ_beta, hp->situ_linear_beta);
}

/* Below this many elements the activation runs on the calling thread. Measured when SiTU cost
 * three libm calls per element (55-60 ns): run on the caller alone, a decode expert's 2048 left
 * the other thread idle (perf, bench/results/engine.md: the worker idle 10.7% of decode's
 * samples, 4.1% split). As a SIMD kernel (4-5 ns per element with AVX-512) either choice is now
 * within the noise of decode (~1 ms of a 350 ms token on k3-mini); the split is kept. */
enum { GLU_PARALLEL_MIN = 1024 };

void blk_glu(const blk *b, float *gate, const float *up, size_t n)
{
    struct glu_job j = {b->hp, b->k, gate, up};
    assert(n <= INT_MAX); /* T x inter of one pass */
    if (n < GLU_PARALLEL_MIN || pool_size(b->pool) == 1)
        glu_run(&j, 0, (int)n, 0);
    else
        pool_for(b->pool, (int)n, glu_run, &j);
}

void blk_rope_table(const hparams *hp, int pos, float *cs)
{
    int h = hp->rope_dim / 2;
    for (int i = 0; i < h; i++) {
        float ang = (float)pos * hp->rope_inv_freq[i]; /* HF: float32 product */
        cs[i] = (float)cos((double)ang) * hp->rope_attn_factor;
        cs[h + i] = (float)sin((double)ang) * hp->rope_attn_factor;
    }
}

void blk_rope_apply(const hparams *hp, float *v, const float *cs)
{
    int h = hp->rope_dim / 2;
    const float *c = cs, *s = cs + h;
    if (hp->rope == ROPE_INTERLEAVED) {
        for (int i = 0; i < h; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c[i] - b * s[i];
            v[2 * i + 1] = b * c[i] + a * s[i];
        }
    } else {
        for (int i = 0; i < h; i++) {
            float a = v[i], b = v[i + h];
            v[i] = a * c[i] - b * s[i];
            v[i + h] = b * c[i] + a * s[i];
        }
    }
}

void blk_attnres_mix(const blk *b, const float *const *src, int n, const float *u, int H, float *out)
{
    float s[MODEL_MAX_BLOCKS + 1]; /* n <= MAX_BLOCKS + 1 (cfg_validate) */
    for (int j = 0; j < n; j++) {
        float ss = b->k->dot(src[j], src[j], H);
        float r = 1.0f / sqrtf(ss / (float)H + b->hp->rms_eps);
        s[j] = b->k->dot(src[j], u, H) * r; /* keys RMS-normed, values raw */
    }
    b->k->softmax_rows(s, 0, &n, 1, 1.0f); /* (x * 1 is x) */
    for (int i = 0; i < H; i++)
        out[i] = 0.0f;
    for (int j = 0; j < n; j++)
        b->k->axpy(out, src[j], s[j], H);
}
