/* tok_encode.c — text -> ids: special tokens, Kimi's slicing, normalization, pre-tokenization, BPE,
 * serially and on all cores.
 *
 * Order of operations, as the reference code does it:
 *   Kimi (tokenization_kimi.py): 400,000-character windows -> runs of at most 25,000 space or
 *     non-space characters (Python str.isspace) -> per run, tiktoken: special tokens (if allowed)
 *     -> pattern pieces -> BPE.
 *   tokenizer.json (HF): added tokens matched in the raw text -> normalizer on each text part ->
 *     pre-tokenizer -> BPE.
 * Parallel encoding (tok_encode_parallel) cuts each text part into chunks at arbitrary character
 * boundaries, pre-tokenizes the chunks on all threads, then makes the cuts exact serially: the
 * pieces of a chunk are trusted only from the first position at which the serial scan of the
 * previous chunk would also start a search (the scan from a position depends on nothing before
 * it), and the previous chunk is extended piece by piece until that happens. BPE then runs on
 * all threads over the exact piece list. So the ids are identical to tok_encode's by construction
 * (and by test, tests/test_tok_encode.c).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"
#include "tokenizer/tok_unicode.h"

enum { KIMI_WINDOW = 400000, KIMI_RUN = 25000 };

void tok_ids_free(tok_ids *ids)
{
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

int tok_ids_push(tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 256;
        int32_t *nv = realloc(ids->v, cap * sizeof *nv);
        if (!nv)
            return -1;
        ids->v = nv;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

static int ids_append(tok_ids *ids, const int32_t *v, size_t n)
{
    if (ids->n + n > ids->cap) {
        size_t cap = ids->cap ? ids->cap : 256;
        while (cap < ids->n + n)
            cap *= 2;
        int32_t *nv = realloc(ids->v, cap * sizeof *nv);
        if (!nv)
            return -1;
        ids->v = nv;
        ids->cap = cap;
    }
    memcpy(ids->v + ids->n, v, n * sizeof *v);
    ids->n += n;
    return 0;
}

int tok_scratch_init(tok_scratch *s, const tok *t, errbuf *err)
{
    memset(s, 0, sizeof *s);
    int regex = 0;
    for (int i = 0; i < t->pt.nlev; i++)
        regex |= t->pt.lev[i].kind == PT_REGEX;
    if (regex) {
        /* JIT backtracking over a 25,000-character run needs more than the default 32 KiB stack */
        s->md = pcre2_match_data_create(4, NULL);
        s->mctx = pcre2_match_context_create(NULL);
        s->jst = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
        if (!s->md || !s->mctx || !s->jst) {
            tok_scratch_free(s);
            return errbuf_set(err, "out of memory for the regex engine");
        }
        pcre2_jit_stack_assign(s->mctx, NULL, s->jst);
    }
    return 0;
}

void tok_scratch_free(tok_scratch *s)
{
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jst);
    free(s->lv[0].v);
    free(s->lv[1].v);
    free(s->bpe);
    free(s->norm);
    memset(s, 0, sizeof *s);
}

/* ---- special tokens ---- */

static int len_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

int tok_specials_index(tok *t, errbuf *err)
{
    int n = 0;
    for (int32_t id = 0; id < t->nids; id++)
        n += t->kind[id] == TK_SPECIAL || t->kind[id] == TK_ADDED;
    t->nspec = 0;
    if (tok_smap_init(&t->spec, (size_t)n))
        return errbuf_set(err, "out of memory");
    for (int32_t id = 0; id < t->nids; id++) {
        if (t->kind[id] != TK_SPECIAL && t->kind[id] != TK_ADDED)
            continue;
        int len = (int)(t->off[id + 1] - t->off[id]);
        if (len == 0 || tok_smap_put(&t->spec, t, id) >= 0)
            continue; /* the same string twice: the lower id is found */
        t->nspec++;
        t->spec_first[t->blob[t->off[id]]] = 1;
        int k;
        for (k = 0; k < t->nspec_len && t->spec_len[k] != len; k++)
            ;
        if (k == t->nspec_len) {
            if (t->nspec_len == (int)(sizeof t->spec_len / sizeof t->spec_len[0]))
                return errbuf_set(err, "special tokens: more than 64 distinct lengths");
            t->spec_len[t->nspec_len++] = len;
        }
    }
    qsort(t->spec_len, (size_t)t->nspec_len, sizeof t->spec_len[0], len_desc);
    return 0;
}

