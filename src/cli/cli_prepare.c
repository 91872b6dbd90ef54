/* cli_prepare.c — `deltafin prepare`: write a DFSP store from a Hugging Face folder. */
#include <string.h>

#include "cli/cli.h"
#include "store/dfsp.h"

static const char *HELP =
    "usage: deltafin prepare --model HFDIR --out STORE [--drives DIR,DIR,...] [--mirrors N]\n"
    "                        [--spine as-released|int8]\n"
    "Writes a DFSP store: every routed expert and every layer's spine as a 4 KiB-aligned blob,\n"
    "striped over the drive folders (each blob on N of them with --mirrors), with a manifest of\n"
    "offsets, sizes, drives and xxh3 checksums in STORE. Atomic and resumable: rerun after an\n"
    "interruption and it verifies what was written and continues. Refuses a STORE holding another\n"
    "model; checks free space first. Run the store with `deltafin run --model STORE`.\n"
    "--spine int8 (opt-in, never the default) stores the layers' attention, shared-expert and dense\n"
    "matrices as INT8 with a BF16 scale per 32 weights: about half their memory and drive bytes, at\n"
    "the cost of a small logit error (measured in bench/results/store.md). Routers, routed experts,\n"
    "embedding and output head stay as released.\n";

int cmd_prepare(int argc, char **argv)
{
    const char *cmd = "prepare", *model_dir = NULL, *out = NULL, *drives = NULL, *v;
    long mirrors = 1;
    int spine_int8 = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
            model_dir = v;
        } else if ((r = cli_opt(argc, argv, &i, "--out", &v))) {
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--drives", &v))) {
            drives = v;
        } else if ((r = cli_opt(argc, argv, &i, "--spine", &v))) {
            if (r > 0 && strcmp(v, "int8") && strcmp(v, "as-released"))
                return cli_usage(cmd, "--spine must be as-released or int8, not '%s'", v);
            spine_int8 = r > 0 && !strcmp(v, "int8");
        } else if ((r = cli_opt(argc, argv, &i, "--mirrors", &v))) {
            if (r > 0 && cli_long(cmd, "--mirrors", v, 1, STORE_MAX_COPIES, &mirrors))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!model_dir || !out)
        return cli_usage(cmd, "--model and --out are required");
    char buf[8192], *save = NULL;
    const char *list[STORE_MAX_PACKS];
    int n = 0;
    if (drives) {
        snprintf(buf, sizeof buf, "%s", drives);
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n == STORE_MAX_PACKS)
                return cli_usage(cmd, "--drives: at most %d folders", STORE_MAX_PACKS);
            list[n++] = t;
        }
    }
    dfsp_prepare_opts o = {list, n, (int)mirrors, spine_int8};
    dfsp_prepare_stats st;
    errbuf err;
    int rc = dfsp_prepare(model_dir, out, &o, &st, &err);
    if (rc == DFSP_STOPPED) { /* the test aid: the exit status a crash would have had */
        fprintf(stderr, "deltafin %s: %s\n", cmd, err.msg);
        return 3;
    }
    if (rc != 0)
        return cli_fail(cmd, &err);
    if (spine_int8)
        printf("prepare: spine int8: %d matrices, %.3f GB as released -> %.3f GB\n", st.spine_mats,
               (double)st.spine_in / 1e9, (double)st.spine_out / 1e9);
    if (st.already)
        printf("prepare: %s already holds this model (%d blobs)\n", out, st.blobs);
    else
        printf("prepare: %d blobs (%d verified from an earlier run), %.2f GB written in %.1f s (%.2f GB/s) over %d "
               "drive(s), %d mirror(s)\n",
               st.blobs, st.resumed, (double)st.bytes / 1e9, st.seconds,
               st.seconds > 0 ? (double)st.bytes / 1e9 / st.seconds : 0.0, n > 0 ? n : 1, (int)mirrors);
    return 0;
}
