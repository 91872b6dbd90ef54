/* session_file.c — a session's state on disk (engine.h: session_save, session_load), so that a
 * restarted server resumes a conversation without recomputing it, and the model's identity that
 * such a file is checked against.
 *
 * File layout (little-endian, native floats; the header says the sizes it was written with):
 *     sfile_head                        magic, identity, positions, sizes, counts
 *     int32  tokens[n]
 *     float  rec[rec_floats]            the recurrent state after the n positions
 *     float  chunks[nchunks][chunk_floats]  every attention layer's cache rows, chunk by chunk
 *     float  logits[vocab]              of position n - 1, when has_lg
 *     { int32 pos, has_lg; float rec[rec_floats], logits[vocab] } [nck]   the checkpoints
 *     uint64 xxh3_64 of everything before it
 * Written to a temporary file and renamed into place. A load checks the magic, the identity, every
 * size against the session's, the file's length and the checksum before it changes anything, so
 * a bad file leaves the session as it was. A loaded session is the saved one: its next logits are
 * the bits the saved session (and so a cold run) would give.
 */
#include <assert.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/file.h"
#include "engine/engine_int.h"
#include "store/dfsp.h"

enum { SFILE_SAMPLES = 16, SFILE_SAMPLE = 4096 };

typedef struct sfile_head {
    char magic[8];          /* "DFSTATE1" */
    char identity[64];      /* engine_identity, hex */
    int32_t n, vocab, has_lg, nck, nchunks, pad;
    uint64_t rec_floats, chunk_floats;
} sfile_head;
_Static_assert(sizeof(sfile_head) == 112, "sfile_head has no padding");

static const char SFILE_MAGIC[8] = {'D', 'F', 'S', 'T', 'A', 'T', 'E', '1'};

/* SHA-256 of what makes the model's logits: config.json and, for a DFSP store, its manifest (which
 * holds every blob's checksum); for a Hugging Face folder each safetensors header and
 * SFILE_SAMPLES blocks of each file's data spread over it (a retrained model with the same shapes
 * differs there), without reading the whole checkpoint. */
int engine_identity(engine *e, char out[65], errbuf *err)
{
    if (e->identity[0]) {
        memcpy(out, e->identity, 65);
        return 0;
    }
    char path[4200], *buf = NULL;
    size_t n = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned mdlen = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    snprintf(path, sizeof path, "%s/config.json", engine_model_dir(e));
    if (ok && file_read_all(path, &buf, &n, err) != 0)
        goto fail;
    ok = ok && EVP_DigestUpdate(c, buf, n);
    free(buf);
    buf = NULL;
    if (e->dfsp) {
        snprintf(path, sizeof path, "%s/manifest.json", engine_model_dir(e));
        if (ok && file_read_all(path, &buf, &n, err) != 0)
            goto fail;
        ok = ok && EVP_DigestUpdate(c, buf, n);
        free(buf);
    } else {
        const st_set *st = &e->m->st;
        for (int i = 0; ok && i < st->nfiles; i++) {
            const uint8_t *d = st->files[i].map.data;
            size_t size = st->files[i].map.size;
            if (size < 8)
                continue;
            uint64_t hl = 0;
            for (int k = 7; k >= 0; k--)
                hl = (hl << 8) | d[k];
            hl = 8 + hl < size ? 8 + hl : size;
            ok = EVP_DigestUpdate(c, d, hl);
            for (int k = 0; ok && k < SFILE_SAMPLES && size > hl; k++) {
                size_t at = hl + (size - hl) / SFILE_SAMPLES * (size_t)k;
                size_t len = size - at < SFILE_SAMPLE ? size - at : SFILE_SAMPLE;
                ok = EVP_DigestUpdate(c, d + at, len);
            }
        }
    }
    ok = ok && EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    if (!ok)
        return errbuf_set(err, "%s: cannot compute the model's identity", engine_model_dir(e));
    for (int i = 0; i < 32; i++)
        snprintf(e->identity + 2 * i, 3, "%02x", md[i]);
    memcpy(out, e->identity, 65);
    return 0;
fail:
    EVP_MD_CTX_free(c);
    return -1;
}

typedef struct sfile_out {
    file_out f;
    XXH3_state_t *h;
    errbuf *err;
    int bad;
} sfile_out;

static void put(sfile_out *o, const void *p, size_t n)
{
    if (o->bad || n == 0)
        return;
    XXH3_64bits_update(o->h, p, n);
    o->bad = file_out_write(&o->f, p, n, o->err) != 0;
}

