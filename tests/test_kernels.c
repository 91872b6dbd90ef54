/* test_kernels.c — format decoders against known values, every SIMD kernel against the scalar
 * reference with memcmp (the seq16 contract of kern.h: same bits on every ISA), and kmath.h's
 * functions against libm's double precision (accuracy) and against their own pinned bits (the same
 * on every machine: this file also runs on AArch64 under qemu, see the Makefile's test-neon, and with
 * the GPU's kernels behind a kern_ops table in tests/cuda/test_cuda.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "kernels/kern.h"
#include "kernels/kmath.h"
#include "test.h"
#include "test_kern.h"

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* The kernels' constant-foldable helpers say what the format table says. */
TEST(dtype_table_and_helpers_agree)
{
    for (int f = 0; f < WF_COUNT; f++) {
        const wfmt_info *fi = &wfmt_table[f];
        CHECKF(fi->name && fi->decode && fi->block >= 1 && fi->block_bytes >= 1, "format %d: empty row", f);
        CHECKF(wfmt_nibble(f) == (fi->lanes == WF_LANES_NIBBLE), "%s: wfmt_nibble disagrees", fi->name);
        CHECKF(fi->block > 1 || wfmt_plain_bytes(f) == fi->block_bytes, "%s: wfmt_plain_bytes disagrees", fi->name);
        CHECKF((fi->scale == WF_SCALE_NONE) == (fi->st_scale_suffix == NULL), "%s: scale tensor", fi->name);
        for (int i = 0; i < 64; i++)
            CHECKF(kern_lane(f, i) == (fi->lanes == WF_LANES_NIBBLE ? (i % 32) / 2 : i % 16),
                   "%s: lane of %d", fi->name, i);
        kmat w;
        kmat_init(&w, f, 256, 256, NULL, NULL);
        CHECKF(w.row_bytes == (size_t)(256 / fi->block * fi->block_bytes), "%s: row bytes", fi->name);
        CHECKF((w.scale_stride == 0) == (fi->scale == WF_SCALE_NONE), "%s: scale stride", fi->name);
    }
}

TEST(dtype_mxfp4_table)
{
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++)
        CHECKF(same_bits(e2m1_table[c], want[c]), "code %d", c);
    CHECK(signbit(e2m1_table[8]) && e2m1_table[8] == 0.0f); /* -0 */
    CHECK(e8m0_to_f32(127) == 1.0f);
    CHECK(e8m0_to_f32(128) == 2.0f);
    CHECK(e8m0_to_f32(1) == ldexpf(1.0f, -126));
    CHECK(e8m0_to_f32(0) == ldexpf(1.0f, -127)); /* subnormal float, still exact */
    CHECK(e8m0_to_f32(254) == ldexpf(1.0f, 127));
    CHECK(isnan(e8m0_to_f32(255)));
    /* a packed byte: low nibble = even column */
    uint8_t packed[16] = {0x8F, 0x21}, scale[1] = {126}; /* codes: col0=F(-6) col1=8(-0) col2=1 col3=2 */
    kmat m;
    kmat_init(&m, WF_MXFP4, 1, 32, packed, scale);
    float out[32];
    wfmt_table[WF_MXFP4].decode(&m, 0, 0, 32, out);
    CHECK(out[0] == -3.0f && same_bits(out[1], -0.0f) && out[2] == 0.25f && out[3] == 0.5f);
}

TEST(dtype_e4m3)
{
    CHECK(e4m3_to_f32(0x00) == 0.0f && !signbit(e4m3_to_f32(0x00)));
    CHECK(e4m3_to_f32(0x80) == 0.0f && signbit(e4m3_to_f32(0x80)));
    CHECK(e4m3_to_f32(0x01) == ldexpf(1.0f, -9)); /* smallest subnormal */
    CHECK(e4m3_to_f32(0x07) == 7.0f * ldexpf(1.0f, -9));
    CHECK(e4m3_to_f32(0x08) == ldexpf(1.0f, -6)); /* smallest normal */
    CHECK(e4m3_to_f32(0x38) == 1.0f);
    CHECK(e4m3_to_f32(0x7E) == 448.0f);
    CHECK(e4m3_to_f32(0xFE) == -448.0f);
    CHECK(isnan(e4m3_to_f32(0x7F)) && isnan(e4m3_to_f32(0xFF)));
    CHECK(e4m3_to_f32(0x77) == 240.0f); /* e=14, m=7: 1.875 * 2^7 */
}

TEST(dtype_int4_signs)
{
    /* word 0 holds columns 0..7 low nibble first; nibble u means u - 8 */
    uint32_t words[4] = {0x76543210u, 0xFEDCBA98u, 0, 0};
    uint16_t scale[1] = {0x3F80}; /* bf16 1.0 */
    kmat m;
    kmat_init(&m, WF_INT4G32, 1, 32, words, scale);
    float out[32];
    wfmt_table[WF_INT4G32].decode(&m, 0, 0, 32, out);
    for (int c = 0; c < 16; c++)
        CHECKF(out[c] == (float)(c - 8), "col %d: %g", c, out[c]);
    for (int c = 16; c < 32; c++)
        CHECK(out[c] == -8.0f);
}

