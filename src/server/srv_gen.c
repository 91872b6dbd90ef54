/* srv_gen.c — the generation thread (srv_int.h): it loads the model, then runs queued jobs one at
 * a time on its one session, so a request sharing a prefix with what the session holds continues
 * from it (session_sync: the logits are a cold run's bits). Each job's tokens go through the chat
 * format's reply parser (or the plain detokenizer), the stop strings, and out as OpenAI objects:
 * SSE chunks, one per decode step, or one response at the end.
 *
 * Stop strings: content text is handed out only up to the longest suffix that could still begin a
 * stop string, so a stop string split over steps is never partly sent; a match ends generation
 * and is not part of the text.
 */
#include <math.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timer.h"
#include "engine/sampler.h"
#include "server/srv_int.h"
#include "store/store.h"

void job_release(srv *sv, job *j)
{
    pthread_mutex_lock(&sv->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&sv->mu);
    if (!last)
        return;
    api_req_free(&j->rq);
    tok_ids_free(&j->prompt);
    buf_free(&j->out);
    free(j->body);
    pthread_cond_destroy(&j->cv);
    free(j);
}

int srv_enqueue(srv *sv, job *j)
{
    if (sv->stopping)
        return -2;
    /* --queue places wait behind the running generation; with none running, the job about to
     * start is not one of them */
    if (sv->queued >= sv->o.queue + (sv->running ? 0 : 1))
        return -1;
    j->state = JOB_QUEUED;
    j->refs++;
    j->next = NULL;
    if (sv->queue_tail)
        sv->queue_tail->next = j;
    else
        sv->queue = j;
    sv->queue_tail = j;
    sv->queued++;
    pthread_cond_signal(&sv->work);
    return 0;
}

/* ---- one job ---- */

typedef struct genctx {
    srv *sv;
    job *j;
    const api_req *rq;
    int chat;
    tok_reply *reply;       /* chat */
    tok_stream ts;          /* completions */
    int have_ts;
    buf content, reasoning;
    size_t safe;            /* content[0..safe) can no longer become part of a stop string */
    size_t c_sent, r_sent;  /* stream: bytes of content / reasoning sent */
    json_t *calls;          /* tool calls, OpenAI form */
    size_t calls_sent;
    json_t *lp;             /* chat: logprobs.content entries not yet sent (non-stream: all) */
    json_t *lp_tokens, *lp_vals, *lp_top, *lp_off; /* completions: the four parallel arrays */
    size_t text_off;
    const float *logits;    /* of the token being emitted (gen_logits_fn comes just before it) */
    int n_gen, n_reasoning, in_reasoning;
    int ended, stop_hit, role_sent;
    buf echo;              /* completions with echo: the prompt's text */
    int echo_sent;
    int fail;               /* out of memory building output */
} genctx;

