/* pool.c — see pool.h.
 *
 * Handshake: the caller publishes (fn, ctx, n, chunk) and bumps `gen`; each worker that sees a
 * new generation takes chunks from `next` until none is left and increments `done`. The caller
 * takes chunks too and then waits for done == nthreads - 1. Release/acquire on gen and done order
 * the job fields and the results. A worker polls for SPIN_SECONDS before sleeping so back-to-back
 * loops in decode do not pay a wake-up each time.
 */
#include "base/pool.h"

#include "base/mem.h"
#include "base/timer.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long an idle worker keeps polling for the next loop before it sleeps. Decode issues a
 * thousand or more loops per token with single-threaded work between them; waking a sleeping
 * thread costs far more than that gap on virtual machines (measured: half of all decode time
 * went to wake-ups with a 20000-poll limit), so workers stay hot for a few milliseconds. */
#define SPIN_SECONDS 0.005

/* Chunks per thread: a loop is cut into POOL_CHUNKS * n pieces taken first come, first served, so
 * a thread that starts late (woken from sleep, or its vCPU preempted) or runs slower leaves its
 * share to the others instead of holding the loop's end. Measured (perf, bench/results/engine.md):
 * with one range per thread, the caller's wait at a loop's end was 9.5% of decode's samples on 2
 * vCPUs; with chunks, 3.3%. */
#define POOL_CHUNKS 8

struct worker {
    pool *p;
    int tid;
    pthread_t th;
};

struct pool {
    int n;
    struct worker *w;        /* [n-1] workers, tids 1..n-1 */
    void **scratch;          /* [n] per-thread buffers */
    size_t scratch_bytes;
    /* current job */
    pool_fn fn;
    void *ctx;
    int items, chunk;
    _Atomic long long next; /* first item not yet taken; 64-bit: it runs a chunk per thread past n */
    _Atomic unsigned gen;
    _Atomic int done;
    _Atomic int quit;
    _Atomic int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Takes chunks of the current loop until none is left. */
static void run_chunks(pool *p, int tid)
{
    for (;;) {
        long long b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->items)
            return;
        long long e = p->items - b < p->chunk ? p->items : b + p->chunk;
        p->fn(p->ctx, (int)b, (int)e, tid);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    pool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        double idle_since = timer_now();
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_acquire)) {
            if ((++spins & 255) != 0 || timer_now() - idle_since < SPIN_SECONDS) {
                CPU_RELAX();
                if ((spins & 1023) == 0)
                    sched_yield(); /* on a busy machine the thread we wait for may need this core */
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            return NULL;
        seen = g;
        run_chunks(p, w->tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

int pool_ncpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0)
            return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

pool *pool_new(int nthreads, errbuf *err)
{
    if (nthreads < 1)
        nthreads = 1;
    pool *p = calloc(1, sizeof *p);
    if (!p) {
        errbuf_set(err, "thread pool: out of memory");
        return NULL;
    }
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->scratch = calloc((size_t)nthreads, sizeof *p->scratch);
    p->w = calloc((size_t)nthreads, sizeof *p->w);
    if (!p->scratch || !p->w) {
        errbuf_set(err, "thread pool: out of memory");
        pool_free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        p->w[i - 1].p = p;
        p->w[i - 1].tid = i;
        if (pthread_create(&p->w[i - 1].th, NULL, worker_main, &p->w[i - 1]) != 0) {
            errbuf_set(err, "thread pool: cannot start thread %d of %d", i, nthreads);
            p->n = i; /* join only the ones that started */
            pool_free(p);
            return NULL;
        }
    }
    return p;
}

void pool_free(pool *p)
{
    if (!p)
        return;
    atomic_store(&p->quit, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->w[i - 1].th, NULL);
    if (p->scratch)
        for (int i = 0; i < p->n; i++)
            free(p->scratch[i]);
    free(p->scratch);
    free(p->w);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int pool_size(const pool *p) { return p ? p->n : 1; }

void pool_for(pool *p, int n, pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (!p || p->n == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->items = n;
    p->chunk = (int)(((long long)n + POOL_CHUNKS * p->n - 1) / (POOL_CHUNKS * p->n));
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* seq_cst, not release: this store and the load of sleepers below pair with the worker's
     * sleepers++ then gen load; weaker orders allow both sides to miss each other (a lost wakeup) */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, 0);
    for (unsigned spins = 1; atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1; spins++) {
        CPU_RELAX();
        if ((spins & 1023) == 0)
            sched_yield();
    }
}

int pool_reserve(pool *p, size_t bytes, errbuf *err)
{
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes <= p->scratch_bytes)
        return 0;
    for (int i = 0; i < p->n; i++) {
        void *nb = NULL;
        if (posix_memalign(&nb, 64, bytes) != 0)
            return errbuf_set(err, "thread scratch: out of memory (%zu bytes)", bytes);
        mem_populate(nb, bytes); /* which thread takes which chunk varies: each must find its scratch in */
        free(p->scratch[i]);
        p->scratch[i] = nb;
    }
    p->scratch_bytes = bytes;
    return 0;
}

void *pool_scratch(pool *p, int tid) { return p->scratch[tid]; }
size_t pool_scratch_size(const pool *p) { return p->scratch_bytes; }
