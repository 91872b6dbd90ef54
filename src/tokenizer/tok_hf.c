/* tok_hf.c — loading an HF tokenizer.json with a byte-level BPE model (Qwen3, DeepSeek-V3, ...).
 *
 * What is supported, and everything else is a one-line error rather than a silent difference:
 *   model       BPE; merges as "a b" strings or ["a", "b"] pairs; ignore_merges; no dropout, no
 *               subword prefix / suffix. Vocab strings are GPT-2 byte-level characters; they are
 *               stored as the raw bytes they stand for, so BPE and decoding work on bytes.
 *   normalizer  none, NFC, NFD, or a Sequence of those.
 *   pre_tokenizer  Split (Regex or String; Isolated, Removed, MergedWithPrevious, MergedWithNext,
 *               Contiguous; invert), Digits, ByteLevel (use_regex adds GPT-2's split), Sequence.
 *   added_tokens  matched in the raw text (before normalization), special or not; lstrip /
 *               rstrip / single_word are rejected.
 *   decoder     ByteLevel.
 * Merge errors name the line of the offending merge in the file. A pair listed twice keeps the
 * later rank, as HF's HashMap construction does.
 */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

static const char GPT2_PAT[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* GPT-2's bytes_to_unicode inverse: code point -> byte, -1 outside the alphabet. */
static void byte_alphabet(int16_t inv[324])
{
    for (int i = 0; i < 324; i++)
        inv[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable)
            inv[b] = (int16_t)b;
        else
            inv[256 + n++] = (int16_t)b;
    }
}

/* Byte-level string -> raw bytes (out has room for n bytes). Returns the length, or -1 if a
 * character is outside the alphabet. */
static long bl_decode(const int16_t inv[324], const char *s, size_t n, uint8_t *out)
{
    const uint8_t *p = (const uint8_t *)s, *e = p + n;
    long o = 0;
    while (p < e) {
        int len;
        uint32_t c = toku_next(p, e, &len);
        if (c >= 324 || inv[c] < 0)
            return -1;
        out[o++] = (uint8_t)inv[c];
        p += len;
    }
    return o;
}

static int add_level(tok *t, const char *pat, size_t len, int behavior, int invert, const char *path, errbuf *err)
{
    if (t->pt.nlev == TOK_MAX_LEVELS)
        return errbuf_set(err, "%s: pre_tokenizer: more than %d splits", path, TOK_MAX_LEVELS);
    tok_pt_level *lv = &t->pt.lev[t->pt.nlev];
    if (tok_pretok_level(lv, pat, len, behavior != SPLIT_ISOLATED || invert, path, err))
        return -1;
    lv->behavior = behavior;
    lv->invert = invert;
    t->pt.nlev++;
    return 0;
}

static int pretok(tok *t, const json_t *pt, const char *path, int *bytelevel, errbuf *err)
{
    if (!pt || json_is_null(pt))
        return 0;
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type)
        return errbuf_set(err, "%s: pre_tokenizer without a type", path);
    if (!strcmp(type, "Sequence")) {
        const json_t *a = json_object_get(pt, "pretokenizers");
        size_t i;
        json_t *v;
        if (!json_is_array(a))
            return errbuf_set(err, "%s: pre_tokenizer Sequence needs 'pretokenizers'", path);
        json_array_foreach(a, i, v) if (pretok(t, v, path, bytelevel, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(pt, "add_prefix_space")))
            return errbuf_set(err, "%s: ByteLevel add_prefix_space=true is not supported", path);
        *bytelevel = 1;
        const json_t *ur = json_object_get(pt, "use_regex");
        if (!ur || json_is_true(ur))
            return add_level(t, GPT2_PAT, strlen(GPT2_PAT), SPLIT_ISOLATED, 0, path, err);
        return 0;
    }
    if (!strcmp(type, "Digits")) {
        int ind = json_is_true(json_object_get(pt, "individual_digits"));
        const char *p = ind ? "\\p{N}" : "\\p{N}+";
        return add_level(t, p, strlen(p), SPLIT_ISOLATED, 0, path, err);
    }
    if (!strcmp(type, "Split")) {
        const json_t *p = json_object_get(pt, "pattern"), *re = json_object_get(p, "Regex"),
                     *str = json_object_get(p, "String");
        const char *beh = json_string_value(json_object_get(pt, "behavior"));
        static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5; i++)
            if (beh && !strcmp(beh, names[i]))
                b = i;
        if (b < 0)
            return errbuf_set(err, "%s: Split behavior '%s' is not supported", path, beh ? beh : "(none)");
        int inv = json_is_true(json_object_get(pt, "invert"));
        if (json_is_string(re))
            return add_level(t, json_string_value(re), json_string_length(re), b, inv, path, err);
        if (json_is_string(str)) { /* a literal: escape every character for the regex */
            size_t n = json_string_length(str);
            const char *s = json_string_value(str);
            char *q = malloc(2 * n + 1);
            if (!q)
                return errbuf_set(err, "out of memory");
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if ((unsigned char)s[i] < 0x80 && !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
                                                    (s[i] >= 'A' && s[i] <= 'Z')))
                    q[k++] = '\\';
                q[k++] = s[i];
            }
            int rc = add_level(t, q, k, b, inv, path, err);
            free(q);
            return rc;
        }
        return errbuf_set(err, "%s: Split pattern must be {\"Regex\": ...} or {\"String\": ...}", path);
    }
    return errbuf_set(err, "%s: pre_tokenizer type '%s' is not supported", path, type);
}

