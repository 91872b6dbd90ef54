/* srv_http.c — the HTTP side of `deltafin serve` on libmicrohttpd (srv_int.h): routes, limits,
 * authentication, the non-generating routes, and the hand-over of generations to the generation
 * thread. Every answer that is not a success is an OpenAI error object (api.h).
 *
 * A request arrives in up to three calls of on_request: the headers (route, method, key and
 * Content-Length are checked there, so an oversized or unauthorised body is refused before it is
 * read), the body in pieces, and the end of the body, where it is handled. A generation then
 * waits for its job: a streamed one through stream_read, which hands over the job's SSE bytes as
 * they come; a whole one in on_request itself. Both watch the client's socket, so a client that
 * goes away cancels its job, queued or running.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/args.h"
#include "base/timer.h"
#include "server/srv_int.h"
#include "store/store.h"

enum route {
    R_NONE, R_PAGE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_LOGITS
};

static const struct {
    const char *path, *method;
    enum route r;
} ROUTES[] = {
    {.path = "/", .method = "GET", .r = R_PAGE},
    {.path = "/health", .method = "GET", .r = R_HEALTH},
    {.path = "/metrics", .method = "GET", .r = R_METRICS},
    {.path = "/v1/models", .method = "GET", .r = R_MODELS},
    {.path = "/v1/chat/completions", .method = "POST", .r = R_CHAT},
    {.path = "/v1/completions", .method = "POST", .r = R_COMPLETIONS},
    {.path = "/tokenize", .method = "POST", .r = R_TOKENIZE},
    {.path = "/detokenize", .method = "POST", .r = R_DETOKENIZE},
    {.path = "/debug/logits", .method = "POST", .r = R_LOGITS}, /* only with --debug */
};

/* how much of a body over the limit is read and dropped before the connection is refused */
enum { SRV_DRAIN_BYTES = 64 << 20 };

/* the status codes /metrics counts one by one (others only by class) */
static const int CODES[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
enum { N_CODES = sizeof CODES / sizeof CODES[0] };

typedef struct conn {
    enum route r;
    buf body;
    int too_big;
    size_t dropped;   /* bytes of a too-big body read and dropped */
    int fd;
    job *j;       /* a generation's job, once queued */
    double t0;
} conn;

void srv_metrics_count(srv *sv, int status)
{
    if (status >= 100 && status < 600)
        sv->m.by_status[status / 100]++;
    for (int k = 0; k < N_CODES; k++)
        if (CODES[k] == status)
            sv->m.by_code[k]++;
}

static enum MHD_Result respond(srv *sv, struct MHD_Connection *c, int status, const char *type, char *body)
{
    if (!body)
        return MHD_NO; /* out of memory: close the connection */
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&sv->mu);
    srv_metrics_count(sv, status);
    pthread_mutex_unlock(&sv->mu);
    return rc;
}

static enum MHD_Result respond_json(srv *sv, struct MHD_Connection *c, int status, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return respond(sv, c, status, "application/json", s);
}

static enum MHD_Result respond_err(srv *sv, struct MHD_Connection *c, const api_err *e)
{
    return respond(sv, c, e->status, "application/json", api_err_json(e));
}

static enum MHD_Result fail(srv *sv, struct MHD_Connection *c, int status, const char *type, const char *code,
                            const char *fmt, const char *arg)
{
    api_err e;
    api_err_set(&e, status, type, code, NULL, fmt, arg);
    return respond_err(sv, c, &e);
}

/* ---- the routes that never wait ---- */

static json_t *model_obj(srv *sv)
{
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", sv->model_id, "object", "model", "created",
                          (json_int_t)sv->started, "owned_by", "deltafin");
    pthread_mutex_lock(&sv->mu);
    if (m && sv->ready)
        json_object_set_new(m, "context_length", json_integer(sv->context));
    pthread_mutex_unlock(&sv->mu);
    return m;
}

static enum MHD_Result health(srv *sv, struct MHD_Connection *c)
{
    pthread_mutex_lock(&sv->mu);
    int ready = sv->ready, failed = sv->failed;
    pthread_mutex_unlock(&sv->mu);
    return respond_json(sv, c, ready ? 200 : 503,
                        json_pack("{s:s}", "status", ready ? "ok" : failed ? "error" : "loading"));
}

