/* file.c — see file.h. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int file_map_open(file_map *m, const char *path, errbuf *err)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errbuf_errno(err, path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        errbuf_errno(err, path);
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return errbuf_set(err, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            errbuf_errno(err, path);
            close(fd);
            return -1;
        }
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void file_map_close(file_map *m)
{
    if (m->data)
        munmap((void *)m->data, m->size);
    memset(m, 0, sizeof *m);
}

int file_read_all(const char *path, char **out, size_t *len, errbuf *err)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errbuf_errno(err, path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            fclose(f);
            return errbuf_set(err, "%s: out of memory", path);
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return errbuf_set(err, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int file_out_open(file_out *o, const char *path, errbuf *err)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    struct stat st;
    if (snprintf(o->path, sizeof o->path, "%s", path) >= (int)sizeof o->path)
        return errbuf_set(err, "%s: path too long", path);
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) { /* follow it: write the target, keep the link */
        char *real = realpath(path, NULL);
        if (real) {
            snprintf(o->path, sizeof o->path, "%s", real);
            free(real);
        } else if (errno == ENOENT) { /* a dangling link: its target's folder must exist */
            char tgt[4096];
            ssize_t n = readlink(path, tgt, sizeof tgt - 1);
            if (n < 0)
                return errbuf_errno(err, path);
            tgt[n] = 0;
            const char *slash = strrchr(path, '/');
            if (tgt[0] == '/' || !slash)
                snprintf(o->path, sizeof o->path, "%s", tgt);
            else
                snprintf(o->path, sizeof o->path, "%.*s/%s", (int)(slash - path), path, tgt);
        } else {
            return errbuf_errno(err, path);
        }
    }
    if (stat(o->path, &st) == 0) {
        if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
            o->direct = 1;
            o->fd = open(o->path, O_WRONLY | O_CLOEXEC);
            return o->fd < 0 ? errbuf_errno(err, o->path) : 0;
        }
        if (!S_ISREG(st.st_mode))
            return errbuf_set(err, "%s: is %s, not a file to write", o->path,
                              S_ISDIR(st.st_mode) ? "a directory" : S_ISBLK(st.st_mode) ? "a block device" : "not a regular file");
    } else if (errno != ENOENT) {
        return errbuf_errno(err, o->path);
    }
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->path, (long)getpid()) >= (int)sizeof o->tmp)
        return errbuf_set(err, "%s: path too long", o->path);
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0)
        return errbuf_errno(err, o->tmp);
    return 0;
}

int file_out_write(file_out *o, const void *data, size_t len, errbuf *err)
{
    const unsigned char *p = data;
    while (len > 0) {
        ssize_t w = write(o->fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errbuf_errno(err, o->direct ? o->path : o->tmp);
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int file_out_commit(file_out *o, errbuf *err)
{
    int fd = o->fd;
    o->fd = -1;
    if (o->direct)
        return close(fd) != 0 ? errbuf_errno(err, o->path) : 0;
    if (fsync(fd) != 0 || close(fd) != 0) {
        errbuf_errno(err, o->tmp);
        unlink(o->tmp);
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        errbuf_errno(err, o->path);
        unlink(o->tmp);
        return -1;
    }
    return 0;
}

void file_out_abort(file_out *o)
{
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    if (!o->direct && o->tmp[0])
        unlink(o->tmp);
}

int file_write_atomic(const char *path, const void *data, size_t len, errbuf *err)
{
    file_out o;
    if (file_out_open(&o, path, err) != 0)
        return -1;
    if (file_out_write(&o, data, len, err) != 0) {
        file_out_abort(&o);
        return -1;
    }
    return file_out_commit(&o, err);
}

/* the whole of [off, off + len) read or written, through short transfers and EINTR */
static int full_io(int fd, void *buf, size_t len, uint64_t off, int write)
{
    size_t done = 0;
    while (done < len) {
        char *p = (char *)buf + done;
        ssize_t r = write ? pwrite(fd, p, len - done, (off_t)(off + done)) : pread(fd, p, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

int file_pread_full(int fd, void *buf, size_t len, uint64_t off) { return full_io(fd, buf, len, off, 0); }

int file_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    return full_io(fd, (void *)buf, len, off, 1);
}

int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int file_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int file_relpath(const char *from, const char *to, char *out, size_t cap)
{
    /* the longest common run of whole components */
    size_t i = 0, common = 0;
    while (from[i] && to[i] && from[i] == to[i]) {
        if (from[i] == '/')
            common = i;
        i++;
    }
    if (!from[i] && (to[i] == '/' || !to[i]))
        common = i; /* `from` is a prefix of `to` at a component boundary */
    size_t n = 0;
    out[0] = 0;
    for (const char *p = from + common; *p; p++) /* one ".." per component of `from` left */
        if (*p == '/' && p[1] && p[1] != '/') {
            int w = snprintf(out + n, cap - n, "../");
            if (w < 0 || (size_t)w >= cap - n)
                return -1;
            n += (size_t)w;
        }
    const char *rest = to + common;
    while (*rest == '/')
        rest++;
    int w = snprintf(out + n, cap - n, "%s", rest);
    return w < 0 || (size_t)w >= cap - n ? -1 : 0;
}

int file_mkdirs(const char *dir, errbuf *err)
{
    char d[4096];
    if ((size_t)snprintf(d, sizeof d, "%s", dir) >= sizeof d)
        return errbuf_set(err, "%.200s...: the path is too long", dir);
    for (char *p = d + 1;; p++) {
        if (*p != '/' && *p)
            continue;
        char c = *p;
        *p = 0;
        if (mkdir(d, 0755) && errno != EEXIST)
            return errbuf_errno(err, d);
        if (!(*p = c))
            return 0;
    }
}

int file_mkdirs_for(const char *path, errbuf *err)
{
    char d[4096];
    if ((size_t)snprintf(d, sizeof d, "%s", path) >= sizeof d)
        return errbuf_set(err, "%.200s...: the path is too long", path);
    char *sl = strrchr(d, '/');
    if (!sl || sl == d)
        return 0;
    *sl = 0;
    return file_mkdirs(d, err);
}
