/* spineq.h — `prepare --spine int8`: a store whose layer spines hold their matrices as INT8
 * group-32 (dtype.h WF_INT8G32) instead of as released. An opt-in memory saver, never the
 * default: it changes the model (logits move by the error bench/results/store.md measures), so
 * such a store is a different store from the as-released one of the same checkpoint (its own
 * pack names, and its manifest says "spine": "int8").
 *
 * What is quantized: every matrix a layer's spine binds (model_layer_mats: attention, shared
 * experts, dense FFN, latent MoE projections) that is BF16, F16 or F32, has a multiple of 32
 * columns and is a whole tensor. Not the router (its scores choose the experts), not the routed
 * experts (released 4-bit already), not the globals (embedding, output head), not vectors.
 *
 * The plan is the store's tensor list: the source's tensors (sorted by name) with each
 * quantized "X.weight" replaced by "X.weight" (I8, same shape) and "X.weight_scale" (BF16,
 * [rows][cols/32]), which is what the model loader binds as WF_INT8G32. Their bytes are made
 * one matrix at a time while prepare writes the blob (spineq_fill), so prepare's memory stays
 * one blob.
 *
 * Quantization, per row and group of 32: s = max|w| / 127 rounded up to a BF16 (so no code
 * needs clipping), q = round-to-nearest-even(w / s), and q = 0 where s = 0. A non-finite
 * weight is an error naming the tensor, row and column, found by spineq_plan (one read of the
 * chosen matrices) before anything is written; so is a model with nothing to code.
 */
#ifndef DF_STORE_SPINEQ_H
#define DF_STORE_SPINEQ_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

typedef enum { SPINEQ_COPY, SPINEQ_CODES, SPINEQ_SCALES } spineq_role;

typedef struct spineq {
    st_tensor *t;          /* [n] the store's tensors, sorted by name; new ones: data NULL,
                              begin 0, end = byte length, name owned */
    int n;
    int *src;              /* [n] the source tensor (index into the model's st_set) */
    unsigned char *role;   /* [n] spineq_role */
    model_bind *bind;      /* [n_bind] the model's bindings over these tensors (a quantized matrix's
                              binding becomes its codes' and its scales') */
    int n_bind;
    int nmat;              /* matrices quantized */
    uint64_t bytes_in, bytes_out; /* their bytes as released / as INT8 codes + scales */
} spineq;

int spineq_plan(spineq *q, const model *m, errbuf *err);
void spineq_free(spineq *q);
/* A shallow copy of m whose tensor list is q's (for blob_table_build and the manifest); it
 * shares everything else with m and is never passed to model_free. */
void spineq_view(const spineq *q, const model *m, model *view);
/* The bytes of store tensor i (role CODES) into codes, and those of its SCALES tensor into scales
 * (each its byte length), in one pass over the source matrix. */
void spineq_fill(const spineq *q, const model *m, int i, uint8_t *codes, uint8_t *scales);

#endif
