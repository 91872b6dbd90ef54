/* engine_opts.c — the options every subcommand that runs a model shares (engine.h). */
#include <string.h>

#include "base/args.h"
#include "engine/engine.h"
#include "store/store.h"

const char ENGINE_OPTS_HELP[] =
    "model: [--model DIR] [--threads N] [--kernels auto|scalar|avx2|avx512|neon]\n"
    "       [--device cpu|cuda[:N]] [--vram-budget BYTES]\n"
    "weight store: [--ram-budget BYTES] [--drives DIR,...] [--emulate-drives MBps:lat_us,...]\n"
    "              [--prefetch on|off] [--io uring|pread] [--no-verify]\n"
    "  --model takes a Hugging Face folder or a DFSP store (deltafin prepare); without it the bundled\n"
    "  default model runs. --kernels pins the instruction set (the logits are the same bits). --device\n"
    "  picks where passes run: cpu, or cuda[:N] in a CUDA build (make CUDA=1: the whole pass on GPU N,\n"
    "  every spine in its memory, routed experts too or, with a weight store, a cache of them in what\n"
    "  --vram-budget leaves; the logits are the same bits).\n"
    "  --ram-budget (e.g. 8G) bounds the RAM for weights: the globals and as many layer spines as fit\n"
    "  stay resident, the other layers' spines stream through two slots, experts through a cache of\n"
    "  what is left. Without it, everything stays mapped when it fits in 80% of physical memory.\n";

void engine_opts_default(engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->verify = 1;
}

int engine_opts_parse(engine_opts *o, int argc, char **argv, int *i, errbuf *err)
{
    static const char *const names[] = {"--model",   "--ram-budget", "--drives",  "--emulate-drives",
                                        "--prefetch", "--io",        "--threads", "--kernels",
                                        "--device",  "--vram-budget"};
    if (!strcmp(argv[*i], "--no-verify")) {
        o->verify = 0;
        return 1;
    }
    const char *v = NULL;
    int which = args_which(argc, argv, i, names, (int)(sizeof names / sizeof names[0]), &v, err);
    if (which < 0)
        return which == -1 ? 0 : -1;
    long n;
    switch (which) {
    case 0:
        o->model = v;
        break;
    case 1:
        if (store_parse_bytes(v, &o->ram_budget) != 0 || o->ram_budget == 0)
            return errbuf_set(err, "--ram-budget expects bytes like 8G or 512M, got '%s'", v);
        break;
    case 2:
        o->drives = v;
        break;
    case 3:
        o->emulate = v;
        break;
    case 4:
        if (strcmp(v, "on") && strcmp(v, "off"))
            return errbuf_set(err, "--prefetch expects on or off, got '%s'", v);
        o->prefetch = !strcmp(v, "on");
        break;
    case 5:
        if (strcmp(v, "uring") && strcmp(v, "pread"))
            return errbuf_set(err, "--io expects uring or pread, got '%s'", v);
        o->io = !strcmp(v, "uring") ? ENGINE_IO_URING : ENGINE_IO_PREAD;
        break;
    case 6:
        if (args_long("--threads", v, 1, 1024, &n, err) != 0)
            return -1;
        o->threads = (int)n;
        break;
    case 7:
        o->kernels = v;
        break;
    case 8:
        o->device = v;
        break;
    default:
        if (store_parse_bytes(v, &o->vram_budget) != 0 || o->vram_budget == 0)
            return errbuf_set(err, "--vram-budget expects bytes like 40G or 512M, got '%s'", v);
    }
    return 1;
}