int tok_special_find(const tok *t, const uint8_t *s, size_t from, size_t end, size_t *ms, size_t *me, int32_t *id)
{
    if (!t->nspec)
        return 0;
    for (size_t i = from; i < end; i++) {
        if (!t->spec_first[s[i]])
            continue;
        for (int k = 0; k < t->nspec_len; k++) {
            size_t l = (size_t)t->spec_len[k];
            if (l > end - i)
                continue;
            int32_t x = tok_smap_get(&t->spec, t, s + i, l);
            if (x >= 0) {
                *ms = i;
                *me = i + l;
                *id = x;
                return 1;
            }
        }
    }
    return 0;
}

/* ---- serial encoding ---- */

/* The text a part is pre-tokenized from: normalized into scratch when the normalizer changes it. */
static int normalized(const tok *t, const uint8_t *s, size_t n, tok_scratch *sc, const uint8_t **out, size_t *on,
                      errbuf *err)
{
    *out = s;
    *on = n;
    if (!t->norm || (t->norm == NORM_NFC && toku_nfc_is_trivial(s, n)))
        return 0;
    uint8_t *buf;
    size_t len;
    if ((t->norm == NORM_NFC ? toku_nfc(s, n, &buf, &len) : toku_nfd(s, n, &buf, &len)))
        return errbuf_set(err, "out of memory normalizing text");
    free(sc->norm);
    sc->norm = buf;
    sc->normcap = len;
    *out = buf;
    *on = len;
    return 0;
}

int tok_encode_plain(const tok *t, const uint8_t *s0, size_t n0, tok_scratch *sc, tok_ids *out, errbuf *err)
{
    const uint8_t *s;
    size_t n;
    if (n0 == 0)
        return 0;
    if (normalized(t, s0, n0, sc, &s, &n, err))
        return -1;
    if (tok_pretok_streamable(&t->pt)) {
        size_t pos = 0, ps, pe;
        int rc;
        while ((rc = tok_pretok_next(&t->pt, s, pos, n, sc, &ps, &pe)) > 0) {
            if (tok_bpe_piece(t, s + ps, pe - ps, sc, out))
                return errbuf_set(err, "out of memory encoding text");
            pos = pe;
        }
        return rc < 0 ? errbuf_set(err, "pre-tokenizer: regex engine error (PCRE2)") : 0;
    }
    tok_pieces pv = {0};
    int rc = tok_pretok_all(&t->pt, s, n, sc, &pv, err);
    for (size_t i = 0; !rc && i < pv.n; i++)
        if (tok_bpe_piece(t, s + pv.v[i].s, pv.v[i].e - pv.v[i].s, sc, out))
            rc = errbuf_set(err, "out of memory encoding text");
    free(pv.v);
    return rc;
}

int tok_encode_doc(const tok *t, const uint8_t *s, size_t n, int allow_special, tok_scratch *sc, tok_ids *out,
                   errbuf *err)
{
    size_t pos = 0, ms, me;
    int32_t id;
    while (allow_special && tok_special_find(t, s, pos, n, &ms, &me, &id)) {
        if (tok_encode_plain(t, s + pos, ms - pos, sc, out, err) || tok_ids_push(out, id))
            return out->n == out->cap ? errbuf_set(err, "out of memory") : -1;
        pos = me;
    }
    return tok_encode_plain(t, s + pos, n - pos, sc, out, err);
}

/* Cut positions of tokenization_kimi.py's slicing (window starts and over-long runs). */
typedef struct cuts {
    size_t *v, n, cap;
} cuts;

static int cuts_push(cuts *c, size_t pos)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        size_t *nv = realloc(c->v, cap * sizeof *nv);
        if (!nv)
            return -1;
        c->v = nv;
        c->cap = cap;
    }
    c->v[c->n++] = pos;
    return 0;
}

