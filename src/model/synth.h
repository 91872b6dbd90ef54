/* synth.h — random-weight checkpoints in Kimi K3's released format: nested config.json
 * (model_type kimi_k3, text_config kimi_linear with every K3 feature), tensors named
 * "language_model.*", routed experts in MXFP4 (U8 codes + U8 E8M0 scales), F32 conv taps /
 * A_log / dt_bias / o_norm / router bias, BF16 everything else. Used for the bundled default
 * model and for benchmark models larger than RAM.
 *
 * Deterministic: the bytes depend only on the shape and the seed (integer arithmetic and
 * exactly-rounded float operations only), so a committed checkpoint can be regenerated and
 * compared byte for byte.
 */
#ifndef DF_MODEL_SYNTH_H
#define DF_MODEL_SYNTH_H

#include <stdint.h>

#include "base/err.h"

typedef struct synth_k3 {
    int hidden, layers, vocab;
    int heads, q_lora, kv_lora, nope, rope, v_head;    /* MLA */
    int kda_heads, kda_dim;                            /* KDA */
    int dense_inter, moe_inter, experts, top_k, shared, latent;
    int attnres_block;
    uint64_t seed;
} synth_k3;

/* Fills c with a named preset ("k3-tiny": the bundled default model; "k3-mini": K3's shape
 * scaled down for storage benchmarks; "k3-wide": fewer layers but K3's own 17.5 MB experts).
 * Returns -1 for an unknown name. */
int synth_preset(const char *name, synth_k3 *c);
/* Sets the number of routed experts so the checkpoint is about `gb` GB (at least top_k). */
void synth_scale(synth_k3 *c, double gb);
/* Bytes of the checkpoint's tensor data. */
uint64_t synth_bytes(const synth_k3 *c);
/* Writes dir/config.json and dir/model.safetensors (dir must exist). */
int synth_k3_write(const synth_k3 *c, const char *dir, errbuf *err);

#endif
