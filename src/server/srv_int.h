/* srv_int.h — what the server's files share: the server, its jobs and their hand-over between the
 * connection threads (srv_http.c) and the one generation thread (srv_gen.c).
 *
 * Threads: libmicrohttpd runs one thread per connection; they parse, check and tokenize requests,
 * answer every non-generating route themselves, and queue generations. One generation thread owns
 * the engine, its session and the drafters, and runs the queued jobs in order. Everything below
 * marked "mu" is read and written only with srv.mu held.
 *
 * A job's life: QUEUED (in srv.queue) -> RUNNING -> DONE, or straight to DONE when cancelled
 * while queued. Two references hold it: the connection's and the queue's / generation thread's;
 * the last to let go frees it (job_release). A client that goes away sets `cancel`; the
 * generation thread checks it, and the client's socket, at every token.
 */
#ifndef DF_SERVER_SRV_INT_H
#define DF_SERVER_SRV_INT_H

#include <pthread.h>
#include <stdint.h>

#include "base/buf.h"
#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "server/api.h"
#include "server/srv_cache.h"
#include "server/server.h"

enum job_state { JOB_QUEUED = 1, JOB_RUNNING, JOB_DONE };

typedef struct job job;
struct srv;
struct job {
    api_req rq;
    tok_ids prompt;     /* the prompt's ids, tokenized by the connection thread */
    char id[48];        /* "chatcmpl-..." / "cmpl-..." */
    long created;       /* unix seconds */
    uint64_t auto_seed; /* the sampling seed when the request gives none */
    struct srv *sv;
    /* mu */
    int state;          /* enum job_state */
    int cancel;         /* the client went away */
    int fd;             /* the client's socket, for hang-up checks; -1 once the connection ended */
    int refs;
    buf out;           /* stream: SSE bytes produced; out.p[out_off..out.n) not yet handed over */
    size_t out_off;
    int status;         /* non-stream: the response's status and body, set when DONE */
    char *body;
    pthread_cond_t cv;  /* signalled on new output and on DONE */
    job *next;          /* in srv.queue */
};

typedef struct srv_metrics { /* mu */
    uint64_t by_status[6];           /* responses by status class 1xx .. 5xx (index 1..5) */
    uint64_t by_code[16];            /* by status, in the order of srv_http.c's CODES */
    uint64_t prompt_tokens, gen_tokens, reused_tokens, reuse_hits, gen_requests, cancelled;
    double decode_s, prefill_s;
    double last_tps;
    uint64_t draft_proposed[GEN_MAX_DRAFTERS], draft_accepted[GEN_MAX_DRAFTERS], draft_steps[GEN_MAX_DRAFTERS];
    const char *draft_name[GEN_MAX_DRAFTERS];
    uint64_t store_requests, store_hits; /* the weight store's expert requests and hits, if it streams */
    uint64_t cache_loads, cache_saves, cache_states, cache_bytes; /* --cache-dir */
    int has_cache;
    int has_store;
} srv_metrics;

typedef struct srv srv;
struct srv {
    server_opts o;
    char model_id[128];
    long started;              /* unix seconds */
    char limit_text[32];       /* --max-request-bytes, for its error */
    pthread_mutex_t mu;
    pthread_cond_t work;       /* signalled when a job is queued or the server stops */
    /* mu */
    int ready;                 /* the model is loaded: generation can start */
    int failed;                /* loading failed (load_err) */
    int stopping;
    errbuf load_err;
    job *queue, *queue_tail;
    int queued, running;
    int answering;             /* connections holding a job, until libmicrohttpd is done with them */
    uint64_t serial;
    srv_metrics m;
    /* set once before ready, then read-only */
    engine *e;
    const tok *tk;
    int vocab, context, n_eos;
    int32_t eos[16];
    /* the generation thread's own */
    pthread_t gen_thread;
    session *s;
    drafter *drafters[GEN_MAX_DRAFTERS];
    int nd;
    srv_cache cache;           /* --cache-dir */
    int have_cache;
    pthread_cond_t loaded;     /* signalled when ready or failed */
};

/* srv_gen.c: the generation thread */
void *srv_gen_main(void *arg);
void job_release(srv *sv, job *j); /* takes mu itself */
int srv_hung_up(int fd);            /* the peer of a socket closed its end */
/* Queues j (taking a reference for the generation thread); -1 when the queue is full. mu held. */
int srv_enqueue(srv *sv, job *j);

/* srv_http.c */
void srv_metrics_count(srv *sv, int status); /* mu held */

/* the chat page (srv_page.c, from page.html) */
extern const char srv_page_html[];
extern const unsigned srv_page_len;

#endif
