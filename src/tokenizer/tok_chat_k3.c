/* tok_chat_k3.c — Kimi K3's XTML prompt, segment for segment as Moonshot's encoding_k3.py builds it.
 *
 *   OPEN(tag, attrs) = <|open|> tag { " key" "=\"" escaped-value "\"" }* <|sep|>
 *   CLOSE(tag)       = <|close|> tag <|sep|>          EOM = <|end_of_msg|>
 * Each piece between the braces is its own text segment (encoded separately); an empty piece is
 * no segment at all. Order: tool declaration, thinking-effort note (thinking on; effort defaults
 * to "max" as the HF apply_chat_template does), the messages (tool results first re-ordered to
 * the assistant's tool_calls order by tool_call_id), tool-choice and response-format notes, then
 * the generation prompt OPEN(message role=assistant) OPEN(think | response).
 * Python semantics kept on purpose: `x or y` / truthiness for optional fields, str() of scalar
 * attribute values, json.dumps spacing (compact for schemas, ", " ": " for argument values).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

static const char OPEN[] = "<|open|>", CLOSE[] = "<|close|>", SEP[] = "<|sep|>", EOM[] = "<|end_of_msg|>";
static const char IMAGE_PLACEHOLDER[] = "<|kimi_image_placeholder|>";

static int truthy(const json_t *v)
{
    if (!v)
        return 0;
    switch (json_typeof(v)) {
    case JSON_STRING:
        return json_string_length(v) > 0;
    case JSON_INTEGER:
        return json_integer_value(v) != 0;
    case JSON_REAL:
        return json_real_value(v) != 0;
    case JSON_TRUE:
        return 1;
    case JSON_ARRAY:
        return json_array_size(v) > 0;
    case JSON_OBJECT:
        return json_object_size(v) > 0;
    default:
        return 0;
    }
}

/* Python str.strip() would leave nothing. */
static int blank(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s, *e = p + n;
    while (p < e) {
        int len;
        uint32_t c = toku_next(p, e, &len);
        if (!(toku_flags(c) & TOKU_PYSPACE))
            return 0;
        p += len;
    }
    return 1;
}

static void ctl(tok_segs *o, const char *s) { tok_segs_str(o, s, 1); }
static void txt(tok_segs *o, const char *s, size_t n) { tok_segs_add(o, s, n, 0); }
static void txts(tok_segs *o, const char *s) { tok_segs_add(o, s, strlen(s), 0); }

/* str(value) of a JSON scalar as text; other values are an error. */
static int txt_str(tok_segs *o, const json_t *v, errbuf *err, const char *what)
{
    char buf[64];
    const char *s;
    size_t n;
    if (tok_json_pystr(v, buf, sizeof buf, &s, &n))
        return errbuf_set(err, "%s: expected a string", what);
    txt(o, s, n);
    return 0;
}

typedef struct attr {
    const char *key;
    const json_t *jv; /* value as JSON (str() of it), or */
    const char *sv;   /* a literal value */
} attr;

/* " key" "=\"" value with & and " escaped "\"" — four separate segments */
static int open_tag(tok_segs *o, const char *tag, const attr *a, int na, errbuf *err)
{
    ctl(o, OPEN);
    txts(o, tag);
    for (int i = 0; i < na; i++) {
        char key[64], buf[64];
        snprintf(key, sizeof key, " %s", a[i].key);
        txts(o, key);
        txts(o, "=\"");
        const char *s = a[i].sv;
        size_t n = s ? strlen(s) : 0;
        if (!s && tok_json_pystr(a[i].jv, buf, sizeof buf, &s, &n))
            return errbuf_set(err, "attribute '%s': expected a string", a[i].key);
        tok_segs esc = {0};
        size_t start = 0;
        for (size_t k = 0; k < n; k++) {
            const char *rep = s[k] == '&' ? "&amp;" : s[k] == '"' ? "&quot;" : NULL;
            if (rep) {
                tok_segs_add(&esc, s + start, k - start, 0);
                tok_segs_str(&esc, rep, 0);
                start = k + 1;
            }
        }
        tok_segs_add(&esc, s + start, n - start, 0);
        txt(o, esc.text, esc.len);
        if (esc.bad)
            o->bad = 1;
        tok_segs_free(&esc);
        txts(o, "\"");
    }
    ctl(o, SEP);
    return 0;
}

