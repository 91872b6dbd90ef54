/* test_cuda.c — the GPU against the CPU, bit for bit. Built and run only by `make test-cuda` (a
 * machine with an NVIDIA GPU; every test skips without one).
 *   - The kernels (src/backend/cuda/cuda_kern.h) against the scalar reference through
 *     test_kernels.c's own checks: a kern_ops table whose entries copy their host operands to the
 *     device, run the CUDA kernel and copy the results back (a test adapter: the engine's GPU path
 *     keeps its operands on the device).
 *   - Whole passes on --device cuda against --device cpu, memcmp of the logits: every family and
 *     format of the oracle cases, chunkings, long contexts, passes kept in part, drafting, and
 *     the VRAM tier over a weight store. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kern.h"
#include "test.h"
#include "test_kern.h"

/* A device copy of n bytes of host memory (n may be 0); aborts the test binary on a CUDA error,
 * since every later check would fail for the same reason. */
static void *dput(const void *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 4) != cudaSuccess || (n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess)) {
        fprintf(stderr, "test_cuda: cudaMalloc/cudaMemcpy of %zu bytes failed: %s\n", n,
                cudaGetErrorString(cudaGetLastError()));
        abort();
    }
    return d;
}

/* waits for the kernels, copies n bytes of d back into h and frees d */
static void dget(void *h, void *d, size_t n)
{
    errbuf err;
    if (cudak_sync(NULL, "test_cuda", &err) || (n && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    cudaFree(d);
}

/* the device copy of a host matrix view (rows of data row_bytes apart, and its scales) */
static kmat dmat(const kmat *w)
{
    kmat d = *w;
    d.data = dput(w->data, (size_t)(w->rows - 1) * w->row_bytes + wfmt_data_bytes(w->fmt, 1, w->cols));
    size_t sb = wfmt_scale_bytes(w->fmt, w->rows, w->cols);
    d.scale = sb ? dput(w->scale, sb) : NULL;
    return d;
}

static void dmat_free(kmat *d)
{
    cudaFree((void *)d->data);
    cudaFree((void *)d->scale);
}

static void c_matmul(const kmat *w, int r0, int r1, const float *x, size_t ldx, int T, float *y, size_t ldy,
                     float *scratch)
{
    (void)scratch;
    kmat d = dmat(w);
    size_t nx = ((size_t)(T - 1) * ldx + (size_t)w->cols) * 4, ny = ((size_t)(T - 1) * ldy + (size_t)(r1 - r0)) * 4;
    float *dx = dput(x, nx), *dy = dput(y, ny); /* y's gaps go up and come back: they must stay */
    cudak_matmul(&d, r0, r1, dx, ldx, T, dy, ldy, NULL);
    dget(y, dy, ny);
    cudaFree(dx);
    dmat_free(&d);
}

static void c_dot_rows(const float *a, const float *x, size_t ldx, int rows, int n, float *out)
{
    size_t nx = rows ? ((size_t)(rows - 1) * ldx + (size_t)n) * 4 : 0;
    float *da = dput(a, (size_t)n * 4), *dx = dput(x, nx), *dout = dput(out, (size_t)rows * 4);
    cudak_dot_rows(da, dx, ldx, rows, n, dout, NULL);
    dget(out, dout, (size_t)rows * 4);
    cudaFree(da);
    cudaFree(dx);
}

static float c_dot(const float *a, const float *b, int n)
{
    float out = 0.0f;
    c_dot_rows(a, b, (size_t)n, 1, n, &out);
    return out;
}

static void c_decode_rows(const kmat *w, int r0, int r1, float *out)
{
    kmat d = dmat(w);
    size_t n = (size_t)(r1 - r0) * (size_t)w->cols * 4;
    float *dout = dput(out, n);
    cudak_decode_rows(&d, r0, r1, dout, NULL);
    dget(out, dout, n);
    dmat_free(&d);
}

static void c_axpy_rows(float *y, size_t ldy, const float *a, size_t lda, int ny, const float *x, size_t ldx, int n,
                        int len)
{
    size_t nx = n ? ((size_t)(n - 1) * ldx + (size_t)len) * 4 : 0;
    size_t nyb = ny ? ((size_t)(ny - 1) * ldy + (size_t)len) * 4 : 0, na = ny ? ((size_t)(ny - 1) * lda + n) * 4 : 0;
    float *dy = dput(y, nyb), *dx = dput(x, nx), *da = dput(a, na);
    cudak_axpy_rows(dy, ldy, da, lda, ny, dx, ldx, n, len, NULL);
    dget(y, dy, nyb);
    cudaFree(dx);
    cudaFree(da);
}

static void c_axpy(float *y, const float *x, float a, int n)
{
    c_axpy_rows(y, (size_t)n, &a, 1, 1, x, (size_t)n, 1, n);
}

static void c_kda_step(float *S, int d, const float *k, const float *v, const float *q, const float *alpha,
                       float beta, float *o, float *u)
{
    (void)u;
    size_t nd = (size_t)d * 4;
    float *dS = dput(S, nd * (size_t)d), *dk = dput(k, nd), *dv = dput(v, nd), *dq = dput(q, nd);
    float *dal = dput(alpha, nd), *dout = dput(o, nd);
    cudak_kda_step(dS, d, dk, dv, dq, dal, beta, dout, NULL);
    dget(o, dout, nd);
    dget(S, dS, nd * (size_t)d);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dq);
    cudaFree(dal);
}

static void c_glu(int act, float *gate, const float *up, int n, float bt, float bl)
{
    float *dg = dput(gate, (size_t)n * 4), *du = dput(up, (size_t)n * 4);
    cudak_glu(act, dg, du, n, bt, bl, NULL);
    dget(gate, dg, (size_t)n * 4);
    cudaFree(du);
}

static void c_exp_sub(float *x, int n, float m)
{
    float *dx = dput(x, (size_t)n * 4);
    cudak_exp_sub(dx, n, m, NULL);
    dget(x, dx, (size_t)n * 4);
}

static const kern_ops cuda_host_ops = {
    .name = "cuda",
    .matmul = c_matmul,
    .dot = c_dot,
    .dot_rows = c_dot_rows,
    .decode_rows = c_decode_rows,
    .axpy = c_axpy,
    .axpy_rows = c_axpy_rows,
    .kda_step = c_kda_step,
    .glu = c_glu,
    .exp_sub = c_exp_sub,
};

static const kern_ops *cuda_ops(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? &cuda_host_ops : NULL;
}

TEST(kern_cuda_matches_scalar) { kern_test_matches_scalar(cuda_ops()); }

TEST(kern_cuda_elementwise) { kern_test_elementwise(cuda_ops()); }

/* cudak_matmul's prefill tiles (k_mmx) take 64-row blocks only where those fill half the SMs, and
 * kern_cuda_matches_scalar's matrices have at most 130 rows: here one block more than the SMs, and
 * a ragged end, so that the 64-row blocks run for every format, with partial column stages, in
 * tiles of 16 tokens (T = 13) and of 32. */
TEST(kern_cuda_matmul_wide)
{
    const kern_ops *k = cuda_ops();
    int sms = 0;
    if (!k || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        test_skip("no CUDA device");
        return;
    }
    int rows = 64 * sms + 37;
    static const int cols[] = {96, 160}, toks[] = {13, 25, 70};
    for (int fmt = 0; fmt < WF_COUNT; fmt++)
        for (int c = 0; c < 2; c++)
            for (int t = 0; t < 3; t++)
                CHECKF(kern_test_matmul_case(k, fmt, rows, cols[c], toks[t], 300 + 4 * c + t),
                       "cuda %s rows %d cols %d T %d differs from scalar", wfmt_table[fmt].name, rows, cols[c],
                       toks[t]);
}

/* ---- whole passes: the CUDA backend against the CPU's, memcmp ---- */

#include "backend/cuda/backend_cuda.h"
#include "engine/draft.h"
#include "engine/engine_int.h"
#include "engine/generate.h"
#include "store/store.h"
#include "test_util.h"

/* an engine over m on `device` ("cpu" or "cuda"), two threads, the best CPU kernels */
static engine *dev_engine(const model *m, const char *device, errbuf *err)
{
    engine_opts o;
    engine_opts_default(&o);
    o.threads = 2;
    o.device = device;
    engine *e = NULL;
    return engine_wrap(m, NULL, &o, &e, err) == 0 ? e : NULL;
}

#define NEED_GPU()                                                                                       \
    do {                                                                                                 \
        if (!cuda_ops()) {                                                                               \
            test_skip("no CUDA device");                                                                 \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

/* a random matrix of fmt on the device: BF16 of magnitude 2^-7 .. 2^-6, 4-bit codes of every value
 * with ordinary scales */
static kmat rand_dmat(int fmt, int rows, int cols, uint32_t *seed)
{
    size_t db = wfmt_data_bytes(fmt, rows, cols), sb = wfmt_scale_bytes(fmt, rows, cols);
    uint8_t *h = malloc(db + sb);
    for (size_t i = 0; i < db + sb; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        h[i] = (uint8_t)(*seed >> 24);
    }
    if (fmt == WF_BF16)
        for (size_t i = 0; i < db / 2; i++)
            h[2 * i + 1] = (uint8_t)(0x3C + (h[2 * i + 1] & 1) + (h[2 * i + 1] & 0x80));
    if (fmt == WF_MXFP4)
        for (size_t i = db; i < db + sb; i++)
            h[i] = (uint8_t)(118 + h[i] % 6);
    if (fmt == WF_INT4G32)
        for (size_t i = db; i + 1 < db + sb; i += 2)
            h[i + 1] = (uint8_t)(0x3C + (h[i + 1] & 1));
    kmat w;
    kmat_init(&w, fmt, rows, cols, h, sb ? h + db : NULL);
    kmat d = dmat(&w);
    free(h);
    return d;
}

/* cudak_matmul_set (a MoE layer's experts in one launch) gives each product's cudak_matmul bits
 * (which kern_cuda_matches_scalar holds to the scalar table): 40 products of three formats, T of 1
 * to 8 (k_gemv's family) and of 10 to 45 (k_mmx's sets, in tiles of 16 and 32 tokens), row
 * ranges, strides, and shapes neither takes (cols not a whole column block or group), in runs
 * longer than one launch takes; and cudak_glu_set gives cudak_glu's. */
TEST(kern_cuda_matmul_set)
{
    NEED_GPU();
    enum { N = 40 };
    static const int fmts[] = {WF_BF16, WF_MXFP4, WF_INT4G32};
    uint32_t seed = 7;
    cudak_mm m[N];
    float *ref[N], *got[N];
    size_t ny[N];
    for (int i = 0; i < N; i++) {
        int fmt = fmts[i < 34 ? 0 : i % 3], rows = 64 + 16 * (i % 5) + (i % 3);
        int cols = i % 7 == 6 ? 520 : 512 * (1 + i % 2);
        int T = i == 20 ? 11 : i % 5 == 3 || i == 37 ? 9 + i * 7 % 40 : 1 + i % 8, r0 = i % 4 == 1 ? 5 : 0;
        kmat w = rand_dmat(fmt, rows, cols, &seed);
        size_t ldx = (size_t)cols + (i % 2) * 4, ldy = (size_t)rows + 3;
        float *hx = malloc(sizeof(float) * ldx * (size_t)T);
        for (size_t j = 0; j < ldx * (size_t)T; j++) {
            seed = seed * 1664525u + 1013904223u;
            hx[j] = (float)((int)(seed >> 9) - (1 << 22)) * 0x1p-22f;
        }
        ny[i] = sizeof(float) * ldy * (size_t)T;
        m[i] = (cudak_mm){.w = w, .x = dput(hx, sizeof(float) * ldx * (size_t)T), .ldx = ldx, .ldy = ldy,
                          .r0 = r0, .r1 = rows, .T = T};
        free(hx);
        ref[i] = malloc(ny[i]);
        got[i] = malloc(ny[i]);
        memset(ref[i], 0, ny[i]);
        float *dy = dput(ref[i], ny[i]);
        cudak_matmul(&m[i].w, m[i].r0, m[i].r1, m[i].x, ldx, T, dy, ldy, NULL);
        dget(ref[i], dy, ny[i]);
        memset(got[i], 0, ny[i]);
        m[i].y = dput(got[i], ny[i]);
    }
    cudak_matmul_set(m, N, NULL);
    int bad = -1;
    for (int i = 0; i < N; i++) {
        dget(got[i], m[i].y, ny[i]);
        if (bad < 0 && memcmp(got[i], ref[i], ny[i]))
            bad = i;
        cudaFree((void *)m[i].x);
        dmat_free(&m[i].w);
        free(ref[i]);
    }
    CHECKF(bad < 0, "product %d of the set differs from its own cudak_matmul", bad);
    /* GLU over spans of got[*] rows, against cudak_glu over the whole buffer's spans one by one */
    enum { L = 4096 };
    float hg[L], hu[L], want[L], have[L];
    for (int j = 0; j < L; j++) {
        hg[j] = got[j % N][j % 64] * 300.0f;
        hu[j] = got[(j + 1) % N][j % 60];
    }
    int off[N], len[N];
    for (int i = 0; i < N; i++) {
        off[i] = i * 100;
        len[i] = i % 5 == 4 ? 0 : 37 + i;
    }
    float *dg = dput(hg, sizeof hg), *du = dput(hu, sizeof hu);
    for (int i = 0; i < N; i++)
        cudak_glu(KERN_GLU_SWIGLU, dg + off[i], du + off[i], len[i], 0.0f, 0.0f, NULL);
    dget(want, dg, sizeof want);
    dg = dput(hg, sizeof hg);
    cudak_glu_set(KERN_GLU_SWIGLU, dg, du, off, len, N, 0.0f, 0.0f, NULL);
    dget(have, dg, sizeof have);
    cudaFree(du);
    for (int i = 0; i < N; i++)
        free(got[i]);
    CHECK(!memcmp(want, have, sizeof want));
}

/* an oracle case's model (test data) with an engine on each device */
typedef struct pair {
    model m;
    int loaded;
    engine *cpu, *gpu;
} pair;

static int pair_open(pair *p, const char *name, errbuf *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", test_data("oracle"), name);
    memset(p, 0, sizeof *p);
    if (model_load(&p->m, dir, err) != 0)
        return -1;
    p->loaded = 1;
    p->cpu = dev_engine(&p->m, "cpu", err);
    p->gpu = p->cpu ? dev_engine(&p->m, "cuda", err) : NULL;
    return p->gpu ? 0 : -1;
}

/* token v of a test sequence (0 when the model did not load: no vocabulary to take it modulo) */
static int32_t pair_token(const pair *p, long v)
{
    return p->loaded ? (int32_t)(v % p->m.hp.vocab) : 0;
}

static void pair_close(pair *p)
{
    engine_free(p->gpu);
    engine_free(p->cpu);
    if (p->loaded)
        model_free(&p->m);
}

/* Every position's logits of a 40-token sequence (two KV chunks' worth of rows would need 257:
 * the chunk walk is covered by cuda_backend_long_context), in passes of 1, 7 and 40 tokens on the
 * GPU, against one CPU run: the same bits for every chunking. */
static void gpu_case(const char *name)
{
    NEED_GPU();
    errbuf err;
    pair P;
    int opened = pair_open(&P, name, &err) == 0;
    const model *mp = &P.m;
    engine *cpu = P.cpu, *gpu = opened ? P.gpu : NULL;
    enum { N = 40 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = pair_token(&P, i * 7919 + 17);
    size_t V = (size_t)mp->hp.vocab;
    int on_gpu = gpu && gpu->be == &backend_cuda && gpu->be_dev; /* not the CPU behind another name */
    float *want = gpu ? tu_eval_engine(cpu, ids, N, N, &err) : NULL;
    static const int chunks[] = {1, 7, N};
    int bad_chunk = -1;
    for (size_t c = 0; want && c < sizeof chunks / sizeof chunks[0] && bad_chunk < 0; c++) {
        float *got = tu_eval_engine(gpu, ids, N, chunks[c], &err);
        if (!got || memcmp(got, want, sizeof(float) * N * V))
            bad_chunk = chunks[c];
        free(got);
    }
    int ok = gpu && want;
    free(want);
    pair_close(&P);
    CHECKF(ok, "%s: %s", name, err.msg);
    CHECKF(on_gpu, "%s: the engine asked for --device cuda does not run on the CUDA backend", name);
    CHECKF(bad_chunk < 0, "%s: the GPU's logits in passes of %d differ from the CPU's (%s)", name, bad_chunk,
           err.msg);
}

TEST(cuda_backend_qwen3_a) { gpu_case("qwen3-a"); }
TEST(cuda_backend_qwen3_h) { gpu_case("qwen3-h"); }
TEST(cuda_backend_qwen3_moe_a) { gpu_case("qwen3_moe-a"); }
TEST(cuda_backend_qwen3_moe_h) { gpu_case("qwen3_moe-h"); }
TEST(cuda_backend_deepseek_v3_a) { gpu_case("deepseek_v3-a"); }
TEST(cuda_backend_deepseek_v3_fp8) { gpu_case("deepseek_v3-fp8"); }
TEST(cuda_backend_deepseek_v3_fp8_h) { gpu_case("deepseek_v3-fp8-h"); }
TEST(cuda_backend_deepseek_v3_yarn) { gpu_case("deepseek_v3-yarn"); }
TEST(cuda_backend_kimi_k2_int4) { gpu_case("kimi_k2-int4"); }
TEST(cuda_backend_kimi_k2_int4_h) { gpu_case("kimi_k2-int4-h"); }
TEST(cuda_backend_kimi_linear_a) { gpu_case("kimi_linear-a"); }
TEST(cuda_backend_kimi_linear_h) { gpu_case("kimi_linear-h"); }
TEST(cuda_backend_kimi_k3_a) { gpu_case("kimi_k3-a"); }
TEST(cuda_backend_kimi_k3_b) { gpu_case("kimi_k3-b"); }
TEST(cuda_backend_kimi_k3_h) { gpu_case("kimi_k3-h"); }
TEST(cuda_backend_default_k3) { gpu_case("default-k3"); } /* the bundled, trained model */

/* 300 positions: the cache's second chunk, a session grown past its first 256 rows */
TEST(cuda_backend_long_context)
{
    NEED_GPU();
    errbuf err;
    pair P;
    int opened = pair_open(&P, "qwen3-a", &err) == 0;
    const model *mp = &P.m;
    engine *cpu = P.cpu, *gpu = opened ? P.gpu : NULL;
    enum { N = 300 };
    int32_t *ids = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
        ids[i] = pair_token(&P, i * 31 + 5);
    float *want = gpu ? tu_eval_engine(cpu, ids, N, 64, &err) : NULL;
    float *got = want ? tu_eval_engine(gpu, ids, N, 64, &err) : NULL;
    int same = got && !memcmp(got, want, sizeof(float) * N * (size_t)mp->hp.vocab);
    free(ids);
    free(want);
    free(got);
    pair_close(&P);
    CHECKF(same, "300 positions on the GPU differ from the CPU's (%s)", err.msg);
}

/* A drafter's verify pass kept in part: passes of 6, each committing 4 (KDA's state replayed from
 * the commit log on the GPU, attention caches truncated), then the next pass starting from the kept
 * positions; every kept position's logits are the CPU's cold run's, to the bit. A checkpoint
 * restored by session_sync (host copies of the device's state) gives the same bits too. */
static void commit_case(const char *name)
{
    NEED_GPU();
    errbuf err;
    pair P;
    int opened = pair_open(&P, name, &err) == 0;
    const model *mp = &P.m;
    engine *cpu = P.cpu, *gpu = opened ? P.gpu : NULL;
    enum { N = 30, PASS = 6, KEEP = 4 };
    int32_t ids[N + PASS];
    for (int i = 0; i < N + PASS; i++)
        ids[i] = pair_token(&P, (long)i * 104729 + 3);
    size_t V = (size_t)mp->hp.vocab;
    float *want = gpu ? tu_eval_engine(cpu, ids, N + PASS, N + PASS, &err) : NULL;
    session *s = want ? tu_session(gpu, N + PASS, PASS, &err) : NULL;
    int bad_pos = -1, n = 0;
    while (s && n < N && bad_pos < 0) {
        session_pass p = {.tokens = ids + n, .T = PASS, .n_logits = PASS};
        if (session_run(s, &p, &err) != 0 || session_commit(s, KEEP, &err) != 0) {
            bad_pos = n;
            break;
        }
        for (int t = 0; t < KEEP && bad_pos < 0; t++)
            if (memcmp(session_logits(s, t), want + (size_t)(n + t) * V, V * sizeof(float)))
                bad_pos = n + t;
        n += KEEP;
    }
    /* back to a shorter prefix and forward again: the sync's own restart from position 0 */
    int synced = s && bad_pos < 0 && session_sync(s, ids, 10, &err) == 0 && session_last_logits(s) &&
                 !memcmp(session_last_logits(s), want + 9 * V, V * sizeof(float));
    int refused = 0;
    if (s) { /* session files hold host memory: refused on the GPU, with a reason */
        char path[4200];
        snprintf(path, sizeof path, "%s/gpu.session", test_tmpdir());
        errbuf e2;
        refused = session_save(s, path, &e2) == -1 && strstr(e2.msg, "--device cuda") && !strchr(e2.msg, '\n');
    }
    session_free(s);
    free(want);
    pair_close(&P);
    CHECKF(s, "%s: %s", name, err.msg);
    CHECKF(bad_pos < 0, "%s: position %d after commits on the GPU differs from the CPU's cold run (%s)", name,
           bad_pos, err.msg);
    CHECKF(synced, "%s: a sync back to 10 tokens on the GPU differs from the CPU (%s)", name, err.msg);
    CHECKF(refused, "%s: session_save of a GPU session was not refused with a reason", name);
}

TEST(cuda_backend_commit_kimi_k3) { commit_case("kimi_k3-a"); }
TEST(cuda_backend_commit_kimi_linear) { commit_case("kimi_linear-a"); }
TEST(cuda_backend_commit_qwen3) { commit_case("qwen3-a"); }

/* a GPU engine over store st with a VRAM budget of `budget` bytes, and its expert slots in *slots
 * (NULL when the budget holds fewer than two) */
static engine *gpu_over(const model *m, store *st, uint64_t budget, int *slots, errbuf *err)
{
    engine_opts o;
    engine_opts_default(&o);
    o.threads = 2;
    o.device = "cuda";
    o.vram_budget = budget;
    engine *e = NULL;
    if (engine_wrap(m, st, &o, &e, err) != 0)
        return NULL;
    uint64_t hits, misses;
    int pinned;
    backend_cuda_stats(e->be_dev, &hits, &misses, slots, &pinned);
    return e;
}

/* A weight store over oracle case `name` (m loaded from it) that keeps every spine resident and
 * `ram_experts(&m->hp)` expert slots' worth of RAM besides (the planner rounds); with on_device,
 * planned for a device that holds the layer spines (store_cfg.spines_on_device: the budget is the
 * globals and the experts). NULL with err set when it cannot open. *X, *spine: the largest
 * expert's and the spines' bytes. */
static store *oracle_store_for(const char *name, model *m, int (*ram_experts)(const hparams *), int prefetch,
                               int on_device, uint64_t *X, uint64_t *spine, errbuf *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", test_data("oracle"), name);
    if (model_load(m, dir, err) != 0)
        return NULL;
    blob_table bt;
    if (blob_table_build(&bt, m, err) != 0) {
        model_free(m);
        return NULL;
    }
    *X = bt.max_expert;
    *spine = bt.spine_bytes;
    store_cfg c;
    memset(&c, 0, sizeof c);
    io_cfg_default(&c.io);
    c.ram_budget = (on_device ? bt.b[bt.global_blob].size : *spine) + (uint64_t)ram_experts(&m->hp) * (*X + 4096);
    c.spines_on_device = on_device;
    c.verify = 1;
    c.prefetch = prefetch; /* the GPU's router lookahead (cuda_guess) then starts reads */
    store *st = NULL;
    if (store_open(&st, m, &bt, NULL, &c, err) != 0) {
        model_free(m);
        return NULL;
    }
    return st;
}

static store *oracle_store(const char *name, model *m, int (*ram_experts)(const hparams *), int prefetch,
                           uint64_t *X, uint64_t *spine, errbuf *err)
{
    return oracle_store_for(name, m, ram_experts, prefetch, 0, X, spine, err);
}

static int two_layers_and_four(const hparams *hp) { return 2 * hp->top_k + 4; }

/* n token ids spread over the vocabulary (the store cases' input) */
static void spread_ids(int32_t *ids, int n, int vocab)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 6151 + 11) % vocab);
}

/* The VRAM tier: a weight store keeps every spine in RAM and streams the routed experts; the GPU
 * holds the spines and a cache of a few experts (--vram-budget: the spine and about four expert
 * slots, far below the model's experts), refilled least recently used first. The logits are the
 * resident CPU's, to the bit, in passes of 1 and 5; the cache missed more often than it has slots
 * (so slots were refilled). */
static void vram_case(const char *name, int prefetch)
{
    NEED_GPU();
    errbuf err;
    model m;
    uint64_t X, spine;
    store *st = oracle_store(name, &m, two_layers_and_four, prefetch, &X, &spine, &err);
    CHECKF(st, "%s: %s", name, err.msg);
    int slots = 0;
    engine *cpu = dev_engine(&m, "cpu", &err);
    engine *gpu = cpu ? gpu_over(&m, st, spine + spine / 8 + 4 * (X + 4096), &slots, &err) : NULL;
    enum { N = 24 };
    int32_t ids[N];
    spread_ids(ids, N, m.hp.vocab);
    size_t V = (size_t)m.hp.vocab;
    float *want = gpu ? tu_eval_engine(cpu, ids, N, N, &err) : NULL;
    float *g1 = want ? tu_eval_engine(gpu, ids, N, 1, &err) : NULL;
    float *g5 = g1 ? tu_eval_engine(gpu, ids, N, 5, &err) : NULL;
    float *gn = g5 ? tu_eval_engine(gpu, ids, N, N, &err) : NULL; /* experts of more than 8 positions */
    int same = gn && !memcmp(g1, want, sizeof(float) * N * V) && !memcmp(g5, want, sizeof(float) * N * V) &&
               !memcmp(gn, want, sizeof(float) * N * V);
    uint64_t hits = 0, misses = 0;
    int pinned = 0;
    store_stats ss = {0};
    if (gpu) {
        backend_cuda_stats(gpu->be_dev, &hits, &misses, &slots, &pinned);
        store_stats_get(st, &ss);
    }
    int all = m.hp.n_layers * m.hp.n_experts;
    free(want);
    free(g1);
    free(g5);
    free(gn);
    engine_free(gpu);
    engine_free(cpu);
    store_free(st);
    model_free(&m);
    CHECKF(gpu, "%s: %s", name, err.msg);
    CHECKF(same, "%s: the GPU with streamed experts differs from the resident CPU (%s)", name, err.msg);
    CHECKF(slots > 0 && slots < all && misses > (uint64_t)slots, /* evicted and refilled */
           "%s: %d VRAM slots of %d experts, %llu hits, %llu misses", name, slots, all, (unsigned long long)hits,
           (unsigned long long)misses);
    CHECKF(pinned, "%s: the store's slot memory was not registered with the GPU", name);
    CHECKF(!prefetch || ss.prefetch_reads > 0, "%s: the router lookahead started no reads", name);
}

/* VRAM and RAM hold different experts: with V VRAM slots and R RAM slots, each below the model's
 * experts but together more than all of them (V + R >= all + 2 top_k: room for a layer's pinned
 * ones), the second run of the same tokens reads nothing from the drive. The GPU's dropped experts
 * went back into RAM (weight_src.adopt) and RAM made room with the ones the GPU holds
 * (weight_src.held); with two caches that each kept what they last saw, a second run rereads
 * what neither kept. The logits stay the resident CPU's. */
/* the routed experts of all MoE layers */
static int routed_experts(const hparams *hp)
{
    int all = 0;
    for (int i = 0; i < hp->n_layers; i++)
        all += hp->ffn_kind[i] == FFN_MOE ? hp->n_experts : 0;
    return all;
}

static int half_and_two_layers(const hparams *hp) { return routed_experts(hp) / 2 + 2 * hp->top_k; }

static void exclusive_case(const char *name)
{
    NEED_GPU();
    errbuf err;
    model m;
    uint64_t X, spine;
    store *st = oracle_store(name, &m, half_and_two_layers, 0, &X, &spine, &err);
    CHECKF(st, "%s: %s", name, err.msg);
    int all = routed_experts(&m.hp), K = m.hp.top_k, R = store_slots(st);
    engine *cpu = dev_engine(&m, "cpu", &err), *gpu = NULL;
    /* the least VRAM budget that gives all - R + 3 top_k slots (below all), found by bisection:
     * what a slot takes on the device is the backend's business */
    int want_v = all - R + 3 * K < all ? all - R + 3 * K : all - 1, V = 0;
    uint64_t lo = spine, hi = spine + spine / 2 + (uint64_t)all * 2 * (X + 4096);
    while (cpu && lo + 4096 < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        engine *e = gpu_over(&m, st, mid, &V, &err);
        if (e && V >= want_v)
            hi = mid;
        else
            lo = mid;
        engine_free(e);
    }
    if (cpu)
        gpu = gpu_over(&m, st, hi, &V, &err);
    enum { N = 24 };
    int32_t ids[N];
    spread_ids(ids, N, m.hp.vocab);
    size_t Vb = (size_t)m.hp.vocab;
    float *want = gpu ? tu_eval_engine(cpu, ids, N, N, &err) : NULL;
    float *g1 = want ? tu_eval_engine(gpu, ids, N, 1, &err) : NULL;
    store_stats s1 = {0}, s2 = {0};
    if (g1) {
        store_stats_get(st, &s1);
        store_stats_reset(st);
    }
    float *g2 = g1 ? tu_eval_engine(gpu, ids, N, 1, &err) : NULL;
    if (g2)
        store_stats_get(st, &s2);
    int same = g2 && !memcmp(g1, want, sizeof(float) * N * Vb) && !memcmp(g2, want, sizeof(float) * N * Vb);
    free(want);
    free(g1);
    free(g2);
    engine_free(gpu);
    engine_free(cpu);
    store_free(st);
    model_free(&m);
    CHECKF(gpu, "%s: %s", name, err.msg);
    CHECKF(same, "%s: the GPU over VRAM and RAM differs from the resident CPU (%s)", name, err.msg);
    CHECKF(V < all && R < all && V + R >= all + 2 * K, "%s: %d VRAM and %d RAM slots for %d experts", name, V, R,
           all);
    CHECKF(s2.reads == 0, "%s: the second run read %llu experts from the drive (%d VRAM, %d RAM slots, %d experts; "
           "%llu adopted in the first run)", name, (unsigned long long)s2.reads, V, R, all,
           (unsigned long long)s1.adopted);
    CHECKF(s1.adopted > 0, "%s: the first run's dropped experts never went back into RAM", name);
}

/* The spines live in VRAM, so a store planned for the device (STORE_PLAN_DEVICE) spends a RAM
 * budget below the spines on the globals and experts alone, which the RAM plan cannot open without
 * streaming spines (the device refuses that); once the GPU holds them, RAM lets their pages go. The
 * logits are the resident CPU's, in passes of 1 and 5. */
static void ram_below_spines_case(const char *name)
{
    NEED_GPU();
    errbuf err;
    model m;
    uint64_t X, spine;
    store *st = oracle_store_for(name, &m, two_layers_and_four, 0, 1, &X, &spine, &err);
    CHECKF(st, "%s: %s", name, err.msg);
    const store_plan *p = store_plan_get(st);
    int below = p->budget < spine, slots = 0;
    engine *cpu = dev_engine(&m, "cpu", &err), *gpu = NULL;
    enum { N = 12 };
    int32_t ids[N];
    spread_ids(ids, N, m.hp.vocab);
    size_t Vb = (size_t)m.hp.vocab;
    float *want = cpu ? tu_eval_engine(cpu, ids, N, N, &err) : NULL;
    if (want)
        gpu = gpu_over(&m, st, spine + spine / 2 + 4 * (X + 4096), &slots, &err);
    uint64_t gone = gpu ? gpu->spines_released : 0;
    float *g1 = gpu ? tu_eval_engine(gpu, ids, N, 1, &err) : NULL;
    float *g5 = g1 ? tu_eval_engine(gpu, ids, N, 5, &err) : NULL;
    int same = g5 && !memcmp(g1, want, sizeof(float) * N * Vb) && !memcmp(g5, want, sizeof(float) * N * Vb);
    free(want);
    free(g1);
    free(g5);
    engine_free(gpu);
    engine_free(cpu);
    store_free(st);
    model_free(&m);
    CHECKF(gpu, "%s: %s", name, err.msg);
    CHECKF(below, "%s: the budget holds the spines; the case proves nothing", name);
    CHECKF(same, "%s: the GPU over a device-planned store differs from the resident CPU (%s)", name, err.msg);
    CHECKF(gone > 0, "%s: RAM kept every spine page", name);
}

TEST(cuda_backend_ram_below_spines_kimi_k3) { ram_below_spines_case("kimi_k3-a"); }
TEST(cuda_backend_ram_below_spines_kimi_k2_int4) { ram_below_spines_case("kimi_k2-int4"); }
TEST(cuda_backend_vram_ram_exclusive_kimi_k3) { exclusive_case("kimi_k3-a"); }
TEST(cuda_backend_vram_ram_exclusive_qwen3_moe) { exclusive_case("qwen3_moe-a"); }
TEST(cuda_backend_vram_tier_kimi_k3) { vram_case("kimi_k3-a", 0); }
TEST(cuda_backend_vram_tier_lookahead_kimi_k3) { vram_case("kimi_k3-a", 1); }
TEST(cuda_backend_vram_tier_qwen3_moe) { vram_case("qwen3_moe-a", 0); }
TEST(cuda_backend_vram_tier_kimi_k2_int4) { vram_case("kimi_k2-int4", 0); }

/* ---- drafting on the GPU ---- */

enum { GMAX = 48 };
typedef struct grun {
    int32_t ids[GMAX];
    float *logits; /* [GMAX][V] the logits each emitted token was decided from */
    int n, V;
} grun;

static int g_token(void *ud, int32_t id)
{
    grun *r = ud;
    if (r->n < GMAX)
        r->ids[r->n] = id;
    r->n++;
    return 0;
}

static void g_logits(void *ud, int64_t pos, const float *lg)
{
    grun *r = ud;
    (void)pos;
    if (r->n < GMAX)
        memcpy(r->logits + (size_t)r->n * r->V, lg, sizeof(float) * (size_t)r->V);
}

/* greedy generation of GMAX tokens after prompt on e, with the n-gram drafter guessing `fixed`
 * tokens every step (verify passes kept in part: KDA's log replayed) or without drafting */
static int g_generate(engine *e, const int32_t *prompt, int np, int draft, grun *r, errbuf *err)
{
    session *s = tu_session(e, np + GMAX + 16, 16, err);
    drafter *d = NULL;
    draft_ctx dc = {.target = e, .context = np + GMAX + 16};
    sampler sm;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = 0.0f;
    int rc = -1;
    if (s && (!draft || draft_ngram_new(&dc, &d, err) == 0) && sampler_init(&sm, &sc, r->V, err) == 0) {
        gen_req rq = {.prompt = prompt, .n_prompt = np, .max_new = GMAX, .drafters = &d, .n_drafters = draft ? 1 : 0,
                      .draft_max = 4, .fixed = draft};
        gen_stats st;
        r->n = 0;
        rc = gen_run(s, &sm, &rq, g_token, g_logits, r, &st, err);
        sampler_free(&sm);
    }
    if (d)
        draft_close(&d, 1);
    session_free(s);
    return rc;
}

/* Drafted greedy output on the GPU is the CPU's plain decode, token for token and logit for logit
 * (a repetitive prompt, so the n-gram drafter's guesses are partly kept). */
static void draft_case(const char *name)
{
    NEED_GPU();
    errbuf err;
    pair P;
    int opened = pair_open(&P, name, &err) == 0;
    enum { NP = 36 };
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++)
        prompt[i] = pair_token(&P, (i % 9) * 7919 + 5); /* a phrase of 9, four times */
    size_t V = opened ? (size_t)P.m.hp.vocab : 1;
    grun a = {.V = (int)V, .logits = malloc(sizeof(float) * GMAX * V)};
    grun b = {.V = (int)V, .logits = malloc(sizeof(float) * GMAX * V)};
    int ok = opened && g_generate(P.cpu, prompt, NP, 0, &a, &err) == 0 && g_generate(P.gpu, prompt, NP, 1, &b, &err) == 0;
    int same = ok && a.n == GMAX && b.n == GMAX && !memcmp(a.ids, b.ids, sizeof a.ids) &&
               !memcmp(a.logits, b.logits, sizeof(float) * GMAX * V);
    free(a.logits);
    free(b.logits);
    pair_close(&P);
    CHECKF(ok, "%s: %s", name, err.msg);
    CHECKF(same, "%s: drafted generation on the GPU differs from a plain CPU decode", name);
}

TEST(cuda_backend_draft_kimi_k3) { draft_case("kimi_k3-a"); }
TEST(cuda_backend_draft_qwen3_moe) { draft_case("qwen3_moe-a"); }
