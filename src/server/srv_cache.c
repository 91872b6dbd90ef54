/* srv_cache.c — serve --cache-dir: the states behind the last conversations, on disk, so that a
 * restarted server resumes a long conversation without recomputing it (srv_cache.h).
 *
 * After each generation the session is saved (session_save: the model's identity and a checksum
 * inside) as DIR/<xxh3 of its tokens>.state; a state whose tokens begin another one's (the earlier
 * turn of the same conversation) is dropped; then the least recently used go until the files fit
 * the byte budget. Before a generation, when a state shares a longer prefix with the prompt than
 * the session itself does, it is loaded (session_load checks identity, sizes and checksum; a bad
 * file is removed). The generation thread alone uses it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "server/srv_cache.h"

static int common(const int32_t *a, int na, const int32_t *b, int nb)
{
    int k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

static void entry_drop(srv_cache *c, int k, int unlink_file)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->v[k].name);
    if (unlink_file)
        remove(path);
    c->total -= c->v[k].bytes;
    free(c->v[k].ids);
    c->v[k] = c->v[--c->n];
}

static int entry_add(srv_cache *c, const char *name, int32_t *ids, int n, uint64_t bytes)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        srv_cache_entry *v = realloc(c->v, sizeof *v * (size_t)cap);
        if (!v)
            return -1;
        c->v = v;
        c->cap = cap;
    }
    srv_cache_entry *x = &c->v[c->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ids = ids;
    x->n = n;
    x->bytes = bytes;
    x->used = ++c->tick;
    c->total += bytes;
    return 0;
}

int srv_cache_open(srv_cache *c, const char *dir, uint64_t budget, engine *e, FILE *log, errbuf *err)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->budget = budget;
    c->e = e;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return errbuf_set(err, "--cache-dir %s: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d)
        return errbuf_set(err, "--cache-dir %s: %s", dir, strerror(errno));
    struct dirent *de;
    int skipped = 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l < 7 || l >= sizeof c->v[0].name || strcmp(de->d_name + l - 6, ".state") != 0)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        int32_t *ids;
        int n;
        errbuf e2;
        if (stat(path, &st) != 0 || session_file_tokens(e, path, &ids, &n, &e2) != 0) {
            skipped++; /* another model's, or not a state: left alone */
            continue;
        }
        if (entry_add(c, de->d_name, ids, n, (uint64_t)st.st_size) != 0) {
            free(ids);
            closedir(d);
            return errbuf_set(err, "--cache-dir %s: out of memory", dir);
        }
    }
    closedir(d);
    if (log)
        fprintf(log, "cache: %d conversation state%s in %s (%.1f MB)%s\n", c->n, c->n == 1 ? "" : "s", dir,
                (double)c->total / 1e6, skipped ? " (other files left alone)" : "");
    return 0;
}

void srv_cache_free(srv_cache *c)
{
    for (int k = 0; k < c->n; k++)
        free(c->v[k].ids);
    free(c->v);
    memset(c, 0, sizeof *c);
}

int srv_cache_resume(srv_cache *c, session *s, const int32_t *ids, int n, errbuf *err)
{
    int have = common(session_tokens(s), session_len(s), ids, n), best = -1, best_k = have;
    for (int k = 0; k < c->n; k++) {
        if (c->v[k].n > session_context(s))
            continue; /* saved with a longer --context: kept, for a server that has one */
        int l = common(c->v[k].ids, c->v[k].n, ids, n);
        if (l > best_k) {
            best_k = l;
            best = k;
        }
    }
    if (best < 0)
        return 0;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->v[best].name);
    if (session_load(s, path, err) != 0) {
        entry_drop(c, best, 1); /* damaged or cut short: gone, and the session as it was */
        return -1;
    }
    c->v[best].used = ++c->tick;
    c->loads++;
    return 1;
}

int srv_cache_save(srv_cache *c, session *s, errbuf *err)
{
    int n = session_len(s);
    if (n < 1)
        return 0;
    const int32_t *t = session_tokens(s);
    char name[64], path[4400];
    snprintf(name, sizeof name, "%016llx.state", (unsigned long long)XXH3_64bits(t, sizeof *t * (size_t)n));
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    if (session_save(s, path, err) != 0)
        return -1;
    n = session_len(s); /* a pending pass was kept whole */
    t = session_tokens(s);
    struct stat st;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids || stat(path, &st) != 0) {
        free(ids);
        remove(path);
        return errbuf_set(err, "%s: out of memory or gone", path);
    }
    memcpy(ids, t, sizeof *ids * (size_t)n);
    for (int k = c->n - 1; k >= 0; k--) /* the same state again, or one it continues */
        if (c->v[k].n <= n && common(c->v[k].ids, c->v[k].n, ids, n) == c->v[k].n)
            entry_drop(c, k, strcmp(c->v[k].name, name) != 0);
    if (entry_add(c, name, ids, n, (uint64_t)st.st_size) != 0) {
        free(ids);
        return errbuf_set(err, "%s: out of memory", path);
    }
    c->saves++;
    while (c->total > c->budget && c->n > 0) { /* the least recently used go first, the newest last */
        int lru = 0;
        for (int k = 1; k < c->n; k++)
            if (c->v[k].used < c->v[lru].used)
                lru = k;
        entry_drop(c, lru, 1);
    }
    return 0;
}
