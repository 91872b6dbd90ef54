/* cli.c — see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0)
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val = argv[++*i];
    return 1;
}

int cli_long(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi)
        return cli_usage(cmd, "%s expects an integer in %ld..%ld, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}

int cli_double(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi))
        return cli_usage(cmd, "%s expects a number in %g..%g, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n, errbuf *err)
{
    size_t cap = 16;
    int cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (v) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return errbuf_set(err, "token list: '%.20s' at character %d is not a token id", p, (int)(p - s));
        }
        if ((size_t)cnt == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv)
                free(v);
            v = nv;
            if (!v)
                break;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (!v)
        return errbuf_set(err, "token list: out of memory");
    *ids = v;
    *n = cnt;
    return 0;
}

int cli_default_model(char *out, size_t cap, errbuf *err)
{
    const char *env = getenv("DELTAFIN_MODEL");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        static const char *rel[] = {"models/default", "../models/default", "../../models/default"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(out, cap, "%s/%s", exe, rel[i]);
            if (file_is_dir(out))
                return 0;
        }
    }
    if (file_is_dir("models/default")) {
        snprintf(out, cap, "models/default");
        return 0;
    }
    return errbuf_set(err, "no --model given and the bundled model (models/default) was not found");
}

int cli_engine_open(cli_engine *e, const char *model_dir, int threads, const char *kernels, errbuf *err)
{
    memset(e, 0, sizeof *e);
    char dir[4096];
    if (!model_dir) {
        if (cli_default_model(dir, sizeof dir, err) != 0)
            return -1;
        model_dir = dir;
    }
    e->k = kern_select(kernels);
    if (!e->k)
        return errbuf_set(err, "--kernels %s: not available on this CPU or build", kernels);
    if (model_load(&e->m, model_dir, err) != 0)
        return -1;
    e->pool = pool_new(threads > 0 ? threads : pool_ncpu(), err);
    if (!e->pool) {
        model_free(&e->m);
        return -1;
    }
    return 0;
}

void cli_engine_close(cli_engine *e)
{
    pool_free(e->pool);
    if (e->m.L)
        model_free(&e->m);
    memset(e, 0, sizeof *e);
}

int cli_fail(const char *cmd, const errbuf *err)
{
    fprintf(stderr, "deltafin %s: %s\n", cmd, err->msg);
    return 1;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "deltafin %s: %s (see deltafin %s --help)\n", cmd, msg, cmd);
    return 2;
}
