/* synth.c — see synth.h. */
#include "model/synth.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/rng.h"
#include "kernels/dtype.h"
#include "model/st_write.h"

int synth_preset(const char *name, synth_k3 *c)
{
    memset(c, 0, sizeof *c);
    if (strcmp(name, "k3-tiny") == 0) {
        *c = (synth_k3){.hidden = 128, .layers = 8, .vocab = 1024, .heads = 4, .q_lora = 64, .kv_lora = 32,
                        .nope = 32, .rope = 16, .v_head = 32, .kda_heads = 4, .kda_dim = 32, .dense_inter = 384,
                        .moe_inter = 64, .experts = 16, .top_k = 4, .shared = 1, .latent = 64,
                        .attnres_block = 3, .seed = 1};
        return 0;
    }
    if (strcmp(name, "k3-mini") == 0) { /* K3's layout at hidden 2048: 24 layers, top-16, 6.7 MB experts */
        *c = (synth_k3){.hidden = 2048, .layers = 24, .vocab = 32768, .heads = 16, .q_lora = 512, .kv_lora = 256,
                        .nope = 128, .rope = 64, .v_head = 128, .kda_heads = 16, .kda_dim = 128,
                        .dense_inter = 8192, .moe_inter = 2048, .experts = 256, .top_k = 16, .shared = 2,
                        .latent = 2048, .attnres_block = 12, .seed = 1};
        return 0;
    }
    /* K3's own expert shape (latent 3584, expert width 3072: 17.5 MB MXFP4 experts, as released),
     * at hidden 3584 and 8 layers: one layer's misses are as many bytes in flight as K3's */
    if (strcmp(name, "k3-wide") == 0) {
        *c = (synth_k3){.hidden = 3584, .layers = 8, .vocab = 32768, .heads = 28, .q_lora = 768, .kv_lora = 512,
                        .nope = 128, .rope = 64, .v_head = 128, .kda_heads = 28, .kda_dim = 128,
                        .dense_inter = 9216, .moe_inter = 3072, .experts = 64, .top_k = 16, .shared = 2,
                        .latent = 3584, .attnres_block = 4, .seed = 1};
        return 0;
    }
    return -1;
}

static int is_mla(const synth_k3 *c, int i) { return i % 4 == 3 || i == c->layers - 1; }

/* kinds of fill */
enum { F_NORMAL, F_ONES_NOISE, F_PROJ, F_ALOG, F_SMALL, F_MX_CODES, F_MX_SCALE };

typedef struct tdesc {
    st_wtensor t;
    int fill;
    float scale; /* standard deviation (F_NORMAL) */
} tdesc;

typedef struct synth_ctx {
    const synth_k3 *c;
    tdesc *d;
    int n, cap;
} synth_ctx;

static int add(synth_ctx *s, int fill, float scale, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2,
               const char *fmt, ...) __attribute__((format(printf, 9, 10)));
static int add(synth_ctx *s, int fill, float scale, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2,
               const char *fmt, ...)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        tdesc *nd = realloc(s->d, sizeof *nd * (size_t)s->cap);
        if (!nd)
            return -1;
        s->d = nd;
    }
    tdesc *t = &s->d[s->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->t.name, sizeof t->t.name, fmt, ap);
    va_end(ap);
    t->t.dtype = dtype;
    t->t.ndim = ndim;
    t->t.shape[0] = d0;
    t->t.shape[1] = d1;
    t->t.shape[2] = d2;
    t->fill = fill;
    t->scale = scale;
    return 0;
}

/* An approximately normal value from integers only (Irwin-Hall of 4 uniforms), so the result
 * is the same on every machine and libm. */
static float approx_normal(rng *r)
{
    uint64_t x = rng_next(r);
    int32_t s = (int32_t)(x & 0xFFFF) + (int32_t)((x >> 16) & 0xFFFF) + (int32_t)((x >> 32) & 0xFFFF) +
                (int32_t)(x >> 48) - 2 * 65535;
    return (float)s * (1.0f / 37837.0f); /* sd of the sum is 65535 * sqrt(4/12) = 37837 */
}

static const float ln_int[15] = {0.0f,        0.69314718f, 1.09861229f, 1.38629436f, 1.60943791f,
                                 1.79175947f, 1.94591015f, 2.07944154f, 2.19722458f, 2.30258509f,
                                 2.39789527f, 2.48490665f, 2.56494936f, 2.63905733f, 2.70805020f};

/* floor(log2(x)) for x > 0, exactly */
static int ilog2f(float x)
{
    int e;
    frexpf(x, &e);
    return e - 1;
}

