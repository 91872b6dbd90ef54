/* args.h — reading command-line options: "--name value" or "--name=value", and bounded numbers.
 *
 * Shared by the CLI and the engine's option parser (engine/engine.h), so every subcommand spells
 * and checks an option the same way. Errors name the option and the value given. */
#ifndef DF_BASE_ARGS_H
#define DF_BASE_ARGS_H

#include "base/err.h"

/* Matches argv[*i] against "--name value" or "--name=value". Returns 1 and sets *val (advancing
 * *i past a separate value), 0 if it is another option, -1 if the value is missing. */
int args_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Which of names[0..n) argv[*i] is, each taking a value (args_opt): its index with *val set (and *i
 * advanced past a separate value), -1 when it is none of them, -2 with err "NAME needs a value" when
 * the value is missing. */
int args_which(int argc, char **argv, int *i, const char *const *names, int n, const char **val, errbuf *err);
/* A decimal integer in lo..hi, or a double in lo..hi; -1 with "OPT expects ..., got 'VAL'". */
int args_long(const char *opt, const char *val, long lo, long hi, long *out, errbuf *err);
int args_double(const char *opt, const char *val, double lo, double hi, double *out, errbuf *err);

#endif
