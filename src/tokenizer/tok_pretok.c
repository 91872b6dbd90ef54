/* tok_pretok.c — pre-tokenization: cutting text into the pieces that BPE then encodes one by one.
 *
 * Two engines, proven equal by tests/test_tok_pretok.c on every test text:
 *   1. Hand-written scanners for the patterns we ship (Kimi's, o200k's, cl100k's, Qwen's). Each
 *      follows the backtracking semantics of the reference engines exactly: alternatives are
 *      tried in order, the first that matches wins, quantifiers are greedy and give back one
 *      character at a time. The derivations of the shortcuts are in the comments.
 *   2. PCRE2 (JIT) for any other pattern, after translating fancy-regex / Oniguruma syntax:
 *      `[A&&B]` (class intersection, which PCRE2 10.42 lacks) becomes `(?:(?=B)A)`, a bare script
 *      name becomes Script (`\p{sc:Han}`; PCRE2's bare `\p{Han}` means Script_Extensions, which
 *      would put 、 and 。 into Han runs), `\s` becomes White_Space exactly, and every property
 *      gains the code points that the reference engines (Unicode 16) assign to it but PCRE2's
 *      Unicode 14 tables do not.
 * Invariants: a scanner piece is never empty and never crosses `end`; the scan from a given
 * position depends only on the text from that position to `end` (no look-behind), which is what
 * lets tok_encode_parallel cut a document anywhere and resynchronize.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

/* ---- the known patterns (exact strings, as the reference files spell them) ---- */

static const char PAT_KIMI[] =
    "[\\p{Han}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|"
    "\\s+";
static const char PAT_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
    "\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|"
    "\\s+";
