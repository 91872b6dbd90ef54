/* bench_cuda.cu — the GPU's matrix products against the GPU's own limits, measured in the same run:
 *   HBM bandwidth: a device-to-device copy, bytes read plus bytes written over its time;
 *   FMA peak: a kernel of independent fp32 FMA chains;
 *   cudak_matmul at K3's shapes (rows x cols: 12288 x 7168, 3584 x 3072 and 3072 x 3584), BF16 and
 *   MXFP4, T = 1, 2, 4, 8 as weight bytes read per second over the copy bandwidth, and T = 16, 64,
 *   512 as FLOP/s over the FMA peak (INT4-g32, Kimi K2's expert format, at T <= 8); and for the
 *   expert shapes, 16 matrices in one cudak_matmul_set launch (a MoE layer's experts) at T = 1 .. 8
 *   and 12, 16, 32 (MXFP4 and BF16).
 * Each shape's weights come in enough copies to exceed the L2 cache, used in turn, so that every
 * pass reads HBM. Times are CUDA events around `iters` launches after a warm-up.
 *   usage: bench_cuda [--iters N] [--fmt bf16|mxfp4|int4-g32] [--shape 0|1|2] (that format, that
 *   shape of the three alone) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cuda/cuda_kern.h"
}

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "bench_cuda: %s: %s\n", #x, cudaGetErrorString(e_));                       \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

__global__ void k_fma_peak(float *out, int iters)
{
    float a[8];
    for (int j = 0; j < 8; j++)
        a[j] = (float)(threadIdx.x + j) * 1e-7f;
    const float m = 0.999999f, c = 1e-7f;
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            a[j] = __fmaf_rn(a[j], m, c);
    float s = 0.0f;
    for (int j = 0; j < 8; j++)
        s += a[j];
    if (s == 12345.0f)
        out[0] = s;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* host bytes of a random matrix: BF16 of magnitude about 0.02, or MXFP4 codes with ordinary scales */
static void fill(int fmt, int rows, int cols, uint8_t **data, size_t *db, uint8_t **scale, size_t *sb)
{
    *db = wfmt_data_bytes(fmt, rows, cols);
    *sb = wfmt_scale_bytes(fmt, rows, cols);
    *data = (uint8_t *)malloc(*db);
    *scale = *sb ? (uint8_t *)malloc(*sb) : NULL;
    if (fmt == WF_BF16)
        for (size_t i = 0; i < *db / 2; i++) {
            uint16_t h = (uint16_t)(0x3C00 + rnd() % 0x200) | (uint16_t)((rnd() & 1) << 15); /* ~2^-7 .. 2^-6 */
            memcpy(*data + 2 * i, &h, 2);
        }
    else
        for (size_t i = 0; i < *db; i++)
            (*data)[i] = (uint8_t)rnd();
    if (fmt == WF_INT4G32) /* BF16 group scales of about 2^-7 */
        for (size_t i = 0; i + 1 < *sb; i += 2) {
            uint16_t h = (uint16_t)(0x3C00 + rnd() % 0x80);
            memcpy(*scale + i, &h, 2);
        }
    else
        for (size_t i = 0; i < *sb; i++)
            (*scale)[i] = (uint8_t)(118 + rnd() % 6);
}

