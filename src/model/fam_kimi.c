/* fam_kimi.c — the Kimi linear-attention family: Kimi K3 (model_type kimi_k3, text model in
 * text_config, tensors under "language_model.") and Kimi-Linear (kimi_linear).
 *
 * Layers are KDA or MLA (NoPE: the 64-wide "rope" slice is never rotated), MLPs are dense in
 * the first layers and MoE after (sigmoid router, bias for selection only). K3 adds: the
 * lower-bound KDA gate, a full-rank KDA output gate, the MLA output gate, SiTU-GLU, the latent
 * MoE with its norm, and Block AttnRes. Layer lists in linear_attn_config are 1-based.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kmath.h"
#include "model/config.h"

static int in_list(const json_t *arr, int v)
{
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (json_is_integer(json_array_get(arr, i)) && json_integer_value(json_array_get(arr, i)) == v)
            return 1;
    return 0;
}

static int kimi_config(hparams *hp, const void *jc, const char *where, errbuf *err)
{
    const json_t *c = jc;
    const json_t *lac = json_object_get(c, "linear_attn_config");
    char lwhere[1400];
    snprintf(lwhere, sizeof lwhere, "%s linear_attn_config", where);
    if (cfg_dim(c, where, &hp->hidden, err, "hidden_size", NULL) ||
        cfg_dim(c, where, &hp->n_layers, err, "num_hidden_layers", NULL) ||
        cfg_dim(c, where, &hp->vocab, err, "vocab_size", NULL) ||
        cfg_float(c, where, &hp->rms_eps, 1e-5, 0, err, "rms_norm_eps", NULL) ||
        cfg_dim(c, where, &hp->n_heads, err, "num_attention_heads", NULL) ||
        cfg_int(c, where, &hp->q_lora_rank, 0, err, "q_lora_rank", NULL) ||
        cfg_dim(c, where, &hp->kv_lora_rank, err, "kv_lora_rank", NULL) ||
        cfg_dim(c, where, &hp->qk_nope, err, "qk_nope_head_dim", NULL) ||
        cfg_int(c, where, &hp->qk_rope, 0, err, "qk_rope_head_dim", NULL) ||
        cfg_dim(c, where, &hp->v_head, err, "v_head_dim", NULL) ||
        cfg_bool(c, where, &hp->mla_out_gate, 0, err, "mla_use_output_gate", NULL) ||
        cfg_bool(c, where, &hp->tie_embeddings, 0, err, "tie_word_embeddings", NULL))
        return -1;
    int nope = 1;
    if (cfg_bool(c, where, &nope, 1, err, "mla_use_nope", NULL))
        return -1;
    if (!nope)
        return errbuf_set(err, "%s: mla_use_nope=false (rotary MLA) is not part of this family", where);
    hp->rope = ROPE_NONE;
    hp->mla_norm_eps = 1e-6f;
    hp->attn_scale = 1.0f / sqrtf((float)(hp->qk_nope + hp->qk_rope));

    /* KDA */
    if (!json_is_object(lac))
        lac = c; /* HF 5.x flattens these keys */
    if (cfg_dim(lac, lwhere, &hp->kda_heads, err, "num_heads", "linear_num_heads", NULL) ||
        cfg_dim(lac, lwhere, &hp->kda_dim, err, "head_dim", "linear_head_dim", NULL) ||
        cfg_int(lac, lwhere, &hp->conv_k, 4, err, "short_conv_kernel_size", "linear_conv_kernel_dim", NULL) ||
        cfg_bool(lac, lwhere, &hp->kda_full_gate, 0, err, "use_full_rank_gate", NULL))
        return -1;
    if (hp->conv_k < 1 || hp->conv_k > 16)
        return errbuf_set(err, "%s: short_conv_kernel_size %d out of range 1..16", lwhere, hp->conv_k);
    const json_t *lb = json_object_get(lac, "gate_lower_bound");
    hp->kda_gate = json_is_number(lb) ? KDA_GATE_LOWER_BOUND : KDA_GATE_SOFTPLUS;
    hp->kda_lower_bound = json_is_number(lb) ? (float)json_number_value(lb) : 0.0f;
    const json_t *kl = json_object_get(lac, "kda_layers"), *lt = json_object_get(c, "layer_types");
    if (hp->n_layers > MODEL_MAX_LAYERS)
        return errbuf_set(err, "%s: num_hidden_layers %d exceeds %d", where, hp->n_layers, MODEL_MAX_LAYERS);
    for (int i = 0; i < hp->n_layers; i++) {
        if (json_is_array(kl)) {
            hp->attn_kind[i] = in_list(kl, i + 1) ? ATTN_KDA : ATTN_MLA; /* 1-based list */
        } else if (json_is_array(lt) && json_array_size(lt) == (size_t)hp->n_layers) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (!s || (strcmp(s, "linear_attention") && strcmp(s, "full_attention")))
                return errbuf_set(err, "%s: layer_types[%d] is not \"linear_attention\" or \"full_attention\"", where,
                                  i);
            hp->attn_kind[i] = strcmp(s, "linear_attention") == 0 ? ATTN_KDA : ATTN_MLA;
        } else {
            return errbuf_set(err, "%s: missing field 'kda_layers' (or layer_types)", lwhere);
        }
    }

    /* feed-forward */
    const char *act = "silu";
    const json_t *ja = json_object_get(c, "hidden_act");
    if (json_is_string(ja))
        act = json_string_value(ja);
    if (strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0)
        hp->act = ACT_SILU;
    else if (strcmp(act, "situ") == 0)
        hp->act = ACT_SITU;
    else
        return errbuf_set(err, "%s: hidden_act '%s' is not supported (silu, situ)", where, act);
    int first_dense = 1, freq = 1;
    if (cfg_float(c, where, &hp->situ_beta, 4.0, 0, err, "activation_situ_beta", NULL) ||
        cfg_float(c, where, &hp->situ_linear_beta, 25.0, 0, err, "activation_situ_linear_beta", NULL) ||
        cfg_int(c, where, &hp->dense_inter, 0, err, "intermediate_size", NULL) ||
        cfg_int(c, where, &hp->moe_inter, 0, err, "moe_intermediate_size", NULL) ||
        cfg_int(c, where, &hp->n_experts, 0, err, "num_experts", "num_local_experts", NULL) ||
        cfg_int(c, where, &hp->top_k, 0, err, "num_experts_per_token", "num_experts_per_tok", NULL) ||
        cfg_int(c, where, &hp->n_shared, 0, err, "num_shared_experts", "n_shared_experts", NULL) ||
        cfg_int(c, where, &first_dense, 1, err, "first_k_dense_replace", NULL) ||
        cfg_int(c, where, &freq, 1, err, "moe_layer_freq", NULL) ||
        cfg_int(c, where, &hp->n_group, 1, err, "num_expert_group", "n_group", NULL) ||
        cfg_int(c, where, &hp->topk_group, 1, err, "topk_group", NULL) ||
        cfg_bool(c, where, &hp->norm_topk, 1, err, "moe_renormalize", "norm_topk_prob", NULL) ||
        cfg_float(c, where, &hp->routed_scale, 1.0, 0, err, "routed_scaling_factor", NULL) ||
        cfg_int(c, where, &hp->latent, 0, err, "routed_expert_hidden_size", NULL) ||
        cfg_bool(c, where, &hp->latent_norm, 0, err, "latent_moe_use_norm", NULL) ||
        cfg_int(c, where, &hp->attnres_block, 0, err, "attn_res_block_size", NULL))
        return -1;
    const json_t *rf = json_object_get(c, "moe_router_activation_func");
    if (json_is_string(rf) && strcmp(json_string_value(rf), "sigmoid") != 0)
        return errbuf_set(err, "%s: moe_router_activation_func '%s' is not supported (sigmoid)", where,
                          json_string_value(rf));
    hp->router = ROUTER_SIGMOID;
    hp->shared_inter = hp->n_shared * hp->moe_inter;
    if (freq < 1)
        return errbuf_set(err, "%s: moe_layer_freq %d must be at least 1", where, freq);
    const json_t *mt = json_object_get(c, "mlp_layer_types");
    for (int i = 0; i < hp->n_layers; i++) {
        int moe = hp->n_experts > 0 && i >= first_dense && i % freq == 0;
        if (json_is_array(mt) && json_array_size(mt) == (size_t)hp->n_layers) {
            const char *s = json_string_value(json_array_get(mt, (size_t)i));
            if (!s || (strcmp(s, "sparse") && strcmp(s, "dense")))
                return errbuf_set(err, "%s: mlp_layer_types[%d] is not \"sparse\" or \"dense\"", where, i);
            moe = strcmp(s, "sparse") == 0;
        }
        hp->ffn_kind[i] = moe ? FFN_MOE : FFN_DENSE;
        if (!moe && hp->dense_inter <= 0)
            return errbuf_set(err, "%s: layer %d is dense but intermediate_size is missing", where, i);
        if (moe && hp->moe_inter <= 0)
            return errbuf_set(err, "%s: layer %d is MoE but moe_intermediate_size is missing", where, i);
    }
    if (hp->latent && !hp->latent_norm)
        return errbuf_set(err, "%s: latent MoE without latent_moe_use_norm is not supported", where);
    return cfg_validate(hp, where, err);
}

