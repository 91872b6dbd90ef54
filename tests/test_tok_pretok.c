/* test_tok_pretok.c — the hand-written pre-tokenizer scanners are the PCRE2 translation of the same
 * patterns, piece for piece; the translated classes are the generated tables, code point for code
 * point; and the translation keeps the reference engines' meanings (&&, Script=Han, White_Space,
 * case-insensitive contractions, HF Split behaviors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_tok.h"
#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

/* Pieces of s by a one-level pre-tokenizer, as "start:end," text (for comparing and printing). */
static void pieces(const tok_pretok *pt, const char *s, size_t n, tok_scratch *sc, char *out, size_t cap)
{
    size_t pos = 0, ps, pe, o = 0;
    out[0] = 0;
    while (tok_pretok_next(pt, (const uint8_t *)s, pos, n, sc, &ps, &pe) > 0 && o + 32 < cap) {
        o += (size_t)snprintf(out + o, cap - o, "%zu:%zu,", ps, pe);
        pos = pe;
    }
}

typedef struct pair {
    tok_pretok hand, re;
    tok_scratch sc;
} pair;

static int pair_init(pair *p, int kind, errbuf *err)
{
    memset(p, 0, sizeof *p);
    const char *pat = tok_pretok_pattern(kind);
    p->hand.nlev = p->re.nlev = 1;
    p->hand.drop_gaps = p->re.drop_gaps = 1;
    if (tok_pretok_level(&p->hand.lev[0], pat, strlen(pat), 0, "hand", err) ||
        tok_pretok_level(&p->re.lev[0], pat, strlen(pat), 1, "pcre2", err))
        return -1;
    if (p->hand.lev[0].kind != kind || p->re.lev[0].kind != PT_REGEX)
        return errbuf_set(err, "pattern %d: expected a hand scanner and a regex", kind);
    tok fake;
    memset(&fake, 0, sizeof fake);
    fake.pt = p->re;
    return tok_scratch_init(&p->sc, &fake, err);
}

static void pair_free(pair *p)
{
    tok_pretok_free(&p->re);
    tok_scratch_free(&p->sc);
}

/* 1 if both engines cut s identically; else 0 and a description. */
static int same(pair *p, const char *s, size_t n, char *why, size_t cap)
{
    static char a[1 << 16], b[1 << 16];
    pieces(&p->hand, s, n, &p->sc, a, sizeof a);
    pieces(&p->re, s, n, &p->sc, b, sizeof b);
    if (!strcmp(a, b))
        return 1;
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    snprintf(why, cap, "text %.60s: hand ...%.40s / pcre2 ...%.40s", s, a + i, b + i);
    return 0;
}

TEST(tok_pretok_scanners_equal_pcre2)
{
    static const int kinds[] = {PT_KIMI, PT_O200K, PT_CL100K, PT_QWEN};
    const json_t *x = tt_json("extra/extra.json"), *e = tt_json("expected.json");
    CHECK(x && e);
    char why[512], *buf = malloc(4 * 400 + 1);
    CHECK(buf);
    uint64_t st = 7;
    for (int k = 0; k < 4; k++) {
        pair p;
        errbuf err;
        CHECKF(!pair_init(&p, kinds[k], &err), "%s", err.msg);
        int ok = 1;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(x, "kimi"), i, c) if (ok)
            ok = same(&p, json_string_value(json_object_get(c, "text")),
                      json_string_length(json_object_get(c, "text")), why, sizeof why);
        json_array_foreach(json_object_get(json_object_get(e, "qwen3"), "encode"), i, c) if (ok)
            ok = same(&p, json_string_value(json_object_get(c, "text")),
                      json_string_length(json_object_get(c, "text")), why, sizeof why);
        for (int r = 0; r < 3000 && ok; r++) {
            size_t n = tt_rand_utf8(&st, buf, 1 + (size_t)r % 400);
            ok = same(&p, buf, n, why, sizeof why);
        }
        pair_free(&p);
        if (!ok)
            free(buf);
        CHECKF(ok, "pattern %d: %s", kinds[k], why);
    }
    free(buf);
}

