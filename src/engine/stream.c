/* stream.c — see stream.h. A blob is fetched range by range (its parts, adjacent ones merged, in
 * pieces of at most STREAM_PIECE bytes), each piece written at its place in the sparse shard; the
 * data is synced before the journal line that claims it, so a crash leaves at worst a blob fetched
 * again. */
#include "engine/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "base/timer.h"

#define STREAM_JOURNAL "stream.journal"
#define STREAM_PIECE ((uint64_t)64 << 20)

typedef struct srange {
    int file;
    uint64_t off, len;
} srange;

typedef struct sblob {
    int kind, present, shard_verified_at_open;
    int first_range, nranges;
    char *key;        /* "TENSOR+OFFSET": its first part's tensor and the part's offset in it (an
                         expert sliced from a fused tensor shares the tensor with its layer's others) */
    uint64_t xxh3;
} sblob;

typedef struct sshard {
    const char *name;  /* the file's name in the repo (its path relative to the folder) */
    char sha256[65];
    uint64_t size;
    int blobs, present; /* blobs with a part in this shard, and how many of them are present */
    int verified;
    int tried;          /* completed (or tried to) by this run */
    int fd;             /* for writing, opened on first use */
} sshard;

struct stream {
    char dir[1024], repo[256], commit[41], journal[1100];
    const model *m;
    hub *h;
    sblob *b;
    int nb;
    srange *r;
    int nr;
    int *by_key;   /* [nb] blob ids sorted by key */
    sshard *sh;    /* [m->st.nfiles] */
    int nsh;
    int jfd;
    store_fetcher f;
    stream_counts c;
};

int stream_is_install(const char *dir)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, STREAM_JSON);
    return file_exists(p);
}

static int by_key_cmp(const void *a, const void *b, void *ctx)
{
    const stream *s = ctx;
    return strcmp(s->b[*(const int *)a].key, s->b[*(const int *)b].key);
}

static int blob_of_key(const stream *s, const char *key)
{
    int lo = 0, hi = s->nb - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s->b[s->by_key[mid]].key, key);
        if (c == 0)
            return s->by_key[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* The shard a blob's first range is in (a blob's parts share one shard in every release seen;
 * one that spans two counts toward the first). */
static int shard_of(const stream *s, int b) { return s->r[s->b[b].first_range].file; }

/* 1 if blob b has a range in shard i */
static int touches(const stream *s, int b, int i)
{
    for (int r = 0; r < s->b[b].nranges; r++)
        if (s->r[s->b[b].first_range + r].file == i)
            return 1;
    return 0;
}

/* Adds d to the count c of every shard blob b has a range in (each once). */
static void count_shards(stream *s, int b, int d, int which)
{
    for (int r = 0; r < s->b[b].nranges; r++) {
        int f = s->r[s->b[b].first_range + r].file, seen = 0;
        for (int q = 0; q < r; q++)
            seen |= s->r[s->b[b].first_range + q].file == f;
        if (!seen)
            *(which ? &s->sh[f].present : &s->sh[f].blobs) += d;
    }
}

/* Forgets every blob with a range in shard i (a shard that failed its sha256: all of it is fetched
 * again, the spine by setup --stream, the experts as they are routed). */
static void forget_shard(stream *s, int i)
{
    s->sh[i].verified = 0;
    for (int b = 0; b < s->nb; b++)
        if (s->b[b].present && touches(s, b, i)) {
            s->b[b].present = 0;
            count_shards(s, b, -1, 1);
        }
}

static void mark_present(stream *s, int b, uint64_t h)
{
    if (!s->b[b].present) {
        s->b[b].present = 1;
        count_shards(s, b, +1, 1);
    }
    s->b[b].xxh3 = h;
}

static int journal_append(stream *s, const char *line, errbuf *err)
{
    size_t n = strlen(line);
    if (write(s->jfd, line, n) != (ssize_t)n || fsync(s->jfd))
        return errbuf_errno(err, s->journal);
    return 0;
}

