/* tok_unicode.h — the Unicode the tokenizers need: character classes, UTF-8 stepping, NFC.
 *
 * Classes are those of the reference regex engines (tiktoken's fancy-regex and HF's Oniguruma,
 * Unicode 16), generated into tok_unicode_tab.c by gen_unicode.py. Invariants:
 *   - toku_flags(cp) is defined for every cp < 0x110000; anything else (including the
 *     stand-in for an invalid UTF-8 byte, TOKU_INVALID) has the flags of U+FFFD (So), so a
 *     stray byte is "punctuation-like" text and never a letter, digit or space.
 *   - toku_next() consumes at least one byte and never reads past `end`.
 *   - NFC follows UAX #15 (decompose, reorder by combining class, compose) and only rewrites the
 *     spans around code points flagged TOKU_NFC_CHECK; text without them is returned unchanged.
 */
#ifndef DF_TOKENIZER_TOK_UNICODE_H
#define DF_TOKENIZER_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    TOKU_LU = 1 << 0,
    TOKU_LL = 1 << 1,
    TOKU_LT = 1 << 2,
    TOKU_LM = 1 << 3,
    TOKU_LO = 1 << 4,
    TOKU_M = 1 << 5,
    TOKU_N = 1 << 6,
    TOKU_P = 1 << 7,
    TOKU_S = 1 << 8,
    TOKU_HAN = 1 << 9,      /* Script=Han (not Script_Extensions) */
    TOKU_WS = 1 << 10,      /* White_Space: regex \s */
    TOKU_PYSPACE = 1 << 11, /* Python str.isspace() */
    TOKU_NFC_CHECK = 1 << 12, /* combining class != 0 or NFC_Quick_Check != Yes */
    TOKU_L = TOKU_LU | TOKU_LL | TOKU_LT | TOKU_LM | TOKU_LO,
};

/* The code point reported for a byte that does not start a valid UTF-8 sequence. */
#define TOKU_INVALID 0x110000u

extern const uint16_t toku_class_flags[];
extern const uint16_t toku_ascii[128]; /* the flags of U+0000..U+007F, without the two-stage lookup */
extern const uint16_t toku_stage1[];
extern const uint8_t toku_stage2[];
extern const uint32_t toku_ccc[];
extern const int toku_nccc;
extern const uint32_t toku_decomp_idx[];
extern const int toku_ndecomp;
extern const uint32_t toku_decomp_pool[];
extern const uint64_t toku_comp_key[];
extern const uint32_t toku_comp_val[];
extern const int toku_ncomp;

static inline unsigned toku_flags(uint32_t cp)
{
    if (cp < 128)
        return toku_ascii[cp];
    if (cp >= 0x110000u)
        cp = 0xFFFD;
    return toku_class_flags[toku_stage2[(size_t)toku_stage1[cp >> 7] * 128 + (cp & 127)]];
}

/* Decodes one code point at s[0..end-s). Invalid or truncated sequences (overlongs, surrogates,
 * > U+10FFFF, bad continuation bytes) yield TOKU_INVALID and a length of 1 byte. */
static inline uint32_t toku_next(const uint8_t *s, const uint8_t *end, int *len)
{
    uint32_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    ptrdiff_t room = end - s;
    if (c >= 0xC2 && c <= 0xDF && room >= 2 && (s[1] & 0xC0) == 0x80) {
        *len = 2;
        return ((c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c >= 0xE0 && c <= 0xEF && room >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
        uint32_t v = ((c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) {
            *len = 3;
            return v;
        }
    }
    if (c >= 0xF0 && c <= 0xF4 && room >= 4 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 &&
        (s[3] & 0xC0) == 0x80) {
        uint32_t v = ((c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
                     (s[3] & 0x3F);
        if (v >= 0x10000 && v <= 0x10FFFF) {
            *len = 4;
            return v;
        }
    }
    *len = 1;
    return TOKU_INVALID;
}

/* Writes cp as UTF-8 into out (room for 4 bytes); returns the length. */
int toku_put(uint8_t *out, uint32_t cp);

/* Canonical combining class (0 for most code points). */
int toku_ccc_of(uint32_t cp);

/* 1 if NFC(s) == s can be seen without rewriting anything (no TOKU_NFC_CHECK code point). */
int toku_nfc_is_trivial(const uint8_t *s, size_t n);

/* NFC of s[0..n) into a malloc'd buffer (*out, *outlen). Invalid bytes are copied through
 * unchanged. Returns 0, or -1 when out of memory. */
int toku_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *outlen);

/* NFD (canonical decomposition + reordering) likewise. */
int toku_nfd(const uint8_t *s, size_t n, uint8_t **out, size_t *outlen);

#endif