int srv_hung_up(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* the client went away (or the server stops): checked after every step */
static int job_gone(genctx *g)
{
    srv *sv = g->sv;
    pthread_mutex_lock(&sv->mu);
    if (!g->j->cancel && srv_hung_up(g->j->fd))
        g->j->cancel = 1;
    int gone = g->j->cancel || sv->stopping;
    pthread_mutex_unlock(&sv->mu);
    return gone;
}

/* the longest suffix of s that is a proper prefix of some stop string */
static size_t stop_hold(const api_req *rq, const char *s, size_t n)
{
    size_t best = 0;
    for (int k = 0; k < rq->n_stop; k++)
        for (size_t l = rq->stop_len[k] - 1; l > best; l--)
            if (l <= n && !memcmp(s + n - l, rq->stop[k], l)) {
                best = l;
                break;
            }
    return best;
}

/* new content text: look for a stop string from the first byte not yet safe */
static void content_add(genctx *g, const char *t, size_t n)
{
    if (g->stop_hit || buf_put(&g->content, t, n)) {
        g->fail |= !g->stop_hit;
        return;
    }
    const api_req *rq = g->rq;
    size_t at = g->content.n;
    for (int k = 0; k < rq->n_stop; k++) {
        const char *m = memmem(g->content.p + g->safe, g->content.n - g->safe, rq->stop[k], rq->stop_len[k]);
        if (m && (size_t)(m - g->content.p) < at)
            at = (size_t)(m - g->content.p);
    }
    if (at < g->content.n) {
        g->content.n = at;
        g->content.p[at] = 0;
        g->safe = at;
        g->stop_hit = 1;
        return;
    }
    g->safe = g->content.n - stop_hold(rq, g->content.p, g->content.n);
}

static json_t *jstr(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    return v ? v : json_string("\xef\xbf\xbd"); /* text is whole UTF-8 by construction; never fail */
}

static int on_event(void *ud, const tok_reply_event *ev)
{
    genctx *g = ud;
    switch (ev->kind) {
    case TOK_REPLY_TEXT:
        g->in_reasoning = 0;
        content_add(g, ev->text, ev->len);
        break;
    case TOK_REPLY_REASONING:
        g->in_reasoning = 1;
        g->fail |= buf_put(&g->reasoning, ev->text, ev->len);
        break;
    case TOK_REPLY_TOOL_CALL: {
        g->in_reasoning = 0;
        char id[80];
        if (ev->id && ev->id[0])
            snprintf(id, sizeof id, "%s", ev->id);
        else
            snprintf(id, sizeof id, "call_%s_%d", strchr(g->j->id, '-') + 1, (int)json_array_size(g->calls));
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name", ev->name,
                              "arguments", jstr(ev->text, ev->len));
        g->fail |= !c || json_array_append_new(g->calls, c);
        if (!g->rq->parallel_tool_calls)
            g->ended = 1; /* one call asked for: that is the end */
        break;
    }
    case TOK_REPLY_END:
        g->ended = 1;
        break;
    }
    return 0;
}

/* the text of one token for logprobs (invalid UTF-8 as U+FFFD) */
static json_t *tok_text(genctx *g, int32_t id)
{
    char *s = NULL;
    size_t n = 0;
    errbuf err;
    if (tok_decode(g->sv->tk, &id, 1, 0, &s, &n, &err) != 0)
        return json_string("");
    json_t *v = jstr(s, n);
    free(s);
    return v;
}