/* Each translated property matches exactly the code points the generated tables give it. */
TEST(tok_pretok_classes_equal_tables)
{
    static const struct {
        const char *pat;
        unsigned mask;
    } props[] = {{"\\p{L}", TOKU_L},   {"\\p{Lu}", TOKU_LU}, {"\\p{Ll}", TOKU_LL}, {"\\p{Lt}", TOKU_LT},
                 {"\\p{Lm}", TOKU_LM}, {"\\p{Lo}", TOKU_LO}, {"\\p{M}", TOKU_M},   {"\\p{N}", TOKU_N},
                 {"\\p{P}", TOKU_P},   {"\\p{S}", TOKU_S},   {"\\p{Han}", TOKU_HAN}, {"\\s", TOKU_WS}};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    CHECK(md);
    for (size_t k = 0; k < sizeof props / sizeof props[0]; k++) {
        tok_pt_level lv;
        errbuf err;
        char pat[64];
        snprintf(pat, sizeof pat, "^%s", props[k].pat);
        if (tok_pretok_level(&lv, pat, strlen(pat), 1, "test", &err)) {
            pcre2_match_data_free(md);
            CHECKF(0, "%s", err.msg);
        }
        uint32_t bad = 0;
        int nbad = 0;
        for (uint32_t c = 0; c < 0x110000; c++) {
            if (c == 0xD800)
                c = 0xE000;
            uint8_t u[4];
            int n = toku_put(u, c);
            int re = pcre2_match(lv.re, u, (size_t)n, 0, 0, md, NULL) >= 0;
            int tab = (toku_flags(c) & props[k].mask) != 0;
            if (re != tab && !nbad++)
                bad = c;
        }
        pcre2_code_free(lv.re);
        if (nbad)
            pcre2_match_data_free(md);
        CHECKF(!nbad, "%s: %d code points differ, first U+%04X", props[k].pat, nbad, bad);
    }
    pcre2_match_data_free(md);
}

/* Pieces of text for a pattern through the generic (PCRE2) path with HF gap semantics. */
static int split(const char *pat, int behavior, int invert, const char *text, char *out, size_t cap)
{
    tok t;
    memset(&t, 0, sizeof t);
    errbuf err;
    t.pt.nlev = 1;
    if (tok_pretok_level(&t.pt.lev[0], pat, strlen(pat), 1, "test", &err))
        return -1;
    t.pt.lev[0].behavior = behavior;
    t.pt.lev[0].invert = invert;
    tok_scratch sc;
    tok_pieces pv = {0};
    int rc = tok_scratch_init(&sc, &t, &err) || tok_pretok_all(&t.pt, (const uint8_t *)text, strlen(text), &sc, &pv, &err);
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; !rc && i < pv.n && o + 64 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "[%.*s]", (int)(pv.v[i].e - pv.v[i].s), text + pv.v[i].s);
    free(pv.v);
    tok_scratch_free(&sc);
    tok_pretok_free(&t.pt);
    return rc;
}

/* HF's own documented examples for SplitDelimiterBehavior on "the-final--countdown". */
TEST(tok_pretok_split_behaviors)
{
    static const struct {
        int behavior, invert;
        const char *want;
    } cases[] = {
        {SPLIT_REMOVED, 0, "[the][final][countdown]"},
        {SPLIT_ISOLATED, 0, "[the][-][final][-][-][countdown]"},
        {SPLIT_MERGED_PREV, 0, "[the-][final-][-][countdown]"},
        {SPLIT_MERGED_NEXT, 0, "[the][-final][-][-countdown]"},
        {SPLIT_CONTIGUOUS, 0, "[the][-][final][--][countdown]"},
        {SPLIT_REMOVED, 1, "[-][-][-]"},
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(!split("-", cases[i].behavior, cases[i].invert, "the-final--countdown", got, sizeof got));
        CHECKF(!strcmp(got, cases[i].want), "behavior %d invert %d: got %s want %s", cases[i].behavior,
               cases[i].invert, got, cases[i].want);
    }
}

/* What the translation must mean, on characters where PCRE2's own reading would differ. */
TEST(tok_pretok_translation_semantics)
{
    static const struct {
        const char *pat, *text, *want;
    } cases[] = {
        {"[\\p{Han}]+", "中文、汉字。", "[中文][汉字]"},          /* Script, not Script_Extensions */
        {"\\s+", "a\xE1\xA0\x8E" "b \xE3\x80\x80" "c", "[ \xE3\x80\x80]"}, /* U+180E is not White_Space */
        {"(?i:'s|'t)", "it'S it\xE2\x80\x99s it'\xC5\xBF it'T", "['S]['\xC5\xBF]['T]"}, /* ſ folds to s */
        {"[\\p{L}&&[^\\p{Han}]]+", "abc中def", "[abc][def]"},
        {"[^\\p{L}&&[^\\p{Han}]]+", "ab中1!c", "[中1!]"},
        {"\\p{N}{1,3}", "12345\xD9\xA1\xD9\xA2", "[123][45\xD9\xA1][\xD9\xA2]"},
        {"[\\u{61}-\\x63]+", "abcd", "[abc]"},
        {"\\p{L}+", "\xE1\xB2\x89x", "[\xE1\xB2\x89x]"}, /* U+1C89, a Unicode 16 letter PCRE2 14 lacks */
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = split(cases[i].pat, SPLIT_REMOVED, 1, cases[i].text, got, sizeof got);
        CHECKF(!rc, "%s does not compile", cases[i].pat);
        CHECKF(!strcmp(got, cases[i].want), "%s on %s: got %s want %s", cases[i].pat, cases[i].text, got,
               cases[i].want);
    }
    tok_pt_level lv;
    errbuf err;
    CHECK(tok_pretok_level(&lv, "[a-", 3, 1, "pat.json", &err) == -1);
    CHECKF(strstr(err.msg, "pat.json") && strstr(err.msg, "unterminated"), "%s", err.msg);
}
