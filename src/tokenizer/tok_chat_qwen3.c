/* tok_chat_qwen3.c — Qwen3's chat template (the hybrid-thinking one shipped in tokenizer_config.json),
 * rendered the way transformers' Jinja renders it:
 *   [tools] <|im_start|>system\n{first system content}\n\n(if any)# Tools ... <tools>\n{tool JSON}...
 *           </tools> ... </tool_call><|im_end|>\n          [else first system] <|im_start|>system\n{c}<|im_end|>\n
 *   user / later system   <|im_start|>{role}\n{content}<|im_end|>\n
 *   assistant             <|im_start|>assistant\n[<think>\n{reasoning}\n</think>\n\n]{content}[tool calls]<|im_end|>\n
 *     the think block only after the last real user query, and then only for the final message or
 *     one with reasoning; reasoning = reasoning_content, or the text before </think> in content
 *   tool results          grouped into one user turn: \n<tool_response>\n{c}\n</tool_response> each
 *   gen prompt            <|im_start|>assistant\n  (+ <think>\n\n</think>\n\n with thinking off)
 * JSON is HF's tojson: json.dumps(ensure_ascii=False), ", " and ": ", keys in request order.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

static void mk(tok_segs *o, const char *s) { tok_segs_str(o, s, 1); }
static void tx(tok_segs *o, const char *s, size_t n) { tok_segs_add(o, s, n, 0); }

/* message.content as a string (text parts joined; None -> ""). */
static int str_of(const json_t *c, tok_segs *buf, errbuf *err)
{
    char tmp[64];
    const char *s;
    size_t n;
    if (!c || json_is_null(c))
        return 0;
    if (json_is_array(c)) {
        size_t i;
        json_t *p;
        json_array_foreach(c, i, p) if (str_of(json_object_get(p, "text"), buf, err)) return -1;
        return 0;
    }
    if (tok_json_pystr(c, tmp, sizeof tmp, &s, &n))
        return errbuf_set(err, "message content: expected a string");
    tok_segs_add(buf, s, n, 0);
    return 0;
}

static const char *role_of(const json_t *m) { return json_string_value(json_object_get(m, "role")); }

static int starts(const char *s, size_t n, const char *p) { return n >= strlen(p) && !memcmp(s, p, strlen(p)); }
static int ends(const char *s, size_t n, const char *p)
{
    return n >= strlen(p) && !memcmp(s + n - strlen(p), p, strlen(p));
}

/* Finds the last occurrence of needle in s[0..n). */
static const char *rfind(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k))
            return s + i;
    return NULL;
}

