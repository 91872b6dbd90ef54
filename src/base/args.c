/* args.c — see args.h. */
#include "base/args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int args_opt(int argc, char **argv, int *i, const char *name, const char **val)
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

int args_which(int argc, char **argv, int *i, const char *const *names, int n, const char **val, errbuf *err)
{
    for (int k = 0; k < n; k++) {
        int r = args_opt(argc, argv, i, names[k], val);
        if (r > 0)
            return k;
        if (r < 0)
            return errbuf_set(err, "%s needs a value", names[k]), -2;
    }
    return -1;
}

int args_long(const char *opt, const char *val, long lo, long hi, long *out, errbuf *err)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi)
        return errbuf_set(err, "%s expects an integer in %ld..%ld, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}

int args_double(const char *opt, const char *val, double lo, double hi, double *out, errbuf *err)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi))
        return errbuf_set(err, "%s expects a number in %g..%g, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}
