/* st_write.h — writing safetensors files, streamed tensor by tensor.
 *
 * The caller declares every tensor (name, dtype, shape) up front; the writer lays out the
 * header and data offsets, then asks `fill` for each tensor's bytes in order, so a file larger
 * than RAM can be produced. The file appears atomically: it is written to "path.tmp.<pid>" and
 * renamed into place only when complete and synced.
 */
#ifndef DF_MODEL_ST_WRITE_H
#define DF_MODEL_ST_WRITE_H

#include <stdint.h>

#include "base/err.h"
#include "model/safetensors.h"

typedef struct st_wtensor {
    char name[256];
    int dtype; /* st_dtype */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
} st_wtensor;

/* Fills buf[0..n) with the bytes of tensor idx. */
typedef int (*st_fill_fn)(void *ud, int idx, uint8_t *buf, uint64_t n, errbuf *err);

uint64_t st_wtensor_bytes(const st_wtensor *t);
int st_write_file(const char *path, const st_wtensor *t, int n, st_fill_fn fill, void *ud, errbuf *err);

#endif
