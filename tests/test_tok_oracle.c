/* test_tok_oracle.c — the tokenizers against ids computed by the reference libraries:
 * tests/data/tokenizers/expected.json (the shared oracle: tiktoken, HF tokenizers, transformers'
 * Jinja templates, Moonshot's encoding_k3.py) and extra.tar.xz's extra.json (gen_extra.py: 600 random
 * multilingual texts per tokenizer, long inputs that exercise Kimi's 25,000-character run and
 * 400,000-character window slicing, and Qwen3 chats with tools). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_tok.h"

/* Encodes every {"text", "ids"} case of arr with tokenizer `name`; the first failure is reported. */
static int run_cases(const char *name, const json_t *arr, tok_special sp, char *why, size_t cap, int *count)
{
    const char *lw;
    tok *t = tt_tok(name, &lw);
    if (!t) {
        snprintf(why, cap, "load %s: %s", name, lw);
        return 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(arr, i, c)
    {
        const json_t *tx = json_object_get(c, "text");
        tok_ids ids = {0};
        errbuf err;
        if (tok_encode(t, json_string_value(tx), json_string_length(tx), sp, &ids, &err)) {
            snprintf(why, cap, "%s case %zu: %s", name, i, err.msg);
            return 0;
        }
        char d[200];
        int ok = tt_ids_eq(&ids, json_object_get(c, "ids"), d, sizeof d);
        tok_ids_free(&ids);
        if (!ok) {
            snprintf(why, cap, "%s case %zu (%.40s): %s", name, i, json_string_value(tx), d);
            return 0;
        }
        ++*count;
    }
    return 1;
}

/* expected.json, and heldout_texts.json: the oracle generator's held-out texts, encoded by the same
 * libraries (tiktoken 0.14, HF tokenizers 0.23) with tests/data/tokenizers/gen_extra.py's helpers. */
static void expected_encode(const char *file)
{
    const json_t *e = tt_json(file);
    CHECKF(e, "tests/data/tokenizers/%s missing or malformed", file);
    const char *key;
    json_t *block;
    char why[512];
    int n = 0;
    json_object_foreach((json_t *)e, key, block)
    {
        const char *dir = json_string_value(json_object_get(block, "dir"));
        CHECKF(run_cases(dir, json_object_get(block, "encode"), TOK_SPECIAL_DEFAULT, why, sizeof why, &n), "%s", why);
        CHECKF(run_cases(dir, json_object_get(block, "encode_allow_special"), TOK_SPECIAL_ALL, why, sizeof why, &n),
               "%s", why);
    }
    CHECKF(n >= 60, "%s: only %d cases", file, n);
}

TEST(tok_expected_encode)
{
    expected_encode("expected.json");
    if (!test_failed())
        expected_encode("heldout_texts.json");
}

/* Chat cases: ids and, where given, the rendered text. */
static int run_chats(const char *name, const json_t *arr, char *why, size_t cap)
{
    const char *lw;
    tok *t = tt_tok(name, &lw);
    if (!t) {
        snprintf(why, cap, "load %s: %s", name, lw);
        return 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(arr, i, c)
    {
        const json_t *kw = json_object_get(c, "kwargs"), *tools = json_object_get(c, "tools");
        char *dump = json_dumps(json_object_get(c, "messages"), 0);
        int typed_special = dump && strstr(dump, "<|im_end|>");
        free(dump);
        json_t *req = json_object();
        json_object_set(req, "messages", json_object_get(c, "messages"));
        if (tools)
            json_object_set(req, "tools", (json_t *)tools);
        tok_chat_opts o;
        tok_chat_opts_init(&o);
        if (json_is_false(json_object_get(kw, "thinking")) || json_is_false(json_object_get(kw, "enable_thinking")))
            o.thinking = 0;
        o.thinking_effort = json_string_value(json_object_get(kw, "thinking_effort"));
        tok_ids ids = {0};
        errbuf err;
        char *text = NULL, d[200];
        size_t tl;
        int ok = !tok_chat_encode(t, req, &o, &ids, &err) && !tok_chat_render(t, req, &o, &text, &tl, &err);
        if (!ok)
            snprintf(why, cap, "%s chat %zu: %s", name, i, err.msg);
        const json_t *want = json_object_get(c, "rendered");
        if (ok && want && (tl != json_string_length(want) || memcmp(text, json_string_value(want), tl))) {
            snprintf(why, cap, "%s chat %zu renders differently:\n got  %.300s\n want %.300s", name, i, text,
                     json_string_value(want));
            ok = 0;
        }
        if (ok && typed_special) {
            /* The reference renders to a string and encodes it whole, so "<|im_end|>" typed in a
             * message becomes the special id; ours stays text (by design): one fewer such id. */
            size_t want = 0, got = 0;
            size_t k;
            json_t *x;
            json_array_foreach(json_object_get(c, "ids"), k, x) want += json_integer_value(x) == 151645;
            for (k = 0; k < ids.n; k++)
                got += ids.v[k] == 151645;
            if (got + 1 != want) {
                snprintf(why, cap, "%s chat %zu: %zu <|im_end|> ids, want %zu (the typed one stays text)", name, i,
                         got, want - 1);
                ok = 0;
            }
        } else if (ok && !tt_ids_eq(&ids, json_object_get(c, "ids"), d, sizeof d)) {
            snprintf(why, cap, "%s chat %zu: %s", name, i, d);
            ok = 0;
        }
        free(text);
        tok_ids_free(&ids);
        json_decref(req);
        if (!ok)
            return 0;
    }
    return 1;
}

TEST(tok_expected_chat)
{
    const json_t *e = tt_json("expected.json");
    CHECK(e);
    char why[1024];
    CHECKF(run_chats("kimi-k3-standin", json_object_get(json_object_get(e, "kimi-k3-standin"), "chat"), why, sizeof why),
           "%s", why);
    CHECKF(run_chats("qwen3", json_object_get(json_object_get(e, "qwen3"), "chat"), why, sizeof why), "%s", why);
}

TEST(tok_extra_encode)
{
    const json_t *x = tt_json("extra/extra.json");
    CHECKF(x, "tokenizers/extra/extra.json (from tests/data/tokenizers/extra.tar.xz) missing or malformed");
    char why[512];
    int n = 0;
    CHECKF(run_cases("kimi-k3-standin", json_object_get(x, "kimi"), TOK_SPECIAL_NONE, why, sizeof why, &n), "%s", why);
    CHECKF(run_cases("kimi-k3-standin", json_object_get(x, "kimi_special"), TOK_SPECIAL_ALL, why, sizeof why, &n),
           "%s", why);
    CHECKF(run_cases("cl100k", json_object_get(x, "cl100k"), TOK_SPECIAL_NONE, why, sizeof why, &n), "%s", why);
    CHECKF(run_cases("qwen3", json_object_get(x, "qwen3"), TOK_SPECIAL_DEFAULT, why, sizeof why, &n), "%s", why);
    CHECKF(n == 2400, "%d cases", n);
}

TEST(tok_extra_qwen_chat)
{
    const json_t *x = tt_json("extra/extra.json");
    CHECK(x);
    char why[1024];
    CHECKF(run_chats("qwen3", json_object_get(x, "qwen3_chat"), why, sizeof why), "%s", why);
}

/* Long inputs: built from {"parts": [[string, repeat], ...]}, checked by count and hash. */
TEST(tok_extra_long)
{
    const json_t *x = tt_json("extra/extra.json");
    CHECK(x);
    static const char *names[][2] = {{"kimi", "kimi-k3-standin"}, {"cl100k", "cl100k"}, {"qwen3", "qwen3"}};
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(x, "long"), i, c)
    {
        size_t len = 0, k;
        json_t *part;
        json_array_foreach(json_object_get(c, "parts"), k, part)
            len += json_string_length(json_array_get(part, 0)) * (size_t)json_integer_value(json_array_get(part, 1));
        char *text = malloc(len + 1), *p = text;
        CHECK(text);
        json_array_foreach(json_object_get(c, "parts"), k, part)
        {
            const json_t *s = json_array_get(part, 0);
            for (json_int_t r = 0; r < json_integer_value(json_array_get(part, 1)); r++) {
                memcpy(p, json_string_value(s), json_string_length(s));
                p += json_string_length(s);
            }
        }
        for (int m = 0; m < 3; m++) {
            const char *lw;
            tok *t = tt_tok(names[m][1], &lw);
            const json_t *want = json_object_get(c, names[m][0]);
            tok_ids ids = {0};
            errbuf err;
            char h[17];
            int bad = !t || tok_encode(t, text, len, TOK_SPECIAL_NONE, &ids, &err);
            if (!bad)
                tt_fnv(ids.v, ids.n, h);
            int ok = !bad && ids.n == (size_t)json_integer_value(json_array_get(want, 0)) &&
                     !strcmp(h, json_string_value(json_array_get(want, 1)));
            size_t got = ids.n;
            tok_ids_free(&ids);
            if (!ok)
                free(text);
            CHECKF(ok, "long case %zu (%zu bytes) with %s: %zu ids, want %lld", i, len, names[m][1], got,
                   (long long)json_integer_value(json_array_get(want, 0)));
        }
        free(text);
    }
}
