/* config.c — see config.h. */
#include "model/config.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"

static const json_t *first_of(const json_t *c, va_list ap, const char **first)
{
    const char *k;
    *first = NULL;
    while ((k = va_arg(ap, const char *))) {
        if (!*first)
            *first = k;
        const json_t *v = json_is_object(c) ? json_object_get(c, k) : NULL;
        if (v && !json_is_null(v)) {
            *first = k;
            return v;
        }
    }
    return NULL;
}

int cfg_int(const json_t *c, const char *where, int *out, int dflt, errbuf *err, ...)
{
    va_list ap;
    va_start(ap, err);
    const char *key;
    const json_t *v = first_of(c, ap, &key);
    va_end(ap);
    if (!v) {
        if (dflt == CFG_REQUIRED)
            return errbuf_set(err, "%s: missing field '%s'", where, key);
        *out = dflt;
        return 0;
    }
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
    if (!(d == floor(d)) || fabs(d) > 2147483647.0)
        return errbuf_set(err, "%s: field '%s' must be an integer", where, key);
    *out = (int)d;
    return 0;
}

int cfg_dim(const json_t *c, const char *where, int *out, errbuf *err, ...)
{
    va_list ap;
    va_start(ap, err);
    const char *key;
    const json_t *v = first_of(c, ap, &key);
    va_end(ap);
    if (!v)
        return errbuf_set(err, "%s: missing field '%s'", where, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 28)) {
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        int rc = errbuf_set(err, "%s: field '%s' must be an integer in 1..%d, got %.40s", where, key, 1 << 28,
                            got ? got : "?");
        free(got);
        return rc;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

int cfg_float(const json_t *c, const char *where, float *out, double dflt, int required, errbuf *err, ...)
{
    va_list ap;
    va_start(ap, err);
    const char *key;
    const json_t *v = first_of(c, ap, &key);
    va_end(ap);
    if (!v) {
        if (required)
            return errbuf_set(err, "%s: missing field '%s'", where, key);
        *out = (float)dflt;
        return 0;
    }
    if (!json_is_number(v))
        return errbuf_set(err, "%s: field '%s' must be a number", where, key);
    *out = (float)json_number_value(v);
    return 0;
}

int cfg_bool(const json_t *c, const char *where, int *out, int dflt, errbuf *err, ...)
{
    va_list ap;
    va_start(ap, err);
    const char *key;
    const json_t *v = first_of(c, ap, &key);
    va_end(ap);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return errbuf_set(err, "%s: field '%s' must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static double num_or(const json_t *o, const char *k, double dflt)
{
    const json_t *v = json_is_object(o) ? json_object_get(o, k) : NULL;
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static double yarn_corr_dim(double rot, int dim, double base, double orig)
{
    return (dim * log(orig / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

/* The precision of the inverse-frequency table. Hugging Face keeps it in a module buffer, and
 * casting a model to its checkpoint dtype (model.to(bfloat16), as the reference runs that made
 * our oracle did for unquantized checkpoints) rounds that buffer to bf16; the rounded table is
 * then what every later computation uses, and at position 70 it moves logits by ~1e-3. So an
 * unquantized checkpoint declaring dtype bfloat16 / float16 gets its table rounded the same
 * way; quantized checkpoints (FP8, INT4, MXFP4) are dequantized, never cast, and keep float32. */
static void round_table(const json_t *c, hparams *hp)
{
    if (json_is_object(json_object_get(c, "quantization_config")))
        return;
    const json_t *d = json_object_get(c, "dtype");
    if (!json_is_string(d))
        d = json_object_get(c, "torch_dtype");
    const char *s = json_is_string(d) ? json_string_value(d) : "";
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        if (strcmp(s, "bfloat16") == 0)
            hp->rope_inv_freq[i] = bf16_to_f32(f32_to_bf16(hp->rope_inv_freq[i]));
        else if (strcmp(s, "float16") == 0)
            hp->rope_inv_freq[i] = f16_to_f32(f32_to_f16(hp->rope_inv_freq[i]));
    }
}

int cfg_rope(const json_t *c, const char *where, hparams *hp, double *mscale2, errbuf *err)
{
    *mscale2 = 1.0;
    hp->rope_attn_factor = 1.0f;
    const json_t *rp = json_object_get(c, "rope_parameters");
    if (!json_is_object(rp))
        rp = json_object_get(c, "rope_scaling"); /* legacy: rope_theta at top level */
    if (!json_is_object(rp))
        rp = NULL;
    double theta = num_or(rp, "rope_theta", num_or(c, "rope_theta", 10000.0));
    const char *type = "default";
    const json_t *t = rp ? json_object_get(rp, "rope_type") : NULL;
    if (!json_is_string(t) && rp)
        t = json_object_get(rp, "type");
    if (json_is_string(t))
        type = json_string_value(t);
    int dim = hp->rope_dim;
    if (dim <= 0 || dim > MODEL_MAX_ROPE || dim % 2)
        return errbuf_set(err, "%s: rotary dimension %d is not an even number up to %d", where, dim, MODEL_MAX_ROPE);
    if (!(theta > 1.0))
        return errbuf_set(err, "%s: rope_theta %g must be > 1", where, theta);
    for (int i = 0; i < dim / 2; i++) /* HF: 1 / base ** (arange(0, dim, 2) / dim), float32 */
        hp->rope_inv_freq[i] = (float)(1.0 / pow(theta, (double)(float)(2.0 * i / dim)));
    if (strcmp(type, "default") == 0) {
        round_table(c, hp);
        return 0;
    }
    if (strcmp(type, "yarn") != 0)
        return errbuf_set(err, "%s: rope type '%s' is not supported (default, yarn)", where, type);
    double factor = num_or(rp, "factor", 0.0);
    double orig = num_or(rp, "original_max_position_embeddings", num_or(c, "original_max_position_embeddings", 0.0));
    if (factor <= 0.0 && orig > 0.0)
        factor = num_or(c, "max_position_embeddings", 0.0) / orig;
    if (!(factor > 0.0))
        return errbuf_set(err, "%s: yarn rope needs 'factor'", where);
    if (!(orig > 0.0))
        orig = num_or(c, "max_position_embeddings", 0.0);
    if (!(orig > 0.0))
        return errbuf_set(err, "%s: yarn rope needs 'original_max_position_embeddings'", where);
    double mscale = num_or(rp, "mscale", 0.0), mscale_all = num_or(rp, "mscale_all_dim", 0.0);
    const json_t *af = json_object_get(rp, "attention_factor");
    if (json_is_number(af))
        hp->rope_attn_factor = (float)json_number_value(af);
    else if (mscale != 0.0 && mscale_all != 0.0)
        hp->rope_attn_factor = (float)(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all));
    else
        hp->rope_attn_factor = (float)yarn_mscale(factor, 1.0);
    double bf = num_or(rp, "beta_fast", 0.0), bs = num_or(rp, "beta_slow", 0.0);
    if (bf == 0.0)
        bf = 32.0;
    if (bs == 0.0)
        bs = 1.0;
    int truncate = 1;
    const json_t *tr = json_object_get(rp, "truncate");
    if (json_is_boolean(tr))
        truncate = json_is_true(tr);
    double low = yarn_corr_dim(bf, dim, theta, orig), high = yarn_corr_dim(bs, dim, theta, orig);
    if (truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0)
        low = 0;
    if (high > dim - 1)
        high = dim - 1;
    if (low == high)
        high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        float ramp = (float)(((float)i - low) / (high - low));
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* extrapolation factor */
        float extra = hp->rope_inv_freq[i], inter = (float)(extra / factor);
        hp->rope_inv_freq[i] = inter * (1.0f - keep) + extra * keep;
    }
    if (mscale_all != 0.0) {
        double ms = yarn_mscale(factor, mscale_all);
        *mscale2 = ms * ms;
    }
    round_table(c, hp);
    return 0;
}

int cfg_common(hparams *hp, const json_t *c, const char *where, errbuf *err)
{
    hp->bos_id = -1;
    const json_t *ctx = json_object_get(c, "max_position_embeddings");
    if (ctx && !json_is_null(ctx) && cfg_dim(c, where, &hp->ctx_len, err, "max_position_embeddings", NULL))
        return -1;
    const json_t *bos = json_object_get(c, "bos_token_id");
    if (json_is_integer(bos)) {
        if (json_integer_value(bos) < 0 || json_integer_value(bos) > INT32_MAX)
            return errbuf_set(err, "%s: bos_token_id %lld is not a token id", where, (long long)json_integer_value(bos));
        hp->bos_id = (int)json_integer_value(bos);
    } else if (bos && !json_is_null(bos)) {
        return errbuf_set(err, "%s: field 'bos_token_id' must be an integer or null", where);
    }
    if (!(hp->routed_scale > 0.0f && hp->routed_scale <= 1000.0f))
        return errbuf_set(err, "%s: routed_scaling_factor %g is out of range (0, 1000]", where, (double)hp->routed_scale);
    return 0;
}

/* Every width the engine multiplies out stays far below INT_MAX: it indexes with int and
 * sizes with size_t, and a checkpoint this large does not exist. */
enum { MAX_WIDTH = 1 << 26 };

static int width_ok(long long v) { return v >= 0 && v <= MAX_WIDTH; }

int cfg_validate(const hparams *hp, const char *where, errbuf *err)
{
    if (hp->n_layers <= 0 || hp->n_layers > MODEL_MAX_LAYERS)
        return errbuf_set(err, "%s: num_hidden_layers %d out of range 1..%d", where, hp->n_layers, MODEL_MAX_LAYERS);
    if (hp->hidden <= 0 || hp->vocab <= 0)
        return errbuf_set(err, "%s: hidden_size and vocab_size must be positive", where);
    if (!(hp->rms_eps > 0.0f))
        return errbuf_set(err, "%s: rms_norm_eps must be positive", where);
    int has_kda = 0, has_mla = 0, has_gqa = 0, has_moe = 0, has_dense = 0;
    for (int i = 0; i < hp->n_layers; i++) {
        has_kda |= hp->attn_kind[i] == ATTN_KDA;
        has_mla |= hp->attn_kind[i] == ATTN_MLA;
        has_gqa |= hp->attn_kind[i] == ATTN_GQA;
        has_moe |= hp->ffn_kind[i] == FFN_MOE;
        has_dense |= hp->ffn_kind[i] == FFN_DENSE;
    }
    long long H = hp->hidden;
    if (!width_ok(H) || !width_ok((long long)hp->vocab) || !width_ok(hp->vocab * H / 64))
        return errbuf_set(err, "%s: hidden_size %d x vocab_size %d is out of range", where, hp->hidden, hp->vocab);
    if (has_kda && (hp->kda_heads <= 0 || hp->kda_dim <= 0 || !width_ok((long long)hp->kda_heads * hp->kda_dim)))
        return errbuf_set(err, "%s: KDA heads %d x head_dim %d out of range", where, hp->kda_heads, hp->kda_dim);
    if (has_mla) {
        long long qd = (long long)hp->qk_nope + hp->qk_rope;
        if (hp->qk_rope < 0 || hp->qk_rope % 2 || hp->qk_nope <= 0 || hp->v_head <= 0 || hp->kv_lora_rank <= 0 ||
            hp->q_lora_rank < 0 || !width_ok(hp->n_heads * qd) || !width_ok((long long)hp->n_heads * hp->v_head) ||
            !width_ok((long long)hp->n_heads * (hp->qk_nope + hp->v_head)) || !width_ok(hp->kv_lora_rank + qd))
            return errbuf_set(err, "%s: MLA sizes (heads %d, nope %d, rope %d, v %d, kv_lora %d, q_lora %d) out of range",
                              where, hp->n_heads, hp->qk_nope, hp->qk_rope, hp->v_head, hp->kv_lora_rank,
                              hp->q_lora_rank);
    }
    if (has_gqa && (!width_ok((long long)hp->n_heads * hp->head_dim) || hp->head_dim % 2))
        return errbuf_set(err, "%s: %d heads x head_dim %d out of range", where, hp->n_heads, hp->head_dim);
    if (has_dense && !width_ok((long long)hp->dense_inter))
        return errbuf_set(err, "%s: intermediate_size %d out of range", where, hp->dense_inter);
    if (hp->attnres_block > 0 && (hp->n_layers + hp->attnres_block - 1) / hp->attnres_block > MODEL_MAX_BLOCKS)
        return errbuf_set(err, "%s: %d layers in AttnRes blocks of %d make more than %d blocks", where, hp->n_layers,
                          hp->attnres_block, MODEL_MAX_BLOCKS);
    if (hp->attnres_block < 0)
        return errbuf_set(err, "%s: attn_res_block_size must not be negative", where);
    if (has_moe) {
        if (hp->n_experts <= 0 || hp->top_k <= 0 || hp->top_k > hp->n_experts || !width_ok((long long)hp->n_experts))
            return errbuf_set(err, "%s: MoE experts %d / top-k %d are not valid", where, hp->n_experts, hp->top_k);
        if (hp->n_group < 1 || hp->n_group > MODEL_MAX_GROUPS || hp->n_experts % hp->n_group || hp->topk_group < 1 ||
            hp->topk_group > hp->n_group)
            return errbuf_set(err, "%s: expert groups %d / topk_group %d do not divide %d experts (at most %d groups)",
                              where, hp->n_group, hp->topk_group, hp->n_experts, MODEL_MAX_GROUPS);
        if (hp->n_group > 1 && hp->n_experts / hp->n_group < 2)
            return errbuf_set(err, "%s: grouped routing needs at least 2 experts per group", where);
        if (hp->top_k > hp->topk_group * (hp->n_experts / hp->n_group))
            return errbuf_set(err, "%s: top-k %d exceeds the %d experts the %d kept groups hold", where, hp->top_k,
                              hp->topk_group * (hp->n_experts / hp->n_group), hp->topk_group);
        if (hp->moe_inter <= 0 || !width_ok((long long)hp->moe_inter) || hp->n_shared < 0 ||
            !width_ok((long long)hp->n_shared * hp->moe_inter) || hp->latent < 0 || !width_ok((long long)hp->latent))
            return errbuf_set(err, "%s: MoE widths (expert %d, shared %d x %d, latent %d) out of range", where,
                              hp->moe_inter, hp->n_shared, hp->moe_inter, hp->latent);
    }
    return 0;
}