/* The caches of a session on a device backend live in its memory, which these files do not read
 * or write yet. */
static int sfile_host_only(const session *s, const char *path, errbuf *err)
{
    if (s->e->be->mem_alloc)
        return errbuf_set(err, "%s: session files hold host memory; this session's caches are on --device %s",
                          path, s->e->be->name);
    return 0;
}

int session_save(session *s, const char *path, errbuf *err)
{
    if (sfile_host_only(s, path, err) || engine_enter(s->e, err))
        return -1;
    sfile_out o = {.err = err};
    int rc = -1;
    char id[65];
    if (session_keep_pending(s, err) != 0 || engine_identity(s->e, id, err) != 0)
        goto out;
    const float *lg = session_last_logits(s);
    const int V = s->hp->vocab;
    sfile_head h = {.n = s->n, .vocab = V, .has_lg = lg != NULL, .nck = s->nck,
                    .nchunks = (s->n + BLK_KV_CHUNK - 1) / BLK_KV_CHUNK, .rec_floats = s->rec_floats,
                    .chunk_floats = s->chunk_floats};
    memcpy(h.magic, SFILE_MAGIC, 8);
    memcpy(h.identity, id, 64);
    assert(h.nchunks <= s->nchunks);
    if (!(o.h = XXH3_createState()) || XXH3_64bits_reset(o.h) != XXH_OK) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    if (file_out_open(&o.f, path, err) != 0)
        goto out;
    put(&o, &h, sizeof h);
    put(&o, s->hist, sizeof(int32_t) * (size_t)s->n);
    put(&o, s->rec[s->cur], sizeof(float) * s->rec_floats);
    for (int c = 0; c < h.nchunks; c++)
        put(&o, s->chunk_mem[c], sizeof(float) * s->chunk_floats);
    if (lg)
        put(&o, lg, sizeof(float) * (size_t)V);
    for (int i = 0; i < s->nck; i++) {
        int32_t pl[2] = {s->ck[i].pos, s->ck[i].has_lg};
        put(&o, pl, sizeof pl);
        put(&o, s->ck[i].rec, sizeof(float) * (s->rec_floats + (size_t)V));
    }
    uint64_t sum = XXH3_64bits_digest(o.h);
    if (!o.bad)
        o.bad = file_out_write(&o.f, &sum, sizeof sum, err) != 0;
    if (o.bad) {
        file_out_abort(&o.f);
        goto out;
    }
    rc = file_out_commit(&o.f, err);
out:
    XXH3_freeState(o.h);
    engine_leave(s->e);
    return rc;
}

/* the mapped file checked against the engine: header, sizes, length, checksum */
static int sfile_open(engine *e, const char *path, file_map *m, const sfile_head **hp, int verify, errbuf *err)
{
    char id[65];
    if (engine_identity(e, id, err) != 0 || file_map_open(m, path, err) != 0)
        return -1;
    const sfile_head *h = (const sfile_head *)m->data;
    const hparams *hpar = engine_hparams(e);
    int rc = -1;
    if (m->size < sizeof *h + 8 || memcmp(h->magic, SFILE_MAGIC, 8) != 0) {
        errbuf_set(err, "%s: not a Deltafin session state", path);
        goto out;
    }
    if (memcmp(h->identity, id, 64) != 0) {
        errbuf_set(err, "%s: the state of another model (identity %.12s..., this one %.12s...)", path, h->identity, id);
        goto out;
    }
    if (h->n < 1 || h->vocab != hpar->vocab || h->nck < 0 || h->has_lg < 0 || h->has_lg > 1 ||
        h->nchunks != (h->n + BLK_KV_CHUNK - 1) / BLK_KV_CHUNK) {
        errbuf_set(err, "%s: inconsistent header", path);
        goto out;
    }
    /* the length the header implies, every step checked for overflow (a crafted header must not
     * wrap it round to the file's size) */
    uint64_t V = (uint64_t)h->vocab, want = sizeof *h + 8, t;
    int over = h->rec_floats > m->size || h->chunk_floats > m->size;
    over |= __builtin_add_overflow(want, 4 * (uint64_t)h->n, &want);
    over |= __builtin_add_overflow(want, 4 * h->rec_floats, &want);
    over |= __builtin_mul_overflow((uint64_t)h->nchunks, 4 * h->chunk_floats, &t) || __builtin_add_overflow(want, t, &want);
    over |= __builtin_add_overflow(want, 4 * V * (uint64_t)h->has_lg, &want);
    over |= __builtin_mul_overflow((uint64_t)h->nck, 8 + 4 * (h->rec_floats + V), &t) || __builtin_add_overflow(want, t, &want);
    if (over || want != m->size) {
        errbuf_set(err, "%s: %zu bytes where its header says %llu (cut short?)", path, m->size, (unsigned long long)want);
        goto out;
    }
    uint64_t sum;
    memcpy(&sum, m->data + m->size - 8, 8);
    if (verify && XXH3_64bits(m->data, m->size - 8) != sum) {
        errbuf_set(err, "%s: checksum mismatch (the file is damaged)", path);
        goto out;
    }
    *hp = h;
    rc = 0;
out:
    if (rc)
        file_map_close(m);
    return rc;
}

