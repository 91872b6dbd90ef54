/* tok_reply.c — the reply parser (tok.h: tok_reply_*): generated ids -> text, reasoning, tool
 * calls and the end of the message, for each chat format's markup as its renderer writes it
 * (tok_chat_*.c):
 *
 *   K3 XTML     reasoning <|close|>think<|sep|> <|open|>response<|sep|> text <|close|>response<|sep|>
 *               [<|open|>tools<|sep|> (<|open|>call tool="F" index="0"<|sep|>
 *                 (<|open|>argument key="K" type="T"<|sep|> value <|close|>argument<|sep|>)*
 *                 | <|open|>json type="object"<|sep|> raw <|close|>json<|sep|>
 *               <|close|>call<|sep|>)* <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|>
 *               The markers are special ids (text never becomes one); a tag's header between a
 *               marker and <|sep|> is ordinary text. A string argument is its raw value, any
 *               other type is JSON.
 *   Kimi K2     [<think>r</think>] text [<|tool_calls_section_begin|> (<|tool_call_begin|>
 *               functions.F:0 <|tool_call_argument_begin|> {args} <|tool_call_end|>)*
 *               <|tool_calls_section_end|>] <|im_end|>
 *   Qwen3       [<think>\n r \n</think>\n\n] text [\n<tool_call>\n{"name": F, "arguments": {...}}
 *               \n</tool_call>]* <|im_end|>   (newlines next to the think tags and between calls
 *               are the template's, not the model's words)
 *   DeepSeek-V3 text [<｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜>function<｜tool▁sep｜>F\n```json\n
 *               {args}\n```<｜tool▁call▁end｜>)* <｜tool▁calls▁end｜>] <｜end▁of▁sentence｜>
 *
 * Except for K3, markers are matched in the bytes of the ids (a special token contributes its
 * name), so a marker written as several ordinary tokens is a marker too: the bytes that could
 * still begin one are held back until they cannot. Text reaches the callback as complete UTF-8.
 * Invariant: `hold` never contains a whole marker of the current state.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "tokenizer/tok_int.h"

/* states */
enum {
    S_TEXT,   /* the answer */
    S_REASON, /* the thinking channel */
    S_CALLS,  /* a tool-call section, between calls */
    S_HEAD,   /* a call's head: K2 "functions.F:0", DeepSeek "function" */
    S_ARGS,   /* a call's arguments (K2) or body (DeepSeek "F\n```json\n...\n```") */
    S_QCALL,  /* Qwen3: the JSON between <tool_call> and </tool_call> */
    S_K3TAG,  /* K3: a tag's header, from <|open|> or <|close|> to <|sep|> */
    S_K3SKIP, /* K3: inside a tag whose text is not the reply's (tools, call, message) */
    S_K3ARG,  /* K3: an argument's value, or a raw json block */
    S_END
};

/* what a marker does */
enum { M_THINK, M_UNTHINK, M_SECTION, M_UNSECTION, M_CALL, M_ARGSTART, M_SEP, M_CALLEND, M_QCALL, M_QCALLEND };

typedef struct marker {
    const char *s;
    int state; /* the state it is a marker in */
    int action;
} marker;

#define FW "\xEF\xBD\x9C" /* ｜ */
#define SP "\xE2\x96\x81" /* ▁ */

static const marker K2_MARKS[] = {
    {.s = "<think>", .state = S_TEXT, .action = M_THINK},
    {.s = "</think>", .state = S_REASON, .action = M_UNTHINK},
    {.s = "<|tool_calls_section_begin|>", .state = S_TEXT, .action = M_SECTION},
    {.s = "<|tool_call_begin|>", .state = S_CALLS, .action = M_CALL},
    {.s = "<|tool_calls_section_end|>", .state = S_CALLS, .action = M_UNSECTION},
    {.s = "<|tool_call_argument_begin|>", .state = S_HEAD, .action = M_ARGSTART},
    {.s = "<|tool_call_end|>", .state = S_ARGS, .action = M_CALLEND},
    {.s = NULL},
};

