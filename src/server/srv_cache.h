/* srv_cache.h — serve --cache-dir: conversation states on disk under a byte budget (srv_cache.c).
 * Used by the generation thread only. */
#ifndef DF_SERVER_SRV_CACHE_H
#define DF_SERVER_SRV_CACHE_H

#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"

typedef struct srv_cache_entry {
    char name[64];   /* <xxh3 of its tokens>.state, in dir */
    int32_t *ids;    /* [n] the tokens it holds */
    int n;
    uint64_t bytes;
    uint64_t used;   /* the tick it was last saved or loaded */
} srv_cache_entry;

typedef struct srv_cache {
    char dir[4096];
    uint64_t budget, total;  /* bytes allowed, and held */
    engine *e;
    srv_cache_entry *v;      /* [n] */
    int n, cap;
    uint64_t tick, loads, saves;
} srv_cache;

/* Creates dir if needed and indexes the states of this model there (others are left alone). */
int srv_cache_open(srv_cache *c, const char *dir, uint64_t budget, engine *e, FILE *log, errbuf *err);
void srv_cache_free(srv_cache *c);
/* Before bringing s to ids[0..n): loads the state sharing the longest prefix with them when it is
 * longer than what s shares. 1 loaded, 0 none better, -1 a bad file (removed; s as it was). */
int srv_cache_resume(srv_cache *c, session *s, const int32_t *ids, int n, errbuf *err);
/* Saves s, drops the states it continues, evicts down to the budget. */
int srv_cache_save(srv_cache *c, session *s, errbuf *err);

#endif
