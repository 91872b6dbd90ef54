/* err.h — error reporting by value: a message buffer filled by the function that failed.
 *
 * Convention: a function that can fail returns an int, 0 on
 * success and -1 on failure, and takes an `errbuf *` that it fills with one line saying what
 * went wrong and where ("model.safetensors: tensor 'x': data_offsets past end of file").
 * Callers that add context use errbuf_prefix. Only main() turns an error into an exit code.
 */
#ifndef DF_BASE_ERR_H
#define DF_BASE_ERR_H

#include <stddef.h>

typedef struct errbuf {
    char msg[768];
} errbuf;

/* Sets the message (printf-style) and returns -1, so callers can `return errbuf_set(...)`. */
int errbuf_set(errbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to the message already in e and returns -1. */
int errbuf_prefix(errbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets the message from errno: "what: strerror(errno)". Returns -1. */
int errbuf_errno(errbuf *e, const char *what);

#endif
