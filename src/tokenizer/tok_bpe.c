/* tok_bpe.c — the hash maps and the byte-pair merge loop shared by both vocabulary formats.
 *
 * Merge rule (tiktoken's _byte_pair_merge and HF's Word::merge_all agree): repeatedly merge the
 * adjacent pair with the lowest rank, the leftmost one on ties, until no adjacent pair has a
 * rank. tiktoken ranks a pair by the rank of the merged bytes; tokenizer.json by the pair's
 * position in `merges`. Short pieces use the quadratic scan (cache-friendly, what tiktoken does);
 * long ones a binary heap keyed (rank, position) with lazy invalidation by version numbers, so a
 * pathological 25,000-character piece costs O(n log n) and gives the same result: the heap always
 * pops the minimum (rank, leftmost position) over the pairs that currently exist.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

enum { BPE_SMALL = 64 };
#define RANK_NONE UINT32_MAX

uint32_t tok_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        for (size_t i = 0; i < n; i++)
            w |= (uint64_t)p[i] << (8 * i);
        h = (h ^ w) * 0x94D049BB133111EBull;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(h >> 32);
}

static uint64_t pow2_at_least(size_t n)
{
    uint64_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int tok_smap_init(tok_smap *m, size_t n)
{
    uint64_t cap = pow2_at_least(2 * n + 1);
    m->slot = calloc(cap, sizeof *m->slot);
    m->tag = calloc(cap, 1);
    m->mask = cap - 1;
    if (!m->slot || !m->tag) {
        tok_smap_free(m);
        return -1;
    }
    return 0;
}

void tok_smap_free(tok_smap *m)
{
    free(m->slot);
    free(m->tag);
    m->slot = NULL;
    m->tag = NULL;
}

static inline uint64_t load_short(const uint8_t *p, size_t n)
{
    uint64_t w = 0;
    memcpy(&w, p, n); /* n <= 8: little bytes first, zero padded */
    return w;
}

static inline int same_bytes(const tok *t, int32_t id, const uint8_t *p, size_t n)
{
    uint64_t a = t->off[id], b = t->off[id + 1];
    return b - a == n && memcmp(t->blob + a, p, n) == 0;
}

int32_t tok_smap_get(const tok_smap *m, const tok *t, const uint8_t *p, size_t n)
{
    uint32_t h = tok_hash(p, n), l8 = n < 255 ? (uint32_t)n : 255;
    uint8_t tag = (uint8_t)(1 + (h >> 25));
    uint64_t w = n <= 8 ? load_short(p, n) : 0;
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        if (!m->tag[i])
            return -1;
        if (m->tag[i] != tag)
            continue;
        const tok_slot *s = &m->slot[i];
        if (s->hash != h || s->idl >> 24 != l8)
            continue;
        int32_t id = (int32_t)(s->idl & 0xFFFFFF) - 1;
        if (n <= 8 ? s->inl == w : same_bytes(t, id, p, n))
            return id;
    }
}

int32_t tok_smap_put(tok_smap *m, const tok *t, int32_t id)
{
    const uint8_t *p = t->blob + t->off[id];
    size_t n = (size_t)(t->off[id + 1] - t->off[id]);
    int32_t old = tok_smap_get(m, t, p, n);
    if (old >= 0)
        return old;
    uint32_t h = tok_hash(p, n);
    uint64_t i = h & m->mask;
    while (m->tag[i])
        i = (i + 1) & m->mask;
    m->tag[i] = (uint8_t)(1 + (h >> 25));
    m->slot[i].hash = h;
    m->slot[i].idl = ((uint32_t)id + 1) | (n < 255 ? (uint32_t)n : 255) << 24;
    m->slot[i].inl = n <= 8 ? load_short(p, n) : 0;
    return -1;
}

int tok_pmap_init(tok_pmap *m, size_t n)
{
    uint64_t cap = pow2_at_least(2 * n + 1);
    m->key = malloc(cap * sizeof *m->key);
    m->val = malloc(cap * sizeof *m->val);
    m->mask = cap - 1;
    if (!m->key || !m->val) {
        tok_pmap_free(m);
        return -1;
    }
    memset(m->key, 0xFF, cap * sizeof *m->key);
    return 0;
}

void tok_pmap_free(tok_pmap *m)
{
    free(m->key);
    free(m->val);
    m->key = m->val = NULL;
}

