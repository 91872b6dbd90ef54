/* dfsp.c — see dfsp.h: the manifest (parse, write), prepare, open. */
#include "store/dfsp.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "base/timer.h"
#include "store/spineq.h"

static const char *kind_name[3] = {"global", "spine", "expert"};

int dfsp_is_store(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    return file_exists(p);
}

int dfsp_identity(const char *hf_dir, const st_set *st, char out[65], errbuf *err)
{
    char path[4096], *cfg;
    size_t n;
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    if (file_read_all(path, &cfg, &n, err) != 0)
        return -1;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned mdlen = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, cfg, n);
    for (int i = 0; ok && i < st->nfiles; i++) {
        const uint8_t *d = st->files[i].map.data;
        uint64_t hl = 0;
        for (int k = 7; k >= 0; k--)
            hl = (hl << 8) | d[k];
        ok = EVP_DigestUpdate(c, d, 8 + hl);
    }
    ok = ok && EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    free(cfg);
    if (!ok)
        return errbuf_set(err, "%s: cannot compute the SHA-256 identity", hf_dir);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* ---- the manifest ---- */

static int kind_of(const char *s)
{
    for (int k = 0; s && k < 3; k++)
        if (strcmp(s, kind_name[k]) == 0)
            return k;
    return -1;
}

static int is_hex(const char *s, size_t n)
{
    if (!s || strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* a non-negative JSON integer at most max, else -1 */
static int64_t uint_at(const json_t *v, int64_t max)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 || x > max ? -1 : (int64_t)x;
}

enum { MAX_SIZE_BITS = 50 };

/* a manifest's "spine": absent (as released, 0) or "int8" (1); anything else -1 */
static int spine_of(const json_t *man)
{
    const json_t *sp = json_object_get(man, "spine");
    if (!sp)
        return 0;
    return json_is_string(sp) && !strcmp(json_string_value(sp), "int8") ? 1 : -1;
} /* a blob or pack above 1 PB is not a checkpoint */

static int parse_tensor(const json_t *e, const char *where, size_t b, size_t i, uint64_t size, dfsp_tensor *t,
                        errbuf *err)
{
    const json_t *shape = json_array_get(e, 2);
    const char *name = json_string_value(json_array_get(e, 0)), *dt = json_string_value(json_array_get(e, 1));
    int64_t off = uint_at(json_array_get(e, 3), (int64_t)1 << MAX_SIZE_BITS);
    if (!json_is_array(e) || json_array_size(e) != 4 || !name || !dt || (t->dtype = st_dtype_parse(dt)) < 0 ||
        !json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS || off < 0)
        return errbuf_set(err, "%s: blob %zu tensor %zu must be [name, dtype, shape, offset]", where, b, i);
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t dim = uint_at(json_array_get(shape, (size_t)d), (int64_t)1 << 40);
        if (dim < 0 || (dim && numel > (UINT64_MAX >> 4) / (uint64_t)dim))
            return errbuf_set(err, "%s: tensor '%s' has a bad shape", where, name);
        t->shape[d] = dim;
        numel *= (uint64_t)dim;
    }
    t->len = numel * (uint64_t)st_dtype_size(t->dtype);
    t->off = (uint64_t)off;
    if (t->off + t->len > size)
        return errbuf_set(err, "%s: tensor '%s' ends past its blob (%llu > %llu bytes)", where, name,
                          (unsigned long long)(t->off + t->len), (unsigned long long)size);
    if (!(t->name = strdup(name)))
        return errbuf_set(err, "%s: out of memory", where);
    return 0;
}

static int parse_blob(const json_t *jb, const char *where, size_t b, dfsp_manifest *m, dfsp_blob *x, errbuf *err)
{
    const json_t *copies = json_object_get(jb, "copies"), *ts = json_object_get(jb, "tensors");
    const char *h = json_string_value(json_object_get(jb, "xxh3"));
    int64_t size = uint_at(json_object_get(jb, "size"), (int64_t)1 << MAX_SIZE_BITS);
    x->kind = kind_of(json_string_value(json_object_get(jb, "kind")));
    x->layer = json_is_integer(json_object_get(jb, "layer")) ? (int)json_integer_value(json_object_get(jb, "layer")) : -2;
    x->expert =
        json_is_integer(json_object_get(jb, "expert")) ? (int)json_integer_value(json_object_get(jb, "expert")) : -2;
    if (x->kind < 0 || x->layer < -1 || x->layer >= MODEL_MAX_LAYERS || x->expert < -1 || x->expert >= (1 << 24) ||
        size < 0 || !is_hex(h, 16) || !json_is_array(copies) || json_array_size(copies) < 1 ||
        json_array_size(copies) > STORE_MAX_COPIES || !json_is_array(ts))
        return errbuf_set(err, "%s: blob %zu needs kind, layer, expert, size, xxh3, copies (1..%d) and tensors",
                          where, b, STORE_MAX_COPIES);
    x->size = (uint64_t)size;
    x->xxh3 = strtoull(h, NULL, 16);
    x->ncopies = (int)json_array_size(copies);
    for (int k = 0; k < x->ncopies; k++) {
        const json_t *c = json_array_get(copies, (size_t)k);
        int64_t pack = uint_at(json_array_get(c, 0), m->npacks - 1), off = uint_at(json_array_get(c, 1), INT64_MAX);
        if (!json_is_array(c) || pack < 0 || off < 0 || off % BLOB_ALIGN ||
            (uint64_t)off > m->pack_size[pack] || blob_padded(x->size) > m->pack_size[pack] - (uint64_t)off)
            return errbuf_set(err, "%s: blob %zu copy %d is not a 4 KiB-aligned range inside a pack", where, b, k);
        x->copy[k].file = (int)pack;
        x->copy[k].off = (uint64_t)off;
    }
    x->first_tensor = m->nt;
    x->ntensors = (int)json_array_size(ts);
    for (size_t i = 0; i < json_array_size(ts); i++) {
        if (parse_tensor(json_array_get(ts, i), where, b, i, x->size, &m->t[m->nt], err) != 0)
            return -1;
        m->nt++;
    }
    return 0;
}

