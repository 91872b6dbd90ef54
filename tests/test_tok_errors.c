/* test_tok_errors.c — broken tokenizer files give one-line errors naming the file and the line
 * (or field): bad base64, duplicate and missing ranks, missing byte ranks, malformed JSON, merges
 * naming unknown tokens; bad chat requests name the message. Small files are written per case. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "test.h"
#include "test_tok.h"
#include "tokenizer/tok_unicode.h"

static const char *dir_for(const char *name)
{
    static char d[512];
    snprintf(d, sizeof d, "%s/%s", test_tmpdir(), name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
    if (system(cmd) != 0)
        return NULL;
    return d;
}

static int put(const char *dir, const char *file, const char *text)
{
    char p[700];
    errbuf err;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return file_write_atomic(p, text, strlen(text), &err);
}

static void b64(const uint8_t *s, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = a[w >> 18];
        out[o++] = a[(w >> 12) & 63];
        out[o++] = i + 1 < n ? a[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? a[w & 63] : '=';
    }
    out[o] = 0;
}

/* A rank file: 256 single bytes (rank = byte, except `skip_byte` which is left out when >= 0),
 * then "ab" and "abc"; `edit` replaces 1-based line `line` with its text. */
static char *rank_file(int skip_byte, int line, const char *edit)
{
    char *t = malloc(300 * 32), *p = t;
    int ln = 0, rank = 0;
    for (int b = 0; b < 256 + 2; b++) {
        char enc[16];
        if (b == skip_byte)
            continue;
        if (b < 256) {
            uint8_t c = (uint8_t)b;
            b64(&c, 1, enc);
        } else {
            b64((const uint8_t *)(b == 256 ? "ab" : "abc"), b == 256 ? 2 : 3, enc);
        }
        ln++;
        if (ln == line)
            p += sprintf(p, "%s\n", edit);
        else
            p += sprintf(p, "%s %d\n", enc, rank);
        rank++;
    }
    return t;
}

/* Loads dir and expects failure with all of the given substrings in the message. */
static int fails_with(const char *dir, const char *a, const char *b, char *msg, size_t cap)
{
    tok *t;
    errbuf err;
    if (!tok_load(&t, dir, &err)) {
        tok_free(t);
        snprintf(msg, cap, "%s loaded", dir);
        return 0;
    }
    snprintf(msg, cap, "%s", err.msg);
    return strstr(err.msg, a) && (!b || strstr(err.msg, b)) && !strchr(err.msg, '\n');
}

TEST(tok_errors_rank_file)
{
    char msg[800];
    const char *d = dir_for("rank_ok");
    char *f = rank_file(-1, 0, NULL);
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    tok *t;
    errbuf err;
    CHECKF(!tok_load(&t, d, &err), "%s", err.msg);
    CHECK(tok_vocab_size(t) == 258 + 256); /* plus Kimi's 256 reserved specials */
    tok_free(t);

    d = dir_for("rank_b64");
    f = rank_file(-1, 3, "Zm9v! 2");
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model:3:", "base64", msg, sizeof msg), "%s", msg);

    d = dir_for("rank_dup");
    f = rank_file(-1, 5, "QQ== 1"); /* "A" again, with line 2's rank */
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model:5:", "duplicate rank 1 (first at line 2)", msg, sizeof msg), "%s", msg);

    d = dir_for("rank_gap");
    f = rank_file(-1, 258, "YWJj 300");
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model:258:", "missing", msg, sizeof msg), "%s", msg);

    d = dir_for("rank_byte");
    f = rank_file(0x41, 0, NULL);
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model", "0x", msg, sizeof msg), "%s", msg); /* a rank is missing too */

    d = dir_for("rank_samebytes");
    f = rank_file(-1, 258, "YWI= 257"); /* "ab" twice */
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model:258:", "same token bytes as line 257", msg, sizeof msg), "%s", msg);

    d = dir_for("rank_norank");
    f = rank_file(-1, 7, "QUJD");
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECKF(fails_with(d, "tiktoken.model:7:", NULL, msg, sizeof msg), "%s", msg);

    d = dir_for("rank_config");
    f = rank_file(-1, 0, NULL);
    CHECK(d && !put(d, "tiktoken.model", f));
    free(f);
    CHECK(!put(d, "tokenizer_config.json", "{\n  \"added_tokens_decoder\": {,\n}\n"));
    CHECKF(fails_with(d, "tokenizer_config.json:2:", NULL, msg, sizeof msg), "%s", msg);
    CHECK(!put(d, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"300\": {\"content\": 5}}}"));
    CHECKF(fails_with(d, "tokenizer_config.json", "added_tokens_decoder.300", msg, sizeof msg), "%s", msg);

    CHECKF(fails_with(dir_for("empty"), "no tiktoken.model or tokenizer.json", NULL, msg, sizeof msg), "%s", msg);
}

/* GPT-2 byte-level character of byte b, as UTF-8 (JSON-escaped when needed). */
static void bl_char(int b, char *out)
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
        int c = printable ? x : 256 + n++;
        if (x == b)
            cp = c;
    }
    if (cp == '"' || cp == '\\') {
        sprintf(out, "\\%c", cp);
        return;
    }
    uint8_t u[4];
    int l = toku_put(u, (uint32_t)cp);
    memcpy(out, u, (size_t)l);
    out[l] = 0;
}

/* A tokenizer.json: the 256 bytes, "ab", "abc" (one vocab entry per line, the merges one per line
 * from line 263 on), a normalizer and the given merges lines. */
