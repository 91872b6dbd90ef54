/* dfsp.c — see dfsp.h. */
#include "store/dfsp.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "base/timer.h"

static const char *kind_name[3] = {"global", "spine", "expert"};

static uint64_t pad4k(uint64_t n) { return (n + BLOB_ALIGN - 1) & ~(uint64_t)(BLOB_ALIGN - 1); }

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

/* ---- prepare ---- */

typedef struct plan {
    int ndrives, mirrors;
    char drive[STORE_MAX_PACKS][1024];   /* absolute or "." (the store folder) */
    char pack[STORE_MAX_PACKS][1200];    /* pack file path */
    uint64_t size[STORE_MAX_PACKS];      /* planned pack size */
    int fd[STORE_MAX_PACKS];
} plan;

static void place(const blob_table *t, plan *p)
{
    memset(p->size, 0, sizeof p->size);
    for (int b = 0; b < t->n; b++) {
        blob *x = &t->b[b];
        x->ncopies = p->mirrors;
        for (int k = 0; k < p->mirrors; k++) {
            int d = (b + k) % p->ndrives;
            x->copy[k].file = d;
            x->copy[k].off = p->size[d];
            p->size[d] += pad4k(x->size);
        }
    }
}

static int copy_small_files(const char *hf_dir, const char *store_dir, errbuf *err)
{
    static const char *names[] = {"config.json", "generation_config.json", "tokenizer_config.json",
                                  "tiktoken.model", "tokenizer.json", "special_tokens_map.json",
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
        json_array_append_new(packs, json_pack("{s:i, s:s, s:I}", "drive", d, "path", p->pack[d], "size",
                                               (json_int_t)p->size[d]));
    for (int b = 0; b < t->n; b++) {
        const blob *x = &t->b[b];
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)x->xxh3);
        json_t *copies = json_array(), *ts = json_array();
        for (int k = 0; k < x->ncopies; k++)
            json_array_append_new(copies, json_pack("[i, I]", x->copy[k].file, (json_int_t)x->copy[k].off));
        for (int i = 0; i < x->nparts; i++) {
            const blob_part *pt = &t->part[x->first_part + i];
            const st_tensor *tt = &m->st.t[pt->tensor];
            json_t *shape = json_array();
            for (int d = 0; d < tt->ndim; d++)
                json_array_append_new(shape, json_integer(tt->shape[d]));
            json_array_append_new(ts, json_pack("[s, s, o, I]", tt->name, st_dtype_name(tt->dtype), shape,
                                                (json_int_t)pt->off));
        }
        json_array_append_new(blobs, json_pack("{s:s, s:i, s:i, s:I, s:s, s:o, s:o}", "kind", kind_name[x->kind],
                                               "layer", x->layer, "expert", x->expert, "size", (json_int_t)x->size,
                                               "xxh3", h, "copies", copies, "tensors", ts));
    }
    return json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:o, s:o}", "format", "dfsp", "version", 1, "identity", identity,
                     "source", hf_dir, "drives", p->ndrives, "mirrors", p->mirrors, "packs", packs, "blobs", blobs);
}