/* Python's str.isspace() for ASCII: \t \n \v \f \r, the separators 0x1C-0x1F, and space. */
static const uint8_t PY_ASCII_SPACE[128] = {[9] = 1,  [10] = 1, [11] = 1, [12] = 1, [13] = 1,
                                            [28] = 1, [29] = 1, [30] = 1, [31] = 1, [32] = 1};

/* Bit i of the result is set when byte i of w is a Python space (w must be all ASCII): per byte,
 * (x | 0x80) - c keeps its top bit exactly when x >= c, with no borrow into the next byte. */
static inline unsigned ascii_space_mask(uint64_t w)
{
    const uint64_t H = 0x8080808080808080ull, ONE = 0x0101010101010101ull;
    uint64_t x = w | H;
    uint64_t lt21 = ~(x - 0x21 * ONE) & H, ge09 = (x - 0x09 * ONE) & H, lt0e = ~(x - 0x0E * ONE) & H,
             ge1c = (x - 0x1C * ONE) & H;
    uint64_t sp = lt21 & ((ge09 & lt0e) | ge1c);
    return (unsigned)(((sp >> 7) * 0x0102040810204080ull) >> 56);
}

static int kimi_cuts(const uint8_t *s, size_t n, cuts *c)
{
    if (n <= KIMI_RUN) /* fewer bytes than a run may have characters: nothing to cut */
        return 0;
    size_t in_window = 0, run = 0;
    int run_space = 0;
    const uint8_t *e = s + n;
    for (size_t p = 0; p < n;) {
        /* Eight ASCII bytes at a time while no cut can fall inside them: the run state after the
         * word is its trailing same-class bytes (or the old run plus 8 if there was no change). */
        uint64_t w;
        if (p > 0 && p + 8 <= n && in_window + 8 < KIMI_WINDOW && run + 8 <= KIMI_RUN &&
            (memcpy(&w, s + p, 8), (w & 0x8080808080808080ull) == 0)) {
            unsigned m = ascii_space_mask(w), last = (m >> 7) & 1, diff = m ^ (last ? 0xFFu : 0u);
            if (!diff && (int)last == run_space) {
                run += 8;
            } else { /* the run now is the word's trailing bytes of the last byte's class */
                run = diff ? (size_t)(7 - (31 - __builtin_clz(diff))) : 8;
                run_space = (int)last;
            }
            in_window += 8;
            p += 8;
            continue;
        }
        int len = 1, sp;
        if (s[p] < 0x80)
            sp = PY_ASCII_SPACE[s[p]];
        else
            sp = (toku_flags(toku_next(s + p, e, &len)) & TOKU_PYSPACE) != 0;
        if (in_window == KIMI_WINDOW) {
            if (cuts_push(c, p))
                return -1;
            in_window = 0;
            run = 0;
            run_space = sp;
        } else if (p == 0) {
            run_space = sp;
        }
        if (run_space != sp) {
            run = 1;
            run_space = sp;
        } else if (++run > KIMI_RUN) {
            if (cuts_push(c, p))
                return -1;
            run = 1;
        }
        in_window++;
        p += (size_t)len;
    }
    return 0;
}

static int resolve(const tok *t, tok_special sp) { return sp == TOK_SPECIAL_ALL || (sp == TOK_SPECIAL_DEFAULT && t->default_all); }

int tok_encode(const tok *t, const char *text, size_t len, tok_special sp, tok_ids *out, errbuf *err)
{
    const uint8_t *s = (const uint8_t *)text;
    int allow = resolve(t, sp), rc = -1;
    tok_scratch sc;
    cuts c = {0};
    if (tok_scratch_init(&sc, t, err))
        return -1;
    if (t->kimi_slicing && kimi_cuts(s, len, &c)) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    size_t start = 0;
    for (size_t i = 0; i <= c.n; i++) {
        size_t end = i < c.n ? c.v[i] : len;
        if (tok_encode_doc(t, s + start, end - start, allow, &sc, out, err))
            goto out;
        start = end;
    }
    rc = 0;
out:
    free(c.v);
    tok_scratch_free(&sc);
    return rc;
}