static json_t *tok_bytes(genctx *g, int32_t id)
{
    size_t l = 0;
    const uint8_t *p = tok_token_bytes(g->sv->tk, id, &l);
    json_t *a = json_array();
    for (size_t i = 0; p && i < l; i++)
        json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* the logprobs of token id from the logits that decided it, with the top alternatives */
static void add_logprobs(genctx *g, int32_t id, size_t text_len)
{
    const float *lg = g->logits;
    int V = g->sv->vocab, N = g->rq->top_logprobs;
    if (!lg)
        return;
    float mx = lg[0];
    for (int i = 1; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    int top[API_MAX_TOP_LOGPROBS];
    int nt = 0;
    for (int i = 0; i < V && N > 0; i++) { /* the N largest, highest first, lowest id on ties */
        if (nt == N && lg[i] <= lg[top[nt - 1]])
            continue;
        int at = nt < N ? nt++ : nt - 1;
        while (at > 0 && lg[top[at - 1]] < lg[i]) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = i;
    }
    if (g->chat) {
        json_t *alts = json_array();
        for (int k = 0; k < nt; k++)
            json_array_append_new(alts, json_pack("{s:o, s:f, s:o}", "token", tok_text(g, top[k]), "logprob",
                                                  lg[top[k]] - lse, "bytes", tok_bytes(g, top[k])));
        json_t *e = json_pack("{s:o, s:f, s:o, s:o}", "token", tok_text(g, id), "logprob", lg[id] - lse, "bytes",
                              tok_bytes(g, id), "top_logprobs", alts);
        g->fail |= !e || json_array_append_new(g->lp, e);
        return;
    }
    json_t *alts = json_object();
    for (int k = 0; k < nt; k++) {
        json_t *t = tok_text(g, top[k]);
        json_object_set_new(alts, json_string_value(t), json_real(lg[top[k]] - lse));
        json_decref(t);
    }
    json_array_append_new(g->lp_tokens, tok_text(g, id));
    json_array_append_new(g->lp_vals, json_real(lg[id] - lse));
    json_array_append_new(g->lp_top, alts);
    json_array_append_new(g->lp_off, json_integer((json_int_t)g->text_off));
    g->text_off += text_len;
}

static void on_logits(void *ud, int64_t pos, const float *logits)
{
    (void)pos;
    ((genctx *)ud)->logits = logits;
}

static int on_token(void *ud, int32_t id)
{
    genctx *g = ud;
    errbuf err;
    g->n_gen++;
    size_t before = g->content.n;
    if (g->chat) {
        int was = g->in_reasoning;
        if (tok_reply_feed(g->reply, &id, 1, on_event, g, &err) < 0)
            g->fail = 1;
        g->n_reasoning += was || g->in_reasoning;
    } else {
        size_t n;
        const char *t = tok_stream_feed(&g->ts, id, &n);
        content_add(g, t, n);
        for (int k = 0; k < g->sv->n_eos && !g->rq->ignore_eos; k++)
            g->ended |= id == g->sv->eos[k];
        g->ended |= !g->rq->ignore_eos && tok_is_stop(g->sv->tk, id);
    }
    if (g->rq->logprobs)
        add_logprobs(g, id, g->content.n - before);
    return g->stop_hit || g->ended || g->fail;
}

/* a chunk's common fields around choices (NULL: the usage chunk's empty list) */
static json_t *chunk_new(genctx *g, json_t *choice)
{
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", g->j->id, "object",
                          g->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)g->j->created,
                          "model", g->sv->model_id, "system_fingerprint", "deltafin", "choices", json_array());
    if (c && choice)
        json_array_append_new(json_object_get(c, "choices"), choice);
    if (c && g->rq->include_usage)
        json_object_set_new(c, "usage", json_null());
    return c;
}

/* appends "data: JSON\n\n" of c (taking it) to the job's output; mu held */
static void sse_put(genctx *g, json_t *c)
{
    char *s = c ? json_dumps(c, JSON_COMPACT) : NULL;
    json_decref(c);
    if (!s || buf_put(&g->j->out, "data: ", 6) || buf_put(&g->j->out, s, strlen(s)) ||
        buf_put(&g->j->out, "\n\n", 2))
        g->fail = 1;
    free(s);
}

/* the logprobs gathered since the last chunk, handed over (fresh arrays take their place) */
static json_t *take_logprobs(genctx *g)
{
    if (!g->rq->logprobs)
        return json_null();
    json_t *v;
    if (g->chat) {
        v = json_pack("{s:o}", "content", g->lp);
        g->lp = json_array();
    } else {
        v = json_pack("{s:o, s:o, s:o, s:o}", "tokens", g->lp_tokens, "token_logprobs", g->lp_vals, "top_logprobs",
                      g->lp_top, "text_offset", g->lp_off);
        g->lp_tokens = json_array();
        g->lp_vals = json_array();
        g->lp_top = json_array();
        g->lp_off = json_array();
    }
    g->fail |= !v;
    return v ? v : json_null();
}

static json_t *chat_choice(json_t *delta, json_t *logprobs, const char *finish)
{
    return json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs", logprobs ? logprobs : json_null(),
                     "finish_reason", finish ? json_string(finish) : json_null());
}

