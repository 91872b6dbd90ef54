/* api.c — reading and checking OpenAI requests (api.h). Each request kind has a table of the
 * fields it accepts; a field outside it is refused by name, so nothing that would change the
 * output is ever silently ignored. A JSON null counts as an absent field (clients send them).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

/* s made valid UTF-8 in place: a byte that begins no whole sequence (a URL's raw bytes, a code point
 * cut by truncation) becomes '?', so that an error can always be written as JSON */
static void utf8_fix(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p;) {
        int n = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 && *p >= 0xc2 ? 2 : (*p & 0xf0) == 0xe0 ? 3
              : (*p & 0xf8) == 0xf0 && *p <= 0xf4 ? 4 : 0;
        int ok = n > 0;
        for (int k = 1; ok && k < n; k++)
            ok = (p[k] & 0xc0) == 0x80;
        if (ok && n == 3) /* no overlongs, no surrogates */
            ok = !(p[0] == 0xe0 && p[1] < 0xa0) && !(p[0] == 0xed && p[1] >= 0xa0);
        if (ok && n == 4)
            ok = !(p[0] == 0xf0 && p[1] < 0x90) && !(p[0] == 0xf4 && p[1] >= 0x90);
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

int api_err_set(api_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    utf8_fix(e->msg);
    utf8_fix(e->param);
    return -1;
}

char *api_err_json(const api_err *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type", e->type ? e->type : "server_error",
                          "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

#define BAD(param, ...) api_err_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* a field's value, NULL when absent or null */
static const json_t *field(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* every key of o is one of names (NULL-terminated), else 400 naming the first that is not */
static int known_fields(const json_t *o, const char *const *names, const char *what, api_err *e)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        int ok = 0;
        for (int i = 0; names[i] && !ok; i++)
            ok = !strcmp(k, names[i]);
        if (!ok)
            return BAD(k, "unsupported field '%s' in %s: it is not one this server honours (docs/SERVER.md)", k, what);
    }
    return 0;
}

static int get_num(const json_t *o, const char *key, double lo, double hi, double *out, api_err *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return BAD(key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return BAD(key, "'%s' must be between %g and %g, got %g", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_int(const json_t *o, const char *key, long lo, long hi, long *out, api_err *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return BAD(key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(key, "'%s' must be between %ld and %ld, got %lld", key, lo, hi, (long long)x);
    *out = (long)x;
    return 0;
}

static int get_bool(const json_t *o, const char *key, int *out, api_err *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return BAD(key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* fields that change nothing unless given a value other than their neutral one */
static int neutral_only(const json_t *o, api_err *e)
{
    static const char *const pens[] = {"presence_penalty", "frequency_penalty", "repetition_penalty"};
    for (int i = 0; i < 3; i++) {
        const json_t *v = field(o, pens[i]);
        if (v && (!json_is_number(v) || json_number_value(v) != (i == 2 ? 1.0 : 0.0)))
            return BAD(pens[i], "'%s' is not supported (only its neutral value %s): the output would differ", pens[i],
                       i == 2 ? "1" : "0");
    }
    const json_t *lb = field(o, "logit_bias");
    if (lb && (!json_is_object(lb) || json_object_size(lb) != 0))
        return BAD("logit_bias", "'logit_bias' is not supported (only an empty object)");
    static const char *const ones[] = {"n", "best_of"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = field(o, ones[i]);
        if (v && (!json_is_integer(v) || json_integer_value(v) != 1))
            return BAD(ones[i], "'%s' must be 1: one choice per request", ones[i]);
    }
    return 0;
}

static int get_stop(const json_t *o, api_req *r, api_err *e)
{
    const json_t *v = field(o, "stop");
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return BAD("stop", "'stop' must not be empty");
        r->stop[0] = json_string_value(v);
        r->stop_len[0] = json_string_length(v);
        r->n_stop = 1;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > API_MAX_STOP)
        return BAD("stop", "'stop' must be a string or an array of up to %d strings", API_MAX_STOP);
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s) || json_string_length(s) == 0)
            return BAD("stop", "stop[%zu] must be a non-empty string", i);
        r->stop[r->n_stop] = json_string_value(s);
        r->stop_len[r->n_stop++] = json_string_length(s);
    }
    return 0;
}

/* sampling, length, stop, streaming: what chat and completions share */
static int get_common(const json_t *o, api_req *r, api_err *e)
{
    if (neutral_only(o, e) || get_num(o, "temperature", 0.0, 2.0, &r->temperature, e) ||
        get_num(o, "top_p", 1e-9, 1.0, &r->top_p, e) || get_num(o, "min_p", 0.0, 1.0, &r->min_p, e) ||
        get_int(o, "top_k", 0, 1L << 30, &r->top_k, e) || get_stop(o, r, e) || get_bool(o, "stream", &r->stream, e))
        return -1;
    const json_t *seed = field(o, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return BAD("seed", "'seed' must be an integer");
        r->seed = (uint64_t)json_integer_value(seed);
        r->has_seed = 1;
    }
    const json_t *so = field(o, "stream_options");
    if (so) {
        static const char *const names[] = {"include_usage", "continuous_usage_stats", NULL};
        if (!json_is_object(so))
            return BAD("stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return BAD("stream_options", "'stream_options' is only allowed with stream: true");
        if (known_fields(so, names, "stream_options", e) || get_bool(so, "include_usage", &r->include_usage, e))
            return -1;
        int cont = 0;
        if (get_bool(so, "continuous_usage_stats", &cont, e))
            return -1;
        if (cont)
            return BAD("stream_options", "'stream_options.continuous_usage_stats' is not supported");
    }
    return 0;
}

static int check_model(const json_t *o, const char *model_id, api_err *e)
{
    const json_t *m = field(o, "model");
    if (!m)
        return 0;
    if (!json_is_string(m))
        return BAD("model", "'model' must be a string");
    if (model_id && strcmp(json_string_value(m), model_id) != 0)
        return api_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                           "The model '%s' does not exist: this server serves '%s'", json_string_value(m), model_id);
    return 0;
}

/* a message's content: a string, null, or text parts (joined with newlines) */
static int norm_content(const json_t *c, size_t mi, json_t **out, api_err *e)
{
    char where[48];
    snprintf(where, sizeof where, "messages[%zu].content", mi);
    *out = NULL;
    if (!c || json_is_null(c) || json_is_string(c)) {
        *out = c ? json_deep_copy(c) : json_null();
        return 0;
    }
    if (!json_is_array(c))
        return BAD(where, "%s must be a string or an array of text parts", where);
    size_t total = 0, i;
    const json_t *p;
    json_array_foreach(c, i, p)
    {
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !type)
            return BAD(where, "%s[%zu] must be an object with a 'type'", where, i);
        if (strcmp(type, "text") != 0)
            return BAD(where, "%s[%zu]: content of type '%s' is not supported (text only)", where, i, type);
        if (!json_is_string(json_object_get(p, "text")))
            return BAD(where, "%s[%zu]: a text part needs 'text' (a string)", where, i);
        total += json_string_length(json_object_get(p, "text")) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(c, i, p)
    {
        const json_t *t = json_object_get(p, "text");
        if (i)
            buf[at++] = '\n';
        memcpy(buf + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    *out = json_stringn_nocheck(buf, at);
    free(buf);
    return *out ? 0 : api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* messages -> the renderer's copy: roles checked (developer is system), content made a string or
 * null, the keys it renders kept */
static int norm_messages(const json_t *msgs, json_t *chat, api_err *e)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return BAD("messages", "'messages' must be a non-empty array");
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "messages", out))
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    static const char *const keep[] = {"name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning", NULL};
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m)
    {
        char where[40];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!json_is_object(m))
            return BAD(where, "%s must be an object", where);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role)
            return BAD(where, "%s needs a 'role' (a string)", where);
        if (!strcmp(role, "developer"))
            role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
            return BAD(where, "%s: role '%s' is not one of system, developer, user, assistant, tool", where, role);
        const json_t *calls = field(m, "tool_calls");
        if (calls && (strcmp(role, "assistant") || !json_is_array(calls)))
            return BAD(where, "%s: 'tool_calls' must be an array, on an assistant message", where);
        json_t *c = NULL;
        if (norm_content(json_object_get(m, "content"), i, &c, e))
            return -1;
        json_t *nm = json_pack("{s:s, s:o}", "role", role, "content", c);
        if (!nm || json_array_append_new(out, nm))
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        for (int k = 0; keep[k]; k++) {
            const json_t *v = field(m, keep[k]);
            if (v && json_object_set_new(nm, keep[k], json_deep_copy(v)))
                return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    return 0;
}

static int check_tools(const json_t *o, json_t *chat, api_req *r, api_err *e)
{
    const json_t *tools = field(o, "tools"), *choice = field(o, "tool_choice");
    if (tools) {
        if (!json_is_array(tools))
            return BAD("tools", "'tools' must be an array");
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t)
        {
            const json_t *fn = json_object_get(t, "function");
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn) ||
                !json_is_string(json_object_get(fn, "name")))
                return BAD("tools", "tools[%zu] must be {\"type\":\"function\",\"function\":{\"name\":...}}", i);
            const json_t *params = field(fn, "parameters");
            if (params && !json_is_object(params))
                return BAD("tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        }
    }
    if (choice) {
        const char *s = json_string_value(choice);
        if (s && strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required"))
            return BAD("tool_choice", "'tool_choice' must be none, auto, required or a function");
        if (!s) {
            const char *type = json_string_value(json_object_get(choice, "type"));
            const char *name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
            if (!type || strcmp(type, "function") || !name)
                return BAD("tool_choice", "'tool_choice' must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}");
            int found = 0;
            size_t i;
            const json_t *t;
            json_array_foreach(tools, i, t) found |= !strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name);
            if (!found)
                return BAD("tool_choice", "'tool_choice' names '%s', which is not in 'tools'", name);
        }
        if (!tools && !(s && !strcmp(s, "none")))
            return BAD("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (get_bool(o, "parallel_tool_calls", &r->parallel_tool_calls, e))
        return -1;
    /* tool_choice none: the tools are not shown to the model at all */
    if (tools && !(choice && json_is_string(choice) && !strcmp(json_string_value(choice), "none"))) {
        if (json_object_set_new(chat, "tools", json_deep_copy(tools)) ||
            (choice && json_object_set_new(chat, "tool_choice", json_deep_copy(choice))))
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

static int check_reasoning(const json_t *o, api_req *r, api_err *e)
{
    const json_t *re = field(o, "reasoning_effort");
    if (re) {
        const char *s = json_string_value(re);
        if (!s)
            return BAD("reasoning_effort", "'reasoning_effort' must be a string");
        if (!strcmp(s, "none"))
            r->thinking = 0;
        else if (!strcmp(s, "minimal") || !strcmp(s, "low"))
            r->effort = "low";
        else if (!strcmp(s, "medium") || !strcmp(s, "high"))
            r->effort = "high";
        else if (!strcmp(s, "max") || !strcmp(s, "xhigh"))
            r->effort = "max";
        else
            return BAD("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium, high or max, got '%s'", s);
    }
    const json_t *kw = field(o, "chat_template_kwargs");
    if (kw) {
        static const char *const names[] = {"thinking", "enable_thinking", NULL};
        if (!json_is_object(kw))
            return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (known_fields(kw, names, "chat_template_kwargs", e) || get_bool(kw, "thinking", &r->thinking, e) ||
            get_bool(kw, "enable_thinking", &r->thinking, e))
            return -1;
    }
    return 0;
}

static int parse_chat(const json_t *o, api_req *r, api_err *e)
{
    static const char *const names[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
        "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "reasoning_effort", "chat_template_kwargs", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "user", "store", "metadata", NULL};
    if (known_fields(o, names, "a chat completion request", e) || get_common(o, r, e))
        return -1;
    long mt = -1, mct = -1;
    if (get_int(o, "max_tokens", 0, 1L << 40, &mt, e) || get_int(o, "max_completion_tokens", 0, 1L << 40, &mct, e))
        return -1;
    if (mt >= 0 && mct >= 0)
        return BAD("max_tokens", "give one of 'max_tokens' and 'max_completion_tokens', not both");
    r->max_tokens = mct >= 0 ? mct : mt;
    long top = 0;
    if (get_bool(o, "logprobs", &r->logprobs, e) || get_int(o, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &top, e))
        return -1;
    if (field(o, "top_logprobs") && !r->logprobs)
        return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = (int)top;
    if (!(r->chat = json_object()))
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (norm_messages(json_object_get(o, "messages"), r->chat, e) || check_tools(o, r->chat, r, e) ||
        check_reasoning(o, r, e))
        return -1;
    const json_t *rf = field(o, "response_format");
    if (rf) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type || (strcmp(type, "text") && strcmp(type, "json_object")))
            return BAD("response_format", "'response_format' must be {\"type\":\"text\"} or {\"type\":\"json_object\"}%s",
                       type && !strcmp(type, "json_schema") ? " (json_schema is not supported)" : "");
        r->json_object = !strcmp(type, "json_object");
        if (json_object_set_new(r->chat, "response_format", json_deep_copy(rf)))
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* ids of a JSON array into r->ids; 400 naming `param` when one is not a token id */
static int get_ids(const json_t *a, const char *param, api_req *r, api_err *e)
{
    size_t n = json_array_size(a), i;
    if (n == 0)
        return BAD(param, "'%s' must not be empty", param);
    if (n > (1u << 24))
        return BAD(param, "'%s' has too many tokens", param);
    if (!(r->ids = malloc(sizeof(int32_t) * n)))
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    const json_t *v;
    json_array_foreach(a, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return BAD(param, "%s[%zu] must be a token id (a non-negative integer)", param, i);
        r->ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_ids = (int)n;
    return 0;
}

static int parse_completion(const json_t *o, api_req *r, api_err *e)
{
    static const char *const names[] = {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "best_of",
        "stream", "stream_options", "logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "logit_bias", "user", "ignore_eos", NULL};
    if (known_fields(o, names, "a completion request", e) || get_common(o, r, e))
        return -1;
    r->max_tokens = 16; /* the legacy endpoint's default */
    long top = -1;
    if (get_int(o, "max_tokens", 0, 1L << 40, &r->max_tokens, e) ||
        get_int(o, "logprobs", 0, API_MAX_TOP_LOGPROBS, &top, e) || get_bool(o, "echo", &r->echo, e) ||
        get_bool(o, "ignore_eos", &r->ignore_eos, e))
        return -1;
    r->logprobs = top >= 0;
    r->top_logprobs = top > 0 ? (int)top : 0;
    if (r->echo && r->logprobs)
        return BAD("echo", "'echo' with 'logprobs' is not supported (the prompt's logprobs are not computed)");
    const json_t *sfx = field(o, "suffix");
    if (sfx && (!json_is_string(sfx) || json_string_length(sfx) > 0))
        return BAD("suffix", "'suffix' is not supported: this model does not insert");
    const json_t *p = field(o, "prompt");
    if (!p)
        return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] or [[ids]]: one prompt */
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return 0;
    }
    if (json_is_array(p) && json_is_integer(json_array_get(p, 0)))
        return get_ids(p, "prompt", r, e);
    return BAD("prompt", "'prompt' must be a string, an array of token ids, or one of those in an array of one");
}

static int parse_tokenize(const json_t *o, api_req *r, api_err *e)
{
    static const char *const names[] = {"model", "content", "prompt", "messages", "add_special", "with_pieces",
                                        "reasoning_effort", "chat_template_kwargs", "tools", "tool_choice", NULL};
    if (known_fields(o, names, "a tokenize request", e) || get_bool(o, "add_special", &r->add_special, e) ||
        get_bool(o, "with_pieces", &r->with_pieces, e))
        return -1;
    const json_t *c = field(o, "content") ? field(o, "content") : field(o, "prompt");
    if (field(o, "messages")) {
        if (c)
            return BAD("messages", "give 'content' or 'messages', not both");
        if (!(r->chat = json_object()))
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return norm_messages(field(o, "messages"), r->chat, e) || check_tools(o, r->chat, r, e) ||
                       check_reasoning(o, r, e)
                   ? -1
                   : 0;
    }
    if (!json_is_string(c))
        return BAD("content", "'content' (a string) or 'messages' is required");
    r->prompt = json_string_value(c);
    r->prompt_len = json_string_length(c);
    return 0;
}

static int parse_detokenize(const json_t *o, api_req *r, api_err *e)
{
    static const char *const names[] = {"model", "tokens", NULL};
    if (known_fields(o, names, "a detokenize request", e))
        return -1;
    const json_t *t = field(o, "tokens");
    if (!json_is_array(t))
        return BAD("tokens", "'tokens' (an array of token ids) is required");
    return json_array_size(t) == 0 ? 0 : get_ids(t, "tokens", r, e);
}

int api_req_parse(api_kind kind, const char *body, size_t len, const char *model_id, api_req *r, api_err *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->thinking = 1;
    r->parallel_tool_calls = 1;
    json_error_t je;
    r->body = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->body) {
        api_err_set(e, 400, "invalid_request_error", NULL, NULL, "the body is not valid JSON: %s at line %d, column %d",
                    je.text, je.line, je.column);
        goto fail;
    }
    if (!json_is_object(r->body)) {
        BAD(NULL, "the body must be a JSON object");
        goto fail;
    }
    if (check_model(r->body, model_id, e))
        goto fail;
    static int (*const parse[])(const json_t *, api_req *, api_err *) = {
        [API_CHAT] = parse_chat, [API_COMPLETION] = parse_completion, [API_TOKENIZE] = parse_tokenize,
        [API_DETOKENIZE] = parse_detokenize, [API_LOGITS] = parse_detokenize};
    if (parse[kind](r->body, r, e) == 0)
        return 0;
fail:
    api_req_free(r);
    return -1;
}

void api_req_free(api_req *r)
{
    json_decref(r->body);
    json_decref(r->chat);
    free(r->ids);
    memset(r, 0, sizeof *r);
}