int tok_chat_qwen3(const tok *t, const tok_chat_req *r, const tok_chat_opts *opt, tok_segs *o, errbuf *err)
{
    (void)t;
    const json_t *msgs = r->messages;
    size_t n = json_array_size(msgs);
    int first_system = n > 0 && !strcmp(role_of(json_array_get(msgs, 0)), "system");
    tok_segs c = {0}, rs = {0};
    int rc = -1;
    if (r->tools && json_array_size(r->tools)) {
        mk(o, "<|im_start|>system\n");
        if (first_system) {
            if (str_of(json_object_get(json_array_get(msgs, 0), "content"), &c, err))
                goto out;
            tx(o, c.text, c.len);
            mk(o, "\n\n");
        }
        mk(o, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
              "function signatures within <tools></tools> XML tags:\n<tools>");
        size_t i;
        json_t *tool;
        json_array_foreach(r->tools, i, tool)
        {
            tok_segs js = {0};
            mk(o, "\n");
            tok_json_dump(tool, 0, 0, &js, 0);
            tx(o, js.text, js.len);
            tok_segs_free(&js);
        }
        mk(o, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (first_system) {
        mk(o, "<|im_start|>system\n");
        if (str_of(json_object_get(json_array_get(msgs, 0), "content"), &c, err))
            goto out;
        tx(o, c.text, c.len);
        mk(o, "<|im_end|>\n");
    }
    /* the last user message that is not a wrapped tool response */
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0;) {
        const json_t *m = json_array_get(msgs, i);
        if (strcmp(role_of(m), "user"))
            continue;
        c.len = 0;
        if (str_of(json_object_get(m, "content"), &c, err))
            goto out;
        if (!(starts(c.text ? c.text : "", c.len, "<tool_response>") &&
              ends(c.text ? c.text : "", c.len, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = role_of(m);
        c.len = 0;
        c.n = 0;
        if (str_of(json_object_get(m, "content"), &c, err))
            goto out;
        const char *ct = c.text ? c.text : "";
        size_t cl = c.len;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i > 0)) {
            mk(o, "<|im_start|>");
            mk(o, role);
            mk(o, "\n");
            tx(o, ct, cl);
            mk(o, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            const json_t *rcj = json_object_get(m, "reasoning_content");
            const char *rt = "";
            size_t rl = 0;
            rs.len = 0;
            if (rcj && !json_is_null(rcj)) {
                if (str_of(rcj, &rs, err))
                    goto out;
                rt = rs.text ? rs.text : "";
                rl = rs.len;
            } else {
                const char *close = rfind(ct, cl, "</think>");
                if (close) {
                    /* content.split('</think>')[-1].lstrip('\n') and [0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                    const char *first = strstr(ct, "</think>");
                    rt = ct;
                    rl = (size_t)(first - ct);
                    while (rl && rt[rl - 1] == '\n')
                        rl--;
                    const char *open = rfind(rt, rl, "<think>");
                    if (open) {
                        rl -= (size_t)(open + 7 - rt);
                        rt = open + 7;
                    }
                    while (rl && *rt == '\n')
                        rt++, rl--;
                    size_t skip = (size_t)(close + 8 - ct);
                    ct += skip;
                    cl -= skip;
                    while (cl && *ct == '\n')
                        ct++, cl--;
                }
            }
            if (i > last_query && (i + 1 == n || rl)) {
                while (rl && *rt == '\n') /* reasoning_content.strip('\n') */
                    rt++, rl--;
                while (rl && rt[rl - 1] == '\n')
                    rl--;
                while (cl && *ct == '\n')
                    ct++, cl--;
                mk(o, "<|im_start|>assistant\n<think>\n");
                tx(o, rt, rl);
                mk(o, "\n</think>\n\n");
                tx(o, ct, cl);
            } else {
                mk(o, "<|im_start|>assistant\n");
                tx(o, ct, cl);
            }
            const json_t *calls = json_object_get(m, "tool_calls");
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call)
            {
                if ((k == 0 && cl) || k > 0)
                    mk(o, "\n");
                const json_t *fn = json_object_get(call, "function");
                if (fn)
                    call = (json_t *)fn;
                const json_t *name = json_object_get(call, "name"), *args = json_object_get(call, "arguments");
                mk(o, "<tool_call>\n{\"name\": \"");
                if (json_is_string(name))
                    tx(o, json_string_value(name), json_string_length(name));
                mk(o, "\", \"arguments\": ");
                if (json_is_string(args)) {
                    tx(o, json_string_value(args), json_string_length(args));
                } else {
                    tok_segs js = {0};
                    json_t *null = json_null();
                    tok_json_dump(args ? args : null, 0, 0, &js, 0);
                    json_decref(null);
                    tx(o, js.text, js.len);
                    tok_segs_free(&js);
                }
                mk(o, "}\n</tool_call>");
            }
            mk(o, "<|im_end|>\n");
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(role_of(json_array_get(msgs, i - 1)), "tool"))
                mk(o, "<|im_start|>user");
            mk(o, "\n<tool_response>\n");
            tx(o, ct, cl);
            mk(o, "\n</tool_response>");
            if (i + 1 == n || strcmp(role_of(json_array_get(msgs, i + 1)), "tool"))
                mk(o, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt) {
        mk(o, "<|im_start|>assistant\n");
        if (!opt->thinking)
            mk(o, "<think>\n\n</think>\n\n");
    }
    rc = 0;
out:
    tok_segs_free(&c);
    tok_segs_free(&rs);
    return rc;
}