static void close_tag(tok_segs *o, const char *tag)
{
    ctl(o, CLOSE);
    txts(o, tag);
    ctl(o, SEP);
}

/* A message's content: a string, or OpenAI's list of parts (images become the placeholder). */
static int content(tok_segs *o, const json_t *c, errbuf *err, size_t mi)
{
    if (!c || json_is_null(c))
        return 0;
    if (json_is_array(c)) {
        size_t i;
        json_t *part;
        json_array_foreach(c, i, part)
        {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (type && (!strcmp(type, "image") || !strcmp(type, "image_url"))) {
                ctl(o, IMAGE_PLACEHOLDER);
                continue;
            }
            const json_t *tx = json_object_get(part, "text");
            if (!tx)
                return errbuf_set(err, "messages[%zu].content[%zu]: a part needs 'text'", mi, i);
            if (txt_str(o, tx, err, "content part"))
                return -1;
        }
        return 0;
    }
    return txt_str(o, c, err, "message content");
}

static void internal_system(tok_segs *o, const char *type, const char *body)
{
    attr a[2] = {{"role", NULL, "system"}, {"type", NULL, type}};
    errbuf unused; /* literal attribute values cannot fail */
    open_tag(o, "message", a, 2, &unused);
    txts(o, body);
    close_tag(o, "message");
    ctl(o, EOM);
}

static int tool_declare(tok_segs *o, const json_t *tools, int dynamic)
{
    tok_segs body = {0};
    tok_segs_str(&body,
                 dynamic ? "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                           "You have access to all existing and extended tools.\n"
                           "Here are the specs for the extended tools.\n\n```json\n"
                         : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n",
                 0);
    int rc = tok_json_dump(tools, 1, 1, &body, 0);
    tok_segs_str(&body, "\n```", 0);
    attr a[2] = {{"role", NULL, "system"}, {"type", NULL, "tool-declare"}};
    errbuf unused; /* literal attribute values cannot fail */
    open_tag(o, "message", a, 2, &unused);
    txt(o, body.text, body.len);
    close_tag(o, "message");
    ctl(o, EOM);
    if (body.bad)
        o->bad = 1;
    tok_segs_free(&body);
    return rc;
}

static const char *xtml_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
        return "null";
    case JSON_INTEGER:
    case JSON_REAL:
        return "number";
    case JSON_STRING:
        return "string";
    case JSON_OBJECT:
        return "object";
    default:
        return "array";
    }
}

/* normalize_tool_arguments: a mapping to render as arguments (new reference in *args), or the
 * raw text of arguments that are not JSON (*block). */
static int tool_args(const json_t *a, json_t **args, const char **block, size_t *blen, errbuf *err, size_t mi)
{
    *args = NULL;
    *block = NULL;
    if (!a || json_is_null(a))
        return 0;
    if (json_is_object(a)) {
        *args = json_incref((json_t *)a);
        return 0;
    }
    if (!json_is_string(a))
        return errbuf_set(err, "messages[%zu]: tool call arguments must be an object or a JSON object string", mi);
    const char *s = json_string_value(a);
    size_t n = json_string_length(a);
    if (blank(s, n))
        return 0;
    json_error_t je;
    json_t *p = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!p) {
        *block = s;
        *blen = n;
        return 0;
    }
    if (!json_is_object(p)) {
        json_decref(p);
        return errbuf_set(err, "messages[%zu]: Kimi K3 tool call arguments must be a JSON object", mi);
    }
    *args = p;
    return 0;
}

