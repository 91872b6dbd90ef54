/* tok.h — text <-> token ids and chat messages -> prompt ids, for every model family Deltafin runs.
 *
 * Usage:
 *     tok *t;  errbuf err;
 *     if (tok_load(&t, "models/k3", &err)) die(err.msg);        // tiktoken.model or tokenizer.json
 *     tok_ids ids = {0};
 *     tok_encode(t, text, len, TOK_SPECIAL_NONE, &ids, &err);    // user text: never special ids
 *     tok_encode_parallel(t, text, len, TOK_SPECIAL_NONE, pool, &ids, &err);   // same ids, all cores
 *
 *     tok_chat_opts o;  tok_chat_opts_init(&o);                  // thinking on, effort per format
 *     o.thinking = 0;                                            // --no-thinking
 *     tok_chat_encode(t, messages_or_request_json, &o, &ids, &err);   // ends with the gen prompt
 *
 *     tok_stream s;  tok_stream_init(&s, t, 0, &err);            // reserves everything up front
 *     for each generated id:
 *         size_t n; const char *txt = tok_stream_feed(&s, id, &n);   // complete UTF-8 only
 *         fwrite(txt, 1, n, stdout);
 *         if (tok_is_stop(t, id)) break;
 *     txt = tok_stream_flush(&s, &n);                            // a dangling partial code point -> U+FFFD
 *     tok_stream_free(&s); tok_ids_free(&ids); tok_free(t);
 *
 * Invariants: a loaded tok is immutable, so any number of threads may encode and decode with it
 * at once. Ids are int32 in [0, tok_vocab_size). Encoding is byte-exact with the reference library
 * of the folder's format (tiktoken + tokenization_kimi.py, HF tokenizers) on valid UTF-8; invalid
 * UTF-8 never fails and its bytes survive a round trip (they are tokenized as single bytes).
 * Errors are one line naming the file and line or field (see base/err.h).
 */
#ifndef DF_TOKENIZER_TOK_H
#define DF_TOKENIZER_TOK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/pool.h"

typedef struct tok tok;

/* A growable list of ids: zero-initialize, free with tok_ids_free. Encoders append to it, so to
 * reuse one for a new text set ids.n = 0 first (the capacity is kept). */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
void tok_ids_free(tok_ids *ids);
int tok_ids_push(tok_ids *ids, int32_t id); /* 0 or -1 (out of memory) */

/* What happens to special-token strings ("<|im_end|>", added tokens) inside text:
 * NONE: they are ordinary text (the safe choice for anything a user wrote);
 * ALL: every special / added token string becomes its id (leftmost, longest first);
 * DEFAULT: what the format's reference library does by default — NONE for tiktoken files
 *          (tiktoken encode(disallowed_special=())), ALL for tokenizer.json (HF Tokenizer.encode). */
typedef enum tok_special { TOK_SPECIAL_DEFAULT = 0, TOK_SPECIAL_NONE, TOK_SPECIAL_ALL } tok_special;

/* The chat format of a model folder (decided from config.json model_type and
 * tokenizer_config.json / chat_template.jinja). */
typedef enum tok_chat_format {
    TOK_CHAT_NONE = 0, /* plain tokenizer (e.g. a bare tiktoken encoding): no chat */
    TOK_CHAT_K3,       /* Kimi K3 XTML, as Moonshot's encoding_k3.py renders it */
    TOK_CHAT_KIMI2,    /* Kimi K2 / Kimi-Linear <|im_user|>...<|im_middle|>...<|im_end|> */
    TOK_CHAT_QWEN3,    /* Qwen3 ChatML with <think> (enable_thinking) */
    TOK_CHAT_DEEPSEEK3 /* DeepSeek-V3 <｜User｜>/<｜Assistant｜> */
} tok_chat_format;

/* Loads the tokenizer of a model folder: tiktoken.model (+ tokenizer_config.json for Kimi's
 * special ids, or tiktoken_config.json for a plain encoding's pat_str and specials), or
 * tokenizer.json (HF byte-level BPE). The folder's chat format is detected too. */
int tok_load(tok **out, const char *model_dir, errbuf *err);
void tok_free(tok *t);

int tok_vocab_size(const tok *t);      /* one past the largest id */
tok_chat_format tok_chat_format_of(const tok *t);
const char *tok_chat_format_name(tok_chat_format f);
/* Id of an exact token string (a special name such as "<|im_end|>", or mergeable bytes);
 * -1 if there is none. */
int32_t tok_token_id(const tok *t, const char *s, size_t len);
/* Raw bytes of a token (a special's bytes are its UTF-8 name); NULL for an unused id. */
const uint8_t *tok_token_bytes(const tok *t, int32_t id, size_t *len);
int tok_is_special(const tok *t, int32_t id);

/* Encodes text (any bytes) and appends the ids. */
int tok_encode(const tok *t, const char *text, size_t len, tok_special sp, tok_ids *out, errbuf *err);
/* How much of text no appended text can re-tokenize: *stable gets the length of the longest prefix
 * that ends at a pre-token piece boundary before the last piece and at least TOK_STABLE_MARGIN bytes
 * before the end (a pattern match looks past its end by at most a contraction such as 're and one
 * character of lookahead), so tok_encode of text + anything begins with the tokens of that prefix.
 * Plain text (no special tokens). 0 where it cannot be shown: a normalizer that changes the text,
 * or text long enough for Kimi's slicing. Returns 0 or -1 (a regex engine error, in err). */
enum { TOK_STABLE_MARGIN = 8 };
int tok_stable_len(const tok *t, const char *text, size_t len, size_t *stable, errbuf *err);
/* The same ids, computed on all threads of `p` (NULL or one thread: serial). The text is cut only
 * where the pre-tokenizer provably restarts, so the result is identical to tok_encode. */
