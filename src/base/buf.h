/* buf.h — a growable byte buffer, always NUL-terminated after its n bytes once anything was put.
 *
 *     buf b = {0};  buf_put(&b, "ab", 2);  buf_putf(&b, "%d", 7);  ... b.p[0..b.n) ...  buf_free(&b);
 *
 * Zero-initialize; every function that can fail returns 0 or -1 (out of memory, the buffer as it was). */
#ifndef DF_BASE_BUF_H
#define DF_BASE_BUF_H

#include <stddef.h>

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

int buf_reserve(buf *b, size_t n); /* room for n more bytes and the NUL */
int buf_put(buf *b, const void *s, size_t n);
int buf_putf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_cut(buf *b, size_t from); /* drops b->p[0..from) */
void buf_free(buf *b);

#endif