static const char PAT_CL100K[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *tok_pretok_pattern(int kind)
{
    switch (kind) {
    case PT_KIMI:
        return PAT_KIMI;
    case PT_O200K:
        return PAT_O200K;
    case PT_CL100K:
        return PAT_CL100K;
    case PT_QWEN:
        return PAT_QWEN;
    default:
        return NULL;
    }
}

/* ---- hand scanners ---- */

static inline unsigned cls(const uint8_t *s, size_t i, size_t end, uint32_t *cp, int *len)
{
    if (s[i] < 0x80) {
        *cp = s[i];
        *len = 1;
        return toku_flags(s[i]);
    }
    *cp = toku_next(s + i, s + end, len);
    return toku_flags(*cp);
}

/* Letter classes of Kimi / o200k: U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}],
 * both minus Script=Han when `han` (Kimi's `&&[^\p{Han}]`). */
#define F_U (TOKU_LU | TOKU_LT | TOKU_LM | TOKU_LO | TOKU_M)
#define F_W (TOKU_LL | TOKU_LM | TOKU_LO | TOKU_M)
static inline int in_set(unsigned f, unsigned set, int han) { return (f & set) && !(han && (f & TOKU_HAN)); }
/* [^\r\n\p{L}\p{N}] */
static inline int is_p(uint32_t c, unsigned f) { return c != '\r' && c != '\n' && !(f & (TOKU_L | TOKU_N)); }
/* [^\s\p{L}\p{N}] */
static inline int is_q(unsigned f) { return !(f & (TOKU_WS | TOKU_L | TOKU_N)); }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at r: its end, or r. Case-insensitive matching of these letters
 * also accepts U+017F (ſ) for s — the only non-ASCII simple case fold among them (checked
 * against tiktoken in gen_extra.py's probe). */
static size_t contraction(const uint8_t *s, size_t r, size_t end)
{
    if (r + 1 >= end || s[r] != '\'')
        return r;
    uint8_t a = s[r + 1] | 0x20; /* folds only ASCII letters onto their lower case */
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return r + 2;
    if (s[r + 1] == 0xC5 && r + 2 < end && s[r + 2] == 0xBF)
        return r + 3;
    if (r + 2 < end) {
        uint8_t b = s[r + 2] | 0x20;
        if ((a == 'r' || a == 'v') && b == 'e')
            return r + 3;
        if (a == 'l' && b == 'l')
            return r + 3;
    }
    return r;
}

/* U*W+ from s0 as a backtracking engine does it: U* takes the longest run [s0, j); if the
 * character at j is in W, W+ extends from j. Otherwise U* gives back characters one at a time
 * until W+ can match a single character k < j that is in W (and since everything between k and
 * j is in U but not W, W+ stops right after k). No such k: no match. */
static long scan_uw(const uint8_t *s, size_t s0, size_t end, int han)
{
    size_t j = s0, lastw = 0;
    int have = 0, len;
    uint32_t c;
    unsigned f = 0;
    while (j < end) {
        f = cls(s, j, end, &c, &len);
        if (!in_set(f, F_U, han))
            break;
        if (in_set(f, F_W, han)) {
            have = 1;
            lastw = j + (size_t)len;
        }
        j += (size_t)len;
    }
    if (j < end && in_set(f, F_W, han)) {
        while (j < end) {
            f = cls(s, j, end, &c, &len);
            if (!in_set(f, F_W, han))
                break;
            j += (size_t)len;
        }
        return (long)j;
    }
    return have ? (long)lastw : -1;
}

/* U+W* from s0: greedy U+ then W* (which cannot fail). */
static long scan_uplus_w(const uint8_t *s, size_t s0, size_t end, int han)
{
    size_t j = s0;
    int len;
    uint32_t c;
    if (j >= end || !in_set(cls(s, j, end, &c, &len), F_U, han))
        return -1;
    while (j < end && in_set(cls(s, j, end, &c, &len), F_U, han))
        j += (size_t)len;
    while (j < end && in_set(cls(s, j, end, &c, &len), F_W, han))
        j += (size_t)len;
    return (long)j;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at i (s[i] is white space). \s* backtracks to the last CR/LF of
 * the run, [\r\n]+ then takes just that one; \s+(?!\S) gives back the run's last character when
 * a non-space follows (if that leaves at least one); else \s+ takes the run. */
static size_t scan_space(const uint8_t *s, size_t i, size_t end)
{
    size_t j = i, last = i, lastnl = (size_t)-1;
    int len;
    uint32_t c;
    while (j < end) {
        unsigned f = cls(s, j, end, &c, &len);
        if (!(f & TOKU_WS))
            break;
        if (c == '\r' || c == '\n')
            lastnl = j;
        last = j;
        j += (size_t)len;
    }
    if (lastnl != (size_t)-1)
        return lastnl + 1;
    if (j == end || last == i)
        return j;
    return last;
}

/* " ?[^\s\p{L}\p{N}]+[\r\n]*" (with '/' in the tail for o200k) at i, or i when it does not match. */
static size_t scan_punct(const uint8_t *s, size_t i, size_t end, int slash)
{
    size_t q = i;
    int len;
    uint32_t c;
    if (s[i] == ' ' && i + 1 < end && is_q(cls(s, i + 1, end, &c, &len)))
        q = i + 1;
    if (!is_q(cls(s, q, end, &c, &len)))
        return i;
    size_t j = q;
    while (j < end && is_q(cls(s, j, end, &c, &len)))
        j += (size_t)len;
    while (j < end && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')))
        j++;
    return j;
}

static size_t scan_kimi(const uint8_t *s, size_t i, size_t end, int han, int slash)
{
    int l0, len;
    uint32_t c0, c;
    unsigned f0 = cls(s, i, end, &c0, &l0);
    if (han && (f0 & TOKU_HAN)) { /* [\p{Han}]+ */
        size_t j = i + (size_t)l0;
        while (j < end && (cls(s, j, end, &c, &len) & TOKU_HAN))
            j += (size_t)len;
        return j;
    }
    int p0 = is_p(c0, f0) && i + (size_t)l0 < end;
    long r;
    /* P?U*W+contraction? : with the optional prefix first, then without */
    if ((p0 && (r = scan_uw(s, i + (size_t)l0, end, han)) >= 0) || (r = scan_uw(s, i, end, han)) >= 0)
        return contraction(s, (size_t)r, end);
    /* P?U+W*contraction? */
    if ((p0 && (r = scan_uplus_w(s, i + (size_t)l0, end, han)) >= 0) || (r = scan_uplus_w(s, i, end, han)) >= 0)
        return contraction(s, (size_t)r, end);
    if (f0 & TOKU_N) { /* \p{N}{1,3} */
        size_t j = i + (size_t)l0;
        for (int k = 1; k < 3 && j < end && (cls(s, j, end, &c, &len) & TOKU_N); k++)
            j += (size_t)len;
        return j;
    }
    size_t j = scan_punct(s, i, end, slash);
    if (j > i)
        return j;
    if (f0 & TOKU_WS)
        return scan_space(s, i, end);
    return i + (size_t)l0; /* unreachable: every code point is in one of the classes above */
}

static size_t scan_cl100k(const uint8_t *s, size_t i, size_t end, int maxdig)
{
    int l0, len;
    uint32_t c0, c;
    if (s[i] == '\'') {
        size_t r = contraction(s, i, end);
        if (r > i)
            return r;
    }
    unsigned f0 = cls(s, i, end, &c0, &l0);
    size_t j = i + (size_t)l0;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (is_p(c0, f0) && j < end && (cls(s, j, end, &c, &len) & TOKU_L)) {
        while (j < end && (cls(s, j, end, &c, &len) & TOKU_L))
            j += (size_t)len;
        return j;
    }
    if (f0 & TOKU_L) {
        while (j < end && (cls(s, j, end, &c, &len) & TOKU_L))
            j += (size_t)len;
        return j;
    }
    if (f0 & TOKU_N) {
        for (int k = 1; k < maxdig && j < end && (cls(s, j, end, &c, &len) & TOKU_N); k++)
            j += (size_t)len;
        return j;
    }
    size_t q = scan_punct(s, i, end, 0);
    if (q > i)
        return q;
    if (f0 & TOKU_WS)
        return scan_space(s, i, end);
    return i + (size_t)l0;
}

size_t tok_pretok_scan(int kind, const uint8_t *s, size_t i, size_t end)
{
    switch (kind) {
    case PT_KIMI:
        return scan_kimi(s, i, end, 1, 0);
    case PT_O200K:
        return scan_kimi(s, i, end, 0, 1);
    case PT_CL100K:
        return scan_cl100k(s, i, end, 3);
    default:
        return scan_cl100k(s, i, end, 1);
    }
}

/* ---- translation to PCRE2 ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int bad;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->bad = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_add(b, tmp, n < 0 ? 0 : (size_t)n);
}

static void sb_range(sbuf *b, uint32_t lo, uint32_t hi)
{
    if (lo == hi)
        sb_fmt(b, "\\x{%X}", lo);
    else
        sb_fmt(b, "\\x{%X}-\\x{%X}", lo, hi);
}

/* White_Space, as \s means in the reference engines (PCRE2's \s would add U+180E). */
static const uint32_t WS_RANGES[][2] = {{0x09, 0x0D}, {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                                        {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                        {0x205F, 0x205F}, {0x3000, 0x3000}};

static void sb_ws(sbuf *b)
{
    for (size_t i = 0; i < sizeof WS_RANGES / sizeof WS_RANGES[0]; i++)
        sb_range(b, WS_RANGES[i][0], WS_RANGES[i][1]);
}

static const struct {
    const char *name, *pcre;
    unsigned mask;
} PROPS[] = {
    {"L", "\\p{L}", TOKU_L},       {"Letter", "\\p{L}", TOKU_L},       {"Lu", "\\p{Lu}", TOKU_LU},
    {"Ll", "\\p{Ll}", TOKU_LL},    {"Lt", "\\p{Lt}", TOKU_LT},         {"Lm", "\\p{Lm}", TOKU_LM},
    {"Lo", "\\p{Lo}", TOKU_LO},    {"M", "\\p{M}", TOKU_M},            {"Mark", "\\p{M}", TOKU_M},
    {"N", "\\p{N}", TOKU_N},       {"Number", "\\p{N}", TOKU_N},       {"P", "\\p{P}", TOKU_P},
    {"Punctuation", "\\p{P}", TOKU_P}, {"S", "\\p{S}", TOKU_S},        {"Symbol", "\\p{S}", TOKU_S},
    {"Han", "\\p{sc:Han}", TOKU_HAN}, {"Hani", "\\p{sc:Han}", TOKU_HAN}, {"sc=Han", "\\p{sc:Han}", TOKU_HAN},
    {"Script=Han", "\\p{sc:Han}", TOKU_HAN},
};
enum { NPROPS = sizeof PROPS / sizeof PROPS[0] };

typedef struct xlat {
    const char *p, *end; /* pattern cursor */
    sbuf add[NPROPS];    /* additions per property, computed on first use */
    int have[NPROPS];
    char err[160];
} xlat;

/* Code points our tables put in property i that PCRE2 does not: as class ranges. */
static void additions(xlat *x, int i)
{
    if (x->have[i])
        return;
    x->have[i] = 1;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)PROPS[i].pcre, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec, &eo, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create(1, NULL) : NULL;
    if (!md) {
        pcre2_code_free(re);
        x->add[i].bad = 1;
        return;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    uint32_t lo = 0, prev = 0;
    int open = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c == 0xD800)
            c = 0xE000;
        if (!(toku_flags(c) & PROPS[i].mask))
            continue;
        uint8_t u[4];
        int n = toku_put(u, c);
        if (pcre2_match(re, u, (size_t)n, 0, 0, md, NULL) >= 0)
            continue;
        if (open && c == prev + 1) {
            prev = c;
            continue;
        }
        if (open)
            sb_range(&x->add[i], lo, prev);
        lo = prev = c;
        open = 1;
    }
    if (open)
        sb_range(&x->add[i], lo, prev);
    if (!x->add[i].p)
        sb_add(&x->add[i], "", 0);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
}

/* \p{Name} / \pL at x->p (just after the 'p' or 'P'): the class body for it, into out. */
static int prop_body(xlat *x, sbuf *out)
{
    char name[64];
    size_t n = 0;
    if (x->p < x->end && *x->p == '{') {
        x->p++;
        while (x->p < x->end && *x->p != '}' && n + 1 < sizeof name)
            name[n++] = *x->p++;
        if (x->p >= x->end || *x->p != '}') {
            snprintf(x->err, sizeof x->err, "unterminated \\p{...}");
            return -1;
        }
        x->p++;
    } else if (x->p < x->end) {
        name[n++] = *x->p++;
    }
    name[n] = 0;
    for (int i = 0; i < NPROPS; i++)
        if (!strcmp(name, PROPS[i].name)) {
            additions(x, i);
            sb_str(out, PROPS[i].pcre);
            sb_add(out, x->add[i].p, x->add[i].n);
            return 0;
        }
    /* Anything else goes to PCRE2 as is; a bare script name means Script there too. */
    int gc = n <= 2 && strchr("LMNPSZC", name[0]);
    for (size_t i = 0; i < n; i++)
        if (name[i] == '=')
            name[i] = ':';
    sb_fmt(out, "\\p{%s%s}", gc || strchr(name, ':') ? "" : "sc:", name);
    return 0;
}

/* A character escape at x->p (after the backslash) as a code point; -1 if it is not one. */
static long char_escape(xlat *x)
{
    char e = *x->p;
    switch (e) {
    case 'n': x->p++; return '\n';
    case 'r': x->p++; return '\r';
    case 't': x->p++; return '\t';
    case 'f': x->p++; return '\f';
    case 'v': x->p++; return '\v';
    case 'a': x->p++; return 7;
    case 'e': x->p++; return 27;
    case '0': x->p++; return 0;
    case 'x':
    case 'u': {
        x->p++;
        int brace = x->p < x->end && *x->p == '{';
        if (brace)
            x->p++;
        long v = 0;
        int digits = 0, max = brace ? 8 : (e == 'x' ? 2 : 4);
        while (x->p < x->end && digits < max) {
            char h = *x->p;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0)
                break;
            v = v * 16 + d;
            digits++;
            x->p++;
        }
        if (brace) {
            if (x->p >= x->end || *x->p != '}')
                return -1;
            x->p++;
        }
        return digits ? v : -1;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return -1;
        x->p++;
        return (unsigned char)e; /* an escaped punctuation character stands for itself */
    }
}

static long literal(xlat *x)
{
    int len;
    uint32_t c = toku_next((const uint8_t *)x->p, (const uint8_t *)x->end, &len);
    x->p += len;
    return c == TOKU_INVALID ? -1 : (long)c;
}

/* One operand of a class (items up to "&&" or "]"): `simple` gets bracket-body text, `alts`
 * whole expressions for items that cannot live inside one bracket. */
static int class_body(xlat *x, sbuf *simple, sbuf *alts, int *nalts);

/* Parses a class after its '['; writes a one-character expression. If the class is a plain
 * union, *body gets its bracket body (so a parent class can inline it) and *is_simple = 1. */
static int class_expr(xlat *x, sbuf *expr, sbuf *body, int *is_simple)
{
    int neg = 0;
    if (x->p < x->end && *x->p == '^') {
        neg = 1;
        x->p++;
    }
    sbuf ops[8] = {{0}};
    int nops = 0, rc = -1, simple_union = 0;
    for (;;) {
        if (nops == 8) {
            snprintf(x->err, sizeof x->err, "too many && in one class");
            goto out;
        }
        sbuf s = {0}, a = {0};
        int nalts = 0;
        if (class_body(x, &s, &a, &nalts)) {
            free(s.p);
            free(a.p);
            goto out;
        }
        /* operand expression */
        if (nalts == 0) {
            if (nops == 0 && x->p < x->end && *x->p == ']')
                simple_union = 1, sb_add(body, s.p ? s.p : "", s.n);
            sb_str(&ops[nops], s.n ? "[" : "(?!)");
            if (s.n)
                sb_add(&ops[nops], s.p, s.n), sb_str(&ops[nops], "]");
        } else {
            sb_str(&ops[nops], "(?:");
            if (s.n)
                sb_str(&ops[nops], "["), sb_add(&ops[nops], s.p, s.n), sb_str(&ops[nops], "]|");
            sb_add(&ops[nops], a.p, a.n);
            sb_str(&ops[nops], ")");
        }
        free(s.p);
        free(a.p);
        nops++;
        if (x->p >= x->end) {
            snprintf(x->err, sizeof x->err, "unterminated character class");
            goto out;
        }
        if (*x->p == ']') {
            x->p++;
            break;
        }
        x->p += 2; /* "&&" */
    }
    *is_simple = simple_union && nops == 1 && !neg;
    if (nops == 1 && simple_union && neg) {
        sb_str(expr, "[^");
        sb_add(expr, body->p ? body->p : "", body->n);
        sb_str(expr, "]");
    } else {
        sbuf e = {0};
        sb_str(&e, "(?:");
        for (int i = 1; i < nops; i++)
            sb_str(&e, "(?="), sb_add(&e, ops[i].p, ops[i].n), sb_str(&e, ")");
        sb_add(&e, ops[0].p, ops[0].n);
        sb_str(&e, ")");
        if (neg)
            sb_str(expr, "(?:(?!"), sb_add(expr, e.p, e.n), sb_str(expr, ")(?s:.))");
        else
            sb_add(expr, e.p, e.n);
        free(e.p);
    }
    rc = 0;
out:
    for (int i = 0; i < 8; i++)
        free(ops[i].p);
    return rc;
}

static int class_body(xlat *x, sbuf *s, sbuf *a, int *nalts)
{
    int first = 1;
    while (x->p < x->end) {
        char ch = *x->p;
        if (ch == ']' && !first)
            return 0;
        if (ch == '&' && x->p + 1 < x->end && x->p[1] == '&')
            return 0;
        first = 0;
        long lo = -1;
        if (ch == '[' && !(x->p + 1 < x->end && x->p[1] == ':')) {
            x->p++;
            sbuf e = {0}, b = {0};
            int simple = 0;
            if (class_expr(x, &e, &b, &simple)) {
                free(e.p);
                free(b.p);
                return -1;
            }
            if (simple) {
                sb_add(s, b.p ? b.p : "", b.n);
            } else {
                if ((*nalts)++)
                    sb_str(a, "|");
                sb_add(a, e.p, e.n);
            }
            free(e.p);
            free(b.p);
            continue;
        }
        if (ch == '\\' && x->p + 1 < x->end) {
            x->p++;
            char e = *x->p;
            if (e == 'p' || e == 'P') {
                x->p++;
                sbuf pb = {0};
                if (prop_body(x, &pb)) {
                    free(pb.p);
                    return -1;
                }
                if (e == 'p') {
                    sb_add(s, pb.p, pb.n);
                } else {
                    if ((*nalts)++)
                        sb_str(a, "|");
                    sb_str(a, "[^"), sb_add(a, pb.p, pb.n), sb_str(a, "]");
                }
                free(pb.p);
                continue;
            }
            if (e == 's' || e == 'S') {
                x->p++;
                if (e == 's') {
                    sb_ws(s);
                } else {
                    if ((*nalts)++)
                        sb_str(a, "|");
                    sb_str(a, "[^"), sb_ws(a), sb_str(a, "]");
                }
                continue;
            }
            lo = char_escape(x);
            if (lo < 0) { /* \d, \w, ...: PCRE2 knows them */
                sb_add(s, x->p - 1, 2);
                x->p++;
                continue;
            }
        } else {
            lo = literal(x);
            if (lo < 0) {
                snprintf(x->err, sizeof x->err, "invalid UTF-8 in character class");
                return -1;
            }
        }
        long hi = lo;
        if (x->p + 1 < x->end && *x->p == '-' && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\' && x->p + 1 < x->end) {
                x->p++;
                hi = char_escape(x);
            } else {
                hi = literal(x);
            }
            if (hi < lo) {
                snprintf(x->err, sizeof x->err, "bad range in character class");
                return -1;
            }
        }
        sb_range(s, (uint32_t)lo, (uint32_t)hi);
    }
    snprintf(x->err, sizeof x->err, "unterminated character class");
    return -1;
}

/* Whole pattern. */
static int translate(xlat *x, sbuf *out)
{
    while (x->p < x->end) {
        char ch = *x->p;
        if (ch == '[') {
            x->p++;
            sbuf e = {0}, b = {0};
            int simple = 0;
            int rc = class_expr(x, &e, &b, &simple);
            if (!rc)
                sb_add(out, e.p, e.n);
            free(e.p);
            free(b.p);
            if (rc)
                return -1;
            continue;
        }
        if (ch == '\\' && x->p + 1 < x->end) {
            char e = x->p[1];
            if (e == 'p' || e == 'P') {
                x->p += 2;
                sbuf pb = {0};
                if (prop_body(x, &pb)) {
                    free(pb.p);
                    return -1;
                }
                sb_str(out, e == 'p' ? "[" : "[^");
                sb_add(out, pb.p, pb.n);
                sb_str(out, "]");
                free(pb.p);
                continue;
            }
            if (e == 's' || e == 'S') {
                x->p += 2;
                sb_str(out, e == 's' ? "[" : "[^");
                sb_ws(out);
                sb_str(out, "]");
                continue;
            }
            if (e == 'u') { /* \u{...} and \uHHHH are not PCRE2 syntax */
                x->p++;
                long c = char_escape(x);
                if (c < 0) {
                    snprintf(x->err, sizeof x->err, "bad \\u escape");
                    return -1;
                }
                sb_fmt(out, "\\x{%lX}", (unsigned long)c);
                continue;
            }
            sb_add(out, x->p, 2);
            x->p += 2;
            continue;
        }
        sb_add(out, x->p, 1);
        x->p++;
    }
    return 0;
}

int tok_pretok_level(tok_pt_level *lv, const char *pat, size_t patlen, int force_regex, const char *where,
                     errbuf *err)
{
    memset(lv, 0, sizeof *lv);
    lv->behavior = SPLIT_ISOLATED;
    static const struct {
        const char *pat;
        int kind;
    } known[] = {{PAT_KIMI, PT_KIMI}, {PAT_O200K, PT_O200K}, {PAT_CL100K, PT_CL100K}, {PAT_QWEN, PT_QWEN}};
    if (!force_regex)
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (strlen(known[i].pat) == patlen && !memcmp(known[i].pat, pat, patlen)) {
                lv->kind = known[i].kind;
                return 0;
            }
    xlat x;
    memset(&x, 0, sizeof x);
    x.p = pat;
    x.end = pat + patlen;
    sbuf out = {0};
    int rc = translate(&x, &out);
    for (int i = 0; i < NPROPS; i++) {
        rc |= x.add[i].bad ? -1 : 0;
        free(x.add[i].p);
    }
    if (rc || out.bad) {
        free(out.p);
        return errbuf_set(err, "%s: pre-tokenizer pattern: %s at offset %d", where,
                          x.err[0] ? x.err : "out of memory", (int)(x.p - pat));
    }
    int ec;
    PCRE2_SIZE eo;
    lv->re = pcre2_compile((PCRE2_SPTR)out.p, out.n, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!lv->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        free(out.p);
        return errbuf_set(err, "%s: pre-tokenizer pattern: %s (PCRE2, translated offset %d)", where, (char *)msg,
                          (int)eo);
    }
    free(out.p);
    pcre2_jit_compile(lv->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when JIT is unavailable */
    lv->kind = PT_REGEX;
    return 0;
}

void tok_pretok_free(tok_pretok *pt)
{
    for (int i = 0; i < pt->nlev; i++)
        pcre2_code_free(pt->lev[i].re);
    pt->nlev = 0;
}

int tok_pretok_streamable(const tok_pretok *pt)
{
    return pt->nlev == 1 && (pt->lev[0].kind != PT_REGEX || (pt->lev[0].behavior == SPLIT_ISOLATED && !pt->lev[0].invert));
}

/* First regex match in s[pos..end): 1 with [*ms, *me), 0 when none, -1 on an engine error. Empty
 * matches are skipped (no pattern we load produces them; skipping keeps the scan moving). */
static int re_find(const tok_pt_level *lv, const uint8_t *s, size_t pos, size_t end, tok_scratch *sc, size_t *ms,
                   size_t *me)
{
    while (pos <= end) {
        int rc = pcre2_match(lv->re, s, end, pos, 0, sc->md, sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc < 0)
            return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        pos = ov[0] + 1;
        while (pos < end && (s[pos] & 0xC0) == 0x80)
            pos++;
    }
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t a, size_t b)
{
    while (a < b) {
        int len;
        if (toku_next(s + a, s + b, &len) == TOKU_INVALID)
            return 0;
        a += (size_t)len;
    }
    return 1;
}

int tok_pretok_next(const tok_pretok *pt, const uint8_t *s, size_t pos, size_t end, tok_scratch *sc, size_t *ps,
                    size_t *pe)
{
    if (pos >= end)
        return 0;
    const tok_pt_level *lv = &pt->lev[0];
    if (lv->kind != PT_REGEX) {
        *ps = pos;
        *pe = tok_pretok_scan(lv->kind, s, pos, end);
        return 1;
    }
    for (;;) {
        size_t ms, me;
        int rc = re_find(lv, s, pos, end, sc, &ms, &me);
        if (rc < 0)
            return -1;
        if (rc == 0) { /* trailing text no alternative matches */
            ms = me = end;
        }
        if (ms > pos && !(pt->drop_gaps && valid_utf8(s, pos, ms))) {
            *ps = pos;
            *pe = ms;
            return 1;
        }
        if (rc == 0)
            return 0;
        *ps = ms;
        *pe = me;
        return 1;
    }
}

void tok_pieces_push(tok_pieces *p, size_t s, size_t e)
{
    if (p->bad)
        return;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 1024;
        tok_piece *nv = realloc(p->v, cap * sizeof *nv);
        if (!nv) {
            p->bad = 1;
            return;
        }
        p->v = nv;
        p->cap = cap;
    }
    p->v[p->n].s = s;
    p->v[p->n].e = e;
    p->n++;
}

/* Splits [a, b) of s by one level (the piece is its own subject: its end is the text's end).
 * Segments alternate gap / match (roles swap when inverted) and combine as HF's
 * SplitDelimiterBehavior says: MergedWithPrevious appends a match to the gap before it,
 * MergedWithNext prepends it to the gap after it, Contiguous joins adjacent matches. */
static int split_level(const tok_pretok *pt, const tok_pt_level *lv, const uint8_t *s, size_t a, size_t b,
                       tok_scratch *sc, tok_pieces *out)
{
    const uint8_t *base = s + a;
    size_t n = b - a;
    if (lv->kind != PT_REGEX) {
        for (size_t i = 0; i < n;) {
            size_t e = tok_pretok_scan(lv->kind, base, i, n);
            tok_pieces_push(out, a + i, a + e);
            i = e;
        }
        return 0;
    }
    size_t pos = 0, prev_end = 0, hs = 0, he = 0;
    int prev_match = 0, have = 0, held = 0; /* held: a match waiting for the gap after it */
    for (;;) {
        size_t ms, me;
        int rc = re_find(lv, base, pos, n, sc, &ms, &me);
        if (rc < 0)
            return -1;
        if (rc == 0)
            ms = me = n;
        for (int part = 0; part < 2; part++) {
            size_t ss = part ? ms : prev_end, se = part ? me : ms;
            if (se <= ss)
                continue;
            int is_match = part ^ lv->invert;
            if (pt->drop_gaps && !is_match && valid_utf8(base, ss, se))
                continue;
            switch (lv->behavior) {
            case SPLIT_REMOVED:
                if (!is_match)
                    tok_pieces_push(out, a + ss, a + se);
                break;
            case SPLIT_MERGED_PREV:
                if (is_match && have && !prev_match)
                    out->v[out->n - 1].e = a + se;
                else
                    tok_pieces_push(out, a + ss, a + se);
                break;
            case SPLIT_MERGED_NEXT:
                if (!is_match) {
                    tok_pieces_push(out, a + (held ? hs : ss), a + se);
                    held = 0;
                } else {
                    if (held)
                        tok_pieces_push(out, a + hs, a + he);
                    held = 1;
                    hs = ss;
                    he = se;
                }
                break;
            case SPLIT_CONTIGUOUS:
                if (have && is_match && prev_match)
                    out->v[out->n - 1].e = a + se;
                else
                    tok_pieces_push(out, a + ss, a + se);
                break;
            default:
                tok_pieces_push(out, a + ss, a + se);
            }
            if (out->bad)
                return -1;
            prev_match = is_match;
            have = 1;
        }
        if (rc == 0)
            break;
        pos = prev_end = me;
    }
    if (held)
        tok_pieces_push(out, a + hs, a + he);
    return 0;
}

int tok_pretok_all(const tok_pretok *pt, const uint8_t *s, size_t end, tok_scratch *sc, tok_pieces *out,
                   errbuf *err)
{
    if (pt->nlev == 0) {
        if (end)
            tok_pieces_push(out, 0, end);
        return out->bad ? errbuf_set(err, "out of memory splitting text") : 0;
    }
    tok_pieces *cur = &sc->lv[0], *nxt = &sc->lv[1];
    cur->n = 0;
    if (end)
        tok_pieces_push(cur, 0, end);
    for (int l = 0; l < pt->nlev; l++) {
        tok_pieces *dst = l == pt->nlev - 1 ? out : nxt;
        if (dst != out)
            dst->n = 0;
        for (size_t i = 0; i < cur->n; i++)
            if (split_level(pt, &pt->lev[l], s, cur->v[i].s, cur->v[i].e, sc, dst))
                return errbuf_set(err, "pre-tokenizer: regex engine error (PCRE2)");
        if (dst->bad)
            return errbuf_set(err, "out of memory splitting text");
        tok_pieces *t = cur;
        cur = nxt;
        nxt = t;
    }
    return 0;
}
