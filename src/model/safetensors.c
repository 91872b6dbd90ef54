/* safetensors.c — see safetensors.h. */
#include "model/safetensors.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/jsonr.h"

static const struct {
    const char *name;
    int size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {.name = "BOOL", .size = 1},
    [ST_U8] = {.name = "U8", .size = 1},
    [ST_I8] = {.name = "I8", .size = 1},
    [ST_U16] = {.name = "U16", .size = 2},
    [ST_I16] = {.name = "I16", .size = 2},
    [ST_F16] = {.name = "F16", .size = 2},
    [ST_BF16] = {.name = "BF16", .size = 2},
    [ST_U32] = {.name = "U32", .size = 4},
    [ST_I32] = {.name = "I32", .size = 4},
    [ST_F32] = {.name = "F32", .size = 4},
    [ST_U64] = {.name = "U64", .size = 8},
    [ST_I64] = {.name = "I64", .size = 8},
    [ST_F64] = {.name = "F64", .size = 8},
    [ST_F8_E4M3] = {.name = "F8_E4M3", .size = 1},
    [ST_F8_E5M2] = {.name = "F8_E5M2", .size = 1},
    [ST_F8_E8M0] = {.name = "F8_E8M0", .size = 1},
};

/* A header larger than this is not a checkpoint we can trust (K3's largest is a few MB). */
enum { ST_MAX_HEADER = 256 << 20 };

const char *st_dtype_name(int dtype) { return dtype >= 0 && dtype < ST_DTYPE_COUNT ? dtypes[dtype].name : "?"; }
int st_dtype_size(int dtype) { return dtype >= 0 && dtype < ST_DTYPE_COUNT ? dtypes[dtype].size : 0; }

uint64_t st_numel(const st_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

int st_dtype_parse(const char *s)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0)
            return i;
    return -1;
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

static int parse_entry(const char *path, const char *key, json_t *v, uint64_t data_size, st_tensor *t, errbuf *err)
{
    if (!json_is_object(v))
        return errbuf_set(err, "%s: tensor '%s': entry must be an object", path, key);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return errbuf_set(err, "%s: tensor '%s': missing or non-string dtype", path, key);
    t->dtype = st_dtype_parse(json_string_value(jd));
    if (t->dtype < 0)
        return errbuf_set(err, "%s: tensor '%s': unknown dtype '%s'", path, key, json_string_value(jd));
    if (!json_is_array(js))
        return errbuf_set(err, "%s: tensor '%s': missing shape", path, key);
    if (json_array_size(js) > ST_MAX_DIMS)
        return errbuf_set(err, "%s: tensor '%s': %zu dimensions (at most %d)", path, key, json_array_size(js),
                          ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return errbuf_set(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, key, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        uint64_t dim = (uint64_t)t->shape[i];
        if (dim != 0 && numel > UINT64_MAX / dim)
            return errbuf_set(err, "%s: tensor '%s': shape overflows", path, key);
        numel *= dim;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return errbuf_set(err, "%s: tensor '%s': data_offsets must be [begin, end]", path, key);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return errbuf_set(err, "%s: tensor '%s': data_offsets [%lld, %lld] are not an increasing pair", path, key,
                          (long long)b, (long long)e);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (t->end > data_size)
        return errbuf_set(err, "%s: tensor '%s': data_offsets end %llu is past the end of the data (%llu bytes)", path,
                          key, (unsigned long long)t->end, (unsigned long long)data_size);
    uint64_t es = (uint64_t)dtypes[t->dtype].size;
    if (numel > UINT64_MAX / es || numel * es != t->end - t->begin)
        return errbuf_set(err, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %llu", path, key,
                          dtypes[t->dtype].name, (unsigned long long)(numel * es),
                          (unsigned long long)(t->end - t->begin));
    return 0;
}

int st_parse(const uint8_t *buf, size_t size, const char *path, int file, st_tensor **tp, int *np, errbuf *err)
{
    if (size < 8)
        return errbuf_set(err, "%s: truncated file (%zu bytes, no header length)", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > size - 8)
        return errbuf_set(err, "%s: header length %llu is past the end of the file (%zu bytes)", path,
                          (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER)
        return errbuf_set(err, "%s: header length %llu is implausibly large", path, (unsigned long long)hlen);
    if (hlen < 2 || buf[8] != '{')
        return errbuf_set(err, "%s: header is not a JSON object", path);
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errbuf_set(err, "%s: header JSON, line %d column %d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return errbuf_set(err, "%s: header is not a JSON object", path);
    }
    uint64_t data_size = size - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;
    size_t count = json_object_size(root);
    int first = *np, rc = 0;
    st_tensor *t = realloc(*tp, sizeof *t * ((size_t)*np + count + 1));
    if (!t) {
        json_decref(root);
        return errbuf_set(err, "%s: out of memory", path);
    }
    *tp = t;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                rc = errbuf_set(err, "%s: __metadata__ must be an object", path);
                break;
            }
            continue;
        }
        st_tensor *x = &t[*np];
        memset(x, 0, sizeof *x);
        if (parse_entry(path, key, v, data_size, x, err) != 0) {
            rc = -1;
            break;
        }
        x->name = strdup(key);
        if (!x->name) {
            rc = errbuf_set(err, "%s: out of memory", path);
            break;
        }
        x->data = data + x->begin;
        x->file = file;
        x->file_off = 8 + hlen + x->begin;
        (*np)++;
    }
    json_decref(root);
    if (rc == 0 && *np - first > 1) { /* no two tensors of this file may overlap */
        int cnt = *np - first;
        st_tensor **order = malloc(sizeof *order * (size_t)cnt);
        if (!order)
            return errbuf_set(err, "%s: out of memory", path);
        for (int i = 0; i < cnt; i++)
            order[i] = &t[first + i];
        qsort(order, (size_t)cnt, sizeof *order, cmp_begin);
        /* in begin order, each non-empty range must start at or after the furthest end of those
         * before it (an empty tensor between two others hides nothing) */
        const st_tensor *reach = NULL; /* the non-empty range reaching furthest so far */
        for (int i = 0; i < cnt && rc == 0; i++) {
            if (order[i]->end == order[i]->begin)
                continue;
            if (reach && order[i]->begin < reach->end)
                rc = errbuf_set(err, "%s: tensors '%s' and '%s' overlap in the data area", path, reach->name,
                                order[i]->name);
            if (!reach || order[i]->end > reach->end)
                reach = order[i];
        }
        free(order);
    }
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int add_file(st_set *s, const char *path, errbuf *err)
{
    st_file *f = realloc(s->files, sizeof *f * (size_t)(s->nfiles + 1));
    if (!f)
        return errbuf_set(err, "%s: out of memory", path);
    s->files = f;
    st_file *nf = &s->files[s->nfiles];
    memset(nf, 0, sizeof *nf);
    nf->path = strdup(path);
    if (!nf->path)
        return errbuf_set(err, "%s: out of memory", path);
    s->nfiles++;
    if (file_map_open(&nf->map, path, err) != 0)
        return -1;
    return st_parse(nf->map.data, nf->map.size, path, s->nfiles - 1, &s->t, &s->n, err);
}

int st_finish(st_set *s, errbuf *err)
{
    qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_name);
    for (int i = 1; i < s->n; i++)
        if (strcmp(s->t[i].name, s->t[i - 1].name) == 0)
            return errbuf_set(err, "tensor '%s' appears in both %s and %s", s->t[i].name,
                              s->files[s->t[i - 1].file].path, s->files[s->t[i].file].path);
    return 0;
}

