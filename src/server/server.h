/* server.h — `deltafin serve`: an OpenAI-compatible HTTP server over one engine (docs/SERVER.md).
 *
 *     server_opts o;  server_opts_default(&o);
 *     for each argv option:  server_opts_parse(&o, argc, argv, &i, &err);  // serve's, the engine's, drafting
 *     server_run(&o, stdout, &err);   // until SIGINT or SIGTERM
 *
 * The server listens at once and loads the model in the background (generating routes answer 503
 * until it is loaded); it prints one line "listening on http://HOST:PORT" when the socket is bound
 * (with --port 0 the port the system chose), and "ready" when the model is loaded.
 */
#ifndef DF_SERVER_SERVER_H
#define DF_SERVER_SERVER_H

#include <stdio.h>

#include "base/err.h"
#include "engine/draft.h"
#include "engine/engine.h"

typedef struct server_opts {
    engine_opts eng;          /* the model: engine_opts_parse's options */
    draft_opts draft;         /* drafting: draft_opts_parse's options (default auto) */
    const char *host;         /* "127.0.0.1" */
    int port;                 /* 8000; 0: any free port */
    const char *api_key;      /* NULL: no key; else every route but /health needs "Bearer KEY" */
    long max_tokens;          /* the most tokens one response may generate (1,000,000) */
    long max_request_bytes;   /* the largest request body (8 MiB) */
    int queue;                /* generations that may wait behind the running one (16) */
    int context;              /* positions the session holds (0: 32768, at most the model's) */
    int timeout_s;            /* a connection idle this long is closed (30) */
    const char *cache_dir;    /* persist the states behind the last conversations there (NULL: no) */
    uint64_t cache_bytes;     /* their byte budget (4 GiB) */
    int debug;                /* serve POST /debug/logits */
} server_opts;

void server_opts_default(server_opts *o);
/* Consumes argv[*i] when it is a serve option, an engine option or a drafting option: 1 consumed,
 * 0 not one, -1 bad value (err names it). */
int server_opts_parse(server_opts *o, int argc, char **argv, int *i, errbuf *err);
extern const char SERVER_OPTS_HELP[];

/* Serves until SIGINT or SIGTERM (blocked in every thread but the one that waits for them), or
 * until the model fails to load. Status lines go to `log`. */
int server_run(const server_opts *o, FILE *log, errbuf *err);

#endif
