/* st_write.c — see st_write.h. */
#include "model/st_write.h"

#include "base/file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t st_wtensor_bytes(const st_wtensor *t)
{
    uint64_t n = (uint64_t)st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

int st_write_file(const char *path, const st_wtensor *t, int n, st_fill_fn fill, void *ud, errbuf *err)
{
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0, maxb = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = st_wtensor_bytes(&t[i]);
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t[i].dtype)));
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "shape", shape);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + b)));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, t[i].name, e);
        off += b;
        maxb = b > maxb ? b : maxb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr)
        return errbuf_set(err, "%s: cannot encode the header", path);
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8; /* data starts 8-byte aligned */
    file_out o;
    uint8_t *buf = NULL;
    int rc = -1, opened = 0;
    if (file_out_open(&o, path, err) != 0)
        goto out;
    opened = 1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(padded >> (8 * i));
    if (file_out_write(&o, len, 8, err) || file_out_write(&o, hdr, hl, err) ||
        file_out_write(&o, "        ", padded - hl, err))
        goto out;
    buf = malloc(maxb ? maxb : 1);
    if (!buf) {
        errbuf_set(err, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        uint64_t b = st_wtensor_bytes(&t[i]);
        if (fill(ud, i, buf, b, err) != 0 || file_out_write(&o, buf, b, err) != 0)
            goto out;
    }
    rc = file_out_commit(&o, err);
    opened = 0;
out:
    if (opened)
        file_out_abort(&o);
    free(buf);
    free(hdr);
    return rc;
}
