/* model.h — a loaded checkpoint: hyperparameters and weight views, for every supported family.
 *
 * model_load(dir) reads config.json, picks the family adapter by model_type (fam_kimi.c:
 * kimi_k3 and kimi_linear; fam_deepseek.c: deepseek_v3, kimi_k2, kimi_k25; fam_qwen3.c: qwen3,
 * qwen3_moe), parses the safetensors, and binds every tensor the text model uses, checking its
 * shape; tensors it does not use (vision tower, projector, MTP layers) are never touched. A
 * missing or mis-shaped tensor is an error naming it.
 *
 * Matrices are kmat views into the mapped files (bytes exactly as released). Small vectors
 * (norms, biases, conv taps, gate constants) are copied to float32 arrays owned by the model.
 * The model is read-only after loading and may be shared by any number of sessions.
 */
#ifndef DF_MODEL_MODEL_H
#define DF_MODEL_MODEL_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/dtype.h"
#include "model/safetensors.h"

/* MAX_BLOCKS: AttnRes mixes at most MAX_BLOCKS + 1 sources; MAX_GROUPS: grouped routing */
enum { MODEL_MAX_LAYERS = 512, MODEL_MAX_ROPE = 256, MODEL_MAX_EOS = 8, MODEL_MAX_BLOCKS = 62, MODEL_MAX_GROUPS = 64 };

typedef enum { ATTN_KDA, ATTN_MLA, ATTN_GQA } attn_kind;
typedef enum { FFN_DENSE, FFN_MOE } ffn_kind;
typedef enum { ACT_SILU, ACT_SITU } act_kind;
typedef enum { ROUTER_SIGMOID, ROUTER_SOFTMAX } router_kind;
typedef enum { ROPE_NONE, ROPE_NEOX, ROPE_INTERLEAVED } rope_kind;
typedef enum { KDA_GATE_SOFTPLUS, KDA_GATE_LOWER_BOUND } kda_gate_kind;

typedef struct hparams {
    char arch[32];          /* model_type of the checkpoint: kimi_k3, kimi_linear, deepseek_v3, ... */
    int n_layers, hidden, vocab;
    float rms_eps;
    int tie_embeddings;
    int ctx_len;            /* max_position_embeddings: the longest sequence (0: not given) */
    int bos_id;             /* -1: none */
    int eos_ids[MODEL_MAX_EOS], n_eos;

    /* softmax attention: MLA (n_heads, q_lora_rank 0 = direct q_proj, kv_lora_rank, qk_nope,
     * qk_rope, v_head) or GQA (n_heads, n_kv_heads, head_dim) */
    int n_heads, n_kv_heads, head_dim;
    int q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head;
    int mla_out_gate;       /* K3: o *= sigmoid(x @ g_proj^T) before o_proj */
    float mla_norm_eps;     /* q_a_layernorm / kv_a_layernorm: 1e-6 whatever rms_norm_eps says */
    float attn_scale;       /* softmax scale, yarn mscale^2 folded in */
    int rope;               /* rope_kind */
    int rope_dim;           /* rotated width: qk_rope (MLA) or head_dim (GQA) */
    float rope_inv_freq[MODEL_MAX_ROPE / 2]; /* [rope_dim/2], as HF computes them in float32 */
    float rope_attn_factor; /* yarn amplitude on cos and sin (1.0 for DeepSeek/K2) */

    /* KDA */
    int kda_heads, kda_dim, conv_k;
    int kda_gate;           /* kda_gate_kind */
    float kda_lower_bound;  /* -5 for K3 */
    int kda_full_gate;      /* 1: g_proj [P, H]; 0: g_a_proj/g_b_proj low rank */

    /* feed-forward */
    int act;                /* act_kind */
    float situ_beta, situ_linear_beta;
    int dense_inter;        /* dense MLP width */
    int moe_inter;          /* routed expert width */
    int n_experts, top_k, n_shared, shared_inter;
    int n_group, topk_group, norm_topk;
    float routed_scale;
    int router;             /* router_kind */
    int latent;             /* latent MoE width (K3), 0 = experts work on the hidden width */
    int latent_norm;

    int attnres_block;      /* Block AttnRes block size in layers (K3), 0 = plain residual */

    uint8_t attn_kind[MODEL_MAX_LAYERS];
    uint8_t ffn_kind[MODEL_MAX_LAYERS];
} hparams;

typedef struct mlp_w {
    kmat gate, up, down; /* [I, D], [I, D], [D, I] */
} mlp_w;

typedef struct kda_w {
    kmat q, k, v;        /* [P, H], P = kda_heads * kda_dim */
    float *conv[3];      /* q, k, v depthwise taps [P][conv_k], tap conv_k-1 = current token */
    kmat f_a, f_b;       /* [r, H], [P, r] forget-gate low-rank pair */
    kmat b;              /* [kda_heads, H] beta logits */
    kmat g, g_a, g_b;    /* output gate: full rank [P, H], or g_a [r, H] + g_b [P, r] */
    float *A;            /* [kda_heads] exp(A_log) */
    float *dt_bias;      /* [P] */
    float *o_norm;       /* [kda_dim] */
    kmat o;              /* [H, P] */
} kda_w;

typedef struct mla_w {
    kmat q, q_a, q_b;    /* q [nh*(nope+rope), H] or q_a [q_lora, H] + q_b [nh*(nope+rope), q_lora] */
    float *q_a_norm;     /* [q_lora] */
    kmat kv_a;           /* [kv_lora + rope, H] */
    float *kv_a_norm;    /* [kv_lora] */
    kmat kv_b;           /* [nh*(nope+v), kv_lora]: per head nope rows (Wk) then v rows (Wv) */
    kmat g;              /* [nh*v, H] output gate (mla_out_gate) */
    kmat o;              /* [H, nh*v] */
} mla_w;