static enum MHD_Result metrics(srv *sv, struct MHD_Connection *c)
{
    buf b = {0};
    pthread_mutex_lock(&sv->mu);
    const srv_metrics *m = &sv->m;
    int ok = 0;
    ok |= buf_putf(&b, "# HELP deltafin_http_responses_total HTTP responses by status.\n"
                        "# TYPE deltafin_http_responses_total counter\n");
    for (int k = 0; k < N_CODES; k++)
        ok |= buf_putf(&b, "deltafin_http_responses_total{code=\"%d\"} %llu\n", CODES[k],
                        (unsigned long long)m->by_code[k]);
    for (int k = 1; k < 6; k++)
        ok |= buf_putf(&b, "deltafin_http_responses_total{class=\"%dxx\"} %llu\n", k, (unsigned long long)m->by_status[k]);
#define COUNTER(name, help, v)                                                                                         \
    ok |= buf_putf(&b, "# HELP deltafin_" name " " help "\n# TYPE deltafin_" name " counter\ndeltafin_" name " %llu\n", \
                    (unsigned long long)(v))
#define GAUGE(name, help, fmt, v)                                                                                      \
    ok |= buf_putf(&b, "# HELP deltafin_" name " " help "\n# TYPE deltafin_" name " gauge\ndeltafin_" name " " fmt "\n", v)
    COUNTER("generation_requests_total", "Generations run to the end or cancelled.", m->gen_requests);
    COUNTER("cancelled_total", "Generations whose client went away.", m->cancelled);
    COUNTER("prompt_tokens_total", "Prompt tokens of generations.", m->prompt_tokens);
    COUNTER("generation_tokens_total", "Tokens generated.", m->gen_tokens);
    COUNTER("prefix_reuse_hits_total", "Generations that reused positions the session held.", m->reuse_hits);
    COUNTER("prefix_reused_tokens_total", "Prompt positions not recomputed.", m->reused_tokens);
    GAUGE("prefill_seconds_total", "Seconds spent on prompts.", "%.6f", m->prefill_s);
    GAUGE("decode_seconds_total", "Seconds spent generating after the first token.", "%.6f", m->decode_s);
    GAUGE("decode_tokens_per_second", "Decode speed of the last generation.", "%.3f", m->last_tps);
    GAUGE("queue_depth", "Generations waiting.", "%d", sv->queued);
    GAUGE("running", "Generations running (0 or 1).", "%d", sv->running);
    GAUGE("loaded", "1 once the model is loaded.", "%d", sv->ready);
    ok |= buf_putf(&b, "# HELP deltafin_draft_tokens_total Drafted tokens, and those the model kept.\n"
                        "# TYPE deltafin_draft_tokens_total counter\n");
    for (int d = 0; d < GEN_MAX_DRAFTERS && m->draft_name[d]; d++)
        ok |= buf_putf(&b,
                        "deltafin_draft_tokens_total{drafter=\"%s\",kind=\"proposed\"} %llu\n"
                        "deltafin_draft_tokens_total{drafter=\"%s\",kind=\"accepted\"} %llu\n"
                        "deltafin_draft_acceptance{drafter=\"%s\"} %.4f\n",
                        m->draft_name[d], (unsigned long long)m->draft_proposed[d], m->draft_name[d],
                        (unsigned long long)m->draft_accepted[d], m->draft_name[d],
                        m->draft_proposed[d] ? (double)m->draft_accepted[d] / (double)m->draft_proposed[d] : 0.0);
    if (m->has_cache) {
        COUNTER("cache_loads_total", "Conversation states loaded from --cache-dir.", m->cache_loads);
        COUNTER("cache_saves_total", "Conversation states saved to --cache-dir.", m->cache_saves);
        GAUGE("cache_states", "States held in --cache-dir.", "%llu", (unsigned long long)m->cache_states);
        GAUGE("cache_bytes", "Their bytes.", "%llu", (unsigned long long)m->cache_bytes);
    }
    if (m->has_store) {
        COUNTER("store_expert_requests_total", "Expert requests of passes on the weight store.", m->store_requests);
        COUNTER("store_expert_hits_total", "Of those, already in RAM.", m->store_hits);
        GAUGE("store_hit_rate", "Expert hits over requests.", "%.4f",
              m->store_requests ? (double)m->store_hits / (double)m->store_requests : 0.0);
    }
#undef COUNTER
#undef GAUGE
    pthread_mutex_unlock(&sv->mu);
    if (ok) {
        buf_free(&b);
        return MHD_NO;
    }
    return respond(sv, c, 200, "text/plain; version=0.0.4", b.p);
}