TEST(dtype_int8_group_scales)
{
    /* columns 0..31 use scale 0 (bf16 0.5), 32..63 scale 1 (bf16 -3.0); codes are two's complement */
    int8_t q[64];
    for (int c = 0; c < 64; c++)
        q[c] = (int8_t)(c < 32 ? c * 8 - 128 : 127 - c);
    uint16_t scale[2] = {0x3F00, 0xC040};
    kmat m;
    kmat_init(&m, WF_INT8G32, 1, 64, q, scale);
    CHECK(m.row_bytes == 64 && m.scale_stride == 4);
    float out[64];
    wfmt_table[WF_INT8G32].decode(&m, 0, 0, 64, out);
    CHECK(out[0] == -64.0f && out[16] == 0.0f && out[31] == 60.0f);
    CHECK(out[32] == -285.0f && out[63] == -192.0f);
    wfmt_table[WF_INT8G32].decode(&m, 0, 40, 41, out);
    CHECK(out[0] == -261.0f);
}

TEST(dtype_f16_bf16)
{
    CHECK(f16_to_f32(0x3C00) == 1.0f);
    CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(isinf(f16_to_f32(0x7C00)) && isnan(f16_to_f32(0x7E00)));
    CHECK(bf16_to_f32(0x3F80) == 1.0f && bf16_to_f32(0xC000) == -2.0f);
    CHECK(f32_to_bf16(1.0f) == 0x3F80);
    CHECK(f32_to_bf16(1.00390625f) == 0x3F80); /* tie rounds to even */
    CHECK(f32_to_bf16(1.01171875f) == 0x3F82);
}

/* Random weights of every format for a rows x cols matrix; returns owned data + scale. */
static void random_matrix(rng *r, int fmt, int rows, int cols, kmat *m, void **data, void **scale)
{
    size_t db = wfmt_data_bytes(fmt, rows, cols), sb = wfmt_scale_bytes(fmt, rows, cols);
    uint8_t *d = malloc(db + 1), *s = sb ? malloc(sb) : NULL;
    for (size_t i = 0; i < db; i++)
        d[i] = (uint8_t)rng_next(r);
    if (fmt == WF_BF16 || fmt == WF_F16 || fmt == WF_F32) { /* finite values near 1 */
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            float v = (float)rng_normal(r);
            if (fmt == WF_F32)
                memcpy(d + 4 * i, &v, 4);
            else if (fmt == WF_BF16) {
                uint16_t h = f32_to_bf16(v);
                memcpy(d + 2 * i, &h, 2);
            } else {
                uint16_t h = (uint16_t)(0x3000 + (rng_next(r) % 0x1000)) | (uint16_t)((rng_next(r) & 1) << 15);
                memcpy(d + 2 * i, &h, 2);
            }
        }
    }
    if (fmt == WF_FP8B128) /* avoid the two NaN codes in the random fill except on purpose */
        for (size_t i = 0; i < db; i++)
            if ((d[i] & 0x7F) == 0x7F && rng_next(r) % 8)
                d[i] ^= 1;
    for (size_t i = 0; i < sb; i++)
        s[i] = (uint8_t)rng_next(r);
    if (fmt == WF_MXFP4) /* mostly ordinary scales; 1 in 8 an E8M0 extreme: 2^-127 (subnormal
                          * values), 2^-126, 2^127 (6 x 2^127 overflows to inf) or 255 (NaN) */
        for (size_t i = 0; i < sb; i++) {
            static const uint8_t extreme[4] = {0, 1, 254, 255};
            uint64_t v = rng_next(r);
            s[i] = v % 8 ? (uint8_t)(110 + (v >> 8) % 30) : extreme[(v >> 8) % 4];
        }
    if (fmt == WF_INT4G32 || fmt == WF_INT8G32)
        for (size_t i = 0; i < sb / 2; i++) {
            uint16_t h = f32_to_bf16((float)(0.01 + 0.1 * fabs(rng_normal(r))));
            memcpy(s + 2 * i, &h, 2);
        }
    if (fmt == WF_FP8B128)
        for (size_t i = 0; i < sb / 4; i++) {
            float v = (float)(0.001 + 0.01 * fabs(rng_normal(r)));
            memcpy(s + 4 * i, &v, 4);
        }
    kmat_init(m, fmt, rows, cols, d, s);
    *data = d;
    *scale = s;
}

/* the same bits, or both NaN (which NaN is not part of the contract: kern.h) */
static int same_out(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_bits(a[i], b[i]) && !(isnan(a[i]) && isnan(b[i])))
            return 0;
    return 1;
}

/* y[t * ldy + rows .. (t + 1) * ldy) were left untouched (still +0) for every token */
static int pads_untouched(const float *y, int rows, size_t ldy, int T)
{
    for (int t = 0; t < T; t++)
        for (size_t i = (size_t)rows; i < ldy; i++)
            if (!same_bits(y[(size_t)t * ldy + i], 0.0f))
                return 0;
    return 1;
}

/* b's matmul against a's on a random matrix and T random tokens; for T > 1 the activations and
 * outputs are strided (ldx > cols, ldy > rows) and the gaps must stay untouched */
