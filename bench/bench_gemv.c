/* bench_gemv.c — decode-shaped GEMV (one activation row times a weight matrix) for BF16 and
 * MXFP4 at K3's shapes (7168 -> 12288 and 12288 -> 7168; the experts' 3584 -> 3072 and
 * 3072 -> 3584), on 1 and 2 threads: GB/s of weights streamed, GFLOPS, and the ratio to the read
 * bandwidth this same program measures (the better of a plain and a paged, prefetching streaming
 * read of a buffer far larger than the caches, see read_range). The GEMVs of a round read every
 * matrix of a rotating set larger than the caches once, so the weights come from DRAM as in real
 * decode; rounds alternate with a round of the read measurement, and both figures are medians
 * over the rounds (see bench_shape).
 *
 * With --tokens T (T > 1: prefill- and verify-shaped, T activation rows per call) the ratio is to
 * the FMA peak the same rounds measure instead (fma_once), and for T <= 8 also to the read
 * bandwidth (from a separate read round), since a verify pass should stream its weights once.
 * The rotating set is then 1 GiB / T (at least 64 MiB, still far beyond the caches) so that a
 * round stays short at T = 512.
 *
 * usage: bench_gemv [--kernels auto|scalar|avx2|avx512] [--seconds S] [--shape ROWSxCOLS] [--in-cache]
 *                   [--tokens T] [--formats bf16,mxfp4,int4,fp8,f16,f32]
 * (--shape: any shape, columns a multiple of 128; --in-cache: see bench_shape)
 * Prints a Markdown table. Timing only; never part of a pass/fail test.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/rng.h"
#include "base/timer.h"
#include "kernels/kern.h"

enum { SET_BYTES = 1 << 30 }; /* 1 GiB of distinct matrices per shape: far beyond any cache */

/* Page-aligned, as the store's blobs are (4 KiB-aligned in DFSP), so that the kernels' per-page
 * passes (kern_matmul.inc) line up with pages here as they do there. */
static void *big_alloc(size_t len) { return aligned_alloc(4096, (len + 4095) / 4096 * 4096); }

struct read_job {
    const uint8_t *buf;
    size_t len;
    int paged;
    uint64_t sink[64];
};

/* Sums n bytes at p (a multiple of 4 KiB); with `paged`, page by page, each page's lines
 * prefetched while the one before it is read (on the Xeon host this VM moved to, 2026-12-01, that
 * read 17-18 GB/s on one core and 30-32 on two, against 15 and 22-29 for the plain stream: the
 * hardware streamer alone keeps too few lines in flight there, and the kernels prefetch, so a
 * plain stream would understate the limit they are held to). */
__attribute__((target("avx2"))) static uint64_t read_range(const uint8_t *p, size_t n, int paged)
{
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256(), c = _mm256_setzero_si256(),
            d = _mm256_setzero_si256();
    for (size_t i = 0; i + 128 <= n; i += 128) {
        if (paged && i + 4096 < n) {
            _mm_prefetch((const char *)(p + i + 4096), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i + 4096 + 64), _MM_HINT_T0);
        }
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t s[4];
    _mm256_storeu_si256((__m256i *)s, a);
    return s[0] + s[1] + s[2] + s[3];
}

static void read_part(void *ctx, int b, int e, int tid)
{
    struct read_job *j = ctx;
    size_t chunk = j->len / 64;
    for (int i = b; i < e; i++)
        j->sink[i] = read_range(j->buf + (size_t)i * chunk, chunk, j->paged);
}

/* The read bandwidth of this moment: the better of one plain and one paged streaming read of the
 * whole buffer with the pool's threads, GB/s. */