static int fill_tensor(void *ud, int idx, uint8_t *buf, uint64_t n, errbuf *err)
{
    synth_ctx *s = ud;
    const tdesc *d = &s->d[idx];
    rng r;
    rng_seed(&r, s->c->seed * 1000003u + (uint64_t)idx);
    uint64_t cnt = n / (uint64_t)st_dtype_size(d->t.dtype);
    if (d->fill == F_MX_CODES) { /* eight random codes per draw */
        for (uint64_t i = 0; i < n; i += 8) {
            uint64_t v = rng_next(&r);
            memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
        }
        return 0;
    }
    for (uint64_t i = 0; i < cnt; i++) {
        float v;
        switch (d->fill) {
        case F_MX_SCALE:
            buf[i] = (uint8_t)(127 + (int)d->scale + (int)(rng_next(&r) % 2));
            continue;
        case F_ONES_NOISE:
            v = 1.0f + 0.2f * approx_normal(&r);
            break;
        case F_ALOG: /* ln of an integer in [1, 16): per-head decay rate, from a table (no libm) */
            v = ln_int[rng_next(&r) % 15];
            break;
        default:
            v = d->scale * approx_normal(&r);
        }
        if (d->t.dtype == ST_F32) {
            memcpy(buf + 4 * i, &v, 4);
        } else {
            uint16_t h = f32_to_bf16(v);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    (void)err;
    return 0;
}

static float inv_sqrt(int n) { return 1.0f / sqrtf((float)n); }

static int build(synth_ctx *s)
{
    const synth_k3 *c = s->c;
    int H = c->hidden, P = c->kda_heads * c->kda_dim, qd = c->nope + c->rope, E = c->experts;
    int rc = 0;
#define A(...) rc |= add(s, __VA_ARGS__)
    const char *lm = "language_model.model.";
    A(F_NORMAL, 1.0f, ST_BF16, 2, c->vocab, H, 0, "%sembed_tokens.weight", lm);
    for (int i = 0; i < c->layers; i++) {
        char p[128];
        snprintf(p, sizeof p, "%slayers.%d.", lm, i);
        A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%sinput_layernorm.weight", p);
        A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%spost_attention_layernorm.weight", p);
        A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%sself_attention_res_norm.weight", p);
        A(F_NORMAL, 0.5f, ST_BF16, 2, 1, H, 0, "%sself_attention_res_proj.weight", p);
        A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%smlp_res_norm.weight", p);
        A(F_NORMAL, 0.5f, ST_BF16, 2, 1, H, 0, "%smlp_res_proj.weight", p);
        if (is_mla(c, i)) {
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->q_lora, H, 0, "%sself_attn.q_a_proj.weight", p);
            A(F_ONES_NOISE, 0, ST_BF16, 1, c->q_lora, 0, 0, "%sself_attn.q_a_layernorm.weight", p);
            A(F_NORMAL, inv_sqrt(c->q_lora), ST_BF16, 2, c->heads * qd, c->q_lora, 0, "%sself_attn.q_b_proj.weight",
              p);
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->kv_lora + c->rope, H, 0, "%sself_attn.kv_a_proj_with_mqa.weight",
              p);
            A(F_ONES_NOISE, 0, ST_BF16, 1, c->kv_lora, 0, 0, "%sself_attn.kv_a_layernorm.weight", p);
            A(F_NORMAL, inv_sqrt(c->kv_lora), ST_BF16, 2, c->heads * (c->nope + c->v_head), c->kv_lora, 0,
              "%sself_attn.kv_b_proj.weight", p);
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->heads * c->v_head, H, 0, "%sself_attn.g_proj.weight", p);
            A(F_NORMAL, inv_sqrt(c->heads * c->v_head), ST_BF16, 2, H, c->heads * c->v_head, 0,
              "%sself_attn.o_proj.weight", p);
        } else {
            static const char *qkv[3] = {"q", "k", "v"};
            for (int j = 0; j < 3; j++) {
                A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, P, H, 0, "%sself_attn.%s_proj.weight", p, qkv[j]);
                A(F_NORMAL, 0.5f, ST_F32, 3, P, 1, 4, "%sself_attn.%s_conv1d.weight", p, qkv[j]);
            }
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->kda_dim, H, 0, "%sself_attn.f_a_proj.weight", p);
            A(F_NORMAL, inv_sqrt(c->kda_dim), ST_BF16, 2, P, c->kda_dim, 0, "%sself_attn.f_b_proj.weight", p);
            A(F_ALOG, 0, ST_F32, 1, c->kda_heads, 0, 0, "%sself_attn.A_log", p);
            A(F_NORMAL, 0.1f, ST_F32, 1, P, 0, 0, "%sself_attn.dt_bias", p);
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->kda_heads, H, 0, "%sself_attn.b_proj.weight", p);
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, P, H, 0, "%sself_attn.g_proj.weight", p);
            A(F_ONES_NOISE, 0, ST_F32, 1, c->kda_dim, 0, 0, "%sself_attn.o_norm.weight", p);
            A(F_NORMAL, inv_sqrt(P), ST_BF16, 2, H, P, 0, "%sself_attn.o_proj.weight", p);
        }
        if (i == 0) {
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->dense_inter, H, 0, "%smlp.gate_proj.weight", p);
            A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->dense_inter, H, 0, "%smlp.up_proj.weight", p);
            A(F_NORMAL, inv_sqrt(c->dense_inter), ST_BF16, 2, H, c->dense_inter, 0, "%smlp.down_proj.weight", p);
            continue;
        }
        char m[160];
        snprintf(m, sizeof m, "%sblock_sparse_moe.", p);
        A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, E, H, 0, "%sgate.weight", m);
        A(F_NORMAL, 0.1f, ST_F32, 1, E, 0, 0, "%sgate.e_score_correction_bias", m);
        A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->latent, H, 0, "%srouted_expert_down_proj.weight", m);
        A(F_NORMAL, inv_sqrt(c->latent), ST_BF16, 2, H, c->latent, 0, "%srouted_expert_up_proj.weight", m);
        A(F_ONES_NOISE, 0, ST_BF16, 1, c->latent, 0, 0, "%srouted_expert_norm.weight", m);
        /* E2M1 codes average |v| ~ 2.6: pick the E8M0 exponent so |w| ~ 1/sqrt(fan_in) */
        int e_in = ilog2f(inv_sqrt(c->latent) / 2.6f), e_out = ilog2f(inv_sqrt(c->moe_inter) / 2.6f);
        for (int e = 0; e < E; e++) {
            static const char *w[3] = {"w1", "w3", "w2"};
            for (int j = 0; j < 3; j++) {
                int rows = j < 2 ? c->moe_inter : c->latent, cols = j < 2 ? c->latent : c->moe_inter;
                A(F_MX_CODES, 0, ST_U8, 2, rows, cols / 2, 0, "%sexperts.%d.%s.weight_packed", m, e, w[j]);
                A(F_MX_SCALE, (float)(j < 2 ? e_in : e_out), ST_U8, 2, rows, cols / 32, 0,
                  "%sexperts.%d.%s.weight_scale", m, e, w[j]);
            }
        }
        int si = c->shared * c->moe_inter;
        A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, si, H, 0, "%sshared_experts.gate_proj.weight", m);
        A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, si, H, 0, "%sshared_experts.up_proj.weight", m);
        A(F_NORMAL, inv_sqrt(si), ST_BF16, 2, H, si, 0, "%sshared_experts.down_proj.weight", m);
    }
    A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%snorm.weight", lm);
    A(F_ONES_NOISE, 0, ST_BF16, 1, H, 0, 0, "%soutput_attn_res_norm.weight", lm);
    A(F_NORMAL, 0.5f, ST_BF16, 2, 1, H, 0, "%soutput_attn_res_proj.weight", lm);
    A(F_NORMAL, inv_sqrt(H), ST_BF16, 2, c->vocab, H, 0, "language_model.lm_head.weight");
