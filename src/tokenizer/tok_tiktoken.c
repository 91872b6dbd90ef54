/* tok_tiktoken.c — loading a tiktoken rank file (Kimi's tiktoken.model, cl100k_base.tiktoken).
 *
 * File format: one "<base64 of the token bytes> <decimal rank>" per line; blank lines ignored. The
 * id of a mergeable token is its rank, so the ranks must be exactly 0..n-1 (each once) and every
 * single byte must have one (BPE starts from single bytes). Violations are errors naming the file
 * and line. Special tokens:
 *   - Kimi (tokenizer_config.json, TikTokenTokenizer): 256 slots at ids n..n+255, named from
 *     added_tokens_decoder, the rest "<|reserved_token_{id}|>"; text is cut into 400,000-char
 *     windows and 25,000-char space / non-space runs as tokenization_kimi.py does.
 *   - plain tiktoken (tiktoken_config.json): {"pat_str": ..., "special_tokens": {name: id}}.
 */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "tokenizer/tok_int.h"

enum { KIMI_RESERVED = 256 };

static int b64val(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Strict base64 (standard alphabet, '=' padding only at the end) of s[0..n) into out.
 * Returns the decoded length, or -1 - (offset of the first bad character). */
static long b64_decode(const char *s, size_t n, uint8_t *out)
{
    if (n % 4)
        return -1 - (long)n;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            char c = s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad || (v[k] = b64val((unsigned char)c)) < 0)
                return -1 - (long)(i + k);
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* A special token to place at a fixed id. */
typedef struct spec_in {
    int32_t id;
    char *name; /* malloc'd */
    int special;
} spec_in;

/* Parses the rank file and the given specials into t (blob, off, kind, bytes, byte_id). */
static int build(tok *t, const char *path, const char *text, size_t len, spec_in *sp, int nsp, errbuf *err)
{
    int rc = -1;
    size_t nlines = 1;
    for (size_t i = 0; i < len; i++)
        nlines += text[i] == '\n';
    uint8_t *tmp = malloc(len / 4 * 3 + 16);
    uint64_t *tokoff = malloc(sizeof *tokoff * nlines);       /* per entry: offset in tmp */
    uint32_t *toklen = malloc(sizeof *toklen * nlines);
    int32_t *rank_of = malloc(sizeof *rank_of * nlines);      /* per entry */
    int32_t *entry_of = NULL;                                 /* per rank */
    int *line_of = malloc(sizeof *line_of * nlines);
    size_t n = 0, used = 0;
    if (!tmp || !tokoff || !toklen || !rank_of || !line_of) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    int line = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        size_t e = j;
        line++;
        if (e > i && text[e - 1] == '\r')
            e--;
        if (e > i) {
            const char *sp1 = memchr(text + i, ' ', e - i);
            if (!sp1) {
                errbuf_set(err, "%s:%d: expected '<base64> <rank>'", path, line);
                goto out;
            }
            long dl = b64_decode(text + i, (size_t)(sp1 - (text + i)), tmp + used);
            if (dl < 0) {
                errbuf_set(err, "%s:%d: bad base64 at column %ld", path, line, -dl);
                goto out;
            }
            if (dl == 0) {
                errbuf_set(err, "%s:%d: empty token", path, line);
                goto out;
            }
            const char *r = sp1 + 1, *re = text + e;
            long v = 0;
            if (r == re) {
                errbuf_set(err, "%s:%d: missing rank", path, line);
                goto out;
            }
            for (; r < re; r++) {
                if (*r < '0' || *r > '9' || v > 100000000) {
                    errbuf_set(err, "%s:%d: rank is not a number below 10^8", path, line);
                    goto out;
                }
                v = v * 10 + (*r - '0');
            }
            tokoff[n] = used;
            toklen[n] = (uint32_t)dl;
            rank_of[n] = (int32_t)v;
            line_of[n] = line;
            used += (size_t)dl;
            n++;
        }
        i = j + 1;
    }
    if (n == 0 || n > TOK_MAX_IDS - 65536) {
        errbuf_set(err, "%s: %zu ranks (1 to %d are supported)", path, n, TOK_MAX_IDS - 65536);
        goto out;
    }
    entry_of = malloc(sizeof *entry_of * n);
    if (!entry_of) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    for (size_t k = 0; k < n; k++)
        entry_of[k] = -1;
    for (size_t k = 0; k < n; k++) {
        int32_t r = rank_of[k];
        if ((size_t)r >= n) {
            errbuf_set(err, "%s:%d: rank %d but the file has only %zu tokens (a rank is missing)", path, line_of[k], r,
                       n);
            goto out;
        }
        if (entry_of[r] >= 0) {
            errbuf_set(err, "%s:%d: duplicate rank %d (first at line %d)", path, line_of[k], r, line_of[entry_of[r]]);
            goto out;
        }
        entry_of[r] = (int32_t)k;
    }
    /* ids: 0..n-1 mergeable, then the specials (any id >= n) */
    int32_t nids = (int32_t)n;
    size_t slen = 0;
    for (int k = 0; k < nsp; k++) {
        if (sp[k].id < (int32_t)n) {
            errbuf_set(err, "%s: special '%s' has id %d, which is a mergeable rank", path, sp[k].name, sp[k].id);
            goto out;
        }
        if ((size_t)sp[k].id >= n + 65536) { /* ids index arrays: keep them dense */
            errbuf_set(err, "%s: special '%s' has id %d, more than 65536 past the last rank", path, sp[k].name, sp[k].id);
            goto out;
        }
        if (sp[k].id >= nids)
            nids = sp[k].id + 1;
        slen += strlen(sp[k].name);
    }
    t->nids = nids;
    t->blob = malloc(used + slen + 1);
    t->off = calloc((size_t)nids + 1, sizeof *t->off);
    t->kind = calloc((size_t)nids, 1);
    if (!t->blob || !t->off || !t->kind || tok_smap_init(&t->bytes, n)) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    const char **name_of = calloc((size_t)nids, sizeof *name_of);
    if (!name_of) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    for (int k = 0; k < nsp; k++) {
        if (name_of[sp[k].id]) {
            free(name_of);
            errbuf_set(err, "%s: two special tokens have id %d", path, sp[k].id);
            goto out;
        }
        name_of[sp[k].id] = sp[k].name;
        t->kind[sp[k].id] = sp[k].special ? TK_SPECIAL : TK_ADDED;
    }
    uint64_t o = 0;
    for (int32_t id = 0; id < nids; id++) {
        t->off[id] = o;
        if (id < (int32_t)n) {
            size_t k = (size_t)entry_of[id];
            memcpy(t->blob + o, tmp + tokoff[k], toklen[k]);
            o += toklen[k];
            t->kind[id] = TK_MERGEABLE;
        } else if (name_of[id]) {
            size_t l = strlen(name_of[id]);
            memcpy(t->blob + o, name_of[id], l);
            o += l;
        }
        if (t->off[id] + t->maxlen < o)
            t->maxlen = (size_t)(o - t->off[id]);
    }
    t->off[nids] = o;
    free(name_of);
    for (int32_t id = 0; id < (int32_t)n; id++) {
        int32_t old = tok_smap_put(&t->bytes, t, id);
        if (old >= 0) {
            errbuf_set(err, "%s:%d: the same token bytes as line %d", path, line_of[entry_of[id]],
                       line_of[entry_of[old]]);
            goto out;
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_smap_get(&t->bytes, t, &c, 1);
        if (t->byte_id[b] < 0) {
            errbuf_set(err, "%s: no rank for the single byte 0x%02X (BPE needs all 256)", path, b);
            goto out;
        }
    }
    rc = 0;
out:
    free(tmp);
    free(tokoff);
    free(toklen);
    free(rank_of);
    free(entry_of);
    free(line_of);
    return rc;
}

/* Number of non-blank lines: the count of mergeable ranks (for Kimi's special ids). */
static size_t count_entries(const char *text, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        size_t e = j;
        if (e > i && text[e - 1] == '\r')
            e--;
        n += e > i;
        i = j + 1;
    }
    return n;
}

