/* fam_qwen3.c — Qwen3 (dense; the drafters' shape) and Qwen3-MoE: GQA with per-head q/k
 * RMSNorm before half-rotation RoPE, SwiGLU, softmax router over all experts then top-k. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

static int qwen3_config(hparams *hp, const void *jc, const char *where, errbuf *err)
{
    const json_t *c = jc;
    int sparse_step = 1, sliding = 0;
    if (cfg_dim(c, where, &hp->hidden, err, "hidden_size", NULL) ||
        cfg_dim(c, where, &hp->n_layers, err, "num_hidden_layers", NULL) ||
        cfg_dim(c, where, &hp->vocab, err, "vocab_size", NULL) ||
        cfg_float(c, where, &hp->rms_eps, 1e-6, 0, err, "rms_norm_eps", NULL) ||
        cfg_dim(c, where, &hp->n_heads, err, "num_attention_heads", NULL) ||
        cfg_int(c, where, &hp->n_kv_heads, hp->n_heads, err, "num_key_value_heads", NULL) ||
        cfg_int(c, where, &hp->head_dim, hp->hidden / hp->n_heads, err, "head_dim", NULL) ||
        cfg_bool(c, where, &hp->tie_embeddings, 0, err, "tie_word_embeddings", NULL) ||
        cfg_int(c, where, &hp->dense_inter, 0, err, "intermediate_size", NULL) ||
        cfg_int(c, where, &hp->moe_inter, 0, err, "moe_intermediate_size", NULL) ||
        cfg_int(c, where, &hp->n_experts, 0, err, "num_experts", "num_local_experts", NULL) ||
        cfg_int(c, where, &hp->top_k, 0, err, "num_experts_per_tok", NULL) ||
        cfg_bool(c, where, &hp->norm_topk, 0, err, "norm_topk_prob", NULL) ||
        cfg_int(c, where, &sparse_step, 1, err, "decoder_sparse_step", NULL) ||
        cfg_bool(c, where, &sliding, 0, err, "use_sliding_window", NULL))
        return -1;
    if (sliding)
        return errbuf_set(err, "%s: use_sliding_window=true is not supported", where);
    if (hp->head_dim <= 0)
        return errbuf_set(err, "%s: head_dim %d must be a positive integer", where, hp->head_dim);
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads)
        return errbuf_set(err, "%s: %d attention heads do not split into %d key/value heads", where, hp->n_heads,
                          hp->n_kv_heads);
    hp->act = ACT_SILU;
    hp->router = ROUTER_SOFTMAX;
    hp->n_group = hp->topk_group = 1;
    hp->routed_scale = 1.0f;
    hp->rope = ROPE_NEOX;
    hp->rope_dim = hp->head_dim;
    double mscale2;
    if (cfg_rope(c, where, hp, &mscale2, err))
        return -1;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (hp->n_layers > MODEL_MAX_LAYERS)
        return errbuf_set(err, "%s: num_hidden_layers %d exceeds %d", where, hp->n_layers, MODEL_MAX_LAYERS);
    const json_t *only = json_object_get(c, "mlp_only_layers");
    if (sparse_step < 1)
        return errbuf_set(err, "%s: decoder_sparse_step %d must be at least 1", where, sparse_step);
    for (int i = 0; i < hp->n_layers; i++) {
        int dense_only = 0;
        for (size_t j = 0; json_is_array(only) && j < json_array_size(only); j++)
            dense_only |= json_integer_value(json_array_get(only, j)) == i;
        int moe = hp->n_experts > 0 && !dense_only && (i + 1) % sparse_step == 0;
        hp->attn_kind[i] = ATTN_GQA;
        hp->ffn_kind[i] = moe ? FFN_MOE : FFN_DENSE;
        if (!moe && hp->dense_inter <= 0)
            return errbuf_set(err, "%s: layer %d is dense but intermediate_size is missing", where, i);
        if (moe && hp->moe_inter <= 0)
            return errbuf_set(err, "%s: layer %d is MoE but moe_intermediate_size is missing", where, i);
    }
    return cfg_validate(hp, where, err);
}

static int qwen3_bind(model *m, const char *prefix, errbuf *err)
{
    hparams *hp = &m->hp;
    int H = hp->hidden, qd = hp->n_heads * hp->head_dim, kd = hp->n_kv_heads * hp->head_dim;
    char base[256], p[300], q[400];
    snprintf(base, sizeof base, "%smodel.", prefix);
    for (int i = 0; i < hp->n_layers; i++) {
        layer_w *L = &m->L[i];
        model_scope(m, MODEL_PART_SPINE, i, -1, MODEL_ROLE_OTHER);
        gqa_w *a = &L->gqa;
        snprintf(p, sizeof p, "%slayers.%d.", base, i);
        snprintf(q, sizeof q, "%sself_attn.", p);
        if (model_vec(m, &L->in_norm, H, 0, err, "%sinput_layernorm.weight", p) ||
            model_vec(m, &L->post_norm, H, 0, err, "%spost_attention_layernorm.weight", p) ||
            model_mat(m, &a->q, qd, H, err, "%sq_proj", q) || model_mat(m, &a->k, kd, H, err, "%sk_proj", q) ||
            model_mat(m, &a->v, kd, H, err, "%sv_proj", q) || model_mat(m, &a->o, H, qd, err, "%so_proj", q))
            return -1;
        if (model_has(m, "%sq_norm.weight", q) &&
            (model_vec(m, &a->q_norm, hp->head_dim, 0, err, "%sq_norm.weight", q) ||
             model_vec(m, &a->k_norm, hp->head_dim, 0, err, "%sk_norm.weight", q)))
            return -1;
        snprintf(q, sizeof q, "%smlp.", p);
        if (hp->ffn_kind[i] == FFN_DENSE) {
            if (fam_bind_mlp(m, &L->mlp, hp->dense_inter, H, err, q, "gate_proj", "up_proj", "down_proj"))
                return -1;
            continue;
        }
        if (model_mat(m, &L->moe.router, hp->n_experts, H, err, "%sgate", q) ||
            fam_bind_experts(m, i, q, &L->moe, H, FAM_EXPERT_NAMES, err))
            return -1;
    }
    return fam_bind_globals(m, base, prefix, err);
}

static const char *const qwen3_types[] = {"qwen3", "qwen3_moe", NULL};
const family fam_qwen3 = {.model_types = qwen3_types, .config = qwen3_config, .bind = qwen3_bind};
