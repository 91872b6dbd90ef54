/* tok_chat_kimi2.c — Kimi K2 / K2-Thinking / Kimi-Linear chat: <|im_…|> turns, no newlines, no BOS.
 *
 *   [tools]   <|im_system|>tool_declare<|im_middle|>{tools: deep-sorted, compact JSON}<|im_end|>
 *   [first message not system]
 *             <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
 *   turn      <|im_{user|assistant|system}|>{name or role}<|im_middle|>{body}<|im_end|>
 *             (tool results use <|im_system|>; their body is "## Return of {call id}\n{content}")
 *   assistant body: [K2-Thinking: <think></think> for turns up to the last assistant turn without
 *             tool calls, <think>{reasoning_content}</think> after it] {content}
 *             [<|tool_calls_section_begin|>{<|tool_call_begin|>{id}<|tool_call_argument_begin|>
 *             {arguments}<|tool_call_end|>}*<|tool_calls_section_end|>]
 *   gen prompt <|im_assistant|>assistant<|im_middle|>
 * Tool call ids are the calls' own ids, else functions.{name}:{n} (n counts calls without an id);
 * tool results take the ids of the calls in order. This follows the K2-Thinking chat template
 * (K2-Instruct's is the same without the think tags). The tools JSON is written compact (no
 * spaces after separators); no reference ids for K2 were available to check it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

static void mk(tok_segs *o, const char *s) { tok_segs_str(o, s, 1); }
static void tx(tok_segs *o, const char *s, size_t n) { tok_segs_add(o, s, n, 0); }

static int text_of(tok_segs *o, const json_t *v, errbuf *err)
{
    char buf[64];
    const char *s;
    size_t n;
    if (!v || json_is_null(v))
        return 0;
    if (tok_json_pystr(v, buf, sizeof buf, &s, &n))
        return errbuf_set(err, "expected a string, got a JSON %s", json_is_object(v) ? "object" : "array");
    tx(o, s, n);
    return 0;
}

/* render_content: a string, or parts (images as the media marker text). */
static int content(tok_segs *o, const json_t *c, errbuf *err)
{
    if (!json_is_array(c))
        return text_of(o, c, err);
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p)
    {
        const char *type = json_string_value(json_object_get(p, "type"));
        if ((type && !strcmp(type, "image")) || json_object_get(p, "image") || json_object_get(p, "image_url"))
            mk(o, "<|media_start|>image<|media_content|><|media_pad|><|media_end|>");
        else if (text_of(o, json_object_get(p, "text"), err))
            return -1;
    }
    return 0;
}

static int truthy_str(const json_t *v) { return json_is_string(v) && json_string_length(v) > 0; }

int tok_chat_kimi2(const tok *t, const tok_chat_req *r, const tok_chat_opts *opt, tok_segs *o, errbuf *err)
{
    const json_t *msgs = r->messages;
    size_t n = json_array_size(msgs), nq = 0, qhead = 0, counter = 0;
    char **queue = NULL;
    int rc = -1;
    if (r->tools && json_array_size(r->tools)) {
        mk(o, "<|im_system|>tool_declare<|im_middle|>");
        tok_segs js = {0};
        if (tok_json_dump(r->tools, 1, 1, &js, 0)) {
            tok_segs_free(&js);
            return errbuf_set(err, "out of memory");
        }
        tx(o, js.text, js.len);
        tok_segs_free(&js);
        mk(o, "<|im_end|>");
    }
    if (n == 0 || strcmp(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system"))
        mk(o, "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>");
    long last_plain = -1; /* last assistant message without tool calls */
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i), *tc = json_object_get(m, "tool_calls");
        if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant") &&
            !(json_is_array(tc) && json_array_size(tc)))
            last_plain = (long)i;
    }
    queue = calloc(1, sizeof *queue);
    for (size_t i = 0; i < n && queue; i++) {
        const json_t *m = json_array_get(msgs, i), *name = json_object_get(m, "name");
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *opener = !strcmp(role, "user") ? "<|im_user|>" : !strcmp(role, "assistant") ? "<|im_assistant|>"
                                                                                                  : "<|im_system|>";
        mk(o, opener);
        if (truthy_str(name))
            tx(o, json_string_value(name), json_string_length(name));
        else
            tx(o, role, strlen(role));
        mk(o, "<|im_middle|>");
        if (!strcmp(role, "assistant")) {
            if (t->kimi2_think && (long)i <= last_plain) {
                mk(o, "<think></think>");
            } else if (t->kimi2_think) {
                mk(o, "<think>");
                if (text_of(o, json_object_get(m, "reasoning_content"), err))
                    goto out;
                mk(o, "</think>");
            }
            if (content(o, json_object_get(m, "content"), err))
                goto out;
            const json_t *calls = json_object_get(m, "tool_calls");
            if (json_is_array(calls) && json_array_size(calls)) {
                mk(o, "<|tool_calls_section_begin|>");
                size_t k;
                json_t *call;
                json_array_foreach(calls, k, call)
                {
                    const json_t *fn = json_object_get(call, "function"), *id = json_object_get(call, "id"),
                                 *args = json_object_get(fn, "arguments");
                    char buf[256];
                    if (json_is_string(id)) {
                        snprintf(buf, sizeof buf, "%s", json_string_value(id));
                    } else {
                        const char *fname = json_string_value(json_object_get(fn, "name"));
                        snprintf(buf, sizeof buf, "functions.%s:%zu", fname ? fname : "", counter++);
                    }
                    char **nqv = realloc(queue, (nq + 1) * sizeof *queue);
                    if (!nqv || !(nqv[nq] = strdup(buf))) {
                        if (nqv)
                            queue = nqv;
                        errbuf_set(err, "out of memory");
                        goto out;
                    }
                    queue = nqv;
                    nq++;
                    mk(o, "<|tool_call_begin|>");
                    tx(o, buf, strlen(buf));
                    mk(o, "<|tool_call_argument_begin|>");
                    if (json_is_string(args)) {
                        tx(o, json_string_value(args), json_string_length(args));
                    } else if (args) {
                        tok_segs js = {0};
                        tok_json_dump(args, 0, 0, &js, 0);
                        tx(o, js.text, js.len);
                        tok_segs_free(&js);
                    }
                    mk(o, "<|tool_call_end|>");
                }
                mk(o, "<|tool_calls_section_end|>");
            }
        } else if (!strcmp(role, "tool")) {
            char buf[320];
            if (qhead < nq) {
                snprintf(buf, sizeof buf, "## Return of %s\n", queue[qhead++]);
            } else {
                const char *nm = json_string_value(name);
                snprintf(buf, sizeof buf, "## Return of functions.%s:%zu\n", nm ? nm : "unknown", counter);
            }
            tx(o, buf, strlen(buf));
            if (content(o, json_object_get(m, "content"), err))
                goto out;
        } else if (content(o, json_object_get(m, "content"), err)) {
            goto out;
        }
        mk(o, "<|im_end|>");
    }
    if (!queue) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    if (opt->add_generation_prompt)
        mk(o, "<|im_assistant|>assistant<|im_middle|>");
    rc = 0;
out:
    for (size_t i = 0; i < nq; i++)
        free(queue[i]);
    free(queue);
    return rc;
}