static int ready_or_503(srv *sv, api_err *e)
{
    pthread_mutex_lock(&sv->mu);
    int ready = sv->ready, failed = sv->failed;
    pthread_mutex_unlock(&sv->mu);
    if (ready)
        return 0;
    return api_err_set(e, 503, "server_error", failed ? "model_failed" : "model_loading", NULL,
                       failed ? "the model failed to load" : "the model is still loading: try again shortly");
}

static enum MHD_Result tokenize(srv *sv, struct MHD_Connection *c, conn *cx, api_kind kind)
{
    api_req rq;
    api_err e;
    errbuf err;
    if (ready_or_503(sv, &e) || api_req_parse(kind, cx->body.p ? cx->body.p : "", cx->body.n, sv->model_id, &rq, &e))
        return respond_err(sv, c, &e);
    json_t *out = NULL;
    if (kind == API_DETOKENIZE) {
        char *s = NULL;
        size_t n = 0;
        for (int i = 0; i < rq.n_ids; i++)
            if (rq.ids[i] >= sv->vocab) {
                api_err_set(&e, 400, "invalid_request_error", NULL, "tokens", "tokens[%d]: %d is not a token id (vocabulary %d)",
                            i, rq.ids[i], sv->vocab);
                api_req_free(&rq);
                return respond_err(sv, c, &e);
            }
        if (tok_decode(sv->tk, rq.ids, (size_t)rq.n_ids, 0, &s, &n, &err) == 0)
            out = json_pack("{s:s%}", "content", s, n);
        free(s);
    } else {
        tok_ids ids = {0};
        int rc;
        if (rq.chat) {
            tok_chat_opts co;
            tok_chat_opts_init(&co);
            co.thinking = rq.thinking;
            co.thinking_effort = rq.effort;
            rc = tok_chat_encode(sv->tk, rq.chat, &co, &ids, &err);
        } else {
            rc = tok_encode(sv->tk, rq.prompt, rq.prompt_len, rq.add_special ? TOK_SPECIAL_ALL : TOK_SPECIAL_NONE, &ids, &err);
        }
        if (rc != 0) {
            api_err_set(&e, 400, "invalid_request_error", NULL, rq.chat ? "messages" : "content", "%s", err.msg);
            tok_ids_free(&ids);
            api_req_free(&rq);
            return respond_err(sv, c, &e);
        }
        json_t *a = json_array();
        for (size_t i = 0; i < ids.n; i++)
            json_array_append_new(a, json_integer(ids.v[i]));
        out = json_pack("{s:o}", "tokens", a);
        if (out && rq.with_pieces) {
            json_t *pc = json_array();
            for (size_t i = 0; i < ids.n; i++) {
                char *s = NULL;
                size_t n = 0;
                if (tok_decode(sv->tk, &ids.v[i], 1, 0, &s, &n, &err) == 0)
                    json_array_append_new(pc, json_pack("{s:i, s:s%}", "id", ids.v[i], "piece", s, n));
                free(s);
            }
            json_object_set_new(out, "pieces", pc);
        }
        tok_ids_free(&ids);
    }
    api_req_free(&rq);
    return respond_json(sv, c, 200, out);
}

/* ---- generations ---- */

/* waits for the job's next signal, or 50 ms, whichever is first: the waiter then checks the client;
 * mu held */
