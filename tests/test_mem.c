/* test_mem.c — base/mem.h: mem_populate makes a range's pages present and changes no byte. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/mem.h"
#include "test.h"

/* pages of [p, p + n) present in memory, by mincore */
static size_t pages_present(void *p, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = (n + pg - 1) / pg, have = 0;
    unsigned char v[64];
    if (np > sizeof v || mincore(p, n, v) != 0)
        return (size_t)-1;
    for (size_t i = 0; i < np; i++)
        have += v[i] & 1;
    return have;
}

TEST(mem_populate_keeps_bytes_and_faults_pages_in)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 16 * pg;
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    CHECKF(pages_present(m, n) == 0, "%zu of 16 fresh pages present", pages_present(m, n));
    m[pg + 5] = 7;       /* written: present, and its bytes must stay */
    m[9 * pg - 1] = 9;
    /* a range from inside page 1 to inside page 9: pages 1..8 whole or in part */
    mem_populate(m + pg + 3, 8 * pg - 10);
    CHECKF(pages_present(m + pg, 8 * pg) == 8, "%zu of the range's 8 pages present", pages_present(m + pg, 8 * pg));
    CHECKF(pages_present(m + 10 * pg, 6 * pg) == 0, "pages past the range were faulted in");
    CHECK(m[pg + 5] == 7 && m[9 * pg - 1] == 9);
    for (size_t i = 0; i < n; i++)
        if (i != pg + 5 && i != 9 * pg - 1 && m[i] != 0)
            CHECKF(0, "byte %zu changed to %d", i, m[i]);
    mem_populate(NULL, 0); /* nothing to do */
    munmap(m, n);
}