/* stream: what the step added, as chunks (finish: the last one too); mu held */
static void stream_flush(genctx *g, const char *finish)
{
    int lp_pending = g->rq->logprobs && (g->chat ? json_array_size(g->lp) : json_array_size(g->lp_tokens)) > 0;
    if (!g->chat) {
        if (g->safe > g->c_sent || finish || lp_pending || (g->echo.n && !g->echo_sent)) {
            buf t = {0}; /* echo: the prompt's text leads the first chunk */
            if (!g->echo_sent && g->echo.n)
                g->fail |= buf_put(&t, g->echo.p, g->echo.n);
            g->echo_sent = 1;
            g->fail |= buf_put(&t, g->content.p ? g->content.p + g->c_sent : "", g->safe - g->c_sent);
            json_t *ch = json_pack("{s:o, s:i, s:o, s:o}", "text", jstr(t.p ? t.p : "", t.n), "index", 0, "logprobs",
                                   take_logprobs(g), "finish_reason", finish ? json_string(finish) : json_null());
            buf_free(&t);
            sse_put(g, chunk_new(g, ch));
            g->c_sent = g->safe;
        }
        return;
    }
    json_t *pending = json_array(); /* the deltas of this step, in order */
    if (!pending) {
        g->fail = 1;
        return;
    }
    if (!g->role_sent) {
        json_array_append_new(pending, json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
        g->role_sent = 1;
    }
    if (g->reasoning.n > g->r_sent) {
        json_array_append_new(pending, json_pack("{s:o}", "reasoning_content",
                                                 jstr(g->reasoning.p + g->r_sent, g->reasoning.n - g->r_sent)));
        g->r_sent = g->reasoning.n;
    }
    if (g->safe > g->c_sent) {
        json_array_append_new(pending, json_pack("{s:o}", "content", jstr(g->content.p + g->c_sent, g->safe - g->c_sent)));
        g->c_sent = g->safe;
    }
    for (; g->calls_sent < json_array_size(g->calls); g->calls_sent++) {
        /* the call's name first, then its arguments: the form the SDKs accumulate */
        json_t *c = json_array_get(g->calls, g->calls_sent), *fn = json_object_get(c, "function");
        json_array_append_new(pending, json_pack("{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls", "index",
                                                 (json_int_t)g->calls_sent, "id", json_object_get(c, "id"), "type",
                                                 "function", "function", "name", json_object_get(fn, "name"),
                                                 "arguments", ""));
        json_array_append_new(pending, json_pack("{s:[{s:I, s:{s:O}}]}", "tool_calls", "index",
                                                 (json_int_t)g->calls_sent, "function", "arguments",
                                                 json_object_get(fn, "arguments")));
    }
    size_t np = json_array_size(pending);
    if (np == 0 && lp_pending && !finish) { /* logprobs ride with the next text */
        json_decref(pending);
        return;
    }
    for (size_t k = 0; k < np; k++)
        sse_put(g, chunk_new(g, chat_choice(json_incref(json_array_get(pending, k)),
                                            k == np - 1 && !finish ? take_logprobs(g) : NULL, NULL)));
    json_decref(pending);
    if (finish)
        sse_put(g, chunk_new(g, chat_choice(json_object(), take_logprobs(g), finish)));
}

static int on_step(void *ud)
{
    genctx *g = ud;
    if (g->rq->stream) {
        pthread_mutex_lock(&g->sv->mu);
        stream_flush(g, NULL);
        pthread_cond_broadcast(&g->j->cv);
        pthread_mutex_unlock(&g->sv->mu);
    }
    return job_gone(g);
}

static json_t *usage_of(genctx *g, const gen_stats *st)
{
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", st->n_prompt, "completion_tokens", st->n_gen,
                          "total_tokens", st->n_prompt + st->n_gen, "prompt_tokens_details", "cached_tokens",
                          st->n_reused);
    if (u && g->chat)
        json_object_set_new(u, "completion_tokens_details", json_pack("{s:i}", "reasoning_tokens", g->n_reasoning));
    return u;
}

