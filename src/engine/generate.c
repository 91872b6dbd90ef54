/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/engine_int.h"
#include "store/store.h"

/* what the economics knows */
typedef struct econ {
    double pass_s[GEN_MAX_DRAFT + 2]; /* EMA of a pass's seconds by its size T, 0: not measured */
    double io_frac;                   /* share of a one-position pass spent waiting on reads */
    double union_ratio[GEN_MAX_DRAFT + 2]; /* experts T positions read / those one reads (uniform routing) */
    double acc[GEN_MAX_DRAFTERS][GEN_MAX_DRAFT]; /* EMA of keeping the guess at block position j, given the ones before */
    double propose_s[GEN_MAX_DRAFTERS];
    int tries[GEN_MAX_DRAFTERS];
    int since_probe;
} econ;

enum { ECON_WARMUP = 4 };          /* steps each drafter drafts before its estimate is trusted */
static const double EMA = 0.25;    /* weight of a new measurement */
static const double ACC_PRIOR = 0.5, COMPUTE_PER_POS = 0.15;

static void ema(double *x, double v) { *x = *x > 0 ? (1 - EMA) * *x + EMA * v : v; }

/* the time of a pass of T positions: measured, or the one-position pass scaled (generate.h) */
static double pass_cost(const econ *e, int T)
{
    if (e->pass_s[T] > 0)
        return e->pass_s[T];
    double t1 = e->pass_s[1] > 0 ? e->pass_s[1] : 1e-3;
    return t1 * ((1 - e->io_frac) * (1 + COMPUTE_PER_POS * (T - 1)) + e->io_frac * e->union_ratio[T]);
}

/* expected tokens of a step of drafter d with k guesses */
static double expected(const econ *e, int d, int k)
{
    double E = 1, run = 1;
    for (int j = 0; j < k; j++) {
        run *= e->acc[d][j];
        E += run;
    }
    return E;
}

/* The drafter (-1: none) and k with the best tokens per second. */
static void choose(econ *e, int nd, int kmax, int *best_d, int *best_k, double *predicted)
{
    double best = 1.0 / pass_cost(e, 1);
    *best_d = -1;
    *best_k = 0;
    *predicted = pass_cost(e, 1);
    for (int d = 0; d < nd; d++) {
        if (e->tries[d] < ECON_WARMUP) { /* not measured yet: try it, half the block */
            *best_d = d;
            *best_k = kmax > 1 ? (kmax + 1) / 2 : kmax;
            *predicted = pass_cost(e, *best_k + 1) + e->propose_s[d];
            return;
        }
        for (int k = 1; k <= kmax; k++) {
            double c = pass_cost(e, k + 1) + e->propose_s[d], r = expected(e, d, k) / c;
            if (r > best) {
                best = r;
                *best_d = d;
                *best_k = k;
                *predicted = c;
            }
        }
    }
    if (*best_d < 0 && nd > 0 && ++e->since_probe >= GEN_PROBE_EVERY) { /* keep a drafter's acceptance measured */
        e->since_probe = 0;
        double top = -1;
        for (int d = 0; d < nd; d++)
            if (e->acc[d][0] > top) {
                top = e->acc[d][0];
                *best_d = d;
            }
        *best_k = kmax < 2 ? kmax : 2;
        *predicted = pass_cost(e, *best_k + 1) + e->propose_s[*best_d];
    }
}

static double store_stall(const session *s)
{
    struct store *st = s->e->store;
    if (!st)
        return 0;
    store_stats ss;
    store_stats_get(st, &ss);
    return ss.stall_s + ss.spine_stall_s;
}

/* what emitting a token said: 1 stop (a stop id, the callback, or max_new), 0 go on */
typedef struct emitter {
    const gen_req *rq;
    gen_token_fn cb;
    gen_logits_fn lcb;
    void *ud;
    gen_stats *st;
    double t0, t1;
} emitter;

