/* cli.h — shared helpers of the subcommands (one file per subcommand: cli_run.c, cli_eval.c,
 * ...). Subcommands return the process exit status: 0 success, 1 failure, 2 usage error; they
 * print errors as one line "deltafin <cmd>: what" on stderr. Only main() exits. */
#ifndef DF_CLI_CLI_H
#define DF_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "engine/draft.h"
#include "engine/engine.h"
#include "hub/hub.h"

/* Matches argv[*i] against "--name value" or "--name=value" (base/args.h). Returns 1 and sets
 * *val (advancing *i past a separate value), 0 if it is another option, -1 if the value is missing. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Bounded numbers; on a bad value they print the usage error and return 2. */
int cli_long(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out);
int cli_double(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out);
/* "1,2,3" or "1 2 3" -> malloc'd ids. */
int cli_parse_ids(const char *s, int32_t **ids, int *n, errbuf *err);
/* Consumes argv[*i] if it is an engine option (engine_opts_parse): 1 consumed, 0 not one, -1 usage
 * error (printed). */
int cli_engine_opt(const char *cmd, int argc, char **argv, int *i, engine_opts *o);

/* The same for the drafting options (draft_opts_parse). */
int cli_draft_opt(const char *cmd, int argc, char **argv, int *i, draft_opts *o);

/* The model root: `opt` (--model-root) when given, else $DELTAFIN_HOME, else ~/.deltafin. */
int cli_model_root(const char *opt, char *out, size_t cap, errbuf *err);
/* For run, eval and serve: without --model, the K3 `deltafin setup` installed under the model root
 * (its install.json), else the bundled default model, said on stderr in a line "model: ..." (not
 * an error's "deltafin CMD: ..."); and the hub a streamed install fetches experts from (HF_ENDPOINT,
 * HF_TOKEN, HF_HUB_OFFLINE). Sets o->model and o->hub to what *pick holds, which must outlive o. */
typedef struct cli_model {
    char dir[4096];
    hub_opts hub;
} cli_model;
void cli_model_pick(const char *cmd, engine_opts *o, cli_model *pick);

int cli_fail(const char *cmd, const errbuf *err); /* prints, returns 1 */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3))); /* returns 2 */

int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_upgrade(int argc, char **argv);
int cmd_setup(int argc, char **argv);
int cmd_setup_qwen(int argc, char **argv);

#endif