/* the whole response of a non-streaming request */
static char *final_body(genctx *g, const gen_stats *st, const char *finish)
{
    json_t *r;
    if (g->chat) {
        size_t ncalls = json_array_size(g->calls);
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                g->content.n || !ncalls ? jstr(g->content.p ? g->content.p : "", g->content.n) : json_null());
        if (msg && g->reasoning.n)
            json_object_set_new(msg, "reasoning_content", jstr(g->reasoning.p, g->reasoning.n));
        if (msg && ncalls)
            json_object_set(msg, "tool_calls", g->calls);
        r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:i, s:o, s:o, s:s}], s:o}", "id", g->j->id, "object",
                      "chat.completion", "created", (json_int_t)g->j->created, "model", g->sv->model_id,
                      "system_fingerprint", "deltafin", "choices", "index", 0, "message", msg, "logprobs",
                      take_logprobs(g), "finish_reason", finish, "usage", usage_of(g, st));
    } else {
        buf text = {0};
        buf_put(&text, g->echo.p ? g->echo.p : "", g->echo.n);
        buf_put(&text, g->content.p ? g->content.p : "", g->content.n);
        r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:o, s:i, s:o, s:s}], s:o}", "id", g->j->id, "object",
                      "text_completion", "created", (json_int_t)g->j->created, "model", g->sv->model_id,
                      "system_fingerprint", "deltafin", "choices", "text", jstr(text.p ? text.p : "", text.n), "index",
                      0, "logprobs", take_logprobs(g), "finish_reason", finish, "usage", usage_of(g, st));
        buf_free(&text);
    }
    char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
    json_decref(r);
    return s;
}

static void metrics_add(srv *sv, const gen_stats *st, int cancelled)
{
    srv_metrics *m = &sv->m;
    m->gen_requests++;
    m->cancelled += cancelled != 0;
    m->prompt_tokens += (uint64_t)st->n_prompt;
    m->gen_tokens += (uint64_t)st->n_gen;
    m->reused_tokens += (uint64_t)st->n_reused;
    m->reuse_hits += st->n_reused > 0;
    m->prefill_s += st->t_prefill;
    m->decode_s += st->t_decode;
    if (st->n_gen > 1 && st->t_decode > 0)
        m->last_tps = (st->n_gen - 1) / st->t_decode;
    for (int d = 0; d < st->n_drafters && d < GEN_MAX_DRAFTERS; d++) {
        m->draft_name[d] = st->draft[d].name;
        m->draft_steps[d] += st->draft[d].steps;
        m->draft_proposed[d] += st->draft[d].proposed;
        m->draft_accepted[d] += st->draft[d].accepted;
    }
    struct store *so = engine_store(sv->e);
    if (so) {
        store_stats ss;
        store_stats_get(so, &ss);
        m->has_store = 1;
        m->store_requests = ss.requests;
        m->store_hits = ss.hits;
    }
}

/* --cache-dir: a saved conversation that continues further into the prompt than the session */
static void cache_resume(srv *sv, const tok_ids *prompt)
{
    errbuf err;
    if (sv->have_cache && srv_cache_resume(&sv->cache, sv->s, prompt->v, (int)prompt->n, &err) < 0)
        fprintf(stderr, "deltafin serve: cache: %s (removed)\n", err.msg);
}