static int normalizer(tok *t, const json_t *n, const char *path, errbuf *err)
{
    if (!n || json_is_null(n))
        return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *a = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) if (normalizer(t, v, path, err)) return -1;
        return 0;
    }
    if (type && (!strcmp(type, "NFC") || !strcmp(type, "NFD"))) {
        if (t->norm)
            return errbuf_set(err, "%s: more than one normalization form in the normalizer", path);
        t->norm = type[2] == 'C' ? NORM_NFC : NORM_NFD;
        return 0;
    }
    return errbuf_set(err, "%s: normalizer type '%s' is not supported", path, type ? type : "(none)");
}

/* The two token strings of merge k: "a b" or ["a", "b"]. */
static int merge_pair(const json_t *m, const char **a, size_t *al, const char **b, size_t *bl)
{
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return 0;
    }
    if (!json_is_string(m))
        return -1;
    const char *s = json_string_value(m), *sp = strchr(s, ' ');
    size_t n = json_string_length(m);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
        return -1;
    *a = s;
    *al = (size_t)(sp - s);
    *b = sp + 1;
    *bl = n - *al - 1;
    return 0;
}

int tok_load_hf(tok *t, const char *dir, errbuf *err)
{
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (file_read_all(path, &text, &len, err))
        return -1;
    int rc = tok_load_hf_buf(t, path, text, len, err);
    free(text);
    return rc;
}

