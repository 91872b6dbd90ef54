/* test_tok_encode.c — properties of encoding and decoding that hold for any input:
 * parallel == serial (memcmp) on large multilingual text for every tokenizer and thread count,
 * decode(encode(x)) == x on random valid UTF-8 (NFC(x) where the tokenizer normalizes), bytes
 * survive invalid UTF-8, the heap and quadratic BPE loops agree, the streaming detokenizer
 * emits exactly tok_decode's text and never half a code point, special-token modes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_tok.h"
#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

static const char *const NAMES[] = {"kimi-k3-standin", "cl100k", "qwen3"};

/* Raw bytes of ids (no UTF-8 repair), malloc'd. */
static char *raw_bytes(const tok *t, const tok_ids *ids, size_t *len)
{
    size_t n = 0, l;
    for (size_t i = 0; i < ids->n; i++)
        if (tok_token_bytes(t, ids->v[i], &l))
            n += l;
    char *b = malloc(n + 1), *p = b;
    for (size_t i = 0; b && i < ids->n; i++) {
        const uint8_t *s = tok_token_bytes(t, ids->v[i], &l);
        if (s) {
            memcpy(p, s, l);
            p += l;
        }
    }
    *len = n;
    return b;
}

/* A large text mixing prose, code, CJK, long runs (> 25,000 characters, so Kimi's slicing cuts
 * inside it and parallel chunks must resynchronize across pieces longer than a chunk), special
 * token strings and random scripts. */
static char *big_text(size_t target, size_t *len)
{
    char *b = malloc(target + 64 * 1024); /* room for the last snippet or run */
    size_t n = 0;
    uint64_t st = 99;
    static const char *snips[] = {
        "The quick brown fox jumps over the lazy dog. It's what they'd said; WE'LL see.\n",
        "int main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n}\n",
        "中文分词测试，以及标点。日本語のテキストとカタカナ、한국어 문장입니다.\n",
        "  \u00a0\u2009 spaces\t\ttabs\r\n\r\n\n",
        "<|end_of_msg|><|im_end|><think>[BOS]<|endoftext|>",
        ("na\xC3\xAFve cafe\xCC\x81 \xF0\x9F\xA6\x80 \xC3\xBC" "ber 1234567890 \xD9\xA1\xD9\xA2\xD9\xA3 "),
    };
    while (b && n < target) {
        uint64_t r = tt_rand(&st) % 1000;
        if (r < 600) {
            const char *s = snips[tt_rand(&st) % 6];
            memcpy(b + n, s, strlen(s));
            n += strlen(s);
        } else if (r < 997) {
            n += tt_rand_utf8(&st, b + n, 200);
        } else { /* a long run: letters, spaces or digits */
            char c = "a \n7"[tt_rand(&st) % 4];
            size_t k = 20000 + tt_rand(&st) % 12000;
            memset(b + n, c, k);
            n += k;
        }
    }
    *len = n;
    return b;
}

TEST(tok_parallel_equals_serial)
{
    size_t n;
    char *text = big_text(1u << 20, &n);
    CHECK(text);
    for (int k = 0; k < 3; k++) {
        const char *why;
        tok *t = tt_tok(NAMES[k], &why);
        if (!t)
            free(text);
        CHECKF(t, "%s", why);
        for (int sp = TOK_SPECIAL_NONE; sp <= TOK_SPECIAL_ALL; sp++) {
            tok_ids serial = {0};
            errbuf err;
            int rc = tok_encode(t, text, n, (tok_special)sp, &serial, &err);
            if (rc)
                free(text);
            CHECKF(!rc, "%s", err.msg);
            for (int th = 2; th <= 7; th += 5) {
                pool *p = pool_new(th, &err);
                tok_ids par = {0};
                rc = !p || tok_encode_parallel(t, text, n, (tok_special)sp, p, &par, &err);
                pool_free(p);
                int same = !rc && par.n == serial.n && !memcmp(par.v, serial.v, serial.n * sizeof *par.v);
                size_t at = 0;
                while (!rc && at < par.n && at < serial.n && par.v[at] == serial.v[at])
                    at++;
                tok_ids_free(&par);
                if (!same) {
                    tok_ids_free(&serial);
                    free(text);
                }
                CHECKF(same, "%s, special mode %d, %d threads: %s (first difference at id %zu)", NAMES[k], sp, th,
                       rc ? err.msg : "ids differ", at);
            }
            tok_ids_free(&serial);
        }
    }
    free(text);
}

