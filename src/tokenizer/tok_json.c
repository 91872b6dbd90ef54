/* tok_json.c — JSON text exactly as Python writes it, because chat templates embed JSON in prompts.
 *
 * Moonshot's encoding_k3.py uses json.dumps(ensure_ascii=False) with separators (",", ":") for
 * tool declarations and the default (", ", ": ") for argument values; HF's Jinja `tojson` is
 * json.dumps(ensure_ascii=False) too. So: non-ASCII is written raw, '"' '\\' and control
 * characters are escaped the Python way (\n \r \t \b \f, others \u00XX in lower-case hex),
 * floats use repr() (shortest round-trip digits: 2.0, 1e-05, 1e+16), object keys keep their
 * order unless sorted (deep_sort_dict: by code point, which is UTF-8 byte order).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

json_t *tok_json_load(const char *buf, size_t len, const char *where, errbuf *err)
{
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    if (!j)
        errbuf_set(err, "%s:%d:%d: %s", where, je.line, je.column, je.text);
    return j;
}

int tok_py_float_repr(double d, char *buf)
{
    if (isnan(d))
        return sprintf(buf, "NaN");
    if (isinf(d))
        return sprintf(buf, d < 0 ? "-Infinity" : "Infinity");
    if (d == 0)
        return sprintf(buf, signbit(d) ? "-0.0" : "0.0");
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) { /* the shortest digit string that reads back exactly */
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int exp = atoi(p + 1);
    char *o = buf;
    if (neg)
        *o++ = '-';
    if (exp < -4 || exp >= 16) { /* repr switches to exponent form outside [1e-4, 1e16) */
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        o += sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp - 1; i++)
            *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i <= exp; i++)
            *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp + 1) {
            memcpy(o, digits + exp + 1, (size_t)(nd - exp - 1));
            o += nd - exp - 1;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
    return (int)(o - buf);
}

int tok_json_pystr(const json_t *v, char *buf, size_t cap, const char **s, size_t *n)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        *s = json_string_value(v);
        *n = json_string_length(v);
        return 0;
    case JSON_INTEGER:
        *n = (size_t)snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        break;
    case JSON_REAL:
        *n = (size_t)tok_py_float_repr(json_real_value(v), buf);
        break;
    case JSON_TRUE:
        *n = (size_t)snprintf(buf, cap, "True");
        break;
    case JSON_FALSE:
        *n = (size_t)snprintf(buf, cap, "False");
        break;
    case JSON_NULL:
        *n = (size_t)snprintf(buf, cap, "None");
        break;
    default:
        return -1;
    }
    *s = buf;
    return 0;
}

static void put_string(const char *s, size_t n, tok_segs *out, int markup)
{
    static const char hex[] = "0123456789abcdef";
    size_t start = 0;
    tok_segs_add(out, "\"", 1, markup);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = 0;
                esc = u;
            }
        }
        if (esc) {
            tok_segs_add(out, s + start, i - start, markup);
            tok_segs_add(out, esc, strlen(esc), markup);
            start = i + 1;
        }
    }
    tok_segs_add(out, s + start, n - start, markup);
    tok_segs_add(out, "\"", 1, markup);
}

typedef struct kv {
    const char *k;
    size_t n;
    json_t *v;
} kv;

static int kv_cmp(const void *a, const void *b)
{
    const kv *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->k, y->k, m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

int tok_json_dump(const json_t *v, int compact, int sort, tok_segs *out, int markup)
{
    const char *comma = compact ? "," : ", ", *colon = compact ? ":" : ": ";
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v), i = 0;
        kv *items = malloc(sizeof *items * (n ? n : 1));
        if (!items)
            return -1;
        const char *k;
        size_t klen;
        json_t *x;
        json_object_keylen_foreach((json_t *)v, k, klen, x)
        {
            items[i].k = k;
            items[i].n = klen;
            items[i++].v = x;
        }
        if (sort)
            qsort(items, n, sizeof *items, kv_cmp);
        tok_segs_add(out, "{", 1, markup);
        for (i = 0; i < n; i++) {
            if (i)
                tok_segs_add(out, comma, strlen(comma), markup);
            put_string(items[i].k, items[i].n, out, markup);
            tok_segs_add(out, colon, strlen(colon), markup);
            if (tok_json_dump(items[i].v, compact, sort, out, markup)) {
                free(items);
                return -1;
            }
        }
        free(items);
        tok_segs_add(out, "}", 1, markup);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *x;
        tok_segs_add(out, "[", 1, markup);
        json_array_foreach(v, i, x)
        {
            if (i)
                tok_segs_add(out, comma, strlen(comma), markup);
            if (tok_json_dump(x, compact, sort, out, markup))
                return -1;
        }
        tok_segs_add(out, "]", 1, markup);
        break;
    }
    case JSON_STRING:
        put_string(json_string_value(v), json_string_length(v), out, markup);
        break;
    case JSON_NULL:
        tok_segs_add(out, "null", 4, markup);
        break;
    case JSON_TRUE:
        tok_segs_add(out, "true", 4, markup);
        break;
    case JSON_FALSE:
        tok_segs_add(out, "false", 5, markup);
        break;
    default: {
        const char *s;
        size_t n;
        tok_json_pystr(v, buf, sizeof buf, &s, &n);
        tok_segs_add(out, s, n, markup);
    }
    }
    return out->bad ? -1 : 0;
}

/* Skips one JSON value at p (whitespace first); returns the position after it, or NULL. */
static const char *skip_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static const char *skip_value(const char *p, const char *e)
{
    p = skip_ws(p, e);
    if (p >= e)
        return NULL;
    if (*p == '"') {
        for (p++; p < e; p++) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                return p + 1;
        }
        return NULL;
    }
    if (*p == '[' || *p == '{') {
        int depth = 0;
        for (; p < e; p++) {
            if (*p == '"') {
                p = skip_value(p, e);
                if (!p)
                    return NULL;
                p--;
            } else if (*p == '[' || *p == '{') {
                depth++;
            } else if (*p == ']' || *p == '}') {
                if (--depth == 0)
                    return p + 1;
            }
        }
        return NULL;
    }
    while (p < e && *p != ',' && *p != ']' && *p != '}' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t')
        p++;
    return p;
}

int tok_json_elem_line(const char *text, size_t len, const char *key, size_t k)
{
    const char *e = text + len, *p = text;
    size_t kl = strlen(key);
    for (;;) {
        const char *q = memmem(p, (size_t)(e - p), key, kl);
        if (!q)
            return 0;
        p = skip_ws(q + kl, e);
        if (p < e && *p == ':')
            break;
    }
    p = skip_ws(p + 1, e);
    if (p >= e || *p != '[')
        return 0;
    p++;
    for (size_t i = 0; i < k; i++) {
        p = skip_value(p, e);
        if (!p)
            return 0;
        p = skip_ws(p, e);
        if (p >= e || *p != ',')
            return 0;
        p++;
    }
    p = skip_ws(p, e);
    int line = 1;
    for (const char *c = text; c < p; c++)
        line += *c == '\n';
    return line;
}
