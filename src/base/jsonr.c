/* jsonr.c — see jsonr.h. */
#include "base/jsonr.h"

#include <math.h>

json_t *jsonr_load_file(const char *path, errbuf *err)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        errbuf_set(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return j;
}

json_t *jsonr_load_buf(const char *buf, size_t len, const char *where, errbuf *err)
{
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        errbuf_set(err, "%s:%d:%d: %s", where, je.line, je.column, je.text);
    return j;
}

static const json_t *field(const json_t *obj, const char *key)
{
    const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return (v && !json_is_null(v)) ? v : NULL;
}

static int missing(const char *key, int dflt_ok, const char *where, errbuf *err)
{
    if (dflt_ok)
        return 0;
    return errbuf_set(err, "%s: missing field '%s'", where, key);
}

int jsonr_int(const json_t *obj, const char *key, int64_t *out, int dflt_ok, const char *where, errbuf *err)
{
    const json_t *v = field(obj, key);
    if (!v)
        return missing(key, dflt_ok, where, err);
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) { /* 4096.0 is an integer written by Python */
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.0e15) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return errbuf_set(err, "%s: field '%s' must be an integer", where, key);
}

int jsonr_num(const json_t *obj, const char *key, double *out, int dflt_ok, const char *where, errbuf *err)
{
    const json_t *v = field(obj, key);
    if (!v)
        return missing(key, dflt_ok, where, err);
    if (!json_is_number(v))
        return errbuf_set(err, "%s: field '%s' must be a number", where, key);
    *out = json_number_value(v);
    return 0;
}

int jsonr_bool(const json_t *obj, const char *key, int *out, int dflt_ok, const char *where, errbuf *err)
{
    const json_t *v = field(obj, key);
    if (!v)
        return missing(key, dflt_ok, where, err);
    if (!json_is_boolean(v))
        return errbuf_set(err, "%s: field '%s' must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

int jsonr_str(const json_t *obj, const char *key, const char **out, int dflt_ok, const char *where, errbuf *err)
{
    const json_t *v = field(obj, key);
    if (!v)
        return missing(key, dflt_ok, where, err);
    if (!json_is_string(v))
        return errbuf_set(err, "%s: field '%s' must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

int jsonr_int_array(const json_t *obj, const char *key, int64_t *out, int cap, int *n, int dflt_ok,
                    const char *where, errbuf *err)
{
    const json_t *v = field(obj, key);
    if (!v)
        return missing(key, dflt_ok, where, err);
    if (!json_is_array(v))
        return errbuf_set(err, "%s: field '%s' must be an array of integers", where, key);
    size_t len = json_array_size(v);
    if (len > (size_t)cap)
        return errbuf_set(err, "%s: field '%s' has %zu entries, at most %d allowed", where, key, len, cap);
    for (size_t i = 0; i < len; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x))
            return errbuf_set(err, "%s: field '%s[%zu]' must be an integer", where, key, i);
        out[i] = (int64_t)json_integer_value(x);
    }
    *n = (int)len;
    return 0;
}
