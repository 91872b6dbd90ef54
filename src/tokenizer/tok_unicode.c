/* tok_unicode.c — UTF-8 output and Unicode normalization (NFC, NFD) over the generated tables.
 *
 * NFC works span by span: a code point with combining class 0 and NFC_Quick_Check=Yes (not TOKU_NFC_CHECK) is a boundary that normalization never moves across,
 * so only the span from the last such code point before a flagged one up to the next such code
 * point is decomposed, reordered and recomposed; everything else is copied. Invalid UTF-8 bytes
 * are boundaries too and are copied through unchanged (normalization never repairs input).
 */
#include "tokenizer/tok_unicode.h"

#include <stdlib.h>
#include <string.h>

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28 };
enum { NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

int toku_put(uint8_t *o, uint32_t c)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

int toku_ccc_of(uint32_t cp)
{
    if (cp < 0x300 || cp >= 0x110000u)
        return 0;
    int lo = 0, hi = toku_nccc - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t c = toku_ccc[mid] >> 8;
        if (c == cp)
            return (int)(toku_ccc[mid] & 0xFF);
        if (c < cp)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

/* Full canonical decomposition of cp appended to buf (room for 4). Returns the count. */
static int decompose(uint32_t cp, uint32_t *buf)
{
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        buf[0] = LBASE + s / NCOUNT;
        buf[1] = VBASE + (s % NCOUNT) / TCOUNT;
        if (s % TCOUNT) {
            buf[2] = TBASE + s % TCOUNT;
            return 3;
        }
        return 2;
    }
    if (cp >= 0xC0 && cp < 0x110000u) {
        int lo = 0, hi = toku_ndecomp - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            uint32_t c = toku_decomp_idx[2 * mid];
            if (c == cp) {
                uint32_t v = toku_decomp_idx[2 * mid + 1];
                int n = (int)(v & 7);
                memcpy(buf, toku_decomp_pool + (v >> 3), sizeof *buf * (size_t)n);
                return n;
            }
            if (c < cp)
                lo = mid + 1;
            else
                hi = mid - 1;
        }
    }
    buf[0] = cp;
    return 1;
}

static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    uint64_t key = (uint64_t)a << 21 | b;
    int lo = 0, hi = toku_ncomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (toku_comp_key[mid] == key)
            return toku_comp_val[mid];
        if (toku_comp_key[mid] < key)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

/* A growable byte buffer; `bad` latches an allocation failure so callers check once. */
typedef struct obuf {
    uint8_t *p;
    size_t n, cap;
    int bad;
} obuf;

static void ob_reserve(obuf *o, size_t extra)
{
    if (o->bad || o->n + extra <= o->cap)
        return;
    size_t cap = o->cap ? o->cap : 64;
    while (cap < o->n + extra)
        cap *= 2;
    uint8_t *np = realloc(o->p, cap);
    if (!np) {
        o->bad = 1;
        return;
    }
    o->p = np;
    o->cap = cap;
}

static void ob_add(obuf *o, const uint8_t *s, size_t n)
{
    ob_reserve(o, n);
    if (!o->bad) {
        memcpy(o->p + o->n, s, n);
        o->n += n;
    }
}

/* Decomposed code points of one span: grows on the heap only for absurdly long spans. */
typedef struct cpbuf {
    uint32_t *v;
    size_t n, cap;
    uint32_t local[256];
    int bad;
} cpbuf;

static void cp_push(cpbuf *b, uint32_t c)
{
    if (b->bad)
        return;
    if (b->n == b->cap) {
        size_t cap = b->cap * 2;
        uint32_t *nv = b->v == b->local ? malloc(cap * sizeof *nv) : realloc(b->v, cap * sizeof *nv);
        if (!nv) {
            b->bad = 1;
            return;
        }
        if (b->v == b->local)
            memcpy(nv, b->local, sizeof b->local);
        b->v = nv;
        b->cap = cap;
    }
    b->v[b->n++] = c;
}

/* Decomposes s[0..n) (valid UTF-8 here except for TOKU_INVALID bytes, kept as marker values
 * 0x110000 + byte) and puts combining marks in canonical order (a stable insertion sort). */
static void decompose_span(const uint8_t *s, size_t n, cpbuf *b)
{
    const uint8_t *e = s + n;
    while (s < e) {
        int len;
        uint32_t c = toku_next(s, e, &len), d[4];
        if (c == TOKU_INVALID) {
            cp_push(b, 0x110000u + s[0]);
        } else {
            int k = decompose(c, d);
            for (int i = 0; i < k; i++) {
                uint32_t x = d[i];
                int cc = toku_ccc_of(x);
                size_t j = b->n;
                cp_push(b, x);
                if (b->bad || cc == 0)
                    continue;
                while (j > 0 && toku_ccc_of(b->v[j - 1]) > cc) {
                    b->v[j] = b->v[j - 1];
                    j--;
                }
                b->v[j] = x;
            }
        }
        s += len;
    }
}