static int compare_ops(const kern_ops *a, const kern_ops *b, int fmt, int rows, int cols, int T, uint64_t seed)
{
    rng r;
    rng_seed(&r, seed);
    kmat m;
    void *d, *s;
    random_matrix(&r, fmt, rows, cols, &m, &d, &s);
    size_t ldx = (size_t)cols + (T > 1 ? 5 : 0), ldy = (size_t)rows + (T > 1 ? 3 : 0);
    float *x = malloc(sizeof(float) * (size_t)T * ldx);
    for (size_t i = 0; i < (size_t)T * ldx; i++)
        x[i] = (float)rng_normal(&r);
    float *ya = calloc((size_t)T * ldy, 4), *yb = calloc((size_t)T * ldy, 4);
    float *scratch = aligned_alloc(64, (kern_scratch_floats((size_t)cols) * 4 + 63) / 64 * 64);
    a->matmul(&m, 0, rows, x, ldx, T, ya, ldy, scratch);
    b->matmul(&m, 0, rows, x, ldx, T, yb, ldy, scratch);
    int ok = same_out(ya, yb, (size_t)T * ldy) && pads_untouched(yb, rows, ldy, T);
    /* T = 1 on each token must give the same bits as one T pass (batch invariance) */
    for (int t = 0; t < T && ok; t++) {
        float *y1 = calloc((size_t)rows, 4);
        b->matmul(&m, 0, rows, x + (size_t)t * ldx, ldx, 1, y1, (size_t)rows, scratch);
        ok = same_out(y1, ya + (size_t)t * ldy, (size_t)rows);
        free(y1);
    }
    /* a row range gives the same bits as the full matrix (thread split) */
    if (ok && rows > 2) {
        float *yp = calloc((size_t)T * ldy, 4);
        b->matmul(&m, 1, rows - 1, x, ldx, T, yp, ldy, scratch);
        for (int t = 0; t < T && ok; t++)
            ok = same_out(yp + (size_t)t * ldy, ya + (size_t)t * ldy + 1, (size_t)(rows - 2));
        free(yp);
    }
    free(d);
    free(s);
    free(x);
    free(ya);
    free(yb);
    free(scratch);
    return ok;
}

int kern_test_matmul_case(const kern_ops *k, int fmt, int rows, int cols, int T, uint64_t seed)
{
    return compare_ops(&kern_scalar, k, fmt, rows, cols, T, seed);
}

