/* jsonr.h — reading JSON documents with errors that say where.
 *
 * A thin layer over jansson (Debian's libjansson): loading a file or buffer reports
 * "file:line:col: what"; typed field getters report "file: field 'a.b': expected an integer".
 * `where` names the document (usually its path) and `path` the dotted field prefix, so a
 * nested getter can say exactly which field was wrong.
 */
#ifndef DF_BASE_JSONR_H
#define DF_BASE_JSONR_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"

json_t *jsonr_load_file(const char *path, errbuf *err);
json_t *jsonr_load_buf(const char *buf, size_t len, const char *where, errbuf *err);

/* Getters: missing field -> if `dflt_ok`, leave *out untouched and return 0; else error.
 * A present field of the wrong type is always an error. A JSON null counts as missing. */
int jsonr_int(const json_t *obj, const char *key, int64_t *out, int dflt_ok, const char *where, errbuf *err);
int jsonr_num(const json_t *obj, const char *key, double *out, int dflt_ok, const char *where, errbuf *err);
int jsonr_bool(const json_t *obj, const char *key, int *out, int dflt_ok, const char *where, errbuf *err);
/* Borrowed string, lives as long as obj. */
int jsonr_str(const json_t *obj, const char *key, const char **out, int dflt_ok, const char *where, errbuf *err);
/* Integer array into out[0..cap); *n = count. */
int jsonr_int_array(const json_t *obj, const char *key, int64_t *out, int cap, int *n, int dflt_ok,
                    const char *where, errbuf *err);

#endif
