/* arena.c — see arena.h. */
#include "base/arena.h"

#include <stdlib.h>
#include <string.h>

int arena_init(arena *a, size_t cap)
{
    memset(a, 0, sizeof *a);
    cap = (cap + 63) & ~(size_t)63;
    if (cap == 0)
        cap = 64;
    if (posix_memalign((void **)&a->base, 64, cap) != 0)
        return -1;
    a->cap = cap;
    return 0;
}

void arena_init_at(arena *a, void *base, size_t cap)
{
    memset(a, 0, sizeof *a);
    a->base = base;
    a->cap = cap & ~(size_t)63;
}

void arena_free(arena *a)
{
    free(a->base);
    memset(a, 0, sizeof *a);
}

void *arena_alloc(arena *a, size_t bytes)
{
    size_t need = (bytes + 63) & ~(size_t)63;
    if (need < bytes || a->cap - a->used < need)
        return NULL;
    void *p = a->base + a->used;
    a->used += need;
    if (a->used > a->peak)
        a->peak = a->used;
    return p;
}

void *arena_zalloc(arena *a, size_t bytes)
{
    void *p = arena_alloc(a, bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}
