/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <assert.h>
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
    /* by drafter, class of its guesses (draft.h: cls) and block position j: */
    double acc[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT]; /* EMA of keeping guess j, given the ones before */
    int ruled[GEN_MAX_DRAFTERS][DRAFT_CLASSES][GEN_MAX_DRAFT];  /* guesses at position j ruled on */
    int last_cls[GEN_MAX_DRAFTERS];                              /* the class of its latest guesses */
    double propose_s[GEN_MAX_DRAFTERS];
    int asked[GEN_MAX_DRAFTERS], guessed[GEN_MAX_DRAFTERS]; /* steps that asked it, and that got guesses */
    drafter *const *dr;               /* the request's drafters (their cost estimates) */
    int n_seq, remaining;             /* this step's sequence length, and the tokens still wanted */
    int turn;                          /* the next drafter to warm up */
    int probe_turn;                    /* the next drafter to probe */
    int since_probe, probe_every;
} econ;

/* Warm-up: each drafter drafts one guess (the cheapest verify) until ECON_WARMUP steps had guesses
 * from it, or it was asked ECON_WARMUP_ASKS times (a drafter that seldom guesses, as the n-gram
 * one on new text, costs nothing when it has none). */
enum { ECON_WARMUP = 2, ECON_WARMUP_ASKS = 64, ECON_PROBE_MAX = 512 };
static const double EMA = 0.25;    /* weight of a new measurement */
static const double ACC_PRIOR = 0.5, ACC_DECAY = 0.9, COMPUTE_PER_POS = 0.15;
/* a drafter whose proposing costs less than this share of a plain pass is free: it is asked every
 * step, and its guesses are verified when their class pays (a plain pass when none come). Its
 * optimism: 0.5 kept verifying n-gram guesses on chat from RAM that cost more than they saved
 * (0.89-0.90x of no drafting, 0.93-0.94x at 0.25; bench/results/drafting.md) */
static const double FREE_SHARE = 0.01, ACC_OPTIMISM = 0.25;
/* before its first ask, a drafter that can say what an ask costs (draft.h: cost) is judged as a good
 * drafter would be: this share of its guesses kept, position after position */
static const double ACC_GOOD = 0.8;

static void ema(double *x, double v) { *x = *x > 0 ? (1 - EMA) * *x + EMA * v : v; }

/* a pass of T positions relative to one, by the model of generate.h: compute grows slowly with T,
 * reads with the union of the experts the positions route to */
static double shape(const econ *e, int T)
{
    return (1 - e->io_frac) * (1 + COMPUTE_PER_POS * (T - 1)) + e->io_frac * e->union_ratio[T];
}

/* the time of a pass of T positions: measured, or the largest measured smaller one scaled by the
 * model (it carries the routing locality and cache hits the model does not know) */
static double pass_cost(const econ *e, int T)
{
    if (e->pass_s[T] > 0)
        return e->pass_s[T];
    for (int t = T - 1; t >= 1; t--)
        if (e->pass_s[t] > 0)
            return e->pass_s[t] * shape(e, T) / shape(e, t);
    return 1e-3 * shape(e, T);
}

static int is_free(const econ *e, int d) { return e->asked[d] > 0 && e->propose_s[d] < FREE_SHARE * pass_cost(e, 1); }

/* expected tokens of a step of drafter d with k guesses of class c; a position never ruled on is
 * taken as a little less likely than the one before it. A free drafter is judged optimistically
 * (an upper bound that tightens as rulings come): trying its guesses costs only a wider pass, and
 * a class judged on two rulings below break-even would otherwise never be verified again. */
static double expected(const econ *e, int d, int c, int k)
{
    double E = 1, run = 1, a = ACC_PRIOR;
    int opt = is_free(e, d);
    for (int j = 0; j < k; j++) {
        int n = e->ruled[d][c][j];
        a = n ? e->acc[d][c][j] : j ? a * (opt ? 1.0 : ACC_DECAY) : ACC_PRIOR;
        double b = opt && n ? a + ACC_OPTIMISM / sqrt(n + 1.0) : a;
        run *= b < 1 ? b : 1;
        E += run;
    }
    return E;
}

/* the k <= kmax (0: none) with the most tokens per second for drafter d's guesses of class c,
 * proposing costing `extra` */
static int best_k(const econ *e, int d, int c, int kmax, double extra, double *rate)
{
    int best = 0;
    *rate = 1.0 / pass_cost(e, 1);
    for (int k = 1; k <= kmax; k++) {
        double r = expected(e, d, c, k) / (pass_cost(e, k + 1) + extra);
        if (r > *rate) {
            *rate = r;
            best = k;
        }
    }
    return best;
}

/* Before drafter d's first ask, from its own estimate of the cost: would a good drafter (ACC_GOOD)
 * win back more than that first ask's catch-up (a model drafter prefilling the prompt) over the
 * tokens still wanted, for some k? */