TEST(tok_roundtrip_random_utf8)
{
    char *buf = malloc(4 * 300 + 1);
    CHECK(buf);
    for (int k = 0; k < 3; k++) {
        const char *why;
        tok *t = tt_tok(NAMES[k], &why);
        if (!t)
            free(buf);
        CHECKF(t, "%s", why);
        uint64_t st = 1000 + (uint64_t)k;
        for (int r = 0; r < 1500; r++) {
            size_t n = tt_rand_utf8(&st, buf, 300), dl = 0, wl = n;
            tok_ids ids = {0};
            errbuf err;
            char *dec = NULL;
            uint8_t *want = (uint8_t *)buf;
            int ok = !tok_encode(t, buf, n, TOK_SPECIAL_NONE, &ids, &err) &&
                     !tok_decode(t, ids.v, ids.n, 0, &dec, &dl, &err);
            if (ok && k == 2 && toku_nfc((const uint8_t *)buf, n, &want, &wl)) /* Qwen normalizes to NFC */
                ok = 0;
            ok = ok && dl == wl && !memcmp(dec, want, wl);
            if (want != (uint8_t *)buf)
                free(want);
            free(dec);
            tok_ids_free(&ids);
            if (!ok)
                free(buf);
            CHECKF(ok, "%s: decode(encode(x)) != x for random text %d", NAMES[k], r);
        }
    }
    free(buf);
}

TEST(tok_invalid_utf8_bytes_survive)
{
    uint64_t st = 5;
    uint8_t buf[512];
    for (int k = 0; k < 3; k++) {
        const char *why;
        tok *t = tt_tok(NAMES[k], &why);
        CHECKF(t, "%s", why);
        for (int r = 0; r < 500; r++) {
            size_t n = 1 + tt_rand(&st) % sizeof buf;
            for (size_t i = 0; i < n; i++) /* bytes biased to UTF-8 lead / continuation values */
                buf[i] = (uint8_t)(tt_rand(&st) % 3 ? 0x80 + tt_rand(&st) % 0x80 : tt_rand(&st));
            tok_ids ids = {0};
            errbuf err;
            CHECKF(!tok_encode(t, (const char *)buf, n, TOK_SPECIAL_NONE, &ids, &err), "%s", err.msg);
            size_t len, wl = n;
            char *raw = raw_bytes(t, &ids, &len);
            char *dec = NULL;
            size_t dl;
            uint8_t *want = buf; /* Qwen normalizes valid parts to NFC; invalid bytes pass through */
            int ok = k != 2 || !toku_nfc(buf, n, &want, &wl);
            ok = ok && raw && len == wl && !memcmp(raw, want, wl) && !tok_decode(t, ids.v, ids.n, 0, &dec, &dl, &err);
            if (want != buf)
                free(want);
            /* decode repairs: the result is valid UTF-8 */
            for (size_t i = 0; ok && i < dl;) {
                int l;
                ok = toku_next((const uint8_t *)dec + i, (const uint8_t *)dec + dl, &l) != TOKU_INVALID;
                i += (size_t)l;
            }
            free(raw);
            free(dec);
            tok_ids_free(&ids);
            CHECKF(ok, "%s: invalid UTF-8 input %d: bytes lost or decode not valid UTF-8", NAMES[k], r);
        }
    }
}

