/* cli.c — see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/args.h"
#include "base/file.h"
#include "base/jsonr.h"
#include "engine/stream.h"
#include "store/dfsp.h"

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

int cli_model_root(const char *opt, char *out, size_t cap, errbuf *err)
{
    const char *home = getenv("HOME"), *dh = getenv("DELTAFIN_HOME");
    int n;
    if (opt && *opt)
        n = snprintf(out, cap, "%s", opt);
    else if (dh && *dh)
        n = snprintf(out, cap, "%s", dh);
    else if (home && *home)
        n = snprintf(out, cap, "%s/.deltafin", home);
    else
        return errbuf_set(err, "no model root: give --model-root, or set DELTAFIN_HOME or HOME");
    if (n < 0 || (size_t)n >= cap)
        return errbuf_set(err, "the model root's path is too long");
    while (n > 1 && out[n - 1] == '/')
        out[--n] = 0;
    return 0;
}

void cli_model_pick(const char *cmd, engine_opts *o, cli_model *pick)
{
    hub_opts_default(&pick->hub);
    hub_opts_from_env(&pick->hub);
    pick->hub.progress = 0;
    o->hub = &pick->hub;
    if (o->model)
        return;
    char *buf = pick->dir;
    size_t cap = sizeof pick->dir;
    char root[4096] = "?", path[4200];
    errbuf err;
    const char *store = NULL, *repo = "?", *commit = "?";
    json_t *inst = NULL;
    if (cli_model_root(NULL, root, sizeof root, &err) == 0) {
        snprintf(path, sizeof path, "%s/install.json", root);
        json_t *k3;
        if (file_exists(path) && (inst = jsonr_load_file(path, &err)) && (k3 = json_object_get(inst, "k3")) &&
            (jsonr_str(k3, "store", &store, 1, path, &err) == 0 && jsonr_str(k3, "stream", &store, 1, path, &err) == 0) &&
            store) {
            jsonr_str(k3, "repo", &repo, 1, path, &err);
            jsonr_str(k3, "commit", &commit, 1, path, &err);
            if (!dfsp_is_store(store) && !stream_is_install(store)) {
                fprintf(stderr, "deltafin %s: %s names the K3 install %s, which is not there (rerun deltafin setup)\n",
                        cmd, path, store);
                store = NULL;
            }
        } else if (file_exists(path)) {
            fprintf(stderr, "deltafin %s: %s: %s\n", cmd, path, inst ? "no installed K3 in it" : err.msg);
            store = NULL;
        }
    }
    if (store) {
        snprintf(buf, cap, "%s", store);
        o->model = buf;
        fprintf(stderr, "model: the installed Kimi K3, %s (%s@%.12s)\n", buf, repo, commit);
    } else if (engine_default_model(buf, cap, &err) == 0) {
        o->model = buf;
        fprintf(stderr, "model: the bundled default model, %s (no K3 installed in %s; see deltafin setup)\n", buf,
                root);
    } /* else engine_open reports the missing bundled model */
    json_decref(inst);
}
