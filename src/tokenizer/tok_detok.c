/* tok_detok.c — ids -> UTF-8, whole or streaming.
 *
 * Token bytes are concatenated (a special token contributes its name) and decoded as UTF-8 with
 * errors="replace": each maximal subpart of an ill-formed sequence (the Unicode standard's rule, what Python and
 * Rust's from_utf8_lossy do) becomes one U+FFFD. The streaming decoder emits a prefix as soon as it
 * is complete and holds back at most 3 bytes that could still become a code point; its buffers are
 * sized at init from the longest token, so feeding an id never allocates: the output of one feed
 * is at most 3 bytes per input byte (U+FFFD for each) of (held bytes + token bytes).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

/* Length of the valid sequence at s (1..4), 0 if s[0..n) is a valid but incomplete prefix, or -k
 * for an ill-formed maximal subpart of k bytes. */
static int utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t b = s[0];
    if (b < 0x80)
        return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        need = 1;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else
        return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF))
            return -i;
    }
    return need + 1;
}

size_t tok_utf8_replace(const uint8_t *in, size_t n, char *out, int final, size_t *rest)
{
    size_t i = 0, o = 0;
    *rest = 0;
    while (i < n) {
        if (in[i] < 0x80) {
            out[o++] = (char)in[i++];
            continue;
        }
        int k = utf8_seq(in + i, n - i);
        if (k > 0) {
            memcpy(out + o, in + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else if (k == 0 && !final) {
            *rest = n - i;
            break;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += k == 0 ? n - i : (size_t)-k;
        }
    }
    return o;
}

int tok_decode(const tok *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len, errbuf *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->nids || t->kind[ids[i]] == TK_UNUSED)
            return errbuf_set(err, "token id %d at position %zu is not in the vocabulary", ids[i], i);
        total += (size_t)(t->off[ids[i] + 1] - t->off[ids[i]]);
    }
    uint8_t *raw = malloc(total + 1);
    char *txt = malloc(3 * total + 1);
    if (!raw || !txt) {
        free(raw);
        free(txt);
        return errbuf_set(err, "out of memory decoding %zu ids", n);
    }
    size_t r = 0, rest;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->kind[ids[i]] == TK_SPECIAL)
            continue;
        size_t l = (size_t)(t->off[ids[i] + 1] - t->off[ids[i]]);
        memcpy(raw + r, t->blob + t->off[ids[i]], l);
        r += l;
    }
    size_t o = tok_utf8_replace(raw, r, txt, 1, &rest);
    txt[o] = 0;
    free(raw);
    *out = txt;
    *len = o;
    return 0;
}

int tok_stream_init(tok_stream *s, const tok *t, int skip_special, errbuf *err)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    s->incap = t->maxlen + 4;
    s->outcap = 3 * s->incap + 1;
    s->in = malloc(s->incap);
    s->out = malloc(s->outcap);
    if (!s->in || !s->out) {
        tok_stream_free(s);
        return errbuf_set(err, "out of memory for the detokenizer");
    }
    return 0;
}

const char *tok_stream_feed(tok_stream *s, int32_t id, size_t *len)
{
    const tok *t = s->t;
    *len = 0;
    s->out[0] = 0;
    if (id < 0 || id >= t->nids || t->kind[id] == TK_UNUSED || (s->skip_special && t->kind[id] == TK_SPECIAL))
        return s->out;
    size_t l = (size_t)(t->off[id + 1] - t->off[id]), rest;
    memcpy(s->in, s->pend, (size_t)s->npend);
    memcpy(s->in + s->npend, t->blob + t->off[id], l);
    size_t n = (size_t)s->npend + l;
    *len = tok_utf8_replace(s->in, n, s->out, 0, &rest);
    memcpy(s->pend, s->in + n - rest, rest);
    s->npend = (int)rest;
    s->out[*len] = 0;
    return s->out;
}

const char *tok_stream_flush(tok_stream *s, size_t *len)
{
    size_t rest;
    *len = tok_utf8_replace(s->pend, (size_t)s->npend, s->out, 1, &rest);
    s->npend = 0;
    s->out[*len] = 0;
    return s->out;
}

void tok_stream_free(tok_stream *s)
{
    free(s->in);
    free(s->out);
    s->in = NULL;
    s->out = NULL;
}