static int emit(emitter *em, int32_t id, int64_t pos, const float *logits)
{
    if (em->lcb)
        em->lcb(em->ud, pos, logits);
    em->st->n_gen++;
    if (em->st->n_gen == 1) {
        em->t1 = timer_now();
        em->st->t_first = em->t1 - em->t0;
    }
    int stop = em->cb ? em->cb(em->ud, id) : 0;
    for (int j = 0; j < em->rq->n_stop; j++)
        stop |= id == em->rq->stop[j];
    return stop || em->st->n_gen >= em->rq->max_new;
}

/* a guess at `pos` ruled on from its row: 1 kept; else *next is the target's token there */
static int rule(sampler *sm, const float *row, int32_t guess, const float *q, int64_t pos, int32_t *next)
{
    if (sm->cfg.temperature == 0.0f) {
        *next = sampler_argmax(row, sm->vocab);
        return *next == guess;
    }
    sampler_dist(sm, row);
    double p = sampler_prob(sm, guess), qd = q ? (double)q[guess] : 1.0;
    float u = rng_uniform_at(sm->cfg.seed, (uint64_t)pos, SAMPLER_STREAM_ACCEPT);
    if (qd > 0 && (double)u < p / qd)
        return 1;
    *next = sampler_draw_residual(sm, q, guess, rng_uniform_at(sm->cfg.seed, (uint64_t)pos, SAMPLER_STREAM_RESIDUAL));
    return 0;
}

