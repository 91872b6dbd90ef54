/* tok_int.h — the tokenizer module's internal structures, shared by its .c files only.
 *
 * Layout of a loaded tokenizer (immutable after tok_load):
 *   - every id's bytes live in one blob (`off[id]..off[id+1]`); a special's bytes are its name.
 *   - `bytes` maps mergeable token bytes -> id (for tiktoken the id IS the rank, and merge
 *     priority is the rank of the merged bytes); `merges` maps an id pair -> (merge rank, new id)
 *     for tokenizer.json BPE, whose priority belongs to the pair, not to the merged bytes.
 *   - `spec` maps special / added token strings -> id for matching inside text.
 *   - a pre-tokenizer: a hand-written scanner for the patterns we know (Kimi, o200k, cl100k,
 *     Qwen), or PCRE2 levels for anything else (tok_pretok.c).
 * Per-call state lives in tok_scratch (one per thread), never in the tok.
 */
#ifndef DF_TOKENIZER_TOK_INT_H
#define DF_TOKENIZER_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "tokenizer/tok.h"

/* ---- UTF-8 (tok_detok.c) ---- */

/* Decodes in[0..n) into out with errors="replace" (a maximal ill-formed subpart -> U+FFFD); with
 * `final` == 0 an incomplete tail is left undecoded and its length returned in *rest. Returns the
 * output length. out needs 3 * n bytes. */
size_t tok_utf8_replace(const uint8_t *in, size_t n, char *out, int final, size_t *rest);

/* ---- hash maps (tok_bpe.c) ---- */

/* bytes -> id, open addressing over 16-byte slots. A token of at most 8 bytes is kept in the slot
 * itself, so the common lookup touches one cache line and never the blob. idl = (id + 1) | length
 * (255: longer) << 24, so ids stay below 2^24 - 1 (TOK_MAX_IDS); idl == 0 marks an empty slot. */
typedef struct tok_slot {
    uint32_t hash;
    uint32_t idl;
    uint64_t inl; /* the token bytes, zero-padded, when length <= 8 */
} tok_slot;
typedef struct tok_smap {
    tok_slot *slot;
    uint8_t *tag;  /* [cap] 0 empty, else 1 + the hash's top 7 bits: probing a missing key (most BPE
                    * pair lookups) stays in this small array, which fits in cache */
    uint64_t mask;
} tok_smap;
#define TOK_MAX_IDS 0xFFFFFE

/* (id a, id b) -> (rank, new id). key = a << 32 | b (UINT64_MAX empty); val = rank << 32 | new. */
typedef struct tok_pmap {
    uint64_t *key, *val;
    uint64_t mask;
} tok_pmap;

uint32_t tok_hash(const uint8_t *p, size_t n);
int tok_smap_init(tok_smap *m, size_t n);
void tok_smap_free(tok_smap *m);
/* Inserts (bytes of id) -> id; returns the id already there if the bytes are present, else -1. */
int32_t tok_smap_put(tok_smap *m, const tok *t, int32_t id);
int32_t tok_smap_get(const tok_smap *m, const tok *t, const uint8_t *p, size_t n);
int tok_pmap_init(tok_pmap *m, size_t n);
void tok_pmap_free(tok_pmap *m);
int tok_pmap_put(tok_pmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t newid); /* 1 if present */
static inline int tok_pmap_get(const tok_pmap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *newid)
{
    uint64_t k = (uint64_t)a << 32 | b, h = k * 0x9E3779B97F4A7C15ull;
    for (uint64_t i = (h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k) {
            *rank = (uint32_t)(m->val[i] >> 32);
            *newid = (uint32_t)m->val[i];
            return 1;
        }
        if (m->key[i] == UINT64_MAX)
            return 0;
    }
}

/* ---- pre-tokenizer (tok_pretok.c) ---- */

enum { PT_KIMI = 1, PT_O200K, PT_CL100K, PT_QWEN, PT_REGEX };
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { TOK_MAX_LEVELS = 8 };

typedef struct tok_pt_level {
    int kind;        /* PT_* */
    pcre2_code *re;  /* PT_REGEX only */
    int behavior;    /* SPLIT_* */
    int invert;
} tok_pt_level;

typedef struct tok_pretok {
    int nlev; /* 0: the whole text is one piece */
    tok_pt_level lev[TOK_MAX_LEVELS];
    int drop_gaps; /* tiktoken: valid text the pattern does not match is dropped */
} tok_pretok;

typedef struct tok_piece {
    size_t s, e;
} tok_piece;

typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
    int bad; /* an allocation failed */
} tok_pieces;
void tok_pieces_push(tok_pieces *p, size_t s, size_t e);

/* Per-thread working memory for encoding; grows as needed, freed by tok_scratch_free. */
typedef struct tok_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jst;
    tok_pieces lv[2];      /* multi-level splitting */
    uint32_t *bpe;         /* BPE arrays, 6 * bpecap words */
    size_t bpecap;
    uint8_t *norm;         /* normalized text */
    size_t normcap;
} tok_scratch;
int tok_scratch_init(tok_scratch *s, const tok *t, errbuf *err);
void tok_scratch_free(tok_scratch *s);

/* Compiles a pattern for level `lv`: a known pattern gets its hand scanner, anything else is
 * translated to PCRE2 (fancy-regex / Oniguruma syntax: `&&` class intersection, \p{Han} as
 * Script=Han, \s as White_Space, with the reference engines' Unicode 16 classes). */
int tok_pretok_level(tok_pt_level *lv, const char *pat, size_t patlen, int force_regex, const char *where,
                     errbuf *err);
void tok_pretok_free(tok_pretok *pt);
/* True when pieces can be found one at a time from any boundary (one level, Isolated or a hand
 * scanner): the parallel encoder may then cut a document anywhere and resynchronize. */
int tok_pretok_streamable(const tok_pretok *pt);
/* Next piece of s[0..end) at or after pos (streamable pre-tokenizers). Returns 0 when none. */
int tok_pretok_next(const tok_pretok *pt, const uint8_t *s, size_t pos, size_t end, tok_scratch *sc, size_t *ps,
                    size_t *pe);
/* All pieces of s[0..end), appended to out (any pre-tokenizer). Returns 0 or -1 (out of memory
 * or a regex engine error such as a JIT stack limit, reported in err). */
int tok_pretok_all(const tok_pretok *pt, const uint8_t *s, size_t end, tok_scratch *sc, tok_pieces *out,
                   errbuf *err);
/* The hand scanner alone: end of the piece starting at i (always > i). For tests. */
size_t tok_pretok_scan(int kind, const uint8_t *s, size_t i, size_t end);
/* The pattern a hand scanner implements (PT_KIMI .. PT_QWEN), for tests and the Kimi loader. */
const char *tok_pretok_pattern(int kind);

/* ---- the tokenizer ---- */

enum { TK_UNUSED = 0, TK_MERGEABLE, TK_SPECIAL, TK_ADDED };
enum { NORM_NONE = 0, NORM_NFC, NORM_NFD };

struct tok {
    int hf;           /* 0: tiktoken rank file; 1: tokenizer.json */
    int32_t nids;     /* ids are 0..nids-1 */
    uint8_t *blob;    /* bytes of every id */
    uint64_t *off;    /* [nids + 1] */
    uint8_t *kind;    /* [nids] TK_* */
    size_t maxlen;    /* longest token, in bytes */
    tok_smap bytes;   /* mergeable bytes -> id */
    tok_pmap merges;  /* hf only */
    int32_t byte_id[256];
    uint64_t *pair2;  /* [65536] merge of two single bytes: rank << 32 | new id (rank UINT32_MAX: none) */
    int ignore_merges;
    tok_smap spec;     /* special / added token strings -> id */
    int nspec;
    uint8_t spec_first[256]; /* 1 if some special string starts with this byte */
    int spec_len[64];        /* distinct special lengths, longest first */
    int nspec_len;
    tok_pretok pt;
    int norm;          /* NORM_* (tokenizer.json normalizer) */
    int kimi_slicing;  /* tokenization_kimi.py: 400k-char windows, 25k-char space/non-space runs */
    int default_all;   /* TOK_SPECIAL_DEFAULT means ALL */
    tok_chat_format chat;
    int kimi2_think;   /* K2-Thinking style <think></think> in assistant turns */
    int32_t stops[8];
    int nstops;
    int32_t eom;
};

/* Loaders (tok_tiktoken.c, tok_hf.c). Both fill blob/off/kind/bytes and the pretok; tok_load
 * reads the files and calls the _buf parsers (which the fuzz targets call directly), then
 * tok_finish (specials index, chat format, stop ids; every JSON argument may be NULL). */
tok *tok_new(void);
int tok_load_tiktoken(tok *t, const char *dir, errbuf *err);
/* Rank file text; `plain` = tiktoken_config.json (pat_str, special_tokens) for a plain encoding,
 * else Kimi's layout with names from tokenizer_config.json `tcfg`. */
