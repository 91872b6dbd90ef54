/* backend_cpu.c — the CPU backend: the blk_* blocks over kern.h's tables and the thread pool, on
 * buffers in host memory (the definition every other backend's bits are held to: backend.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

/* defined only in a CUDA build; its address is NULL in any other */
extern const backend_ops backend_cuda __attribute__((weak));

static void cpu_embed(const blk *b, const int32_t *tokens, int T, float *h)
{
    int H = b->hp->hidden;
    for (int t = 0; t < T; t++)
        b->k->decode_rows(&b->m->embed, tokens[t], tokens[t] + 1, h + (size_t)t * H);
}

/* Each block's scratch is released when it returns: only its output survives. */
static int cpu_attn(const blk *b, int i, const layer_w *L, layer_state *st, int pos0, const float *x, int T,
                    float *out)
{
    size_t mark = arena_mark(b->ar);
    int rc;
    switch (b->hp->attn_kind[i]) {
    case ATTN_KDA:
        rc = blk_kda(b, &L->kda, st, x, T, out);
        break;
    case ATTN_MLA:
        rc = blk_mla(b, &L->mla, st, pos0, x, T, out);
        break;
    default:
        rc = blk_gqa(b, &L->gqa, st, pos0, x, T, out);
    }
    arena_rewind(b->ar, mark);
    return rc;
}

static int cpu_ffn(const blk *b, int i, const layer_w *L, const float *x, int T, float *out)
{
    size_t mark = arena_mark(b->ar);
    int rc = b->hp->ffn_kind[i] == FFN_MOE ? blk_moe(b, i, &L->moe, x, T, out)
                                           : blk_mlp(b, &L->mlp, b->hp->dense_inter, x, T, out);
    arena_rewind(b->ar, mark);
    return rc;
}

static void cpu_mix(const blk *b, float *const *stack, int ns, const float *prefix, const float *u, int T,
                    float *out)
{
    int H = b->hp->hidden;
    const float *src[MODEL_MAX_BLOCKS + 1]; /* blocks + the current stream (cfg_validate bounds them) */
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < ns; j++)
            src[j] = stack[j] + (size_t)t * H;
        src[ns] = prefix + (size_t)t * H;
        blk_attnres_mix(b, src, ns + 1, u, H, out + (size_t)t * H);
    }
}

static void cpu_add(const blk *b, float *y, const float *a, size_t n)
{
    (void)b;
    for (size_t j = 0; j < n; j++)
        y[j] += a[j];
}

static void cpu_copy(const blk *b, float *dst, const float *src, size_t n)
{
    (void)b;
    memcpy(dst, src, n * sizeof(float));
}

static int cpu_head(const blk *b, const kmat *lm_head, const float *x, int T, float *host)
{
    blk_matmul(b, lm_head, x, T, host);
    return 0;
}

static int cpu_replay(const blk *b, int i, const kda_w *w, layer_state *st, const float *log, int n)
{
    (void)i;
    return blk_kda_replay(b, w, st, log, n);
}

static void cpu_guess(const blk *b, int i, const layer_w *L, const float *x, int T)
{
    blk_moe_guess(b, i, &L->moe, x, T);
}

const backend_ops backend_cpu = {
    .name = "cpu",
    .embed = cpu_embed,
    .rmsnorm = blk_rmsnorm,
    .attn = cpu_attn,
    .ffn = cpu_ffn,
    .mix = cpu_mix,
    .add = cpu_add,
    .copy = cpu_copy,
    .head = cpu_head,
    .read = cpu_copy,
    .replay = cpu_replay,
    .guess = cpu_guess,
};

const backend_ops *backend_select(const char *device, int *index, errbuf *err)
{
    *index = 0;
    if (!device || !strcmp(device, "cpu"))
        return &backend_cpu;
    if (!strcmp(device, "cuda") || !strncmp(device, "cuda:", 5)) {
        if (device[4] == ':') {
            char *end;
            long n = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || n < 0 || n > 63) {
                errbuf_set(err, "--device %s: expected cuda or cuda:N with N a device number", device);
                return NULL;
            }
            *index = (int)n;
        }
        if (&backend_cuda) /* linked in by make CUDA=1 */
            return &backend_cuda;
        errbuf_set(err, "--device %s: this build has no CUDA backend (build it with make CUDA=1)", device);
        return NULL;
    }
    errbuf_set(err, "--device %s: unknown device (cpu, cuda or cuda:N)", device);
    return NULL;
}