int tok_stable_len(const tok *t, const char *text, size_t len, size_t *stable, errbuf *err)
{
    const uint8_t *s = (const uint8_t *)text;
    *stable = 0;
    if (len <= TOK_STABLE_MARGIN || t->pt.nlev == 0 || (t->kimi_slicing && len > KIMI_RUN) ||
        (t->norm && !(t->norm == NORM_NFC && toku_nfc_is_trivial(s, len))))
        return 0;
    tok_scratch sc;
    tok_pieces pv = {0};
    if (tok_scratch_init(&sc, t, err))
        return -1;
    int rc = 0;
    if (tok_pretok_streamable(&t->pt)) {
        size_t pos = 0, ps, pe;
        while ((rc = tok_pretok_next(&t->pt, s, pos, len, &sc, &ps, &pe)) > 0) {
            tok_pieces_push(&pv, ps, pe);
            pos = pe;
        }
        rc = rc < 0 ? errbuf_set(err, "pre-tokenizer: regex engine error (PCRE2)") : 0;
    } else {
        rc = tok_pretok_all(&t->pt, s, len, &sc, &pv, err);
    }
    if (!rc && pv.bad)
        rc = errbuf_set(err, "out of memory pre-tokenizing %zu bytes", len);
    /* the last boundary before the last piece with the margin after it */
    for (size_t i = pv.n; !rc && i-- > 1;)
        if (pv.v[i].s + TOK_STABLE_MARGIN <= len) {
            *stable = pv.v[i].s;
            break;
        }
    free(pv.v);
    tok_scratch_free(&sc);
    return rc;
}

/* ---- parallel encoding ---- */

/* A part of the input: text to pre-tokenize and BPE, or one special id. */
typedef struct pdoc {
    const uint8_t *s;
    size_t n;
    int32_t special; /* >= 0: a special token, s/n unused */
} pdoc;

/* A chunk of a part, pre-tokenized on its own. */
typedef struct unit {
    size_t doc, from, to;
    tok_pieces pv;
    size_t first; /* pieces before this index are not the serial ones */
} unit;

typedef struct pjob {
    const tok *t;
    pdoc *docs;
    size_t ndocs;
    unit *units;
    size_t nunits;
    size_t bounds[2][257]; /* per thread slot: units to pre-tokenize, units to BPE */
    int phase;
    tok_ids outs[256];
    int rc[256];
    errbuf errs[256];
} pjob;

static void pjob_run(void *ctx, int begin, int end, int tid)
{
    pjob *j = ctx;
    (void)tid;
    for (int slot = begin; slot < end; slot++) {
        tok_scratch sc;
        if (tok_scratch_init(&sc, j->t, &j->errs[slot])) {
            j->rc[slot] = -1;
            continue;
        }
        if (j->phase == 0) {
            for (size_t u = j->bounds[0][slot]; u < j->bounds[0][slot + 1] && !j->rc[slot]; u++) {
                unit *un = &j->units[u];
                const pdoc *d = &j->docs[un->doc];
                if (!tok_pretok_streamable(&j->t->pt)) {
                    j->rc[slot] = tok_pretok_all(&j->t->pt, d->s, d->n, &sc, &un->pv, &j->errs[slot]);
                    continue;
                }
                size_t pos = un->from, ps, pe;
                int rc;
                tok_pieces pv = {0}; /* local: units of two threads may share a cache line */
                while ((rc = tok_pretok_next(&j->t->pt, d->s, pos, d->n, &sc, &ps, &pe)) > 0 && ps < un->to) {
                    tok_pieces_push(&pv, ps, pe);
                    pos = pe;
                }
                un->pv = pv;
                if (rc < 0 || un->pv.bad)
                    j->rc[slot] = errbuf_set(&j->errs[slot], rc < 0 ? "pre-tokenizer: regex engine error (PCRE2)"
                                                                    : "out of memory splitting text");
            }
        } else {
            tok_ids o = {0}; /* local: the slots' tok_ids share cache lines */
            for (size_t u = j->bounds[1][slot]; u < j->bounds[1][slot + 1] && !j->rc[slot]; u++) {
                const unit *un = &j->units[u];
                const pdoc *d = &j->docs[un->doc];
                int bad = d->special >= 0 ? tok_ids_push(&o, d->special) : 0;
                for (size_t k = un->first; k < un->pv.n && !bad; k++)
                    bad = tok_bpe_piece(j->t, d->s + un->pv.v[k].s, un->pv.v[k].e - un->pv.v[k].s, &sc, &o);
                if (bad)
                    j->rc[slot] = errbuf_set(&j->errs[slot], "out of memory encoding text");
            }
            j->outs[slot] = o;
        }
        tok_scratch_free(&sc);
    }
}