static int rows_of(const model *m, const char *name)
{
    const st_tensor *t = st_find(&m->st, name);
    return t && t->ndim == 2 ? (int)t->shape[0] : -1;
}

static int bind_kda(model *m, const char *p, kda_w *w, errbuf *err)
{
    const hparams *hp = &m->hp;
    int H = hp->hidden, P = hp->kda_heads * hp->kda_dim, K = hp->conv_k;
    char name[512];
    snprintf(name, sizeof name, "%sf_a_proj.weight", p);
    int r = rows_of(m, name);
    if (r <= 0)
        return errbuf_set(err, "%s: missing tensor '%s'", m->dir, name);
    static const char *qkv[3] = {"q", "k", "v"};
    kmat *proj[3] = {&w->q, &w->k, &w->v};
    for (int j = 0; j < 3; j++)
        if (model_mat(m, proj[j], P, H, err, "%s%s_proj", p, qkv[j]) ||
            model_vec(m, &w->conv[j], P * K, 0, err, "%s%s_conv1d.weight", p, qkv[j]))
            return -1;
    if (model_mat(m, &w->f_a, r, H, err, "%sf_a_proj", p) || model_mat(m, &w->f_b, P, r, err, "%sf_b_proj", p) ||
        model_mat(m, &w->b, hp->kda_heads, H, err, "%sb_proj", p) ||
        model_vec(m, &w->A, hp->kda_heads, 1, err, "%sA_log", p) ||
        model_vec(m, &w->dt_bias, P, 0, err, "%sdt_bias", p) ||
        model_vec(m, &w->o_norm, hp->kda_dim, 0, err, "%so_norm.weight", p) ||
        model_mat(m, &w->o, H, P, err, "%so_proj", p))
        return -1;
    for (int h = 0; h < hp->kda_heads; h++)
        w->A[h] = km_expf(w->A[h]); /* the gate uses exp(A_log) per head */
    if (hp->kda_full_gate)
        return model_mat(m, &w->g, P, H, err, "%sg_proj", p);
    snprintf(name, sizeof name, "%sg_a_proj.weight", p);
    int rg = rows_of(m, name);
    if (rg <= 0)
        return errbuf_set(err, "%s: missing tensor '%s' (low-rank KDA output gate)", m->dir, name);
    return model_mat(m, &w->g_a, rg, H, err, "%sg_a_proj", p) || model_mat(m, &w->g_b, P, rg, err, "%sg_b_proj", p)
               ? -1
               : 0;
}

