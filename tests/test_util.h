/* test_util.h — helpers shared by the engine tests: running a model over tokens, reading
 * float files, comparing logits. */
#ifndef DF_TESTS_TEST_UTIL_H
#define DF_TESTS_TEST_UTIL_H

#include <stdint.h>

#include "base/pool.h"
#include "engine/session.h"
#include "model/model.h"

/* Logits [n][vocab] of ids through a fresh session, in passes of `chunk` tokens, on `threads`
 * threads with kernel table k (NULL = best). Returns malloc'd logits or NULL (err set). */
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
/* The deltafin binary under test ($DELTAFIN_BIN or build/deltafin). */
const char *tu_bin(void);

#endif
