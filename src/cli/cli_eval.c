/* cli_eval.c — `deltafin eval`: the logits of every position of a token list, float32
 * little-endian [tokens x vocab], written atomically. The conformance interface: the oracle
 * checks and the exactness tests compare these bytes. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "engine/session.h"

static const char *HELP =
    "usage: deltafin eval [--model DIR] --tokens 1,2,3 --logits-out FILE [--prefill-chunk N]\n"
    "                     [--threads N] [--kernels auto|scalar|avx2|avx512|neon] [--stats]\n"
    "Runs the tokens through the model and writes float32 logits [tokens x vocab] to FILE.\n"
    "The bits do not depend on --prefill-chunk, --threads, --kernels or the weight-store options.\n";

int cmd_eval(int argc, char **argv)
{
    const char *cmd = "eval", *model_dir = NULL, *tokens = NULL, *out = NULL, *kernels = NULL, *v;
    long threads = 0, chunk = 0;
    int stats = 0;
    cli_store_opts so;
    cli_store_opts_default(&so);
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            fputs(CLI_STORE_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = 1;
            continue;
        } else if ((r = cli_store_opt(cmd, argc, argv, &i, &so))) {
            if (r < 0)
                return 2;
            continue;
        } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
            model_dir = v;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v))) {
            tokens = v;
        } else if ((r = cli_opt(argc, argv, &i, "--logits-out", &v))) {
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--kernels", &v))) {
            kernels = v;
        } else if ((r = cli_opt(argc, argv, &i, "--threads", &v))) {
            if (r > 0 && cli_long(cmd, "--threads", v, 1, 1024, &threads))
                return 2;
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
    cli_engine e;
    session s;
    float *logits = NULL;
    memset(&s, 0, sizeof s);
    double t0 = timer_now();
    if (cli_engine_open(&e, model_dir, (int)threads, kernels, &so, &err) != 0) {
        free(ids);
        return cli_fail(cmd, &err);
    }
    int V = e.m.hp.vocab, T = chunk > 0 && chunk < n ? (int)chunk : n;
    logits = malloc(sizeof(float) * (size_t)n * V);
    if (!logits) {
        errbuf_set(&err, "out of memory for %d x %d logits", n, V);
        goto out;
    }
    if (session_init(&s, &e.m, e.k, e.pool, n, T, &err) != 0)
        goto out;
    cli_engine_attach(&e, &s);
    for (int i = 0; i < n; i += T) {
        int c = n - i < T ? n - i : T;
        if (session_forward(&s, ids + i, c, logits + (size_t)i * V, 1, &err) != 0)
            goto out;
    }
    if (file_write_atomic(out, logits, sizeof(float) * (size_t)n * V, &err) != 0)
        goto out;
    if (stats)
        cli_engine_stats(&e, n, timer_now() - t0);
    rc = 0;
out:
    if (rc)
        cli_fail(cmd, &err);
    session_free(&s);
    cli_engine_close(&e);
    free(logits);
    free(ids);
    return rc;
}
