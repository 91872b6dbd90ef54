/* sampler.c — see sampler.h. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sampler_cfg_default(sampler_cfg *c)
{
    c->temperature = 0.0f;
    c->top_k = 0;
    c->top_p = 1.0f;
    c->min_p = 0.0f;
    c->seed = 0;
}

int sampler_init(sampler *s, const sampler_cfg *cfg, int vocab, errbuf *err)
{
    memset(s, 0, sizeof *s);
    if (!(cfg->temperature >= 0.0f) || !(cfg->top_p > 0.0f && cfg->top_p <= 1.0f) ||
        !(cfg->min_p >= 0.0f && cfg->min_p <= 1.0f) || cfg->top_k < 0)
        return errbuf_set(err, "sampling: need temperature >= 0, 0 < top-p <= 1, 0 <= min-p <= 1, top-k >= 0");
    s->cfg = *cfg;
    s->vocab = vocab;
    rng_seed(&s->r, cfg->seed);
    s->cand = malloc(sizeof *s->cand * (size_t)vocab);
    if (!s->cand) {
        sampler_free(s);
        return errbuf_set(err, "sampling: out of memory");
    }
    return 0;
}

void sampler_free(sampler *s)
{
    free(s->cand);
    memset(s, 0, sizeof *s);
}

int32_t sampler_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int by_prob(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

int32_t sampler_pick(sampler *s, const float *logits)
{
    int V = s->vocab;
    if (s->cfg.temperature == 0.0f)
        return sampler_argmax(logits, V);
    float mx = logits[sampler_argmax(logits, V)], inv = 1.0f / s->cfg.temperature;
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        sum += expf((logits[i] - mx) * inv);
    /* candidates: tokens with non-zero mass at or above the min-p floor, by probability */
    int n = 0;
    float floor_p = s->cfg.min_p * (float)(1.0 / sum); /* the top token has probability 1/sum */
    for (int i = 0; i < V; i++) {
        float p = (float)(expf((logits[i] - mx) * inv) / sum);
        if (p > 0.0f && p >= floor_p) {
            s->cand[n].p = p;
            s->cand[n].id = i;
            n++;
        }
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_prob);
    if (s->cfg.top_k > 0 && n > s->cfg.top_k)
        n = s->cfg.top_k;
    if (s->cfg.top_p < 1.0f) {
        double c = 0.0;
        for (int i = 0; i < n; i++) {
            c += s->cand[i].p;
            if (c >= s->cfg.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->cand[i].p;
    double u = (double)rng_uniform(&s->r) * total, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += s->cand[i].p;
        if (u < c)
            return s->cand[i].id;
    }
    return s->cand[n > 0 ? n - 1 : 0].id;
}