static int first_ask_pays(const econ *e, int d, int kmax)
{
    drafter *dr = e->dr[d];
    /* its estimate is in the target's passes from RAM: the reads a pass waits on are the target's */
    double p1 = pass_cost(e, 1), compute = p1 * (1 - e->io_frac);
    for (int k = 1; k <= kmax; k++) {
        double once, step = dr->cost(dr, e->n_seq, k, &once);
        double E = 0, run = 1;
        for (int j = 0; j <= k; j++, run *= ACC_GOOD)
            E += run;
        double per_token = (pass_cost(e, k + 1) + step * compute) / E;
        if (per_token < p1 && (p1 - per_token) * e->remaining > once * compute)
            return 1;
    }
    return 0;
}

/* Whether drafter d could pay at all: even if every guess were kept, does some k beat a plain
 * pass, its proposing costing what it did? Before it was asked: its own estimate when it gives one
 * (first_ask_pays), else yes. A drafter that cannot is neither warmed up nor probed: its asks are
 * pure cost. */
static int can_pay(const econ *e, int d, int kmax)
{
    if (e->asked[d] == 0)
        return e->dr[d]->cost ? first_ask_pays(e, d, kmax) : 1;
    double plain = 1.0 / pass_cost(e, 1);
    for (int k = 1; k <= kmax; k++)
        if ((k + 1) / (pass_cost(e, k + 1) + e->propose_s[d]) > plain)
            return 1;
    return 0;
}

/* The drafter (-1: none) and k of this step. *probe: a probe of a drafter that does not pay. */
static void choose(econ *e, int nd, int kmax, int *best_d, int *best_k_out, int *probe)
{
    *best_d = -1;
    *best_k_out = 0;
    *probe = 0;
    for (int i = 0; i < nd; i++) { /* warm-up, in turn */
        int d = (e->turn + i) % nd;
        if (e->guessed[d] < ECON_WARMUP && e->asked[d] < ECON_WARMUP_ASKS && can_pay(e, d, kmax)) {
            e->turn = d + 1;
            *best_d = d;
            *best_k_out = 1;
            return;
        }
    }
    double best = 1.0 / pass_cost(e, 1);
    for (int d = 0; d < nd; d++) {
        double r;
        if (!can_pay(e, d, kmax)) /* (before its first ask, its propose_s is not known yet) */
            continue;
        int k = best_k(e, d, e->last_cls[d], kmax, e->propose_s[d], &r);
        if (k > 0 && r > best) {
            best = r;
            *best_d = d;
            *best_k_out = k;
        }
    }
    if (*best_d < 0 && nd > 0 && ++e->since_probe >= e->probe_every) { /* keep acceptance measured, */
        e->since_probe = 0;                                                /* of each drafter in turn */
        for (int i = 0; i < nd && *best_d < 0; i++) {
            int d = (e->probe_turn + i) % nd;
            if (can_pay(e, d, kmax)) {
                e->probe_turn = d + 1;
                *best_d = d;
                *best_k_out = 1;
                *probe = 1;
            }
        }
    }
    for (int d = 0; d < nd && *best_d < 0; d++) /* nothing else this step: a free drafter's guesses */
        if (is_free(e, d)) {
            *best_d = d;
            *best_k_out = kmax;
        }
}

/* Asks drafter d for up to k guesses after seq[0 .. n) (its anchor last) into out, and records what
 * the ask cost; returns their number, or -1 (err). *cls: the class of its guesses. */