TEST(tok_bpe_heap_equals_scan)
{
    uint64_t st = 11;
    char *buf = malloc(4 * 120 + 1);
    CHECK(buf);
    for (int k = 0; k < 3; k++) {
        const char *why;
        tok *t = tt_tok(NAMES[k], &why);
        if (!t)
            free(buf);
        CHECKF(t, "%s", why);
        tok_scratch sc;
        errbuf err;
        CHECK(!tok_scratch_init(&sc, t, &err));
        int ok = 1;
        for (int r = 0; r < 3000 && ok; r++) {
            size_t n;
            if (r % 3 == 0) { /* random bytes */
                n = 2 + tt_rand(&st) % 200;
                for (size_t i = 0; i < n; i++)
                    buf[i] = (char)tt_rand(&st);
            } else {
                n = tt_rand_utf8(&st, buf, 120);
            }
            tok_ids a = {0}, b = {0};
            ok = !tok_bpe_merge(t, (uint8_t *)buf, n, 0, &sc, &a) && !tok_bpe_merge(t, (uint8_t *)buf, n, 1, &sc, &b) &&
                 a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof *a.v);
            tok_ids_free(&a);
            tok_ids_free(&b);
        }
        tok_scratch_free(&sc);
        if (!ok)
            free(buf);
        CHECKF(ok, "%s: heap and scan merge loops disagree", NAMES[k]);
    }
    free(buf);
}

/* 25,000 identical characters are one piece for Qwen (no slicing): the heap loop must handle it;
 * for Kimi the slicing cuts it; either way the text comes back. */
TEST(tok_pathological_pieces)
{
    static const char *units[] = {"a", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "1", " ", "'"};
    for (int k = 0; k < 3; k++) {
        const char *why;
        tok *t = tt_tok(NAMES[k], &why);
        CHECKF(t, "%s", why);
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
            size_t ul = strlen(units[u]), n = ul * 30000;
            char *s = malloc(n), *dec = NULL;
            CHECK(s);
            for (size_t i = 0; i < 30000; i++)
                memcpy(s + i * ul, units[u], ul);
            tok_ids ids = {0};
            errbuf err;
            size_t dl = 0;
            int ok = !tok_encode(t, s, n, TOK_SPECIAL_NONE, &ids, &err) && !tok_decode(t, ids.v, ids.n, 0, &dec, &dl, &err) &&
                     dl == n && !memcmp(dec, s, n);
            free(s);
            free(dec);
            tok_ids_free(&ids);
            CHECKF(ok, "%s: 30,000 x '%s' does not round-trip", NAMES[k], units[u]);
        }
    }
}

TEST(tok_stream_detokenizer)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    /* a text whose tokens split code points, then random texts */
    uint64_t st = 3;
    char *buf = malloc(4 * 200 + 1);
    CHECK(buf);
    for (int r = 0; r < 300; r++) {
        size_t n = tt_rand_utf8(&st, buf, 200);
        tok_ids ids = {0};
        errbuf err;
        char *whole = NULL, *acc = malloc(3 * n + 16);
        size_t wl = 0, al = 0, l;
        int ok = acc && !tok_encode(t, buf, n, TOK_SPECIAL_NONE, &ids, &err) &&
                 !tok_decode(t, ids.v, ids.n, 0, &whole, &wl, &err);
        tok_stream s;
        ok = ok && !tok_stream_init(&s, t, 0, &err);
        for (size_t i = 0; ok && i < ids.n; i++) {
            const char *o = tok_stream_feed(&s, ids.v[i], &l);
            /* every piece of output is complete UTF-8 */
            for (size_t j = 0; j < l;) {
                int cl;
                if (toku_next((const uint8_t *)o + j, (const uint8_t *)o + l, &cl) == TOKU_INVALID)
                    ok = 0;
                j += (size_t)cl;
            }
            memcpy(acc + al, o, l);
            al += l;
        }
        if (ok) {
            const char *o = tok_stream_flush(&s, &l);
            memcpy(acc + al, o, l);
            al += l;
            tok_stream_free(&s);
        }
        ok = ok && al == wl && !memcmp(acc, whole, wl) && wl == n && !memcmp(whole, buf, n);
        free(acc);
        free(whole);
        tok_ids_free(&ids);
        if (!ok)
            free(buf);
        CHECKF(ok, "streamed text differs from tok_decode for random text %d", r);
    }
    free(buf);
    /* byte tokens: a code point split over ids is held back, invalid bytes become U+FFFD */
    tok_stream s;
    errbuf err;
    size_t l;
    CHECK(!tok_stream_init(&s, t, 0, &err));
    int32_t e4 = tok_token_id(t, "\xE4", 1), b8 = tok_token_id(t, "\xB8", 1), ad = tok_token_id(t, "\xAD", 1),
            x = tok_token_id(t, "x", 1);
    CHECK(e4 >= 0 && b8 >= 0 && ad >= 0 && x >= 0);
    int ok = !strcmp(tok_stream_feed(&s, e4, &l), "") && l == 0 && !strcmp(tok_stream_feed(&s, b8, &l), "") &&
             !strcmp(tok_stream_feed(&s, ad, &l), "\xE4\xB8\xAD") && l == 3;
    ok = ok && !strcmp(tok_stream_feed(&s, e4, &l), "") && !strcmp(tok_stream_feed(&s, x, &l), "\xEF\xBF\xBDx");
    ok = ok && !strcmp(tok_stream_feed(&s, e4, &l), "") && !strcmp(tok_stream_feed(&s, b8, &l), "") &&
         !strcmp(tok_stream_flush(&s, &l), "\xEF\xBF\xBD") && l == 3;
    ok = ok && !strcmp(tok_stream_feed(&s, ad, &l), "\xEF\xBF\xBD"); /* a lone continuation byte */
    ok = ok && !strcmp(tok_stream_feed(&s, 200000, &l), "<|end_of_msg|>") && l == 14;
    tok_stream_free(&s);
    CHECK(ok);
    CHECK(!tok_stream_init(&s, t, 1, &err)); /* skip_special */
    ok = !strcmp(tok_stream_feed(&s, 200000, &l), "") && !strcmp(tok_stream_feed(&s, x, &l), "x");
    tok_stream_free(&s);
    CHECK(ok);
}

