/* file.h — whole-file access: read-only maps, reads, and outputs that never clobber.
 *
 * An output (file_out_*, and file_write_atomic on top of it) goes where the user pointed:
 *   - a missing path or a regular file: written to "path.tmp.<pid>" beside it, synced, and renamed
 *     over it only when complete, so a reader never sees a half-written file;
 *   - a symlink: followed (to its final target), which the same rules apply to; the link stays;
 *   - a character device or a FIFO (/dev/null, a pipe): written straight into, never replaced;
 *   - anything else (a directory, a block device, a socket): refused, naming what it is.
 * A map is read-only and private to its owner.
 */
#ifndef DF_BASE_FILE_H
#define DF_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct file_map {
    const uint8_t *data; /* [size] bytes, NULL when size == 0 */
    size_t size;
} file_map;

int file_map_open(file_map *m, const char *path, errbuf *err);
void file_map_close(file_map *m);
/* Reads the whole file into a malloc'd, NUL-terminated buffer. */
int file_read_all(const char *path, char **out, size_t *len, errbuf *err);
int file_write_atomic(const char *path, const void *data, size_t len, errbuf *err);

typedef struct file_out {
    int fd;
    int direct;          /* a device or FIFO: no temporary file */
    char path[4096];     /* the target (a symlink resolved) */
    char tmp[4200];      /* the temporary file, when not direct */
} file_out;
int file_out_open(file_out *o, const char *path, errbuf *err);
int file_out_write(file_out *o, const void *data, size_t len, errbuf *err);
/* Syncs and renames the temporary file into place (direct: closes). */
int file_out_commit(file_out *o, errbuf *err);
/* Closes and removes the temporary file; the target is as it was. */
void file_out_abort(file_out *o);
/* Positional read / write of exactly len bytes (retrying short transfers and EINTR); -1 with
 * errno set on failure or end of file. */
int file_pread_full(int fd, void *buf, size_t len, uint64_t off);
int file_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int file_exists(const char *path);
/* The path of `to` relative to the folder `from` (both absolute and without "." or ".."
 * components, as realpath gives them), e.g. "../drive1/x.pack". -1 if it does not fit. */
int file_relpath(const char *from, const char *to, char *out, size_t cap);
int file_is_dir(const char *path);
/* Creates dir and the folders above it that are missing (mkdir -p); file_mkdirs_for: the folders
 * above path (its parent and up). */
int file_mkdirs(const char *dir, errbuf *err);
int file_mkdirs_for(const char *path, errbuf *err);

#endif