typedef struct gqa_w {
    kmat q, k, v, o;     /* [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd] */
    float *q_norm, *k_norm; /* [hd] or NULL */
} gqa_w;

typedef struct moe_w {
    kmat router;         /* [E, H] */
    float *bias;         /* [E] selection bias or NULL */
    kmat lat_down, lat_up; /* [L, H], [H, L] (latent MoE) */
    float *lat_norm;     /* [L] */
    mlp_w *experts;      /* [E], each [I, L or H] / [L or H, I] */
    mlp_w shared;        /* [n_shared * I] wide, when n_shared > 0 */
} moe_w;

typedef struct layer_w {
    float *in_norm, *post_norm;  /* [H] */
    float *res_u[2];             /* AttnRes score vectors norm.w * proj.w for the attention and
                                    FFN mixes [H] (attnres_block > 0) */
    kda_w kda;
    mla_w mla;
    gqa_w gqa;
    mlp_w mlp;
    moe_w moe;
} layer_w;

/* What a bound tensor is part of: the weight store's unit (blobs.h), decided by the family adapter
 * as it binds, never re-derived from names. */
typedef enum { MODEL_PART_GLOBAL, MODEL_PART_SPINE, MODEL_PART_EXPERT } model_part;
typedef enum { MODEL_ROLE_OTHER, MODEL_ROLE_GATE, MODEL_ROLE_UP, MODEL_ROLE_DOWN } model_role;

/* One byte range of a tensor the model bound. A tensor used whole is one binding; a fused 3-D
 * experts tensor (experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]) gives one binding
 * per expert and matrix, each a contiguous slice. */
typedef struct model_bind {
    int tensor;          /* index into the model's st_set */
    uint64_t off, len;   /* bytes inside the tensor's data */
    uint8_t part, role;  /* model_part, model_role */
    int layer, expert;   /* -1 where it does not apply */
} model_bind;

typedef struct model {
    hparams hp;
    st_set st;
    char dir[1024];
    kmat embed;          /* [V, H] */
    kmat lm_head;        /* [V, H] (the embedding when tied) */
    float *final_norm;   /* [H] */
    float *out_res_u;    /* [H] final AttnRes mix (attnres_block > 0) */
    layer_w *L;          /* [n_layers] */
    void **owned;        /* float arrays owned by the model */
    int n_owned, cap_owned;
    size_t max_cols;     /* widest matrix row, for kernel scratch sizing */
    model_bind *bind;    /* [n_bind] every tensor range bound, in binding order */
    int n_bind, cap_bind;
    model_bind scope;    /* part, layer, expert and role the next bindings get (model_scope) */
} model;

int model_load(model *m, const char *dir, errbuf *err);
/* Every matrix of a layer outside its routed experts (attention, router, latent projections,
 * shared experts, dense MLP) that the layer binds, as pointers into *L: the views a weight store
 * moves onto a streamed copy of the layer. Returns how many (at most MODEL_LAYER_MATS). */
enum { MODEL_LAYER_MATS = 30 };
int model_layer_mats(layer_w *L, kmat **out);
/* The same with the tensors supplied by the caller (a weight store's packs); the model takes
 * ownership of *tensors (also on failure). dir still provides config.json. */
int model_load_set(model *m, const char *dir, st_set *tensors, errbuf *err);
/* The RoPE table of hp->rope_dim (set first, with hp->rope) from a config's rope_parameters (or
 * rope_theta + rope_scaling): inverse frequencies in float32 (YaRN ramped), amplitude; *mscale2
 * gets YaRN's softmax-scale factor. For models outside the families (a drafter's own config). */
int model_rope(hparams *hp, const json_t *cfg, const char *where, double *mscale2, errbuf *err);
/* Only the config: fills hp from a parsed config.json (`where` names it in errors). */
int model_config(hparams *hp, const json_t *cfg, const char *where, errbuf *err);
void model_free(model *m);
/* Decodes every weight the model bound and checks that it is finite: -1 naming the first tensor,
 * row and column that is not (NaN or infinite). Reads the whole checkpoint (doctor --model). */
int model_scan_finite(const model *m, errbuf *err);

/* Helpers for family adapters (model.c). Names are full tensor names without the ".weight"
 * suffix for matrices. Every tensor they bind is recorded (model.bind) with the scope set by
 * model_scope: an adapter names the part (global, a layer's spine, or one expert of a layer)
 * and the role before binding its tensors. */
void model_scope(model *m, int part, int layer, int expert, int role);
/* Records a slice [off, off+len) of tensor t in the current scope (fused expert tensors). */
int model_bind_range(model *m, const st_tensor *t, uint64_t off, uint64_t len, errbuf *err);
int model_mat(model *m, kmat *out, int rows, int cols, errbuf *err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
int model_mat_opt(model *m, kmat *out, int rows, int cols, errbuf *err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7))); /* returns 1 if bound, 0 if absent, -1 on error */
/* A float vector of n elements (any shape with n elements, or the first n of a longer 1-D
 * tensor when `prefix_ok`), any float dtype, converted to an owned float32 array. */
int model_vec(model *m, float **out, int n, int prefix_ok, errbuf *err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
int model_has(const model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
float *model_alloc(model *m, size_t nfloats, errbuf *err);

/* Family adapter: fills hp from config (the text part), then binds tensors. */
typedef struct family {
    const char *const *model_types; /* NULL-terminated */
    int (*config)(hparams *hp, const void *json_cfg, const char *where, errbuf *err);
    int (*bind)(model *m, const char *prefix, errbuf *err);
} family;

extern const family fam_kimi, fam_deepseek, fam_qwen3;

#endif