int st_open_files(st_set *s, const char *const *paths, int npaths, errbuf *err)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < npaths; i++)
        if (add_file(s, paths[i], err) != 0) {
            st_close(s);
            return -1;
        }
    if (st_finish(s, err) != 0) {
        st_close(s);
        return -1;
    }
    return 0;
}

static int open_index(st_set *s, const char *dir, const char *ipath, errbuf *err)
{
    json_t *root = jsonr_load_file(ipath, err);
    if (!root)
        return -1;
    int rc = 0;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return errbuf_set(err, "%s: missing object 'weight_map'", ipath);
    }
    const char *key;
    json_t *v;
    /* open each shard once, in order of first mention */
    json_object_foreach(wm, key, v)
    {
        if (!json_is_string(v)) {
            rc = errbuf_set(err, "%s: weight_map['%s'] must be a file name", ipath, key);
            break;
        }
        const char *fn = json_string_value(v);
        if (strchr(fn, '/') || strcmp(fn, "..") == 0 || fn[0] == 0) {
            rc = errbuf_set(err, "%s: weight_map['%s'] = '%s' is not a file name in the folder", ipath, key, fn);
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        int seen = 0;
        for (int i = 0; i < s->nfiles && !seen; i++)
            seen = strcmp(s->files[i].path, path) == 0;
        if (!seen && (rc = add_file(s, path, err)) != 0)
            break;
    }
    if (rc == 0)
        rc = st_finish(s, err);
    if (rc == 0) /* every tensor the index names is in the shard it names */
        json_object_foreach(wm, key, v)
        {
            const st_tensor *t = st_find(s, key);
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
            if (!t || strcmp(s->files[t->file].path, path) != 0) {
                rc = errbuf_set(err, "%s: tensor '%s' is not in %s", ipath, key, json_string_value(v));
                break;
            }
        }
    json_decref(root);
    return rc;
}

int st_open_dir(st_set *s, const char *dir, errbuf *err)
{
    memset(s, 0, sizeof *s);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc;
    if (file_exists(path)) {
        rc = open_index(s, dir, path, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!file_exists(path)) { /* a lone *.safetensors file is accepted too */
            DIR *d = opendir(dir);
            if (!d)
                return errbuf_errno(err, dir);
            struct dirent *e;
            int found = 0;
            while ((e = readdir(d))) {
                size_t l = strlen(e->d_name);
                if (l > 12 && strcmp(e->d_name + l - 12, ".safetensors") == 0) {
                    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                    found++;
                }
            }
            closedir(d);
            if (found != 1)
                return errbuf_set(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
        }
        rc = add_file(s, path, err);
        if (rc == 0)
            rc = st_finish(s, err);
    }
    if (rc != 0)
        st_close(s);
    return rc;
}

void st_close(st_set *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->t[i].name);
    free(s->t);
    for (int i = 0; i < s->nfiles; i++) {
        file_map_close(&s->files[i].map);
        free(s->files[i].path);
    }
    free(s->files);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s->t[mid].name, name);
        if (c == 0)
            return &s->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