static const marker QWEN_MARKS[] = {
    {.s = "<think>", .state = S_TEXT, .action = M_THINK},
    {.s = "</think>", .state = S_REASON, .action = M_UNTHINK},
    {.s = "<tool_call>", .state = S_TEXT, .action = M_QCALL},
    {.s = "</tool_call>", .state = S_QCALL, .action = M_QCALLEND},
    {.s = NULL},
};

static const marker DS_MARKS[] = {
    {.s = "<think>", .state = S_TEXT, .action = M_THINK},
    {.s = "</think>", .state = S_REASON, .action = M_UNTHINK},
    {.s = "<" FW "tool" SP "calls" SP "begin" FW ">", .state = S_TEXT, .action = M_SECTION},
    {.s = "<" FW "tool" SP "call" SP "begin" FW ">", .state = S_CALLS, .action = M_CALL},
    {.s = "<" FW "tool" SP "calls" SP "end" FW ">", .state = S_CALLS, .action = M_UNSECTION},
    {.s = "<" FW "tool" SP "sep" FW ">", .state = S_HEAD, .action = M_SEP},
    {.s = "<" FW "tool" SP "call" SP "end" FW ">", .state = S_ARGS, .action = M_CALLEND},
    {.s = NULL},
};

struct tok_reply {
    const tok *t;
    int fmt;            /* tok_chat_format */
    const marker *marks; /* NULL for K3 (id markers) and plain formats */
    int state;
    int strip_nl;       /* Qwen3: drop the template's newlines next to think tags and calls */
    int skip_lead;      /* the next content of this channel drops its leading newlines */
    size_t held_nl;     /* Qwen3: the channel's trailing newlines, held until more text comes */
    buf hold;          /* bytes that may begin a marker */
    buf u8;            /* an incomplete code point of the channel being emitted */
    int u8_kind;
    buf out;           /* text being handed to the callback */
    buf call, head;    /* the tool call being collected */
    int ncalls;
    /* K3 */
    int32_t k3_open, k3_close, k3_sep;
    int k3_closing, k3_back; /* the header opened with <|close|>; the state to return to */
    int k3_think_depth;
    buf k3_name, k3_key, k3_type;
    int k3_json;        /* the value is a raw json block */
    json_t *k3_args;
};

int tok_reply_new(const tok *t, int thinking, tok_reply **out, errbuf *err)
{
    tok_reply *r = calloc(1, sizeof *r);
    *out = NULL;
    if (!r)
        return errbuf_set(err, "reply parser: out of memory");
    r->t = t;
    r->fmt = t->chat;
    r->state = S_TEXT;
    switch (r->fmt) {
    case TOK_CHAT_K3:
        r->k3_open = tok_token_id(t, "<|open|>", 8);
        r->k3_close = tok_token_id(t, "<|close|>", 9);
        r->k3_sep = tok_token_id(t, "<|sep|>", 7);
        if (thinking)
            r->state = S_REASON;
        break;
    case TOK_CHAT_KIMI2:
        r->marks = K2_MARKS;
        break;
    case TOK_CHAT_QWEN3:
        r->marks = QWEN_MARKS;
        r->strip_nl = 1;
        break;
    case TOK_CHAT_DEEPSEEK3:
        r->marks = DS_MARKS;
        break;
    default:
        break;
    }
    *out = r;
    return 0;
}

void tok_reply_free(tok_reply *r)
{
    if (!r)
        return;
    buf *b[] = {&r->hold, &r->u8, &r->out, &r->call, &r->head, &r->k3_name, &r->k3_key, &r->k3_type};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        free(b[i]->p);
    json_decref(r->k3_args);
    free(r);
}

/* ---- emitting ---- */

typedef struct sink {
    tok_reply_fn cb;
    void *ud;
    int stop;     /* the callback's non-zero return */
    errbuf *err;
    int oom;
} sink;

static void emit(tok_reply *r, sink *k, const tok_reply_event *ev)
{
    (void)r;
    if (!k->stop && !k->oom)
        k->stop = k->cb(k->ud, ev);
}