void kern_test_matches_scalar(const kern_ops *k)
{
    if (!k) {
        test_skip("instruction set not available on this CPU or build");
        return;
    }
    /* At T = 1 rows longer than kern_matmul.inc's MM_KB (4096) run in passes over row blocks of
     * 16, four rows at a time: the last pass may hold only a tail (4099, 4128) or several full
     * passes precede it (8259, 12320); long plain rows come 19 to a matrix so that a second row
     * block follows the first and ends in a group of three (the prefetch offsets change there).
     * At T > 1 rows go in blocks of KERN_RB = 16, 8 on AVX2 (130: eight or sixteen and a block of
     * 2, padded to the tile's rows), columns in blocks of KERN_KC = 256, 512 on AVX2 (tails of a
     * block and of a 16-column vector: 1000, 4099, 8259), tokens in equal groups of at most KERN_TG = 64 (70: 35 + 35) or,
     * for 4-bit rows, of KERN_XF / cols (12320 columns: 42, so 64 goes as 32 + 32 and 70 as
     * 35 + 35), and within a group in tiles of up to 6 tokens (every T from 1 to 8, 13 = 6 + 6 +
     * 1, 25 = 4 x 6 + 1). The GPU's T <= 8 path takes rows of whole 512-column blocks (2048,
     * 1536, 1024), in warps of 8 rows (16 for 4-bit rows at T = 4) and blocks of 2 or 4 warps (3,
     * 5, 131 and 19 rows end in a partial warp, 37 and 131 in a second block). */
    static const int shapes[][2] = {{1, 32},    {3, 64},    {5, 96},    {7, 160},   {2, 224},  {9, 1056},
                                    {130, 256}, {19, 4128}, {2, 12320}, {5, 2048}, {37, 1024}};
    static const int plain_cols[] = {1, 3, 17, 63, 64, 65, 127, 129, 192, 200, 1000, 1536, 4099, 8256, 8259};
    for (int fmt = 0; fmt < WF_COUNT; fmt++) {
        static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 25, 64, 70};
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            if (wfmt_table[fmt].block == 32) {
                for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                    CHECKF(compare_ops(&kern_scalar, k, fmt, shapes[i][0], shapes[i][1], T, 100 + i),
                           "%s %s rows %d cols %d T %d differs from scalar", k->name, wfmt_table[fmt].name,
                           shapes[i][0], shapes[i][1], T);
            } else {
                for (size_t i = 0; i < sizeof plain_cols / sizeof plain_cols[0]; i++) {
                    int rows = fmt == WF_FP8B128 ? 131 : plain_cols[i] > 4096 ? 19 : 3;
                    CHECKF(compare_ops(&kern_scalar, k, fmt, rows, plain_cols[i], T, 200 + i),
                           "%s %s rows %d cols %d T %d differs from scalar", k->name, wfmt_table[fmt].name, rows,
                           plain_cols[i], T);
                }
            }
        }
    }
    /* F32 rows further apart than they are long, as attention's keys are (a cache row holds every
     * head's keys and values, and K3's latent rows are 512 + 64): 37 rows (four groups of eight
     * for dot_rows, and five lone rows), lengths and token counts on both sides of each ISA_DOTS
     * bound, and a range that starts inside the matrix */
    {
        static const int kn[] = {16, 32, 48, 64, 96, 128, 160, 1024, 1040}, kt[] = {1, 2, 3, 6, 7, 12, 16};
        enum { KR = 37, KLD = 1043, KT = 16, KN = 1040 };
        rng kr;
        rng_seed(&kr, 9);
        float *keys = malloc(sizeof(float) * KR * KLD), *q = malloc(sizeof(float) * KT * KN);
        float *ya = malloc(sizeof(float) * KT * KR), *yb = malloc(sizeof(float) * KT * KR);
        float *scratch = aligned_alloc(64, (kern_scratch_floats(KN) * 4 + 63) / 64 * 64);
        int have = keys && q && ya && yb && scratch, bad_n = 0, bad_t = 0;
        for (int i = 0; have && i < KR * KLD; i++)
            keys[i] = (float)rng_normal(&kr);
        for (int i = 0; have && i < KT * KN; i++)
            q[i] = (float)rng_normal(&kr);
        for (size_t ni = 0; have && ni < sizeof kn / sizeof kn[0] && !bad_n; ni++)
            for (size_t ti = 0; ti < sizeof kt / sizeof kt[0] && !bad_n; ti++) {
                kmat m = {.fmt = WF_F32, .rows = KR, .cols = kn[ni], .data = (const uint8_t *)keys,
                          .row_bytes = KLD * sizeof(float)};
                kern_scalar.matmul(&m, 0, KR, q, (size_t)kn[ni], kt[ti], ya, KR, scratch);
                k->matmul(&m, 0, KR, q, (size_t)kn[ni], kt[ti], yb, KR, scratch);
                int same = memcmp(ya, yb, sizeof(float) * (size_t)kt[ti] * KR) == 0;
                k->matmul(&m, 5, KR, q, (size_t)kn[ni], kt[ti], yb, KR, scratch);
                for (int t = 0; t < kt[ti]; t++)
                    same &= memcmp(ya + t * KR + 5, yb + t * KR, sizeof(float) * (KR - 5)) == 0;
                if (!same)
                    bad_n = kn[ni], bad_t = kt[ti];
            }
        free(keys);
        free(q);
        free(ya);
        free(yb);
        free(scratch);
        CHECKF(have, "%s f32 rows apart: out of memory", k->name);
        CHECKF(!bad_n, "%s f32 rows %d apart, cols %d T %d differ from scalar", k->name, (int)KLD, bad_n, bad_t);
    }
    /* dot products of odd lengths */
    rng r;
    rng_seed(&r, 7);
    for (int n = 0; n < 300; n += 7) {
        float a[300], b[300];
        for (int i = 0; i < n; i++) {
            a[i] = (float)rng_normal(&r);
            b[i] = (float)rng_normal(&r);
        }
        float x = kern_scalar.dot(a, b, n), y = k->dot(a, b, n);
        CHECKF(same_bits(x, y), "%s dot n=%d: %a vs %a", k->name, n, x, y);
    }
    /* Products that underflow to -0 (-2^-100 x 2^-60) leave every partial sum -0, and the
     * scalar table's sum of such a row is -0. A tail padded with +0 x +0 would turn a lane past
     * the row's end into +0 (-0 + +0 = +0), and the row into +0 (kern_matmul.inc). Column counts
     * end inside a vector (20, 33, 100) or inside a column block (1000); the tokens take every
     * path (T = 1, fused groups, tiles). */
    static const int tiny_fmts[] = {WF_F32, WF_BF16}, ncols[] = {20, 33, 100, 1000}, ntok[] = {1, 2, 3, 5, 8, 13, 70};
    enum { NR = 5 };
    for (size_t fi = 0; fi < sizeof tiny_fmts / sizeof tiny_fmts[0]; fi++)
        for (size_t ci = 0; ci < sizeof ncols / sizeof ncols[0]; ci++)
            for (size_t ti = 0; ti < sizeof ntok / sizeof ntok[0]; ti++) {
                int fmt = tiny_fmts[fi], cols = ncols[ci], T = ntok[ti];
                size_t es = fmt == WF_F32 ? 4 : 2;
                uint8_t *d = malloc(es * NR * (size_t)cols);
                for (size_t i = 0; i < (size_t)NR * (size_t)cols; i++) {
                    float v = -0x1p-100f;
                    uint16_t h = f32_to_bf16(v);
                    memcpy(d + es * i, fmt == WF_F32 ? (const void *)&v : (const void *)&h, es);
                }
                kmat m;
                kmat_init(&m, fmt, NR, cols, d, NULL);
                float *x = malloc(sizeof(float) * (size_t)T * (size_t)cols);
                for (size_t i = 0; i < (size_t)T * (size_t)cols; i++)
                    x[i] = 0x1p-60f;
                float *y1 = calloc((size_t)T * NR, 4), *y2 = calloc((size_t)T * NR, 4);
                float *scratch = aligned_alloc(64, (kern_scratch_floats((size_t)cols) * 4 + 63) / 64 * 64);
                kern_scalar.matmul(&m, 0, NR, x, (size_t)cols, T, y1, NR, scratch);
                k->matmul(&m, 0, NR, x, (size_t)cols, T, y2, NR, scratch);
                int ok = signbit(y1[0]) && memcmp(y1, y2, sizeof(float) * (size_t)T * NR) == 0;
                float got = y2[0];
                free(d);
                free(x);
                free(y1);
                free(y2);
                free(scratch);
                CHECKF(ok, "%s %s matmul of underflowing products, cols %d T %d: -0 vs %a", k->name,
                       wfmt_table[fmt].name, cols, T, (double)got);
            }
    /* decode_rows is the exact decoder */
    for (int fmt = 0; fmt < WF_COUNT; fmt++) {
        kmat m;
        void *d, *s;
        int cols = wfmt_table[fmt].block == 32 ? 352 : 333;
        random_matrix(&r, fmt, 5, cols, &m, &d, &s);
        float *o1 = malloc(sizeof(float) * 5 * cols), *o2 = malloc(sizeof(float) * 5 * cols);
        kern_scalar.decode_rows(&m, 0, 5, o1);
        k->decode_rows(&m, 0, 5, o2);
        int same = same_out(o1, o2, (size_t)5 * cols); /* which NaN is not part of the contract (kern.h) */
        free(o1);
        free(o2);
        free(d);
        free(s);
        CHECKF(same, "%s decode_rows %s differs", k->name, wfmt_table[fmt].name);
    }
}

