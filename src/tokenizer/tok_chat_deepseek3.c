/* tok_chat_deepseek3.c — DeepSeek-V3's original chat format:
 *   <｜begin▁of▁sentence｜>{system contents joined by "\n\n"}
 *   user       <｜User｜>{content}
 *   assistant  <｜Assistant｜>{content}<｜end▁of▁sentence｜>, or with tool calls
 *              <｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n
 *              {arguments}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
 *   tool       <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{c}<｜tool▁output▁end｜> (later ones of a run
 *              prefixed "\n"), the run closed by <｜tool▁outputs▁end｜>
 *   gen prompt <｜Assistant｜>
 * No reference ids were available for this format; it follows the spec's description.
 */
#include <string.h>

#include "tokenizer/tok_int.h"

#define FW "\xEF\xBD\x9C" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define SP "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

static void mk(tok_segs *o, const char *s) { tok_segs_str(o, s, 1); }

static int text(tok_segs *o, const json_t *v, errbuf *err)
{
    char buf[64];
    const char *s;
    size_t n;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_array(v)) {
        size_t i;
        json_t *p;
        json_array_foreach(v, i, p) if (text(o, json_object_get(p, "text"), err)) return -1;
        return 0;
    }
    if (tok_json_pystr(v, buf, sizeof buf, &s, &n))
        return errbuf_set(err, "message content: expected a string");
    tok_segs_add(o, s, n, 0);
    return 0;
}

int tok_chat_deepseek3(const tok *t, const tok_chat_req *r, const tok_chat_opts *opt, tok_segs *o, errbuf *err)
{
    (void)t;
    const json_t *msgs = r->messages;
    size_t n = json_array_size(msgs), nsys = 0;
    mk(o, "<" FW "begin" SP "of" SP "sentence" FW ">");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (strcmp(json_string_value(json_object_get(m, "role")), "system"))
            continue;
        if (nsys++)
            mk(o, "\n\n");
        if (text(o, json_object_get(m, "content"), err))
            return -1;
    }
    int in_outputs = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (strcmp(role, "tool") && in_outputs) {
            mk(o, "<" FW "tool" SP "outputs" SP "end" FW ">");
            in_outputs = 0;
        }
        if (!strcmp(role, "user")) {
            mk(o, "<" FW "User" FW ">");
            if (text(o, json_object_get(m, "content"), err))
                return -1;
        } else if (!strcmp(role, "assistant")) {
            const json_t *calls = json_object_get(m, "tool_calls");
            mk(o, "<" FW "Assistant" FW ">");
            if (text(o, json_object_get(m, "content"), err))
                return -1;
            if (json_is_array(calls) && json_array_size(calls)) {
                mk(o, "<" FW "tool" SP "calls" SP "begin" FW ">");
                size_t k;
                json_t *c;
                json_array_foreach(calls, k, c)
                {
                    const json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
                    if (k)
                        mk(o, "\n");
                    mk(o, "<" FW "tool" SP "call" SP "begin" FW ">function<" FW "tool" SP "sep" FW ">");
                    if (text(o, json_object_get(fn, "name"), err))
                        return -1;
                    mk(o, "\n```json\n");
                    if (json_is_string(args)) {
                        text(o, args, err);
                    } else if (args) {
                        tok_segs js = {0};
                        tok_json_dump(args, 0, 0, &js, 0);
                        tok_segs_add(o, js.text, js.len, 0);
                        tok_segs_free(&js);
                    }
                    mk(o, "\n```<" FW "tool" SP "call" SP "end" FW ">");
                }
                mk(o, "<" FW "tool" SP "calls" SP "end" FW ">");
            }
            mk(o, "<" FW "end" SP "of" SP "sentence" FW ">");
        } else if (!strcmp(role, "tool")) {
            mk(o, in_outputs ? "\n" : "<" FW "tool" SP "outputs" SP "begin" FW ">");
            in_outputs = 1;
            mk(o, "<" FW "tool" SP "output" SP "begin" FW ">");
            if (text(o, json_object_get(m, "content"), err))
                return -1;
            mk(o, "<" FW "tool" SP "output" SP "end" FW ">");
        }
    }
    if (in_outputs)
        mk(o, "<" FW "tool" SP "outputs" SP "end" FW ">");
    if (opt->add_generation_prompt)
        mk(o, "<" FW "Assistant" FW ">");
    return 0;
}