/* Hands over the complete code points of u8 (final: all of it, a dangling tail as U+FFFD). */
static void flush_utf8(tok_reply *r, sink *k, int final)
{
    if (r->u8.n == 0)
        return;
    r->out.n = 0;
    if (buf_reserve(&r->out, 3 * r->u8.n)) {
        k->oom = 1;
        return;
    }
    size_t rest;
    size_t n = tok_utf8_replace((const uint8_t *)r->u8.p, r->u8.n, r->out.p, final, &rest);
    buf_cut(&r->u8, r->u8.n - rest);
    if (n) {
        tok_reply_event ev = {.kind = (tok_reply_kind)r->u8_kind, .text = r->out.p, .len = n};
        emit(r, k, &ev);
    }
}

/* Text of `kind` for the callback, whole code points at a time. */
static void text_out(tok_reply *r, sink *k, int kind, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (kind != r->u8_kind)
        flush_utf8(r, k, 1);
    r->u8_kind = kind;
    if (buf_put(&r->u8, s, n)) {
        k->oom = 1;
        return;
    }
    flush_utf8(r, k, 0);
}

/* Qwen3: the newlines held at the end of the channel's text are its own after all */
static void release_nl(tok_reply *r, sink *k)
{
    static const char NL[16] = "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n";
    int kind = r->state == S_TEXT ? TOK_REPLY_TEXT : TOK_REPLY_REASONING;
    while (r->held_nl) {
        size_t c = r->held_nl < sizeof NL ? r->held_nl : sizeof NL;
        text_out(r, k, kind, NL, c);
        r->held_nl -= c;
    }
}

/* Content of the current state: the channel's text, or the call being collected. */
static void content(tok_reply *r, sink *k, const char *s, size_t n)
{
    if (r->skip_lead) {
        while (n && *s == '\n')
            s++, n--;
        if (n)
            r->skip_lead = 0;
    }
    switch (r->state) {
    case S_TEXT:
    case S_REASON: {
        int kind = r->state == S_TEXT ? TOK_REPLY_TEXT : TOK_REPLY_REASONING;
        size_t nl = 0;
        while (r->strip_nl && nl < n && s[n - 1 - nl] == '\n')
            nl++; /* newlines that may be the template's, before a tag: held */
        if (nl < n) {
            release_nl(r, k);
            text_out(r, k, kind, s, n - nl);
        }
        r->held_nl += nl;
        break;
    }
    case S_HEAD:
        if (buf_put(&r->head, s, n))
            k->oom = 1;
        break;
    case S_ARGS:
    case S_QCALL:
    case S_K3ARG:
        if (buf_put(&r->call, s, n))
            k->oom = 1;
        break;
    case S_K3TAG:
        if (buf_put(&r->k3_name, s, n))
            k->oom = 1;
        break;
    default: /* between calls, inside K3 tags that carry no text, after the end */
        break;
    }
}

/* s[0..n) as valid UTF-8 (ill-formed bytes as U+FFFD) in b, NUL-terminated */
static int utf8_valid(buf *b, const char *s, size_t n)
{
    b->n = 0;
    if (buf_reserve(b, 3 * n))
        return -1;
    size_t rest;
    b->n = tok_utf8_replace((const uint8_t *)s, n, b->p, 1, &rest);
    b->p[b->n] = 0;
    return 0;
}

/* A call's name, id and arguments go out as valid UTF-8 whatever the model wrote. */
static void call_out(tok_reply *r, sink *k, const char *name, const char *id, const char *args, size_t len)
{
    flush_utf8(r, k, 1);
    buf nb = {0}, ib = {0}, ab = {0};
    if (utf8_valid(&nb, name, strlen(name)) || utf8_valid(&ib, id, strlen(id)) || utf8_valid(&ab, args, len)) {
        k->oom = 1;
    } else {
        tok_reply_event ev = {.kind = TOK_REPLY_TOOL_CALL, .text = ab.p, .len = ab.n, .name = nb.p, .id = ib.p,
                              .index = r->ncalls++};
        emit(r, k, &ev);
    }
    free(nb.p);
    free(ib.p);
    free(ab.p);
}

