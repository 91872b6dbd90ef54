/* cli.c — see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/args.h"

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    return args_opt(argc, argv, i, name, val);
}

int cli_long(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out)
{
    errbuf err;
    return args_long(opt, val, lo, hi, out, &err) ? cli_usage(cmd, "%s", err.msg) : 0;
}

int cli_double(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out)
{
    errbuf err;
    return args_double(opt, val, lo, hi, out, &err) ? cli_usage(cmd, "%s", err.msg) : 0;
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

int cli_engine_opt(const char *cmd, int argc, char **argv, int *i, engine_opts *o)
{
    errbuf err;
    int r = engine_opts_parse(o, argc, argv, i, &err);
    if (r < 0)
        cli_usage(cmd, "%s", err.msg);
    return r;
}

int cli_draft_opt(const char *cmd, int argc, char **argv, int *i, draft_opts *o)
{
    errbuf err;
    int r = draft_opts_parse(o, argc, argv, i, &err);
    if (r < 0)
        cli_usage(cmd, "%s", err.msg);
    return r;
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