int tok_load_hf_buf(tok *t, const char *path, const char *text, size_t len, errbuf *err)
{
    char *cat = NULL;
    json_t *root = NULL;
    int rc = -1, bytelevel = 0;
    int16_t inv[324];
    byte_alphabet(inv);
    if (!(root = tok_json_load(text, len, path, err)))
        goto out;
    const json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab"),
                 *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || (mtype && strcmp(mtype, "BPE"))) {
        errbuf_set(err, "%s: model.type must be BPE (got %s)", path, mtype ? mtype : "no model");
        goto out;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        errbuf_set(err, "%s: model needs a 'vocab' object and a 'merges' array", path);
        goto out;
    }
    const json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v)) {
        errbuf_set(err, "%s: BPE dropout is not supported", path);
        goto out;
    }
    static const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(model, affix[i])) && !json_is_null(v) &&
            !(json_is_string(v) && json_string_length(v) == 0)) {
            errbuf_set(err, "%s: model.%s is not supported", path, affix[i]);
            goto out;
        }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (pretok(t, json_object_get(root, "pre_tokenizer"), path, &bytelevel, err) ||
        normalizer(t, json_object_get(root, "normalizer"), path, err))
        goto out;
    const json_t *dec = json_object_get(root, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (dtype && !strcmp(dtype, "ByteLevel"))
        bytelevel = 1;
    if (!bytelevel) {
        errbuf_set(err, "%s: only byte-level BPE (a ByteLevel pre_tokenizer or decoder) is supported", path);
        goto out;
    }
    /* ids */
    int64_t maxid = -1;
    size_t blob = 0;
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)vocab, k, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_IDS) {
            errbuf_set(err, "%s: model.vocab['%.40s']: expected a token id below %d", path, k, TOK_MAX_IDS);
            goto out;
        }
        if (json_integer_value(val) > maxid)
            maxid = json_integer_value(val);
        blob += strlen(k) + 1;
    }
    size_t i;
    json_array_foreach(added, i, val)
    {
        const json_t *id = json_object_get(val, "id"), *c = json_object_get(val, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_IDS ||
            !json_is_string(c) || json_string_length(c) == 0) {
            errbuf_set(err, "%s: added_tokens[%zu]: needs an 'id' and a non-empty 'content'", path, i);
            goto out;
        }
        static const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (json_is_true(json_object_get(val, flags[f]))) {
                errbuf_set(err, "%s: added_tokens[%zu] ('%s'): %s is not supported", path, i, json_string_value(c),
                           flags[f]);
                goto out;
            }
        if (json_integer_value(id) > maxid)
            maxid = json_integer_value(id);
        blob += json_string_length(c);
    }
    if (maxid < 0) {
        errbuf_set(err, "%s: empty vocabulary", path);
        goto out;
    }
    /* ids index arrays, so they must be (nearly) dense: a stray huge id is an error, not 4 GB */
    size_t nentries = json_object_size(vocab) + json_array_size(added);
    if ((size_t)maxid > 2 * nentries + 65536) {
        errbuf_set(err, "%s: token id %lld is far beyond the %zu tokens (ids must be dense)", path, (long long)maxid,
                   nentries);
        goto out;
    }
    t->nids = (int32_t)maxid + 1;
    uint8_t **src = calloc((size_t)t->nids, sizeof *src); /* bytes of each id, into cat */
    uint32_t *srclen = calloc((size_t)t->nids, sizeof *srclen);
    cat = malloc(blob + 1);
    t->kind = calloc((size_t)t->nids, 1);
    t->off = calloc((size_t)t->nids + 1, sizeof *t->off);
    t->blob = malloc(blob + 1);
    if (!src || !srclen || !cat || !t->kind || !t->off || !t->blob || tok_smap_init(&t->bytes, nentries)) {
        free(src);
        free(srclen);
        errbuf_set(err, "out of memory");
        goto out;
    }
    size_t used = 0;
    json_object_foreach((json_t *)vocab, k, val)
    {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->kind[id]) {
            free(src);
            free(srclen);
            errbuf_set(err, "%s: model.vocab: id %d is given to two tokens", path, id);
            goto out;
        }
        long n = bl_decode(inv, k, strlen(k), (uint8_t *)cat + used);
        int mergeable = n >= 0;
        if (!mergeable) { /* not byte-level text: keep its UTF-8, it cannot come out of BPE */
            n = (long)strlen(k);
            memcpy(cat + used, k, (size_t)n);
        }
        src[id] = (uint8_t *)cat + used;
        srclen[id] = (uint32_t)n;
        t->kind[id] = mergeable ? TK_MERGEABLE : TK_ADDED;
        used += (size_t)n;
    }
    json_array_foreach(added, i, val)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        const json_t *c = json_object_get(val, "content");
        memcpy(cat + used, json_string_value(c), json_string_length(c));
        src[id] = (uint8_t *)cat + used;
        srclen[id] = (uint32_t)json_string_length(c);
        used += json_string_length(c);
        t->kind[id] = json_is_true(json_object_get(val, "special")) ? TK_SPECIAL : TK_ADDED;
    }
    uint64_t o = 0;
    for (int32_t id = 0; id < t->nids; id++) {
        t->off[id] = o;
        if (src[id]) {
            memcpy(t->blob + o, src[id], srclen[id]);
            o += srclen[id];
            if (srclen[id] > t->maxlen)
                t->maxlen = srclen[id];
        }
    }
    t->off[t->nids] = o;
    free(src);
    free(srclen);
    for (int32_t id = 0; id < t->nids; id++) {
        if (t->kind[id] != TK_MERGEABLE)
            continue;
        int32_t old = tok_smap_put(&t->bytes, t, id);
        if (old >= 0) {
            errbuf_set(err, "%s: model.vocab: ids %d and %d are the same bytes", path, old, id);
            goto out;
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_smap_get(&t->bytes, t, &c, 1);
        if (t->byte_id[b] < 0) {
            errbuf_set(err, "%s: model.vocab has no token for the byte 0x%02X (byte-level BPE needs all 256)", path,
                       b);
            goto out;
        }
    }
    /* merges */
    if (tok_pmap_init(&t->merges, json_array_size(merges))) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    uint8_t *buf = malloc(2 * t->maxlen + 16);
    if (!buf) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    json_array_foreach(merges, i, val)
    {
        const char *a, *b;
        size_t al, bl;
        const char *why = NULL, *what = NULL;
        long an = -1, bn = -1;
        int32_t ia = -1, ib = -1, inew = -1;
        if (merge_pair(val, &a, &al, &b, &bl)) {
            why = "is not \"a b\" or [\"a\", \"b\"]";
        } else if (al > t->maxlen || bl > t->maxlen || (an = bl_decode(inv, a, al, buf)) < 0 ||
                   (ia = tok_smap_get(&t->bytes, t, buf, (size_t)an)) < 0) {
            why = "names a token that is not in the vocab:", what = a;
        } else if ((bn = bl_decode(inv, b, bl, buf + an)) < 0 ||
                   (ib = tok_smap_get(&t->bytes, t, buf + an, (size_t)bn)) < 0) {
            why = "names a token that is not in the vocab:", what = b;
        } else if ((inew = tok_smap_get(&t->bytes, t, buf, (size_t)(an + bn))) < 0) {
            why = "makes a token that is not in the vocab";
        }
        if (why) {
            int line = tok_json_elem_line(text, len, "\"merges\"", i);
            errbuf_set(err, "%s:%d: merges[%zu] %s%s%.*s%s", path, line, i, why, what ? " '" : "",
                       what ? (int)(what == a ? al : bl) : 0, what ? what : "", what ? "'" : "");
            free(buf);
            goto out;
        }
        if (tok_pmap_put(&t->merges, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)inew)) {
            /* listed twice: the later rank wins, as in HF */
            uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, h = key * 0x9E3779B97F4A7C15ull;
            for (uint64_t s = (h >> 32) & t->merges.mask;; s = (s + 1) & t->merges.mask)
                if (t->merges.key[s] == key) {
                    t->merges.val[s] = (uint64_t)i << 32 | (uint32_t)inew;
                    break;
                }
        }
    }
    free(buf);
    t->hf = 1;
    t->default_all = 1;
    rc = 0;
out:
    free(cat);
    json_decref(root);
    return rc;
}
