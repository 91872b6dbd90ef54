/* dtype.c — the format table and the exact scalar decoders (the reference every SIMD kernel
 * is tested against). */
#include "kernels/dtype.h"
#include "kernels/kmath.h" /* km_bits, km_float */

#include <math.h>

const float e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F)
        return km_float(sign | 0x7F800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {
        float v = (float)man * 0x1p-24f; /* subnormal: exact */
        return sign ? -v : v;
    }
    return km_float(sign | ((exp + 112) << 23) | (man << 13));
}

float e4m3_to_f32(uint8_t b)
{
    int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 7;
    float v;
    if (exp == 0xF && man == 7)
        return NAN;
    if (exp == 0)
        v = (float)man * 0x1p-9f; /* m/8 * 2^-6 */
    else
        v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

float e8m0_to_f32(uint8_t s)
{
    if (s == 255)
        return NAN;
    if (s == 0)
        return 0x1p-127f; /* subnormal float */
    return km_float((uint32_t)s << 23);
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u = km_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = km_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return sign | 0x7E00;
    if (a >= 0x477FF000u) /* rounds to >= 65520: infinity */
        return sign | 0x7C00;
    if (a < 0x38800000u) { /* f16 subnormal or zero: value / 2^-24, rounded to even */
        float m = fabsf(f) * 0x1p24f;
        float r = nearbyintf(m);
        return sign | (uint16_t)r;
    }
    uint32_t e = (a >> 23) - 112, man = a & 0x7FFFFF;
    uint32_t h = (e << 10) | (man >> 13), rest = man & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

static void dec_f32(const kmat *w, int r, int c0, int c1, float *out)
{
    memcpy(out, w->data + (size_t)r * w->row_bytes + 4 * (size_t)c0, (size_t)(c1 - c0) * 4);
}

static void dec_f16(const kmat *w, int r, int c0, int c1, float *out)
{
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    for (int i = c0; i < c1; i++)
        out[i - c0] = f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

static void dec_bf16(const kmat *w, int r, int c0, int c1, float *out)
{
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    for (int i = c0; i < c1; i++)
        out[i - c0] = bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

static void dec_mxfp4(const kmat *w, int r, int c0, int c1, float *out)
{
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->scale + (size_t)r * w->scale_stride;
    for (int i = c0; i < c1; i++) {
        int code = (p[i / 2] >> ((i & 1) * 4)) & 0xF;
        out[i - c0] = e2m1_table[code] * e8m0_to_f32(s[i / 32]);
    }
}

static void dec_int4(const kmat *w, int r, int c0, int c1, float *out)
{
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    for (int i = c0; i < c1; i++) {
        int q = ((p[i / 2] >> ((i & 1) * 4)) & 0xF) - 8;
        out[i - c0] = (float)q * kmat_group_scale(w, r, i / 32);
    }
}

static void dec_int8(const kmat *w, int r, int c0, int c1, float *out)
{
    const int8_t *p = (const int8_t *)(w->data + (size_t)r * w->row_bytes);
    for (int i = c0; i < c1; i++)
        out[i - c0] = (float)p[i] * kmat_group_scale(w, r, i / 32);
}

static void dec_fp8(const kmat *w, int r, int c0, int c1, float *out)
{
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    const uint8_t *srow = w->scale + (size_t)(r / 128) * w->scale_stride;
    for (int i = c0; i < c1; i++) {
        float sc;
        memcpy(&sc, srow + 4 * (size_t)(i / 128), 4);
        out[i - c0] = e4m3_to_f32(p[i]) * sc;
    }
}

const wfmt_info wfmt_table[WF_COUNT] = {
    [WF_F32] = {.name = "f32", .block = 1, .block_bytes = 4, .lanes = WF_LANES_SEQ, .scale = WF_SCALE_NONE,
                .st_suffix = ".weight", .st_dtype = "F32", .st_elem_bytes = 4, .decode = dec_f32},
    [WF_F16] = {.name = "f16", .block = 1, .block_bytes = 2, .lanes = WF_LANES_SEQ, .scale = WF_SCALE_NONE,
                .st_suffix = ".weight", .st_dtype = "F16", .st_elem_bytes = 2, .decode = dec_f16},
    [WF_BF16] = {.name = "bf16", .block = 1, .block_bytes = 2, .lanes = WF_LANES_SEQ, .scale = WF_SCALE_NONE,
                 .st_suffix = ".weight", .st_dtype = "BF16", .st_elem_bytes = 2, .decode = dec_bf16},
    [WF_MXFP4] = {.name = "mxfp4", .block = 32, .block_bytes = 16, .lanes = WF_LANES_NIBBLE,
                  .scale = WF_SCALE_E8M0_G32, .st_suffix = ".weight_packed", .st_dtype = "U8", .st_elem_bytes = 1,
                  .st_scale_suffix = ".weight_scale", .st_scale_dtype = "U8", .decode = dec_mxfp4},
    [WF_INT4G32] = {.name = "int4-g32", .block = 32, .block_bytes = 16, .lanes = WF_LANES_NIBBLE,
                    .scale = WF_SCALE_BF16_G32, .st_suffix = ".weight_packed", .st_dtype = "I32", .st_elem_bytes = 4,
                    .st_scale_suffix = ".weight_scale", .st_scale_dtype = "BF16", .decode = dec_int4},
    [WF_FP8B128] = {.name = "fp8-b128", .block = 1, .block_bytes = 1, .lanes = WF_LANES_SEQ,
                    .scale = WF_SCALE_F32_T128, .st_suffix = ".weight", .st_dtype = "F8_E4M3", .st_elem_bytes = 1,
                    .st_scale_suffix = ".weight_scale_inv", .st_scale_dtype = "F32", .decode = dec_fp8},
    [WF_INT8G32] = {.name = "int8-g32", .block = 32, .block_bytes = 32, .lanes = WF_LANES_SEQ,
                    .scale = WF_SCALE_BF16_G32, .st_suffix = ".weight", .st_dtype = "I8", .st_elem_bytes = 1,
                    .st_scale_suffix = ".weight_scale", .st_scale_dtype = "BF16", .decode = dec_int8},
};

size_t wfmt_data_bytes(int fmt, int rows, int cols)
{
    const wfmt_info *f = &wfmt_table[fmt];
    return (size_t)rows * (size_t)(cols / f->block) * (size_t)f->block_bytes;
}

/* rows and columns of a format's scale array, and bytes per scale row */
static void scale_dims(int fmt, int rows, int cols, size_t *srows, size_t *stride)
{
    switch (wfmt_table[fmt].scale) {
    case WF_SCALE_E8M0_G32:
        *srows = (size_t)rows;
        *stride = (size_t)cols / 32;
        return;
    case WF_SCALE_BF16_G32:
        *srows = (size_t)rows;
        *stride = (size_t)cols / 32 * 2;
        return;
    case WF_SCALE_F32_T128:
        *srows = (size_t)(rows + 127) / 128;
        *stride = (size_t)((cols + 127) / 128) * 4;
        return;
    default:
        *srows = 0;
        *stride = 0;
    }
}

size_t wfmt_scale_bytes(int fmt, int rows, int cols)
{
    size_t srows, stride;
    scale_dims(fmt, rows, cols, &srows, &stride);
    return srows * stride;
}

void kmat_init(kmat *m, int fmt, int rows, int cols, const void *data, const void *scale)
{
    size_t srows;
    m->fmt = fmt;
    m->rows = rows;
    m->cols = cols;
    m->data = data;
    m->row_bytes = wfmt_data_bytes(fmt, 1, cols);
    m->scale = scale;
    scale_dims(fmt, rows, cols, &srows, &m->scale_stride);
}
