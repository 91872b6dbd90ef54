/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <string.h>

#include "base/timer.h"

int gen_run(session *s, sampler *sm, const gen_req *rq, gen_token_fn cb, void *ud, gen_stats *st, errbuf *err)
{
    memset(st, 0, sizeof *st);
    if (rq->n_prompt < 1)
        return errbuf_set(err, "empty prompt: give at least one token");
    double t0 = timer_now();
    session_stats before, after;
    session_stats_get(s, &before);
    if (session_sync(s, rq->prompt, rq->n_prompt, err) != 0)
        return -1;
    session_stats_get(s, &after);
    st->n_prompt = rq->n_prompt;
    st->n_reused = (int)(after.reused - before.reused);
    st->t_prefill = timer_now() - t0;
    const float *logits = session_last_logits(s);
    double t1 = 0;
    for (int g = 0; g < rq->max_new; g++) {
        int32_t id = sampler_pick(sm, logits, session_len(s));
        st->n_gen++;
        if (g == 0) {
            t1 = timer_now();
            st->t_first = t1 - t0;
        }
        int stop = cb ? cb(ud, id) : 0;
        for (int j = 0; j < rq->n_stop; j++)
            stop |= id == rq->stop[j];
        if (stop || g + 1 == rq->max_new)
            break;
        session_pass p = {.tokens = &id, .T = 1, .n_logits = 1};
        if (session_run(s, &p, err) != 0)
            return -1;
        logits = session_logits(s, 0);
    }
    if (st->n_gen > 0)
        st->t_decode = timer_now() - t1;
    return 0;
}
