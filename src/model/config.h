/* config.h — reading config.json fields for the family adapters: key aliases (real checkpoints
 * and Hugging Face rename fields), defaults, and the RoPE / YaRN tables.
 * Internal to src/model. */
#ifndef DF_MODEL_CONFIG_H
#define DF_MODEL_CONFIG_H

#include <jansson.h>

#include "base/err.h"
#include "model/model.h"

#define CFG_REQUIRED (-0x7fffffff)

/* First present key of the NULL-terminated alias list wins; if none is present, *out = dflt,
 * or an error naming the first key when dflt == CFG_REQUIRED. */
int cfg_int(const json_t *c, const char *where, int *out, int dflt, errbuf *err, ...);
int cfg_float(const json_t *c, const char *where, float *out, double dflt, int required, errbuf *err, ...);
int cfg_bool(const json_t *c, const char *where, int *out, int dflt, errbuf *err, ...);
/* A positive integer dimension (required). */
int cfg_dim(const json_t *c, const char *where, int *out, errbuf *err, ...);

/* RoPE from rope_parameters (or legacy rope_theta + rope_scaling): fills hp->rope_inv_freq for
 * hp->rope_dim and hp->rope_attn_factor; *mscale2 gets the YaRN softmax-scale factor
 * (mscale_all_dim)^2 used by MLA (1 when not YaRN). */
int cfg_rope(const json_t *c, const char *where, hparams *hp, double *mscale2, errbuf *err);

/* Fields every family shares, read after its adapter: max_position_embeddings (ctx_len, a
 * positive integer when given) and bos_token_id. */
int cfg_common(hparams *hp, const json_t *c, const char *where, errbuf *err);

/* Checks common invariants after a family filled hp (sizes positive, layers within limits). */
int cfg_validate(const hparams *hp, const char *where, errbuf *err);

/* Binders shared by the family adapters (fam_common.c). p is the tensor-name prefix. */
int fam_bind_mla(model *m, const char *p, mla_w *w, errbuf *err);
int fam_bind_mlp(model *m, mlp_w *w, int inter, int width, errbuf *err, const char *p, const char *gate,
                 const char *up, const char *down);
/* Layer `layer`'s routed experts under prefix p ("...mlp."): per-expert experts.{e}.NAME for the
 * three names (gate, up, down: "gate_proj", "up_proj", "down_proj", or Kimi's "w1", "w3", "w2"),
 * or the fused 3-D experts.gate_up_proj [E, 2I, D] (gate rows first) + experts.down_proj
 * [E, D, I]. Each expert is bound in its own scope (model_scope: MODEL_PART_EXPERT). */
extern const char *const FAM_EXPERT_NAMES[3]; /* "gate_proj", "up_proj", "down_proj" */
int fam_bind_experts(model *m, int layer, const char *p, moe_w *moe, int width, const char *const names[3],
                     errbuf *err);
/* The token embedding and final norm under `base` ("...model."), and the output head under
 * `prefix` ("...lm_head"), or the embedding itself when tied and absent; in the global scope. */
int fam_bind_globals(model *m, const char *base, const char *prefix, errbuf *err);

#endif