int dfsp_manifest_parse(const json_t *man, const char *where, dfsp_manifest *m, errbuf *err)
{
    memset(m, 0, sizeof *m);
    const json_t *packs = json_object_get(man, "packs"), *blobs = json_object_get(man, "blobs");
    const char *fmt = json_string_value(json_object_get(man, "format"));
    const char *id = json_string_value(json_object_get(man, "identity"));
    int64_t ver = uint_at(json_object_get(man, "version"), 1000);
    int64_t drives = uint_at(json_object_get(man, "drives"), IO_MAX_DRIVES);
    int64_t mirrors = uint_at(json_object_get(man, "mirrors"), STORE_MAX_COPIES);
    if (!fmt || strcmp(fmt, "dfsp") != 0 || ver != DFSP_VERSION)
        return errbuf_set(err, "%s: not a DFSP version %d manifest", where, DFSP_VERSION);
    if (!is_hex(id, 64) || drives < 1 || mirrors < 1 || mirrors > drives || !json_is_array(packs) ||
        json_array_size(packs) < 1 || json_array_size(packs) > STORE_MAX_PACKS || !json_is_array(blobs))
        return errbuf_set(err, "%s: needs identity (sha256 hex), drives (1..%d), mirrors (1..drives), packs (1..%d) "
                               "and blobs",
                          where, IO_MAX_DRIVES, STORE_MAX_PACKS);
    if ((m->spine_int8 = spine_of(man)) < 0)
        return errbuf_set(err, "%s: \"spine\" must be \"int8\" when present", where);
    memcpy(m->identity, id, 65);
    m->ndrives = (int)drives;
    m->mirrors = (int)mirrors;
    m->npacks = (int)json_array_size(packs);
    for (int i = 0; i < m->npacks; i++) {
        const json_t *pk = json_array_get(packs, (size_t)i);
        const char *pp = json_string_value(json_object_get(pk, "path"));
        const char *rel = json_string_value(json_object_get(pk, "rel"));
        int64_t d = uint_at(json_object_get(pk, "drive"), m->ndrives - 1);
        int64_t size = uint_at(json_object_get(pk, "size"), (int64_t)1 << MAX_SIZE_BITS);
        if (!pp || !pp[0] || strlen(pp) >= sizeof m->pack_path[i] || d < 0 || size < 0)
            return errbuf_set(err, "%s: pack %d needs path, drive (0..%d) and size", where, i, m->ndrives - 1);
        if (rel && (!rel[0] || strlen(rel) >= sizeof m->pack_rel[i]))
            return errbuf_set(err, "%s: pack %d: \"rel\" must be a non-empty path", where, i);
        const char *base = strrchr(pp, '/') ? strrchr(pp, '/') + 1 : pp;
        if (!base[0] || strlen(base) >= sizeof m->pack_file[i])
            return errbuf_set(err, "%s: pack %d: path '%s' names no file", where, i, pp);
        snprintf(m->pack_path[i], sizeof m->pack_path[i], "%s", pp);
        snprintf(m->pack_rel[i], sizeof m->pack_rel[i], "%s", rel ? rel : "");
        snprintf(m->pack_file[i], sizeof m->pack_file[i], "%s", base);
        m->pack_drive[i] = (int)d;
        m->pack_size[i] = (uint64_t)size;
    }
    size_t nb = json_array_size(blobs), nt = 0;
    for (size_t b = 0; b < nb; b++)
        nt += json_array_size(json_object_get(json_array_get(blobs, b), "tensors"));
    m->b = calloc(nb ? nb : 1, sizeof *m->b);
    m->t = calloc(nt ? nt : 1, sizeof *m->t);
    if (!m->b || !m->t) {
        dfsp_manifest_free(m);
        return errbuf_set(err, "%s: out of memory", where);
    }
    for (size_t b = 0; b < nb; b++) {
        if (parse_blob(json_array_get(blobs, b), where, b, m, &m->b[b], err) != 0) {
            dfsp_manifest_free(m);
            return -1;
        }
        m->nb++;
    }
    return 0;
}

void dfsp_manifest_free(dfsp_manifest *m)
{
    for (int i = 0; i < m->nt; i++)
        free(m->t[i].name);
    free(m->t);
    free(m->b);
    memset(m, 0, sizeof *m);
}

/* ---- prepare ---- */

typedef struct plan {
    int ndrives, mirrors;
    int spine_int8;
    char drive[STORE_MAX_PACKS][1024];
    char pack[STORE_MAX_PACKS][1200];  /* pack file path (absolute) */
    char rel[STORE_MAX_PACKS][1200];   /* the same relative to the store folder */
    uint64_t size[STORE_MAX_PACKS];    /* planned pack size */
    int fd[STORE_MAX_PACKS];
} plan;

/* Drive folders: they exist, there are at most STORE_MAX_PACKS, and no folder is listed twice
 * (two packs of one model in one folder would be the same file). */