/* journal: line 1 = "dfsp-journal <identity> <ndrives> <mirrors>", then "<blob> <xxh3hex>" */
static int journal_read(const char *path, const char *identity, const plan *p, unsigned char *done,
                        uint64_t *sums, int nblobs, errbuf *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256], id[80];
    int nd, mi, rc = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, "dfsp-journal %70s %d %d", id, &nd, &mi) != 3) {
        rc = errbuf_set(err, "%s: not a DFSP journal; remove it to start over", path);
    } else if (strcmp(id, identity) != 0) {
        rc = errbuf_set(err, "%s: an unfinished prepare of another model (identity %.12s..., this one %.12s...) is "
                             "in this store; refusing to mix them",
                        path, id, identity);
    } else if (nd != p->ndrives || mi != p->mirrors) {
        rc = errbuf_set(err, "%s: the unfinished prepare used %d drives and %d mirrors; rerun with the same "
                             "--drives and --mirrors",
                        path, nd, mi);
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

static int read_full(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (uint64_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, uint64_t len, uint64_t off)
{
    uint64_t put = 0;
    while (put < len) {
        ssize_t r = pwrite(fd, (const char *)buf + put, len - put, (off_t)(off + put));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        put += (uint64_t)r;
    }
    return 0;
}

int dfsp_prepare(const char *hf_dir, const char *store_dir, const dfsp_prepare_opts *o, errbuf *err)
{
    model m;
    blob_table t;
    plan *p = calloc(1, sizeof *p);
    int *src_fd = NULL, rc = -1;
    unsigned char *done = NULL;
    uint64_t *sums = NULL;
    uint8_t *img = NULL;
    FILE *jf = NULL;
    json_t *man = NULL;
    char identity[65], path[4096], jpath[4096];
    memset(&t, 0, sizeof t);
    if (!p)
        return errbuf_set(err, "prepare: out of memory");
    for (int d = 0; d < STORE_MAX_PACKS; d++)
        p->fd[d] = -1;
    if (model_load(&m, hf_dir, err) != 0) {
        free(p);
        return -1;
    }
    if (blob_table_build(&t, &m, err) != 0 || dfsp_identity(hf_dir, &m.st, identity, err) != 0)
        goto out;
    if (mkdir(store_dir, 0755) != 0 && errno != EEXIST) {
        errbuf_errno(err, store_dir);
        goto out;
    }
    p->ndrives = o->ndrives > 0 ? o->ndrives : 1;
    if (p->ndrives > STORE_MAX_PACKS) {
        errbuf_set(err, "prepare: at most %d drives", STORE_MAX_PACKS);
        goto out;
    }
    p->mirrors = o->mirrors < 1 ? 1 : o->mirrors;
    if (p->mirrors > p->ndrives || p->mirrors > STORE_MAX_COPIES) {
        errbuf_set(err, "prepare: %d mirrors need at least as many drives (have %d)", p->mirrors, p->ndrives);
        goto out;
    }
    for (int d = 0; d < p->ndrives; d++) {
        const char *dr = o->ndrives > 0 ? o->drives[d] : store_dir;
        if (!file_is_dir(dr)) {
            errbuf_set(err, "prepare: drive folder '%s' does not exist", dr);
            goto out;
        }
        snprintf(p->drive[d], sizeof p->drive[d], "%s", dr);
        snprintf(p->pack[d], sizeof p->pack[d], "%s/dfsp-%.16s.pack", dr, identity);
    }
    /* an existing manifest: the same model is done; another model is refused */
    snprintf(path, sizeof path, "%s/manifest.json", store_dir);
    if (file_exists(path)) {
        json_t *old = jsonr_load_file(path, err);
        const char *oid = NULL;
        if (!old)
            goto out;
        jsonr_str(old, "identity", &oid, 1, path, err);
        int same = oid && strcmp(oid, identity) == 0;
        json_decref(old);
        if (!same) {
            errbuf_set(err, "%s: this store holds another model; refusing to mix (use another folder)", path);
            goto out;
        }
        if (!o->quiet)
            printf("prepare: %s already holds this model\n", store_dir);
        rc = 0;
        goto out;
    }
    place(&t, p);
    done = calloc((size_t)t.n, 1);
    sums = calloc((size_t)t.n, sizeof *sums);
    src_fd = malloc(sizeof(int) * (size_t)m.st.nfiles);
    if (!done || !sums || !src_fd) {
        errbuf_set(err, "prepare: out of memory");
        goto out;
    }
    for (int i = 0; i < m.st.nfiles; i++)
        src_fd[i] = -1;
    snprintf(jpath, sizeof jpath, "%s/prepare.journal", store_dir);
    if (journal_read(jpath, identity, p, done, sums, t.n, err) != 0)
        goto out;
    /* free space, counting what earlier runs already wrote */
    for (int d = 0; d < p->ndrives; d++) {
        struct stat st;
        uint64_t have = stat(p->pack[d], &st) == 0 ? (uint64_t)st.st_size : 0, need = 0;
        if (p->size[d] > have)
            need = p->size[d] - have;
        for (int e = 0; e < d; e++) /* drives that are the same folder share its space */
            if (strcmp(p->drive[e], p->drive[d]) == 0)
                need = 0;
        struct statvfs vf;
        if (statvfs(p->drive[d], &vf) == 0 && (uint64_t)vf.f_bavail * vf.f_frsize < need) {
            errbuf_set(err, "prepare: %s needs %.2f GB free, has %.2f GB", p->drive[d], (double)need / 1e9,
                       (double)vf.f_bavail * vf.f_frsize / 1e9);
            goto out;
        }
    }
    for (int d = 0; d < p->ndrives; d++)
        if ((p->fd[d] = open(p->pack[d], O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
            errbuf_errno(err, p->pack[d]);
            goto out;
        }
    for (int i = 0; i < m.st.nfiles; i++)
        if ((src_fd[i] = open(m.st.files[i].path, O_RDONLY | O_CLOEXEC)) < 0) {
            errbuf_errno(err, m.st.files[i].path);
            goto out;
        }
    uint64_t maxb = 0;
    for (int b = 0; b < t.n; b++)
        maxb = pad4k(t.b[b].size) > maxb ? pad4k(t.b[b].size) : maxb;
    if (posix_memalign((void **)&img, BLOB_ALIGN, maxb ? maxb : BLOB_ALIGN) != 0) {
        errbuf_set(err, "prepare: out of memory for a %llu-byte blob", (unsigned long long)maxb);
        goto out;
    }
    /* blobs a previous run journalled are re-read and checked before they count as written */
    int resumed = 0;
    for (int b = 0; b < t.n; b++) {
        if (!done[b])
            continue;
        for (int k = 0; k < t.b[b].ncopies && done[b]; k++) {
            const blob_copy *c = &t.b[b].copy[k];
            if (read_full(p->fd[c->file], img, t.b[b].size, c->off) != 0 ||
                XXH3_64bits(img, t.b[b].size) != sums[b])
                done[b] = 0;
        }
        resumed += done[b];
    }
    jf = fopen(jpath, "a");
    if (!jf) {
        errbuf_errno(err, jpath);
        goto out;
    }
    if (ftell(jf) == 0)
        fprintf(jf, "dfsp-journal %s %d %d\n", identity, p->ndrives, p->mirrors);
    const char *stop_env = getenv("DELTAFIN_PREPARE_STOP_AFTER"); /* test aid: simulate a crash */
    long stop_after = stop_env ? atol(stop_env) : -1, written = 0;
    uint64_t since_sync = 0, total = 0;
    double t0 = timer_now();
    for (int b = 0; b < t.n; b++) {
        blob *x = &t.b[b];
        if (done[b]) {
            x->xxh3 = sums[b];
            continue;
        }
        memset(img, 0, pad4k(x->size));
        for (int i = 0; i < x->nparts; i++) {
            const blob_part *pt = &t.part[x->first_part + i];
            const st_tensor *tt = &m.st.t[pt->tensor];
            if (read_full(src_fd[tt->file], img + pt->off, pt->len, tt->file_off) != 0) {
                errbuf_set(err, "prepare: cannot read tensor '%s' from %s", tt->name, m.st.files[tt->file].path);
                goto out;
            }
        }
        x->xxh3 = XXH3_64bits(img, x->size);
        for (int k = 0; k < x->ncopies; k++)
            if (write_full(p->fd[x->copy[k].file], img, pad4k(x->size), x->copy[k].off) != 0) {
                errbuf_errno(err, p->pack[x->copy[k].file]);
                goto out;
            }
        since_sync += pad4k(x->size) * (uint64_t)x->ncopies;
        total += pad4k(x->size) * (uint64_t)x->ncopies;
        if (since_sync >= (256u << 20)) { /* data is synced before the journal claims it */
            for (int d = 0; d < p->ndrives; d++)
                fsync(p->fd[d]);
            fflush(jf);
            fsync(fileno(jf));
            since_sync = 0;
        }
        fprintf(jf, "%d %016llx\n", b, (unsigned long long)x->xxh3);
        if (++written == stop_after) {
            for (int d = 0; d < p->ndrives; d++)
                fsync(p->fd[d]);
            fflush(jf);
            fsync(fileno(jf));
            _exit(3);
        }
    }
    for (int d = 0; d < p->ndrives; d++)
        if (ftruncate(p->fd[d], (off_t)p->size[d]) != 0 || fsync(p->fd[d]) != 0) {
            errbuf_errno(err, p->pack[d]);
            goto out;
        }
    fflush(jf);
    fsync(fileno(jf));
    /* the store's pack paths are written relative to the store when inside it */
    for (int d = 0; d < p->ndrives; d++)
        if (strcmp(p->drive[d], store_dir) == 0)
            snprintf(p->pack[d], sizeof p->pack[d], "dfsp-%.16s.pack", identity);
    man = manifest_json(&t, &m, p, identity, hf_dir);
    char *text = man ? json_dumps(man, JSON_COMPACT) : NULL;
    if (!text) {
        errbuf_set(err, "prepare: cannot encode the manifest");
        goto out;
    }
    if (copy_small_files(hf_dir, store_dir, err) != 0) {
        free(text);
        goto out;
    }
    int wrc = file_write_atomic(path, text, strlen(text), err);
    free(text);
    if (wrc)
        goto out;
    unlink(jpath);
    if (!o->quiet) {
        double dt = timer_now() - t0;
        printf("prepare: %d blobs (%d verified from an earlier run), %.2f GB written in %.1f s (%.2f GB/s) over %d "
               "drive(s), %d mirror(s)\n",
               t.n, resumed, (double)total / 1e9, dt, dt > 0 ? (double)total / 1e9 / dt : 0.0, p->ndrives,
               p->mirrors);
    }
    rc = 0;
out:
    if (jf)
        fclose(jf);
    for (int d = 0; d < STORE_MAX_PACKS; d++)
        if (p->fd[d] >= 0)
            close(p->fd[d]);
    if (src_fd)
        for (int i = 0; i < m.st.nfiles; i++)
            if (src_fd[i] >= 0)
                close(src_fd[i]);
    free(src_fd);
    free(done);
    free(sums);
    free(img);
    free(p);
    json_decref(man);
    blob_table_free(&t);
    model_free(&m);
    return rc;
}

/* ---- open ---- */

static int kind_of(const char *s)
{
    for (int k = 0; k < 3; k++)
        if (strcmp(s, kind_name[k]) == 0)
            return k;
    return -1;
}

static int dtype_of(const char *s)
{
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (strcmp(s, st_dtype_name(d)) == 0)
            return d;
    return -1;
}

int dfsp_open(const char *dir, model *m, blob_table *bt, dfsp_info *info, errbuf *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    memset(info, 0, sizeof *info);
    memset(bt, 0, sizeof *bt);
    json_t *man = jsonr_load_file(path, err);
    if (!man)
        return -1;
    st_set set;
    memset(&set, 0, sizeof set);
    int rc = -1;
    const char *fmt = NULL, *id = NULL;
    json_t *packs = json_object_get(man, "packs"), *blobs = json_object_get(man, "blobs");
    if (jsonr_str(man, "format", &fmt, 0, path, err) || strcmp(fmt, "dfsp") != 0 ||
        jsonr_str(man, "identity", &id, 0, path, err) || !json_is_array(packs) || !json_is_array(blobs) ||
        json_array_size(packs) == 0 || json_array_size(packs) > STORE_MAX_PACKS) {
        if (!err->msg[0] || !fmt || strcmp(fmt, "dfsp") != 0)
            errbuf_set(err, "%s: not a DFSP manifest (format, identity, packs, blobs)", path);
        goto out;
    }
    snprintf(info->identity, sizeof info->identity, "%s", id);
    info->npacks = (int)json_array_size(packs);
    int64_t v;
    info->ndrives = jsonr_int(man, "drives", &v, 0, path, err) ? 1 : (int)v;
    info->mirrors = jsonr_int(man, "mirrors", &v, 0, path, err) ? 1 : (int)v;
    set.files = calloc((size_t)info->npacks, sizeof *set.files);
    if (!set.files) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < info->npacks; i++) {
        json_t *pk = json_array_get(packs, (size_t)i);
        const char *pp = NULL;
        int64_t d = 0, size = 0;
        if (jsonr_str(pk, "path", &pp, 0, path, err) || jsonr_int(pk, "drive", &d, 0, path, err) ||
            jsonr_int(pk, "size", &size, 0, path, err))
            goto out;
        if (pp[0] == '/')
            snprintf(info->pack_path[i], sizeof info->pack_path[i], "%s", pp);
        else
            snprintf(info->pack_path[i], sizeof info->pack_path[i], "%s/%s", dir, pp);
        info->pack_drive[i] = (int)d;
        set.files[i].path = strdup(info->pack_path[i]);
        set.nfiles++;
        if (!set.files[i].path || file_map_open(&set.files[i].map, info->pack_path[i], err) != 0)
            goto out;
        if (set.files[i].map.size < (uint64_t)size) {
            errbuf_set(err, "%s: pack is truncated (%zu of %lld bytes)", info->pack_path[i], set.files[i].map.size,
                       (long long)size);
            goto out;
        }
    }
    size_t ntens = 0;
    for (size_t b = 0; b < json_array_size(blobs); b++)
        ntens += json_array_size(json_object_get(json_array_get(blobs, b), "tensors"));
    set.t = calloc(ntens ? ntens : 1, sizeof *set.t);
    if (!set.t) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    for (size_t b = 0; b < json_array_size(blobs); b++) {
        json_t *jb = json_array_get(blobs, b), *c0 = json_array_get(json_object_get(jb, "copies"), 0);
        int pack = (int)json_integer_value(json_array_get(c0, 0));
        uint64_t coff = (uint64_t)json_integer_value(json_array_get(c0, 1));
        json_t *ts = json_object_get(jb, "tensors");
        if (!c0 || pack < 0 || pack >= info->npacks || !json_is_array(ts)) {
            errbuf_set(err, "%s: blob %zu has no valid copy", path, b);
            goto out;
        }
        for (size_t i = 0; i < json_array_size(ts); i++) {
            json_t *e = json_array_get(ts, i), *shape = json_array_get(e, 2);
            st_tensor *x = &set.t[set.n];
            const char *name = json_string_value(json_array_get(e, 0));
            x->dtype = dtype_of(json_string_value(json_array_get(e, 1)) ? json_string_value(json_array_get(e, 1)) : "");
            uint64_t off = (uint64_t)json_integer_value(json_array_get(e, 3)), numel = 1;
            if (!name || x->dtype < 0 || !json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS) {
                errbuf_set(err, "%s: blob %zu tensor %zu is malformed", path, b, i);
                goto out;
            }
            x->ndim = (int)json_array_size(shape);
            for (int d = 0; d < x->ndim; d++) {
                x->shape[d] = (int64_t)json_integer_value(json_array_get(shape, (size_t)d));
                numel *= (uint64_t)x->shape[d];
            }
            uint64_t len = numel * (uint64_t)st_dtype_size(x->dtype);
            x->file = pack;
            x->file_off = coff + off;
            x->begin = x->file_off;
            x->end = x->file_off + len;
            if (x->end > set.files[pack].map.size || x->end < x->begin) {
                errbuf_set(err, "%s: tensor '%s' lies past the end of %s", path, name, info->pack_path[pack]);
                goto out;
            }
            x->data = set.files[pack].map.data + x->file_off;
            if (!(x->name = strdup(name))) {
                errbuf_set(err, "%s: out of memory", path);
                goto out;
            }
            set.n++;
        }
    }
    if (st_finish(&set, err) != 0)
        goto out;
    if (model_load_set(m, dir, &set, err) != 0)
        goto out_man;
    if (blob_table_build(bt, m, err) != 0) {
        model_free(m);
        goto out_man;
    }
    /* copies and checksums from the manifest; the image layout must be the one prepare wrote */
    for (size_t b = 0; b < json_array_size(blobs); b++) {
        json_t *jb = json_array_get(blobs, b);
        int kind = kind_of(json_string_value(json_object_get(jb, "kind")) ? json_string_value(json_object_get(jb, "kind")) : "");
        int layer = (int)json_integer_value(json_object_get(jb, "layer"));
        int expert = (int)json_integer_value(json_object_get(jb, "expert"));
        int id = -1;
        for (int k = 0; k < bt->n && id < 0; k++) /* experts via the index, the few others by scan */
            if (kind == BLOB_EXPERT) {
                if (layer >= 0 && layer < bt->n_layers && expert >= 0 && expert < bt->n_experts)
                    id = bt->expert_blob[(size_t)layer * bt->n_experts + expert];
                break;
            } else if (bt->b[k].kind == kind && bt->b[k].layer == layer) {
                id = k;
            }
        json_t *copies = json_object_get(jb, "copies");
        const char *h = json_string_value(json_object_get(jb, "xxh3"));
        if (id < 0 || !h || (uint64_t)json_integer_value(json_object_get(jb, "size")) != bt->b[id].size ||
            json_array_size(copies) < 1 || json_array_size(copies) > STORE_MAX_COPIES) {
            errbuf_set(err, "%s: blob %zu (%s layer %d expert %d) does not match the model", path, b,
                       kind >= 0 ? kind_name[kind] : "?", layer, expert);
            model_free(m);
            blob_table_free(bt);
            goto out_man;
        }
        blob *x = &bt->b[id];
        json_t *c0 = json_array_get(copies, 0);
        uint64_t base = (uint64_t)json_integer_value(json_array_get(c0, 1));
        for (int k = 0; k < x->nparts; k++) { /* tensors sit where prepare's layout put them */
            const blob_part *pt = &bt->part[x->first_part + k];
            if (m->st.t[pt->tensor].file_off != base + pt->off) {
                errbuf_set(err, "%s: blob %zu: tensor '%s' is not at the offset this engine's layout expects", path,
                           b, m->st.t[pt->tensor].name);
                model_free(m);
                blob_table_free(bt);
                goto out_man;
            }
        }
        x->xxh3 = strtoull(h, NULL, 16);
        x->ncopies = (int)json_array_size(copies);
        for (int k = 0; k < x->ncopies; k++) {
            json_t *c = json_array_get(copies, (size_t)k);
            x->copy[k].file = (int)json_integer_value(json_array_get(c, 0));
            x->copy[k].off = (uint64_t)json_integer_value(json_array_get(c, 1));
            if (x->copy[k].file < 0 || x->copy[k].file >= info->npacks || x->copy[k].off % BLOB_ALIGN ||
                x->copy[k].off + pad4k(x->size) > (uint64_t)m->st.files[x->copy[k].file].map.size) {
                errbuf_set(err, "%s: blob %zu copy %d lies outside its pack", path, b, k);
                model_free(m);
                blob_table_free(bt);
                goto out_man;
            }
        }
    }
    rc = 0;
    goto out_man;
out:
    st_close(&set);
out_man:
    json_decref(man);
    return rc;
}