TEST(kern_select_picks_available)
{
    CHECK(kern_select("scalar") == &kern_scalar);
    CHECK(kern_select("nonsense") == NULL);
    const kern_ops *best = kern_select(NULL);
    CHECK(best && (best == kern_avx512() || best == kern_avx2() || best == kern_neon() || best == &kern_scalar));
    if (kern_avx512())
        CHECK(best == kern_avx512());
}

TEST(kern_avx2_matches_scalar) { kern_test_matches_scalar(kern_avx2()); }
TEST(kern_avx512_matches_scalar) { kern_test_matches_scalar(kern_avx512()); }
TEST(kern_neon_matches_scalar) { kern_test_matches_scalar(kern_neon()); }

TEST(kern_scalar_dot_is_seq16)
{
    /* the lane and tree order is visible where rounding depends on it: 1e8 + 1 loses the 1
     * within one lane, while a 1 in another lane survives until the tree adds it last */
    float a[40] = {0}, b[40];
    for (int i = 0; i < 40; i++)
        b[i] = 1.0f;
    a[0] = 1e8f;
    a[16] = 1.0f; /* same lane as a[0]: fma(1, 1, 1e8) = 1e8 (1 is lost) */
    a[32] = -1e8f;
    float got = kern_scalar.dot(a, b, 40);
    CHECKF(got == 0.0f, "got %g", got);
    a[16] = 0;
    a[1] = 1.0f; /* a different lane: survives until the tree adds lane 1 to lane 0 at h=1 */
    got = kern_scalar.dot(a, b, 40);
    CHECKF(got == 1.0f, "got %g", got); /* a plain left-to-right sum would give 0 */
    /* a dot is the F32 matrix row's product, bit for bit (attention's scores may be a matmul) */
    rng r;
    rng_seed(&r, 5);
    size_t sf = (kern_scratch_floats(300) + 15) / 16 * 16;
    float *scratch = aligned_alloc(64, sizeof(float) * sf);
    CHECK(scratch);
    int bad = -1;
    float bd = 0, by = 0;
    for (int n = 1; n < 300; n += 7) {
        float u[300], v[300];
        for (int i = 0; i < n; i++) {
            u[i] = (float)rng_normal(&r);
            v[i] = (float)rng_normal(&r);
        }
        kmat m;
        kmat_init(&m, WF_F32, 1, n, u, NULL);
        float y = -1;
        kern_scalar.matmul(&m, 0, 1, v, (size_t)n, 1, &y, 1, scratch);
        float d = kern_scalar.dot(u, v, n);
        if (!same_bits(d, y)) {
            bad = n, bd = d, by = y;
            break;
        }
    }
    free(scratch);
    CHECKF(bad < 0, "n=%d: dot %a, F32 row %a", bad, bd, by);
}

TEST(kern_scalar_matmul_is_seq16)
{
    /* a matrix row has 16 lanes: column 16 shares column 0's lane (its 1 is lost against 1e8),
     * column 1 does not (its 1 survives until the tree's last step); 64 lanes would keep both */
    float w[40] = {0}, x[40];
    for (int i = 0; i < 40; i++)
        x[i] = 1.0f;
    w[0] = 1e8f;
    w[16] = 1.0f;
    w[32] = -1e8f;
    kmat m;
    kmat_init(&m, WF_F32, 1, 40, w, NULL);
    float y = -1, scratch[64];
    kern_scalar.matmul(&m, 0, 1, x, 40, 1, &y, 1, scratch);
    CHECKF(y == 0.0f, "got %g", y);
    w[16] = 0;
    w[1] = 1.0f;
    kern_scalar.matmul(&m, 0, 1, x, 40, 1, &y, 1, scratch);
    CHECKF(y == 1.0f, "got %g", y);
}

