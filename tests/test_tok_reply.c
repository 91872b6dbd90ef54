/* test_tok_reply.c — the reply parser reads back what each chat format's renderer writes for an
 * assistant turn: reasoning, text, tool calls (name, arguments as valid JSON equal to the ones
 * given) and the end, for K3 XTML, Kimi K2 (thinking), Qwen3 and DeepSeek-V3. The reply's ids are
 * those the renderer produced after the generation prompt; the same events (joined by kind) come
 * out when the ids are fed one at a time, all at once or three at a time, and when the reply's text
 * is cut at every byte and re-encoded in two pieces (markers then arrive as ordinary tokens, a
 * code point in halves). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_tok.h"

/* what the events said, joined by kind */
typedef struct digest {
    char text[4096], reason[4096];
    size_t ntext, nreason;
    int ncalls, ends, after_end; /* after_end: events after END */
    char names[4][64], ids[4][64];
    json_t *args[4];
    int bad_json;
    char order[64]; /* kinds in order, repeats joined: T R C E */
    int norder;
} digest;

static void dg_free(digest *d)
{
    for (int i = 0; i < d->ncalls && i < 4; i++)
        json_decref(d->args[i]);
}

static int on_event(void *ud, const tok_reply_event *ev)
{
    digest *d = ud;
    static const char K[] = "TRCE";
    if (d->ends)
        d->after_end++;
    if (d->norder == 0 || d->order[d->norder - 1] != K[ev->kind] || ev->kind == TOK_REPLY_TOOL_CALL)
        if (d->norder < 63)
            d->order[d->norder++] = K[ev->kind];
    switch (ev->kind) {
    case TOK_REPLY_TEXT:
        if (d->ntext + ev->len < sizeof d->text)
            memcpy(d->text + d->ntext, ev->text, ev->len);
        d->ntext += ev->len;
        break;
    case TOK_REPLY_REASONING:
        if (d->nreason + ev->len < sizeof d->reason)
            memcpy(d->reason + d->nreason, ev->text, ev->len);
        d->nreason += ev->len;
        break;
    case TOK_REPLY_TOOL_CALL:
        if (d->ncalls < 4) {
            snprintf(d->names[d->ncalls], 64, "%s", ev->name);
            snprintf(d->ids[d->ncalls], 64, "%s", ev->id);
            d->args[d->ncalls] = json_loadb(ev->text, ev->len, 0, NULL);
            d->bad_json += !json_is_object(d->args[d->ncalls]) || ev->index != d->ncalls;
        }
        d->ncalls++;
        break;
    default:
        d->ends++;
    }
    return 0;
}

static int parse(const tok *t, int thinking, const int32_t *ids, size_t n, size_t group, digest *d)
{
    memset(d, 0, sizeof *d);
    tok_reply *r;
    errbuf err;
    if (tok_reply_new(t, thinking, &r, &err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i += group)
        rc = tok_reply_feed(r, ids + i, n - i < group ? n - i : group, on_event, d, &err);
    rc = rc || tok_reply_finish(r, on_event, d, &err);
    tok_reply_free(r);
    return rc;
}

static int same(const digest *a, const digest *b, char *why, size_t cap)
{
    if (a->ntext != b->ntext || memcmp(a->text, b->text, a->ntext < sizeof a->text ? a->ntext : 0))
        return snprintf(why, cap, "text '%.*s' vs '%.*s'", (int)a->ntext, a->text, (int)b->ntext, b->text), 0;
    if (a->nreason != b->nreason || memcmp(a->reason, b->reason, a->nreason < sizeof a->reason ? a->nreason : 0))
        return snprintf(why, cap, "reasoning '%.*s' vs '%.*s'", (int)a->nreason, a->reason, (int)b->nreason,
                        b->reason),
               0;
    if (a->ncalls != b->ncalls || a->ends != b->ends || strcmp(a->order, b->order))
        return snprintf(why, cap, "calls %d/%d, ends %d/%d, order %s/%s", a->ncalls, b->ncalls, a->ends, b->ends,
                        a->order, b->order),
               0;
    for (int i = 0; i < a->ncalls && i < 4; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->ids[i], b->ids[i]) || !json_equal(a->args[i], b->args[i]))
            return snprintf(why, cap, "call %d: %s(%s) vs %s(%s)", i, a->names[i], a->ids[i], b->names[i], b->ids[i]),
                   0;
    return 1;
}

