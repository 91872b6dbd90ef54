/* draft_opts.c — the drafting options every generating subcommand shares (run, serve), and the
 * drafters they name (draft.h: draft_opts, draft_open). */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "base/args.h"
#include "engine/draft.h"
#include "engine/generate.h"

const char DRAFT_OPTS_HELP[] =
    "drafting: [--draft none|ngram|qwen|dspark|auto] [--draft-model DIR] [--draft-max K]\n"
    "  --draft guesses tokens ahead that the model checks in one pass: never a different token, only\n"
    "  sooner. auto (the default) tries the n-gram drafter and any drafter model beside the model\n"
    "  (DIR-dspark, DIR-qwen3-drafter) or given with --draft-model, and drafts only while it pays;\n"
    "  --draft-max (default 31, at most 31) bounds the guesses of a step.\n";

void draft_opts_default(draft_opts *o)
{
    memset(o, 0, sizeof *o);
    o->want = "auto";
    o->max = GEN_MAX_DRAFT;
}

int draft_opts_parse(draft_opts *o, int argc, char **argv, int *i, errbuf *err)
{
    static const char *const names[] = {"--draft", "--draft-model", "--draft-max"};
    const char *v = NULL;
    long n;
    switch (args_which(argc, argv, i, names, 3, &v, err)) {
    case -1:
        return 0;
    case 0:
        if (strcmp(v, "none") && strcmp(v, "ngram") && strcmp(v, "qwen") && strcmp(v, "dspark") && strcmp(v, "auto"))
            return errbuf_set(err, "--draft expects none, ngram, qwen, dspark or auto, got '%s'", v);
        o->want = v;
        return 1;
    case 1:
        o->model = v;
        return 1;
    case 2:
        if (args_long("--draft-max", v, 1, GEN_MAX_DRAFT, &n, err) != 0)
            return -1;
        o->max = (int)n;
        return 1;
    default:
        return -1;
    }
}

/* "k3_dspark", "qwen3", ... of a folder's config.json, into buf ("" if none) */
static const char *model_type_of(const char *dir, char *buf, size_t cap)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    snprintf(buf, cap, "%s", mt ? mt : "");
    json_decref(c);
    return buf;
}

int draft_open(const draft_opts *o, const draft_ctx *dc, drafter **out, int *n, errbuf *err)
{
    *n = 0;
    if (!strcmp(o->want, "none"))
        return 0;
    char beside[2][4200], type[64];
    snprintf(beside[0], sizeof beside[0], "%s-dspark", engine_model_dir(dc->target));
    snprintf(beside[1], sizeof beside[1], "%s-qwen3-drafter", engine_model_dir(dc->target));
    const char *dspark = NULL, *qwen = NULL;
    if (o->model) { /* its config says which kind it is */
        model_type_of(o->model, type, sizeof type);
        if (!strcmp(type, "k3_dspark"))
            dspark = o->model;
        else if (!strcmp(type, "qwen3"))
            qwen = o->model;
        else
            return errbuf_set(err, "--draft-model %s: model_type '%s' is no drafter (k3_dspark, qwen3)", o->model, type);
    } else {
        dspark = !strcmp(model_type_of(beside[0], type, sizeof type), "k3_dspark") ? beside[0] : NULL;
        qwen = !strcmp(model_type_of(beside[1], type, sizeof type), "qwen3") ? beside[1] : NULL;
    }
    int all = !strcmp(o->want, "auto");
    if (!all && !strcmp(o->want, "dspark") && !dspark)
        return errbuf_set(err, "--draft dspark: no DSpark model (give --draft-model, or put one at %s)", beside[0]);
    if (!all && !strcmp(o->want, "qwen") && !qwen)
        return errbuf_set(err, "--draft qwen: no Qwen3 drafter (give --draft-model, or put one at %s)", beside[1]);
    if ((all || !strcmp(o->want, "ngram")) && draft_ngram_new(dc, &out[(*n)++], err) != 0)
        goto fail;
    if ((all || !strcmp(o->want, "dspark")) && dspark && draft_dspark_new(dc, dspark, &out[(*n)++], err) != 0)
        goto fail;
    if ((all || !strcmp(o->want, "qwen")) && qwen && draft_qwen_new(dc, qwen, &out[(*n)++], err) != 0)
        goto fail;
    return 0;
fail:
    (*n)--;
    draft_close(out, *n);
    *n = 0;
    return -1;
}

void draft_close(drafter **d, int n)
{
    for (int i = 0; i < n; i++)
        if (d[i])
            d[i]->free(d[i]);
}

int draft_begin(drafter *const *d, int n, const json_t *messages, int thinking, errbuf *err)
{
    for (int i = 0; i < n; i++)
        if (d[i]->begin && d[i]->begin(d[i], messages, thinking, err) != 0)
            return -1;
    return 0;
}