static char *hf_json(const char *normalizer, const char *merges)
{
    char *t = malloc(64 * 1024), *p = t;
    p += sprintf(p, "{\n\"normalizer\": %s,\n\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                    "\"use_regex\": true},\n\"decoder\": {\"type\": \"ByteLevel\"},\n\"model\": {\"type\": \"BPE\", "
                    "\"vocab\": {\n",
                 normalizer);
    for (int b = 0; b < 256; b++) {
        char c[8];
        bl_char(b, c);
        p += sprintf(p, "\"%s\": %d,\n", c, b);
    }
    p += sprintf(p, "\"ab\": 256,\n\"abc\": 257},\n\"merges\": [\n%s]},\n", merges);
    p += sprintf(p, "\"added_tokens\": [{\"id\": 258, \"content\": \"<|end|>\", \"special\": true}]\n}\n");
    return t;
}

TEST(tok_errors_tokenizer_json)
{
    char msg[800];
    const char *d = dir_for("hf_ok");
    char *f = hf_json("{\"type\": \"NFC\"}", "\"a b\",\n[\"ab\", \"c\"]\n");
    CHECK(d && !put(d, "tokenizer.json", f));
    free(f);
    tok *t;
    errbuf err;
    CHECKF(!tok_load(&t, d, &err), "%s", err.msg);
    tok_ids ids = {0};
    CHECK(!tok_encode(t, "abc ab<|end|>", 13, TOK_SPECIAL_DEFAULT, &ids, &err));
    CHECKF(ids.n == 4 && ids.v[0] == 257 && ids.v[1] == ' ' && ids.v[2] == 256 && ids.v[3] == 258,
           "ids %zu: %d %d %d %d", ids.n, ids.v[0], ids.n > 1 ? ids.v[1] : -1, ids.n > 2 ? ids.v[2] : -1,
           ids.n > 3 ? ids.v[3] : -1);
    tok_ids_free(&ids);
    tok_free(t);

    d = dir_for("hf_unknown_merge");
    /* the merges start on line 266: line 1 "{", 2 normalizer, 3 pre_tokenizer, 4 decoder, 5 model,
     * 6..261 bytes, 262 ab, 263 abc, 264 "merges": [, 265 first merge */
    f = hf_json("null", "\"a b\",\n\"zz q\"\n");
    CHECK(d && !put(d, "tokenizer.json", f));
    free(f);
    CHECKF(fails_with(d, "tokenizer.json:266:", "merges[1] names a token that is not in the vocab: 'zz'", msg,
                      sizeof msg),
           "%s", msg);

    f = hf_json("null", "\"a b\",\n[\"b\", \"c\"]\n");
    CHECK(!put(d, "tokenizer.json", f));
    free(f);
    CHECKF(fails_with(d, "tokenizer.json:266:", "makes a token that is not in the vocab", msg, sizeof msg), "%s", msg);

    f = hf_json("null", "\"a b\",\n\"a b c\"\n");
    CHECK(!put(d, "tokenizer.json", f));
    free(f);
    CHECKF(fails_with(d, "tokenizer.json:266:", "merges[1]", msg, sizeof msg), "%s", msg);

    f = hf_json("{\"type\": \"NFKC\"}", "\"a b\"\n");
    CHECK(!put(d, "tokenizer.json", f));
    free(f);
    CHECKF(fails_with(d, "tokenizer.json", "normalizer type 'NFKC' is not supported", msg, sizeof msg), "%s", msg);

    CHECK(!put(d, "tokenizer.json", "{\n\"model\": {\n\"vocab\": {\"a\": 0,}\n}\n}\n"));
    CHECKF(fails_with(d, "tokenizer.json:3:", NULL, msg, sizeof msg), "%s", msg);

    f = hf_json("null", "\"a b\"\n");
    f[strlen(f) - 60] = 0; /* truncated file */
    CHECK(!put(d, "tokenizer.json", f));
    free(f);
    CHECKF(fails_with(d, "tokenizer.json:", NULL, msg, sizeof msg), "%s", msg);
}

TEST(tok_errors_chat_requests)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    static const struct {
        const char *json, *effort, *want;
    } cases[] = {
        {"[{\"role\": \"user\", \"content\": \"hi\"}]", "medium", "thinking_effort 'medium'"},
        {"{\"messages\": 5}", NULL, "'messages' must be an array"},
        {"[{\"content\": \"hi\"}]", NULL, "messages[0]: missing 'role'"},
        {"[{\"role\": \"user\", \"content\": \"hi\"}, 7]", NULL, "messages[1]: expected an object"},
        {"[{\"role\": \"tool\", \"content\": \"r\"}]", NULL, "messages[0]: a Kimi K3 tool message needs"},
        {"[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
         "\"arguments\": \"[1, 2]\"}}]}]",
         NULL, "must be a JSON object"},
        {"\"hello\"", NULL, "expected a messages array or a request object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *req = json_loads(cases[i].json, JSON_DECODE_ANY, &je);
        CHECK(req);
        tok_chat_opts o;
        tok_chat_opts_init(&o);
        o.thinking_effort = cases[i].effort;
        tok_ids ids = {0};
        errbuf err;
        int rc = tok_chat_encode(t, req, &o, &ids, &err);
        json_decref(req);
        tok_ids_free(&ids);
        CHECKF(rc == -1 && strstr(err.msg, cases[i].want), "case %zu: rc %d, '%s'", i, rc, rc ? err.msg : "");
    }
    tok *c = tt_tok("cl100k", &why);
    json_t *req = json_loads("[]", 0, NULL);
    tok_ids ids = {0};
    errbuf err;
    CHECK(tok_chat_encode(c, req, NULL, &ids, &err) == -1 && strstr(err.msg, "no chat format"));
    json_decref(req);
}
