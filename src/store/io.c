/* io.c — see io.h.
 *
 * Bookkeeping lives in fixed pools reserved at io_new (jobs = one io_read, pieces = one
 * request), recycled through free lists: reading allocates nothing. A piece goes
 * queued (per-drive FIFO) -> in flight (backend) -> held (emulation not yet done) -> reaped.
 */
#include "store/io.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <liburing.h>
#define HAVE_URING 1
#endif

#include "base/file.h"
#include "base/jsonr.h"
#include "base/timer.h"

enum { MAX_JOBS = 8192, MAX_PIECES = 65536 };

typedef struct piece {
    int job, file, drive;
    uint64_t off, len;
    void *buf;
    double t_submit, t_release;
    int res_ok;
    int next; /* free list / queue link */
} piece;

typedef struct job {
    uint64_t tag;
    int left;   /* pieces not yet done */
    int ok;
    int next;
} job;

typedef struct drive {
    int q_head, q_tail;     /* queued pieces (FIFO) */
    int in_flight;          /* submitted to the backend or held */
    uint64_t backlog;       /* bytes queued + in flight */
    double busy_until;      /* emulation: when the modelled drive goes idle */
    double busy_start;
    double changed;         /* when in_flight last changed */
    io_drive_stats st;
} drive;

struct io_engine {
    io_cfg cfg;
    int backend;
    int fds[IO_MAX_FILES], fdrive[IO_MAX_FILES], fdirect[IO_MAX_FILES], nfiles;
    piece *pc;
    job *jb;
    int free_piece, free_job;
    int pieces_free; /* length of the free_piece list */
    int jobs_live;
    drive dr[IO_MAX_DRIVES];
    int *held;              /* pieces done by the backend, waiting for their emulated time */
    int nheld;
    int *done_jobs;         /* finished jobs not yet reaped */
    int ndone;
#ifdef HAVE_URING
    struct io_uring ring;
    int ring_ok;
    /* registered destination memory: pieces wholly inside one region are read with
     * read_fixed (the kernel pins those pages once, not on every request) */
    uint8_t *reg_base;
    uint64_t reg_len;
    int nreg;
    uint64_t fixed_reads;
#endif
    /* pread pool */
    pthread_t *th;
    int nth;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int *pq;                /* pieces handed to the pool (ring buffer) */
    int pq_head, pq_n;
    int *cq;                /* pieces the pool finished */
    int cq_n;
    int quit;
};

void io_cfg_default(io_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->backend = IO_AUTO;
    /* measured here (doctor): 4 MiB requests, and enough of them in flight that the drive still
     * has work while the engine computes on what has landed */
    c->depth = 64;
    c->chunk = 4 << 20;
    c->ndrives = 1;
}

int io_parse_emulation(io_cfg *c, const char *spec, errbuf *err)
{
    int n = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        double mbps = strtod(p, &end);
        if (end == p || *end != ':' || !(mbps > 0))
            return errbuf_set(err, "--emulate-drives '%s': expected MBps:latency_us pairs, at '%s'", spec, p);
        p = end + 1;
        double lat = strtod(p, &end);
        if (end == p || lat < 0)
            return errbuf_set(err, "--emulate-drives '%s': bad latency at '%s'", spec, p);
        if (n >= IO_MAX_DRIVES)
            return errbuf_set(err, "--emulate-drives: at most %d drives", IO_MAX_DRIVES);
        c->emu_mbps[n] = mbps;
        c->emu_lat_us[n] = lat;
        n++;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return errbuf_set(err, "--emulate-drives '%s': expected ',' at '%s'", spec, p);
    }
    if (n > c->ndrives)
        c->ndrives = n;
    return 0;
}

/* ---- pread pool ---- */