static int plan_drives(plan *p, const char *store_dir, const dfsp_prepare_opts *o, const char *identity,
                       errbuf *err)
{
    p->ndrives = o->ndrives > 0 ? o->ndrives : 1;
    p->mirrors = o->mirrors < 1 ? 1 : o->mirrors;
    p->spine_int8 = o->spine_int8 != 0;
    if (p->ndrives > STORE_MAX_PACKS)
        return errbuf_set(err, "prepare: at most %d drives", STORE_MAX_PACKS);
    if (p->mirrors > p->ndrives || p->mirrors > STORE_MAX_COPIES)
        return errbuf_set(err, "prepare: %d mirrors need at least as many drives (have %d)", p->mirrors, p->ndrives);
    char real[STORE_MAX_PACKS][PATH_MAX];
    for (int d = 0; d < p->ndrives; d++) {
        const char *dr = o->ndrives > 0 ? o->drives[d] : store_dir;
        if (!file_is_dir(dr) || !realpath(dr, real[d]))
            return errbuf_set(err, "prepare: drive folder '%s' does not exist", dr);
        for (int e = 0; e < d; e++)
            if (strcmp(real[e], real[d]) == 0)
                return errbuf_set(err, "prepare: drive folder '%s' is listed twice", dr);
        snprintf(p->drive[d], sizeof p->drive[d], "%s", dr);
        snprintf(p->pack[d], sizeof p->pack[d], "%s/dfsp-%.16s%s.pack", real[d], identity,
                 p->spine_int8 ? "-int8" : "");
    }
    /* the drives as mount points move: each pack is recorded absolute and relative to the store */
    char store_real[PATH_MAX];
    if (!realpath(store_dir, store_real))
        return errbuf_errno(err, store_dir);
    for (int d = 0; d < p->ndrives; d++)
        if (file_relpath(store_real, p->pack[d], p->rel[d], sizeof p->rel[d]) != 0)
            return errbuf_set(err, "prepare: the path of %s relative to %s is too long", p->pack[d], store_real);
    return 0;
}

static void place(blob_table *t, plan *p)
{
    memset(p->size, 0, sizeof p->size);
    for (int b = 0; b < t->n; b++) {
        blob *x = &t->b[b];
        x->ncopies = p->mirrors;
        for (int k = 0; k < p->mirrors; k++) {
            int d = (b + k) % p->ndrives;
            x->copy[k].file = d;
            x->copy[k].off = p->size[d];
            p->size[d] += blob_padded(x->size);
        }
    }
}

/* free space for what is still to be written, folder by folder */
static int check_space(const plan *p, errbuf *err)
{
    for (int d = 0; d < p->ndrives; d++) {
        struct stat st;
        uint64_t have = stat(p->pack[d], &st) == 0 ? (uint64_t)st.st_size : 0;
        uint64_t need = p->size[d] > have ? p->size[d] - have : 0;
        struct statvfs vf;
        if (statvfs(p->drive[d], &vf) == 0 && (uint64_t)vf.f_bavail * vf.f_frsize < need)
            return errbuf_set(err, "prepare: %s needs %.2f GB free, has %.2f GB", p->drive[d], (double)need / 1e9,
                              (double)vf.f_bavail * vf.f_frsize / 1e9);
    }
    return 0;
}

static int copy_small_files(const char *hf_dir, const char *store_dir, errbuf *err)
{
    static const char *names[] = {"config.json",    "generation_config.json", "tokenizer_config.json",
                                  "tiktoken.model", "tokenizer.json",         "special_tokens_map.json",
                                  "chat_template.jinja", "tokenizer.model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[4096], dst[4096], *buf;
        size_t n;
        snprintf(src, sizeof src, "%s/%s", hf_dir, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", store_dir, names[i]);
        if (!file_exists(src))
            continue;
        if (file_read_all(src, &buf, &n, err) != 0)
            return -1;
        int rc = file_write_atomic(dst, buf, n, err);
        free(buf);
        if (rc)
            return -1;
    }
    return 0;
}

static json_t *manifest_json(const blob_table *t, const model *m, const plan *p, const char *identity,
                             const char *hf_dir)
{
    json_t *packs = json_array(), *blobs = json_array();
    for (int d = 0; d < p->ndrives; d++)
        json_array_append_new(packs, json_pack("{s:i, s:s, s:s, s:I}", "drive", d, "path", p->pack[d], "rel",
                                               p->rel[d], "size", (json_int_t)p->size[d]));
    for (int b = 0; b < t->n; b++) {
        const blob *x = &t->b[b];
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)x->xxh3);
        json_t *copies = json_array(), *ts = json_array();
        for (int k = 0; k < x->ncopies; k++)
            json_array_append_new(copies, json_pack("[i, I]", x->copy[k].file, (json_int_t)x->copy[k].off));
        for (int i = 0; i < x->nparts; i++) {
            const blob_part *pt = &t->part[x->first_part + i];
            char name[1024];
            int ndim;
            int64_t dims[ST_MAX_DIMS];
            blob_part_tensor(t, m, b, pt, name, sizeof name, &ndim, dims); /* a fused slice: its own tensor */
            json_t *shape = json_array();
            for (int d = 0; d < ndim; d++)
                json_array_append_new(shape, json_integer(dims[d]));
            json_array_append_new(ts, json_pack("[s, s, o, I]", name, st_dtype_name(m->st.t[pt->tensor].dtype), shape,
                                                (json_int_t)pt->off));
        }
        json_array_append_new(blobs, json_pack("{s:s, s:i, s:i, s:I, s:s, s:o, s:o}", "kind", kind_name[x->kind],
                                               "layer", x->layer, "expert", x->expert, "size", (json_int_t)x->size,
                                               "xxh3", h, "copies", copies, "tensors", ts));
    }
    json_t *man = json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:o, s:o}", "format", "dfsp", "version", DFSP_VERSION,
                            "identity", identity, "source", hf_dir, "drives", p->ndrives, "mirrors", p->mirrors,
                            "packs", packs, "blobs", blobs);
    if (man && p->spine_int8)
        json_object_set_new(man, "spine", json_string("int8"));
    return man;
}