/* runs a generation; 1 when it ended well (its state is worth keeping) */
static int run_job(srv *sv, job *j)
{
    const api_req *rq = &j->rq;
    genctx g = {.sv = sv, .j = j, .rq = rq, .chat = rq->kind == API_CHAT};
    errbuf err;
    gen_stats st;
    memset(&st, 0, sizeof st);
    sampler sm;
    memset(&sm, 0, sizeof sm);
    int rc = -1, stop_status = 500;
    g.calls = json_array();
    g.lp = json_array();
    g.lp_tokens = json_array();
    g.lp_vals = json_array();
    g.lp_top = json_array();
    g.lp_off = json_array();
    if (g.chat ? tok_reply_new(sv->tk, rq->thinking, &g.reply, &err) : tok_stream_init(&g.ts, sv->tk, 1, &err))
        goto out;
    g.have_ts = !g.chat;
    if (!g.chat && rq->echo) {
        char *p = NULL;
        size_t n = 0;
        if (rq->prompt)
            g.fail |= buf_put(&g.echo, rq->prompt, rq->prompt_len);
        else if (tok_decode(sv->tk, rq->ids, (size_t)rq->n_ids, 0, &p, &n, &err) == 0)
            g.fail |= buf_put(&g.echo, p, n);
        free(p);
    }
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = (float)rq->temperature;
    sc.top_p = (float)rq->top_p;
    sc.top_k = (int)rq->top_k;
    sc.min_p = (float)rq->min_p;
    sc.seed = rq->has_seed ? rq->seed : j->auto_seed;
    if (sampler_init(&sm, &sc, sv->vocab, &err) != 0)
        goto out;
    long room = sv->context - (long)j->prompt.n;
    long max_new = rq->max_tokens >= 0 ? rq->max_tokens : sv->o.max_tokens;
    max_new = max_new < sv->o.max_tokens ? max_new : sv->o.max_tokens;
    max_new = max_new < room ? max_new : room;
    if (draft_begin(sv->drafters, sv->nd, g.chat ? rq->chat ? json_object_get(rq->chat, "messages") : NULL : NULL,
                    rq->thinking, &err) != 0)
        goto out;
    cache_resume(sv, &j->prompt);
    int32_t stop[32];
    int nstop = 0;
    const int32_t *fmt_stop;
    int nf = tok_stop_ids(sv->tk, &fmt_stop);
    for (int k = 0; k < sv->n_eos && nstop < 32; k++)
        stop[nstop++] = sv->eos[k];
    for (int k = 0; k < nf && nstop < 32; k++)
        stop[nstop++] = fmt_stop[k];
    gen_req gr = {.prompt = j->prompt.v, .n_prompt = (int)j->prompt.n, .max_new = (int)max_new, .stop = stop,
                  .n_stop = rq->ignore_eos ? 0 : nstop, .drafters = sv->drafters, .n_drafters = sv->nd, .draft_max = sv->o.draft.max,
                  .step_done = on_step};
    if (gen_run(sv->s, &sm, &gr, on_token, rq->logprobs ? on_logits : NULL, &g, &st, &err) != 0)
        goto out;
    if (g.chat && tok_reply_finish(g.reply, on_event, &g, &err) < 0)
        goto out;
    if (g.have_ts) {
        size_t n;
        const char *t = tok_stream_flush(&g.ts, &n);
        content_add(&g, t, n);
    }
    if (!g.stop_hit)
        g.safe = g.content.n; /* the end: nothing more can complete a stop string */
    if (g.fail) {
        errbuf_set(&err, "out of memory building the response");
        goto out;
    }
    pthread_mutex_lock(&sv->mu);
    int stopping = sv->stopping && !j->cancel && !g.ended && !g.stop_hit;
    pthread_mutex_unlock(&sv->mu);
    if (stopping) { /* cut short by SIGTERM: not an answer of the length asked for */
        errbuf_set(&err, "the server is stopping: the generation was cut short after %d tokens", g.n_gen);
        stop_status = 503;
        goto out;
    }
    rc = 0;
out:;
    const char *finish = g.stop_hit                               ? "stop"
                         : json_array_size(g.calls) && g.ended    ? "tool_calls"
                         : g.ended                                ? "stop"
                                                                  : "length";
    pthread_mutex_lock(&sv->mu);
    int cancelled = j->cancel;
    if (!cancelled) {
        api_err ae;
        if (rc == 0 && rq->stream) {
            stream_flush(&g, finish);
            if (rq->include_usage)
                sse_put(&g, json_pack("{s:s, s:s, s:I, s:s, s:s, s:[], s:o}", "id", j->id, "object",
                                      g.chat ? "chat.completion.chunk" : "text_completion", "created",
                                      (json_int_t)j->created, "model", sv->model_id, "system_fingerprint", "deltafin",
                                      "choices", "usage", usage_of(&g, &st)));
        } else if (rc == 0) {
            j->status = (j->body = final_body(&g, &st, finish)) ? 200 : 500;
        }
        if (rc != 0 || (!rq->stream && !j->body)) {
            api_err_set(&ae, stop_status, "server_error", NULL, NULL, "%s",
                        rc ? err.msg : "out of memory building the response");
            char *eb = api_err_json(&ae);
            if (rq->stream) { /* after the stream began: one error event, then the end */
                if (eb && (buf_put(&j->out, "data: ", 6) || buf_put(&j->out, eb, strlen(eb)) ||
                           buf_put(&j->out, "\n\n", 2)))
                    g.fail = 1;
                free(eb);
            } else {
                j->status = stop_status;
                j->body = eb;
            }
        }
        if (rq->stream)
            buf_put(&j->out, "data: [DONE]\n\n", 14);
    }
    metrics_add(sv, &st, cancelled);
    pthread_mutex_unlock(&sv->mu);
    if (rc != 0 && !cancelled)
        fprintf(stderr, "deltafin serve: %s: %s\n", j->id, err.msg);
    sampler_free(&sm);
    tok_reply_free(g.reply);
    if (g.have_ts)
        tok_stream_free(&g.ts);
    buf_free(&g.content);
    buf_free(&g.reasoning);
    buf_free(&g.echo);
    json_decref(g.calls);
    json_decref(g.lp);
    json_decref(g.lp_tokens);
    json_decref(g.lp_vals);
    json_decref(g.lp_top);
    json_decref(g.lp_off);
    return rc == 0 && !cancelled;
}

