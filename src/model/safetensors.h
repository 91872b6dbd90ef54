/* safetensors.h — reading safetensors checkpoints, single-file or sharded, bounds-checked.
 *
 * A file is "u64 little-endian header length N, N bytes of JSON, data". Every header is
 * checked before any byte is trusted: N fits in the file, every tensor has a known dtype, a
 * shape of non-negative dimensions, data_offsets [begin, end) inside the data area,
 * dtype size x element count == end - begin (overflow-checked), and no two tensors overlap.
 * A sharded checkpoint is a folder with model.safetensors.index.json whose weight_map names the
 * shard of every tensor; each listed tensor must be in its shard.
 *
 * Tensors are views into read-only maps owned by the st_set; they live until st_close.
 */
#ifndef DF_MODEL_SAFETENSORS_H
#define DF_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/file.h"

typedef enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_U16,
    ST_I16,
    ST_F16,
    ST_BF16,
    ST_U32,
    ST_I32,
    ST_F32,
    ST_U64,
    ST_I64,
    ST_F64,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_F8_E8M0,
    ST_DTYPE_COUNT
} st_dtype;

enum { ST_MAX_DIMS = 8 };

typedef struct st_tensor {
    char *name;                   /* owned */
    int dtype;                    /* st_dtype */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;          /* data_offsets, relative to the data area */
    const uint8_t *data;          /* [end - begin] bytes, inside the file map */
    int file;                     /* index into st_set.files */
    uint64_t file_off;            /* absolute offset of the bytes in that file (for direct reads) */
} st_tensor;

typedef struct st_file {
    char *path;    /* owned */
    file_map map;
} st_file;

typedef struct st_set {
    st_file *files;  /* [nfiles] */
    int nfiles;
    st_tensor *t;    /* [n], sorted by name */
    int n;
} st_set;

const char *st_dtype_name(int dtype);
int st_dtype_parse(const char *name); /* -1 if unknown */
int st_dtype_size(int dtype);

/* Parses and checks one file's header from memory (buf = the whole file). Appends tensors to
 * *t / *n (realloc'd); `file` is stored in each tensor, `path` names the file in errors. */
int st_parse(const uint8_t *buf, size_t size, const char *path, int file, st_tensor **t, int *n, errbuf *err);

/* Opens dir/model.safetensors.index.json if present, else dir/model.safetensors (or a single
 * *.safetensors file in dir). */
int st_open_dir(st_set *s, const char *dir, errbuf *err);
/* Sorts s->t by name and rejects duplicates (for sets assembled by other readers). */
int st_finish(st_set *s, errbuf *err);
/* Opens explicit files (used by tests and tools). */
int st_open_files(st_set *s, const char *const *paths, int npaths, errbuf *err);
void st_close(st_set *s);

const st_tensor *st_find(const st_set *s, const char *name);
/* Element count (product of the shape). */
uint64_t st_numel(const st_tensor *t);

#endif