static void trim(const char **s, size_t *n)
{
    while (*n && (**s == ' ' || **s == '\n'))
        (*s)++, (*n)--;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\n'))
        (*n)--;
}

/* K2: head "functions.F:0" (the id; F between the dot and the colon), args as written */
static void k2_call(tok_reply *r, sink *k)
{
    const char *h = r->head.p ? r->head.p : "", *a = r->call.p ? r->call.p : "";
    size_t hn = r->head.n, an = r->call.n;
    trim(&h, &hn);
    trim(&a, &an);
    char id[256], name[256];
    snprintf(id, sizeof id, "%.*s", (int)hn, h);
    const char *dot = memchr(id, '.', strlen(id)), *colon = strrchr(id, ':');
    const char *b = dot ? dot + 1 : id;
    snprintf(name, sizeof name, "%.*s", (int)(colon && colon > b ? colon - b : (long)strlen(b)), b);
    call_out(r, k, name, id, a, an);
}

/* DeepSeek: body "F\n```json\n{args}\n```" */
static void ds_call(tok_reply *r, sink *k)
{
    const char *b = r->call.p ? r->call.p : "";
    size_t n = r->call.n;
    const char *nl = memchr(b, '\n', n);
    size_t fn = nl ? (size_t)(nl - b) : n;
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)fn, b);
    const char *a = nl ? nl + 1 : b + n;
    size_t an = (size_t)(b + n - a);
    if (an >= 8 && !memcmp(a, "```json\n", 8))
        a += 8, an -= 8;
    trim(&a, &an);
    if (an >= 3 && !memcmp(a + an - 3, "```", 3))
        an -= 3;
    trim(&a, &an);
    call_out(r, k, name, "", a, an);
}

/* Qwen3: {"name": F, "arguments": {...}}; anything else was not a call: its text is passed on */
static void qwen_call(tok_reply *r, sink *k)
{
    json_t *j = json_loadb(r->call.p ? r->call.p : "", r->call.n, 0, NULL);
    const json_t *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
    if (!json_is_string(name) || !args) {
        text_out(r, k, TOK_REPLY_TEXT, "<tool_call>", 11);
        text_out(r, k, TOK_REPLY_TEXT, r->call.p ? r->call.p : "", r->call.n);
        text_out(r, k, TOK_REPLY_TEXT, "</tool_call>", 12);
    } else if (json_is_string(args)) {
        call_out(r, k, json_string_value(name), "", json_string_value(args), json_string_length(args));
    } else {
        char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!a)
            k->oom = 1;
        else
            call_out(r, k, json_string_value(name), "", a, strlen(a));
        free(a);
    }
    json_decref(j);
}

static void act(tok_reply *r, sink *k, int action)
{
    switch (action) {
    case M_THINK:
        release_nl(r, k);
        r->state = S_REASON;
        r->skip_lead = r->strip_nl;
        break;
    case M_UNTHINK:
        r->held_nl = 0; /* "\n</think>" is the template's */
        r->state = S_TEXT;
        r->skip_lead = r->strip_nl;
        break;
    case M_SECTION:
        release_nl(r, k);
        r->state = S_CALLS;
        break;
    case M_UNSECTION:
        r->state = S_TEXT;
        break;
    case M_CALL:
        r->head.n = r->call.n = 0;
        r->state = S_HEAD;
        break;
    case M_ARGSTART:
    case M_SEP:
        r->state = S_ARGS;
        break;
    case M_CALLEND:
        if (r->fmt == TOK_CHAT_KIMI2)
            k2_call(r, k);
        else
            ds_call(r, k);
        r->state = S_CALLS;
        break;
    case M_QCALL:
        r->held_nl = 0; /* "\n<tool_call>" is the template's */
        r->call.n = 0;
        r->state = S_QCALL;
        break;
    case M_QCALLEND:
        qwen_call(r, k);
        r->state = S_TEXT;
        r->skip_lead = r->strip_nl;
        break;
    default:
        assert(0);
    }
}

/* Consumes hold up to what may still begin a marker of the current state (everything when
 * `all`). */