int tok_pmap_put(tok_pmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t newid)
{
    uint64_t k = (uint64_t)a << 32 | b, h = k * 0x9E3779B97F4A7C15ull;
    for (uint64_t i = (h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k)
            return 1;
        if (m->key[i] == UINT64_MAX) {
            m->key[i] = k;
            m->val[i] = (uint64_t)rank << 32 | newid;
            return 0;
        }
    }
}

/* Rank and resulting id of merging the part [s0, s1) with [s1, s2), whose ids are a and b.
 * Two single bytes (every first round of a merge) come from the 64K-entry table built at load,
 * which stays in cache; everything else is a hash lookup. */
static inline uint32_t pair_rank(const tok *t, const uint8_t *p, size_t s0, size_t s1, size_t s2, uint32_t a,
                                 uint32_t b, uint32_t *newid)
{
    if (s2 - s0 == 2 && s1 - s0 == 1) {
        uint64_t v = t->pair2[(size_t)p[s0] << 8 | p[s0 + 1]];
        *newid = (uint32_t)v;
        return (uint32_t)(v >> 32);
    }
    if (t->hf) {
        uint32_t r;
        return tok_pmap_get(&t->merges, a, b, &r, newid) ? r : RANK_NONE;
    }
    int32_t id = tok_smap_get(&t->bytes, t, p + s0, s2 - s0);
    *newid = (uint32_t)id;
    return id < 0 ? RANK_NONE : (uint32_t)id;
}

int tok_pair2_init(tok *t)
{
    t->pair2 = malloc(65536 * sizeof *t->pair2);
    if (!t->pair2)
        return -1;
    for (int x = 0; x < 65536; x++) {
        uint8_t two[2] = {(uint8_t)(x >> 8), (uint8_t)x};
        uint32_t r = RANK_NONE, nw = 0;
        if (t->hf) {
            if (!tok_pmap_get(&t->merges, (uint32_t)t->byte_id[two[0]], (uint32_t)t->byte_id[two[1]], &r, &nw))
                r = RANK_NONE;
        } else {
            int32_t id = tok_smap_get(&t->bytes, t, two, 2);
            r = id < 0 ? RANK_NONE : (uint32_t)id;
            nw = (uint32_t)id;
        }
        t->pair2[x] = (uint64_t)r << 32 | nw;
    }
    return 0;
}

static int reserve(tok_scratch *sc, size_t n)
{
    if (n <= sc->bpecap)
        return 0;
    size_t cap = sc->bpecap ? sc->bpecap : 256;
    while (cap < n)
        cap *= 2;
    /* 5 arrays of cap words + a heap of 4-word entries with room for 3 * cap pushes */
    uint32_t *nb = realloc(sc->bpe, sizeof *nb * cap * 17);
    if (!nb)
        return -1;
    sc->bpe = nb;
    sc->bpecap = cap;
    return 0;
}

static int merge_small(const tok *t, const uint8_t *p, size_t n, tok_scratch *sc, tok_ids *out)
{
    uint32_t *st = sc->bpe, *id = st + sc->bpecap, *pr = id + sc->bpecap, *pn = pr + sc->bpecap;
    size_t m = n;
    for (size_t k = 0; k < n; k++) {
        st[k] = (uint32_t)k;
        id[k] = (uint32_t)t->byte_id[p[k]];
    }
    st[n] = (uint32_t)n;
    for (size_t k = 0; k + 1 < m; k++)
        pr[k] = pair_rank(t, p, st[k], st[k + 1], st[k + 2], id[k], id[k + 1], &pn[k]);
    while (m > 1) {
        uint32_t best = RANK_NONE;
        size_t bi = 0;
        for (size_t k = 0; k + 1 < m; k++)
            if (pr[k] < best) {
                best = pr[k];
                bi = k;
            }
        if (best == RANK_NONE)
            break;
        id[bi] = pn[bi];
        size_t tail = m - (bi + 2);
        memmove(st + bi + 1, st + bi + 2, sizeof *st * (tail + 1)); /* + the end sentinel */
        memmove(id + bi + 1, id + bi + 2, sizeof *id * tail);
        memmove(pr + bi + 1, pr + bi + 2, sizeof *pr * tail);
        memmove(pn + bi + 1, pn + bi + 2, sizeof *pn * tail);
        m--;
        if (bi + 1 < m)
            pr[bi] = pair_rank(t, p, st[bi], st[bi + 1], st[bi + 2], id[bi], id[bi + 1], &pn[bi]);
        if (bi > 0)
            pr[bi - 1] = pair_rank(t, p, st[bi - 1], st[bi], st[bi + 1], id[bi - 1], id[bi], &pn[bi - 1]);
    }
    for (size_t k = 0; k < m; k++)
        if (tok_ids_push(out, (int32_t)id[k]))
            return -1;
    return 0;
}

