/* pool.h — a fixed set of worker threads that run one parallel loop at a time.
 *
 * pool_for(p, n, fn, ctx) splits [0, n) into contiguous chunks (about 8 per thread) that the
 * threads take first come, first served, runs fn(ctx, begin, end, tid) on each (the calling
 * thread is tid 0; a thread may get several chunks, or none) and returns when all are done.
 * Work items are independent by contract: a result never depends on which thread or range
 * computed it, which is what keeps logits bit-identical for any thread count and schedule.
 *
 * Each thread owns a scratch buffer (pool_scratch) reserved before the hot path with
 * pool_reserve, so kernels called from fn never allocate.
 * Workers spin briefly between loops (decode issues many small loops per token) and then
 * sleep on a condition variable.
 */
#ifndef DF_BASE_POOL_H
#define DF_BASE_POOL_H

#include <stddef.h>

#include "base/err.h"

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int begin, int end, int tid);

pool *pool_new(int nthreads, errbuf *err); /* nthreads >= 1; 1 means no workers */
void pool_free(pool *p);
int pool_size(const pool *p);
void pool_for(pool *p, int n, pool_fn fn, void *ctx);
/* Makes every thread's scratch at least `bytes` (64-byte aligned). Not for the hot path. */
int pool_reserve(pool *p, size_t bytes, errbuf *err);
void *pool_scratch(pool *p, int tid);
size_t pool_scratch_size(const pool *p);
/* Number of CPUs this process may run on. */
int pool_ncpu(void);

#endif