TEST(tok_special_modes)
{
    const char *why;
    tok *k = tt_tok("kimi-k3-standin", &why), *q = tt_tok("qwen3", &why);
    CHECKF(k && q, "%s", why);
    static const char text[] = "a<|end_of_msg|>b<|im_end|><think>";
    tok_ids ids = {0};
    errbuf err;
    CHECK(!tok_encode(k, text, strlen(text), TOK_SPECIAL_NONE, &ids, &err));
    for (size_t i = 0; i < ids.n; i++)
        CHECKF(!tok_is_special(k, ids.v[i]), "special id %d from text with specials off", ids.v[i]);
    ids.n = 0;
    CHECK(!tok_encode(k, text, strlen(text), TOK_SPECIAL_ALL, &ids, &err));
    CHECKF(ids.n > 2 && ids.v[1] == 200000, "kimi ALL: second id %d", ids.n > 1 ? ids.v[1] : -1);
    ids.n = 0;
    CHECK(!tok_encode(k, text, strlen(text), TOK_SPECIAL_DEFAULT, &ids, &err)); /* tiktoken default: text */
    for (size_t i = 0; i < ids.n; i++)
        CHECK(!tok_is_special(k, ids.v[i]));
    ids.n = 0;
    CHECK(!tok_encode(q, text, strlen(text), TOK_SPECIAL_DEFAULT, &ids, &err)); /* HF default: added tokens */
    CHECKF(ids.n >= 2 && ids.v[ids.n - 1] == 151667 && ids.v[ids.n - 2] == 151645, "qwen default: last ids %d %d",
           ids.n >= 2 ? ids.v[ids.n - 2] : -1, ids.n ? ids.v[ids.n - 1] : -1);
    ids.n = 0;
    CHECK(!tok_encode(q, text, strlen(text), TOK_SPECIAL_NONE, &ids, &err));
    for (size_t i = 0; i < ids.n; i++)
        CHECK(!tok_is_special(q, ids.v[i]));
    /* skip_special drops special ids but keeps non-special added tokens (Qwen's <think>) */
    int32_t v[] = {151645, 151667, 64};
    char *s;
    size_t l;
    CHECK(!tok_decode(q, v, 3, 1, &s, &l, &err));
    CHECKF(!strcmp(s, "<think>a"), "skip_special decode: %s", s);
    free(s);
    int32_t bad[] = {5, 99999999};
    CHECK(tok_decode(q, bad, 2, 0, &s, &l, &err) == -1 && strstr(err.msg, "99999999"));
    tok_ids_free(&ids);
    /* stop ids of each format */
    const int32_t *st;
    CHECK(tok_stop_ids(k, &st) >= 1 && st[0] == 200000 && tok_eom_id(k) == 200000 && tok_is_stop(k, 199999));
    CHECK(tok_stop_ids(q, &st) >= 2 && st[0] == 151645 && tok_is_stop(q, 151643));
    CHECK(tok_chat_format_of(k) == TOK_CHAT_K3 && tok_chat_format_of(q) == TOK_CHAT_QWEN3);
    CHECK(tok_chat_format_of(tt_tok("cl100k", NULL)) == TOK_CHAT_NONE);
}