int tok_load_tiktoken_buf(tok *t, const char *path, const char *text, size_t len, const json_t *plain,
                          const char *plainpath, const json_t *tcfg, const char *tcfgpath, errbuf *err);
int tok_load_hf(tok *t, const char *dir, errbuf *err);
int tok_load_hf_buf(tok *t, const char *path, const char *text, size_t len, errbuf *err);
int tok_finish(tok *t, const json_t *config, const json_t *tokenizer_config, const char *chat_template,
               errbuf *err);
/* Builds spec/spec_first/spec_len from every id of kind TK_SPECIAL or TK_ADDED (tok_encode.c). */
int tok_specials_index(tok *t, errbuf *err);
/* Leftmost-longest special in s[from..end); returns 1 with [*ms, *me) and *id, or 0. */
int tok_special_find(const tok *t, const uint8_t *s, size_t from, size_t end, size_t *ms, size_t *me,
                     int32_t *id);

/* Fills t->pair2 once the vocabulary (and merges) are loaded. 0 or -1 (out of memory). */
int tok_pair2_init(tok *t);
/* BPE of one piece (tok_bpe.c); appends ids. -1 only on out of memory. */
int tok_bpe_piece(const tok *t, const uint8_t *p, size_t n, tok_scratch *sc, tok_ids *out);
/* The merge loop alone, quadratic scan (heap = 0) or heap (heap = 1), for tests: both must agree. */
int tok_bpe_merge(const tok *t, const uint8_t *p, size_t n, int heap, tok_scratch *sc, tok_ids *out);
/* Encodes text that contains no special tokens to find: normalize (hf), pre-tokenize, BPE. */
int tok_encode_plain(const tok *t, const uint8_t *s, size_t n, tok_scratch *sc, tok_ids *out, errbuf *err);
/* Text encoding with a resolved special mode (no Kimi slicing): tok_encode.c. */
int tok_encode_doc(const tok *t, const uint8_t *s, size_t n, int allow_special, tok_scratch *sc, tok_ids *out,
                   errbuf *err);

/* ---- chat (tok_chat.c and one file per format) ---- */

/* A rendered prompt: text plus which byte ranges are markup (may contain special tokens). */
typedef struct tok_seg {
    size_t off, len;
    int markup;
} tok_seg;

typedef struct tok_segs {
    char *text;
    size_t len, cap;
    tok_seg *v;
    size_t n, segcap;
    int bad;
} tok_segs;
void tok_segs_add(tok_segs *s, const char *p, size_t n, int markup);
void tok_segs_str(tok_segs *s, const char *p, int markup); /* NUL-terminated */
void tok_segs_free(tok_segs *s);

/* The parsed request every renderer reads. */
typedef struct tok_chat_req {
    const json_t *messages; /* array */
    const json_t *tools;    /* array or NULL */
    const json_t *tool_choice, *response_format;
} tok_chat_req;

int tok_chat_k3(const tok *t, const tok_chat_req *r, const tok_chat_opts *o, tok_segs *out, errbuf *err);
int tok_chat_kimi2(const tok *t, const tok_chat_req *r, const tok_chat_opts *o, tok_segs *out, errbuf *err);
int tok_chat_qwen3(const tok *t, const tok_chat_req *r, const tok_chat_opts *o, tok_segs *out, errbuf *err);
int tok_chat_deepseek3(const tok *t, const tok_chat_req *r, const tok_chat_opts *o, tok_segs *out,
                       errbuf *err);

/* ---- Python-compatible JSON output (tok_json.c) ---- */

/* Appends json.dumps(v, ensure_ascii=False, separators=...) to out: compact=1 uses (",", ":"),
 * else (", ", ": "); sort=1 sorts object keys by code point (deep_sort_dict). */
int tok_json_dump(const json_t *v, int compact, int sort, tok_segs *out, int markup);
/* Python str(x) of a JSON scalar (str: itself; int; float repr; True/False; None). */
int tok_json_pystr(const json_t *v, char *buf, size_t cap, const char **s, size_t *n);
/* Python repr() of a double (shortest round-trip digits) into buf (>= 32 bytes). */
int tok_py_float_repr(double d, char *buf);
/* Loads JSON from a buffer with line:column errors. */
json_t *tok_json_load(const char *buf, size_t len, const char *where, errbuf *err);
/* 1-based line of the k-th element of the array that follows the first occurrence of `key`
 * (a quoted JSON key, e.g. "\"merges\"") in a JSON text; 0 if not found. */
int tok_json_elem_line(const char *text, size_t len, const char *key, size_t k);

#endif