/* journal: line 1 = "dfsp-journal <identity> <ndrives> <mirrors>[ int8]", then "<blob> <xxh3hex>" */
static int journal_read(const char *path, const char *identity, const plan *p, unsigned char *done,
                        uint64_t *sums, int nblobs, errbuf *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256], id[80], sp[16] = "";
    int nd, mi, rc = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, "dfsp-journal %70s %d %d %15s", id, &nd, &mi, sp) < 3) {
        rc = errbuf_set(err, "%s: not a DFSP journal; remove it to start over", path);
    } else if (strcmp(id, identity) != 0) {
        rc = errbuf_set(err, "%s: an unfinished prepare of another model (identity %.12s..., this one %.12s...) is "
                             "in this store; refusing to mix them",
                        path, id, identity);
    } else if (nd != p->ndrives || mi != p->mirrors) {
        rc = errbuf_set(err, "%s: the unfinished prepare used %d drives and %d mirrors; rerun with the same "
                             "--drives and --mirrors",
                        path, nd, mi);
    } else if (sp[0] && strcmp(sp, "int8") != 0) {
        rc = errbuf_set(err, "%s: unknown spine '%s' in the journal; remove it to start over", path, sp);
    } else if ((strcmp(sp, "int8") == 0) != p->spine_int8) {
        rc = errbuf_set(err, "%s: the unfinished prepare was %s --spine int8; rerun it the same way", path,
                        p->spine_int8 ? "without" : "with");
    } else {
        int b;
        unsigned long long h;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "%d %llx", &b, &h) == 2 && b >= 0 && b < nblobs) {
                done[b] = 1;
                sums[b] = h;
            }
    }
    fclose(f);
    return rc;
}

/* the prepare of one store: everything its steps share */
typedef struct prep {
    model m;
    spineq q;      /* --spine int8: the store's tensor list */
    model view;    /* m with that list (spineq_view), or m itself */
    blob_table t;  /* over view */
    plan p;
    int *src_fd;
    unsigned char *done;
    uint64_t *sums;
    uint8_t *img;
    FILE *jf;
} prep;

/* Re-reads the blobs an earlier run journalled; those whose copies all match count as written. */
static int verify_journalled(prep *x)
{
    int resumed = 0;
    for (int b = 0; b < x->t.n; b++) {
        for (int k = 0; k < x->t.b[b].ncopies && x->done[b]; k++) {
            const blob_copy *c = &x->t.b[b].copy[k];
            if (file_pread_full(x->p.fd[c->file], x->img, x->t.b[b].size, c->off) != 0 ||
                XXH3_64bits(x->img, x->t.b[b].size) != x->sums[b])
                x->done[b] = 0;
        }
        resumed += x->done[b];
    }
    return resumed;
}

static void sync_all(prep *x)
{
    for (int d = 0; d < x->p.ndrives; d++)
        fsync(x->p.fd[d]);
    fflush(x->jf);
    fsync(fileno(x->jf));
}

/* Writes every blob not yet done; journals each (data synced before the journal claims it). */
static int write_blobs(prep *x, uint64_t *written_bytes, errbuf *err)
{
    const char *stop_env = getenv("DELTAFIN_PREPARE_STOP_AFTER");
    long stop_after = stop_env ? atol(stop_env) : -1, written = 0;
    uint64_t since_sync = 0;
    for (int b = 0; b < x->t.n; b++) {
        blob *bl = &x->t.b[b];
        if (x->done[b]) {
            bl->xxh3 = x->sums[b];
            continue;
        }
        memset(x->img, 0, blob_padded(bl->size));
        for (int i = 0; i < bl->nparts; i++) {
            const blob_part *pt = &x->t.part[bl->first_part + i];
            const st_tensor *tt = &x->view.st.t[pt->tensor];
            if (x->q.role && x->q.role[pt->tensor] != SPINEQ_COPY) {
                if (x->q.role[pt->tensor] == SPINEQ_CODES) { /* its scales are in the same blob */
                    uint8_t *sc = NULL;
                    for (int k = 0; k < bl->nparts; k++) {
                        const blob_part *o = &x->t.part[bl->first_part + k];
                        if (x->q.role[o->tensor] == SPINEQ_SCALES && x->q.src[o->tensor] == x->q.src[pt->tensor])
                            sc = x->img + o->off;
                    }
                    assert(sc);
                    spineq_fill(&x->q, &x->m, pt->tensor, x->img + pt->off, sc);
                }
                continue;
            }
            if (file_pread_full(x->src_fd[tt->file], x->img + pt->off, pt->len, tt->file_off + pt->src) != 0)
                return errbuf_set(err, "prepare: cannot read tensor '%s' from %s", tt->name,
                                  x->m.st.files[tt->file].path);
        }
        bl->xxh3 = XXH3_64bits(x->img, bl->size);
        for (int k = 0; k < bl->ncopies; k++)
            if (file_pwrite_full(x->p.fd[bl->copy[k].file], x->img, blob_padded(bl->size), bl->copy[k].off) != 0)
                return errbuf_errno(err, x->p.pack[bl->copy[k].file]);
        since_sync += blob_padded(bl->size) * (uint64_t)bl->ncopies;
        *written_bytes += blob_padded(bl->size) * (uint64_t)bl->ncopies;
        if (since_sync >= (256u << 20)) {
            sync_all(x);
            since_sync = 0;
        }
        fprintf(x->jf, "%d %016llx\n", b, (unsigned long long)bl->xxh3);
        if (++written == stop_after) {
            sync_all(x);
            errbuf_set(err, "prepare: stopped after %ld blobs (DELTAFIN_PREPARE_STOP_AFTER)", written);
            return DFSP_STOPPED;
        }
    }
    return 0;
}