static int ask(econ *e, const gen_req *rq, gen_stats *st, int d, const int32_t *seq, int n, int k, int32_t *out,
               const float **q, int *cls, errbuf *err)
{
    drafter *dr = rq->drafters[d];
    double once = 0; /* a first ask's catch-up (by its estimate) is not what later asks cost */
    if (e->asked[d] == 0 && dr->cost)
        dr->cost(dr, n, k, &once);
    once *= pass_cost(e, 1) * (1 - e->io_frac);
    double tp = timer_now();
    dr->cls = 0;
    *q = NULL;
    int m = dr->propose(dr, seq, n, k, out, q, err);
    double dt = timer_now() - tp;
    if (m < 0)
        return -1;
    ema(&e->propose_s[d], dt - once > 0.25 * dt ? dt - once : 0.25 * dt);
    st->draft[d].propose_s += dt;
    e->asked[d]++;
    e->guessed[d] += m > 0;
    *cls = dr->cls;
    assert(*cls >= 0 && *cls < DRAFT_CLASSES);
    if (m > 0)
        e->last_cls[d] = *cls;
    return m;
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

/* a guess at `pos` ruled on from its row: 1 kept; else *next is the target's token there.
 * A plain guess (q NULL: all its mass on one token) is sample-and-match: kept when it is the token
 * the target draws there with its own random number, so the tokens are a plain decode's with the
 * same seed whatever was drafted (and kept with probability p(guess), as speculative sampling's
 * rule keeps it). A guess with a distribution q is kept when u < p / q, else the residual. */
static int rule(sampler *sm, const float *row, int32_t guess, const float *q, int64_t pos, int32_t *next)
{
    if (sm->cfg.temperature == 0.0f) {
        *next = sampler_argmax(row, sm->vocab);
        return *next == guess;
    }
    if (!q) {
        *next = sampler_pick(sm, row, pos);
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
    int seq_cap = 0, seq_have = 0, rc = 0;
    econ ec;
    memset(&ec, 0, sizeof ec);
    ec.dr = rq->drafters;
    const struct store *sto = s->e->store;
    const hparams *hp = s->hp;
    for (int T = 1; T <= GEN_MAX_DRAFT + 1; T++) { /* experts a pass of T positions reads, uniform routing */
        double K = hp->top_k, E = hp->n_experts > 0 ? hp->n_experts : 1;
        ec.union_ratio[T] = sto && hp->n_experts > 0 ? E * (1 - pow(1 - K / E, T)) / K : 1.0;
    }
    for (int d = 0; d < nd; d++)
        for (int c = 0; c < DRAFT_CLASSES; c++)
            for (int j = 0; j < GEN_MAX_DRAFT; j++)
                ec.acc[d][c][j] = ACC_PRIOR;
    ec.probe_every = GEN_PROBE_EVERY;
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
    if (!stop && rq->step_done && rq->step_done(ud))
        stop = 1;
    while (!stop) {
        int d, k;
        double predicted;
        int probe = 0, warm = 0;
        if (rq->fixed && nd > 0) {
            d = (int)(st->passes % (uint64_t)nd);
            k = kmax;
        } else {
            ec.n_seq = session_len(s) + 1;
            ec.remaining = rq->max_new - st->n_gen;
            choose(&ec, nd, kmax, &d, &k, &probe);
            warm = d >= 0 && ec.guessed[d] < ECON_WARMUP;
        }
        /* no guess past the session's room or past what the request still wants (a step emits at
         * most its guesses and one more) */
        int room = session_context(s) - session_len(s) - 1, want = rq->max_new - st->n_gen - 1;
        k = k < room ? k : room;
        k = k < want ? k : want;
        int m = 0, cls = 0;
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
            /* the decided tokens never change: copy only those new since the last step */
            memcpy(seq + seq_have, session_tokens(s) + seq_have, sizeof *seq * (size_t)(n - 1 - seq_have));
            seq_have = n - 1;
            seq[n - 1] = anchor;
            m = ask(&ec, rq, st, d, seq, n, k, drafts + 1, &q, &cls, err);
            /* The step's drafter had nothing (a model drafter warming up, a probe, a draft that ended
             * inside a target token): a free drafter's guesses then cost nothing to ask for, and
             * the pass runs anyway. Without this, every warm-up ask of a drafter that seldom
             * guesses took the step from the n-gram drafter's. */
            for (int d2 = 0; m == 0 && !rq->fixed && d2 < nd; d2++) {
                if (d2 == d || !is_free(&ec, d2))
                    continue;
                int k2 = kmax < room ? kmax : room;
                k2 = k2 < want ? k2 : want;
                m = ask(&ec, rq, st, d2, seq, n, k2, drafts + 1, &q, &cls, err);
                if (m != 0) { /* its guesses, judged as its own step's would be */
                    d = d2;
                    warm = probe = 0;
                }
            }
            if (m < 0) {
                rc = -1;
                break;
            }
            if (m > 0 && !rq->fixed && !warm && !probe) { /* are these guesses worth a pass, and how many? */
                double r;                                  /* a class not yet ruled on gets one tried */
                m = ec.ruled[d][cls][0] < ECON_WARMUP ? 1 : best_k(&ec, d, cls, m, 0.0, &r);
            }
        }
        predicted = pass_cost(&ec, m + 1) + (d >= 0 && k > 0 ? ec.propose_s[d] : 0.0);
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
            double w = 1.0 / (++ec.ruled[d][cls][j] + 1); /* a running mean with the prior as one sample, */
            w = w > EMA ? w : EMA;                           /* then the EMA */
            ec.acc[d][cls][j] = (1 - w) * ec.acc[d][cls][j] + w * ok;
            if (!ok)
                break;
            st->draft[d].by_pos_kept[j]++;
            kept++;
            stop = emit(&em, drafts[1 + j], base + 1 + j, row);
        }
        if (probe && m > 0) /* a probe that found guesses kept comes back soon, else ever later */
            ec.probe_every = kept ? GEN_PROBE_EVERY
                                  : (ec.probe_every * 2 < ECON_PROBE_MAX ? ec.probe_every * 2 : ECON_PROBE_MAX);
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
        if (!stop && rq->step_done && rq->step_done(ud))
            stop = 1;
    }
    free(seq);
    if (st->n_gen > 0)
        st->t_decode = timer_now() - em.t1;
    return rc;
}
