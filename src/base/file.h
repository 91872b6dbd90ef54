/* file.h — whole-file access: read-only maps, reads, and atomic writes.
 *
 * file_write_atomic writes to "path.tmp.<pid>" and renames over path, so a reader never sees a
 * half-written file (rule 4 of the house). A map is read-only and private to its owner.
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
/* Positional read / write of exactly len bytes (retrying short transfers and EINTR); -1 with
 * errno set on failure or end of file. */
int file_pread_full(int fd, void *buf, size_t len, uint64_t off);
int file_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int file_exists(const char *path);
int file_is_dir(const char *path);

#endif
