/* cli_eval.c — `deltafin eval`: the logits of every position of a token list, float32
 * little-endian [tokens x vocab], written atomically. The conformance interface: the oracle
 * checks and the exactness tests compare these bytes. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/timer.h"
#include "cli/cli.h"

static const char *HELP =
    "usage: deltafin eval [model options] --tokens 1,2,3 --logits-out FILE [--prefill-chunk N] [--stats]\n"
    "Runs the tokens through the model and writes float32 logits [tokens x vocab] to FILE.\n"
    "The bits do not depend on --prefill-chunk, --threads, --kernels or the weight-store options.\n";

int cmd_eval(int argc, char **argv)
{
    const char *cmd = "eval", *tokens = NULL, *out = NULL, *v;
    long chunk = 0;
    int stats = 0;
    engine_opts eo;
    engine_opts_default(&eo);
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            fputs(ENGINE_OPTS_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = 1;
            continue;
        } else if ((r = cli_engine_opt(cmd, argc, argv, &i, &eo))) {
            if (r < 0)
                return 2;
            continue;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v))) {
            tokens = v;
        } else if ((r = cli_opt(argc, argv, &i, "--logits-out", &v))) {
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--prefill-chunk", &v))) {
            if (r > 0 && cli_long(cmd, "--prefill-chunk", v, 1, 1 << 20, &chunk))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!tokens || !out)
        return cli_usage(cmd, "--tokens and --logits-out are required");
    errbuf err;
    int32_t *ids = NULL;
    int n = 0, rc = 1;
    if (cli_parse_ids(tokens, &ids, &n, &err) != 0)
        return cli_fail(cmd, &err);
    if (n == 0) {
        free(ids);
        return cli_usage(cmd, "--tokens is empty");
    }
    engine *e = NULL;
    session *s = NULL;
    float *logits = NULL;
    double t0 = timer_now();
    cli_model pick;
    cli_model_pick(cmd, &eo, &pick);
    if (engine_open(&eo, &e, &err) != 0) {
        free(ids);
        return cli_fail(cmd, &err);
    }
    int V = engine_hparams(e)->vocab, T = chunk > 0 && chunk < n ? (int)chunk : n;
    logits = malloc(sizeof(float) * (size_t)n * V);
    if (!logits) {
        errbuf_set(&err, "out of memory for %d x %d logits", n, V);
        goto out;
    }
    session_opts so;
    session_opts_default(&so);
    so.context = n;
    so.max_pass = so.max_logits = T;
    so.max_commit = 0;
    so.ckpt_budget = 0;
    if (session_new(e, &so, &s, &err) != 0)
        goto out;
    for (int i = 0; i < n; i += T) {
        int c = n - i < T ? n - i : T;
        session_pass p = {.tokens = ids + i, .T = c, .n_logits = c};
        if (session_run(s, &p, &err) != 0)
            goto out;
        for (int t = 0; t < c; t++)
            memcpy(logits + (size_t)(i + t) * V, session_logits(s, t), sizeof(float) * (size_t)V);
    }
    if (file_write_atomic(out, logits, sizeof(float) * (size_t)n * V, &err) != 0)
        goto out;
    if (stats)
        engine_report(e, stderr, n, timer_now() - t0);
    rc = 0;
out:
    if (rc)
        cli_fail(cmd, &err);
    session_free(s);
    engine_free(e);
    free(logits);
    free(ids);
    return rc;
}
