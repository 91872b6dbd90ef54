/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <string.h>

#include "base/timer.h"

int gen_run(session *s, sampler *sm, const gen_req *rq, float *logits, gen_token_fn cb, void *ud, gen_stats *st,
            errbuf *err)
{
    memset(st, 0, sizeof *st);
    if (rq->n_prompt < 1)
        return errbuf_set(err, "empty prompt: give at least one token");
    double t0 = timer_now();
    int chunk = rq->chunk > 0 && rq->chunk < s->max_T ? rq->chunk : s->max_T;
    for (int i = 0; i < rq->n_prompt; i += chunk) {
        int n = rq->n_prompt - i < chunk ? rq->n_prompt - i : chunk;
        int last = i + n == rq->n_prompt;
        if (session_forward(s, rq->prompt + i, n, last ? logits : NULL, 0, err) != 0)
            return -1;
    }
    st->n_prompt = rq->n_prompt;
    st->t_prefill = timer_now() - t0;
    double t1 = 0;
    for (int g = 0; g < rq->max_new; g++) {
        int32_t id = sampler_pick(sm, logits);
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
        if (session_forward(s, &id, 1, logits, 0, err) != 0)
            return -1;
    }
    if (st->n_gen > 0)
        st->t_decode = timer_now() - t1;
    return 0;
}