static void wait_50ms(job *j, srv *sv)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &sv->mu, &ts);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    job *j = cls;
    srv *sv = j->sv;
    (void)pos;
    ssize_t n = 0;
    double idle = timer_now();
    pthread_mutex_lock(&sv->mu);
    for (;;) {
        if (j->out.n > j->out_off) {
            size_t k = j->out.n - j->out_off < max ? j->out.n - j->out_off : max;
            memcpy(buf, j->out.p + j->out_off, k);
            j->out_off += k;
            if (j->out_off == j->out.n)
                j->out_off = j->out.n = 0;
            n = (ssize_t)k;
            break;
        }
        if (j->state == JOB_DONE) {
            n = j->cancel ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        if (j->cancel || srv_hung_up(j->fd)) {
            j->cancel = 1;
            n = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (timer_now() - idle > 10.0 && max >= 16) { /* waiting in the queue: an SSE comment keeps the line */
            memcpy(buf, ": waiting\n\n", 11);    /* alive (and finds a client gone) */
            n = 11;
            break;
        }
        wait_50ms(j, sv);
    }
    pthread_mutex_unlock(&sv->mu);
    return n;
}

static void stream_free(void *cls)
{
    job *j = cls;
    job_release(j->sv, j);
}

static enum MHD_Result generate(srv *sv, struct MHD_Connection *c, conn *cx, api_kind kind)
{
    api_err e;
    errbuf err;
    if (ready_or_503(sv, &e))
        return respond_err(sv, c, &e);
    job *j = calloc(1, sizeof *j);
    if (!j)
        return MHD_NO;
    j->sv = sv;
    j->fd = cx->fd;
    j->refs = 1; /* the connection's */
    pthread_cond_init(&j->cv, NULL);
    if (api_req_parse(kind, cx->body.p ? cx->body.p : "", cx->body.n, sv->model_id, &j->rq, &e)) {
        job_release(sv, j);
        return respond_err(sv, c, &e);
    }
    const api_req *rq = &j->rq;
    int rc;
    const char *param = kind == API_CHAT ? "messages" : kind == API_LOGITS ? "tokens" : "prompt";
    if (kind == API_CHAT) {
        tok_chat_opts co;
        tok_chat_opts_init(&co);
        co.thinking = rq->thinking;
        co.thinking_effort = rq->effort;
        rc = tok_chat_encode(sv->tk, rq->chat, &co, &j->prompt, &err);
    } else if (kind == API_COMPLETION && rq->prompt) {
        rc = tok_encode(sv->tk, rq->prompt, rq->prompt_len, TOK_SPECIAL_NONE, &j->prompt, &err);
    } else {
        rc = 0;
        for (int i = 0; i < rq->n_ids && !rc; i++)
            if (rq->ids[i] >= sv->vocab)
                rc = errbuf_set(&err, "prompt[%d]: %d is not a token id (vocabulary %d)", i, rq->ids[i], sv->vocab);
            else
                rc = tok_ids_push(&j->prompt, rq->ids[i]) ? errbuf_set(&err, "out of memory") : 0;
    }
    if (rc == 0 && j->prompt.n == 0)
        rc = errbuf_set(&err, "the %s encodes to no tokens", param);
    if (rc) {
        api_err_set(&e, 400, "invalid_request_error", NULL, param, "%s", err.msg);
    } else if ((long)j->prompt.n + 1 > sv->context) {
        rc = api_err_set(&e, 400, "invalid_request_error", "context_length_exceeded", param,
                         "the prompt is %zu tokens; this server's context is %d (--context)", j->prompt.n, sv->context);
    }
    if (rc) {
        job_release(sv, j);
        return respond_err(sv, c, &e);
    }
    pthread_mutex_lock(&sv->mu);
    uint64_t serial = ++sv->serial;
    j->created = (long)time(NULL);
    j->auto_seed = (uint64_t)j->created * 0x9e3779b97f4a7c15ull ^ serial * 0xbf58476d1ce4e5b9ull;
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)sv->started, (unsigned long long)serial);
    int q = srv_enqueue(sv, j);
    if (q != 0) {
        pthread_mutex_unlock(&sv->mu);
        job_release(sv, j);
        if (q == -2)
            api_err_set(&e, 503, "server_error", "stopping", NULL, "the server is stopping");
        else
            api_err_set(&e, 429, "rate_limit_error", "queue_full", NULL,
                        "the queue is full (%d waiting): try again later", sv->o.queue);
        return respond_err(sv, c, &e);
    }
    cx->j = j;
    sv->answering++;
    if (rq->stream && kind != API_LOGITS) {
        j->refs++; /* the response's, released by stream_free */
        pthread_mutex_unlock(&sv->mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
        if (!r) {
            job_release(sv, j);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result q = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        pthread_mutex_lock(&sv->mu);
        srv_metrics_count(sv, 200);
        pthread_mutex_unlock(&sv->mu);
        return q;
    }
    /* a whole response: wait for it here, watching the client */
    while (j->state != JOB_DONE) {
        if (!j->cancel && srv_hung_up(j->fd))
            j->cancel = 1;
        wait_50ms(j, sv);
    }
    int status = j->status;
    char *body = j->body;
    j->body = NULL;
    int cancelled = j->cancel;
    pthread_mutex_unlock(&sv->mu);
    if (cancelled) {
        free(body);
        return MHD_NO; /* nobody to answer */
    }
    return respond(sv, c, status ? status : 500, "application/json", body);
}

/* ---- the connection ---- */

static int authorized(srv *sv, struct MHD_Connection *c)
{
    if (!sv->o.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    size_t kl = strlen(sv->o.api_key);
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    if (strlen(h) != kl)
        return 0;
    unsigned diff = 0; /* the same time whatever the key's first wrong byte */
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)h[i] ^ (unsigned char)sv->o.api_key[i];
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv *sv = cls;
    conn *cx = *con_cls;
    (void)version;
    if (!cx) { /* the headers: everything that can be refused before the body is */
        if (!(cx = calloc(1, sizeof *cx)))
            return MHD_NO;
        *con_cls = cx;
        cx->t0 = timer_now();
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cx->fd = ci ? ci->connect_fd : -1;
        int known = 0;
        for (size_t k = 0; k < sizeof ROUTES / sizeof ROUTES[0] && !cx->r; k++)
            if (!strcmp(url, ROUTES[k].path) && (ROUTES[k].r != R_LOGITS || sv->o.debug)) {
                known = 1;
                if (!strcmp(method, ROUTES[k].method) || (!strcmp(method, "HEAD") && !strcmp(ROUTES[k].method, "GET")))
                    cx->r = ROUTES[k].r;
            }
        if (!strncmp(url, "/v1/models/", 11) && url[11]) {
            known = 1;
            if (!strcmp(method, "GET"))
                cx->r = R_MODEL;
        }
        if (!known)
            return fail(sv, c, 404, "invalid_request_error", "not_found", "no route %s", url);
        if (!cx->r)
            return fail(sv, c, 405, "invalid_request_error", "method_not_allowed", "method %s is not allowed here", method);
        if (cx->r != R_HEALTH && cx->r != R_PAGE && !authorized(sv, c))
            return fail(sv, c, 401, "invalid_request_error", "invalid_api_key", "%s",
                        "a valid API key is required: Authorization: Bearer KEY");
        /* a body over the limit is read and dropped, so that a client still writing it (fetch, the
         * SDKs) gets the 413 rather than a broken pipe; one far over it is refused at once */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
        if (len > (unsigned long long)sv->o.max_request_bytes + SRV_DRAIN_BYTES)
            return fail(sv, c, 413, "invalid_request_error", "request_too_large", "the body is over %s bytes (--max-request-bytes)",
                        sv->limit_text);
        cx->too_big = len > (unsigned long long)sv->o.max_request_bytes;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cx->too_big && cx->body.n + *upload_size > (size_t)sv->o.max_request_bytes)
            cx->too_big = 1;
        cx->dropped += *upload_size * (cx->too_big != 0);
        if (cx->dropped > SRV_DRAIN_BYTES) /* a chunked body that goes on and on: no more reading */
            return fail(sv, c, 413, "invalid_request_error", "request_too_large",
                        "the body is over %s bytes (--max-request-bytes)", sv->limit_text);
        if (!cx->too_big && buf_put(&cx->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->too_big)
        return fail(sv, c, 413, "invalid_request_error", "request_too_large", "the body is over %s bytes (--max-request-bytes)",
                    sv->limit_text);
    switch (cx->r) {
    case R_PAGE: {
        char *p = malloc(srv_page_len + 1);
        if (!p)
            return MHD_NO;
        memcpy(p, srv_page_html, srv_page_len + 1);
        return respond(sv, c, 200, "text/html; charset=utf-8", p);
    }
    case R_HEALTH:
        return health(sv, c);
    case R_METRICS:
        return metrics(sv, c);
    case R_MODELS:
        return respond_json(sv, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_obj(sv)));
    case R_MODEL:
        if (strcmp(url + 11, sv->model_id) != 0)
            return fail(sv, c, 404, "invalid_request_error", "model_not_found", "The model '%s' does not exist", url + 11);
        return respond_json(sv, c, 200, model_obj(sv));
    case R_CHAT:
        return generate(sv, c, cx, API_CHAT);
    case R_COMPLETIONS:
        return generate(sv, c, cx, API_COMPLETION);
    case R_TOKENIZE:
        return tokenize(sv, c, cx, API_TOKENIZE);
    case R_DETOKENIZE:
        return tokenize(sv, c, cx, API_DETOKENIZE);
    case R_LOGITS:
        return generate(sv, c, cx, API_LOGITS);
    case R_NONE:
        break;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    srv *sv = cls;
    conn *cx = *con_cls;
    (void)c;
    (void)why;
    if (!cx)
        return;
    if (cx->j) {
        pthread_mutex_lock(&sv->mu);
        cx->j->fd = -1; /* the socket is about to close: never poll it again */
        if (cx->j->state != JOB_DONE)
            cx->j->cancel = 1;
        sv->answering--;
        pthread_mutex_unlock(&sv->mu);
        job_release(sv, cx->j);
    }
    buf_free(&cx->body);
    free(cx);
    *con_cls = NULL;
}

/* ---- the server ---- */

const char SERVER_OPTS_HELP[] =
    "serve: [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-tokens N] [--max-request-bytes N]\n"
    "       [--queue N] [--context N] [--timeout S] [--cache-dir DIR [--cache-bytes 4G]] [--debug]\n"
    "  --api-key (or DELTAFIN_API_KEY) makes every route but /health and the chat page need\n"
    "  Authorization: Bearer KEY. --max-tokens caps any response (default 1000000); --queue bounds the\n"
    "  generations waiting behind the running one (default 16; more is 429); --context the positions the\n"
    "  session holds (default 32768, at most the model's); --timeout closes idle connections (30 s).\n"
    "  --cache-dir keeps the states behind the last conversations on disk (within --cache-bytes), so a\n"
    "  restarted server resumes them without recomputing.\n"
    "  --debug adds POST /debug/logits {\"tokens\":[...]}: the last position's logits after the session\n"
    "  is brought to the tokens (prefix reuse included), base64 float32, for exactness tests.\n";

void server_opts_default(server_opts *o)
{
    memset(o, 0, sizeof *o);
    engine_opts_default(&o->eng);
    draft_opts_default(&o->draft);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_tokens = 1000000;
    o->max_request_bytes = 8L << 20;
    o->queue = 16;
    o->timeout_s = 30;
    o->cache_bytes = 4ull << 30;
    o->api_key = getenv("DELTAFIN_API_KEY");
    if (o->api_key && !o->api_key[0])
        o->api_key = NULL;
}

int server_opts_parse(server_opts *o, int argc, char **argv, int *i, errbuf *err)
{
    int r;
    if (!strcmp(argv[*i], "--debug")) {
        o->debug = 1;
        return 1;
    }
    if ((r = engine_opts_parse(&o->eng, argc, argv, i, err)) != 0 || (r = draft_opts_parse(&o->draft, argc, argv, i, err)) != 0)
        return r;
    static const char *const names[] = {"--host",  "--port",    "--api-key", "--max-tokens", "--max-request-bytes",
                                        "--queue", "--context", "--timeout", "--cache-dir", "--cache-bytes"};
    const char *v = NULL;
    int which = args_which(argc, argv, i, names, (int)(sizeof names / sizeof names[0]), &v, err);
    if (which < 0)
        return which == -1 ? 0 : -1;
    long n = 0;
    switch (which) {
    case 0:
        o->host = v;
        return 1;
    case 2:
        o->api_key = v[0] ? v : NULL;
        return 1;
    case 8:
        o->cache_dir = v;
        return 1;
    case 9:
        if (store_parse_bytes(v, &o->cache_bytes) != 0 || o->cache_bytes == 0)
            return errbuf_set(err, "--cache-bytes expects bytes like 4G or 512M, got '%s'", v);
        return 1;
    }
    static const long lo[] = {0, 0, 0, 1, 64, 0, 2, 1}, hi[] = {0, 65535, 0, 1L << 40, 1L << 34, 1 << 20, 1 << 30, 86400};
    if (args_long(names[which], v, lo[which], hi[which], &n, err) != 0)
        return -1;
    switch (which) {
    case 1: o->port = (int)n; break;
    case 3: o->max_tokens = n; break;
    case 4: o->max_request_bytes = n; break;
    case 5: o->queue = (int)n; break;
    case 6: o->context = (int)n; break;
    default: o->timeout_s = (int)n;
    }
    return 1;
}

/* the model's name: its folder's */
static void model_id_of(const server_opts *o, char *out, size_t cap)
{
    char dflt[4096];
    errbuf err;
    const char *dir = o->eng.model;
    if (!dir)
        dir = engine_default_model(dflt, sizeof dflt, &err) == 0 ? dflt : "default";
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t a = n;
    while (a > 0 && dir[a - 1] != '/')
        a--;
    snprintf(out, cap, "%.*s", (int)(n - a), dir + a);
}

int server_run(const server_opts *o, FILE *log, errbuf *err)
{
    srv *sv = calloc(1, sizeof *sv);
    if (!sv)
        return errbuf_set(err, "out of memory");
    sv->o = *o;
    sv->started = (long)time(NULL);
    snprintf(sv->limit_text, sizeof sv->limit_text, "%ld", o->max_request_bytes);
    model_id_of(o, sv->model_id, sizeof sv->model_id);
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->work, NULL);
    pthread_cond_init(&sv->loaded, NULL);
    int rc = -1, have_thread = 0;
    struct MHD_Daemon *d = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    /* SIGINT and SIGTERM wait for this thread (sigtimedwait below): blocked before any thread starts */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    signal(SIGPIPE, SIG_IGN);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0) {
        errbuf_set(err, "--host %s: %s", o->host, gai_strerror(gai));
        goto out;
    }
    if (pthread_create(&sv->gen_thread, NULL, srv_gen_main, sv) != 0) {
        errbuf_set(err, "could not start the generation thread");
        goto out;
    }
    have_thread = 1;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, sv, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(64 + o->queue),
                         MHD_OPTION_END);
    if (!d) {
        errbuf_set(err, "could not listen on %s:%d (in use, or not an address of this machine)", o->host, o->port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(log, "listening on http://%s%s%s:%u\n", ai->ai_family == AF_INET6 ? "[" : "", o->host,
            ai->ai_family == AF_INET6 ? "]" : "", di ? di->port : (unsigned)o->port);
    fflush(log);
    pthread_mutex_lock(&sv->mu);
    while (!sv->ready && !sv->failed)
        pthread_cond_wait(&sv->loaded, &sv->mu);
    int failed = sv->failed, has_cache = sv->m.has_cache;
    uint64_t states = sv->m.cache_states, bytes = sv->m.cache_bytes;
    if (failed)
        *err = sv->load_err;
    pthread_mutex_unlock(&sv->mu);
    if (failed)
        goto out;
    char what[256];
    engine_describe(sv->e, what, sizeof what);
    fprintf(log, "ready: %s as '%s', context %d, %d drafter%s", what, sv->model_id, sv->context, sv->nd,
            sv->nd == 1 ? "" : "s");
    if (has_cache)
        fprintf(log, ", %llu conversation state%s in %s (%.1f MB)", (unsigned long long)states, states == 1 ? "" : "s",
                o->cache_dir, (double)bytes / 1e6);
    fprintf(log, "\n");
    fflush(log);
    for (;;) {
        int sig = sigwaitinfo(&sigs, NULL);
        if (sig == SIGINT || sig == SIGTERM)
            break;
    }
    fprintf(log, "stopping\n");
    fflush(log);
    rc = 0;
out:
    pthread_mutex_lock(&sv->mu);
    sv->stopping = 1;
    pthread_cond_broadcast(&sv->work);
    pthread_mutex_unlock(&sv->mu);
    if (have_thread)
        pthread_join(sv->gen_thread, NULL);
    /* every job is DONE now; give the connections a moment to hand their last bytes over (a stream's
     * error event and [DONE]) before libmicrohttpd closes them */
    for (int k = 0; d && k < 150; k++) {
        pthread_mutex_lock(&sv->mu);
        int busy = sv->answering;
        pthread_mutex_unlock(&sv->mu);
        if (!busy)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (d)
        MHD_stop_daemon(d);
    if (ai)
        freeaddrinfo(ai);
    srv_cache_free(&sv->cache);
    draft_close(sv->drafters, sv->nd);
    session_free(sv->s);
    engine_free(sv->e);
    /* a second SIGINT / SIGTERM that came while stopping is not the default action's to take: the
     * server stops as the first asked */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_cond_destroy(&sv->loaded);
    pthread_cond_destroy(&sv->work);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
    return rc;
}