static void *pool_main(void *arg)
{
    io_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->quit && e->pq_n == 0)
            pthread_cond_wait(&e->work_cv, &e->mu);
        if (e->quit)
            break;
        int id = e->pq[e->pq_head];
        e->pq_head = (e->pq_head + 1) % MAX_PIECES;
        e->pq_n--;
        pthread_mutex_unlock(&e->mu);
        piece *p = &e->pc[id];
        uint64_t got = 0;
        int ok = 1;
        while (got < p->len) {
            ssize_t r = pread(e->fds[p->file], (char *)p->buf + got, p->len - got, (off_t)(p->off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                ok = 0;
                break;
            }
            got += (uint64_t)r;
        }
        if (!e->fdirect[p->file])
            posix_fadvise(e->fds[p->file], (off_t)p->off, (off_t)p->len, POSIX_FADV_DONTNEED);
        pthread_mutex_lock(&e->mu);
        p->res_ok = ok;
        e->cq[e->cq_n++] = id;
        pthread_cond_signal(&e->done_cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

enum { TUNE_MIN_REQ = 4096, TUNE_MAX_REQ = 64 << 20, TUNE_MAX_DEPTH = 256 };

int io_tune_files(io_cfg *c, const char *const *paths, const int *drive, int n, errbuf *err)
{
    for (int d = 0; d < c->ndrives && d < IO_MAX_DRIVES; d++)
        for (int i = 0; i < n; i++) {
            if (drive[i] != d)
                continue;
            char dir[1024];
            const char *p = paths[i], *slash = strrchr(p, '/');
            if (!slash)
                snprintf(dir, sizeof dir, ".");
            else
                snprintf(dir, sizeof dir, "%.*s", slash == p ? 1 : (int)(slash - p), p);
            if (io_tune_load(c, d, dir, err) < 0)
                return -1;
            break;
        }
    return 0;
}

int io_tune_load(io_cfg *c, int d, const char *dir, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, IO_TUNE_FILE);
    if (access(path, F_OK) != 0)
        return 0;
    json_t *j = jsonr_load_file(path, err);
    if (!j)
        return -1;
    int rc = io_tune_parse(c, d, j, path, err);
    json_decref(j);
    return rc;
}

int io_tune_parse(io_cfg *c, int d, const json_t *j, const char *path, errbuf *err)
{
    int64_t req = 0, depth = 0;
    double best = 0, cold = 0, sus = 0;
    if (d < 0 || d >= IO_MAX_DRIVES)
        return errbuf_set(err, "%s: drive %d is past the %d drives the engine takes", path, d, IO_MAX_DRIVES);
    if (jsonr_int(j, "request_bytes", &req, 0, path, err) != 0 || jsonr_int(j, "depth", &depth, 0, path, err) != 0 ||
        jsonr_num(j, "best_gbps", &best, 1, path, err) != 0 || jsonr_num(j, "cold_gbps", &cold, 1, path, err) != 0 ||
        jsonr_num(j, "sustained_gbps", &sus, 1, path, err) != 0)
        return -1;
    if (req < TUNE_MIN_REQ || req > TUNE_MAX_REQ || req % 4096)
        return errbuf_set(err, "%s: field 'request_bytes': %lld is not a multiple of 4096 in [4 KiB, 64 MiB]", path,
                          (long long)req);
    if (depth < 1 || depth > TUNE_MAX_DEPTH)
        return errbuf_set(err, "%s: field 'depth': %lld is outside [1, %d]", path, (long long)depth, TUNE_MAX_DEPTH);
    if (!(best >= 0 && best < 1e6))
        return errbuf_set(err, "%s: field 'best_gbps': %g is not a bandwidth in GB/s", path, best);
    if (!(cold >= 0 && cold < 1e6))
        return errbuf_set(err, "%s: field 'cold_gbps': %g is not a bandwidth in GB/s", path, cold);
    if (!(sus >= 0 && sus < 1e6))
        return errbuf_set(err, "%s: field 'sustained_gbps': %g is not a bandwidth in GB/s", path, sus);
    c->drive_chunk[d] = (uint64_t)req;
    c->drive_depth[d] = (int)depth;
    c->drive_best_gbps[d] = best;
    c->drive_cold_gbps[d] = cold;
    c->drive_sustained_gbps[d] = sus;
    return 1;
}

int io_tune_save(const char *dir, uint64_t request_bytes, int depth, double gbps, double best_gbps, double cold_gbps,
                 double sustained_gbps, errbuf *err)
{
    char path[4200], buf[480], cold[64] = "", sus[64] = "";
    snprintf(path, sizeof path, "%s/%s", dir, IO_TUNE_FILE);
    if (cold_gbps > 0)
        snprintf(cold, sizeof cold, "\"cold_gbps\": %.3f, ", cold_gbps);
    if (sustained_gbps > 0)
        snprintf(sus, sizeof sus, "\"sustained_gbps\": %.3f, ", sustained_gbps);
    int n = snprintf(buf, sizeof buf,
                     "{\"request_bytes\": %llu, \"depth\": %d, \"gbps\": %.3f, \"best_gbps\": %.3f, %s%s"
                     "\"note\": \"deltafin doctor --drives: least in flight within 5%% of the best O_DIRECT read\"}\n",
                     (unsigned long long)request_bytes, depth, gbps, best_gbps, cold, sus);
    return file_write_atomic(path, buf, (size_t)n, err);
}

int io_drive_depth(const io_engine *e, int d) { return e->cfg.drive_depth[d]; }
double io_drive_best_gbps(const io_engine *e, int d) { return e->cfg.drive_best_gbps[d]; }
double io_drive_cold_gbps(const io_engine *e, int d) { return e->cfg.drive_cold_gbps[d]; }
double io_drive_sustained_gbps(const io_engine *e, int d) { return e->cfg.drive_sustained_gbps[d]; }
double io_drive_emulated_gbps(const io_engine *e, int d) { return e->cfg.emu_mbps[d] / 1000.0; }
uint64_t io_drive_chunk(const io_engine *e, int d) { return e->cfg.drive_chunk[d]; }
int io_total_depth(const io_engine *e)
{
    int t = 0;
    for (int d = 0; d < e->cfg.ndrives; d++)
        t += e->cfg.drive_depth[d];
    return t;
}

io_engine *io_new(const io_cfg *c, errbuf *err)
{
    io_engine *e = calloc(1, sizeof *e);
    if (!e) {
        errbuf_set(err, "io: out of memory");
        return NULL;
    }
    e->cfg = *c;
    if (e->cfg.depth < 1)
        e->cfg.depth = 1;
    if (e->cfg.chunk < 4096)
        e->cfg.chunk = 4096;
    e->cfg.chunk &= ~(uint64_t)4095;
    if (e->cfg.ndrives < 1)
        e->cfg.ndrives = 1;
    if (e->cfg.ndrives > IO_MAX_DRIVES)
        e->cfg.ndrives = IO_MAX_DRIVES;
    for (int d = 0; d < IO_MAX_DRIVES; d++) { /* every drive's own values: tuned, else the defaults */
        if (e->cfg.drive_depth[d] < 1)
            e->cfg.drive_depth[d] = e->cfg.depth;
        if (e->cfg.drive_chunk[d] < 4096)
            e->cfg.drive_chunk[d] = e->cfg.chunk;
        e->cfg.drive_chunk[d] &= ~(uint64_t)4095;
    }
    e->pc = calloc(MAX_PIECES, sizeof *e->pc);
    e->jb = calloc(MAX_JOBS, sizeof *e->jb);
    e->held = calloc(MAX_PIECES, sizeof(int));
    e->done_jobs = calloc(MAX_JOBS, sizeof(int));
    e->pq = calloc(MAX_PIECES, sizeof(int));
    e->cq = calloc(MAX_PIECES, sizeof(int));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    if (!e->pc || !e->jb || !e->held || !e->done_jobs || !e->pq || !e->cq) {
        io_free(e);
        errbuf_set(err, "io: out of memory");
        return NULL;
    }
    for (int i = 0; i < MAX_PIECES; i++)
        e->pc[i].next = i + 1 < MAX_PIECES ? i + 1 : -1;
    e->pieces_free = MAX_PIECES;
    for (int i = 0; i < MAX_JOBS; i++)
        e->jb[i].next = i + 1 < MAX_JOBS ? i + 1 : -1;
    for (int d = 0; d < IO_MAX_DRIVES; d++)
        e->dr[d].q_head = e->dr[d].q_tail = -1;
    e->backend = c->backend == IO_AUTO ? IO_URING : c->backend;
#ifdef HAVE_URING
    if (e->backend == IO_URING) {
        unsigned entries = (unsigned)io_total_depth(e);
        if (entries > 4096)
            entries = 4096;
        if (io_uring_queue_init(entries, &e->ring, 0) == 0)
            e->ring_ok = 1;
        else if (c->backend == IO_URING) {
            io_free(e);
            errbuf_set(err, "io: io_uring is not available here");
            return NULL;
        } else
            e->backend = IO_PREAD;
    }
#else
    e->backend = IO_PREAD;
#endif
    if (e->backend == IO_PREAD) {
        e->nth = io_total_depth(e);
        if (e->nth > 64)
            e->nth = 64;
        e->th = calloc((size_t)e->nth, sizeof *e->th);
        for (int i = 0; e->th && i < e->nth; i++)
            if (pthread_create(&e->th[i], NULL, pool_main, e) != 0) {
                e->nth = i;
                break;
            }
        if (!e->th || e->nth == 0) {
            io_free(e);
            errbuf_set(err, "io: cannot start reader threads");
            return NULL;
        }
    }
    return e;
}

void io_free(io_engine *e)
{
    if (!e)
        return;
    if (e->th) {
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        pthread_cond_broadcast(&e->work_cv);
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < e->nth; i++)
            pthread_join(e->th[i], NULL);
        free(e->th);
    }
#ifdef HAVE_URING
    if (e->ring_ok)
        io_uring_queue_exit(&e->ring);
#endif
    for (int i = 0; i < e->nfiles; i++)
        close(e->fds[i]);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    free(e->pc);
    free(e->jb);
    free(e->held);
    free(e->done_jobs);
    free(e->pq);
    free(e->cq);
    free(e);
}