/* serve --debug's logits route: the session brought to the ids (reusing what it holds, as a
 * generation does), the last position's logits as base64 of float32 little-endian */
static int run_logits(srv *sv, job *j)
{
    errbuf err;
    session_stats a, b;
    cache_resume(sv, &j->prompt);
    session_stats_get(sv->s, &a);
    int rc = session_sync(sv->s, j->prompt.v, (int)j->prompt.n, &err);
    session_stats_get(sv->s, &b);
    const float *lg = rc == 0 ? session_last_logits(sv->s) : NULL;
    char *b64 = NULL, *body = NULL;
    size_t raw = sizeof(float) * (size_t)sv->vocab;
    if (lg && (b64 = malloc(4 * ((raw + 2) / 3) + 1)) != NULL) {
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)lg, (int)raw);
        json_t *o = json_pack("{s:i, s:I, s:s}", "tokens", (int)j->prompt.n, "cached_tokens",
                              (json_int_t)(b.reused - a.reused), "logits", b64);
        body = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    free(b64);
    if (!body) {
        api_err ae;
        api_err_set(&ae, 500, "server_error", NULL, NULL, "%s", rc ? err.msg : "out of memory");
        body = api_err_json(&ae);
    }
    pthread_mutex_lock(&sv->mu);
    j->status = body && lg ? 200 : 500;
    j->body = body;
    pthread_mutex_unlock(&sv->mu);
    return lg != NULL;
}

/* ---- the thread ---- */