/* Heap entry: rank, position (part index = its first byte), version of that part, new id. */
typedef struct hent {
    uint32_t rank, pos, ver, newid;
} hent;

static inline int hless(const hent *a, const hent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void hpush(hent *h, size_t *n, hent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!hless(&e, &h[up]))
            break;
        h[i] = h[up];
        i = up;
    }
    h[i] = e;
}

static hent hpop(hent *h, size_t *n)
{
    hent top = h[0], last = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len)
            break;
        if (c + 1 < len && hless(&h[c + 1], &h[c]))
            c++;
        if (!hless(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (len)
        h[i] = last;
    return top;
}

static int merge_heap(const tok *t, const uint8_t *p, size_t n, tok_scratch *sc, tok_ids *out)
{
    size_t cap = sc->bpecap;
    uint32_t *nx = sc->bpe, *pv = nx + cap, *id = pv + cap, *ver = id + cap, *alive = ver + cap;
    hent *h = (hent *)(alive + cap);
    size_t hn = 0;
    /* parts are named by their first byte; nx[k] == n marks the last part */
    for (size_t k = 0; k < n; k++) {
        nx[k] = (uint32_t)(k + 1);
        pv[k] = (uint32_t)(k ? k - 1 : UINT32_MAX);
        id[k] = (uint32_t)t->byte_id[p[k]];
        ver[k] = 0;
        alive[k] = 1;
    }
    for (size_t k = 0; k + 1 < n; k++) {
        uint32_t nw, e2 = nx[k + 1], r = pair_rank(t, p, k, k + 1, e2, id[k], id[k + 1], &nw);
        if (r != RANK_NONE)
            hpush(h, &hn, (hent){r, (uint32_t)k, 0, nw});
    }
    while (hn) {
        hent e = hpop(h, &hn);
        uint32_t k = e.pos;
        if (!alive[k] || ver[k] != e.ver || nx[k] >= n)
            continue;
        uint32_t r = nx[k];
        /* merge part r into part k */
        id[k] = e.newid;
        alive[r] = 0;
        nx[k] = nx[r];
        if (nx[k] < n)
            pv[nx[k]] = k;
        ver[k]++;
        if (nx[k] < n) { /* the last part's nx is n, so nx[nx[k]] is the end of the right part */
            uint32_t nw, rr = pair_rank(t, p, k, nx[k], nx[nx[k]], id[k], id[nx[k]], &nw);
            if (rr != RANK_NONE)
                hpush(h, &hn, (hent){rr, k, ver[k], nw});
        }
        if (pv[k] != UINT32_MAX) {
            uint32_t l = pv[k], nw;
            ver[l]++;
            uint32_t rl = pair_rank(t, p, l, k, nx[k], id[l], id[k], &nw);
            if (rl != RANK_NONE)
                hpush(h, &hn, (hent){rl, l, ver[l], nw});
        }
    }
    for (uint32_t k = 0; k < n; k = nx[k])
        if (tok_ids_push(out, (int32_t)id[k]))
            return -1;
    return 0;
}

int tok_bpe_piece(const tok *t, const uint8_t *p, size_t n, tok_scratch *sc, tok_ids *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return tok_ids_push(out, t->byte_id[p[0]]);
    if (!t->hf || t->ignore_merges) {
        int32_t id = tok_smap_get(&t->bytes, t, p, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    if (reserve(sc, n + 1))
        return -1;
    return n <= BPE_SMALL ? merge_small(t, p, n, sc, out) : merge_heap(t, p, n, sc, out);
}

int tok_bpe_merge(const tok *t, const uint8_t *p, size_t n, int heap, tok_scratch *sc, tok_ids *out)
{
    if (n == 0)
        return 0;
    if (reserve(sc, n + 1))
        return -1;
    return heap ? merge_heap(t, p, n, sc, out) : merge_small(t, p, n, sc, out);
}