/* Splits items [0, n) with weights w(i) into `slots` contiguous ranges of about equal weight. */
static void balance(size_t *bounds, int slots, size_t n, size_t (*w)(const pjob *, size_t), const pjob *j)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += w(j, i) + 1;
    size_t acc = 0, i = 0;
    bounds[0] = 0;
    for (int s = 1; s < slots; s++) {
        size_t target = total / (size_t)slots * (size_t)s;
        while (i < n && acc + w(j, i) + 1 <= target)
            acc += w(j, i++) + 1;
        bounds[s] = i;
    }
    bounds[slots] = n;
}

static size_t unit_w(const pjob *j, size_t i) { return j->units[i].to - j->units[i].from; }

/* The position the scan of a synchronized chunk would search from next. */
static size_t scan_pos(const unit *un) { return un->pv.n ? un->pv.v[un->pv.n - 1].e : un->from; }

/* Makes the chunks' pieces exact (see the file comment): afterwards the pieces of unit u from
 * index units[u].first on, unit after unit, are the serial scan's pieces. */
static int sync_units(pjob *j, tok_scratch *sc, errbuf *err)
{
    const tok *t = j->t;
    unit *acc = NULL; /* the chunk holding the serial scan's latest pieces */
    size_t pos = 0;   /* where the serial scan searches next */
    for (size_t u = 0; u < j->nunits; u++) {
        unit *un = &j->units[u];
        un->first = 0;
        if (j->docs[un->doc].special >= 0)
            continue;
        if (un->from == 0) { /* a part's first chunk starts where the serial scan starts */
            acc = un;
            pos = scan_pos(un);
            continue;
        }
        const pdoc *d = &j->docs[un->doc];
        size_t k = 0, last = scan_pos(un);
        for (;;) {
            /* un searched from un->from and from the end of each of its pieces */
            if (pos == un->from) {
                un->first = 0;
                break;
            }
            while (k < un->pv.n && un->pv.v[k].e < pos)
                k++;
            if (k < un->pv.n && un->pv.v[k].e == pos) {
                un->first = k + 1;
                break;
            }
            size_t ps, pe;
            int rc = pos > last ? 0 : tok_pretok_next(&t->pt, d->s, pos, d->n, sc, &ps, &pe);
            if (rc < 0)
                return errbuf_set(err, "pre-tokenizer: regex engine error (PCRE2)");
            if (rc == 0) { /* swallowed whole by the chunks before it */
                un->first = un->pv.n;
                break;
            }
            tok_pieces_push(&acc->pv, ps, pe);
            if (acc->pv.bad)
                return errbuf_set(err, "out of memory splitting text");
            pos = pe;
        }
        if (un->first < un->pv.n || pos == last) {
            acc = un;
            pos = last;
        }
    }
    return 0;
}

