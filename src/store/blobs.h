/* blobs.h — the unit of storage and caching: a blob is one routed expert of one layer (its
 * gate/up/down matrices with their scales, bytes exactly as released) or one layer's block of
 * spine weights (everything else of that layer), or the model's global tensors.
 *
 * A blob table groups what the model bound (model.bind: each binding names its part, layer,
 * expert and role) into blobs, records each part's offset inside the blob image (64-byte
 * aligned, in tensor-name order), and where the bytes come from: for a Hugging Face folder one
 * extent per part in the safetensors files (a whole tensor, or an expert's slice of a fused 3-D
 * experts tensor); for a DFSP store one contiguous copy per drive (dfsp.h). Tensors the model
 * does not bind (a vision tower, MTP layers) are in no blob.
 * For expert blobs it also records how to bind the expert's three matrices to an image in
 * memory (blob_bind_expert), which is how the engine computes on a cache slot.
 */
#ifndef DF_STORE_BLOBS_H
#define DF_STORE_BLOBS_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

enum { STORE_MAX_COPIES = 8, BLOB_ALIGN = 4096 };

/* a binding's part is the kind of blob it goes into */
typedef enum { BLOB_GLOBAL = MODEL_PART_GLOBAL, BLOB_SPINE = MODEL_PART_SPINE, BLOB_EXPERT = MODEL_PART_EXPERT } blob_kind;

/* A blob image's size rounded up to whole 4 KiB blocks (how it is stored and read). */
static inline uint64_t blob_padded(uint64_t n) { return (n + BLOB_ALIGN - 1) & ~(uint64_t)(BLOB_ALIGN - 1); }

typedef struct blob_part {
    int tensor;         /* index into the model's st_set */
    uint64_t src;       /* offset of the part inside the tensor's bytes (0 unless a slice) */
    uint64_t off;       /* offset of the part's bytes inside the blob image */
    uint64_t len;
    int role;           /* model_role of the binding (a fused tensor's slice: gate, up or down) */
} blob_part;

typedef struct blob_copy {
    int file;           /* file index (HF: safetensors file; DFSP: pack) */
    uint64_t off;       /* DFSP: offset of the contiguous image in the pack */
} blob_copy;

typedef struct blob {
    int kind, layer, expert;
    uint64_t size;      /* bytes of the image */
    int first_part, nparts;
    int ncopies;        /* DFSP copies (0 for a Hugging Face source: read part by part) */
    blob_copy copy[STORE_MAX_COPIES];
    uint64_t xxh3;      /* of the image (DFSP) */
    int mapped;         /* DFSP: the copy the model's tensors map (its pack was there) */
    uint8_t dead;       /* DFSP: bit c: copy c's pack is missing or truncated: never read */
    int man_index;      /* DFSP: the blob's index in the manifest */
    /* expert blobs: offsets of the matrices inside the image, for gate, up, down */
    uint64_t mat_data[3], mat_scale[3];
} blob;

typedef struct blob_table {
    blob *b;            /* [n] */
    int n;
    blob_part *part;    /* [nparts] */
    int nparts;
    int *expert_blob;   /* [n_layers * n_experts]: blob id of (layer, expert), -1 if none */
    int *layer_blob;    /* [n_layers]: blob id of the layer's spine, -1 if none */
    int global_blob;    /* the model's global tensors (embedding, final norm, output head), -1 if none */
    int n_layers, n_experts;
    uint64_t expert_bytes, spine_bytes; /* totals (spine_bytes: layer spines and globals) */
    uint64_t max_expert; /* largest expert image */
} blob_table;

/* Groups m's tensors into blobs (tensors the text model does not use are left out). */
int blob_table_build(blob_table *t, const model *m, errbuf *err);
void blob_table_free(blob_table *t);
/* Binds expert blob b's matrices to an image at base (views valid while base is). */
void blob_bind_expert(const blob_table *t, const model *m, int b, const uint8_t *base, mlp_w *out);
/* Binds spine blob b (a layer's) to an image at base: *out is the model's layer with every matrix
 * (model_layer_mats) moved onto the image; its float vectors stay the model's. -1 if one of the
 * layer's matrices lies outside the blob's tensors (then the layer cannot stream). */
int blob_bind_layer(const blob_table *t, const model *m, int b, const uint8_t *base, layer_w *out);
/* 1 if part p is a slice of its tensor (a fused experts tensor), not the whole of it */
int blob_part_is_slice(const blob_part *p, const model *m);
/* How a DFSP store keeps a part as a tensor of its own: a whole tensor keeps its name, dtype and
 * shape; an expert's slice of a fused tensor becomes that expert's per-expert tensor
 * ("...experts.{e}.gate_proj.weight" [I, D], up_proj, down_proj [D, I]), the layout the loader
 * reads too, with the same bytes. */
void blob_part_tensor(const blob_table *t, const model *m, int b, const blob_part *p, char *name, size_t cap,
                      int *ndim, int64_t *shape);
/* "layer 3 expert 17", "layer 3 spine", "globals" */
void blob_name(const blob *b, char *buf, size_t cap);

#endif
