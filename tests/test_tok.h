/* test_tok.h — helpers shared by the tokenizer tests (tests/test_tok_*.c): tokenizers and JSON
 * files under test_data("tokenizers") (tests/data/tokenizers, archives unpacked by tests/testdata.sh)
 * loaded once per run, id comparison, random text. */
#ifndef DF_TESTS_TEST_TOK_H
#define DF_TESTS_TEST_TOK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok.h"

/* The tokenizer of test_data("tokenizers/<name>"), loaded on first use and kept (NULL + a message
 * in *why if it cannot be loaded). */
tok *tt_tok(const char *name, const char **why);
/* test_data("tokenizers/<rel>") parsed, kept for the run. */
const json_t *tt_json(const char *rel);
/* 1 if ids equal the JSON array want; else 0 with a description of the first difference. */
int tt_ids_eq(const tok_ids *got, const json_t *want, char *why, size_t cap);
/* FNV-1a over the ids' little-endian bytes (as gen_extra.py computes it), as 16 hex digits. */
void tt_fnv(const int32_t *v, size_t n, char out[17]);
/* Random valid UTF-8 of up to maxcp code points from a mix of scripts, spaces and marks;
 * returns the byte length (buf needs 4 * maxcp + 1). */
size_t tt_rand_utf8(uint64_t *state, char *buf, size_t maxcp);
uint64_t tt_rand(uint64_t *state);
/* Kimi K2 (thinking: K2-Thinking) and DeepSeek-V3 tokenizers assembled in the test's temp folder
 * (the stand-in ranks with K2's special names; a byte-level vocab with DeepSeek's specials). */
tok *tt_k2_tok(int thinking, errbuf *err);
tok *tt_ds_tok(errbuf *err);

#endif
