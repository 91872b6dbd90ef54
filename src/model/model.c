/* model.c — loading: config.json -> family adapter -> tensor binding; the binding helpers. */
#include "model/model.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "model/config.h"

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

void model_scope(model *m, int part, int layer, int expert, int role)
{
    m->scope = (model_bind){.tensor = -1, .part = (uint8_t)part, .role = (uint8_t)role, .layer = layer,
                            .expert = expert};
}

int model_bind_range(model *m, const st_tensor *t, uint64_t off, uint64_t len, errbuf *err)
{
    assert(off + len <= t->end - t->begin);
    if (m->n_bind == m->cap_bind) {
        int cap = m->cap_bind ? 2 * m->cap_bind : 1024;
        model_bind *b = realloc(m->bind, sizeof *b * (size_t)cap);
        if (!b)
            return errbuf_set(err, "%s: out of memory", m->dir);
        m->bind = b;
        m->cap_bind = cap;
    }
    model_bind *b = &m->bind[m->n_bind++];
    *b = m->scope;
    b->tensor = (int)(t - m->st.t);
    b->off = off;
    b->len = len;
    return 0;
}

static int bind_whole(model *m, const st_tensor *t, errbuf *err)
{
    return model_bind_range(m, t, 0, t->end - t->begin, err);
}

/* The data tensor of a matrix: base + a format's suffix with its dtype (wfmt_table), -1 with an
 * error when it has a dtype no format stores that way, 0 when there is none. */
static int find_format(model *m, const char *base, const st_tensor **w, errbuf *err)
{
    const st_tensor *plain = findf(m, base, ".weight"), *packed = findf(m, base, ".weight_packed");
    *w = NULL;
    for (int f = 0; f < WF_COUNT; f++) {
        const wfmt_info *fi = &wfmt_table[f];
        const st_tensor *t = !strcmp(fi->st_suffix, ".weight") ? plain : packed;
        if (t && !strcmp(st_dtype_name(t->dtype), fi->st_dtype)) {
            *w = t;
            return f;
        }
    }
    if (plain || packed) {
        const st_tensor *t = plain ? plain : packed;
        return errbuf_set(err, plain ? "%s: tensor '%s' has dtype %s, not a weight format"
                                     : "%s: packed tensor '%s' has dtype %s (expected U8 MXFP4 or I32 INT4)",
                          file_of(m, t), t->name, st_dtype_name(t->dtype));
    }
    return -2;
}

/* Binds base.weight or base.weight_packed in whichever format (wfmt_table) its dtype names,
 * with the scale tensor the format keeps. */
static int bind_mat(model *m, kmat *out, int rows, int cols, const char *base, int required, errbuf *err)
{
    const st_tensor *w, *s = NULL;
    memset(out, 0, sizeof *out);
    int fmt = find_format(m, base, &w, err);
    if (fmt == -1)
        return -1;
    if (fmt < 0) {
        if (required)
            return errbuf_set(err, "%s: missing tensor '%s.weight'", m->dir, base);
        return 0;
    }
    const wfmt_info *fi = &wfmt_table[fmt];
    if (cols % fi->block != 0)
        return errbuf_set(err, "%s: %s tensor '%s' has %d input columns, not a multiple of %d", file_of(m, w),
                          fi->st_dtype, w->name, cols, fi->block);
    int64_t dcols = (int64_t)(cols / fi->block) * fi->block_bytes / fi->st_elem_bytes;
    if (want_2d(m, w, w->dtype, rows, dcols, err) != 0)
        return -1;
    if (fi->scale != WF_SCALE_NONE) {
        if (!(s = findf(m, base, fi->st_scale_suffix)))
            return errbuf_set(err, "%s: %s tensor '%s' has no '%s%s'", file_of(m, w), fi->st_dtype, w->name, base,
                              fi->st_scale_suffix);
        int64_t sr = fi->scale == WF_SCALE_F32_T128 ? (rows + 127) / 128 : rows;
        int64_t sc = fi->scale == WF_SCALE_F32_T128 ? (cols + 127) / 128 : cols / 32;
        if (want_2d(m, s, st_dtype_parse(fi->st_scale_dtype), sr, sc, err) != 0)
            return -1;
    }
    const st_tensor *extra = NULL; /* a tensor the format allows beside its data: recorded too */
    if (fmt == WF_INT8G32 && (extra = findf(m, base, ".weight_zero_point")))
        return errbuf_set(err, "%s: I8 tensor '%s' has a zero point ('%s'); only symmetric INT8 is supported",
                          file_of(m, extra), w->name, extra->name);
    if (fmt == WF_INT4G32 && (extra = findf(m, base, ".weight_shape"))) {
        int64_t v[2] = {0, 0};
        if (extra->dtype != ST_I64 || st_numel(extra) != 2)
            return errbuf_set(err, "%s: tensor '%s' must be I64 [2]", file_of(m, extra), extra->name);
        memcpy(v, extra->data, 16);
        if (v[0] != rows || v[1] != cols)
            return errbuf_set(err, "%s: tensor '%s' says [%lld, %lld], expected [%d, %d]", file_of(m, extra),
                              extra->name, (long long)v[0], (long long)v[1], rows, cols);
    }
    kmat_init(out, fmt, rows, cols, w->data, s ? s->data : NULL);
    if (bind_whole(m, w, err) || (s && bind_whole(m, s, err)) || (extra && bind_whole(m, extra, err)))
        return -1;
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
    if (!v || bind_whole(m, t, err) != 0)
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

/* The special ids a config names must be ids of the model. */
static int check_ids(const hparams *hp, const char *where, errbuf *err)
{
    for (int j = 0; j < hp->n_eos; j++)
        if (hp->eos_ids[j] < 0 || hp->eos_ids[j] >= hp->vocab)
            return errbuf_set(err, "%s: eos_token_id %d is outside the vocabulary (0..%d)", where, hp->eos_ids[j],
                              hp->vocab - 1);
    if (hp->bos_id >= hp->vocab)
        return errbuf_set(err, "%s: bos_token_id %d is outside the vocabulary (0..%d)", where, hp->bos_id,
                          hp->vocab - 1);
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
        json_int_t v = json_integer_value(items[i]);
        int id = v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : (int)v, dup = 0;
        for (int j = 0; j < hp->n_eos; j++)
            dup |= hp->eos_ids[j] == id;
        if (!dup && hp->n_eos < MODEL_MAX_EOS)
            hp->eos_ids[hp->n_eos++] = id; /* check_ids refuses one outside the vocabulary */
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
    if (cfg_common(hp, text, twhere, err) != 0)
        return -1;
    add_eos(hp, text);
    if (text != cfg)
        add_eos(hp, cfg);
    return check_ids(hp, where, err);
}

int model_rope(hparams *hp, const json_t *cfg, const char *where, double *mscale2, errbuf *err)
{
    return cfg_rope(cfg, where, hp, mscale2, err);
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
    model_scope(m, MODEL_PART_GLOBAL, -1, -1, MODEL_ROLE_OTHER);
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
        if (check_ids(&m->hp, path, err) != 0)
            goto out;
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
    free(m->bind);
    if (m->L)
        for (int i = 0; i < m->hp.n_layers; i++)
            free(m->L[i].moe.experts);
    free(m->L);
    st_close(&m->st);
    memset(m, 0, sizeof *m);
}

/* the binding whose bytes hold address p: its tensor name and where in it */
static const model_bind *bind_at(const model *m, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < m->n_bind; i++) {
        const model_bind *b = &m->bind[i];
        uintptr_t lo = (uintptr_t)m->st.t[b->tensor].data + b->off;
        if (a >= lo && a - lo < b->len)
            return b;
    }
    return NULL;
}