static int bind_attnres(model *m, float **u, const char *norm, const char *proj, errbuf *err)
{
    float *n, *pj;
    if (model_vec(m, &n, m->hp.hidden, 0, err, "%s", norm) || model_vec(m, &pj, m->hp.hidden, 0, err, "%s", proj))
        return -1;
    for (int i = 0; i < m->hp.hidden; i++)
        n[i] = n[i] * pj[i]; /* score vector u = gamma * p, folded once */
    *u = n;
    return 0;
}

static int kimi_bind(model *m, const char *prefix, errbuf *err)
{
    hparams *hp = &m->hp;
    int H = hp->hidden;
    char base[256], p[300];
    snprintf(base, sizeof base, "%smodel.", prefix);
    for (int i = 0; i < hp->n_layers; i++) {
        layer_w *L = &m->L[i];
        model_scope(m, MODEL_PART_SPINE, i, -1, MODEL_ROLE_OTHER);
        snprintf(p, sizeof p, "%slayers.%d.", base, i);
        if (model_vec(m, &L->in_norm, H, 0, err, "%sinput_layernorm.weight", p) ||
            model_vec(m, &L->post_norm, H, 0, err, "%spost_attention_layernorm.weight", p))
            return -1;
        if (hp->attnres_block > 0) {
            char n1[400], p1[400], n2[400], p2[400];
            snprintf(n1, sizeof n1, "%sself_attention_res_norm.weight", p);
            snprintf(p1, sizeof p1, "%sself_attention_res_proj.weight", p);
            snprintf(n2, sizeof n2, "%smlp_res_norm.weight", p);
            snprintf(p2, sizeof p2, "%smlp_res_proj.weight", p);
            if (bind_attnres(m, &L->res_u[0], n1, p1, err) || bind_attnres(m, &L->res_u[1], n2, p2, err))
                return -1;
        }
        char ap[400];
        snprintf(ap, sizeof ap, "%sself_attn.", p);
        if ((hp->attn_kind[i] == ATTN_KDA ? bind_kda(m, ap, &L->kda, err) : fam_bind_mla(m, ap, &L->mla, err)) != 0)
            return -1;
        char fp[400];
        if (hp->ffn_kind[i] == FFN_DENSE) {
            /* K3 names the dense MLP mlp.*; HF-saved Kimi-Linear writes block_sparse_moe.* */
            snprintf(fp, sizeof fp, "%s%s", p,
                     model_has(m, "%smlp.gate_proj.weight", p) ? "mlp." : "block_sparse_moe.");
            if (fam_bind_mlp(m, &L->mlp, hp->dense_inter, H, err, fp, "gate_proj", "up_proj", "down_proj"))
                return -1;
            continue;
        }
        moe_w *moe = &L->moe;
        snprintf(fp, sizeof fp, "%sblock_sparse_moe.", p);
        int D = hp->latent ? hp->latent : H;
        if (model_mat(m, &moe->router, hp->n_experts, H, err, "%sgate", fp))
            return -1;
        if (model_has(m, "%sgate.e_score_correction_bias", fp)) {
            if (model_vec(m, &moe->bias, hp->n_experts, 0, err, "%sgate.e_score_correction_bias", fp))
                return -1;
        }
        if (hp->latent &&
            (model_mat(m, &moe->lat_down, hp->latent, H, err, "%srouted_expert_down_proj", fp) ||
             model_mat(m, &moe->lat_up, H, hp->latent, err, "%srouted_expert_up_proj", fp) ||
             model_vec(m, &moe->lat_norm, hp->latent, 0, err, "%srouted_expert_norm.weight", fp)))
            return -1;
        static const char *const kimi_experts[3] = {"w1", "w3", "w2"}; /* gate, up, down */
        if (fam_bind_experts(m, i, fp, moe, D, kimi_experts, err))
            return -1;
        if (hp->n_shared > 0 && fam_bind_mlp(m, &moe->shared, hp->shared_inter, H, err, fp,
                                             "shared_experts.gate_proj", "shared_experts.up_proj",
                                             "shared_experts.down_proj"))
            return -1;
    }
    if (fam_bind_globals(m, base, prefix, err))
        return -1;
    if (hp->attnres_block > 0) {
        char n[400], pj[400];
        snprintf(n, sizeof n, "%soutput_attn_res_norm.weight", base);
        snprintf(pj, sizeof pj, "%soutput_attn_res_proj.weight", base);
        if (bind_attnres(m, &m->out_res_u, n, pj, err))
            return -1;
    }
    return 0;
}

static const char *const kimi_types[] = {"kimi_k3", "kimi_linear", NULL};
const family fam_kimi = {.model_types = kimi_types, .config = kimi_config, .bind = kimi_bind};
