/* test_util.h — helpers shared by the engine tests: running a model over tokens, reading
 * float files, comparing logits. */
#ifndef DF_TESTS_TEST_UTIL_H
#define DF_TESTS_TEST_UTIL_H

#include <stdint.h>

#include "engine/engine.h"
#include "kernels/kern.h"
#include "model/model.h"

struct store;
/* An engine over m and st (both borrowed; st NULL: every weight resident) on `threads` threads
 * with kernel table k (NULL = best). NULL with err set on failure. */
engine *tu_engine(const model *m, struct store *st, int threads, const kern_ops *k, errbuf *err);
/* A session of e for `context` positions and passes of up to max_pass tokens, logits for every
 * position of a pass, the default commit log and no checkpoints. */
session *tu_session(engine *e, int context, int max_pass, errbuf *err);
/* Logits [n][vocab] of ids through a fresh session of e, in passes of `chunk` tokens. Returns
 * malloc'd logits or NULL (err set). */
float *tu_eval_engine(engine *e, const int32_t *ids, int n, int chunk, errbuf *err);
/* The same through a fresh engine over m (resident) on `threads` threads with table k. */
float *tu_eval(const model *m, const int32_t *ids, int n, int chunk, int threads, const kern_ops *k, errbuf *err);
/* Reads a whole float32 file; *n = float count. */
float *tu_read_f32(const char *path, size_t *n);
/* sqrt(sum (a-b)^2 / sum b^2) */
double tu_rel_err(const float *a, const float *b, size_t n);
/* Lists sub-folders of dir (sorted); returns count, names malloc'd in *names. */
int tu_list_dirs(const char *dir, char ***names);
/* Runs a shell command line, capturing stdout+stderr (up to cap bytes) into out; returns the
 * exit status (or -1). */
int tu_run(const char *cmdline, char *out, size_t cap);
/* Calls to malloc and friends so far (the test binary wraps them: test_alloc.c). */
long tu_alloc_count(void);
/* The deltafin binary under test ($DELTAFIN_BIN or build/deltafin). */
const char *tu_bin(void);

#endif
