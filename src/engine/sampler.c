/* sampler.c — see sampler.h. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kmath.h"

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
    if (!(cfg->temperature >= 0.0f) || (cfg->temperature > 0.0f && !isfinite(1.0f / cfg->temperature)) ||
        !(cfg->top_p > 0.0f && cfg->top_p <= 1.0f) ||
        !(cfg->min_p >= 0.0f && cfg->min_p <= 1.0f) || cfg->top_k < 0)
        return errbuf_set(err, "sampling: need temperature 0 or one with a finite reciprocal, 0 < top-p <= 1, "
                                "0 <= min-p <= 1, top-k >= 0");
    s->cfg = *cfg;
    s->vocab = vocab;
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

/* The first index of the largest value (NaN never larger; a NaN at 0 wins, as in a plain scan that
 * keeps the first and replaces it only by a larger value). A plain scan that reads v[best] again
 * at every step chains each comparison to the last (17 us for 4096 logits, a token's, on this
 * VM's Xeon: 2% of the bundled model's decode); here 16 lanes each keep the first index of their
 * own largest, from v[0], and the lanes' largest, lowest index on ties, is the answer (2.6 us
 * with SSE2, 1.1 with AVX-512: bench/results/drafting.md, 2026-12-06, twelfth session). */
int32_t sampler_argmax(const float *v, int n)
{
    enum { L = 16 };
    float lm[L];
    int li[L], i = 0;
    if (n <= 0)
        return 0;
    for (int j = 0; j < L; j++)
        lm[j] = v[0], li[j] = 0;
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; j++) {
            float x = v[i + j];
            int up = x > lm[j];
            lm[j] = up ? x : lm[j];
            li[j] = up ? i + j : li[j];
        }
    int b = 0;
    for (int j = 1; j < L; j++)
        if (lm[j] > lm[b] || (lm[j] == lm[b] && li[j] < li[b]))
            b = j;
    float m = lm[b];
    int best = li[b];
    for (; i < n; i++)
        if (v[i] > m)
            m = v[i], best = i;
    return best;
}

/* candidate order: higher probability first, lower id on ties */
static int before(const struct sampler_cand *x, const struct sampler_cand *y)
{
    return x->p > y->p || (x->p == y->p && x->id < y->id);
}

/* A heap whose root is the candidate that sorts last (first = 0: to keep the top-k) or first
 * (first = 1: to take candidates off in order). */
static void sift(struct sampler_cand *c, int n, int i, int first)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && (first ? before(&c[l], &c[m]) : before(&c[m], &c[l])))
            m = l;
        if (r < n && (first ? before(&c[r], &c[m]) : before(&c[m], &c[r])))
            m = r;
        if (m == i)
            return;
        struct sampler_cand t = c[i];
        c[i] = c[m];
        c[m] = t;
        i = m;
    }
}

/* The nucleus without sorting the tail: candidates come off a heap in candidate order until their
 * mass reaches top_p, then sit in order at c[0..m). The set and order are what sorting all n and
 * cutting would give (the order is total: ties go by id). Returns m. */
static int nucleus(struct sampler_cand *c, int n, double top_p)
{
    for (int i = n / 2 - 1; i >= 0; i--)
        sift(c, n, i, 1);
    double cum = 0.0;
    int m = 0;
    while (m < n) { /* the next in order goes to c[n - 1 - m] */
        int e = n - 1 - m;
        struct sampler_cand t = c[0];
        c[0] = c[e];
        c[e] = t;
        sift(c, e, 0, 1);
        m++;
        cum += t.p;
        if (cum >= top_p)
            break;
    }
    for (int i = 0; i < m / 2; i++) { /* c[n-m..n) holds them last-first: reverse, then to the front */
        struct sampler_cand t = c[n - m + i];
        c[n - m + i] = c[n - 1 - i];
        c[n - 1 - i] = t;
    }
    memmove(c, c + (n - m), sizeof *c * (size_t)m);
    return m;
}

/* In-place heapsort into candidate order (no allocation, unlike qsort in glibc). */
static void sort_cands(struct sampler_cand *c, int n)
{
    for (int i = n / 2 - 1; i >= 0; i--)
        sift(c, n, i, 0);
    for (int e = n - 1; e > 0; e--) {
        struct sampler_cand t = c[0];
        c[0] = c[e];
        c[e] = t;
        sift(c, e, 0, 0);
    }
}