int session_file_tokens(engine *e, const char *path, int32_t **ids, int *n, errbuf *err)
{
    file_map m;
    const sfile_head *h;
    *ids = NULL;
    *n = 0;
    if (sfile_open(e, path, &m, &h, 0, err) != 0)
        return -1;
    int32_t *v = malloc(sizeof *v * (size_t)h->n);
    if (v) {
        memcpy(v, m.data + sizeof *h, sizeof *v * (size_t)h->n);
        *ids = v;
        *n = h->n;
    }
    file_map_close(&m);
    return v ? 0 : errbuf_set(err, "%s: out of memory", path);
}

int session_load(session *s, const char *path, errbuf *err)
{
    if (sfile_host_only(s, path, err) || engine_enter(s->e, err))
        return -1;
    file_map m = {0};
    const sfile_head *h = NULL;
    int rc = -1, mapped = 0;
    if (sfile_open(s->e, path, &m, &h, 1, err) != 0)
        goto out;
    mapped = 1;
    if (h->rec_floats != s->rec_floats || h->chunk_floats != s->chunk_floats) {
        errbuf_set(err, "%s: state sizes differ from this session's", path);
        goto out;
    }
    if (h->n > s->o.context) {
        errbuf_set(err, "%s: %d positions, more than this session's %d", path, h->n, s->o.context);
        goto out;
    }
    if (session_grow(s, h->n, err) != 0)
        goto out;
    for (int i = 0; i < h->n; i++) {
        int32_t t;
        memcpy(&t, m.data + sizeof *h + 4 * (size_t)i, 4);
        if (t < 0 || t >= s->hp->vocab) {
            errbuf_set(err, "%s: token %d at position %d is outside the vocabulary", path, t, i);
            goto out;
        }
    }
    /* checked: from here nothing fails */
    const size_t V = (size_t)h->vocab, R = h->rec_floats;
    const uint8_t *p = m.data + sizeof *h;
    const int32_t *toks = (const int32_t *)p;
    p += 4 * (size_t)h->n;
    const float *rec = (const float *)p;
    p += 4 * R;
    const uint8_t *chunks = p;
    p += 4 * (size_t)h->nchunks * h->chunk_floats;
    const float *lg = h->has_lg ? (const float *)p : NULL;
    p += 4 * V * (size_t)h->has_lg;
    session_reset(s);
    memcpy(s->hist, toks, 4 * (size_t)h->n);
    for (int c = 0; c < h->nchunks; c++)
        memcpy(s->chunk_mem[c], chunks + 4 * (size_t)c * h->chunk_floats, 4 * h->chunk_floats);
    for (int i = 0; i < h->nck; i++, p += 8 + 4 * (R + V)) { /* each checkpoint: as the session took it */
        int32_t pl[2];
        memcpy(pl, p, sizeof pl);
        if (pl[0] < 1 || pl[0] > h->n)
            continue;
        s->n = pl[0];
        memcpy(s->rec[s->cur], p + 8, 4 * R);
        s->lg_n = pl[1] ? 1 : 0;
        s->lg_pos = pl[0] - 1;
        if (pl[1])
            memcpy(s->lg, p + 8 + 4 * R, 4 * V);
        session_ckpt_take(s);
    }
    s->n = h->n;
    s->pass_pos = h->n - 1;
    memcpy(s->rec[s->cur], rec, 4 * R);
    s->lg_n = lg ? 1 : 0;
    s->lg_pos = h->n - 1;
    if (lg)
        memcpy(s->lg, lg, 4 * V);
    rc = 0;
out:
    if (mapped)
        file_map_close(&m);
    engine_leave(s->e);
    return rc;
}
