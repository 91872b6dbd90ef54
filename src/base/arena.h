/* arena.h — a bump allocator over one block reserved up front.
 *
 * Per-pass and per-request scratch comes from an arena so that the decode step allocates
 * nothing: the block is reserved when a session starts, a pass takes a mark, allocates, and
 * rewinds to the mark at the end. Allocation never grows the block; running out is a
 * programmer error in sizing (the caller reports it as an error, it is never silent).
 * Invariant: every pointer returned is aligned to at least 64 bytes (a cache line, a zmm).
 */
#ifndef DF_BASE_ARENA_H
#define DF_BASE_ARENA_H

#include <stddef.h>

typedef struct arena {
    unsigned char *base; /* [cap] bytes, 64-byte aligned */
    size_t cap;
    size_t used;
    size_t peak; /* high-water mark, for sizing reports */
} arena;

int arena_init(arena *a, size_t cap); /* 0 or -1 (out of memory) */
/* An arena over memory the caller owns (cap bytes at a 64-byte aligned base, device memory
 * included: the arena only does arithmetic on it); arena_free must not be called on it. */
void arena_init_at(arena *a, void *base, size_t cap);
void arena_free(arena *a);
void *arena_alloc(arena *a, size_t bytes); /* NULL when the arena is full */
void *arena_zalloc(arena *a, size_t bytes);
static inline size_t arena_mark(const arena *a) { return a->used; }
static inline void arena_rewind(arena *a, size_t mark) { a->used = mark; }

#endif
