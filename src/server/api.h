/* api.h — the OpenAI wire format of `deltafin serve`: requests read and checked into api_req, and
 * the error objects every refusal answers with (docs/SERVER.md lists every field and refusal).
 *
 * api_req_parse is a pure function of the body bytes (the fuzz target tests/fuzz/fuzz_api.c drives
 * it): it accepts exactly the fields docs/SERVER.md lists, with their types and ranges, and refuses
 * any other field that would change the output with 400 naming it. It never reads the model; what
 * needs the tokenizer (the prompt's length) is checked by the caller.
 *
 * Invariants: after a successful parse every pointer in api_req points into r->body or r->chat (or
 * owned arrays), lives until api_req_free, and every number is within its documented range.
 */
#ifndef DF_SERVER_API_H
#define DF_SERVER_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum { API_MAX_STOP = 4, API_MAX_TOP_LOGPROBS = 20 };

/* One OpenAI error: {"error":{"message","type","param","code"}} with its HTTP status. */
typedef struct api_err {
    int status;        /* 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type;  /* "invalid_request_error", "rate_limit_error", "server_error", ... */
    const char *code;  /* NULL, or "context_length_exceeded", "model_not_found", ... */
    char param[64];    /* the field at fault, "" for none */
    char msg[512];
} api_err;

/* Fills e and returns -1, so callers can `return api_err_set(...)`. param may be NULL. */
int api_err_set(api_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The error object as JSON text (malloc'd, NUL-terminated), NULL when out of memory. */
char *api_err_json(const api_err *e);

/* API_LOGITS: serve --debug's POST /debug/logits {"tokens": [...]}, read as detokenize's body */
typedef enum api_kind { API_CHAT = 0, API_COMPLETION, API_TOKENIZE, API_DETOKENIZE, API_LOGITS } api_kind;

typedef struct api_req {
    api_kind kind;
    json_t *body;              /* the request as parsed; owned */
    json_t *chat;              /* chat and tokenize-messages: {messages, tools?, tool_choice?,
                                  response_format?} as the chat renderer takes it; owned */
    const char *prompt;        /* completion, tokenize: the text (into body), NULL with ids */
    size_t prompt_len;
    int32_t *ids;              /* completion, detokenize: a token-id prompt [n_ids]; owned */
    int n_ids;
    long max_tokens;           /* -1: not given */
    double temperature;        /* 0 .. 2 (default 1) */
    double top_p, min_p;       /* (0, 1] (default 1); [0, 1] (default 0) */
    long top_k;                /* 0 (off) .. */
    uint64_t seed;
    int has_seed;
    const char *stop[API_MAX_STOP]; /* into body */
    size_t stop_len[API_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int logprobs;              /* 1: return logprobs */
    int top_logprobs;          /* 0 .. API_MAX_TOP_LOGPROBS (completions: the logprobs integer) */
    int echo;                  /* completions: the prompt's text leads the returned text */
    int ignore_eos;            /* completions: generate max_tokens, through end-of-text ids (vLLM's) */
    int thinking;              /* chat: 1 (default) unless reasoning_effort "none" or
                                  chat_template_kwargs.thinking false */
    const char *effort;        /* chat: K3's thinking effort "low" | "high" | "max", NULL: default */
    int parallel_tool_calls;   /* 1 (default); 0: generation ends after the first tool call */
    int json_object;           /* response_format json_object: the model is told, not constrained */
    int add_special;           /* tokenize: special-token text becomes special ids */
    int with_pieces;           /* tokenize: each id's text too */
} api_req;

/* Reads and checks the body of a request of `kind`. model_id is the one model served: a request
 * naming another is 404 model_not_found. Returns 0, or -1 with e filled (r then holds nothing). */
int api_req_parse(api_kind kind, const char *body, size_t len, const char *model_id, api_req *r, api_err *e);
void api_req_free(api_req *r);

#endif