int tok_encode_parallel(const tok *t, const char *text, size_t len, tok_special sp, pool *p, tok_ids *out,
                        errbuf *err);

/* Decodes ids to UTF-8 (malloc'd, NUL-terminated; *len excludes the NUL). Invalid UTF-8 from the
 * token bytes becomes U+FFFD per maximal subpart, as Python's bytes.decode(errors="replace").
 * skip_special drops special / added tokens. Unknown ids are an error. */
int tok_decode(const tok *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len,
               errbuf *err);

/* Streaming detokenizer: text comes out as soon as it is complete UTF-8; a partial code point is
 * held back until the next id completes it (or proves it invalid: U+FFFD). tok_stream_init
 * reserves every buffer, so feed and flush never allocate. The returned text lives until the
 * next feed/flush. An unknown id yields no text. */
typedef struct tok_stream {
    const tok *t; /* borrowed; outlives the stream */
    int skip_special;
    uint8_t pend[4]; /* bytes of an incomplete code point */
    int npend;
    uint8_t *in;  /* [incap] pending + token bytes */
    char *out;    /* [outcap] */
    size_t incap, outcap;
} tok_stream;
int tok_stream_init(tok_stream *s, const tok *t, int skip_special, errbuf *err);
const char *tok_stream_feed(tok_stream *s, int32_t id, size_t *len);
const char *tok_stream_flush(tok_stream *s, size_t *len);
void tok_stream_free(tok_stream *s);

/* Stop ids of the chat format (end of message first, then end of text / eos of config.json). */
int tok_stop_ids(const tok *t, const int32_t **ids);
int tok_is_stop(const tok *t, int32_t id);
int32_t tok_eom_id(const tok *t); /* end of a message (K3 <|end_of_msg|>, <|im_end|>); -1 if none */

/* The reply parser: a model's generated ids in, what they say out, for the folder's chat format
 * (K3 XTML, Kimi K2, Qwen3, DeepSeek-V3; a format without chat gives plain text).
 *
 *     tok_reply *r;  tok_reply_new(t, thinking, &r, &err);
 *     for each group of generated ids:  tok_reply_feed(r, ids, n, on_event, ud, &err);
 *     tok_reply_finish(r, on_event, ud, &err);  tok_reply_free(r);
 *
 * Events: answer text, reasoning text (K3's think channel, <think>...</think>), each tool call
 * whole (its name and its arguments as a JSON object), and the end of the message. It is
 * incremental: ids come one at a time or many at once (a verified draft), and a marker split
 * over several ids, or a code point over several, is held back until it is whole, so the events
 * (joined by kind) do not depend on how the ids were grouped. Text that only looks like a marker
 * is text; a K3 tag the parser does not know loses its header and keeps its contents in the
 * enclosing channel. A stop id of the format ends the message, and what follows is ignored. */
typedef enum tok_reply_kind {
    TOK_REPLY_TEXT,      /* the answer's text, complete UTF-8 */
    TOK_REPLY_REASONING, /* the thinking channel's text */
    TOK_REPLY_TOOL_CALL, /* one whole tool call */
    TOK_REPLY_END        /* the end of the message */
} tok_reply_kind;

typedef struct tok_reply_event {
    tok_reply_kind kind;
    const char *text;  /* TEXT, REASONING: new text; TOOL_CALL: its arguments (a JSON object) */
    size_t len;
    const char *name;  /* TOOL_CALL: the function's name */
    const char *id;    /* TOOL_CALL: the id the model wrote for it (Kimi K2's "functions.f:0"), or "" */
    int index;         /* TOOL_CALL: 0, 1, ... within the message */
} tok_reply_event;

/* Called for each event (valid during the call); a non-zero return stops the feed, which returns
 * that value. */
typedef int (*tok_reply_fn)(void *ud, const tok_reply_event *ev);

typedef struct tok_reply tok_reply;
/* thinking: the prompt opened the thinking channel itself (K3 with thinking on); formats whose
 * model writes its own <think> need not say. */
int tok_reply_new(const tok *t, int thinking, tok_reply **out, errbuf *err);
/* Returns 0, the callback's non-zero value, or -1 (out of memory, err set). */
int tok_reply_feed(tok_reply *r, const int32_t *ids, size_t n, tok_reply_fn cb, void *ud, errbuf *err);
/* The end of the ids: text held back (a partial marker, an incomplete code point as U+FFFD) comes
 * out; a tool call the ids cut short is dropped. No END event unless a stop id came. */
int tok_reply_finish(tok_reply *r, tok_reply_fn cb, void *ud, errbuf *err);
void tok_reply_free(tok_reply *r);

/* Chat rendering. `req` is an OpenAI-style messages array, or a chat-completions request object
 * with "messages" and optionally "tools", "tool_choice", "response_format". */
typedef struct tok_chat_opts {
    int thinking;                /* 1 (default): think before answering, where the format can */
    const char *thinking_effort; /* K3: "low" | "high" | "max"; NULL: "max" (the HF default) */
    int add_generation_prompt;   /* 1 (default): end with the opening of the assistant's turn */
} tok_chat_opts;
void tok_chat_opts_init(tok_chat_opts *o);
/* Renders and encodes; appends the prompt's ids. Message text never becomes special ids. */
int tok_chat_encode(const tok *t, const json_t *req, const tok_chat_opts *o, tok_ids *out, errbuf *err);
/* The rendered prompt as one string (malloc'd, NUL-terminated), for debugging and tests. */
int tok_chat_render(const tok *t, const json_t *req, const tok_chat_opts *o, char **text, size_t *len,
                    errbuf *err);

#endif
