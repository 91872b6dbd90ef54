/* cli_bench.c — `deltafin bench io`: the weight store's streaming rate without compute.
 *
 * For each simulated token and each layer it takes the layer's weights as a pass does (a streamed
 * spine is read), and for each MoE layer asks the store for top-k experts drawn at random
 * (seeded), exactly as the MoE block does (begin / next / release), and discards them: what
 * remains is the cache, the read engine and the drives. Reports GB/s delivered and its ratio
 * to a bandwidth given with --drive-gbs (doctor's measurement, or N x an emulated drive).
 * With --prefetch on, each layer's experts are hinted while the layer before is read: a router
 * lookahead that is always right, the upper bound of what prefetch can do for the I/O. */
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "store/store.h"

static const char *HELP =
    "usage: deltafin bench io --model STORE --ram-budget BYTES [--tokens N] [--seed S] [--drive-gbs G]\n"
    "                         [--emulate-drives ...] [--prefetch on|off] [--io uring|pread]\n"
    "Streams top-k random experts per MoE layer per token through the store without computing,\n"
    "and prints the delivered GB/s (and its ratio to --drive-gbs when given). --prefetch on hints\n"
    "each layer's experts while the previous layer is read (a lookahead that is always right).\n";

/* K distinct experts of E, ascending (the order the MoE block asks in) */
static void draw(rng *r, int E, int K, int *ids)
{
    int n = 0;
    while (n < K) {
        int x = (int)(rng_next(r) % (uint64_t)E), dup = 0;
        for (int j = 0; j < n; j++)
            dup |= ids[j] == x;
        if (!dup)
            ids[n++] = x;
    }
    for (int a = 1; a < n; a++)
        for (int c = a; c > 0 && ids[c] < ids[c - 1]; c--) {
            int tmp = ids[c];
            ids[c] = ids[c - 1];
            ids[c - 1] = tmp;
        }
}

int cmd_bench(int argc, char **argv)
{
    const char *cmd = "bench", *v;
    long tokens = 32, seed = 1;
    double drive_gbs = 0;
    engine_opts eo;
    engine_opts_default(&eo);
    eo.prefetch = 0;
    eo.threads = 1;
    if (argc < 2 || strcmp(argv[1], "io") != 0) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            fputs(HELP, stdout);
            return 0;
        }
        return cli_usage(cmd, "expected 'bench io' (the kernel benchmarks are `make bench`)");
    }
    for (int i = 2; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if ((r = cli_engine_opt(cmd, argc, argv, &i, &eo))) {
            if (r < 0)
                return 2;
            continue;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v))) {
            if (r > 0 && cli_long(cmd, "--tokens", v, 1, 1 << 20, &tokens))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v))) {
            if (r > 0 && cli_long(cmd, "--seed", v, 0, 1L << 40, &seed))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--drive-gbs", &v))) {
            if (r > 0 && cli_double(cmd, "--drive-gbs", v, 0.001, 1e6, &drive_gbs))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!eo.model || !eo.ram_budget)
        return cli_usage(cmd, "bench io needs --model and --ram-budget");
    errbuf err;
    engine *e;
    if (engine_open(&eo, &e, &err) != 0)
        return cli_fail(cmd, &err);
    store *sto = engine_store(e);
    if (!sto) {
        errbuf_set(&err, "%s: nothing to stream (no routed experts)", eo.model);
        engine_free(e);
        return cli_fail(cmd, &err);
    }
    const hparams *hp = engine_hparams(e);
    const weight_src *xs = store_weights(sto);
    int K = hp->top_k, E = hp->n_experts, L = hp->n_layers, rc = 1, held = -1; /* held: the layer taken */
    int *ids = malloc(sizeof(int) * (size_t)K * (size_t)L); /* [layer][K]: this token's and the next's */
    if (!ids) {
        errbuf_set(&err, "out of memory");
        goto out;
    }
    rng r;
    rng_seed(&r, (uint64_t)seed);
    double t0 = timer_now();
    for (long t = 0; t < tokens; t++) {
        for (int l = 0; l < L; l++)
            draw(&r, E, K, ids + (size_t)l * K);
        xs->pass_begin(xs->ctx, 1);
        for (int l = 0; l < L; l++) {
            const layer_w *lw;
            if (xs->layer(xs->ctx, l, &lw, &err) != 0)
                goto out;
            held = l;
            if (hp->ffn_kind[l] != FFN_MOE) {
                xs->layer_release(xs->ctx, l);
                held = -1;
                continue;
            }
            if (xs->begin(xs->ctx, l, ids + (size_t)l * K, K, &err) != 0)
                goto out;
            if (xs->prefetch)
                for (int nl = l + 1; nl < L; nl++)
                    if (hp->ffn_kind[nl] == FFN_MOE) {
                        xs->prefetch(xs->ctx, nl, ids + (size_t)nl * K, K);
                        break;
                    }
            int id;
            mlp_w m;
            for (int k = 0; k < K; k++) {
                int got = xs->next(xs->ctx, &id, &m, &err);
                if (got == 0)
                    errbuf_set(&err, "layer %d: the store handed over %d of %d experts", l, k, K);
                if (got != 1)
                    goto out;
                xs->release(xs->ctx, l, id);
            }
            xs->layer_release(xs->ctx, l);
            held = -1;
        }
    }
    double dt = timer_now() - t0;
    store_stats st;
    store_stats_get(sto, &st);
    double gbs = (st.bytes_read + st.spine_bytes_read) / 1e9 / dt;
    printf("bench io: %ld tokens, %.1f MB read per token (%.1f MB of it spine), %.2f s, %.2f GB/s delivered", tokens,
           (st.bytes_read + st.spine_bytes_read) / 1e6 / (double)tokens, st.spine_bytes_read / 1e6 / (double)tokens,
           dt, gbs);
    if (drive_gbs > 0)
        printf(", %.2f of %.2f GB/s", gbs / drive_gbs, drive_gbs);
    printf(", hit rate %.1f%%\n", st.requests ? 100.0 * (double)st.hits / (double)st.requests : 0.0);
    engine_report(e, stderr, (int)tokens, dt);
    rc = 0;
out:
    if (held >= 0)
        xs->layer_release(xs->ctx, held);
    if (rc)
        cli_fail(cmd, &err);
    free(ids);
    engine_free(e);
    return rc;
}
