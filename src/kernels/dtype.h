/* dtype.h — the weight formats the engine computes on natively, and the matrix view.
 *
 * One table (wfmt_table) describes every format: how many elements a block holds, how many
 * bytes it takes, where its scales live, and an exact scalar decoder. Bytes are used exactly as
 * the checkpoint ships them; nothing is re-quantized or repacked.
 *
 *   WF_F32, WF_F16, WF_BF16  plain little-endian values
 *   WF_MXFP4   compressed-tensors mxfp4-pack-quantized: U8 [rows][cols/2], element 2j in the low
 *              nibble of byte j (E2M1 code), U8 E8M0 scale per 32 columns [rows][cols/32]
 *   WF_INT4G32 compressed-tensors pack-quantized: I32 words [rows][cols/8], column c at bits
 *              4*(c%8) of word c/8 (so byte j again holds 2j low, 2j+1 high), value = nibble - 8,
 *              BF16 scale per 32 columns [rows][cols/32]
 *   WF_FP8B128 F8_E4M3 [rows][cols] with F32 weight_scale_inv per 128x128 tile
 *              [ceil(rows/128)][ceil(cols/128)]; value = e4m3 * scale, rounded to float32
 *   WF_INT8G32 I8 [rows][cols] with a BF16 weight_scale per 32 columns [rows][cols/32],
 *              symmetric: value = q * scale (compressed-tensors int-quantized, group 32). No
 *              release ships it; `prepare --spine int8` writes it, an opt-in memory saver.
 *
 * Dequantized values are exact in float32 for MXFP4, INT4 and INT8 (a BF16 scale has 8
 * significant bits, a code at most 8); FP8 rounds the product once (which is what the reference
 * does when it loads the weights).
 */
#ifndef DF_KERNELS_DTYPE_H
#define DF_KERNELS_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum wfmt {
    WF_F32,
    WF_F16,
    WF_BF16,
    WF_MXFP4,
    WF_INT4G32,
    WF_FP8B128,
    WF_INT8G32,
    WF_COUNT
} wfmt;

/* A weight matrix W[rows][cols] (PyTorch Linear layout: rows = out, cols = in). Borrowed view:
 * the bytes belong to whoever mapped the checkpoint and outlive every kmat that points at them. */
typedef struct kmat {
    int fmt;               /* wfmt */
    int rows, cols;
    const uint8_t *data;   /* row r starts at data + r * row_bytes */
    size_t row_bytes;
    const uint8_t *scale;  /* per-format scales (see above), NULL for plain formats */
    size_t scale_stride;   /* bytes between scale rows: MXFP4 cols/32, INT4 and INT8 2*cols/32,
                              FP8 4*ceil(cols/128) (one scale row per 128 weight rows) */
} kmat;

/* Where a format's scales live (kmat.scale, kmat.scale_stride). */
typedef enum wfmt_scale {
    WF_SCALE_NONE,     /* plain values */
    WF_SCALE_E8M0_G32, /* U8 E8M0 per 32 columns: [rows][cols/32], stride cols/32 */
    WF_SCALE_BF16_G32, /* BF16 per 32 columns: [rows][cols/32], stride 2*cols/32 */
    WF_SCALE_F32_T128  /* F32 per 128x128 tile: [ceil(rows/128)][ceil(cols/128)], stride 4*ceil(cols/128) */
} wfmt_scale;

/* The order a matrix row's elements fill seq16's 16 lanes (kern.h). */
typedef enum wfmt_lanes {
    WF_LANES_SEQ,   /* element i -> lane i % 16 */
    WF_LANES_NIBBLE /* 4-bit formats: lane (i % 32) / 2, a group's even columns then its odd ones */
} wfmt_lanes;

/* One row per format, in the manner of ggml's type traits. The safetensors fields say how a
 * checkpoint stores it: the data tensor's name suffix and dtype, and its scale tensor's. */
typedef struct wfmt_info {
    const char *name;
    int block;             /* elements per block along a row; cols must be a multiple */
    int block_bytes;       /* data bytes per block */
    wfmt_lanes lanes;
    wfmt_scale scale;
    const char *st_suffix; /* ".weight" or ".weight_packed" */
    const char *st_dtype;  /* the data tensor's safetensors dtype ("BF16", "U8", "I32", ...) */
    int st_elem_bytes;     /* bytes of one element of that dtype */
    const char *st_scale_suffix, *st_scale_dtype; /* NULL for plain formats */
    /* Exact decode of columns [c0, c1) of row r into out[0 .. c1-c0). */
    void (*decode)(const kmat *w, int r, int c0, int c1, float *out);
} wfmt_info;

extern const wfmt_info wfmt_table[WF_COUNT];

/* Bytes per element of a plain (block 1) format, and whether fmt's lanes are the nibble order:
 * wfmt_table's block_bytes and lanes as expressions the kernels can fold when fmt is a constant
 * (tests/test_kernels.c checks that they agree with the table). */
static inline int wfmt_plain_bytes(int fmt)
{
    return fmt == WF_F32 ? 4 : fmt == WF_FP8B128 || fmt == WF_INT8G32 ? 1 : 2;
}
static inline int wfmt_nibble(int fmt) { return fmt == WF_MXFP4 || fmt == WF_INT4G32; }

/* Element decoders, exact. */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
float f16_to_f32(uint16_t h);
/* INT4's and INT8's BF16 scale of row r, columns 32g .. 32g+31. */
static inline float kmat_group_scale(const kmat *w, int r, int g)
{
    const uint8_t *s = w->scale + (size_t)r * w->scale_stride + 2 * (size_t)g;
    return bf16_to_f32((uint16_t)(s[0] | (s[1] << 8)));
}
float e4m3_to_f32(uint8_t b);            /* 0x7F and 0xFF are NaN */
extern const float e2m1_table[16];       /* index = 4-bit code, 8 is -0 */
float e8m0_to_f32(uint8_t s);            /* 2^(s-127); 255 is NaN */
/* Round-to-nearest-even float -> bf16 (NaN stays NaN). For writers and tests. */
uint16_t f32_to_bf16(float f);
/* Round-to-nearest-even float -> f16 (overflow to inf, NaN stays NaN). */
uint16_t f32_to_f16(float f);

/* Byte size of the data of a rows x cols matrix in fmt, and of its scales. */
size_t wfmt_data_bytes(int fmt, int rows, int cols);
size_t wfmt_scale_bytes(int fmt, int rows, int cols);
/* Fills a kmat from contiguous data and scale arrays. */
void kmat_init(kmat *m, int fmt, int rows, int cols, const void *data, const void *scale);

#endif
