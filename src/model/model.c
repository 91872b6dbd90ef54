/* model.c — loading: config.json -> family adapter -> tensor binding; the binding helpers. */
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"

static const family *const families[] = {&fam_kimi, &fam_deepseek, &fam_qwen3};

static const family *family_of(const char *type)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        for (const char *const *t = families[i]->model_types; *t; t++)
            if (strcmp(*t, type) == 0)
                return families[i];
    return NULL;
}

float *model_alloc(model *m, size_t n, errbuf *err)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 256;
        void **o = realloc(m->owned, sizeof *o * (size_t)cap);
        if (!o) {
            errbuf_set(err, "%s: out of memory", m->dir);
            return NULL;
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        errbuf_set(err, "%s: out of memory", m->dir);
        return NULL;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

static const char *file_of(const model *m, const st_tensor *t) { return m->st.files[t->file].path; }

static void shape_str(const st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static int want_2d(const model *m, const st_tensor *t, int dtype, int64_t r, int64_t c, errbuf *err)
{
    if (t->dtype != dtype)
        return errbuf_set(err, "%s: tensor '%s' is %s, expected %s", file_of(m, t), t->name, st_dtype_name(t->dtype),
                          st_dtype_name(dtype));
    if (t->ndim != 2 || t->shape[0] != r || t->shape[1] != c) {
        char s[128];
        shape_str(t, s, sizeof s);
        return errbuf_set(err, "%s: tensor '%s' has shape %s, expected [%lld, %lld]", file_of(m, t), t->name, s,
                          (long long)r, (long long)c);
    }
    return 0;
}

static const st_tensor *findf(const model *m, const char *base, const char *suffix)
{
    char name[512];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    return st_find(&m->st, name);
}

/* Binds base.weight (plain, FP8 + weight_scale_inv, or INT8 + weight_scale) or base.weight_packed
 * (MXFP4 or INT4). */
static int bind_mat(model *m, kmat *out, int rows, int cols, const char *base, int required, errbuf *err)
{
    const st_tensor *w = findf(m, base, ".weight"), *s;
    memset(out, 0, sizeof *out);
    if (w) {
        int fmt;
        switch (w->dtype) {
        case ST_BF16:
            fmt = WF_BF16;
            break;
        case ST_F16:
            fmt = WF_F16;
            break;
        case ST_F32:
            fmt = WF_F32;
            break;
        case ST_F8_E4M3:
            fmt = WF_FP8B128;
            break;
        case ST_I8:
            fmt = WF_INT8G32;
            break;
        default:
            return errbuf_set(err, "%s: tensor '%s' has dtype %s, not a weight format", file_of(m, w), w->name,
                              st_dtype_name(w->dtype));
        }
        if (want_2d(m, w, w->dtype, rows, cols, err) != 0)
            return -1;
        const void *scale = NULL;
        if (fmt == WF_FP8B128) {
            if (!(s = findf(m, base, ".weight_scale_inv")))
                return errbuf_set(err, "%s: F8_E4M3 tensor '%s' has no '%s.weight_scale_inv'", file_of(m, w), w->name,
                                  base);
            if (want_2d(m, s, ST_F32, (rows + 127) / 128, (cols + 127) / 128, err) != 0)
                return -1;
            scale = s->data;
        } else if (fmt == WF_INT8G32) { /* what `prepare --spine int8` writes */
            if (cols % 32 != 0)
                return errbuf_set(err, "%s: I8 tensor '%s' has %d input columns, not a multiple of 32", file_of(m, w),
                                  w->name, cols);
            if (!(s = findf(m, base, ".weight_scale")))
                return errbuf_set(err, "%s: I8 tensor '%s' has no '%s.weight_scale'", file_of(m, w), w->name, base);
            if (want_2d(m, s, ST_BF16, rows, cols / 32, err) != 0)
                return -1;
            const st_tensor *zp = findf(m, base, ".weight_zero_point");
            if (zp)
                return errbuf_set(err, "%s: I8 tensor '%s' has a zero point ('%s'); only symmetric INT8 is supported",
                                  file_of(m, zp), w->name, zp->name);
            scale = s->data;
        }
        kmat_init(out, fmt, rows, cols, w->data, scale);
    } else if ((w = findf(m, base, ".weight_packed"))) {
        if (cols % 32 != 0)
            return errbuf_set(err, "%s: packed tensor '%s' has %d input columns, not a multiple of 32", file_of(m, w),
                              w->name, cols);
        if (!(s = findf(m, base, ".weight_scale")))
            return errbuf_set(err, "%s: packed tensor '%s' has no '%s.weight_scale'", file_of(m, w), w->name, base);
        if (w->dtype == ST_U8) { /* MXFP4: two E2M1 codes per byte, E8M0 scale per 32 */
            if (want_2d(m, w, ST_U8, rows, cols / 2, err) || want_2d(m, s, ST_U8, rows, cols / 32, err))
                return -1;
            kmat_init(out, WF_MXFP4, rows, cols, w->data, s->data);
        } else if (w->dtype == ST_I32) { /* INT4 group 32: eight nibbles per word, BF16 scale */
            if (want_2d(m, w, ST_I32, rows, cols / 8, err) || want_2d(m, s, ST_BF16, rows, cols / 32, err))
                return -1;
            const st_tensor *shp = findf(m, base, ".weight_shape");
            if (shp) {
                int64_t v[2] = {0, 0};
                if (shp->dtype != ST_I64 || st_numel(shp) != 2)
                    return errbuf_set(err, "%s: tensor '%s' must be I64 [2]", file_of(m, shp), shp->name);
                memcpy(v, shp->data, 16);
                if (v[0] != rows || v[1] != cols)
                    return errbuf_set(err, "%s: tensor '%s' says [%lld, %lld], expected [%d, %d]", file_of(m, shp),
                                      shp->name, (long long)v[0], (long long)v[1], rows, cols);
            }
            kmat_init(out, WF_INT4G32, rows, cols, w->data, s->data);
        } else {
            return errbuf_set(err, "%s: packed tensor '%s' has dtype %s (expected U8 MXFP4 or I32 INT4)",
                              file_of(m, w), w->name, st_dtype_name(w->dtype));
        }
    } else {
        if (required)
            return errbuf_set(err, "%s: missing tensor '%s.weight'", m->dir, base);
        return 0;
    }
    if ((size_t)cols > m->max_cols)
        m->max_cols = (size_t)cols;
    return 1;
}

int model_mat(model *m, kmat *out, int rows, int cols, errbuf *err, const char *fmt, ...)
{
    char base[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    return bind_mat(m, out, rows, cols, base, 1, err) < 0 ? -1 : 0;
}

int model_mat_opt(model *m, kmat *out, int rows, int cols, errbuf *err, const char *fmt, ...)
{
    char base[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    return bind_mat(m, out, rows, cols, base, 0, err);
}

int model_has(const model *m, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return st_find(&m->st, name) != NULL;
}

int model_vec(model *m, float **out, int n, int prefix_ok, errbuf *err, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return errbuf_set(err, "%s: missing tensor '%s'", m->dir, name);
    uint64_t numel = st_numel(t);
    if (numel != (uint64_t)n && !(prefix_ok && numel > (uint64_t)n)) {
        char s[128];
        shape_str(t, s, sizeof s);
        return errbuf_set(err, "%s: tensor '%s' has shape %s, expected %d elements", file_of(m, t), t->name, s, n);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        return errbuf_set(err, "%s: tensor '%s' is %s, expected a float vector", file_of(m, t), t->name,
                          st_dtype_name(t->dtype));
    float *v = model_alloc(m, (size_t)n, err);
    if (!v)
        return -1;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = t->data + (size_t)i * (size_t)st_dtype_size(t->dtype);
        if (t->dtype == ST_F32)
            memcpy(&v[i], p, 4);
        else if (t->dtype == ST_BF16)
            v[i] = bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
        else
            v[i] = f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
    }
    *out = v;
    return 0;
}

/* eos ids from a config object ("eos_token_id": int or list), appended without duplicates */
static void add_eos(hparams *hp, const json_t *cfg)
{
    const json_t *e = json_is_object(cfg) ? json_object_get(cfg, "eos_token_id") : NULL;
    const json_t *items[MODEL_MAX_EOS];
    int n = 0;
    if (json_is_integer(e))
        items[n++] = e;
    else if (json_is_array(e))
        for (size_t i = 0; i < json_array_size(e) && n < MODEL_MAX_EOS; i++)
            items[n++] = json_array_get(e, i);
    for (int i = 0; i < n; i++) {
        if (!json_is_integer(items[i]))
            continue;
        int id = (int)json_integer_value(items[i]), dup = 0;
        for (int j = 0; j < hp->n_eos; j++)
            dup |= hp->eos_ids[j] == id;
        if (!dup && hp->n_eos < MODEL_MAX_EOS && id >= 0)
            hp->eos_ids[hp->n_eos++] = id;
    }
}

int model_config(hparams *hp, const json_t *cfg, const char *where, errbuf *err)
{
    memset(hp, 0, sizeof *hp);
    const char *type = NULL;
    if (!json_is_object(cfg))
        return errbuf_set(err, "%s: not a JSON object", where);
    if (jsonr_str(cfg, "model_type", &type, 0, where, err) != 0)
        return -1;
    const family *fam = family_of(type);
    const json_t *text = cfg, *tc = json_object_get(cfg, "text_config");
    if (json_is_object(tc)) { /* multimodal wrapper (kimi_k3, kimi_k25): the text model inside */
        text = tc;
        const char *inner = NULL;
        if (!fam && jsonr_str(tc, "model_type", &inner, 1, where, err) == 0 && inner)
            fam = family_of(inner);
    }
    if (!fam)
        return errbuf_set(err,
                          "%s: model_type '%s' is not supported (kimi_k3, kimi_linear, deepseek_v3, kimi_k2, "
                          "kimi_k25, qwen3, qwen3_moe)",
                          where, type);
    snprintf(hp->arch, sizeof hp->arch, "%s", type);
    char twhere[1300];
    snprintf(twhere, sizeof twhere, "%s%s", where, text != cfg ? " text_config" : "");
    if (fam->config(hp, text, twhere, err) != 0)
        return -1;
    add_eos(hp, text);
    if (text != cfg)
        add_eos(hp, cfg);
    return 0;
}

int model_load(model *m, const char *dir, errbuf *err) { return model_load_set(m, dir, NULL, err); }

int model_load_set(model *m, const char *dir, st_set *tensors, errbuf *err)
{
    st_set given;
    if (tensors) { /* take ownership before anything can fail */
        given = *tensors;
        memset(tensors, 0, sizeof *tensors);
    }
    memset(m, 0, sizeof *m);
    if (tensors)
        m->st = given;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (!file_is_dir(dir)) {
        st_close(&m->st);
        return errbuf_set(err, "%s: not a model folder", dir);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = jsonr_load_file(path, err), *gen = NULL;
    if (!cfg) {
        st_close(&m->st);
        return -1;
    }
    int rc = -1;
    if (model_config(&m->hp, cfg, path, err) != 0)
        goto out;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (file_exists(path)) {
        if (!(gen = jsonr_load_file(path, err)))
            goto out;
        add_eos(&m->hp, gen);
    }
    if (!tensors && st_open_dir(&m->st, dir, err) != 0)
        goto out;
    const char *prefix = st_find(&m->st, "language_model.model.embed_tokens.weight") ? "language_model." : "";
    m->L = calloc((size_t)m->hp.n_layers, sizeof *m->L);
    if (!m->L) {
        errbuf_set(err, "%s: out of memory", dir);
        goto out;
    }
    const family *fam = family_of(m->hp.arch);
    if (!fam) { /* the wrapper named the family only in text_config */
        const json_t *tc = json_object_get(cfg, "text_config");
        fam = family_of(json_string_value(json_object_get(tc, "model_type")));
    }
    rc = fam->bind(m, prefix, err);
out:
    json_decref(cfg);
    json_decref(gen);
    if (rc != 0)
        model_free(m);
    return rc;
}

int model_layer_mats(layer_w *L, kmat **out)
{
    kmat *all[MODEL_LAYER_MATS] = {
        &L->kda.q,       &L->kda.k,      &L->kda.v,         &L->kda.f_a,     &L->kda.f_b,   &L->kda.b,
        &L->kda.g,       &L->kda.g_a,    &L->kda.g_b,       &L->kda.o,       &L->mla.q,     &L->mla.q_a,
        &L->mla.q_b,     &L->mla.kv_a,   &L->mla.kv_b,      &L->mla.g,       &L->mla.o,     &L->gqa.q,
        &L->gqa.k,       &L->gqa.v,      &L->gqa.o,         &L->mlp.gate,    &L->mlp.up,    &L->mlp.down,
        &L->moe.router,  &L->moe.lat_down, &L->moe.lat_up,  &L->moe.shared.gate, &L->moe.shared.up,
        &L->moe.shared.down,
    };
    int n = 0;
    for (int i = 0; i < MODEL_LAYER_MATS; i++)
        if (all[i]->data)
            out[n++] = all[i];
    return n;
}

void model_free(model *m)
{
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    if (m->L)
        for (int i = 0; i < m->hp.n_layers; i++)
            free(m->L[i].moe.experts);
    free(m->L);
    st_close(&m->st);
    memset(m, 0, sizeof *m);
}