const char *io_backend_name(const io_engine *e) { return e->backend == IO_URING ? "io_uring" : "pread"; }

int io_register_memory(io_engine *e, void *base, uint64_t len, errbuf *err)
{
#ifdef HAVE_URING
    if (e->backend != IO_URING || !e->ring_ok || e->nreg > 0 || len == 0)
        return errbuf_set(err, "io: buffers can be registered once, with io_uring only");
    int n = (int)((len + IO_REG_MAX - 1) / IO_REG_MAX);
    struct iovec *iov = calloc((size_t)n, sizeof *iov);
    if (!iov)
        return errbuf_set(err, "io: out of memory");
    for (int i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * IO_REG_MAX;
        iov[i].iov_base = (uint8_t *)base + off;
        iov[i].iov_len = len - off < IO_REG_MAX ? len - off : IO_REG_MAX;
    }
    int rc = io_uring_register_buffers(&e->ring, iov, (unsigned)n);
    free(iov);
    if (rc < 0)
        return errbuf_set(err, "io: registering %llu bytes of read buffers failed (%s)", (unsigned long long)len,
                          strerror(-rc));
    e->reg_base = base;
    e->reg_len = len;
    e->nreg = n;
    return 0;
#else
    (void)e;
    (void)base;
    (void)len;
    return errbuf_set(err, "io: registered buffers need io_uring");
#endif
}