static int assistant(tok_segs *o, const json_t *m, int thinking, errbuf *err, size_t mi)
{
    if (thinking) {
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (!truthy(rc))
            rc = json_object_get(m, "reasoning");
        open_tag(o, "think", NULL, 0, err);
        if (rc && !json_is_null(rc)) {
            char buf[64];
            const char *s;
            size_t n;
            if (tok_json_pystr(rc, buf, sizeof buf, &s, &n))
                return errbuf_set(err, "messages[%zu].reasoning_content: expected a string", mi);
            if (!blank(s, n))
                txt(o, s, n);
        }
        close_tag(o, "think");
    }
    open_tag(o, "response", NULL, 0, err);
    if (content(o, json_object_get(m, "content"), err, mi))
        return -1;
    close_tag(o, "response");
    const json_t *calls = json_object_get(m, "tool_calls");
    if (!truthy(calls))
        return 0;
    if (!json_is_array(calls))
        return errbuf_set(err, "messages[%zu].tool_calls: expected an array", mi);
    open_tag(o, "tools", NULL, 0, err);
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc)
    {
        if (!json_is_object(tc))
            return errbuf_set(err, "messages[%zu].tool_calls[%zu]: expected an object", mi, i);
        const json_t *fn = json_object_get(tc, "function");
        if (!fn)
            fn = tc;
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name) || !json_string_length(name))
            return errbuf_set(err, "messages[%zu].tool_calls[%zu]: needs a function name", mi, i);
        char ib[24];
        snprintf(ib, sizeof ib, "%zu", i + 1);
        attr a[2] = {{"tool", name, NULL}, {"index", NULL, ib}};
        open_tag(o, "call", a, 2, err);
        json_t *args;
        const char *block;
        size_t blen;
        if (tool_args(json_object_get(fn, "arguments"), &args, &block, &blen, err, mi))
            return -1;
        if (block) {
            attr t[1] = {{"type", NULL, "object"}};
            open_tag(o, "json", t, 1, err);
            txt(o, block, blen);
            close_tag(o, "json");
        } else if (args) {
            const char *k;
            json_t *v;
            json_object_foreach(args, k, v)
            {
                attr aa[2] = {{"key", NULL, k}, {"type", NULL, xtml_type(v)}};
                open_tag(o, "argument", aa, 2, err);
                if (json_is_string(v)) {
                    txt(o, json_string_value(v), json_string_length(v));
                } else {
                    tok_segs val = {0};
                    tok_json_dump(v, 0, 0, &val, 0);
                    txt(o, val.text, val.len);
                    if (val.bad)
                        o->bad = 1;
                    tok_segs_free(&val);
                }
                close_tag(o, "argument");
            }
        }
        json_decref(args);
        close_tag(o, "call");
    }
    close_tag(o, "tools");
    return 0;
}

/* One message of the re-ordered list, with the tool name the matched call assigns to it. */
typedef struct kmsg {
    const json_t *m;
    const json_t *tool; /* override of "tool" (the matched call's name), or NULL */
} kmsg;

typedef struct callidx {
    char id[96];
    size_t pos;
    const json_t *name;
} callidx;

static int key_of(const json_t *v, char *buf, size_t cap)
{
    char tmp[64];
    const char *s;
    size_t n;
    if (!v || json_is_null(v) || tok_json_pystr(v, tmp, sizeof tmp, &s, &n))
        return -1;
    snprintf(buf, cap, "%.*s", (int)n, s);
    return 0;
}

/* normalize_xtml_tool_result_messages: each run of tool messages sorted into the order of the
 * latest assistant's tool_calls (matched by tool_call_id); a run with any unmatched id stays. */