#undef A
    return rc;
}

static json_t *config_json(const synth_k3 *c)
{
    json_t *full = json_array(), *kda = json_array();
    for (int i = 0; i < c->layers; i++)
        json_array_append_new(is_mla(c, i) ? full : kda, json_integer(i + 1)); /* 1-based, as K3 */
    json_t *lac = json_pack("{s:o, s:o, s:i, s:i, s:i, s:f, s:b}", "full_attn_layers", full, "kda_layers", kda,
                            "num_heads", c->kda_heads, "head_dim", c->kda_dim, "short_conv_kernel_size", 4,
                            "gate_lower_bound", -5.0, "use_full_rank_gate", 1);
    json_t *text = json_pack(
        "{s:s, s:[s], s:i, s:i, s:i, s:f, s:s, s:f, s:f, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b,"
        " s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:s, s:f, s:i, s:i, s:s, s:b, s:i, s:b, s:i, s:i, s:i, s:i,"
        " s:b}",
        "model_type", "kimi_linear", "architectures", "KimiLinearForCausalLM", "hidden_size", c->hidden,
        "num_hidden_layers", c->layers, "vocab_size", c->vocab, "rms_norm_eps", 1e-5, "hidden_act", "situ",
        "activation_situ_beta", 4.0, "activation_situ_linear_beta", 25.0, "num_attention_heads", c->heads,
        "num_key_value_heads", c->heads, "q_lora_rank", c->q_lora, "kv_lora_rank", c->kv_lora, "qk_nope_head_dim",
        c->nope, "qk_rope_head_dim", c->rope, "v_head_dim", c->v_head, "intermediate_size", c->dense_inter,
        "first_k_dense_replace", 1, "mla_use_nope", 1, "mla_use_output_gate", 1, "linear_attn_config", lac,
        "moe_intermediate_size", c->moe_inter, "num_experts", c->experts, "num_experts_per_token", c->top_k,
        "num_shared_experts", c->shared, "num_expert_group", 1, "topk_group", 1, "moe_renormalize", 1,
        "moe_router_activation_func", "sigmoid", "routed_scaling_factor", 1.0, "routed_expert_hidden_size", c->latent,
        "moe_layer_freq", 1, "topk_method", "noaux_tc", "use_grouped_topk", 1, "attn_res_block_size",
        c->attnres_block, "latent_moe_use_norm", 1, "bos_token_id", 1, "eos_token_id", 2, "pad_token_id", 0,
        "max_position_embeddings", 1048576, "tie_word_embeddings", 0);
    json_t *q = json_pack("{s:s, s:s, s:s, s:[s,s,s,s,s,s], s:{s:{s:[s], s:s, s:{s:i, s:s, s:s, s:i, s:b, s:s}}}}",
                          "quant_method", "compressed-tensors", "format", "mxfp4-pack-quantized", "quantization_status",
                          "compressed", "ignore", "re:.*self_attn.*", "re:.*shared_experts.*",
                          "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*", "re:.*vision_tower.*",
                          "re:.*mm_projector.*", "config_groups", "group_0", "targets", "Linear", "format",
                          "mxfp4-pack-quantized", "weights", "num_bits", 4, "type", "float", "strategy", "group",
                          "group_size", 32, "symmetric", 1, "scale_dtype", "torch.uint8");
    json_object_set_new(text, "quantization_config", q);
    return json_pack("{s:[s], s:s, s:o, s:i, s:i, s:i, s:b, s:s}", "architectures", "KimiK3ForConditionalGeneration",
                     "model_type", "kimi_k3", "text_config", text, "bos_token_id", 1, "eos_token_id", 2,
                     "pad_token_id", 0, "tie_word_embeddings", 0, "note",
                     "synthetic random weights written by deltafin synth");
}

