/* mem.c — see mem.h. */
#include "base/mem.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void mem_populate(void *p, size_t bytes)
{
    if (!p || bytes == 0)
        return;
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t pg = ps > 0 ? (uintptr_t)ps : 4096, a = (uintptr_t)p, e = a + bytes;
#ifdef MADV_POPULATE_WRITE
    /* whole pages: the first and last are the range's own mapping, so this writes no one else's */
    uintptr_t a0 = a & ~(pg - 1), e0 = (e + pg - 1) & ~(pg - 1);
    if (madvise((void *)a0, e0 - a0, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (uintptr_t q = a; q < e; q = (q & ~(pg - 1)) + pg) { /* each byte written as it was */
        volatile unsigned char *c = (unsigned char *)q;
        *c = *c;
    }
}
