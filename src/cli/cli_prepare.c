/* cli_prepare.c — `deltafin prepare`: write a DFSP store from a Hugging Face folder. */
#include <string.h>

#include "cli/cli.h"
#include "store/dfsp.h"

static const char *HELP =
    "usage: deltafin prepare --model HFDIR --out STORE [--drives DIR,DIR,...] [--mirrors N]\n"
    "Writes a DFSP store: every routed expert and every layer's spine as a 4 KiB-aligned blob,\n"
    "striped over the drive folders (each blob on N of them with --mirrors), with a manifest of\n"
    "offsets, sizes, drives and xxh3 checksums in STORE. Atomic and resumable: rerun after an\n"
    "interruption and it verifies what was written and continues. Refuses a STORE holding another\n"
    "model; checks free space first. Run the store with `deltafin run --model STORE`.\n";

int cmd_prepare(int argc, char **argv)
{
    const char *cmd = "prepare", *model_dir = NULL, *out = NULL, *drives = NULL, *v;
    long mirrors = 1;
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
    dfsp_prepare_opts o = {list, n, (int)mirrors};
    dfsp_prepare_stats st;
    errbuf err;
    int rc = dfsp_prepare(model_dir, out, &o, &st, &err);
    if (rc == DFSP_STOPPED) { /* the test aid: the exit status a crash would have had */
        fprintf(stderr, "deltafin %s: %s\n", cmd, err.msg);
        return 3;
    }
    if (rc != 0)
        return cli_fail(cmd, &err);
    if (st.already)
        printf("prepare: %s already holds this model (%d blobs)\n", out, st.blobs);
    else
        printf("prepare: %d blobs (%d verified from an earlier run), %.2f GB written in %.1f s (%.2f GB/s) over %d "
               "drive(s), %d mirror(s)\n",
               st.blobs, st.resumed, (double)st.bytes / 1e9, st.seconds,
               st.seconds > 0 ? (double)st.bytes / 1e9 / st.seconds : 0.0, n > 0 ? n : 1, (int)mirrors);
    return 0;
}