uint64_t synth_bytes(const synth_k3 *c)
{
    synth_ctx s = {c, NULL, 0, 0};
    uint64_t total = 0;
    if (build(&s) == 0)
        for (int i = 0; i < s.n; i++)
            total += st_wtensor_bytes(&s.d[i].t);
    free(s.d);
    return total;
}

void synth_scale(synth_k3 *c, double gb)
{
    synth_k3 one = *c;
    one.experts = one.top_k;
    uint64_t base = synth_bytes(&one);
    one.experts = one.top_k + 1;
    uint64_t per = synth_bytes(&one) - base; /* one more expert in every MoE layer */
    double want = gb * 1e9;
    int e = one.top_k;
    if (want > (double)base && per > 0)
        e += (int)((want - (double)base) / (double)per);
    c->experts = e;
}

int synth_k3_write(const synth_k3 *c, const char *dir, errbuf *err)
{
    if (c->hidden % 32 || c->latent % 32 || c->moe_inter % 32 || c->layers < 2 || c->experts < c->top_k)
        return errbuf_set(err, "synth: widths must be multiples of 32, at least 2 layers, experts >= top-k");
    synth_ctx s = {c, NULL, 0, 0};
    if (build(&s) != 0) {
        free(s.d);
        return errbuf_set(err, "synth: out of memory");
    }
    st_wtensor *t = malloc(sizeof *t * (size_t)s.n);
    char path[4096];
    int rc = -1;
    if (!t) {
        errbuf_set(err, "synth: out of memory");
        goto out;
    }
    for (int i = 0; i < s.n; i++)
        t[i] = s.d[i].t;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write_file(path, t, s.n, fill_tensor, &s, err) != 0)
        goto out;
    json_t *cfg = config_json(c);
    char *text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(cfg);
    if (!text) {
        errbuf_set(err, "synth: cannot encode config.json");
        goto out;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = file_write_atomic(path, text, strlen(text), err);
    free(text);
out:
    free(t);
    free(s.d);
    return rc;
}
