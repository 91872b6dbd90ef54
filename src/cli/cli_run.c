/* cli_run.c — `deltafin run`: generate from a prompt, streaming each token as it is decided. */
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli/cli.h"
#include "engine/generate.h"

static const char *HELP =
    "usage: deltafin run [--model DIR] --tokens 1,2,3 [--max-new N] [--temperature T] [--top-p P]\n"
    "                    [--top-k K] [--min-p P] [--seed S] [--threads N] [--prefill-chunk N]\n"
    "                    [--print-ids] [--stop-eos] [--stats] [--kernels auto|scalar|avx2|avx512]\n"
    "Without --model the bundled default model is used. Temperature 0 (the default) is greedy.\n"
    "--tokens is the raw interface: it generates exactly --max-new ids unless --stop-eos.\n"
    "--stats prints time to first token, tokens/s and per-phase times on stderr.\n";

struct emit {
    int print_ids;
    int n;
};

static int on_token(void *ud, int32_t id)
{
    struct emit *e = ud;
    printf(e->n++ ? " %d" : "%d", id);
    fflush(stdout);
    return 0;
}

int cmd_run(int argc, char **argv)
{
    const char *cmd = "run", *model_dir = NULL, *tokens = NULL, *kernels = NULL, *v;
    long threads = 0, max_new = 64, chunk = 0, top_k = 0, seed = 0;
    double temp = 0.0, top_p = 1.0, min_p = 0.0;
    int print_ids = 0, stats = 0, stop_eos = 0;
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--print-ids")) {
            print_ids = 1;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = 1;
        } else if (!strcmp(argv[i], "--stop-eos")) {
            stop_eos = 1;
        } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
            model_dir = v;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v))) {
            tokens = v;
        } else if ((r = cli_opt(argc, argv, &i, "--kernels", &v))) {
            kernels = v;
        } else if ((r = cli_opt(argc, argv, &i, "--prompt", &v))) {
            return cli_usage(cmd, "--prompt needs the tokenizer, which this build does not have yet; use --tokens");
        } else if ((r = cli_opt(argc, argv, &i, "--max-new", &v))) {
            if (r > 0 && cli_long(cmd, "--max-new", v, 0, 1 << 30, &max_new))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--threads", &v))) {
            if (r > 0 && cli_long(cmd, "--threads", v, 1, 1024, &threads))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--prefill-chunk", &v))) {
            if (r > 0 && cli_long(cmd, "--prefill-chunk", v, 1, 1 << 20, &chunk))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--top-k", &v))) {
            if (r > 0 && cli_long(cmd, "--top-k", v, 0, 1 << 30, &top_k))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v))) {
            if (r > 0 && cli_long(cmd, "--seed", v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--temperature", &v))) {
            if (r > 0 && cli_double(cmd, "--temperature", v, 0.0, 100.0, &temp))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--top-p", &v))) {
            if (r > 0 && cli_double(cmd, "--top-p", v, 1e-9, 1.0, &top_p))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--min-p", &v))) {
            if (r > 0 && cli_double(cmd, "--min-p", v, 0.0, 1.0, &min_p))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!tokens)
        return cli_usage(cmd, "--tokens is required");
    errbuf err;
    int32_t *ids = NULL;
    int n = 0, rc = 1;
    if (cli_parse_ids(tokens, &ids, &n, &err) != 0)
        return cli_fail(cmd, &err);
    if (n == 0) {
        free(ids);
        return cli_usage(cmd, "--tokens is empty");
    }
    double t0 = timer_now();
    cli_engine e;
    session s;
    sampler sm;
    float *logits = NULL;
    memset(&s, 0, sizeof s);
    memset(&sm, 0, sizeof sm);
    if (cli_engine_open(&e, model_dir, (int)threads, kernels, &err) != 0) {
        free(ids);
        return cli_fail(cmd, &err);
    }
    double t_load = timer_now() - t0;
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = (float)temp;
    sc.top_k = (int)top_k;
    sc.top_p = (float)top_p;
    sc.min_p = (float)min_p;
    sc.seed = (uint64_t)seed;
    int T = chunk > 0 ? (int)chunk : (n < 256 ? n : 256);
    gen_req rq = {ids, n, (int)max_new, e.m.hp.eos_ids, stop_eos ? e.m.hp.n_eos : 0, T};
    struct emit em = {print_ids, 0};
    gen_stats st;
    if (!(logits = malloc(sizeof(float) * (size_t)e.m.hp.vocab))) {
        errbuf_set(&err, "out of memory");
        goto out;
    }
    if (sampler_init(&sm, &sc, e.m.hp.vocab, &err) || session_init(&s, &e.m, e.k, e.pool, n + (int)max_new, T, &err))
        goto out;
    if (gen_run(&s, &sm, &rq, logits, on_token, &em, &st, &err) != 0)
        goto out;
    printf("\n");
    fflush(stdout);
    if (stats) {
        fprintf(stderr,
                "[stats] model %s, kernels %s, %d threads\n"
                "[stats] load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | time to first token %.3f s\n"
                "[stats] generated %d tokens, decode %.2f tok/s (%.3f s for %d after the first)\n",
                e.m.hp.arch, e.k->name, pool_size(e.pool), t_load, st.n_prompt, st.t_prefill,
                st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0, st.t_first, st.n_gen,
                st.t_decode > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0.0, st.t_decode, st.n_gen - 1);
    }
    rc = 0;
out:
    if (rc)
        cli_fail(cmd, &err);
    free(logits);
    sampler_free(&sm);
    session_free(&s);
    cli_engine_close(&e);
    free(ids);
    return rc;
}
