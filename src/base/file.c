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

int file_write_atomic(const char *path, const void *data, size_t len, errbuf *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return errbuf_set(err, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errbuf_errno(err, tmp);
    const unsigned char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            errbuf_errno(err, tmp);
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        errbuf_errno(err, tmp);
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        errbuf_errno(err, path);
        unlink(tmp);
        return -1;
    }
    return 0;
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