/* the reply: the ids the renderer gives [user, msg] after those of [user] + generation prompt */
static int reply_ids(const tok *t, const json_t *msg, int thinking, tok_ids *out, errbuf *err)
{
    json_t *user = json_pack("{s:s, s:s}", "role", "user", "content", "Hi");
    json_t *a = json_pack("[O]", user), *b = json_pack("[O, O]", user, msg);
    tok_chat_opts o;
    tok_chat_opts_init(&o);
    o.thinking = thinking;
    tok_ids p = {0}, f = {0};
    int rc = tok_chat_encode(t, a, &o, &p, err);
    o.add_generation_prompt = 0;
    rc = rc || tok_chat_encode(t, b, &o, &f, err);
    if (!rc && (f.n < p.n || memcmp(f.v, p.v, sizeof *p.v * p.n)))
        rc = errbuf_set(err, "the prompt with the generation prompt is not a prefix of the rendered turn");
    for (size_t i = p.n; !rc && i < f.n; i++)
        tok_ids_push(out, f.v[i]);
    tok_ids_free(&p);
    tok_ids_free(&f);
    json_decref(user);
    json_decref(a);
    json_decref(b);
    return rc;
}

/* what the message says: its text, reasoning (when the format keeps it) and calls */
static void expected(const json_t *msg, int keeps_reasoning, const char *k2_ids, digest *d)
{
    memset(d, 0, sizeof *d);
    const char *c = json_string_value(json_object_get(msg, "content")), *r = json_string_value(json_object_get(msg, "reasoning_content"));
    d->ntext = c ? strlen(c) : 0;
    memcpy(d->text, c ? c : "", d->ntext);
    d->nreason = keeps_reasoning && r ? strlen(r) : 0;
    memcpy(d->reason, r ? r : "", d->nreason);
    if (d->nreason)
        d->order[d->norder++] = 'R';
    if (d->ntext)
        d->order[d->norder++] = 'T';
    const json_t *calls = json_object_get(msg, "tool_calls");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *fn = json_object_get(json_array_get(calls, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        snprintf(d->names[d->ncalls], 64, "%s", name);
        if (k2_ids)
            snprintf(d->ids[d->ncalls], 64, "functions.%s:%zu", name, i);
        d->args[d->ncalls++] = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        d->order[d->norder++] = 'C';
    }
    d->ends = 1;
    d->order[d->norder++] = 'E';
}

/* The reply with its text cut at byte k (counting over all runs): the runs between atoms (K3's
 * control ids; the stop ids of every format, which end a reply only as ids) are decoded and
 * re-encoded, the run holding k as two pieces. */
static int atom(const tok *t, int k3, int32_t id) { return tok_is_stop(t, id) || (k3 && tok_is_special(t, id)); }

static void recut(const tok *t, int k3, const tok_ids *in, size_t k, tok_ids *out)
{
    out->n = 0;
    size_t at = 0, i = 0;
    errbuf err;
    while (i < in->n) {
        size_t j = i;
        while (j < in->n && !atom(t, k3, in->v[j]))
            j++;
        if (j > i) { /* a text run */
            char *txt;
            size_t len;
            tok_decode(t, in->v + i, j - i, 0, &txt, &len, &err);
            tok_special sp = k3 ? TOK_SPECIAL_NONE : TOK_SPECIAL_ALL;
            size_t cut = k >= at && k < at + len ? k - at : 0;
            tok_encode(t, txt, cut, sp, out, &err);
            tok_encode(t, txt + cut, len - cut, sp, out, &err);
            at += len;
            free(txt);
        }
        if (j < in->n)
            tok_ids_push(out, in->v[j]);
        i = j + 1;
    }
}

static int text_bytes(const tok *t, int k3, const tok_ids *in)
{
    size_t total = 0;
    errbuf err;
    for (size_t i = 0; i < in->n; i++) {
        size_t n = 0;
        if (atom(t, k3, in->v[i]))
            continue;
        tok_token_bytes(t, in->v[i], &n);
        total += n;
    }
    (void)err;
    return (int)total;
}

static const char *const MESSAGES[] = {
    /* reasoning and text */
    "{\"role\": \"assistant\", \"reasoning_content\": \"Two and two.\", \"content\": \"It is 4 — vier, 四.\"}",
    /* text that only looks like a marker's beginning, and multi-byte characters */
    "{\"role\": \"assistant\", \"reasoning_content\": \"a <thin b </thin\", \"content\": \"x <tool_cal y <|tool_ "
    "z 🎉é\"}",
    /* two tool calls with nested arguments */
    "{\"role\": \"assistant\", \"reasoning_content\": \"Look it up.\", \"content\": \"Checking.\", \"tool_calls\": "
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Par\\\\\\\"is "
    "é\\\", \\\"days\\\": 3, \\\"opts\\\": {\\\"units\\\": [\\\"C\\\", null], \\\"alerts\\\": true}}\"}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"arguments\": \"{}\"}}]}",
    /* a call and no text */
    "{\"role\": \"assistant\", \"reasoning_content\": \"Call.\", \"content\": \"\", \"tool_calls\": [{\"type\": "
    "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"q\\\": \\\"1 < 2 & \\\\\\\"x\\\\\\\"\\\"}\"}}]}",
};

static void format_case(const tok *t, const char *what, int thinking, int keeps_reasoning_always, int k2)
{
    int k3 = tok_chat_format_of(t) == TOK_CHAT_K3;
    for (size_t m = 0; m < sizeof MESSAGES / sizeof MESSAGES[0] && !test_failed(); m++) {
        json_error_t je;
        json_t *msg = json_loads(MESSAGES[m], 0, &je);
        CHECKF(msg, "message %zu: %s", m, je.text);
        tok_ids ids = {0}, cut = {0};
        errbuf err;
        int rc = reply_ids(t, msg, thinking, &ids, &err);
        if (rc) {
            json_decref(msg);
            CHECKF(0, "%s message %zu: %s", what, m, err.msg);
        }
        /* K2 keeps reasoning only after the last turn without calls; DeepSeek never renders it */
        int keeps = keeps_reasoning_always || (k2 && json_array_size(json_object_get(msg, "tool_calls")));
        if (tok_chat_format_of(t) == TOK_CHAT_DEEPSEEK3)
            keeps = 0;
        digest want, got;
        expected(msg, keeps, k2 ? "" : NULL, &want);
        char why[9000];
        int ok = 1;
        size_t groups[3] = {1, 3, ids.n};
        for (int g = 0; g < 3 && ok; g++) {
            ok = parse(t, thinking, ids.v, ids.n, groups[g], &got) == 0 && same(&got, &want, why, sizeof why) &&
                 !got.bad_json && !got.after_end;
            dg_free(&got);
            if (!ok)
                test_fail(__FILE__, __LINE__, "%s message %zu, ids in groups of %zu: %s", what, m, groups[g], why);
        }
        int nb = text_bytes(t, k3, &ids);
        for (int k = 0; k <= nb && ok; k++) {
            recut(t, k3, &ids, (size_t)k, &cut);
            ok = parse(t, thinking, cut.v, cut.n, 1, &got) == 0 && same(&got, &want, why, sizeof why) && !got.bad_json;
            dg_free(&got);
            if (!ok)
                test_fail(__FILE__, __LINE__, "%s message %zu, text cut at byte %d: %s", what, m, k, why);
        }
        dg_free(&want);
        tok_ids_free(&ids);
        tok_ids_free(&cut);
        json_decref(msg);
    }
}

TEST(tok_reply_k3)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    format_case(t, "K3", 1, 1, 0);
}

