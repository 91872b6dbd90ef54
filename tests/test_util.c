/* test_util.c — see test_util.h. */
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

float *tu_eval(const model *m, const int32_t *ids, int n, int chunk, int threads, const kern_ops *k, errbuf *err)
{
    if (!k)
        k = kern_select(NULL);
    pool *p = pool_new(threads, err);
    if (!p)
        return NULL;
    session s;
    int V = m->hp.vocab;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    if (!out || session_init(&s, m, k, p, n, chunk, err) != 0) {
        free(out);
        pool_free(p);
        return NULL;
    }
    for (int i = 0; i < n; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        if (session_forward(&s, ids + i, c, out + (size_t)i * V, 1, err) != 0) {
            free(out);
            out = NULL;
            break;
        }
    }
    session_free(&s);
    pool_free(p);
    return out;
}

float *tu_read_f32(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *v = malloc((size_t)sz + 4);
    if (v && fread(v, 1, (size_t)sz, f) != (size_t)sz) {
        free(v);
        v = NULL;
    }
    fclose(f);
    *n = (size_t)sz / 4;
    return v;
}

double tu_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1.0));
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int tu_list_dirs(const char *dir, char ***names)
{
    DIR *d = opendir(dir);
    int n = 0;
    *names = NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s/config.json", dir, e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        fclose(f);
        *names = realloc(*names, sizeof **names * (size_t)(n + 1));
        (*names)[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(*names, (size_t)n, sizeof **names, cmp);
    return n;
}

int tu_run(const char *cmdline, char *out, size_t cap)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmdline);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    while (fgetc(p) != EOF) {
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *tu_bin(void)
{
    const char *b = getenv("DELTAFIN_BIN");
    return b && *b ? b : "build/deltafin";
}
