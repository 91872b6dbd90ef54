/* fam_deepseek.c — DeepSeek-V3 / R1 and the Kimi K2 line (kimi_k2; kimi_k25 wraps it in a
 * text_config with "language_model." names): MLA with interleaved (or half) RoPE and YaRN,
 * dense first layers, MoE with a sigmoid router, bias for selection only, grouped top-k.
 * Release formats: BF16, FP8 with 128x128 weight_scale_inv, INT4 pack-quantized experts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

static int deepseek_config(hparams *hp, const void *jc, const char *where, errbuf *err)
{
    const json_t *c = jc;
    int first_dense = 0, freq = 1, interleave = 1;
    if (cfg_dim(c, where, &hp->hidden, err, "hidden_size", NULL) ||
        cfg_dim(c, where, &hp->n_layers, err, "num_hidden_layers", NULL) ||
        cfg_dim(c, where, &hp->vocab, err, "vocab_size", NULL) ||
        cfg_float(c, where, &hp->rms_eps, 1e-6, 0, err, "rms_norm_eps", NULL) ||
        cfg_dim(c, where, &hp->n_heads, err, "num_attention_heads", NULL) ||
        cfg_int(c, where, &hp->q_lora_rank, 0, err, "q_lora_rank", NULL) ||
        cfg_dim(c, where, &hp->kv_lora_rank, err, "kv_lora_rank", NULL) ||
        cfg_dim(c, where, &hp->qk_nope, err, "qk_nope_head_dim", NULL) ||
        cfg_dim(c, where, &hp->qk_rope, err, "qk_rope_head_dim", NULL) ||
        cfg_dim(c, where, &hp->v_head, err, "v_head_dim", NULL) ||
        cfg_bool(c, where, &interleave, 1, err, "rope_interleave", NULL) ||
        cfg_bool(c, where, &hp->tie_embeddings, 0, err, "tie_word_embeddings", NULL) ||
        cfg_dim(c, where, &hp->dense_inter, err, "intermediate_size", NULL) ||
        cfg_int(c, where, &hp->moe_inter, 0, err, "moe_intermediate_size", NULL) ||
        cfg_int(c, where, &hp->n_experts, 0, err, "n_routed_experts", "num_experts", "num_local_experts", NULL) ||
        cfg_int(c, where, &hp->top_k, 0, err, "num_experts_per_tok", NULL) ||
        cfg_int(c, where, &hp->n_shared, 0, err, "n_shared_experts", NULL) ||
        cfg_int(c, where, &first_dense, 0, err, "first_k_dense_replace", NULL) ||
        cfg_int(c, where, &freq, 1, err, "moe_layer_freq", NULL) ||
        cfg_int(c, where, &hp->n_group, 1, err, "n_group", NULL) ||
        cfg_int(c, where, &hp->topk_group, 1, err, "topk_group", NULL) ||
        cfg_bool(c, where, &hp->norm_topk, 1, err, "norm_topk_prob", NULL) ||
        cfg_float(c, where, &hp->routed_scale, 2.5, 0, err, "routed_scaling_factor", NULL))
        return -1;
    const json_t *sf = json_object_get(c, "scoring_func");
    if (json_is_string(sf) && strcmp(json_string_value(sf), "sigmoid") != 0)
        return errbuf_set(err, "%s: scoring_func '%s' is not supported (sigmoid)", where, json_string_value(sf));
    const json_t *ha = json_object_get(c, "hidden_act");
    if (json_is_string(ha) && strcmp(json_string_value(ha), "silu") != 0)
        return errbuf_set(err, "%s: hidden_act '%s' is not supported (silu)", where, json_string_value(ha));
    hp->act = ACT_SILU;
    hp->router = ROUTER_SIGMOID;
    hp->shared_inter = hp->n_shared * hp->moe_inter;
    hp->mla_norm_eps = 1e-6f;
    hp->rope = interleave ? ROPE_INTERLEAVED : ROPE_NEOX;
    hp->rope_dim = hp->qk_rope;
    double mscale2;
    if (cfg_rope(c, where, hp, &mscale2, err))
        return -1;
    hp->attn_scale = (float)(1.0 / sqrt((double)(hp->qk_nope + hp->qk_rope)) * mscale2);
    if (freq < 1)
        return errbuf_set(err, "%s: moe_layer_freq %d must be at least 1", where, freq);
    if (hp->n_layers > MODEL_MAX_LAYERS)
        return errbuf_set(err, "%s: num_hidden_layers %d exceeds %d", where, hp->n_layers, MODEL_MAX_LAYERS);
    for (int i = 0; i < hp->n_layers; i++) {
        hp->attn_kind[i] = ATTN_MLA;
        int moe = hp->n_experts > 0 && i >= first_dense && i % freq == 0;
        hp->ffn_kind[i] = moe ? FFN_MOE : FFN_DENSE;
        if (moe && hp->moe_inter <= 0)
            return errbuf_set(err, "%s: layer %d is MoE but moe_intermediate_size is missing", where, i);
    }
    return cfg_validate(hp, where, err);
}

static int deepseek_bind(model *m, const char *prefix, errbuf *err)
{
    hparams *hp = &m->hp;
    int H = hp->hidden;
    char base[256], p[300], q[400];
    snprintf(base, sizeof base, "%smodel.", prefix);
    for (int i = 0; i < hp->n_layers; i++) {
        layer_w *L = &m->L[i];
        model_scope(m, MODEL_PART_SPINE, i, -1, MODEL_ROLE_OTHER);
        snprintf(p, sizeof p, "%slayers.%d.", base, i);
        snprintf(q, sizeof q, "%sself_attn.", p);
        if (model_vec(m, &L->in_norm, H, 0, err, "%sinput_layernorm.weight", p) ||
            model_vec(m, &L->post_norm, H, 0, err, "%spost_attention_layernorm.weight", p) ||
            fam_bind_mla(m, q, &L->mla, err))
            return -1;
        snprintf(q, sizeof q, "%smlp.", p);
        if (hp->ffn_kind[i] == FFN_DENSE) {
            if (fam_bind_mlp(m, &L->mlp, hp->dense_inter, H, err, q, "gate_proj", "up_proj", "down_proj"))
                return -1;
            continue;
        }
        moe_w *moe = &L->moe;
        if (model_mat(m, &moe->router, hp->n_experts, H, err, "%sgate", q))
            return -1;
        if (model_has(m, "%sgate.e_score_correction_bias", q)) {
            if (model_vec(m, &moe->bias, hp->n_experts, 0, err, "%sgate.e_score_correction_bias", q))
                return -1;
        }
        if (fam_bind_experts(m, i, q, moe, H, FAM_EXPERT_NAMES, err))
            return -1;
        if (hp->n_shared > 0 && fam_bind_mlp(m, &moe->shared, hp->shared_inter, H, err, q, "shared_experts.gate_proj",
                                             "shared_experts.up_proj", "shared_experts.down_proj"))
            return -1;
    }
    return fam_bind_globals(m, base, prefix, err);
}

static const char *const deepseek_types[] = {"deepseek_v3", "kimi_k2", "kimi_k25", NULL};
const family fam_deepseek = {.model_types = deepseek_types, .config = deepseek_config, .bind = deepseek_bind};