uint64_t io_fixed_reads(const io_engine *e)
{
#ifdef HAVE_URING
    return e->fixed_reads;
#else
    (void)e;
    return 0;
#endif
}

int io_open(io_engine *e, const char *path, int d, int direct, errbuf *err)
{
    if (e->nfiles >= IO_MAX_FILES)
        return errbuf_set(err, "%s: too many open files in the store (%d)", path, IO_MAX_FILES);
    if (d < 0 || d >= IO_MAX_DRIVES)
        return errbuf_set(err, "%s: drive %d out of range", path, d);
    int fd = -1;
#ifdef O_DIRECT
    if (direct)
        fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
    if (fd < 0) {
        direct = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        return errbuf_errno(err, path);
#ifdef F_NOCACHE
    fcntl(fd, F_NOCACHE, 1); /* macOS: the portable path's O_DIRECT */
#endif
    if (!direct) /* reads are exact byte ranges: readahead around them would read what no one asked for */
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    e->fds[e->nfiles] = fd;
    e->fdrive[e->nfiles] = d;
    e->fdirect[e->nfiles] = direct;
    return e->nfiles++;
}

int io_is_direct(const io_engine *e, int file) { return e->fdirect[file]; }

static void drive_busy(io_engine *e, drive *dv, int delta)
{
    double now = timer_now();
    dv->st.depth_s += dv->in_flight * (now - dv->changed);
    dv->changed = now;
    if (dv->in_flight == 0 && delta > 0)
        dv->busy_start = now;
    dv->in_flight += delta;
    if (dv->in_flight == 0 && delta < 0)
        dv->st.busy_s += now - dv->busy_start;
    (void)e;
}

/* hands queued pieces of drive d to the backend while it has room */
static int pump(io_engine *e, int d, errbuf *err)
{
    drive *dv = &e->dr[d];
    int submitted = 0;
    while (dv->q_head >= 0 && dv->in_flight < e->cfg.drive_depth[d]) {
        int id = dv->q_head;
        piece *p = &e->pc[id];
#ifdef HAVE_URING
        struct io_uring_sqe *sqe = NULL;
        if (e->backend == IO_URING && !(sqe = io_uring_get_sqe(&e->ring))) {
            /* the ring is full of entries not yet sent: send them, then take one; a piece leaves
             * the queue only with an entry, so a failure here loses nothing (a later pump retries) */
            if (io_uring_submit(&e->ring) < 0 || !(sqe = io_uring_get_sqe(&e->ring)))
                return errbuf_set(err, "io: io_uring submission queue full");
            submitted = 0;
        }
#endif
        dv->q_head = p->next;
        if (dv->q_head < 0)
            dv->q_tail = -1;
        double now = timer_now();
        p->t_submit = now;
        p->t_release = 0;
        if (e->cfg.emu_mbps[d] > 0) { /* a drive serving requests in order at mbps, plus latency */
            double start = dv->busy_until > now ? dv->busy_until : now;
            dv->busy_until = start + (double)p->len / (e->cfg.emu_mbps[d] * 1e6);
            p->t_release = dv->busy_until + e->cfg.emu_lat_us[d] * 1e-6;
        }
        drive_busy(e, dv, +1);
#ifdef HAVE_URING
        if (e->backend == IO_URING) {
            /* registered region holding the whole piece, if any */
            uint64_t at = (uint64_t)((uintptr_t)p->buf - (uintptr_t)e->reg_base);
            int inside = e->nreg > 0 && (uintptr_t)p->buf >= (uintptr_t)e->reg_base && at + p->len <= e->reg_len;
            if (inside && at / IO_REG_MAX == (at + p->len - 1) / IO_REG_MAX) {
                int reg = (int)(at / IO_REG_MAX);
                io_uring_prep_read_fixed(sqe, e->fds[p->file], p->buf, (unsigned)p->len, p->off, reg);
                e->fixed_reads++;
            } else {
                io_uring_prep_read(sqe, e->fds[p->file], p->buf, (unsigned)p->len, p->off);
            }
            io_uring_sqe_set_data64(sqe, (uint64_t)id);
            submitted++;
            continue;
        }
#endif
        pthread_mutex_lock(&e->mu);
        e->pq[(e->pq_head + e->pq_n) % MAX_PIECES] = id;
        e->pq_n++;
        pthread_cond_signal(&e->work_cv);
        pthread_mutex_unlock(&e->mu);
    }
#ifdef HAVE_URING
    if (submitted && io_uring_submit(&e->ring) < 0)
        return errbuf_set(err, "io: io_uring_submit failed");
#endif
    return 0;
}

int io_read(io_engine *e, int file, uint64_t off, uint64_t len, void *buf, uint64_t tag, errbuf *err)
{
    if (file < 0 || file >= e->nfiles)
        return errbuf_set(err, "io: bad file id %d", file);
    int d = e->fdrive[file];
    uint64_t chunk = e->cfg.drive_chunk[d];
    uint64_t npieces = len ? (len + chunk - 1) / chunk : 1;
    if (e->free_job < 0 || e->free_job >= MAX_JOBS)
        return errbuf_set(err, "io: more than %d reads in flight", MAX_JOBS);
    if (npieces > (uint64_t)e->pieces_free) /* checked before anything is queued: no half jobs */
        return errbuf_set(err, "io: a %llu-byte read needs %llu requests; %d are free of %d",
                          (unsigned long long)len, (unsigned long long)npieces, e->pieces_free, MAX_PIECES);
    int j = e->free_job;
    e->free_job = e->jb[j].next;
    e->jb[j] = (job){tag, (int)npieces, 1, -1};
    e->jobs_live++;
    drive *dv = &e->dr[d];
    for (uint64_t k = 0; k < npieces; k++) {
        int id = e->free_piece;
        piece *p = &e->pc[id];
        e->free_piece = p->next;
        e->pieces_free--;
        uint64_t o = k * chunk, l = len - o < chunk ? len - o : chunk;
        *p = (piece){j, file, d, off + o, l, (char *)buf + o, 0, 0, 0, -1};
        if (dv->q_tail >= 0)
            e->pc[dv->q_tail].next = id;
        else
            dv->q_head = id;
        dv->q_tail = id;
        dv->backlog += l;
    }
    /* the job is queued whole: from here on it completes through io_reap, which pumps again and
     * reports a submission failure that lasts; failing now would tell the caller nothing was
     * queued while its pieces may still land in buf */
    errbuf later;
    (void)pump(e, d, &later);
    return 0;
}

int io_pending(const io_engine *e) { return e->jobs_live; }

/* a piece the backend finished: emulation may hold it; otherwise complete it */
static void finish_piece(io_engine *e, int id)
{
    piece *p = &e->pc[id];
    drive *dv = &e->dr[p->drive];
    double now = timer_now();
    double lat = (now - p->t_submit) * 1e6;
    int b = 0;
    while (b < 31 && lat >= (double)(2u << b))
        b++;
    dv->st.lat_hist[b]++;
    dv->st.bytes += p->len;
    dv->st.reqs++;
    dv->backlog -= p->len;
    drive_busy(e, dv, -1);
    job *j = &e->jb[p->job];
    if (!p->res_ok)
        j->ok = 0;
    if (--j->left == 0)
        e->done_jobs[e->ndone++] = p->job;
    p->next = e->free_piece;
    e->free_piece = id;
    e->pieces_free++;
}

static void backend_done(io_engine *e, int id, int ok)
{
    piece *p = &e->pc[id];
    p->res_ok = ok;
    if (p->t_release > timer_now())
        e->held[e->nheld++] = id;
    else
        finish_piece(e, id);
}

/* collects what the backend finished; blocks for one if wait */
static int collect(io_engine *e, int wait, errbuf *err)
{
#ifdef HAVE_URING
    if (e->backend == IO_URING) {
        struct io_uring_cqe *cqe;
        int got = 0;
        for (;;) {
            int rc = (wait && !got) ? io_uring_wait_cqe(&e->ring, &cqe) : io_uring_peek_cqe(&e->ring, &cqe);
            if (rc == -EINTR)
                continue;
            if (rc != 0)
                break;
            int id = (int)io_uring_cqe_get_data64(cqe);
            const piece *p = &e->pc[id];
            int ok = cqe->res == (int)p->len;
            io_uring_cqe_seen(&e->ring, cqe);
            if (!e->fdirect[p->file]) /* as the pread pool does: streamed bytes leave the page cache
                                         (pages someone has mapped stay) */
                posix_fadvise(e->fds[p->file], (off_t)p->off, (off_t)p->len, POSIX_FADV_DONTNEED);
            backend_done(e, id, ok);
            got++;
        }
        return 0;
    }
#endif
    pthread_mutex_lock(&e->mu);
    while (wait && e->cq_n == 0)
        pthread_cond_wait(&e->done_cv, &e->mu);
    int n = e->cq_n, ids[256];
    if (n > 256)
        n = 256;
    for (int i = 0; i < n; i++) {
        ids[i] = e->cq[i];
    }
    memmove(e->cq, e->cq + n, sizeof(int) * (size_t)(e->cq_n - n));
    e->cq_n -= n;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++)
        backend_done(e, ids[i], e->pc[ids[i]].res_ok);
    (void)err;
    return 0;
}

