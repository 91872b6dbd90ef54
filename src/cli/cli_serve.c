/* cli_serve.c — `deltafin serve`: the OpenAI-compatible server (server/server.h, docs/SERVER.md). */
#include <string.h>

#include "cli/cli.h"
#include "server/server.h"

static const char *HELP =
    "usage: deltafin serve [model options] [drafting options] [serve options]\n"
    "Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions, /v1/completions,\n"
    "/tokenize, /detokenize; GET /v1/models, /health, /metrics, and a chat page at /.\n"
    "Without --model the K3 that `deltafin setup` installed is served, else the bundled default model. Stop with Ctrl-C (SIGINT) or SIGTERM.\n";

int cmd_serve(int argc, char **argv)
{
    const char *cmd = "serve";
    server_opts o;
    server_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            fputs(SERVER_OPTS_HELP, stdout);
            fputs(ENGINE_OPTS_HELP, stdout);
            fputs(DRAFT_OPTS_HELP, stdout);
            return 0;
        }
        errbuf err;
        int r = server_opts_parse(&o, argc, argv, &i, &err);
        if (r < 0)
            return cli_usage(cmd, "%s", err.msg);
        if (r == 0)
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
    }
    errbuf err;
    cli_model pick;
    cli_model_pick(cmd, &o.eng, &pick);
    if (server_run(&o, stdout, &err) != 0)
        return cli_fail(cmd, &err);
    return 0;
}