TEST(tok_reply_qwen3)
{
    const char *why;
    tok *t = tt_tok("qwen3", &why);
    CHECKF(t, "%s", why);
    format_case(t, "Qwen3", 1, 1, 0);
}

TEST(tok_reply_kimi_k2)
{
    errbuf err;
    tok *t = tt_k2_tok(1, &err);
    CHECKF(t, "%s", err.msg);
    format_case(t, "Kimi K2", 1, 0, 1);
    tok_free(t);
}

TEST(tok_reply_deepseek3)
{
    errbuf err;
    tok *t = tt_ds_tok(&err);
    CHECKF(t, "%s", err.msg);
    format_case(t, "DeepSeek-V3", 1, 0, 0);
    tok_free(t);
}

/* K3 with thinking off starts in the response channel; a plain tokenizer gives plain text */
TEST(tok_reply_k3_no_thinking_and_plain)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    json_t *msg = json_loads("{\"role\": \"assistant\", \"content\": \"plain answer\"}", 0, NULL);
    tok_ids ids = {0};
    errbuf err;
    CHECKF(reply_ids(t, msg, 0, &ids, &err) == 0, "%s", err.msg);
    digest d;
    CHECK(parse(t, 0, ids.v, ids.n, 2, &d) == 0);
    json_decref(msg);
    tok_ids_free(&ids);
    CHECKF(d.ntext == 12 && !memcmp(d.text, "plain answer", 12) && d.nreason == 0 && d.ends == 1, "%.*s", (int)d.ntext,
           d.text);
    tok *c = tt_tok("cl100k", &why);
    CHECKF(c, "%s", why);
    CHECK(tok_encode(c, "just <think> text", 17, TOK_SPECIAL_NONE, &ids, &err) == 0);
    CHECK(parse(c, 1, ids.v, ids.n, 1, &d) == 0);
    tok_ids_free(&ids);
    CHECKF(d.ntext == 17 && !strcmp(d.order, "T"), "%.*s (%s)", (int)d.ntext, d.text, d.order);
}