static void scan(tok_reply *r, sink *k, int all)
{
    while (r->hold.n && !k->oom) {
        const char *h = r->hold.p;
        size_t n = r->hold.n, best = n, keep = 0;
        const marker *hit = NULL;
        for (const marker *m = r->marks; m && m->s; m++) {
            if (m->state != r->state)
                continue;
            size_t ml = strlen(m->s);
            const char *f = memmem(h, n, m->s, ml);
            if (f && (size_t)(f - h) < best) {
                best = (size_t)(f - h);
                hit = m;
            }
            /* a proper prefix of the marker at the end of hold */
            for (size_t l = ml - 1 < n ? ml - 1 : n; !hit && l > keep; l--)
                if (!memcmp(h + n - l, m->s, l)) {
                    keep = l;
                    break;
                }
        }
        if (hit) {
            content(r, k, h, best);
            size_t ml = strlen(hit->s);
            buf_cut(&r->hold, best + ml);
            act(r, k, hit->action);
            continue;
        }
        if (all)
            keep = 0;
        content(r, k, h, n - keep);
        buf_cut(&r->hold, n - keep);
        break;
    }
}

/* ---- K3 ---- */

/* the value of attribute `key` in a header ` key="v" ...`, unescaped (&amp; &quot;) */
static int k3_attr(const char *head, const char *key, buf *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=\"", key);
    const char *p = strstr(head, pat);
    out->n = 0;
    if (!p)
        return buf_put(out, "", 0);
    p += strlen(pat);
    for (const char *q = p; *q && *q != '"'; q++) {
        if (!strncmp(q, "&amp;", 5)) {
            if (buf_put(out, "&", 1))
                return -1;
            q += 4;
        } else if (!strncmp(q, "&quot;", 6)) {
            if (buf_put(out, "\"", 1))
                return -1;
            q += 5;
        } else if (buf_put(out, q, 1)) {
            return -1;
        }
    }
    return 0;
}

/* a K3 argument closed: key, type and value into the call's object (an argument outside a call
 * says nothing) */
static void k3_argument(tok_reply *r, sink *k)
{
    if (!json_is_object(r->k3_args))
        return;
    buf key = {0}, val_text = {0};
    json_t *val = NULL;
    if (utf8_valid(&key, r->k3_key.p ? r->k3_key.p : "", r->k3_key.n) ||
        utf8_valid(&val_text, r->call.p ? r->call.p : "", r->call.n)) {
        k->oom = 1;
        goto out;
    }
    if (strcmp(r->k3_type.p ? r->k3_type.p : "", "string") != 0)
        val = json_loadb(val_text.p, val_text.n, JSON_DECODE_ANY, NULL);
    if (!val)
        val = json_stringn(val_text.p, val_text.n);
    if (!val || json_object_set_new(r->k3_args, key.p, val))
        k->oom = 1;
out:
    free(key.p);
    free(val_text.p);
}

