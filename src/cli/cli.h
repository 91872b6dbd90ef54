/* cli.h — shared helpers of the subcommands (one file per subcommand: cli_run.c, cli_eval.c,
 * ...). Subcommands return the process exit status: 0 success, 1 failure, 2 usage error; they
 * print errors as one line "deltafin <cmd>: what" on stderr. Only main() exits. */
#ifndef DF_CLI_CLI_H
#define DF_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "base/pool.h"
#include "kernels/kern.h"
#include "model/model.h"

/* Matches argv[*i] against "--name value" or "--name=value". Returns 1 and sets *val (advancing
 * *i past a separate value), 0 if it is another option, -1 if the value is missing. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
int cli_long(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out);
int cli_double(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out);
/* "1,2,3" or "1 2 3" -> malloc'd ids. */
int cli_parse_ids(const char *s, int32_t **ids, int *n, errbuf *err);
/* The bundled default model folder (models/default next to the binary, or $DELTAFIN_MODEL). */
int cli_default_model(char *out, size_t cap, errbuf *err);

/* Weight-store options shared by run and eval (--ram-budget, --drives, --emulate-drives,
 * --prefetch, --io). */
typedef struct cli_store_opts {
    const char *ram_budget; /* NULL: derived from physical memory */
    const char *drives;     /* comma-separated folders replacing the store's drive folders */
    const char *emulate;    /* "MBps:latency_us,..." */
    const char *io;         /* uring | pread */
    int prefetch;           /* 1 unless --prefetch off */
    int verify;             /* 1 unless --no-verify */
    int min_cache;          /* stream with the budget of the spine and 2 experts, whatever --ram-budget
                               says (the planner may stream a few spines to keep more experts) */
} cli_store_opts;
void cli_store_opts_default(cli_store_opts *o);
/* Consumes argv[*i] if it is a store option: 1 consumed, 0 not one, -1 usage error (printed). */
int cli_store_opt(const char *cmd, int argc, char **argv, int *i, cli_store_opts *o);
extern const char *CLI_STORE_HELP;

struct session;
struct store;

/* The engine a subcommand runs on: model, kernels, threads, and the weight store when experts
 * stream (NULL when every weight is resident). */
typedef struct cli_engine {
    model m;
    const kern_ops *k;
    pool *pool;
    struct store *store;
    int dfsp;
    int spine_int8;    /* a DFSP store made with prepare --spine int8 */
    /* cli_engine_mark: when decode began, and what had been read by then */
    double mark_t;
    uint64_t mark_bytes, mark_drive[16];
} cli_engine;
int cli_engine_open(cli_engine *e, const char *model_dir, int threads, const char *kernels, const cli_store_opts *so,
                    errbuf *err);
void cli_engine_close(cli_engine *e);
/* Points a session's expert reads at the engine's store (no-op when all is resident). */
void cli_engine_attach(cli_engine *e, struct session *s);
/* --stats lines about the store (nothing when all is resident). */
void cli_engine_stats(cli_engine *e, int tokens, double seconds);
/* Marks the start of decode (the first generated token); cli_engine_stats_decode then prints the
 * reads of the `tokens` decoded since, per token and per drive against doctor's rate: the
 * miss-bound decode figure, without the prompt's reads. */
void cli_engine_mark(cli_engine *e);
void cli_engine_stats_decode(cli_engine *e, int tokens);

int cli_fail(const char *cmd, const errbuf *err); /* prints, returns 1 */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3))); /* returns 2 */

int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

#endif
