/* tok_chat.c — chat requests -> segments -> ids, shared by every chat format.
 *
 * A renderer (tok_chat_k3.c, tok_chat_kimi2.c, tok_chat_qwen3.c, tok_chat_deepseek3.c) produces
 * segments: markup (the template's own text; special tokens inside it become special ids) and
 * text (anything from the request: content, names, arguments, tool schemas; never special ids).
 * How segments become ids follows the reference:
 *   K3 (encoding_k3.py + _encode_chat_segments): every segment is encoded on its own, so BPE
 *     never merges across a segment boundary ("message", " role", "=\"", "user", "\"").
 *   Jinja formats (HF apply_chat_template, then encode of the whole string): the text between two
 *     special tokens is encoded as one piece of text, across segment boundaries; only the
 *     special tokens of markup segments are recognized (the reference would also recognize one
 *     typed by a user — we do not, on purpose).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

void tok_segs_add(tok_segs *s, const char *p, size_t n, int markup)
{
    if (s->bad || n == 0)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *nt = realloc(s->text, cap);
        if (!nt) {
            s->bad = 1;
            return;
        }
        s->text = nt;
        s->cap = cap;
    }
    if (s->n == s->segcap) {
        size_t cap = s->segcap ? s->segcap * 2 : 64;
        tok_seg *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv) {
            s->bad = 1;
            return;
        }
        s->v = nv;
        s->segcap = cap;
    }
    memcpy(s->text + s->len, p, n);
    s->v[s->n++] = (tok_seg){s->len, n, markup};
    s->len += n;
    s->text[s->len] = 0;
}

void tok_segs_str(tok_segs *s, const char *p, int markup) { tok_segs_add(s, p, strlen(p), markup); }

void tok_segs_free(tok_segs *s)
{
    free(s->text);
    free(s->v);
    memset(s, 0, sizeof *s);
}

void tok_chat_opts_init(tok_chat_opts *o)
{
    o->thinking = 1;
    o->thinking_effort = NULL;
    o->add_generation_prompt = 1;
}

static int parse_req(const json_t *req, tok_chat_req *r, errbuf *err)
{
    memset(r, 0, sizeof *r);
    if (json_is_array(req)) {
        r->messages = req;
    } else if (json_is_object(req)) {
        r->messages = json_object_get(req, "messages");
        r->tools = json_object_get(req, "tools");
        r->tool_choice = json_object_get(req, "tool_choice");
        r->response_format = json_object_get(req, "response_format");
        if (!json_is_array(r->messages))
            return errbuf_set(err, "chat request: 'messages' must be an array");
        if (r->tools && json_is_null(r->tools))
            r->tools = NULL;
        if (r->tools && !json_is_array(r->tools))
            return errbuf_set(err, "chat request: 'tools' must be an array");
    } else {
        return errbuf_set(err, "chat request: expected a messages array or a request object");
    }
    size_t i;
    json_t *m;
    json_array_foreach(r->messages, i, m)
    {
        if (!json_is_object(m))
            return errbuf_set(err, "messages[%zu]: expected an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return errbuf_set(err, "messages[%zu]: missing 'role' (a string)", i);
    }
    return 0;
}

static int render(const tok *t, const json_t *req, const tok_chat_opts *o, tok_segs *segs, errbuf *err)
{
    tok_chat_req r;
    tok_chat_opts def;
    if (!o) {
        tok_chat_opts_init(&def);
        o = &def;
    }
    if (parse_req(req, &r, err))
        return -1;
    int rc;
    switch (t->chat) {
    case TOK_CHAT_K3:
        rc = tok_chat_k3(t, &r, o, segs, err);
        break;
    case TOK_CHAT_KIMI2:
        rc = tok_chat_kimi2(t, &r, o, segs, err);
        break;
    case TOK_CHAT_QWEN3:
        rc = tok_chat_qwen3(t, &r, o, segs, err);
        break;
    case TOK_CHAT_DEEPSEEK3:
        rc = tok_chat_deepseek3(t, &r, o, segs, err);
        break;
    default:
        return errbuf_set(err, "this tokenizer has no chat format (no chat template or known special tokens)");
    }
    if (!rc && segs->bad)
        rc = errbuf_set(err, "out of memory rendering the chat");
    return rc;
}

int tok_chat_render(const tok *t, const json_t *req, const tok_chat_opts *o, char **text, size_t *len, errbuf *err)
{
    tok_segs segs = {0};
    if (render(t, req, o, &segs, err)) {
        tok_segs_free(&segs);
        return -1;
    }
    if (!segs.text)
        tok_segs_add(&segs, "", 0, 0);
    *text = segs.text ? segs.text : calloc(1, 1);
    *len = segs.len;
    free(segs.v);
    return *text ? 0 : errbuf_set(err, "out of memory");
}

/* Jinja formats: text runs between the special tokens found in markup, encoded whole. */
static int encode_joined(const tok *t, const tok_segs *segs, tok_ids *out, errbuf *err)
{
    const uint8_t *s = (const uint8_t *)segs->text;
    size_t run = 0;
    for (size_t i = 0; i < segs->n; i++) {
        const tok_seg *g = &segs->v[i];
        if (!g->markup)
            continue;
        size_t pos = g->off, end = g->off + g->len, ms, me;
        int32_t id;
        while (tok_special_find(t, s, pos, end, &ms, &me, &id)) {
            if (tok_encode(t, segs->text + run, ms - run, TOK_SPECIAL_NONE, out, err))
                return -1;
            if (tok_ids_push(out, id))
                return errbuf_set(err, "out of memory");
            pos = run = me;
        }
    }
    return tok_encode(t, segs->text + run, segs->len - run, TOK_SPECIAL_NONE, out, err);
}

int tok_chat_encode(const tok *t, const json_t *req, const tok_chat_opts *o, tok_ids *out, errbuf *err)
{
    tok_segs segs = {0};
    int rc = render(t, req, o, &segs, err);
    if (!rc && t->chat == TOK_CHAT_K3) {
        for (size_t i = 0; !rc && i < segs.n; i++)
            rc = tok_encode(t, segs.text + segs.v[i].off, segs.v[i].len,
                            segs.v[i].markup ? TOK_SPECIAL_ALL : TOK_SPECIAL_NONE, out, err);
    } else if (!rc) {
        rc = encode_joined(t, &segs, out, err);
    }
    tok_segs_free(&segs);
    return rc;
}