static void k3_header(tok_reply *r, sink *k)
{
    const char *h = r->k3_name.p ? r->k3_name.p : "";
    size_t tl = strcspn(h, " ");
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(tl < 31 ? tl : 31), h);
    int back = r->k3_back;
    r->state = back;
    if (!r->k3_closing) {
        if (!strcmp(tag, "think"))
            r->state = S_REASON;
        else if (!strcmp(tag, "response"))
            r->state = S_TEXT;
        else if (!strcmp(tag, "call")) {
            json_decref(r->k3_args);
            r->k3_args = json_object();
            r->k3_json = 0;
            if (k3_attr(h, "tool", &r->head) || !r->k3_args)
                k->oom = 1;
            r->state = S_K3SKIP;
        } else if (!strcmp(tag, "argument") || !strcmp(tag, "json")) {
            r->k3_json = !strcmp(tag, "json");
            if (k3_attr(h, "key", &r->k3_key) || k3_attr(h, "type", &r->k3_type))
                k->oom = 1;
            r->call.n = 0;
            r->state = S_K3ARG;
        } else if (!strcmp(tag, "tools") || !strcmp(tag, "message")) {
            r->state = S_K3SKIP;
        }
        return;
    }
    if (!strcmp(tag, "think") || !strcmp(tag, "response") || !strcmp(tag, "tools")) {
        r->state = S_K3SKIP;
    } else if (!strcmp(tag, "argument") || !strcmp(tag, "json")) {
        if (r->k3_json && r->k3_args) { /* the raw arguments stand as written */
            buf raw = {0};
            json_decref(r->k3_args);
            r->k3_args = NULL;
            if (utf8_valid(&raw, r->call.p ? r->call.p : "", r->call.n) || !(r->k3_args = json_stringn(raw.p, raw.n)))
                k->oom = 1;
            free(raw.p);
        } else {
            k3_argument(r, k);
        }
        r->state = S_K3SKIP;
    } else if (!strcmp(tag, "call") && r->k3_args) {
        char *a = NULL;
        if (json_is_string(r->k3_args))
            a = strdup(json_string_value(r->k3_args));
        else if (r->k3_args)
            a = json_dumps(r->k3_args, JSON_COMPACT);
        if (!a)
            k->oom = 1;
        else
            call_out(r, k, r->head.p ? r->head.p : "", "", a, strlen(a));
        free(a);
        json_decref(r->k3_args);
        r->k3_args = NULL;
        r->state = S_K3SKIP;
    } else if (!strcmp(tag, "message")) {
        r->state = S_K3SKIP;
    }
}

static void k3_id(tok_reply *r, sink *k, int32_t id)
{
    if (id == r->k3_open || id == r->k3_close) {
        if (r->state == S_K3TAG) /* a marker inside a header: the header was text */
            r->state = r->k3_back;
        flush_utf8(r, k, 1);
        r->k3_back = r->state;
        r->k3_closing = id == r->k3_close;
        r->k3_name.n = 0;
        r->state = S_K3TAG;
        return;
    }
    if (id == r->k3_sep && r->state == S_K3TAG) {
        if (buf_put(&r->k3_name, "", 0))
            k->oom = 1;
        else
            k3_header(r, k);
        return;
    }
    size_t n;
    const uint8_t *b = tok_token_bytes(r->t, id, &n);
    if (b)
        content(r, k, (const char *)b, n);
}

/* ---- feeding ---- */

int tok_reply_feed(tok_reply *r, const int32_t *ids, size_t n, tok_reply_fn cb, void *ud, errbuf *err)
{
    sink k = {cb, ud, 0, err, 0};
    for (size_t i = 0; i < n && !k.stop && !k.oom && r->state != S_END; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok_vocab_size(r->t))
            continue;
        if (tok_is_stop(r->t, id)) { /* the end: what is held back is text after all */
            if (r->marks)
                scan(r, &k, 1);
            if (r->state == S_TEXT)
                release_nl(r, &k);
            flush_utf8(r, &k, 1);
            r->state = S_END;
            tok_reply_event ev = {.kind = TOK_REPLY_END};
            emit(r, &k, &ev);
            break;
        }
        if (r->fmt == TOK_CHAT_K3) {
            k3_id(r, &k, id);
            continue;
        }
        size_t len;
        const uint8_t *b = tok_token_bytes(r->t, id, &len);
        if (!b)
            continue;
        if (buf_put(&r->hold, b, len)) {
            k.oom = 1;
            break;
        }
        if (r->marks)
            scan(r, &k, 0);
        else {
            content(r, &k, r->hold.p, r->hold.n);
            r->hold.n = 0;
        }
    }
    if (k.oom)
        return errbuf_set(err, "reply parser: out of memory");
    return k.stop;
}

int tok_reply_finish(tok_reply *r, tok_reply_fn cb, void *ud, errbuf *err)
{
    sink k = {cb, ud, 0, err, 0};
    if (r->state != S_END) {
        if (r->marks)
            scan(r, &k, 1);
        if (r->state == S_TEXT)
            release_nl(r, &k);
        flush_utf8(r, &k, 1);
    }
    if (k.oom)
        return errbuf_set(err, "reply parser: out of memory");
    return k.stop;
}