static int load(srv *sv, errbuf *err)
{
    if (engine_open(&sv->o.eng, &sv->e, err) != 0)
        return -1;
    if (!(sv->tk = engine_tok(sv->e, err)))
        return -1;
    const hparams *hp = engine_hparams(sv->e);
    sv->vocab = hp->vocab;
    for (int k = 0; k < hp->n_eos && k < 16; k++)
        sv->eos[sv->n_eos++] = hp->eos_ids[k];
    int ctx = sv->o.context > 0 ? sv->o.context : 32768;
    if (hp->ctx_len > 0 && ctx > hp->ctx_len)
        ctx = hp->ctx_len;
    sv->context = ctx;
    draft_ctx dc = {.target = sv->e, .context = ctx, .messages = NULL, .thinking = 1};
    if (draft_open(&sv->o.draft, &dc, sv->drafters, &sv->nd, err) != 0)
        return -1;
    session_opts so;
    session_opts_default(&so);
    so.context = ctx;
    so.max_pass = ctx < 256 ? ctx : 256;
    so.max_logits = sv->nd ? sv->o.draft.max + 1 : 1;
    so.max_commit = sv->nd ? sv->o.draft.max + 1 : 0;
    if (so.max_pass < so.max_logits)
        so.max_pass = so.max_logits;
    if (session_new(sv->e, &so, &sv->s, err) != 0)
        return -1;
    if (sv->o.cache_dir) {
        if (srv_cache_open(&sv->cache, sv->o.cache_dir, sv->o.cache_bytes, sv->e, NULL, err) != 0)
            return -1;
        sv->have_cache = 1;
    }
    for (int d = 0; d < sv->nd; d++)
        if (sv->drafters[d]->n_taps > 0 && session_set_tap_sink(sv->s, sv->drafters[d]->taps, sv->drafters[d]->n_taps,
                                                                sv->drafters[d]->on_taps, sv->drafters[d], err))
            return -1;
    return 0;
}

void *srv_gen_main(void *arg)
{
    srv *sv = arg;
    errbuf err;
    int rc = load(sv, &err);
    pthread_mutex_lock(&sv->mu);
    if (rc == 0) {
        sv->ready = 1;
        sv->m.has_cache = sv->have_cache;
        sv->m.cache_states = (uint64_t)sv->cache.n;
        sv->m.cache_bytes = sv->cache.total;
    }
    else {
        sv->failed = 1;
        sv->load_err = err;
    }
    pthread_cond_broadcast(&sv->loaded);
    while (rc == 0) {
        while (!sv->queue && !sv->stopping)
            pthread_cond_wait(&sv->work, &sv->mu);
        if (sv->stopping)
            break;
        job *j = sv->queue;
        sv->queue = j->next;
        if (!sv->queue)
            sv->queue_tail = NULL;
        sv->queued--;
        sv->m.cancelled += j->cancel != 0; /* gone while it waited */
        int keep = 0;
        if (!j->cancel) {
            j->state = JOB_RUNNING;
            sv->running = 1;
            pthread_mutex_unlock(&sv->mu);
            keep = j->rq.kind == API_LOGITS ? run_logits(sv, j) : run_job(sv, j);
            pthread_mutex_lock(&sv->mu);
            sv->running = 0;
        }
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&sv->mu);
        job_release(sv, j);
        if (keep && sv->have_cache) { /* the client has its answer: now the state goes to disk */
            errbuf e2;
            if (srv_cache_save(&sv->cache, sv->s, &e2) != 0)
                fprintf(stderr, "deltafin serve: cache: %s\n", e2.msg);
        }
        pthread_mutex_lock(&sv->mu);
        sv->m.cache_loads = sv->cache.loads;
        sv->m.cache_saves = sv->cache.saves;
        sv->m.cache_states = (uint64_t)sv->cache.n;
        sv->m.cache_bytes = sv->cache.total;
    }
    /* stopping (srv_enqueue now refuses): whatever still waits is taken off the queue at once, then
     * answered as cancelled */
    job *q = sv->queue;
    sv->queue = sv->queue_tail = NULL;
    sv->queued = 0;
    for (job *j = q; j; j = j->next) {
        j->cancel = 1;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&sv->mu);
    for (job *j = q, *nx; j; j = nx) {
        nx = j->next;
        job_release(sv, j);
    }
    return NULL;
}