static void check_elementwise(const kern_ops *k)
{
    if (!k) {
        test_skip("instruction set not available on this CPU or build");
        return;
    }
    rng r;
    rng_seed(&r, 11);
    for (int n = 1; n < 100; n += 13) {
        float y1[100], y2[100], x[100];
        for (int i = 0; i < n; i++) {
            y1[i] = y2[i] = (float)rng_normal(&r);
            x[i] = (float)rng_normal(&r);
        }
        kern_scalar.axpy(y1, x, 0.37f, n);
        k->axpy(y2, x, 0.37f, n);
        CHECKF(memcmp(y1, y2, sizeof(float) * (size_t)n) == 0, "%s axpy n=%d differs", k->name, n);
    }
    /* dot_rows against the scalar table's dots: runs of 8 and a remainder, lengths with and
     * without a tail (tails of whole vectors too: MLA's rope parts are 32), a row stride wider
     * than the length */
    static const int dlens[] = {1, 7, 16, 20, 24, 30, 32, 48, 64, 100, 128, 200};
    for (size_t li = 0; li < sizeof dlens / sizeof dlens[0]; li++) {
        enum { DROWS = 19, DLDX = 203 };
        int len = dlens[li];
        float q[200], x[DROWS * DLDX], o1[DROWS], o2[DROWS];
        for (int i = 0; i < len; i++)
            q[i] = (float)rng_normal(&r);
        for (int i = 0; i < DROWS * DLDX; i++)
            x[i] = (float)rng_normal(&r);
        for (int s = 0; s < DROWS; s++)
            o1[s] = kern_scalar.dot(q, x + s * DLDX, len);
        k->dot_rows(q, x, DLDX, DROWS, len, o2);
        CHECKF(memcmp(o1, o2, sizeof o1) == 0, "%s dot_rows len=%d differs", k->name, len);
    }
    /* products that underflow to -0 leave every partial sum -0, so the dot is -0 only if the
     * tail leaves the lanes past the end untouched (adding +0 x +0 to them makes them +0) */
    {
        enum { ULEN = 68, UROWS = 9 };
        float q[ULEN], x[UROWS * ULEN], o1[UROWS], o2[UROWS];
        for (int i = 0; i < ULEN; i++)
            q[i] = -0x1p-100f;
        for (int i = 0; i < UROWS * ULEN; i++)
            x[i] = 0x1p-60f;
        for (int s = 0; s < UROWS; s++)
            o1[s] = kern_scalar.dot(q, x + s * ULEN, ULEN);
        k->dot_rows(q, x, ULEN, UROWS, ULEN, o2);
        CHECKF(signbit(o1[0]) && memcmp(o1, o2, sizeof o1) == 0, "%s dot_rows of underflowing products differs",
               k->name);
    }
    /* axpy_rows against the scalar table's axpys one row at a time (lengths through one and two
     * register blocks with tails of every vector count, a row stride wider than the length), for
     * one to three outputs (rows LDY apart, their weights LDA apart), and nothing past each
     * output's length written */
    static const int lens[] = {1, 7, 16, 20, 33, 64, 90, 100, 120, 128, 129, 200, 250, 280};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int ny = 1; ny <= 3; ny++) {
            enum { ROWS = 9, LDX = 311, LDY = 300, LDA = 11 };
            int len = lens[li];
            float y1[3 * LDY], y2[3 * LDY], x[ROWS * LDX], a[3 * LDA]; /* (y2: sentinels past the length) */
            for (int i = 0; i < 3 * LDY; i++)
                y1[i] = y2[i] = i % LDY < len ? (float)rng_normal(&r) : 7.0f;
            for (int i = 0; i < ROWS * LDX; i++)
                x[i] = (float)rng_normal(&r);
            for (int i = 0; i < 3 * LDA; i++)
                a[i] = (float)rng_normal(&r);
            for (int j = 0; j < ny; j++)
                for (int s = 0; s < ROWS; s++)
                    kern_scalar.axpy(y1 + j * LDY, x + s * LDX, a[j * LDA + s], len);
            k->axpy_rows(y2, LDY, a, LDA, ny, x, LDX, ROWS, len);
            CHECKF(memcmp(y1, y2, sizeof y1) == 0, "%s axpy_rows len=%d ny=%d differs (or wrote past a length)",
                   k->name, len, ny);
        }
    static const int dims[] = {16, 32, 64, 128, 24};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int d = dims[di];
        float *S1 = malloc(sizeof(float) * d * d), *S2 = malloc(sizeof(float) * d * d);
        float kv[4][128], al[128], o1[128], o2[128], u[128];
        for (int i = 0; i < d * d; i++)
            S1[i] = S2[i] = (float)rng_normal(&r);
        for (int step = 0; step < 3; step++) { /* a few tokens: the state feeds forward */
            for (int j = 0; j < 4; j++)
                for (int i = 0; i < d; i++)
                    kv[j][i] = (float)rng_normal(&r);
            for (int i = 0; i < d; i++)
                al[i] = 0.5f + 0.5f * rng_uniform(&r);
            kern_scalar.kda_step(S1, d, kv[0], kv[1], kv[2], al, 0.7f, o1, u);
            k->kda_step(S2, d, kv[0], kv[1], kv[2], al, 0.7f, o2, u);
        }
        int same = memcmp(S1, S2, sizeof(float) * d * d) == 0 && memcmp(o1, o2, sizeof(float) * d) == 0;
        free(S1);
        free(S2);
        CHECKF(same, "%s kda_step d=%d differs from scalar", k->name, d);
    }
}