void stream_journal_scan(const char *txt, size_t len, void (*on)(void *ctx, char kind, uint64_t xxh3, const char *name),
                         void *ctx)
{
    char line[1200];
    for (size_t at = 0; at < len;) {
        const char *p = txt + at, *nl = memchr(p, '\n', len - at);
        if (!nl)
            break; /* a torn last line: its blob is fetched again */
        size_t n = (size_t)(nl - p);
        at += n + 1;
        if (n < 3 || n >= sizeof line || p[1] != ' ' || memchr(p, 0, n))
            continue;
        memcpy(line, p, n);
        line[n] = 0;
        unsigned long long h;
        char key[1100];
        int used = 0;
        if (line[0] == 'B' && sscanf(line + 2, "%16llx %1099s%n", &h, key, &used) == 2 && line[2 + used] == 0)
            on(ctx, 'B', (uint64_t)h, key);
        else if ((line[0] == 'V' || line[0] == 'R') && !strchr(line + 2, ' '))
            on(ctx, line[0], 0, line + 2);
    }
}

static void journal_line(void *ctx, char kind, uint64_t h, const char *name)
{
    stream *s = ctx;
    if (kind == 'B') {
        int b = blob_of_key(s, name);
        if (b >= 0)
            mark_present(s, b, h);
        return;
    }
    for (int i = 0; i < s->nsh; i++) {
        if (strcmp(s->sh[i].name, name))
            continue;
        if (kind == 'V')
            s->sh[i].verified = 1;
        else
            forget_shard(s, i);
    }
}

/* Reads the journal; *keep: the bytes of its whole lines. */
static int journal_load(stream *s, off_t *keep, errbuf *err)
{
    char *txt = NULL;
    size_t len = 0;
    *keep = 0;
    if (file_exists(s->journal) && file_read_all(s->journal, &txt, &len, err))
        return -1;
    if (txt) {
        stream_journal_scan(txt, len, journal_line, s);
        while (len > 0 && txt[len - 1] != '\n')
            len--;
        *keep = (off_t)len;
    }
    free(txt);
    return 0;
}

/* the store's view (store_fetcher) */
static int fetch_of(void *ctx, int b, errbuf *err) { return stream_fetch(ctx, b, err); }
static int present_of(void *ctx, int b) { return stream_present(ctx, b); }
static int sum_of(void *ctx, int b, uint64_t *xxh3)
{
    const stream *s = ctx;
    if (b < 0 || b >= s->nb || !s->b[b].present)
        return 0;
    *xxh3 = s->b[b].xxh3;
    return 1;
}