/* Kimi's slicing (400,000-character windows, runs of at most 25,000 Python-space or non-space
 * characters) against a direct transcription of tokenization_kimi.py's loop: encoding the whole
 * text must equal encoding the slices one by one. Runs straddle the limit with every kind of
 * space (0x1C is a Python space but not a regex one) and multi-byte characters. */
static int py_space(uint32_t c) { return (toku_flags(c) & TOKU_PYSPACE) != 0; }

TEST(tok_kimi_slicing)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    static const char *units[] = {"a", " ", "\t", "\x1C", "\xC2\xA0", "\xE4\xB8\xAD", "b ", "\n"};
    uint64_t st = 77;
    for (int r = 0; r < 6; r++) {
        size_t cap = 1 << 20, n = 0;
        char *s = malloc(cap + 256);
        CHECK(s);
        while (n < (r < 4 ? 160000u : (size_t)cap - 200000)) {
            const char *u = units[tt_rand(&st) % 8];
            size_t reps = tt_rand(&st) % 3 == 0 ? 24990 + tt_rand(&st) % 20 : 1 + tt_rand(&st) % 40;
            size_t ul = strlen(u);
            if (n + reps * ul > cap)
                break;
            for (size_t k = 0; k < reps; k++, n += ul)
                memcpy(s + n, u, ul);
        }
        if (r >= 4) /* over 400,000 characters: window cuts too */
            while (n < cap - 16)
                s[n++] = "xy z"[tt_rand(&st) % 4];
        tok_ids whole = {0}, parts = {0};
        errbuf err;
        int ok = !tok_encode(t, s, n, TOK_SPECIAL_NONE, &whole, &err);
        /* tokenization_kimi.py: for each window, split at runs longer than 25,000 */
        size_t win_start = 0, chars = 0;
        const uint8_t *b = (const uint8_t *)s, *e = b + n;
        for (size_t p = 0; ok && p <= n;) {
            size_t wend = p;
            for (chars = 0; wend < n && chars < 400000; chars++) {
                int l;
                toku_next(b + wend, e, &l);
                wend += (size_t)l;
            }
            size_t start = win_start, cur = 0;
            int is_sp = -1;
            for (size_t q = win_start; q < wend;) {
                int l;
                int now = py_space(toku_next(b + q, e, &l));
                if (is_sp < 0)
                    is_sp = now;
                if (is_sp != now) {
                    cur = 1;
                    is_sp = now;
                } else if (++cur > 25000) {
                    ok = ok && !tok_encode(t, s + start, q - start, TOK_SPECIAL_NONE, &parts, &err);
                    start = q;
                    cur = 1;
                }
                q += (size_t)l;
            }
            ok = ok && !tok_encode(t, s + start, wend - start, TOK_SPECIAL_NONE, &parts, &err);
            if (wend == n)
                break;
            p = win_start = wend;
        }
        ok = ok && whole.n == parts.n && !memcmp(whole.v, parts.v, whole.n * sizeof *whole.v);
        tok_ids_free(&whole);
        tok_ids_free(&parts);
        free(s);
        CHECKF(ok, "text %d (%zu bytes): slicing differs from tokenization_kimi.py's", r, n);
    }
}