int sampler_dist(sampler *s, const float *logits)
{
    int V = s->vocab;
    int32_t best = sampler_argmax(logits, V);
    s->n = 1;
    s->total = 1.0;
    s->cand[0].id = best;
    s->cand[0].p = 1.0f;
    if (s->cfg.temperature == 0.0f)
        return 1;
    float mx = logits[best], inv = 1.0f / s->cfg.temperature;
    if (!isfinite(mx))
        return 1; /* degenerate logits: nothing to sample from but the argmax */
    /* every token's unnormalised probability once, then the candidates in place: tokens with
     * non-zero mass at or above the min-p floor */
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        float e = km_expf((logits[i] - mx) * inv);
        s->cand[i].p = e;
        sum += e;
    }
    if (!(sum >= 1.0) || !isfinite(sum)) {
        s->cand[0].id = best;
        s->cand[0].p = 1.0f;
        return 1;
    }
    int n = 0;
    float floor_p = s->cfg.min_p * (float)(1.0 / sum); /* the top token has probability 1/sum */
    for (int i = 0; i < V; i++) {
        float p = (float)(s->cand[i].p / sum);
        if (p > 0.0f && p >= floor_p) {
            s->cand[n].p = p;
            s->cand[n].id = i;
            n++;
        }
    }
    if (n == 0) {
        s->cand[0].id = best;
        s->cand[0].p = 1.0f;
        return 1;
    }
    if (!(s->cfg.top_k > 0 && n > s->cfg.top_k) && s->cfg.top_p < 1.0f) {
        n = nucleus(s->cand, n, s->cfg.top_p);
    } else if ((s->cfg.top_k > 0 && n > s->cfg.top_k) || s->cfg.top_p < 1.0f) {
        if (s->cfg.top_k > 0 && n > s->cfg.top_k) { /* keep the top-k with a heap of k, then sort them */
            int k = s->cfg.top_k;
            for (int i = k / 2 - 1; i >= 0; i--)
                sift(s->cand, k, i, 0);
            for (int i = k; i < n; i++)
                if (before(&s->cand[i], &s->cand[0])) {
                    s->cand[0] = s->cand[i];
                    sift(s->cand, k, 0, 0);
                }
            n = k;
        }
        sort_cands(s->cand, n);
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
    }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->cand[i].p;
    s->n = n;
    s->total = total;
    return n;
}

double sampler_prob(const sampler *s, int32_t id)
{
    for (int i = 0; i < s->n; i++)
        if (s->cand[i].id == id)
            return (double)s->cand[i].p / s->total;
    return 0.0;
}

int32_t sampler_draw(const sampler *s, float u01)
{
    double u = (double)u01 * s->total, c = 0.0;
    for (int i = 0; i < s->n; i++) {
        c += s->cand[i].p;
        if (u < c)
            return s->cand[i].id;
    }
    return s->cand[s->n - 1].id;
}

int32_t sampler_draw_residual(const sampler *s, const float *q, int32_t point, float u01)
{
    /* r(x) = max(p(x) - q(x), 0) over the candidates (p is 0 elsewhere, and so is r) */
    double total = 0.0;
    for (int i = 0; i < s->n; i++) {
        double p = (double)s->cand[i].p / s->total;
        double qx = q ? (double)q[s->cand[i].id] : s->cand[i].id == point ? 1.0 : 0.0;
        total += p > qx ? p - qx : 0.0;
    }
    if (!(total > 0.0)) /* p <= q everywhere: cannot be rejected; the best candidate */
        return s->cand[0].id;
    double u = (double)u01 * total, c = 0.0;
    int last = 0;
    for (int i = 0; i < s->n; i++) {
        double p = (double)s->cand[i].p / s->total;
        double qx = q ? (double)q[s->cand[i].id] : s->cand[i].id == point ? 1.0 : 0.0;
        if (p > qx) {
            c += p - qx;
            last = i;
            if (u < c)
                return s->cand[i].id;
        }
    }
    return s->cand[last].id;
}

int32_t sampler_pick(sampler *s, const float *logits, int64_t pos)
{
    sampler_dist(s, logits);
    if (s->cfg.temperature == 0.0f)
        return s->cand[0].id;
    return sampler_draw(s, rng_uniform_at(s->cfg.seed, (uint64_t)pos, SAMPLER_STREAM_PICK));
}