static kmsg *reorder(const json_t *msgs, size_t *count)
{
    size_t n = json_array_size(msgs), ncalls = 0;
    kmsg *out = calloc(n + 1, sizeof *out);
    callidx *idx = NULL;
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!strcmp(role, "assistant")) {
            const json_t *calls = json_object_get(m, "tool_calls");
            free(idx);
            idx = NULL;
            ncalls = 0;
            if (json_is_array(calls) && json_array_size(calls)) {
                idx = calloc(json_array_size(calls), sizeof *idx);
                size_t k;
                json_t *tc;
                json_array_foreach(calls, k, tc)
                {
                    char key[96];
                    if (!idx || !json_is_object(tc) || key_of(json_object_get(tc, "id"), key, sizeof key))
                        continue;
                    int dup = 0;
                    for (size_t q = 0; q < ncalls; q++)
                        dup |= !strcmp(idx[q].id, key);
                    if (dup)
                        continue;
                    const json_t *fn = json_object_get(tc, "function");
                    snprintf(idx[ncalls].id, sizeof idx[ncalls].id, "%s", key);
                    idx[ncalls].pos = k + 1;
                    const json_t *nm = json_is_object(fn) ? json_object_get(fn, "name") : json_object_get(tc, "name");
                    idx[ncalls++].name = json_is_null(nm) ? NULL : nm; /* None: the message is left as it is */
                }
            }
        }
        if (strcmp(role, "tool")) {
            out[o++] = (kmsg){m, NULL};
            i++;
            continue;
        }
        size_t r0 = i, unresolved = 0;
        while (i < n && !strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "tool"))
            i++;
        size_t *pos = calloc(i - r0, sizeof *pos);
        const json_t **nm = calloc(i - r0, sizeof *nm);
        if (!pos || !nm) {
            free(pos);
            free(nm);
            free(out);
            free(idx);
            return NULL;
        }
        for (size_t k = r0; k < i; k++) {
            const json_t *tm = json_array_get(msgs, k), *cid = json_object_get(tm, "tool_call_id");
            char key[96];
            if (!json_object_get(tm, "tool_call_id"))
                cid = json_object_get(tm, "id");
            size_t q = ncalls;
            if (!key_of(cid, key, sizeof key))
                for (q = 0; q < ncalls && strcmp(idx[q].id, key); q++)
                    ;
            if (q == ncalls)
                unresolved = 1;
            else {
                pos[k - r0] = idx[q].pos;
                nm[k - r0] = idx[q].name;
            }
        }
        if (unresolved) {
            for (size_t k = r0; k < i; k++)
                out[o++] = (kmsg){json_array_get(msgs, k), NULL};
        } else {
            /* stable sort of the run by matched position (insertion sort: runs are short) */
            size_t len = i - r0, *ord = calloc(len, sizeof *ord);
            if (!ord) {
                free(pos);
                free(nm);
                free(out);
                free(idx);
                return NULL;
            }
            for (size_t k = 0; k < len; k++) {
                size_t q = k;
                while (q > 0 && pos[ord[q - 1]] > pos[k]) {
                    ord[q] = ord[q - 1];
                    q--;
                }
                ord[q] = k;
            }
            for (size_t k = 0; k < len; k++)
                out[o++] = (kmsg){json_array_get(msgs, r0 + ord[k]), nm[ord[k]] ? nm[ord[k]] : NULL};
            free(ord);
        }
        free(pos);
        free(nm);
    }
    free(idx);
    *count = o;
    return out;
}

static const char *effort_body(const char *e, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
             "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
             "Now the system is invoked with `thinking_effort=%s`.",
             e);
    return buf;
}