int tok_encode_parallel(const tok *t, const char *text, size_t len, tok_special sp, pool *p, tok_ids *out,
                        errbuf *err)
{
    int nth = p ? pool_size(p) : 1;
    if (nth > 256)
        nth = 256;
    if (nth <= 1 || len < 4096)
        return tok_encode(t, text, len, sp, out, err);
    const uint8_t *s = (const uint8_t *)text;
    int allow = resolve(t, sp), rc = -1;
    cuts c = {0};
    pdoc *docs = NULL;
    size_t ndocs = 0, capdocs = 0;
    uint8_t **owned = NULL; /* normalized copies */
    size_t nowned = 0;
    tok_scratch sc;
    if (tok_scratch_init(&sc, t, err))
        return -1;
    pjob *j = calloc(1, sizeof *j); /* ~200 KB of per-thread slots: not for the stack */
    if (!j) {
        tok_scratch_free(&sc);
        return errbuf_set(err, "out of memory");
    }
    j->t = t;
    if (t->kimi_slicing && kimi_cuts(s, len, &c)) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    /* 1. parts: slices, split at special tokens, normalized */
    size_t start = 0;
    for (size_t i = 0; i <= c.n; i++) {
        size_t end = i < c.n ? c.v[i] : len, pos = start, ms = 0, me = 0;
        int32_t id = -1;
        for (;;) {
            int found = allow && tok_special_find(t, s, pos, end, &ms, &me, &id);
            size_t te = found ? ms : end;
            for (int k = 0; k < 2; k++) {
                if (k == 0 && te == pos)
                    continue;
                if (k == 1 && !found)
                    break;
                if (ndocs + 2 > capdocs) {
                    capdocs = capdocs ? capdocs * 2 : 64;
                    pdoc *nd = realloc(docs, capdocs * sizeof *nd);
                    uint8_t **no = realloc(owned, capdocs * sizeof *no);
                    if (nd)
                        docs = nd;
                    if (no)
                        owned = no;
                    if (!nd || !no) {
                        errbuf_set(err, "out of memory");
                        goto out;
                    }
                }
                if (k == 1) {
                    docs[ndocs++] = (pdoc){NULL, 0, id};
                    continue;
                }
                const uint8_t *ns;
                size_t nn;
                if (normalized(t, s + pos, te - pos, &sc, &ns, &nn, err))
                    goto out;
                if (ns != s + pos) { /* keep the normalized copy alive */
                    owned[nowned++] = sc.norm;
                    sc.norm = NULL;
                }
                docs[ndocs++] = (pdoc){ns, nn, -1};
            }
            if (!found)
                break;
            pos = me;
        }
        start = end;
    }
    j->docs = docs;
    j->ndocs = ndocs;
    /* 2. chunks */
    size_t chunk = len / ((size_t)nth * 8) + 1;
    if (chunk < 16384)
        chunk = 16384;
    size_t nunits = 0;
    for (size_t d = 0; d < ndocs; d++)
        nunits += docs[d].special < 0 && tok_pretok_streamable(&t->pt) ? docs[d].n / chunk + 1 : 1;
    j->units = calloc(nunits + 1, sizeof *j->units);
    if (!j->units) {
        errbuf_set(err, "out of memory");
        goto out;
    }
    for (size_t d = 0; d < ndocs; d++) {
        if (docs[d].special >= 0) { /* a unit of its own, with no pieces */
            j->units[j->nunits++] = (unit){d, 0, 0, {0}, 0};
            continue;
        }
        size_t from = 0;
        while (from < docs[d].n || from == 0) {
            size_t to = tok_pretok_streamable(&t->pt) ? from + chunk : docs[d].n;
            if (to >= docs[d].n)
                to = docs[d].n;
            while (to < docs[d].n && (docs[d].s[to] & 0xC0) == 0x80)
                to++; /* cut at a character start */
            j->units[j->nunits++] = (unit){d, from, to, {0}, 0};
            from = to;
            if (to == docs[d].n)
                break;
        }
    }
    /* 3. pre-tokenize chunks on all threads */
    balance(j->bounds[0], nth, j->nunits, unit_w, j);
    j->phase = 0;
    pool_for(p, nth, pjob_run, j);
    for (int k = 0; k < nth; k++)
        if (j->rc[k]) {
            *err = j->errs[k];
            goto out;
        }
    /* 4. exact cuts, 5. BPE on all threads */
    if (sync_units(j, &sc, err))
        goto out;
    balance(j->bounds[1], nth, j->nunits, unit_w, j);
    j->phase = 1;
    pool_for(p, nth, pjob_run, j);
    for (int k = 0; k < nth; k++)
        if (j->rc[k]) {
            *err = j->errs[k];
            goto out;
        }
    for (int k = 0; k < nth; k++)
        if (ids_append(out, j->outs[k].v, j->outs[k].n)) {
            errbuf_set(err, "out of memory");
            goto out;
        }
    rc = 0;
out:
    for (size_t u = 0; u < j->nunits; u++)
        free(j->units[u].pv.v);
    for (int k = 0; k < 256; k++)
        tok_ids_free(&j->outs[k]);
    for (size_t k = 0; k < nowned; k++)
        free(owned[k]);
    free(owned);
    free(j->units);
    free(j);
    free(docs);
    free(c.v);
    tok_scratch_free(&sc);
    return rc;
}