static int open_files(prep *x, errbuf *err)
{
    for (int d = 0; d < x->p.ndrives; d++)
        if ((x->p.fd[d] = open(x->p.pack[d], O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
            return errbuf_errno(err, x->p.pack[d]);
    for (int i = 0; i < x->m.st.nfiles; i++)
        if ((x->src_fd[i] = open(x->m.st.files[i].path, O_RDONLY | O_CLOEXEC)) < 0)
            return errbuf_errno(err, x->m.st.files[i].path);
    uint64_t maxb = BLOB_ALIGN;
    for (int b = 0; b < x->t.n; b++)
        maxb = blob_padded(x->t.b[b].size) > maxb ? blob_padded(x->t.b[b].size) : maxb;
    if (posix_memalign((void **)&x->img, BLOB_ALIGN, maxb) != 0) {
        x->img = NULL;
        return errbuf_set(err, "prepare: out of memory for a %llu-byte blob", (unsigned long long)maxb);
    }
    return 0;
}

/* the manifest (atomically, last) and the model's small files */
static int finish_store(prep *x, const char *hf_dir, const char *store_dir, const char *identity, errbuf *err)
{
    for (int d = 0; d < x->p.ndrives; d++)
        if (ftruncate(x->p.fd[d], (off_t)x->p.size[d]) != 0 || fsync(x->p.fd[d]) != 0)
            return errbuf_errno(err, x->p.pack[d]);
    sync_all(x);
    json_t *man = manifest_json(&x->t, &x->view, &x->p, identity, hf_dir);
    char *text = man ? json_dumps(man, JSON_COMPACT) : NULL, path[4200];
    json_decref(man);
    if (!text)
        return errbuf_set(err, "prepare: cannot encode the manifest");
    snprintf(path, sizeof path, "%s/manifest.json", store_dir);
    int rc = copy_small_files(hf_dir, store_dir, err) ? -1 : file_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* an existing manifest: the same model (and spine) means done; another is refused */
static int existing(const char *store_dir, const char *identity, int spine_int8, int *same, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", store_dir);
    *same = 0;
    if (!file_exists(path))
        return 0;
    json_t *old = jsonr_load_file(path, err);
    if (!old)
        return -1;
    const char *oid = json_string_value(json_object_get(old, "identity"));
    *same = oid && strcmp(oid, identity) == 0;
    int old_int8 = spine_of(old);
    json_decref(old);
    if (old_int8 < 0)
        return errbuf_set(err, "%s: \"spine\" must be \"int8\" when present", path);
    if (!*same)
        return errbuf_set(err, "%s: this store holds another model; refusing to mix (use another folder)", path);
    if (old_int8 != spine_int8)
        return errbuf_set(err, "%s: this store holds this model %s --spine int8; use another folder", path,
                          old_int8 ? "made with" : "made without");
    return 0;
}

int dfsp_prepare(const char *hf_dir, const char *store_dir, const dfsp_prepare_opts *o, dfsp_prepare_stats *st,
                 errbuf *err)
{
    prep *x = calloc(1, sizeof *x);
    char identity[65], jpath[4200];
    int rc = -1, same = 0;
    memset(st, 0, sizeof *st);
    if (!x)
        return errbuf_set(err, "prepare: out of memory");
    for (int d = 0; d < STORE_MAX_PACKS; d++)
        x->p.fd[d] = -1;
    double t0 = timer_now();
    if (model_load(&x->m, hf_dir, err) != 0) {
        free(x);
        return -1;
    }
    x->view = x->m;
    if (o->spine_int8) {
        if (spineq_plan(&x->q, &x->m, err) != 0)
            goto out;
        spineq_view(&x->q, &x->m, &x->view);
        st->spine_mats = x->q.nmat;
        st->spine_in = x->q.bytes_in;
        st->spine_out = x->q.bytes_out;
    }
    if (blob_table_build(&x->t, &x->view, err) != 0 || dfsp_identity(hf_dir, &x->m.st, identity, err) != 0)
        goto out;
    if (mkdir(store_dir, 0755) != 0 && errno != EEXIST) {
        errbuf_errno(err, store_dir);
        goto out;
    }
    if (plan_drives(&x->p, store_dir, o, identity, err) != 0 ||
        existing(store_dir, identity, x->p.spine_int8, &same, err) != 0)
        goto out;
    st->blobs = x->t.n;
    if (same) {
        st->already = 1;
        rc = 0;
        goto out;
    }
    place(&x->t, &x->p);
    x->done = calloc((size_t)x->t.n + 1, 1);
    x->sums = calloc((size_t)x->t.n + 1, sizeof *x->sums);
    x->src_fd = malloc(sizeof(int) * (size_t)(x->m.st.nfiles + 1));
    if (!x->done || !x->sums || !x->src_fd) {
        errbuf_set(err, "prepare: out of memory");
        goto out;
    }
    for (int i = 0; i < x->m.st.nfiles; i++)
        x->src_fd[i] = -1;
    snprintf(jpath, sizeof jpath, "%s/prepare.journal", store_dir);
    if (journal_read(jpath, identity, &x->p, x->done, x->sums, x->t.n, err) != 0 || check_space(&x->p, err) != 0 ||
        open_files(x, err) != 0)
        goto out;
    st->resumed = verify_journalled(x);
    if (!(x->jf = fopen(jpath, "a"))) {
        errbuf_errno(err, jpath);
        goto out;
    }
    if (ftell(x->jf) == 0)
        fprintf(x->jf, "dfsp-journal %s %d %d%s\n", identity, x->p.ndrives, x->p.mirrors,
                x->p.spine_int8 ? " int8" : "");
    if ((rc = write_blobs(x, &st->bytes, err)) != 0)
        goto out;
    rc = -1;
    if (finish_store(x, hf_dir, store_dir, identity, err) != 0)
        goto out;
    unlink(jpath);
    rc = 0;
out:
    st->seconds = timer_now() - t0;
    if (x->jf)
        fclose(x->jf);
    for (int d = 0; d < STORE_MAX_PACKS; d++)
        if (x->p.fd[d] >= 0)
            close(x->p.fd[d]);
    if (x->src_fd)
        for (int i = 0; i < x->m.st.nfiles; i++)
            if (x->src_fd[i] >= 0)
                close(x->src_fd[i]);
    free(x->src_fd);
    free(x->done);
    free(x->sums);
    free(x->img);
    blob_table_free(&x->t);
    spineq_free(&x->q);
    model_free(&x->m);
    free(x);
    return rc;
}

/* ---- open ---- */

/* Where pack i is now: with --drives, its file in that drive's folder; otherwise where the manifest
 * recorded it relative to the store, then its absolute path (a manifest from before "rel" kept
 * one path, relative to the store or absolute). 1 with info->pack_path set to the path found, 0
 * with `why` saying what was looked for and why none served. */
static int find_pack(const dfsp_manifest *man, int i, const char *dir, char *const *drive_dir, int ndrive_dir,
                     dfsp_info *info, char *why, size_t cap)
{
    char cand[3][2200];
    int nc = 0;
    if (ndrive_dir > 0) {
        snprintf(cand[nc++], sizeof cand[0], "%s/%s", drive_dir[man->pack_drive[i]], man->pack_file[i]);
    } else {
        if (man->pack_rel[i][0])
            snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, man->pack_rel[i]);
        if (man->pack_path[i][0] == '/')
            snprintf(cand[nc++], sizeof cand[0], "%s", man->pack_path[i]);
        else
            snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, man->pack_path[i]);
    }
    size_t n = (size_t)snprintf(why, cap, "drive %d: pack %s", man->pack_drive[i], man->pack_file[i]);
    for (int k = 0; k < nc; k++) {
        struct stat st;
        const char *what = "missing";
        if (stat(cand[k], &st) == 0) {
            if ((uint64_t)st.st_size >= man->pack_size[i]) {
                snprintf(info->pack_path[i], sizeof info->pack_path[i], "%s", cand[k]);
                return 1;
            }
            what = "truncated";
        }
        if (n < cap)
            n += (size_t)snprintf(why + n, cap - n, "%s %s is %s", k ? ";" : ":", cand[k], what);
    }
    if (n < cap && ndrive_dir == 0)
        snprintf(why + n, cap - n, " (where are the drives now? give --drives)");
    snprintf(info->pack_path[i], sizeof info->pack_path[i], "%s", cand[0]);
    return 0;
}

/* The packs found (info->pack_ok) mapped, and every blob's tensors from one copy on a pack that is
 * there (o->copy when it names one), into set; chosen[b] is that copy. */
static int map_tensors(const dfsp_manifest *man, dfsp_info *info, const dfsp_open_opts *o, const char *dir,
                       const char *where, st_set *set, int *chosen, errbuf *err)
{
    memset(set, 0, sizeof *set);
    set->files = calloc((size_t)man->npacks, sizeof *set->files);
    set->t = calloc((size_t)man->nt + 1, sizeof *set->t);
    if (!set->files || !set->t)
        return errbuf_set(err, "%s: out of memory", where);
    char buf[4096], *save = NULL, *drv[STORE_MAX_PACKS];
    int ndrv = 0;
    if (o && o->drives) {
        snprintf(buf, sizeof buf, "%s", o->drives);
        for (char *t = strtok_r(buf, ",", &save); t && ndrv < STORE_MAX_PACKS; t = strtok_r(NULL, ",", &save))
            drv[ndrv++] = t;
        if (ndrv != man->ndrives)
            return errbuf_set(err, "--drives names %d folders, the store was prepared on %d", ndrv, man->ndrives);
    }
    char why[STORE_MAX_PACKS][1200];
    size_t wn = 0;
    for (int i = 0; i < man->npacks; i++) {
        info->pack_ok[i] = find_pack(man, i, dir, drv, ndrv, info, why[i], sizeof why[i]);
        set->nfiles++;
        if (!(set->files[i].path = strdup(info->pack_path[i])))
            return errbuf_set(err, "%s: out of memory", where);
        if (info->pack_ok[i] && file_map_open(&set->files[i].map, info->pack_path[i], err) != 0)
            return -1;
        if (!info->pack_ok[i] && wn < sizeof info->warning)
            wn += (size_t)snprintf(info->warning + wn, sizeof info->warning - wn, "%s%s", wn ? "\n" : "", why[i]);
    }
    for (int b = 0; b < man->nb; b++) {
        const dfsp_blob *x = &man->b[b];
        int c = o && o->copy && o->copy[b] >= 0 && o->copy[b] < x->ncopies ? o->copy[b] : -1;
        if (c >= 0 && !info->pack_ok[x->copy[c].file])
            c = -1;
        for (int k = 0; k < x->ncopies && c < 0; k++)
            if (info->pack_ok[x->copy[k].file])
                c = k;
        if (c < 0) { /* no copy of this blob can be read: name it and its packs */
            char nm[64], packs[2400];
            blob named = {.kind = x->kind, .layer = x->layer, .expert = x->expert};
            blob_name(&named, nm, sizeof nm);
            size_t pn = 0;
            for (int k = 0; k < x->ncopies && pn < sizeof packs; k++)
                pn += (size_t)snprintf(packs + pn, sizeof packs - pn, "%s%s", k ? "; " : "", why[x->copy[k].file]);
            return errbuf_set(err, "%s: blob '%s' has no copy that can be read: %s", where, nm, packs);
        }
        chosen[b] = c;
        for (int i = 0; i < x->ntensors; i++) {
            const dfsp_tensor *d = &man->t[x->first_tensor + i];
            st_tensor *t = &set->t[set->n];
            t->dtype = d->dtype;
            t->ndim = d->ndim;
            memcpy(t->shape, d->shape, sizeof t->shape);
            t->file = x->copy[c].file;
            t->file_off = x->copy[c].off + d->off;
            t->begin = t->file_off;
            t->end = t->file_off + d->len;
            t->data = set->files[t->file].map.data + t->file_off;
            if (!(t->name = strdup(d->name)))
                return errbuf_set(err, "%s: out of memory", where);
            set->n++;
        }
    }
    return st_finish(set, err);
}

/* Copies and checksums onto the engine's blob table; every blob must be in the manifest, at the
 * layout this engine computes. */
static int attach(const dfsp_manifest *man, const dfsp_info *info, const int *chosen, const model *m, blob_table *bt,
                  const char *where, errbuf *err)
{
    int *seen = calloc((size_t)bt->n + 1, sizeof(int));
    if (!seen)
        return errbuf_set(err, "%s: out of memory", where);
    int rc = 0;
    for (int b = 0; b < man->nb && rc == 0; b++) {
        const dfsp_blob *x = &man->b[b];
        int id = -1;
        if (x->kind == BLOB_EXPERT) {
            if (x->layer >= 0 && x->layer < bt->n_layers && x->expert >= 0 && x->expert < bt->n_experts)
                id = bt->expert_blob[(size_t)x->layer * bt->n_experts + x->expert];
        } else {
            for (int k = 0; k < bt->n && id < 0; k++)
                if (bt->b[k].kind == x->kind && bt->b[k].layer == x->layer)
                    id = k;
        }
        if (id < 0 || seen[id] || x->size != bt->b[id].size) {
            rc = errbuf_set(err, "%s: blob %d (%s layer %d expert %d) does not match the model", where, b,
                            kind_name[x->kind], x->layer, x->expert);
            break;
        }
        seen[id] = 1;
        blob *y = &bt->b[id];
        for (int k = 0; k < y->nparts && rc == 0; k++) {
            const blob_part *pt = &bt->part[y->first_part + k];
            if (m->st.t[pt->tensor].file_off != x->copy[chosen[b]].off + pt->off)
                rc = errbuf_set(err, "%s: blob %d: tensor '%s' is not at the offset this engine's layout expects",
                                where, b, m->st.t[pt->tensor].name);
        }
        y->xxh3 = x->xxh3;
        y->ncopies = x->ncopies;
        memcpy(y->copy, x->copy, sizeof y->copy);
        y->man_index = b;
        y->mapped = chosen[b];
        y->dead = 0;
        for (int k = 0; k < x->ncopies; k++)
            if (!info->pack_ok[x->copy[k].file])
                y->dead |= (uint8_t)(1u << k);
    }
    for (int k = 0; k < bt->n && rc == 0; k++)
        if (!seen[k]) {
            char nm[64];
            blob_name(&bt->b[k], nm, sizeof nm);
            rc = errbuf_set(err, "%s: blob '%s' is missing from the manifest", where, nm);
        }
    free(seen);
    return rc;
}

int dfsp_open(const char *dir, const dfsp_open_opts *o, model *m, blob_table *bt, dfsp_info *info, errbuf *err)
{
    char where[4200];
    snprintf(where, sizeof where, "%s/manifest.json", dir);
    memset(info, 0, sizeof *info);
    memset(bt, 0, sizeof *bt);
    json_t *j = jsonr_load_file(where, err);
    if (!j)
        return -1;
    dfsp_manifest man;
    st_set set;
    memset(&set, 0, sizeof set);
    int rc = dfsp_manifest_parse(j, where, &man, err);
    json_decref(j);
    if (rc != 0)
        return -1;
    memcpy(info->identity, man.identity, sizeof info->identity);
    info->spine_int8 = man.spine_int8;
    info->npacks = man.npacks;
    info->ndrives = man.ndrives;
    info->mirrors = man.mirrors;
    for (int i = 0; i < man.npacks; i++)
        info->pack_drive[i] = man.pack_drive[i];
    int *chosen = calloc((size_t)man.nb + 1, sizeof *chosen);
    rc = -1;
    if (!chosen) {
        errbuf_set(err, "%s: out of memory", where);
        goto out;
    }
    if (map_tensors(&man, info, o, dir, where, &set, chosen, err) != 0) {
        st_close(&set);
        goto out;
    }
    if (model_load_set(m, dir, &set, err) != 0) /* takes the set, also on failure */
        goto out;
    if (blob_table_build(bt, m, err) != 0 || attach(&man, info, chosen, m, bt, where, err) != 0) {
        blob_table_free(bt);
        model_free(m);
        goto out;
    }
    rc = 0;
out:
    free(chosen);
    dfsp_manifest_free(&man);
    return rc;
}

/* ---- verifying what is served from the mapping ---- */

/* the bytes of copy c of blob x in the model's map of its pack (NULL: the pack is not mapped) */
static const uint8_t *copy_bytes(const model *m, const blob *x, int c)
{
    const file_map *fm = &m->st.files[x->copy[c].file].map;
    return fm->data ? fm->data + x->copy[c].off : NULL;
}

struct verify_job {
    const model *m;
    const blob_table *bt;
    const int *ids;  /* blob table ids */
    uint64_t *got;   /* the xxh3 of each one's mapped copy */
};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14: read the range in, page tables and all */
#endif

/* Hashes straight from the map, 8 MiB at a time, each piece read in first (one request per piece
 * instead of a fault per page); the pages stay in the page cache for the run that uses them. */
static void verify_run(void *ctx, int i0, int i1, int tid)
{
    const struct verify_job *j = ctx;
    (void)tid;
    for (int i = i0; i < i1; i++) {
        const blob *x = &j->bt->b[j->ids[i]];
        const uint8_t *p = copy_bytes(j->m, x, x->mapped);
        XXH3_state_t *h = XXH3_createState();
        if (!h) { /* then all at once */
            j->got[i] = XXH3_64bits(p, x->size);
            continue;
        }
        XXH3_64bits_reset(h);
        for (uint64_t off = 0; off < x->size; off += 8u << 20) {
            uint64_t n = x->size - off < (8u << 20) ? x->size - off : (8u << 20);
            void *a = (void *)(uintptr_t)(p + off); /* page-aligned: images start on 4 KiB */
            if (madvise(a, blob_padded(n), MADV_POPULATE_READ) != 0)
                madvise(a, blob_padded(n), MADV_WILLNEED);
            XXH3_64bits_update(h, p + off, n);
        }
        j->got[i] = XXH3_64bits_digest(h);
        XXH3_freeState(h);
    }
}

/* Hashes the listed blobs' mapped copies with O_DIRECT reads through a ring of bounce buffers, on
 * the drives' tuned queues: the page cache stays as it was (an expert the run never routes to is
 * never cached). got[i] gets each xxh3, ok[i] whether the read succeeded. */
static int hash_direct(const model *m, const blob_table *bt, const dfsp_info *info, const int *ids, int n,
                       uint64_t *got, uint8_t *ok, errbuf *err)
{
    if (n == 0)
        return 0;
    io_cfg ic;
    io_cfg_default(&ic);
    ic.ndrives = info->ndrives;
    const char *paths[STORE_MAX_PACKS];
    for (int i = 0; i < info->npacks; i++)
        paths[i] = info->pack_path[i];
    uint64_t slot = 0;
    for (int i = 0; i < n; i++)
        if (blob_padded(bt->b[ids[i]].size) > slot)
            slot = blob_padded(bt->b[ids[i]].size);
    int nslots = (int)((256u << 20) / slot), file_id[STORE_MAX_PACKS], rc = -1;
    nslots = nslots < 2 ? 2 : nslots > 32 ? 32 : nslots;
    uint8_t *mem = NULL;
    int *slot_of = malloc(sizeof(int) * (size_t)nslots), *free_slot = malloc(sizeof(int) * (size_t)nslots);
    io_engine *io = NULL;
    if (!slot_of || !free_slot || posix_memalign((void **)&mem, 4096, slot * (size_t)nslots) != 0) {
        errbuf_set(err, "verify: out of memory for %d read buffers of %llu bytes", nslots, (unsigned long long)slot);
        goto out;
    }
    if (io_tune_files(&ic, paths, info->pack_drive, info->npacks, err) != 0)
        goto out;
    for (int d = 0; d < ic.ndrives && d < IO_MAX_DRIVES; d++) /* one bulk pass: keep the queue deep */
        if (ic.drive_depth[d] < 32)
            ic.drive_depth[d] = 32;
    if (ic.depth < 32)
        ic.depth = 32;
    if (!(io = io_new(&ic, err)))
        goto out;
    for (int i = 0; i < info->npacks; i++)
        if ((file_id[i] = info->pack_ok[i] ? io_open(io, info->pack_path[i], info->pack_drive[i], 1, err) : -1) < 0 &&
            info->pack_ok[i])
            goto out;
    int nfree = nslots, next = 0, landed = 0;
    for (int k = 0; k < nslots; k++)
        free_slot[k] = k;
    while (landed < n) {
        while (next < n && nfree > 0) { /* queue reads while buffers and the engine have room */
            const blob *x = &bt->b[ids[next]];
            int k = free_slot[nfree - 1];
            errbuf full;
            if (io_read(io, file_id[x->copy[x->mapped].file], x->copy[x->mapped].off, blob_padded(x->size),
                        mem + (size_t)k * slot, (uint64_t)next, &full) != 0)
                break;
            slot_of[k] = next++;
            nfree--;
            (void)slot_of;
        }
        uint64_t tag;
        int good;
        int r = io_reap(io, &tag, &good, 1, err);
        if (r <= 0) {
            if (r == 0)
                errbuf_set(err, "verify: a read was lost");
            goto out;
        }
        int k = -1;
        for (int j = 0; j < nslots && k < 0; j++)
            if (slot_of[j] == (int)tag)
                k = j;
        assert(k >= 0);
        const blob *x = &bt->b[ids[tag]];
        ok[tag] = (uint8_t)good;
        got[tag] = good ? XXH3_64bits(mem + (size_t)k * slot, x->size) : 0;
        slot_of[k] = -1;
        free_slot[nfree++] = k;
        landed++;
    }
    rc = 0;
out:
    while (io && io_pending(io) > 0) { /* an early end still waits for the reads it queued */
        uint64_t tag;
        int good;
        errbuf e2;
        if (io_reap(io, &tag, &good, 1, &e2) <= 0)
            break;
    }
    io_free(io);
    free(mem);
    free(slot_of);
    free(free_slot);
    return rc;
}

int dfsp_verify_mapped(const model *m, const blob_table *bt, const dfsp_info *info, const uint8_t *mapped, pool *p,
                       signed char *better, errbuf *err)
{
    int n = 0, nd = 0, rc = 0;
    int *ids = malloc(sizeof(int) * (size_t)(bt->n + 1)), *direct = malloc(sizeof(int) * (size_t)(bt->n + 1));
    uint64_t *got = malloc(sizeof(uint64_t) * (size_t)(bt->n + 1)), *dgot = malloc(sizeof(uint64_t) * (size_t)(bt->n + 1));
    uint8_t *dok = malloc((size_t)bt->n + 1);
    if (!ids || !direct || !got || !dgot || !dok) {
        rc = errbuf_set(err, "%s: out of memory", m->dir);
        goto out;
    }
    /* what every pass reads (globals, spines) through the map, warming it for the run; experts,
     * read only if routed to, with O_DIRECT */
    for (int b = 0; b < bt->n; b++)
        if (mapped[b] && bt->b[b].ncopies > 0) {
            if (bt->b[b].kind == BLOB_EXPERT)
                direct[nd++] = b;
            else
                ids[n++] = b;
        }
    if (hash_direct(m, bt, info, direct, nd, dgot, dok, err) != 0) {
        rc = -1;
        goto out;
    }
    struct verify_job j = {m, bt, ids, got};
    pool_for(p, n, verify_run, &j);
    for (int i = 0; i < nd; i++) { /* one list: mapped, then direct */
        ids[n + i] = direct[i];
        got[n + i] = dok[i] ? dgot[i] : ~bt->b[direct[i]].xxh3;
    }
    n += nd;
    for (int i = 0; i < n && rc >= 0; i++) {
        const blob *x = &bt->b[ids[i]];
        if (got[i] == x->xxh3)
            continue;
        int good = -1; /* a mirror that matches, read once more here */
        for (int c = 0; c < x->ncopies && good < 0; c++)
            if (c != x->mapped && !(x->dead >> c & 1) && XXH3_64bits(copy_bytes(m, x, c), x->size) == x->xxh3)
                good = c;
        char nm[64];
        blob_name(x, nm, sizeof nm);
        if (good < 0) {
            rc = errbuf_set(err, "blob '%s' in %s failed its checksum (xxh3 %016llx, manifest %016llx)%s", nm,
                            m->st.files[x->copy[x->mapped].file].path, (unsigned long long)got[i],
                            (unsigned long long)x->xxh3, x->ncopies > 1 ? ", and so did every other copy" : "");
        } else {
            better[x->man_index] = (signed char)good;
            rc = 1;
        }
    }
out:
    free(ids);
    free(direct);
    free(got);
    free(dgot);
    free(dok);
    return rc;
}