int tok_chat_k3(const tok *t, const tok_chat_req *r, const tok_chat_opts *opt, tok_segs *o, errbuf *err)
{
    (void)t;
    const char *effort = opt->thinking_effort ? opt->thinking_effort : "max";
    if (opt->thinking && strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max"))
        return errbuf_set(err, "thinking_effort '%s' is not one K3's encoder accepts (low, high, max)", effort);
    size_t n;
    kmsg *msgs = reorder(r->messages, &n);
    if (!msgs)
        return errbuf_set(err, "out of memory");
    int rc = -1;
    if (r->tools && json_array_size(r->tools) && tool_declare(o, r->tools, 0))
        goto out;
    if (opt->thinking) {
        char body[512];
        internal_system(o, "thinking-effort", effort_body(effort, body, sizeof body));
    }
    const json_t *calls = NULL;
    size_t tool_index = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = msgs[i].m, *name = json_object_get(m, "name");
        const char *role = json_string_value(json_object_get(m, "role"));
        size_t mi = i;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && !truthy(json_object_get(m, "tools")))) {
            attr a[2] = {{"role", NULL, role}, {"name", name, NULL}};
            if (open_tag(o, "message", a, truthy(name) ? 2 : 1, err) || content(o, json_object_get(m, "content"), err, mi))
                goto out;
            close_tag(o, "message");
            ctl(o, EOM);
        } else if (!strcmp(role, "system")) {
            if (tool_declare(o, json_object_get(m, "tools"), 1))
                goto out;
        } else if (!strcmp(role, "tool")) {
            tool_index++;
            const json_t *tn = msgs[i].tool;
            if (!tn)
                tn = json_object_get(m, "tool") ? json_object_get(m, "tool") : name;
            if ((!tn || json_is_null(tn)) && json_is_array(calls) && tool_index <= json_array_size(calls)) {
                const json_t *tc = json_array_get(calls, tool_index - 1), *fn = json_object_get(tc, "function");
                tn = json_object_get(fn ? fn : tc, "name");
            }
            if (!tn || json_is_null(tn)) {
                errbuf_set(err, "messages[%zu]: a Kimi K3 tool message needs a resolvable tool name (tool/name, "
                                "or a matching assistant tool_call)", mi);
                goto out;
            }
            char ib[24];
            snprintf(ib, sizeof ib, "%zu", tool_index);
            attr a[3] = {{"role", NULL, "tool"}, {"tool", tn, NULL}, {"index", NULL, ib}};
            if (open_tag(o, "message", a, 3, err) || content(o, json_object_get(m, "content"), err, mi))
                goto out;
            close_tag(o, "message");
            ctl(o, EOM);
        } else if (!strcmp(role, "assistant")) {
            calls = json_object_get(m, "tool_calls");
            tool_index = 0;
            attr a[2] = {{"role", NULL, "assistant"}, {"name", name, NULL}};
            if (open_tag(o, "message", a, truthy(name) ? 2 : 1, err) || assistant(o, m, opt->thinking, err, mi))
                goto out;
            close_tag(o, "message");
            ctl(o, EOM);
        }
    }
    const char *tc = json_string_value(r->tool_choice);
    if (tc && !strcmp(tc, "required"))
        internal_system(o, "tool-choice",
                        "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    else if (tc && !strcmp(tc, "none"))
        internal_system(o, "tool-choice",
                        "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next "
                        "message.");
    const json_t *rf = r->response_format;
    const char *rft = json_is_object(rf) ? json_string_value(json_object_get(rf, "type")) : json_string_value(rf);
    static const char RF_HEAD[] = "The system is invoked with `response_format=%s`.\nYour response must be raw JSON "
                                  "data without markdown code blocks (```json) or any additional formatting.";
    if (rft && !strcmp(rft, "json_object")) {
        char body[256];
        snprintf(body, sizeof body, RF_HEAD, "json_object");
        internal_system(o, "response-format", body);
    } else if (rft && !strcmp(rft, "json_schema")) {
        /* extract_response_schema: json_schema.schema, else json_schema.json_schema, else json_schema */
        const json_t *js = json_object_get(rf, "json_schema"), *schema = NULL;
        if (js && !json_is_null(js)) {
            schema = js;
            if (json_is_object(js))
                schema = json_object_get(js, "schema") ? json_object_get(js, "schema")
                         : json_object_get(js, "json_schema") ? json_object_get(js, "json_schema") : js;
        }
        tok_segs body = {0};
        char head[256];
        snprintf(head, sizeof head, RF_HEAD, "json_schema");
        tok_segs_str(&body, head, 0);
        tok_segs_str(&body, "\nThe JSON data must match the following schema:\n```json\n", 0);
        json_t *null = json_null();
        tok_json_dump(schema ? schema : null, 1, 1, &body, 0);
        json_decref(null);
        tok_segs_str(&body, "\n```", 0);
        if (body.bad)
            o->bad = 1;
        else
            internal_system(o, "response-format", body.text);
        tok_segs_free(&body);
    }
    if (opt->add_generation_prompt) {
        attr a[1] = {{"role", NULL, "assistant"}};
        open_tag(o, "message", a, 1, err);
        open_tag(o, opt->thinking ? "think" : "response", NULL, 0, err);
    }
    rc = 0;
out:
    free(msgs);
    return rc;
}