/* The GLU activation and exp_sub of table k against the scalar ones: random inputs of several
 * scales, then bit patterns spread over all of float32 (NaNs, infinities, subnormals) as gates, ups
 * and exp_sub's inputs, at lengths that leave SIMD tails. (NEON's entries are the scalar ones, so
 * there this compares them with themselves; kmath_bits_pinned is what covers AArch64.) */
static void check_glu(const kern_ops *k)
{
    enum { N = 4096 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    rng r;
    rng_seed(&r, 12);
    int bad = 0, bad_act = 0, bad_n = 0;
    for (int round = 0; round < 8 && !bad; round++) {
        float scale = round < 4 ? 0.25f * (float)(1 << (2 * round)) : 1.0f;
        for (int i = 0; i < N; i++) {
            g[i] = round < 4 ? scale * (float)rng_normal(&r) : km_float((uint32_t)(((uint64_t)(round - 4) * N + (uint64_t)i) * 4099u * 257u));
            u[i] = round < 4 ? scale * (float)rng_normal(&r)
                             : km_float((uint32_t)(((uint64_t)i * 4099u + (uint64_t)round) * 2654435761u));
        }
        for (int act = KERN_GLU_SWIGLU; act <= KERN_GLU_SITU && !bad; act++)
            for (int n = N - 13 * round; n > 0 && !bad; n = n > 40 ? n / 3 : n - 7) {
                memcpy(a, g, sizeof(float) * (size_t)n);
                memcpy(b, g, sizeof(float) * (size_t)n);
                kern_scalar.glu(act, a, u, n, 1.4f, 3.0f);
                k->glu(act, b, u, n, 1.4f, 3.0f);
                if (!same_out(a, b, (size_t)n))
                    bad = 1, bad_act = act, bad_n = n;
            }
        for (int n = N - 5 * round; n > 0 && !bad; n = n > 40 ? n / 3 : n - 7) {
            float m = round < 4 ? 0.5f * scale : 0.0f;
            memcpy(a, u, sizeof(float) * (size_t)n);
            memcpy(b, u, sizeof(float) * (size_t)n);
            kern_scalar.exp_sub(a, n, m);
            k->exp_sub(b, n, m);
            if (!same_out(a, b, (size_t)n))
                bad = 1, bad_act = -1, bad_n = n;
        }
    }
    free(g);
    free(u);
    free(a);
    free(b);
    CHECKF(!bad, "%s %s (act %d, n %d) differs from scalar", k->name, bad_act < 0 ? "exp_sub" : "glu", bad_act, bad_n);
}

/* softmax_rows of table k against the scalar one, the whole block compared (the padding between
 * rows too): 1 to 20 rows (groups of eight chains and their remainders), lengths random or
 * causal (each row one longer, as a block of tokens), scores of several scales, rows with NaNs,
 * infinities and subnormals, and rows whose largest value is a zero of both signs. */
static void check_softmax(const kern_ops *k)
{
    enum { LD = 336, ROWS = 20 };
    static const int counts[] = {1, 3, 7, 8, 9, 16, 20};
    static const float scales[] = {1.0f, 0.08838835f, -2.0f};
    float *a = malloc(sizeof(float) * LD * ROWS), *b = malloc(sizeof(float) * LD * ROWS);
    int n[ROWS], bad = 0, bad_case = 0;
    rng r;
    rng_seed(&r, 21);
    for (int c = 0; c < 6 * 7 * 3 && !bad; c++) {
        int kind = c / 21, rows = counts[c / 3 % 7];
        float scale = scales[c % 3];
        for (int q = 0; q < rows; q++)
            n[q] = kind % 2 ? 300 + q : 1 + (int)(rng_next(&r) % (LD - 1));
        for (int i = 0; i < LD * ROWS; i++) {
            float v = (float)rng_normal(&r) * (kind < 2 ? 1.0f : 30.0f);
            if (kind == 4) /* any bit pattern: NaNs, infinities, subnormals */
                v = km_float((uint32_t)(rng_next(&r) >> 32));
            else if (kind == 5) /* the largest value +0 or -0, in either order */
                v = i % 7 == 3 ? 0.0f : i % 7 == 5 ? -0.0f : -1.0f - (float)(i % 3);
            a[i] = b[i] = v;
        }
        kern_scalar.softmax_rows(a, LD, n, rows, scale);
        k->softmax_rows(b, LD, n, rows, scale);
        if (!same_out(a, b, (size_t)LD * ROWS))
            bad = 1, bad_case = c;
    }
    /* one row at ld 0, as AttnRes and a lone query call it */
    for (int len = 1; len < 40 && !bad; len++) {
        for (int i = 0; i < len; i++)
            a[i] = b[i] = (float)rng_normal(&r);
        kern_scalar.softmax_rows(a, 0, &len, 1, 0.5f);
        k->softmax_rows(b, 0, &len, 1, 0.5f);
        if (!same_out(a, b, (size_t)len))
            bad = 1, bad_case = -len;
    }
    free(a);
    free(b);
    CHECKF(!bad, "%s softmax_rows (case %d) differs from scalar", k->name, bad_case);
}

void kern_test_elementwise(const kern_ops *k)
{
    check_elementwise(k);
    if (k)
        check_glu(k);
    if (k && k->softmax_rows) /* (the GPU's test table has none: its softmax runs inside attention) */
        check_softmax(k);
}

TEST(kern_avx2_elementwise) { kern_test_elementwise(kern_avx2()); }
TEST(kern_avx512_elementwise) { kern_test_elementwise(kern_avx512()); }
TEST(kern_neon_elementwise) { kern_test_elementwise(kern_neon()); }

/* ---- kmath.h ---- */

/* |got - want| in units of the last place of float32 at want (subnormal spacing below 2^-126) */
static double ulps(float got, double want)
{
    int e;
    frexp(fabs(want), &e);
    double ulp = ldexp(1.0, e - 24);
    if (ulp < ldexp(1.0, -149))
        ulp = ldexp(1.0, -149);
    return fabs((double)got - want) / ulp;
}

/* Every 1021st float32 bit pattern, against libm's double precision functions (far more
 * accurate than float32's rounding); the bounds are the worst cases found over every float32
 * input (docs/exactness.md). */
TEST(kmath_accuracy)
{
    double worst[4] = {0};
    float at[4] = {0};
    for (uint64_t b = 0; b < 0x100000000ull; b += 1021) {
        float x = km_float((uint32_t)b);
        if (isnan(x))
            continue;
        double e[4] = {
            x > KM_EXP_LO && x < 88.7f ? ulps(km_expf(x), exp((double)x)) : 0,
            ulps(km_tanhf(x), tanh((double)x)),
            x > -87.0f ? ulps(km_sigmoidf(x), 1.0 / (1.0 + exp(-(double)x))) : 0,
            x > -1.0f && !isinf(x) ? ulps(km_log1pf(x), log1p((double)x)) : 0,
        };
        for (int f = 0; f < 4; f++)
            if (e[f] > worst[f])
                worst[f] = e[f], at[f] = x;
    }
    static const double bound[4] = {1.0, 1.5, 2.5, 2.5};
    static const char *name[4] = {"exp", "tanh", "sigmoid", "log1p"};
    for (int f = 0; f < 4; f++)
        CHECKF(worst[f] <= bound[f], "km_%sf: %.3f ulp at %a (bound %.1f)", name[f], worst[f], (double)at[f], bound[f]);
}

TEST(kmath_special_values)
{
    CHECK(km_expf(0.0f) == 1.0f && km_expf(-0.0f) == 1.0f);
    CHECK(km_expf(-INFINITY) == 0.0f && !signbit(km_expf(-INFINITY)) && km_expf(-104.0f) == 0.0f);
    CHECK(km_expf(INFINITY) == INFINITY && km_expf(88.73f) == INFINITY && isfinite(km_expf(88.72f)));
    CHECK(km_expf(-103.0f) > 0.0f); /* a subnormal result, not flushed */
    CHECK(isnan(km_expf(NAN)) && isnan(km_tanhf(NAN)) && isnan(km_sigmoidf(NAN)) && isnan(km_log1pf(NAN)));
    CHECK(km_tanhf(0.0f) == 0.0f && !signbit(km_tanhf(0.0f)) && signbit(km_tanhf(-0.0f)));
    CHECK(km_tanhf(INFINITY) == 1.0f && km_tanhf(-INFINITY) == -1.0f && km_tanhf(10.0f) == 1.0f);
    CHECK(km_sigmoidf(0.0f) == 0.5f && km_sigmoidf(INFINITY) == 1.0f && km_sigmoidf(-INFINITY) == 0.0f);
    CHECK(km_log1pf(0.0f) == 0.0f && signbit(km_log1pf(-0.0f)) && km_log1pf(0x1p-30f) == 0x1p-30f);
    CHECK(km_log1pf(-1.0f) == -INFINITY && isnan(km_log1pf(-2.0f)) && km_log1pf(INFINITY) == INFINITY);
    for (uint64_t b = 0; b < 0x80000000ull; b += 65537) { /* tanh is odd to the bit */
        float x = km_float((uint32_t)b), y = km_tanhf(x), ny = km_tanhf(-x);
        CHECKF(same_bits(-y, ny) || isnan(x), "tanh(-%a) != -tanh(%a)", (double)x, (double)x);
    }
}

/* The bits of every function over a sweep of inputs, hashed (FNV-1a) and compared with the value
 * this test printed when the functions were last changed: the same on every machine and compiler
 * (it also runs on AArch64 under qemu). A change to a coefficient or to the order of operations
 * changes logits, so it must change this value too, on purpose. */
TEST(kmath_bits_pinned)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t b = 0; b < 0x100000000ull; b += 4099) {
        float x = km_float((uint32_t)b);
        float y[5] = {km_expf(x), km_tanhf(x), km_sigmoidf(x), km_log1pf(x), km_situ(x, 0.5f - x, 1.4f, 3.0f)};
        for (int f = 0; f < 5; f++) {
            uint32_t v = isnan(y[f]) ? 0x7FC00000u : km_bits(y[f]); /* any NaN is a NaN (kern.h) */
            for (int i = 0; i < 4; i++)
                h = (h ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001b3ull;
        }
    }
    CHECKF(h == 0xed536f4d0fd2104dull, "kmath bits hash %#018llx", (unsigned long long)h);
}