static double read_once(pool *p, struct read_job *j)
{
    double best = 0;
    for (j->paged = 0; j->paged < 2; j->paged++) {
        double t0 = timer_now();
        pool_for(p, 64, read_part, j);
        double gbs = (double)j->len / (timer_now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

/* The FMA peak of this moment, GFLOPS with the pool's threads: independent chains of vector
 * FMAs on registers, as wide as the kernels' own (16 lanes for avx512, else 8), ten per thread so
 * that latency never binds. */
#define FMA_CHAINS(NAME, TARGET, VEC, SET1, FMADD, ADD, STORE, LANES)                                     \
    __attribute__((target(TARGET))) static float NAME(long n)                                               \
    {                                                                                                       \
        VEC a[10], m = SET1(0.999999f), c = SET1(1e-7f);                                                   \
        for (int k = 0; k < 10; k++)                                                                        \
            a[k] = SET1((float)k);                                                                          \
        for (long i = 0; i < n; i++)                                                                        \
            _Pragma("GCC unroll 10") for (int k = 0; k < 10; k++) a[k] = FMADD(a[k], m, c);                 \
        for (int k = 1; k < 10; k++)                                                                        \
            a[0] = ADD(a[0], a[k]);                                                                         \
        float s[LANES];                                                                                     \
        STORE(s, a[0]);                                                                                     \
        return s[0] + s[LANES - 1];                                                                         \
    }
FMA_CHAINS(fma_chains512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, 16)
FMA_CHAINS(fma_chains256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8)

/* 8 pieces per thread, handed out first come first served, so that a thread that starts late
 * does fewer of them instead of doubling the round (as with read_part's 64). */
enum { FMA_ITERS = 1 << 19, FMA_PIECES = 8 };
struct fma_job {
    int wide;
    float sink[64];
};

static void fma_part(void *ctx, int b, int e, int tid)
{
    struct fma_job *j = ctx;
    (void)tid;
    for (int i = b; i < e; i++)
        j->sink[i % 64] = j->wide ? fma_chains512(FMA_ITERS) : fma_chains256(FMA_ITERS);
}

static double fma_once(pool *p, int wide)
{
    struct fma_job j = {wide, {0}};
    int n = pool_size(p) * FMA_PIECES;
    double t0 = timer_now();
    pool_for(p, n, fma_part, &j);
    return (double)n * FMA_ITERS * 10 * (wide ? 16 : 8) * 2 / (timer_now() - t0) / 1e9;
}

struct mm_job {
    const kern_ops *k;
    const kmat *w;
    const float *x;
    float *y;
    pool *p;
    int T;
};

static void mm_part(void *ctx, int r0, int r1, int tid)
{
    struct mm_job *j = ctx;
    j->k->matmul(j->w, r0, r1, j->x, (size_t)j->w->cols, j->T, j->y + r0, (size_t)j->w->rows,
                 pool_scratch(j->p, tid));
}

static void fill_matrix(rng *r, int fmt, int rows, int cols, uint8_t **data, uint8_t **scale)
{
    size_t db = wfmt_data_bytes(fmt, rows, cols), sb = wfmt_scale_bytes(fmt, rows, cols);
    *data = big_alloc(db);
    *scale = sb ? big_alloc(sb) : NULL;
    /* BF16: trained-weight-like values, N(0, 0.02). Random bit patterns (the fill until 2026-12-01)
     * put a subnormal or a subnormal product in about one 16-wide FMA of five; Intel cores take
     * a microcode assist on each (AMD's do not), which made BF16 three times slower on the Xeon
     * host: a benchmark of subnormals, not of the kernel. */
    if (fmt == WF_BF16 || fmt == WF_F16 || fmt == WF_F32) {
        /* drawn from a table of 4096 normal values: a Box-Muller pair per weight took minutes
         * for a run's gigabytes of matrices */
        static float tab[4096];
        static int filled;
        for (; !filled; filled = 1)
            for (int k = 0; k < 4096; k++)
                tab[k] = (float)(0.02 * rng_normal(r));
        size_t es = fmt == WF_F32 ? 4 : 2;
        for (size_t i = 0; i + 4 * es <= db; i += 4 * es) {
            uint64_t v = rng_next(r);
            for (int k = 0; k < 4; k++) {
                float f = tab[(v >> (12 * k)) & 4095];
                uint16_t h = fmt == WF_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy(*data + i + es * (size_t)k, fmt == WF_F32 ? (const void *)&f : (const void *)&h, es);
            }
        }
    }
    else
        for (size_t i = 0; i < db; i += 8) {
            uint64_t v = rng_next(r);
            memcpy(*data + i, &v, db - i < 8 ? db - i : 8);
        }
    for (size_t i = 0; i < sb; i++)
        (*scale)[i] = (uint8_t)(118 + rng_next(r) % 8);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Rounds alternate one streaming read of the 1 GiB read buffer and one GEMV over every matrix
 * of the 1 GiB rotating set, so numerator and denominator see the same moment of a shared,
 * noisy machine; the table gives the median round of each and their ratio. */
enum { MAX_ROUNDS = 64 };

/* in_cache: the compute ceiling instead: one matrix (small enough for L2, e.g. 256 x 3584) timed
 * over and over, 64 MiB of its weights per round, with no read rounds (no ratio).
 * T > 1: T activation rows per call, and FMA-peak rounds instead of read rounds. */
static void bench_shape(const kern_ops *k, pool *p, struct read_job *rj, int fmt, int rows, int cols,
                        double seconds, int in_cache, int T)
{
    size_t bytes = wfmt_data_bytes(fmt, rows, cols) + wfmt_scale_bytes(fmt, rows, cols);
    size_t set = T > 1 ? (SET_BYTES / (size_t)T > (64u << 20) ? SET_BYTES / (size_t)T : (64u << 20)) : SET_BYTES;
    int nm = in_cache ? 1 : (int)(set / bytes) + 1, reps = in_cache ? (int)((64u << 20) / bytes) + 1 : 1;
    rng r;
    rng_seed(&r, 42);
    kmat *m = calloc((size_t)nm, sizeof *m);
    uint8_t **d = calloc((size_t)nm, sizeof *d), **s = calloc((size_t)nm, sizeof *s);
    for (int i = 0; i < nm; i++) {
        fill_matrix(&r, fmt, rows, cols, &d[i], &s[i]);
        kmat_init(&m[i], fmt, rows, cols, d[i], s[i]);
    }
    float *x = aligned_alloc(64, sizeof(float) * (size_t)cols * T),
          *y = aligned_alloc(64, sizeof(float) * (size_t)rows * T);
    for (int i = 0; i < cols * T; i++)
        x[i] = (float)rng_normal(&r);
    struct mm_job j = {k, NULL, x, y, p, T};
    /* the FMA peak at the kernels' own width; none for tables without FMA (scalar on a CPU
     * without AVX2, NEON) */
    int wide = !strcmp(k->name, "avx512"),
        fma_ok = wide || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
    for (int i = 0; i < nm; i++) { /* warm the page tables, not the caches (the set is 1 GiB) */
        j.w = &m[i];
        pool_for(p, rows, mm_part, &j);
    }
    double rd[MAX_ROUNDS], rb[MAX_ROUNDS], mm[MAX_ROUNDS], t0 = timer_now();
    int n = 0;
    do {
        rd[n] = in_cache ? 0 : T > 1 ? (fma_ok ? fma_once(p, wide) : 0) : read_once(p, rj);
        rb[n] = !in_cache && T > 1 && T <= 8 ? read_once(p, rj) : 0;
        double t1 = timer_now();
        for (int q = 0; q < reps; q++)
            for (int i = 0; i < nm; i++) {
                j.w = &m[i];
                pool_for(p, rows, mm_part, &j);
            }
        mm[n] = (double)bytes * nm * reps / (timer_now() - t1) / 1e9;
        n++;
    } while (n < MAX_ROUNDS && (n < 5 || timer_now() - t0 < seconds));
    double bw = median(rd, n), rbw = median(rb, n), gbs = median(mm, n), per = (double)bytes / gbs / 1e9;
    double gflops = 2.0 * rows * cols * T / per / 1e9;
    printf("| %-6s | %5d x %-5d | %2d | %d | %3d | %8.1f | ", wfmt_table[fmt].name, rows, cols, T, pool_size(p), n,
           per * 1e6);
    if (in_cache || (T > 1 && !fma_ok)) /* no limit measured: no ratio */
        printf("    - | %7.1f | %6.1f |    - |\n", gbs, gflops);
    else if (T > 1 && T <= 8)
        printf("%5.0f | %7.1f | %6.1f | %.2f | %5.1f | %.2f |\n", bw, gbs, gflops, gflops / bw, rbw, gbs / rbw);
    else if (T > 1)
        printf("%5.0f | %7.1f | %6.1f | %.2f |\n", bw, gbs, gflops, gflops / bw);
    else
        printf("%5.1f | %7.1f | %6.1f | %.2f |\n", bw, gbs, gflops, gbs / bw);
    for (int i = 0; i < nm; i++) {
        free(d[i]);
        free(s[i]);
    }
    free(d);
    free(s);
    free(m);
    free(x);
    free(y);
}

/* "bf16,mxfp4,int4,fp8,f16,f32" -> format ids */
static int parse_formats(const char *s, int *fmts, int *nf)
{
    static const struct {
        const char *name;
        int fmt;
    } names[] = {{"bf16", WF_BF16}, {"mxfp4", WF_MXFP4}, {"int4", WF_INT4G32}, {"fp8", WF_FP8B128},
                 {"f16", WF_F16},   {"f32", WF_F32}};
    int n = 0;
    while (*s && n < WF_COUNT) {
        size_t len = strcspn(s, ",");
        int found = -1;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strlen(names[k].name) == len && !strncmp(s, names[k].name, len))
                found = names[k].fmt;
        if (found < 0)
            return -1;
        fmts[n++] = found;
        s += len;
        if (*s == ',')
            s++;
    }
    *nf = n;
    return n > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *kname = NULL;
    double seconds = 2.0;
    int only_r = 0, only_c = 0, in_cache = 0, T = 1, fmts[WF_COUNT] = {WF_BF16, WF_MXFP4}, nf = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            kname = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--in-cache"))
            in_cache = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc && atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 512)
            T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && sscanf(argv[i + 1], "%dx%d", &only_r, &only_c) == 2 &&
                 only_r > 0 && only_c > 0 && only_c % 128 == 0)
            i++;
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc && parse_formats(argv[i + 1], fmts, &nf) == 0)
            i++;
        else {
            fprintf(stderr, "usage: bench_gemv [--kernels NAME] [--seconds S] [--shape ROWSxCOLS] [--in-cache] "
                            "[--tokens 1..512] [--formats bf16,mxfp4,int4,fp8,f16,f32]\n");
            return 2;
        }
    }
    const kern_ops *k = kern_select(kname);
    if (!k) {
        fprintf(stderr, "bench_gemv: kernels '%s' not available here\n", kname);
        return 1;
    }
    static const int shapes[][2] = {{12288, 7168}, {7168, 12288}, {3072, 3584}, {3584, 3072}};
    printf("kernels: %s\n\n", k->name);
    struct read_job rj = {big_alloc(SET_BYTES), SET_BYTES, 0, {0}};
    if (!rj.buf) {
        fprintf(stderr, "bench_gemv: out of memory for the 1 GiB read buffer\n");
        return 1;
    }
    memset((void *)rj.buf, 1, rj.len);
    for (int th = 1; th <= 2; th++) {
        errbuf err;
        printf("threads %d\n\n", th);
        pool *p = pool_new(th, &err);
        if (!p || pool_reserve(p, kern_scratch_floats(only_c > 16384 ? (size_t)only_c : 16384) * sizeof(float), &err) != 0) {
            fprintf(stderr, "bench_gemv: %s\n", err.msg);
            return 1;
        }
        if (T > 1 && T <= 8)
            printf("| format | rows x cols   | tokens | threads | rounds | us/call | FMA peak GFLOPS | weight GB/s "
                   "| GFLOPS | ratio to FMA peak | read GB/s | ratio to read bw |\n");
        else if (T > 1)
            printf("| format | rows x cols   | tokens | threads | rounds | us/call | FMA peak GFLOPS | weight GB/s "
                   "| GFLOPS | ratio to FMA peak |\n");
        else
            printf("| format | rows x cols   | tokens | threads | rounds | us/call | read GB/s | GEMV GB/s | GFLOPS "
                   "| ratio to read bw |\n");
        printf("|--------|---------------|----|---|-----|----------|-------|---------|--------|------|\n");
        for (int f = 0; f < nf; f++)
            if (only_r) /* any shape (cols a multiple of 32) */
                bench_shape(k, p, &rj, fmts[f], only_r, only_c, seconds, in_cache, T);
            else
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                    bench_shape(k, p, &rj, fmts[f], shapes[s][0], shapes[s][1], seconds, in_cache, T);
        printf("\n");
        pool_free(p);
    }
    free((void *)rj.buf);
    return 0;
}