static float time_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main(int argc, char **argv)
{
    int iters = 20;
    const char *only = NULL;
    int only_shape = -1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fmt") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            only_shape = atoi(argv[++i]);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* HBM: copy 2 GiB device to device */
    size_t cb = (size_t)2 << 30;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb));
    CK(cudaMalloc(&cbuf, cb));
    CK(cudaMemset(ca, 1, cb));
    CK(cudaMemcpy(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 5; i++)
        CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    double copy_bw = 2.0 * (double)cb * 5 / (time_ms(e0, e1) * 1e-3);
    CK(cudaFree(ca));
    CK(cudaFree(cbuf));
    printf("copy bandwidth (read + write): %.0f GB/s\n", copy_bw / 1e9);

    /* FMA peak */
    float *dout;
    CK(cudaMalloc(&dout, 4));
    int blocks = prop.multiProcessorCount * 8, fiters = 1 << 16;
    k_fma_peak<<<blocks, 256>>>(dout, 1024);
    CK(cudaEventRecord(e0));
    k_fma_peak<<<blocks, 256>>>(dout, fiters);
    CK(cudaEventRecord(e1));
    double peak = 2.0 * 8 * (double)fiters * blocks * 256 / (time_ms(e0, e1) * 1e-3);
    printf("fp32 FMA peak: %.1f TFLOP/s\n", peak / 1e12);

    static const int shapes[][2] = {{12288, 7168}, {3584, 3072}, {3072, 3584}};
    static const int fmts[] = {WF_BF16, WF_MXFP4, WF_INT4G32}; /* INT4 (Kimi K2's experts) at T <= 8 only */
    static const int Ts[] = {1, 2, 4, 8, 16, 64, 512};
    for (int fi = 0; fi < 3; fi++)
        for (int si = 0; si < 3; si++) {
            int fmt = fmts[fi], rows = shapes[si][0], cols = shapes[si][1];
            if ((only && strcmp(only, wfmt_table[fmt].name) != 0) || (only_shape >= 0 && only_shape != si))
                continue;
            uint8_t *hd, *hs;
            size_t db, sb;
            fill(fmt, rows, cols, &hd, &db, &hs, &sb);
            int ncopy = (int)((512u << 20) / (db + sb)) + 1;
            kmat *w = (kmat *)calloc((size_t)ncopy, sizeof(kmat));
            for (int c = 0; c < ncopy; c++) {
                void *dd, *ds = NULL;
                CK(cudaMalloc(&dd, db));
                CK(cudaMemcpy(dd, hd, db, cudaMemcpyHostToDevice));
                if (sb) {
                    CK(cudaMalloc(&ds, sb));
                    CK(cudaMemcpy(ds, hs, sb, cudaMemcpyHostToDevice));
                }
                kmat_init(&w[c], fmt, rows, cols, dd, ds);
            }
            float *x, *y;
            CK(cudaMalloc(&x, (size_t)512 * cols * 4));
            CK(cudaMalloc(&y, (size_t)512 * rows * 4));
            CK(cudaMemset(x, 0, (size_t)512 * cols * 4));
            for (int ti = 0; ti < (fmt == WF_INT4G32 ? 4 : 7); ti++) {
                int T = Ts[ti], n = T >= 64 ? iters / 4 + 1 : iters * 4;
                for (int c = 0; c < ncopy; c++)
                    cudak_matmul(&w[c], 0, rows, x, (size_t)cols, T, y, (size_t)rows, NULL);
                CK(cudaEventRecord(e0));
                for (int i = 0; i < n; i++)
                    cudak_matmul(&w[i % ncopy], 0, rows, x, (size_t)cols, T, y, (size_t)rows, NULL);
                CK(cudaEventRecord(e1));
                double s = time_ms(e0, e1) * 1e-3 / n;
                CK(cudaGetLastError());
                double bw = (double)(db + sb) / s, fl = 2.0 * rows * cols * (double)T / s;
                printf("%-6s %5d x %5d T %3d: %8.1f us  %7.0f GB/s (%.2f of copy)  %6.2f TFLOP/s (%.2f of FMA peak)\n",
                       wfmt_table[fmt].name, rows, cols, T, s * 1e6, bw / 1e9, bw / copy_bw, fl / 1e12, fl / peak);
            }
            /* a MoE layer's way: 16 experts of this shape in one cudak_matmul_set (decode, verify, and
             * prefill, where K3's 896 experts see about 9 tokens each at a 512-token prompt) */
            static const int Tset[] = {1, 2, 4, 8, 12, 16, 32};
            for (int ti = 0; ti < (fmt == WF_INT4G32 ? 4 : 7) && rows < 8192; ti++) {
                enum { NE = 16 };
                int T = Tset[ti], n = iters * 2;
                cudak_mm set[NE];
                auto fill_set = [&](int i) { /* NE T <= 512: x's and y's rows */
                    for (int j = 0; j < NE; j++)
                        set[j] = (cudak_mm){.w = w[(i * NE + j) % ncopy], .x = x + (size_t)j * T * cols,
                                            .ldx = (size_t)cols, .y = y + (size_t)j * T * rows, .ldy = (size_t)rows,
                                            .r0 = 0, .r1 = rows, .T = T};
                };
                fill_set(0);
                cudak_matmul_set(set, NE, NULL);
                CK(cudaEventRecord(e0));
                for (int i = 0; i < n; i++) {
                    fill_set(i);
                    cudak_matmul_set(set, NE, NULL);
                }
                CK(cudaEventRecord(e1));
                double s = time_ms(e0, e1) * 1e-3 / n;
                CK(cudaGetLastError());
                double bw = NE * (double)(db + sb) / s, fl = NE * 2.0 * rows * cols * (double)T / s;
                printf("%-6s %5d x %5d T %3d: %8.1f us  %7.0f GB/s (%.2f of copy)  %6.2f TFLOP/s (%.2f of FMA "
                       "peak)  16 in one launch\n",
                       wfmt_table[fmt].name, rows, cols, T, s * 1e6, bw / 1e9, bw / copy_bw, fl / 1e12, fl / peak);
            }
            for (int c = 0; c < ncopy; c++) {
                CK(cudaFree((void *)w[c].data));
                if (w[c].scale)
                    CK(cudaFree((void *)w[c].scale));
            }
            CK(cudaFree(x));
            CK(cudaFree(y));
            free(w);
            free(hd);
            free(hs);
        }
    return 0;
}