int stream_open(stream **out, const char *dir, const model *m, const blob_table *bt, hub *h, int need_spine,
                errbuf *err)
{
    *out = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, STREAM_JSON);
    json_t *j = jsonr_load_file(path, err), *files;
    if (!j)
        return -1;
    stream *s = calloc(1, sizeof *s);
    const char *repo = NULL, *commit = NULL, *fmt = NULL;
    int rc = -1;
    if (!s) {
        errbuf_set(err, "out of memory");
        goto done;
    }
    s->jfd = -1;
    if (jsonr_str(j, "format", &fmt, 0, path, err) || jsonr_str(j, "repo", &repo, 0, path, err) ||
        jsonr_str(j, "commit", &commit, 0, path, err))
        goto done;
    if (strcmp(fmt, "deltafin-stream") || strlen(commit) != 40 || !json_is_object(files = json_object_get(j, "files"))) {
        errbuf_set(err, "%s: not a deltafin-stream install (format, a 40-hex commit and files are needed)", path);
        goto done;
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    snprintf(s->repo, sizeof s->repo, "%s", repo);
    memcpy(s->commit, commit, 41);
    snprintf(s->journal, sizeof s->journal, "%s/%s", dir, STREAM_JOURNAL);
    s->m = m;
    s->h = h;
    s->nsh = m->st.nfiles;
    s->nb = bt->n;
    s->sh = calloc((size_t)s->nsh + 1, sizeof *s->sh);
    s->b = calloc((size_t)s->nb + 1, sizeof *s->b);
    s->r = calloc((size_t)bt->nparts + 1, sizeof *s->r);
    s->by_key = calloc((size_t)s->nb + 1, sizeof *s->by_key);
    if (!s->sh || !s->b || !s->r || !s->by_key) {
        errbuf_set(err, "out of memory");
        goto done;
    }
    size_t dl = strlen(dir);
    for (int i = 0; i < s->nsh; i++) {
        sshard *x = &s->sh[i];
        const char *p = m->st.files[i].path;
        x->fd = -1;
        const char *base = strrchr(p, '/');
        x->name = strncmp(p, dir, dl) == 0 && p[dl] == '/' ? p + dl + 1 : base ? base + 1 : p;
        json_t *e = json_object_get(files, x->name);
        const char *sha;
        int64_t size;
        if (!json_is_object(e) || jsonr_str(e, "sha256", &sha, 0, path, err) || jsonr_int(e, "size", &size, 0, path, err)) {
            errbuf_set(err, "%s: no sha256 and size for '%s'", path, x->name);
            goto done;
        }
        snprintf(x->sha256, sizeof x->sha256, "%s", sha);
        x->size = (uint64_t)size;
    }
    for (int b = 0; b < s->nb; b++) { /* the parts as file ranges, adjacent ones merged */
        const blob *x = &bt->b[b];
        sblob *y = &s->b[b];
        y->kind = x->kind;
        y->first_range = s->nr;
        for (int i = 0; i < x->nparts; i++) {
            const blob_part *pt = &bt->part[x->first_part + i];
            const st_tensor *t = &m->st.t[pt->tensor];
            if (i == 0) {
                size_t kl = strlen(t->name) + 24;
                if (!(y->key = malloc(kl))) {
                    errbuf_set(err, "out of memory");
                    goto done;
                }
                snprintf(y->key, kl, "%s+%llu", t->name, (unsigned long long)pt->src);
            }
            uint64_t off = t->file_off + pt->src;
            srange *last = y->nranges ? &s->r[s->nr - 1] : NULL;
            if (last && last->file == t->file && last->off + last->len == off) {
                last->len += pt->len;
            } else {
                s->r[s->nr++] = (srange){.file = t->file, .off = off, .len = pt->len};
                y->nranges++;
            }
        }
        if (!y->nranges) {
            errbuf_set(err, "%s: blob %d has no parts", dir, b);
            goto done;
        }
        s->by_key[b] = b;
        count_shards(s, b, +1, 0);
        s->c.experts += x->kind == BLOB_EXPERT;
    }
    qsort_r(s->by_key, (size_t)s->nb, sizeof *s->by_key, by_key_cmp, s);
    off_t keep = 0;
    if (journal_load(s, &keep, err))
        goto done;
    /* appended to from its last whole line on: a torn tail (a crash) would glue onto the next */
    if ((s->jfd = open(s->journal, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0 || ftruncate(s->jfd, keep) ||
        lseek(s->jfd, 0, SEEK_END) < 0) {
        errbuf_errno(err, s->journal);
        goto done;
    }
    for (int b = 0; need_spine && b < s->nb; b++)
        if (s->b[b].kind != BLOB_EXPERT && !s->b[b].present) {
            errbuf_set(err, "%s: the spine is not all fetched yet ('%s' is missing): rerun deltafin setup --stream", dir,
                       s->b[b].key);
            goto done;
        }
    s->f = (store_fetcher){.ctx = s, .fetch = fetch_of, .present = present_of, .sum = sum_of};
    rc = 0;
done:
    json_decref(j);
    if (rc)
        stream_free(s);
    else
        *out = s;
    return rc;
}

void stream_free(stream *s)
{
    if (!s)
        return;
    for (int i = 0; s->sh && i < s->nsh; i++)
        if (s->sh[i].fd >= 0)
            close(s->sh[i].fd);
    if (s->jfd >= 0)
        close(s->jfd);
    free(s->sh);
    for (int b = 0; s->b && b < s->nb; b++)
        free(s->b[b].key);
    free(s->b);
    free(s->r);
    free(s->by_key);
    free(s);
}

const store_fetcher *stream_fetcher(stream *s) { return &s->f; }

int stream_present(const stream *s, int b) { return b >= 0 && b < s->nb && s->b[b].present; }

static int shard_fd(stream *s, int i, errbuf *err)
{
    if (s->sh[i].fd < 0 && (s->sh[i].fd = open(s->m->st.files[i].path, O_WRONLY | O_CLOEXEC)) < 0)
        return errbuf_errno(err, s->m->st.files[i].path);
    return s->sh[i].fd;
}

/* Fetches [off, off + len) of shard i into its place; h (may be NULL) hashes the bytes in order. */
static int fetch_range(stream *s, int i, uint64_t off, uint64_t len, XXH3_state_t *h, unsigned char *buf,
                       errbuf *err)
{
    int fd = shard_fd(s, i, err);
    if (fd < 0)
        return -1;
    for (uint64_t at = 0; at < len;) {
        uint64_t k = len - at < STREAM_PIECE ? len - at : STREAM_PIECE;
        if (hub_range_get(s->h, s->repo, s->commit, s->sh[i].name, off + at, k, buf, err))
            return -1;
        if (file_pwrite_full(fd, buf, (size_t)k, off + at))
            return errbuf_errno(err, s->m->st.files[i].path);
        if (h)
            XXH3_64bits_update(h, buf, (size_t)k);
        s->c.bytes_fetched += k;
        at += k;
    }
    return 0;
}

/* Every blob of shard i is present: fetch the bytes no blob holds (its header again, tensors the
 * text model does not use), then hash the whole file against the hub's sha256. 0: verified; 1: it
 * does not match (err says so; everything recorded of the shard is forgotten, to be fetched again);
 * -1: it could not be checked now (err: a fetch or read failed; it is tried again next run). */
static int shard_complete(stream *s, int i, unsigned char *buf, errbuf *err)
{
    sshard *x = &s->sh[i];
    const char *path = s->m->st.files[i].path;
    /* the present intervals: the ranges in this shard of the blobs that are present, sorted */
    int n = 0;
    srange *iv = malloc(sizeof *iv * ((size_t)s->nr + 1));
    if (!iv)
        return errbuf_set(err, "out of memory");
    for (int b = 0; b < s->nb; b++)
        for (int r = 0; s->b[b].present && r < s->b[b].nranges; r++)
            if (s->r[s->b[b].first_range + r].file == i)
                iv[n++] = s->r[s->b[b].first_range + r];
    for (int a = 1; a < n; a++) /* insertion sort: ranges of a shard come nearly in order */
        for (int b = a; b > 0 && iv[b - 1].off > iv[b].off; b--) {
            srange t = iv[b];
            iv[b] = iv[b - 1];
            iv[b - 1] = t;
        }
    int rc = 0;
    uint64_t at = 0;
    for (int k = 0; k <= n && rc == 0; k++) {
        uint64_t start = k < n ? iv[k].off : x->size;
        if (start > at)
            rc = fetch_range(s, i, at, start - at, NULL, buf, err);
        if (k < n && iv[k].off + iv[k].len > at)
            at = iv[k].off + iv[k].len;
    }
    free(iv);
    int wfd = rc == 0 ? shard_fd(s, i, err) : -1;
    if (rc == 0 && (wfd < 0 || fdatasync(wfd)))
        rc = wfd < 0 ? -1 : errbuf_errno(err, path);
    char hex[65], line[1200];
    int rfd = rc == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (rc == 0 && (rfd < 0 || hub_sha256_file(rfd, x->size, hex)))
        rc = errbuf_errno(err, path);
    if (rfd >= 0)
        close(rfd);
    if (rc)
        return -1;
    if (strcmp(hex, x->sha256)) { /* some byte is wrong, and nothing says which */
        snprintf(line, sizeof line, "R %s\n", x->name);
        journal_append(s, line, err);
        forget_shard(s, i);
        errbuf_set(err, "%s: its sha256 after streaming is not the hub's (%s@%.12s); what was fetched of it is "
                        "forgotten: rerun deltafin setup --stream",
                   path, s->repo, s->commit);
        return 1;
    }
    snprintf(line, sizeof line, "V %s\n", x->name);
    if (journal_append(s, line, err))
        return -1;
    x->verified = 1;
    return 0;
}

/* Completes every shard of blob b that has all its blobs now and is not verified yet (once a run
 * each): a shard that fails its sha256 fails the read; one that cannot be checked now stays
 * unverified. */
static int shards_complete(stream *s, int b, errbuf *err)
{
    unsigned char *buf = NULL;
    int rc = 0;
    for (int r = 0; r < s->b[b].nranges && rc == 0; r++) {
        sshard *x = &s->sh[s->r[s->b[b].first_range + r].file];
        if (x->verified || x->tried || x->present < x->blobs || !s->h)
            continue;
        x->tried = 1;
        if (!buf && !(buf = malloc((size_t)STREAM_PIECE)))
            return errbuf_set(err, "out of memory");
        errbuf e2;
        if (shard_complete(s, s->r[s->b[b].first_range + r].file, buf, &e2) == 1) {
            *err = e2;
            rc = -1;
        }
    }
    free(buf);
    return rc;
}

int stream_fetch(stream *s, int b, errbuf *err)
{
    if (b < 0 || b >= s->nb)
        return errbuf_set(err, "stream: blob %d out of range", b);
    if (s->b[b].present)
        return shards_complete(s, b, err);
    sblob *y = &s->b[b];
    if (!s->h)
        return errbuf_set(err, "%s: the bytes of '%s' have not been fetched yet, and no hub is set up", s->dir, y->key);
    double t0 = timer_now();
    uint64_t most = 0;
    for (int r = 0; r < y->nranges; r++)
        if (s->r[y->first_range + r].len > most)
            most = s->r[y->first_range + r].len;
    unsigned char *buf = malloc((size_t)(most < STREAM_PIECE ? most : STREAM_PIECE) + 1);
    XXH3_state_t *h = XXH3_createState();
    int rc = -1;
    if (!buf || !h) {
        errbuf_set(err, "out of memory");
        goto done;
    }
    XXH3_64bits_reset(h);
    for (int r = 0; r < y->nranges; r++) {
        const srange *x = &s->r[y->first_range + r];
        if (fetch_range(s, x->file, x->off, x->len, h, buf, err))
            goto done;
    }
    for (int r = 0; r < y->nranges; r++) { /* the bytes are on the drive before the journal says so */
        int f = s->r[y->first_range + r].file, fd = shard_fd(s, f, err);
        if (fd < 0 || fdatasync(fd)) {
            if (fd >= 0)
                errbuf_errno(err, s->m->st.files[f].path);
            goto done;
        }
    }
    uint64_t sum = XXH3_64bits_digest(h);
    char line[1200];
    snprintf(line, sizeof line, "B %016llx %s\n", (unsigned long long)sum, y->key);
    if (journal_append(s, line, err))
        goto done;
    mark_present(s, b, sum);
    s->c.fetched++;
    free(buf);
    buf = NULL;
    if (shards_complete(s, b, err))
        goto done;
    rc = 0;
done:
    s->c.fetch_s += timer_now() - t0;
    XXH3_freeState(h);
    free(buf);
    return rc;
}

void stream_counts_get(const stream *s, stream_counts *out)
{
    *out = s->c;
    out->experts_present = out->experts_unverified = out->shards_verified = 0;
    out->shards = s->nsh;
    for (int b = 0; b < s->nb; b++)
        if (s->b[b].kind == BLOB_EXPERT && s->b[b].present) {
            out->experts_present++;
            out->experts_unverified += !s->sh[shard_of(s, b)].verified;
        }
    for (int i = 0; i < s->nsh; i++)
        out->shards_verified += s->sh[i].verified;
}

int stream_check(const stream *s, errbuf *err)
{
    unsigned char *buf = malloc((size_t)STREAM_PIECE);
    int *fd = malloc(sizeof *fd * ((size_t)s->nsh + 1)), rc = 0;
    if (!buf || !fd) {
        free(buf);
        free(fd);
        return errbuf_set(err, "out of memory");
    }
    for (int i = 0; i < s->nsh; i++)
        fd[i] = -1;
    for (int i = 0; i < s->nsh && rc == 0; i++)
        if ((fd[i] = open(s->m->st.files[i].path, O_RDONLY | O_CLOEXEC)) < 0)
            rc = errbuf_errno(err, s->m->st.files[i].path);
    XXH3_state_t *h = XXH3_createState();
    for (int b = 0; b < s->nb && rc == 0; b++) {
        if (!s->b[b].present)
            continue;
        XXH3_64bits_reset(h);
        for (int r = 0; r < s->b[b].nranges && rc == 0; r++) {
            const srange *x = &s->r[s->b[b].first_range + r];
            for (uint64_t at = 0; at < x->len && rc == 0;) {
                size_t k = x->len - at < STREAM_PIECE ? (size_t)(x->len - at) : (size_t)STREAM_PIECE;
                if (file_pread_full(fd[x->file], buf, k, x->off + at))
                    rc = errbuf_errno(err, s->m->st.files[x->file].path);
                XXH3_64bits_update(h, buf, k);
                at += k;
            }
        }
        if (rc == 0 && XXH3_64bits_digest(h) != s->b[b].xxh3)
            rc = errbuf_set(err, "%s: the bytes of '%s' are not those fetched (xxh3 %016llx, %016llx when fetched)",
                            s->m->st.files[shard_of(s, b)].path, s->b[b].key,
                            (unsigned long long)XXH3_64bits_digest(h), (unsigned long long)s->b[b].xxh3);
    }
    XXH3_freeState(h);
    char hex[65];
    for (int i = 0; i < s->nsh && rc == 0; i++)
        if (s->sh[i].verified) {
            if (hub_sha256_file(fd[i], s->sh[i].size, hex))
                rc = errbuf_errno(err, s->m->st.files[i].path);
            else if (strcmp(hex, s->sh[i].sha256))
                rc = errbuf_set(err, "%s: its sha256 is no longer the hub's (%s@%.12s)", s->m->st.files[i].path,
                                s->repo, s->commit);
        }
    for (int i = 0; i < s->nsh; i++)
        if (fd[i] >= 0)
            close(fd[i]);
    free(fd);
    free(buf);
    return rc;
}

int stream_json_write(const char *dir, const hub_repo *r, errbuf *err)
{
    json_t *files = json_object();
    for (int i = 0; i < r->n_files; i++) {
        const hub_file *f = &r->files[i];
        size_t l = strlen(f->path);
        if (l > 12 && !strcmp(f->path + l - 12, ".safetensors"))
            json_object_set_new(files, f->path,
                                json_pack("{s:I, s:s}", "size", (json_int_t)f->size, "sha256", f->sha256));
    }
    json_t *j = json_pack("{s:s, s:i, s:s, s:s, s:o}", "format", "deltafin-stream", "version", 1, "repo", r->name,
                          "commit", r->commit, "files", files);
    char *txt = j ? json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, STREAM_JSON);
    int rc = txt ? file_write_atomic(path, txt, strlen(txt), err) : errbuf_set(err, "%s: out of memory", path);
    free(txt);
    return rc;
}