int gen_run(session *s, sampler *sm, const gen_req *rq, gen_token_fn cb, gen_logits_fn lcb, void *ud, gen_stats *st,
            errbuf *err)
{
    memset(st, 0, sizeof *st);
    if (rq->n_prompt < 1)
        return errbuf_set(err, "empty prompt: give at least one token");
    int nd = rq->n_drafters < GEN_MAX_DRAFTERS ? rq->n_drafters : GEN_MAX_DRAFTERS;
    int kmax = rq->draft_max < GEN_MAX_DRAFT ? rq->draft_max : GEN_MAX_DRAFT;
    int cap = session_max_commit(s) - 1; /* a verify pass of k + 1 positions is kept in part from its log */
    if (session_max_pass(s) - 1 < cap)
        cap = session_max_pass(s) - 1;
    if (s->o.max_logits - 1 < cap)
        cap = s->o.max_logits - 1;
    if (kmax > cap)
        kmax = cap;
    if (kmax < 1)
        nd = 0;
    st->n_drafters = nd;
    for (int d = 0; d < nd; d++)
        st->draft[d].name = rq->drafters[d]->name;
    emitter em = {rq, cb, lcb, ud, st, timer_now(), 0};
    session_stats before, after;
    session_stats_get(s, &before);
    if (session_sync(s, rq->prompt, rq->n_prompt, err) != 0)
        return -1;
    session_stats_get(s, &after);
    st->n_prompt = rq->n_prompt;
    st->n_reused = (int)(after.reused - before.reused);
    st->t_prefill = timer_now() - em.t0;
    if (rq->max_new < 1)
        return 0;
    const int V = s->hp->vocab;
    int32_t *seq = NULL, drafts[GEN_MAX_DRAFT + 1];
    int seq_cap = 0, rc = 0;
    econ ec;
    memset(&ec, 0, sizeof ec);
    const struct store *sto = s->e->store;
    const hparams *hp = s->hp;
    for (int T = 1; T <= GEN_MAX_DRAFT + 1; T++) { /* experts a pass of T positions reads, uniform routing */
        double K = hp->top_k, E = hp->n_experts > 0 ? hp->n_experts : 1;
        ec.union_ratio[T] = sto && hp->n_experts > 0 ? E * (1 - pow(1 - K / E, T)) / K : 1.0;
    }
    for (int d = 0; d < nd; d++)
        for (int j = 0; j < GEN_MAX_DRAFT; j++)
            ec.acc[d][j] = ACC_PRIOR;
    if (nd > 0) {
        seq_cap = session_context(s) + 1;
        if (!(seq = malloc(sizeof *seq * (size_t)seq_cap)))
            return errbuf_set(err, "out of memory for the drafter's view of %d tokens", seq_cap);
    }
    /* the first token, from the prompt's last logits */
    int64_t pos = session_len(s);
    const float *lg = session_last_logits(s);
    int32_t anchor = sampler_pick(sm, lg, pos);
    int stop = emit(&em, anchor, pos, lg);
    while (!stop) {
        int d, k;
        double predicted;
        if (rq->fixed && nd > 0) {
            d = (int)(st->passes % (uint64_t)nd);
            k = kmax;
            predicted = pass_cost(&ec, k + 1);
        } else {
            choose(&ec, nd, kmax, &d, &k, &predicted);
        }
        /* no guess past the session's room or past what the request still wants (a step emits at
         * most its guesses and one more) */
        int room = session_context(s) - session_len(s) - 1, want = rq->max_new - st->n_gen - 1;
        k = k < room ? k : room;
        k = k < want ? k : want;
        int m = 0;
        const float *q = NULL;
        if (d >= 0 && k > 0) {
            int n = session_len(s) + 1; /* the sequence with the anchor */
            if (n > seq_cap) { /* reserved below: grows only past the session's context */
                int nc = n + 4096;
                int32_t *ns = realloc(seq, sizeof *ns * (size_t)nc);
                if (!ns) {
                    rc = errbuf_set(err, "out of memory for the drafter's view of %d tokens", n);
                    break;
                }
                seq = ns;
                seq_cap = nc;
            }
            memcpy(seq, session_tokens(s), sizeof *seq * (size_t)(n - 1));
            seq[n - 1] = anchor;
            double tp = timer_now();
            m = rq->drafters[d]->propose(rq->drafters[d], seq, n, k, drafts + 1, &q, err);
            double dt = timer_now() - tp;
            if (m < 0) {
                rc = -1;
                break;
            }
            ema(&ec.propose_s[d], dt);
            st->draft[d].propose_s += dt;
            ec.tries[d]++;
        }
        drafts[0] = anchor;
        int T = m + 1;
        double stall0 = store_stall(s), tp = timer_now();
        session_pass p = {.tokens = drafts, .T = T, .n_logits = T};
        if (session_run(s, &p, err) != 0) {
            rc = -1;
            break;
        }
        double took = timer_now() - tp, stalled = store_stall(s) - stall0;
        ema(&ec.pass_s[T], took);
        if (T == 1 && took > 0)
            ec.io_frac = (1 - EMA) * ec.io_frac + EMA * (stalled / took < 1 ? stalled / took : 1);
        st->passes++;
        st->predicted_s += predicted;
        st->measured_s += took;
        /* rule on the guesses in order; the first one refused gives the target's own token */
        int64_t base = session_len(s) - T; /* the anchor's position */
        int kept = 0;
        int32_t next = -1;
        for (int j = 0; j < m && !stop; j++) {
            const float *row = session_logits(s, j);
            int ok = rule(sm, row, drafts[1 + j], q ? q + (size_t)j * V : NULL, base + 1 + j, &next);
            st->draft[d].by_pos_tried[j]++;
            ec.acc[d][j] = (1 - EMA) * ec.acc[d][j] + EMA * ok;
            if (!ok)
                break;
            st->draft[d].by_pos_kept[j]++;
            kept++;
            stop = emit(&em, drafts[1 + j], base + 1 + j, row);
        }
        if (d >= 0 && m > 0) {
            st->draft[d].steps++;
            st->draft[d].proposed += (uint64_t)m;
            st->draft[d].accepted += (uint64_t)kept;
            rq->drafters[d]->feedback(rq->drafters[d], m, kept);
        }
        if (session_commit(s, kept + 1, err) != 0) { /* the anchor and the kept guesses */
            rc = -1;
            break;
        }
        if (stop)
            break;
        const float *row = session_logits(s, kept);
        if (kept == m) /* every guess kept (or none made): the target's next token, plainly */
            next = sampler_pick(sm, row, base + 1 + kept);
        anchor = next;
        stop = emit(&em, anchor, base + 1 + kept, row);
    }
    free(seq);
    if (st->n_gen > 0)
        st->t_decode = timer_now() - em.t1;
    return rc;
}
