/* test_tok_unicode.c — the generated character classes on known code points, UTF-8 stepping, and
 * NFC / NFD on the cases that exercise each rule (composition, canonical reordering, singletons,
 * composition exclusions, Hangul, blocked marks, HF's older data, invalid bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tok_unicode.h"

TEST(tok_unicode_classes)
{
    static const struct {
        uint32_t cp;
        unsigned has, hasnt;
    } cases[] = {
        {'a', TOKU_LL, TOKU_LU | TOKU_WS},    {'Z', TOKU_LU, TOKU_LL},
        {0x4E2D, TOKU_LO | TOKU_HAN, 0},      {0x3001, TOKU_P, TOKU_HAN | TOKU_L}, /* 、 is not Script=Han */
        {0x3005, TOKU_LM | TOKU_HAN, 0},      {0x3007, TOKU_N | TOKU_HAN, TOKU_L},
        {0x30FC, TOKU_LM, TOKU_HAN},          {0x0301, TOKU_M | TOKU_NFC_CHECK, TOKU_L},
        {0x16FF0, TOKU_M | TOKU_HAN, TOKU_L}, {0x3000, TOKU_WS | TOKU_PYSPACE, 0},
        {0x180E, 0, TOKU_WS | TOKU_PYSPACE},  {0x1C, TOKU_PYSPACE, TOKU_WS}, /* str.isspace, not \s */
        {0x85, TOKU_WS | TOKU_PYSPACE, 0},    {0x1C89, TOKU_LU, 0},          /* Unicode 16 */
        {0x31350, TOKU_LO | TOKU_HAN, 0},     {0x661, TOKU_N, 0},
        {0x01C5, TOKU_LT, TOKU_LU | TOKU_LL}, {0xFFFD, TOKU_S, 0},
        {TOKU_INVALID, TOKU_S, TOKU_L | TOKU_N | TOKU_WS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned f = toku_flags(cases[i].cp);
        CHECKF((f & cases[i].has) == cases[i].has && !(f & cases[i].hasnt), "U+%04X: flags 0x%x", cases[i].cp, f);
    }
}

TEST(tok_unicode_utf8_stepping)
{
    static const struct {
        const char *s;
        uint32_t cp;
        int len;
    } cases[] = {
        {"A", 'A', 1},          {"\xC3\xA9", 0xE9, 2},           {"\xE4\xB8\xAD", 0x4E2D, 3},
        {"\xF0\x9F\x98\x80", 0x1F600, 4}, {"\xC0\x80", TOKU_INVALID, 1}, /* overlong */
        {"\xED\xA0\x80", TOKU_INVALID, 1}, /* surrogate */ {"\xF4\x90\x80\x80", TOKU_INVALID, 1}, /* > U+10FFFF */
        {"\xE4\xB8", TOKU_INVALID, 1},     /* truncated */  {"\x80", TOKU_INVALID, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int len;
        const uint8_t *s = (const uint8_t *)cases[i].s;
        uint32_t cp = toku_next(s, s + strlen(cases[i].s), &len);
        CHECKF(cp == cases[i].cp && len == cases[i].len, "case %zu: U+%04X len %d", i, cp, len);
        if (cp != TOKU_INVALID) {
            uint8_t out[4];
            CHECK(toku_put(out, cp) == len && !memcmp(out, s, (size_t)len));
        }
    }
}

static int nfc_is(const char *in, const char *want, int nfd)
{
    uint8_t *out;
    size_t n;
    if ((nfd ? toku_nfd : toku_nfc)((const uint8_t *)in, strlen(in), &out, &n))
        return 0;
    int ok = n == strlen(want) && !memcmp(out, want, n);
    if (!ok)
        fprintf(stderr, "%s(%s) = %.*s\n", nfd ? "NFD" : "NFC", in, (int)n, out);
    free(out);
    return ok;
}

TEST(tok_unicode_nfc)
{
    CHECK(nfc_is("plain ascii", "plain ascii", 0));
    CHECK(nfc_is("e\xCC\x81", "\xC3\xA9", 0));                          /* e + acute -> é */
    CHECK(nfc_is("a\xCC\xA3\xCC\x87", "\xE1\xBA\xA1\xCC\x87", 0));       /* a dot-below dot-above */
    CHECK(nfc_is("a\xCC\x87\xCC\xA3", "\xE1\xBA\xA1\xCC\x87", 0));       /* reordered first */
    CHECK(nfc_is("\xE2\x84\xAB", "\xC3\x85", 0));                        /* Angstrom sign: singleton */
    CHECK(nfc_is("\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", 0));        /* U+0958 is excluded */
    CHECK(nfc_is("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81", 0)); /* L V T -> 각 */
    CHECK(nfc_is("\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81", 0));        /* LV + T */
    CHECK(nfc_is("\xCC\x81" "e", "\xCC\x81" "e", 0));                    /* a leading mark stays */
    CHECK(nfc_is("a\xCC\xB8\xCC\x81", "\xC3\xA1\xCC\xB8", 0));             /* ccc 1 does not block ccc 230 */
    CHECK(nfc_is("e\xE0\xA5\x8D\xCC\x81", "\xC3\xA9\xE0\xA5\x8D", 0)); /* nor does a virama (9) */
    CHECK(nfc_is("e\xCC\x81\xCC\x81", "\xC3\xA9\xCC\x81", 0));          /* second acute is blocked */
    CHECK(nfc_is("x\xCD\x85\xF0\x96\xBF\xB0", "x\xCD\x85\xF0\x96\xBF\xB0", 0)); /* U+16FF0: a starter to HF */
    CHECK(nfc_is("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0", "\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0", 0)); /* HF: no compose */
    CHECK(nfc_is("e\xFF\xCC\x81", "e\xFF\xCC\x81", 0));                  /* an invalid byte is a boundary */
    CHECK(nfc_is("\xCC\x81\xFE", "\xCC\x81\xFE", 0));
    CHECK(toku_nfc_is_trivial((const uint8_t *)"caf\xC3\xA9 \xE4\xB8\xAD", 10));
    CHECK(!toku_nfc_is_trivial((const uint8_t *)"cafe\xCC\x81", 6));
    CHECK(nfc_is("\xC3\xA9\xEA\xB0\x81", "e\xCC\x81\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", 1));
    CHECK(nfc_is("a\xCC\x87\xCC\xA3", "a\xCC\xA3\xCC\x87", 1));
}
