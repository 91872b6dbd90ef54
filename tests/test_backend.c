/* test_backend.c — the backend seam (backend.h) with the CPU backend behind it:
 *   - a pass goes through the seam whole: behind a backend that forwards every operation to the CPU
 *     backend and counts it, the logits are the CPU backend's bits, and each operation is called as
 *     often as the model's layers say;
 *   - nothing reaches around it: a backend whose residual add is wrong changes the logits;
 *   - --device picks the backend, and one this build lacks is a one-line error.
 * (The CUDA backend itself is tested on a GPU: tests/cuda/test_cuda.c, make test-cuda.)
 * The cases are K3's (AttnRes: mixes, copies, KDA and MLA, MoE) and Qwen3's (plain residual, GQA,
 * dense MLP). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "test.h"
#include "test_util.h"

typedef struct counts {
    int embed, rmsnorm, attn, ffn, mix, add, copy, head, read, guess;
    int break_add; /* 1: add does nothing (a backend the logits must notice) */
} counts;
static counts calls;

static void c_embed(const blk *b, const int32_t *tokens, int T, float *h)
{
    calls.embed++;
    backend_cpu.embed(b, tokens, T, h);
}
static void c_rmsnorm(const blk *b, const float *x, const float *w, int T, int n, float eps, float *y)
{
    calls.rmsnorm++;
    backend_cpu.rmsnorm(b, x, w, T, n, eps, y);
}
static int c_attn(const blk *b, int i, const layer_w *L, layer_state *st, int pos0, const float *x, int T, float *out)
{
    calls.attn++;
    return backend_cpu.attn(b, i, L, st, pos0, x, T, out);
}
static int c_ffn(const blk *b, int i, const layer_w *L, const float *x, int T, float *out)
{
    calls.ffn++;
    return backend_cpu.ffn(b, i, L, x, T, out);
}
static void c_mix(const blk *b, float *const *stack, int ns, const float *prefix, const float *u, int T, float *out)
{
    calls.mix++;
    backend_cpu.mix(b, stack, ns, prefix, u, T, out);
}
static void c_add(const blk *b, float *y, const float *a, size_t n)
{
    calls.add++;
    if (!calls.break_add)
        backend_cpu.add(b, y, a, n);
}
static void c_copy(const blk *b, float *dst, const float *src, size_t n)
{
    calls.copy++;
    backend_cpu.copy(b, dst, src, n);
}
static int c_head(const blk *b, const kmat *w, const float *x, int T, float *host)
{
    calls.head++;
    return backend_cpu.head(b, w, x, T, host);
}
static void c_read(const blk *b, float *host, const float *buf, size_t n)
{
    calls.read++;
    backend_cpu.read(b, host, buf, n);
}
static int c_replay(const blk *b, int i, const kda_w *w, layer_state *st, const float *log, int n)
{
    return backend_cpu.replay(b, i, w, st, log, n);
}
static void c_guess(const blk *b, int i, const layer_w *L, const float *x, int T)
{
    calls.guess++;
    backend_cpu.guess(b, i, L, x, T);
}

static const backend_ops counting = {
    .name = "counting",
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .attn = c_attn,
    .ffn = c_ffn,
    .mix = c_mix,
    .add = c_add,
    .copy = c_copy,
    .head = c_head,
    .read = c_read,
    .replay = c_replay,
    .guess = c_guess,
};

static void seam_case(const char *name)
{
    errbuf err;
    model m;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", test_data("oracle"), name);
    CHECKF(model_load(&m, dir, &err) == 0, "%s: %s", name, err.msg);
    engine *e = tu_engine(&m, NULL, 2, NULL, &err);
    CHECKF(e, "%s: %s", name, err.msg);
    const hparams *hp = &m.hp;
    enum { N = 12, CHUNK = 5 }; /* passes of 5, 5 and 2 tokens */
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % hp->vocab);
    float *want = tu_eval_engine(e, ids, N, CHUNK, &err);
    memset(&calls, 0, sizeof calls);
    e->be = &counting;
    float *got = want ? tu_eval_engine(e, ids, N, CHUNK, &err) : NULL;
    int passes = (N + CHUNK - 1) / CHUNK, L = hp->n_layers, attnres = hp->attnres_block > 0;
    int same = got && !memcmp(want, got, sizeof(float) * (size_t)N * hp->vocab);
    counts seen = calls;
    calls.break_add = 1;
    float *broken = got ? tu_eval_engine(e, ids, N, CHUNK, &err) : NULL;
    int differs = broken && memcmp(want, broken, sizeof(float) * (size_t)N * hp->vocab) != 0;
    calls.break_add = 0;
    e->be = &backend_cpu;
    free(want);
    free(got);
    free(broken);
    engine_free(e);
    model_free(&m);
    CHECKF(same, "%s: the logits through the counting backend are not the CPU backend's (%s)", name, err.msg);
    CHECKF(seen.embed == passes && seen.head == passes, "%s: %d embeds, %d heads for %d passes", name, seen.embed,
           seen.head, passes);
    CHECKF(seen.attn == passes * L && seen.ffn == passes * L, "%s: %d attention and %d FFN calls for %d x %d", name,
           seen.attn, seen.ffn, passes, L);
    /* two norms a layer and the final one; K3 adds the FFN side's residual and, within a block, the
     * attention side's, and mixes before each sub-layer but the first */
    CHECKF(seen.rmsnorm >= passes * (2 * L + 1), "%s: %d norms", name, seen.rmsnorm);
    if (attnres)
        CHECKF(seen.mix > 0 && seen.copy > 0 && seen.add >= passes * L, "%s: %d mixes, %d copies, %d adds", name,
               seen.mix, seen.copy, seen.add);
    else
        CHECKF(seen.mix == 0 && seen.add == passes * 2 * L, "%s: %d mixes, %d adds", name, seen.mix, seen.add);
    CHECKF(differs, "%s: a backend that drops the residual adds gave the same logits", name);
}

TEST(backend_seam_k3) { seam_case("kimi_k3-a"); }
TEST(backend_seam_qwen3) { seam_case("qwen3-a"); }

TEST(backend_device_option)
{
    errbuf err;
    int index = -1;
    CHECK(backend_select(NULL, &index, &err) == &backend_cpu && index == 0);
    CHECK(backend_select("cpu", &index, &err) == &backend_cpu);
    CHECK(backend_select("tpu", &index, &err) == NULL && strstr(err.msg, "--device tpu"));
    CHECK(backend_select("cuda:x", &index, &err) == NULL && strstr(err.msg, "cuda:N"));
    /* make test's build has no CUDA backend (tests/cuda/test_cuda.c tests the one a CUDA build has) */
    const backend_ops *c = backend_select("cuda:0", &index, &err);
    CHECK(c == NULL && strstr(err.msg, "--device cuda:0") && strstr(err.msg, "make CUDA=1") && !strchr(err.msg, '\n'));
    engine_opts o;
    engine_opts_default(&o);
    o.device = "cuda";
    engine *e = NULL;
    CHECK(engine_open(&o, &e, &err) == -1 && e == NULL && strstr(err.msg, "--device cuda"));
}