static int scan_mat(const model *m, const kmat *w, float *row, errbuf *err)
{
    if (!w->data)
        return 0;
    for (int r = 0; r < w->rows; r++) {
        wfmt_table[w->fmt].decode(w, r, 0, w->cols, row);
        for (int c = 0; c < w->cols; c++)
            if (!isfinite(row[c])) {
                const model_bind *b = bind_at(m, w->data);
                const char *name = b ? m->st.t[b->tensor].name : "?";
                if (b && b->part == MODEL_PART_EXPERT && b->len != m->st.t[b->tensor].end - m->st.t[b->tensor].begin)
                    return errbuf_set(err, "%s: tensor '%s' (expert %d) row %d column %d is %s", m->dir, name,
                                      b->expert, r, c, isnan(row[c]) ? "NaN" : "infinite");
                return errbuf_set(err, "%s: tensor '%s' row %d column %d is %s", m->dir, name, r, c,
                                  isnan(row[c]) ? "NaN" : "infinite");
            }
    }
    return 0;
}

int model_scan_finite(const model *m, errbuf *err)
{
    float *row = malloc(sizeof(float) * (m->max_cols + 1));
    if (!row)
        return errbuf_set(err, "%s: out of memory", m->dir);
    int rc = scan_mat(m, &m->embed, row, err) || scan_mat(m, &m->lm_head, row, err) ? -1 : 0;
    for (int l = 0; l < m->hp.n_layers && rc == 0; l++) {
        layer_w L = m->L[l];
        kmat *mats[MODEL_LAYER_MATS];
        int n = model_layer_mats(&L, mats);
        for (int k = 0; k < n && rc == 0; k++)
            rc = scan_mat(m, mats[k], row, err);
        for (int e = 0; m->hp.ffn_kind[l] == FFN_MOE && m->L[l].moe.experts && e < m->hp.n_experts && rc == 0; e++) {
            const mlp_w *x = &m->L[l].moe.experts[e];
            rc = scan_mat(m, &x->gate, row, err) || scan_mat(m, &x->up, row, err) || scan_mat(m, &x->down, row, err)
                     ? -1
                     : 0;
        }
    }
    /* vectors (norms, biases, gate constants) were converted to float at load: their tensors */
    for (int i = 0; i < m->n_bind && rc == 0; i++) {
        const st_tensor *t = &m->st.t[m->bind[i].tensor];
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
            continue;
        int es = st_dtype_size(t->dtype), cols = t->ndim ? (int)t->shape[t->ndim - 1] : 1;
        uint64_t n = m->bind[i].len / (uint64_t)es;
        const uint8_t *p = t->data + m->bind[i].off;
        for (uint64_t j = 0; j < n; j++) {
            float v;
            if (t->dtype == ST_F32)
                memcpy(&v, p + 4 * j, 4);
            else if (t->dtype == ST_BF16)
                v = bf16_to_f32((uint16_t)(p[2 * j] | (p[2 * j + 1] << 8)));
            else
                v = f16_to_f32((uint16_t)(p[2 * j] | (p[2 * j + 1] << 8)));
            if (!isfinite(v)) {
                rc = errbuf_set(err, "%s: tensor '%s' row %llu column %llu is %s", m->dir, t->name,
                                (unsigned long long)(j / (uint64_t)(cols > 0 ? cols : 1)),
                                (unsigned long long)(j % (uint64_t)(cols > 0 ? cols : 1)), isnan(v) ? "NaN" : "infinite");
                break;
            }
        }
    }
    free(row);
    return rc;
}