int tok_load_tiktoken_buf(tok *t, const char *path, const char *text, size_t len, const json_t *plain,
                          const char *plainpath, const json_t *tcfg, const char *tcfgpath, errbuf *err)
{
    spec_in *sp = NULL;
    int nsp = 0, rc = -1;
    const char *pat = tok_pretok_pattern(PT_KIMI);
    size_t patlen = strlen(pat);
    if (plain) {
        /* a plain tiktoken encoding: pattern and specials given explicitly */
        const json_t *ps = json_object_get(plain, "pat_str"), *st = json_object_get(plain, "special_tokens");
        if (!json_is_string(ps)) {
            errbuf_set(err, "%s: field 'pat_str' must be a string", plainpath);
            goto out;
        }
        pat = json_string_value(ps);
        patlen = json_string_length(ps);
        if (st && !json_is_object(st)) {
            errbuf_set(err, "%s: field 'special_tokens' must be an object", plainpath);
            goto out;
        }
        sp = calloc(json_object_size(st) + 1, sizeof *sp);
        if (!sp) {
            errbuf_set(err, "out of memory");
            goto out;
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)st, k, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000000) {
                errbuf_set(err, "%s: special_tokens.%s: expected a token id", plainpath, k);
                goto out;
            }
            sp[nsp].id = (int32_t)json_integer_value(v);
            sp[nsp].special = 1;
            if (!(sp[nsp++].name = strdup(k))) {
                errbuf_set(err, "out of memory");
                goto out;
            }
        }
    } else {
        /* Kimi: tokenization_kimi.py's pattern, slicing and 256 reserved special slots */
        t->kimi_slicing = 1;
        size_t n = count_entries(text, len);
        const json_t *atd = json_object_get(tcfg, "added_tokens_decoder");
        if (atd && !json_is_object(atd)) {
            errbuf_set(err, "%s: field 'added_tokens_decoder' must be an object", tcfgpath);
            goto out;
        }
        sp = calloc(KIMI_RESERVED, sizeof *sp);
        if (!sp) {
            errbuf_set(err, "out of memory");
            goto out;
        }
        for (int i = 0; i < KIMI_RESERVED; i++, nsp++) {
            char key[32], buf[64];
            int32_t id = (int32_t)(n + (size_t)i);
            snprintf(key, sizeof key, "%d", id);
            const json_t *e = atd ? json_object_get(atd, key) : NULL;
            const char *name = NULL;
            sp[i].id = id;
            sp[i].special = 1;
            if (e) {
                const json_t *c = json_object_get(e, "content"), *s = json_object_get(e, "special");
                if (!json_is_string(c)) {
                    errbuf_set(err, "%s: added_tokens_decoder.%s.content must be a string", tcfgpath, key);
                    goto out;
                }
                name = json_string_value(c);
                if (json_is_boolean(s))
                    sp[i].special = json_is_true(s);
            } else {
                snprintf(buf, sizeof buf, "<|reserved_token_%d|>", id);
                name = buf;
            }
            if (!(sp[i].name = strdup(name))) {
                errbuf_set(err, "out of memory");
                goto out;
            }
        }
    }
    if (build(t, path, text, len, sp, nsp, err))
        goto out;
    t->pt.nlev = 1;
    t->pt.drop_gaps = 1;
    if (tok_pretok_level(&t->pt.lev[0], pat, patlen, 0, plain ? plainpath : path, err))
        goto out;
    rc = 0;
out:
    for (int i = 0; i < nsp; i++)
        free(sp[i].name);
    free(sp);
    return rc;
}

int tok_load_tiktoken(tok *t, const char *dir, errbuf *err)
{
    char path[4096], plainpath[4096], tcfgpath[4096];
    char *text = NULL;
    size_t len = 0;
    json_t *plain = NULL, *tcfg = NULL;
    int rc = -1;
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    snprintf(plainpath, sizeof plainpath, "%s/tiktoken_config.json", dir);
    snprintf(tcfgpath, sizeof tcfgpath, "%s/tokenizer_config.json", dir);
    if (file_read_all(path, &text, &len, err))
        return -1;
    if (file_exists(plainpath)) {
        if (!(plain = jsonr_load_file(plainpath, err)))
            goto out;
    } else if (file_exists(tcfgpath) && !(tcfg = jsonr_load_file(tcfgpath, err))) {
        goto out;
    }
    rc = tok_load_tiktoken_buf(t, path, text, len, plain, plainpath, tcfg, tcfgpath, err);
out:
    json_decref(plain);
    json_decref(tcfg);
    free(text);
    return rc;
}
