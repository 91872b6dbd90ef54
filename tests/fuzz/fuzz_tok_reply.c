/* fuzz_tok_reply.c — the reply parser over arbitrary id sequences in the K3 and Qwen3 formats
 * ($DF_TEST_DATA/tokenizers, default build/testdata; run from the repository root). Byte 0 picks
 * the format and whether the prompt opened the thinking channel; then every 3 bytes are one id:
 * below 112 the first byte picks a piece of the format's markup (markers, tag names, attributes,
 * JSON, newlines, halves of markers), otherwise the other two bytes pick any id. Checked: no
 * crash, tool-call arguments are JSON where the markup's were, and the events joined by kind
 * are the same whether the ids come one at a time or all at once. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok.h"

static tok *toks[2];
static tok_ids pieces[2][112];

static const char *const K3_PIECES[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "think", "response",
                                        "tools", "call", " tool=\"f\"", " index=\"1\"", "argument",
                                        " key=\"k\" type=\"string\"", " key=\"n\" type=\"number\"", "json",
                                        " type=\"object\"", "message", "{\"a\": 1}", "12", "x", "\xE2\x80",
                                        "\x94", " ", "\n", "&amp;", "&quot;", "\xF0\x9F\x8E\x89"};
static const char *const QW_PIECES[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "\n",
                                        "\n\n", "<", "think>", "</", "tool_call>", "{\"name\": \"f\", ",
                                        "\"arguments\": {\"x\": [1, 2]}}", "{\"name\": 3}", "text", "\xE4\xB8",
                                        "\x89", " ", "}", "<tool", "_call>", "\xF0\x9F\x8E\x89"};

static void load(void)
{
    static const char *names[] = {"kimi-k3-standin", "qwen3"};
    const char *root = getenv("DF_TEST_DATA"); /* tests/run.sh lays the data out there */
    for (int i = 0; i < 2; i++) {
        errbuf err;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", root ? root : "build/testdata", names[i]);
        if (!toks[i] && tok_load(&toks[i], dir, &err)) {
            fprintf(stderr, "fuzz_tok_reply: %s (run tests/testdata.sh, from the repository root)\n", err.msg);
            exit(1);
        }
        const char *const *src = i ? QW_PIECES : K3_PIECES;
        size_t n = i ? sizeof QW_PIECES / sizeof *QW_PIECES : sizeof K3_PIECES / sizeof *K3_PIECES;
        for (size_t k = 0; k < 112; k++) { /* markers are specials in K3, text or added tokens in Qwen3 */
            const char *s = src[k % n];
            int32_t id = tok_token_id(toks[i], s, strlen(s));
            pieces[i][k].n = 0;
            if (id >= 0 && (i == 1 || k % n < 4))
                tok_ids_push(&pieces[i][k], id);
            else
                tok_encode(toks[i], s, strlen(s), TOK_SPECIAL_NONE, &pieces[i][k], &err);
        }
    }
}

typedef struct dg {
    char *s[3]; /* text, reasoning, calls ("name(args)") */
    size_t n[3], cap[3];
    int ends;
} dg;

static void put(dg *d, int k, const char *s, size_t n)
{
    if (d->n[k] + n + 1 > d->cap[k]) {
        d->cap[k] = 2 * (d->n[k] + n + 1);
        d->s[k] = realloc(d->s[k], d->cap[k]);
        if (!d->s[k])
            abort();
    }
    memcpy(d->s[k] + d->n[k], s, n);
    d->n[k] += n;
}

static int on_event(void *ud, const tok_reply_event *ev)
{
    dg *d = ud;
    if (ev->kind == TOK_REPLY_TEXT || ev->kind == TOK_REPLY_REASONING) {
        put(d, ev->kind, ev->text, ev->len);
    } else if (ev->kind == TOK_REPLY_TOOL_CALL) {
        put(d, 2, ev->name, strlen(ev->name));
        put(d, 2, "(", 1);
        put(d, 2, ev->text, ev->len);
        put(d, 2, ")", 1);
    } else {
        d->ends++;
    }
    return 0;
}

static void run(const tok *t, int thinking, const int32_t *ids, size_t n, size_t group, dg *d)
{
    tok_reply *r;
    errbuf err;
    memset(d, 0, sizeof *d);
    if (tok_reply_new(t, thinking, &r, &err))
        abort();
    for (size_t i = 0; i < n; i += group)
        if (tok_reply_feed(r, ids + i, n - i < group ? n - i : group, on_event, d, &err) < 0)
            abort();
    if (tok_reply_finish(r, on_event, d, &err) < 0)
        abort();
    tok_reply_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    load();
    int which = data[0] & 1, thinking = (data[0] >> 1) & 1;
    const tok *t = toks[which];
    tok_ids ids = {0};
    for (size_t i = 1; i + 3 <= size; i += 3) {
        if (data[i] < 112) {
            const tok_ids *p = &pieces[which][data[i]];
            for (size_t k = 0; k < p->n; k++)
                tok_ids_push(&ids, p->v[k]);
        } else {
            tok_ids_push(&ids, (int32_t)(((uint32_t)data[i + 1] << 8 | data[i + 2]) * 4 %
                                         (uint32_t)tok_vocab_size(t)));
        }
    }
    dg a, b;
    run(t, thinking, ids.v, ids.n, 1, &a);
    run(t, thinking, ids.v, ids.n, ids.n ? ids.n : 1, &b);
    for (int k = 0; k < 3; k++)
        if (a.n[k] != b.n[k] || (a.n[k] && memcmp(a.s[k], b.s[k], a.n[k])))
            abort(); /* the grouping of the ids changed what was said */
    if (a.ends != b.ends || a.ends > 1)
        abort();
    for (int k = 0; k < 3; k++) {
        free(a.s[k]);
        free(b.s[k]);
    }
    tok_ids_free(&ids);
    return 0;
}