static void emit(obuf *o, const uint32_t *v, size_t n)
{
    uint8_t tmp[4];
    for (size_t i = 0; i < n; i++) {
        if (v[i] >= 0x110000u) {
            tmp[0] = (uint8_t)(v[i] - 0x110000u);
            ob_add(o, tmp, 1);
        } else {
            ob_add(o, tmp, (size_t)toku_put(tmp, v[i]));
        }
    }
}

/* Canonical composition in place (UAX #15 sample algorithm); returns the new length. */
static size_t compose_span(uint32_t *v, size_t n)
{
    if (n == 0)
        return 0;
    size_t starter = 0, out = 1;
    uint32_t sc = v[0];
    int last = toku_ccc_of(sc);
    if (last != 0)
        last = 256; /* a leading non-starter composes with nothing */
    for (size_t i = 1; i < n; i++) {
        uint32_t c = v[i];
        int cc = toku_ccc_of(c);
        uint32_t comp = (c < 0x110000u && sc < 0x110000u) ? compose(sc, c) : 0;
        if (comp && (last < cc || last == 0)) {
            v[starter] = comp;
            sc = comp;
            continue;
        }
        if (cc == 0) {
            starter = out;
            sc = c;
        }
        last = cc;
        v[out++] = c;
    }
    return out;
}

int toku_nfc_is_trivial(const uint8_t *s, size_t n)
{
    const uint8_t *e = s + n;
    while (s < e) {
        if (*s < 0xCC) { /* below U+0300 nothing combines or decomposes under NFC */
            s++;
            continue;
        }
        int len;
        uint32_t c = toku_next(s, e, &len);
        if (toku_flags(c) & TOKU_NFC_CHECK)
            return 0;
        s += len;
    }
    return 1;
}

static int is_boundary(uint32_t c) { return c == TOKU_INVALID || !(toku_flags(c) & TOKU_NFC_CHECK); }

int toku_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *outlen)
{
    obuf o = {0};
    cpbuf b;
    b.v = b.local;
    b.cap = sizeof b.local / sizeof b.local[0];
    b.bad = 0;
    const uint8_t *e = s + n, *copied = s, *p = s, *last_boundary = s;
    ob_reserve(&o, n + 16);
    while (p < e) {
        int len;
        uint32_t c = toku_next(p, e, &len);
        if (is_boundary(c)) {
            last_boundary = p;
            p += len;
            continue;
        }
        /* span = [last boundary before p, next boundary after p) */
        const uint8_t *span = last_boundary >= copied ? last_boundary : copied, *q = p + len;
        while (q < e) {
            int l2;
            uint32_t c2 = toku_next(q, e, &l2);
            if (is_boundary(c2))
                break;
            q += l2;
        }
        ob_add(&o, copied, (size_t)(span - copied));
        b.n = 0;
        decompose_span(span, (size_t)(q - span), &b);
        if (b.bad)
            break;
        emit(&o, b.v, compose_span(b.v, b.n));
        copied = p = q;
        last_boundary = q;
    }
    ob_add(&o, copied, (size_t)(e - copied));
    if (b.v != b.local)
        free(b.v);
    if (o.bad || b.bad) {
        free(o.p);
        return -1;
    }
    *out = o.p;
    *outlen = o.n;
    return 0;
}

int toku_nfd(const uint8_t *s, size_t n, uint8_t **out, size_t *outlen)
{
    obuf o = {0};
    cpbuf b;
    b.v = b.local;
    b.cap = sizeof b.local / sizeof b.local[0];
    b.bad = 0;
    const uint8_t *e = s + n, *p = s;
    ob_reserve(&o, n + 16);
    /* Decompose starter by starter so the code point buffer stays small. */
    while (p < e && !b.bad) {
        const uint8_t *q = p;
        int len;
        toku_next(q, e, &len);
        q += len;
        while (q < e) {
            uint32_t d[4], c = toku_next(q, e, &len);
            if (c == TOKU_INVALID)
                break;
            decompose(c, d);
            if (toku_ccc_of(d[0]) == 0) /* the next starter begins a new span */
                break;
            q += len;
        }
        b.n = 0;
        decompose_span(p, (size_t)(q - p), &b);
        emit(&o, b.v, b.n);
        p = q;
    }
    if (b.v != b.local)
        free(b.v);
    if (o.bad || b.bad) {
        free(o.p);
        return -1;
    }
    *out = o.p;
    *outlen = o.n;
    return 0;
}
