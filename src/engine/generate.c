/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/econ.h"
#include "engine/engine_int.h"
#include "store/store.h"

/* Asks drafter d for up to k guesses after seq[0 .. n) (its anchor last) into out, and records what
 * the ask cost; returns their number, or -1 (err). *cls: the class of its guesses. */
static int ask(econ *e, const gen_req *rq, gen_stats *st, int d, const int32_t *seq, int n, int k, int32_t *out,
               const float **q, int *cls, errbuf *err)
{
    drafter *dr = rq->drafters[d];
    double once = econ_ask_extra(e, d, n, k); /* catching up is not what a step's ask costs */
    double tp = timer_now();
    dr->cls = 0;
    *q = NULL;
    int m = dr->propose(dr, seq, n, k, out, q, err);
    double dt = timer_now() - tp;
    if (m < 0)
        return -1;
    st->draft[d].propose_s += dt;
    *cls = dr->cls;
    assert(*cls >= 0 && *cls < DRAFT_CLASSES);
    econ_asked(e, d, dt, once, m, *cls);
    return m;
}

/* How many of drafter d's m guesses g (for positions n ..) the pass verifies; plain guesses it does
 * not verify are ruled on as their positions are decided (econ_unverified). */
static int judge(econ *e, int d, int cls, const int32_t *g, int m, const float *q, int n, const econ_step *es)
{
    int v = econ_verify(e, d, cls, m, q == NULL, es);
    if (!q)
        econ_unverified(e, d, cls, n, g, m, v, es);
    return v;
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
    double stall_sync = store_stall(s);
    if (session_sync(s, rq->prompt, rq->n_prompt, err) != 0)
        return -1;
    session_stats_get(s, &after);
    st->n_prompt = rq->n_prompt;
    st->n_reused = (int)(after.reused - before.reused);
    st->t_prefill = timer_now() - em.t0;
    stall_sync = store_stall(s) - stall_sync;
    if (rq->max_new < 1)
        return 0;
    const int V = s->hp->vocab;
    int32_t *seq = NULL, drafts[GEN_MAX_DRAFT + 1];
    int seq_cap = 0, seq_have = 0, rc = 0;
    econ ec;
    const hparams *hp = s->hp;
    econ_init(&ec, rq->drafters, nd, hp->top_k, hp->n_experts, s->e->store != NULL);
    econ_prefilled(&ec, (int)(after.positions_run - before.positions_run), (int)(after.passes - before.passes),
                   st->t_prefill, stall_sync);
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
        econ_step es = {0};
        if (rq->fixed && nd > 0) {
            d = (int)(st->passes % (uint64_t)nd);
            k = kmax;
        } else {
            econ_choose(&ec, kmax, (int)session_len(s) + 1, rq->max_new - st->n_gen, &d, &k, &es);
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
            if (m > 0 && !rq->fixed) /* are these guesses worth a pass, and how many? */
                m = judge(&ec, d, cls, drafts + 1, m, q, n, &es);
            /* The step's drafter had nothing to verify (a model drafter warming up or probed, a
             * draft that ended inside a target token): a free drafter's guesses then cost nothing
             * to ask for, and the pass runs anyway. Without this, every warm-up ask of a drafter
             * that seldom guesses took the step from the n-gram drafter's. */
            for (int d2 = 0; m == 0 && !rq->fixed && d2 < nd; d2++) {
                if (d2 == d || !econ_is_free(&ec, d2))
                    continue;
                int k2 = kmax < room ? kmax : room;
                k2 = k2 < want ? k2 : want;
                m = ask(&ec, rq, st, d2, seq, n, k2, drafts + 1, &q, &cls, err);
                if (m > 0) { /* its guesses, judged as its own step's would be */
                    d = d2;
                    es.warm = es.probe = es.explore = 0;
                    m = judge(&ec, d, cls, drafts + 1, m, q, n, &es);
                }
            }
            if (m < 0) {
                rc = -1;
                break;
            }
        }
        predicted = econ_pass_cost(&ec, m + 1) + (d >= 0 && k > 0 ? ec.propose_s[d] : 0.0);
        drafts[0] = anchor;
        int T = m + 1;
        double stall0 = store_stall(s), tp = timer_now();
        session_pass p = {.tokens = drafts, .T = T, .n_logits = T};
        if (session_run(s, &p, err) != 0) {
            rc = -1;
            break;
        }
        double took = timer_now() - tp, stalled = store_stall(s) - stall0;
        econ_passed(&ec, T, took, stalled);
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
            econ_ruled(&ec, d, cls, j, ok);
            if (!ok)
                break;
            st->draft[d].by_pos_kept[j]++;
            kept++;
            econ_decided(&ec, base + 1 + j, drafts[1 + j]);
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
        econ_decided(&ec, base + 1 + kept, anchor);
        stop = emit(&em, anchor, base + 1 + kept, row);
        if (!stop && rq->step_done && rq->step_done(ud))
            stop = 1;
    }
    for (int d = 0; d < nd && !rq->fixed; d++)
        st->draft[d].ruled_unverified = (uint64_t)ec.shadow_ruled[d];
    free(seq);
    if (st->n_gen > 0)
        st->t_decode = timer_now() - em.t1;
    return rc;
}