static void release_held(io_engine *e)
{
    double now = timer_now();
    for (int i = 0; i < e->nheld;) {
        if (e->pc[e->held[i]].t_release <= now) {
            int id = e->held[i];
            e->held[i] = e->held[--e->nheld];
            finish_piece(e, id);
        } else {
            i++;
        }
    }
}

int io_reap(io_engine *e, uint64_t *tag, int *ok, int wait, errbuf *err)
{
    for (;;) {
        if (collect(e, 0, err) != 0)
            return -1;
        release_held(e);
        for (int d = 0; d < e->cfg.ndrives && d < IO_MAX_DRIVES; d++)
            if (pump(e, d, err) != 0)
                return -1;
        if (e->ndone > 0) {
            int j = e->done_jobs[--e->ndone];
            *tag = e->jb[j].tag;
            *ok = e->jb[j].ok;
            e->jb[j].next = e->free_job;
            e->free_job = j;
            e->jobs_live--;
            return 1;
        }
        if (!wait || e->jobs_live == 0)
            return 0;
        /* nothing finished: sleep until the earliest held piece is due, or the backend reports */
        double next = 0;
        for (int i = 0; i < e->nheld; i++)
            if (next == 0 || e->pc[e->held[i]].t_release < next)
                next = e->pc[e->held[i]].t_release;
        int backend_busy = 0;
        for (int d = 0; d < IO_MAX_DRIVES; d++)
            backend_busy += e->dr[d].in_flight;
        backend_busy -= e->nheld;
        if (backend_busy > 0 && next == 0) {
            if (collect(e, 1, err) != 0)
                return -1;
        } else if (next > 0) {
            double dt = next - timer_now();
            if (dt > 0) {
                struct timespec ts = {(time_t)dt, (long)((dt - floor(dt)) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
    }
}

double io_expected(const io_engine *e, int d, uint64_t len)
{
    const drive *dv = &e->dr[d];
    double bw = e->cfg.emu_mbps[d] > 0 ? e->cfg.emu_mbps[d] * 1e6
                : dv->st.busy_s > 0.01   ? (double)dv->st.bytes / dv->st.busy_s
                                         : 2e9;
    double lat = e->cfg.emu_lat_us[d] * 1e-6;
    double queued = e->cfg.emu_mbps[d] > 0 && dv->busy_until > timer_now() ? dv->busy_until - timer_now()
                                                                            : (double)dv->backlog / bw;
    return queued + (double)len / bw + lat;
}

void io_stats(const io_engine *e, int d, io_drive_stats *out) { *out = e->dr[d].st; }

void io_stats_reset(io_engine *e)
{
    double now = timer_now();
    for (int d = 0; d < IO_MAX_DRIVES; d++) { /* requests in flight now count from now on */
        memset(&e->dr[d].st, 0, sizeof e->dr[d].st);
        e->dr[d].changed = now;
        e->dr[d].busy_start = now;
    }
}

double io_latency_pct(const io_drive_stats *s, double p)
{
    uint64_t n = 0, c = 0;
    for (int b = 0; b < 32; b++)
        n += s->lat_hist[b];
    if (n == 0)
        return 0;
    for (int b = 0; b < 32; b++) {
        c += s->lat_hist[b];
        if ((double)c >= p * (double)n)
            return (double)(2u << b); /* upper edge of the bucket */
    }
    return 0;
}
