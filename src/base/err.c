/* err.c — see err.h. Messages are truncated, never overflowed. */
#include "base/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int errbuf_set(errbuf *e, const char *fmt, ...)
{
    if (!e)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int errbuf_prefix(errbuf *e, const char *fmt, ...)
{
    if (!e)
        return -1;
    char head[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t h = strlen(head);
    if (h + 2 >= sizeof e->msg)
        h = sizeof e->msg - 3;
    memcpy(e->msg, head, h);
    memcpy(e->msg + h, ": ", 2);
    size_t rest = sizeof e->msg - h - 3;
    size_t o = strnlen(old, rest);
    memcpy(e->msg + h + 2, old, o);
    e->msg[h + 2 + o] = 0;
    return -1;
}

int errbuf_errno(errbuf *e, const char *what)
{
    int saved = errno;
    return errbuf_set(e, "%s: %s", what, strerror(saved));
}
