/* main.c — the deltafin command: dispatches to one subcommand. The only place that exits. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {.name = "run", .fn = cmd_run, .help = "generate text or token ids from a prompt"},
    {.name = "eval", .fn = cmd_eval, .help = "write the logits of every position of a token list"},
    {.name = "synth", .fn = cmd_synth, .help = "write a random-weight checkpoint in a real release format"},
    {.name = "prepare",
     .fn = cmd_prepare,
     .help = "write a DFSP store (experts as aligned blobs over drives) from a checkpoint"},
    {.name = "doctor", .fn = cmd_doctor, .help = "measure drives' O_DIRECT bandwidth and latency; verify a store"},
    {.name = "bench", .fn = cmd_bench, .help = "bench io: the weight store's streaming rate without compute"},
    {.name = "tokenize", .fn = cmd_tokenize, .help = "text or chat messages to token ids, and ids back to text"},
    {.name = "serve", .fn = cmd_serve, .help = "an OpenAI-compatible HTTP server with a chat page (docs/SERVER.md)"},
    {.name = "setup", .fn = cmd_setup, .help = "download Kimi K3 from the Hugging Face hub and prepare its store (docs/INSTALL.md)"},
    {.name = "setup-qwen", .fn = cmd_setup_qwen, .help = "download the Qwen3 0.6B and 1.7B Base drafters"},
    {.name = "upgrade", .fn = cmd_upgrade, .help = "git pull --ff-only the source checkout and rebuild it"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: deltafin COMMAND [options]   (deltafin COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0)
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "deltafin: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
