/* cli_synth.c — `deltafin synth`: write a random-weight checkpoint in K3's released format. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "model/synth.h"

static const char *HELP = "usage: deltafin synth --preset k3-tiny|k3-mini|k3-wide --out DIR [--seed S] [--size-gb N]\n"
                          "Writes DIR/config.json and DIR/model.safetensors: K3's architecture and release\n"
                          "format (nested config, MXFP4 experts) with deterministic random weights.\n"
                          "--size-gb sets the number of routed experts so the checkpoint is about N GB\n"
                          "(for storage benchmarks on models larger than the RAM budget).\n";

int cmd_synth(int argc, char **argv)
{
    const char *cmd = "synth", *preset = NULL, *out = NULL, *v;
    long seed = -1;
    double size_gb = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if ((r = cli_opt(argc, argv, &i, "--preset", &v))) {
            preset = v;
        } else if ((r = cli_opt(argc, argv, &i, "--out", &v))) {
            out = v;
        } else if ((r = cli_opt(argc, argv, &i, "--size-gb", &v))) {
            if (r > 0 && cli_double(cmd, "--size-gb", v, 0.001, 100000.0, &size_gb))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v))) {
            if (r > 0 && cli_long(cmd, "--seed", v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!preset || !out)
        return cli_usage(cmd, "--preset and --out are required");
    synth_k3 c;
    if (synth_preset(preset, &c) != 0)
        return cli_usage(cmd, "unknown preset '%s' (k3-tiny, k3-mini, k3-wide)", preset);
    if (seed >= 0)
        c.seed = (uint64_t)seed;
    if (size_gb > 0)
        synth_scale(&c, size_gb);
    errbuf err;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        errbuf_errno(&err, out);
        return cli_fail(cmd, &err);
    }
    if (synth_k3_write(&c, out, &err) != 0)
        return cli_fail(cmd, &err);
    printf("synth: %s, %d routed experts per MoE layer, %.2f GB\n", preset, c.experts, synth_bytes(&c) / 1e9);
    return 0;
}
