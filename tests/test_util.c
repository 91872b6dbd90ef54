/* test_util.c — see test_util.h. */
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

engine *tu_engine(const model *m, struct store *st, int threads, const kern_ops *k, errbuf *err)
{
    engine_opts o;
    engine_opts_default(&o);
    o.threads = threads;
    o.kernels = k ? k->name : NULL;
    engine *e;
    return engine_wrap(m, st, &o, &e, err) == 0 ? e : NULL;
}

session *tu_session(engine *e, int context, int max_pass, errbuf *err)
{
    session_opts o;
    session_opts_default(&o);
    o.context = context;
    o.max_pass = o.max_logits = max_pass;
    o.ckpt_budget = 0;
    session *s;
    return session_new(e, &o, &s, err) == 0 ? s : NULL;
}

float *tu_eval_engine(engine *e, const int32_t *ids, int n, int chunk, errbuf *err)
{
    int V = engine_hparams(e)->vocab;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    session *s = out ? tu_session(e, n, chunk, err) : NULL;
    if (!s) {
        free(out);
        return NULL;
    }
    for (int i = 0; i < n; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        session_pass p = {.tokens = ids + i, .T = c, .n_logits = c};
        if (session_run(s, &p, err) != 0) {
            free(out);
            out = NULL;
            break;
        }
        for (int t = 0; t < c; t++)
            memcpy(out + (size_t)(i + t) * V, session_logits(s, t), sizeof(float) * (size_t)V);
    }
    session_free(s);
    return out;
}

float *tu_eval(const model *m, const int32_t *ids, int n, int chunk, int threads, const kern_ops *k, errbuf *err)
{
    engine *e = tu_engine(m, NULL, threads, k, err);
    if (!e)
        return NULL;
    float *out = tu_eval_engine(e, ids, n, chunk, err);
    engine_free(e);
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
