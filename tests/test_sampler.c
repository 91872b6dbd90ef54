/* test_sampler.c — greedy is the argmax (lowest id on ties); sampling is reproducible from the
 * seed, respects top-k / top-p / min-p, and follows the softmax distribution. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "engine/sampler.h"
#include "test.h"

static sampler make(float temp, int top_k, float top_p, float min_p, uint64_t seed, int V)
{
    sampler s;
    sampler_cfg c;
    sampler_cfg_default(&c);
    c.temperature = temp;
    c.top_k = top_k;
    c.top_p = top_p;
    c.min_p = min_p;
    c.seed = seed;
    errbuf err;
    if (sampler_init(&s, &c, V, &err) != 0)
        memset(&s, 0, sizeof s);
    return s;
}

TEST(sampler_greedy_ties_lowest)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f};
    sampler s = make(0.0f, 0, 1.0f, 0.0f, 1, 6);
    CHECK(sampler_pick(&s, l, 0) == 1);
    CHECK(sampler_argmax(l, 6) == 1);
    sampler_free(&s);
}

TEST(sampler_seed_reproducible)
{
    float l[50];
    for (int i = 0; i < 50; i++)
        l[i] = (float)(i % 7) * 0.3f;
    sampler a = make(1.0f, 0, 1.0f, 0.0f, 42, 50), b = make(1.0f, 0, 1.0f, 0.0f, 42, 50),
            c = make(1.0f, 0, 1.0f, 0.0f, 43, 50);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        int x = sampler_pick(&a, l, i), y = sampler_pick(&b, l, i), z = sampler_pick(&c, l, i);
        same &= x == y;
        differ |= x != z;
    }
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
    CHECK(same);
    CHECK(differ);
}

TEST(sampler_filters)
{
    /* probabilities ~ {0.5, 0.25, 0.125, ...}: logits ln 2 apart */
    float l[10];
    for (int i = 0; i < 10; i++)
        l[i] = -(float)i * 0.69314718f;
    sampler k1 = make(1.0f, 1, 1.0f, 0.0f, 5, 10), k3 = make(1.0f, 3, 1.0f, 0.0f, 5, 10);
    sampler p = make(1.0f, 0, 0.7f, 0.0f, 5, 10), mp = make(1.0f, 0, 1.0f, 0.3f, 5, 10);
    int ok_k1 = 1, ok_k3 = 1, ok_p = 1, ok_mp = 1;
    for (int i = 0; i < 500; i++) {
        ok_k1 &= sampler_pick(&k1, l, i) == 0;
        ok_k3 &= sampler_pick(&k3, l, i) < 3;
        ok_p &= sampler_pick(&p, l, i) < 2;  /* 0.5 + 0.25 >= 0.7: the nucleus is {0, 1} */
        ok_mp &= sampler_pick(&mp, l, i) < 2; /* p >= 0.3 * 0.5 keeps 0.5 and 0.25 */
    }
    sampler_free(&k1);
    sampler_free(&k3);
    sampler_free(&p);
    sampler_free(&mp);
    CHECK(ok_k1);
    CHECK(ok_k3);
    CHECK(ok_p);
    CHECK(ok_mp);
}

/* the reference nucleus: every candidate sorted (probability down, id up), cut where the mass
 * reaches top-p */
static int by_order(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

TEST(sampler_nucleus_is_the_sorted_cut)
{
    enum { V = 3000 };
    static float l[V];
    static struct sampler_cand ref[V];
    rng r;
    rng_seed(&r, 5);
    for (int round = 0; round < 40 && !test_failed(); round++) {
        for (int i = 0; i < V; i++) /* coarse values: many exact ties */
            l[i] = round % 2 ? (float)(rng_next(&r) % 16) * 0.5f : (float)rng_normal(&r) * 3.0f;
        float top_p = 0.05f + 0.9f * (float)(round % 10) / 10.0f;
        sampler s = make(0.8f, 0, top_p, 0.0f, 1, V), all = make(0.8f, 0, 1.0f, 0.0f, 1, V);
        int n = sampler_dist(&s, l), na = sampler_dist(&all, l);
        memcpy(ref, all.cand, sizeof ref[0] * (size_t)na);
        qsort(ref, (size_t)na, sizeof ref[0], by_order);
        double c = 0;
        int m = na;
        for (int i = 0; i < na; i++)
            if ((c += ref[i].p) >= top_p) {
                m = i + 1;
                break;
            }
        int same = n == m;
        for (int i = 0; same && i < m; i++)
            same = s.cand[i].id == ref[i].id && s.cand[i].p == ref[i].p;
        sampler_free(&s);
        sampler_free(&all);
        CHECKF(same, "round %d (top-p %.2f): a nucleus of %d, the sorted cut has %d or another order", round,
               (double)top_p, n, m);
    }
}

TEST(sampler_distribution)
{
    float l[4] = {0.0f, 0.0f, 1.0986123f, -100.0f}; /* exp: 1, 1, 3, ~0 -> 0.2, 0.2, 0.6, 0 */
    sampler s = make(1.0f, 0, 1.0f, 0.0f, 9, 4);
    int cnt[4] = {0};
    int N = 20000;
    for (int i = 0; i < N; i++)
        cnt[sampler_pick(&s, l, i)]++;
    sampler_free(&s);
    CHECKF(fabs(cnt[2] / (double)N - 0.6) < 0.02 && fabs(cnt[0] / (double)N - 0.2) < 0.02 && cnt[3] == 0,
           "counts %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    /* a low temperature sharpens: token 2 dominates */
    s = make(0.1f, 0, 1.0f, 0.0f, 9, 4);
    int c2 = 0;
    for (int i = 0; i < 1000; i++)
        c2 += sampler_pick(&s, l, i) == 2;
    sampler_free(&s);
    CHECKF(c2 > 990, "temperature 0.1 picked the top token %d/1000 times", c2);
}

TEST(sampler_rejects_bad_settings)
{
    sampler s;
    sampler_cfg c;
    errbuf err;
    sampler_cfg_default(&c);
    c.top_p = 0.0f;
    CHECK(sampler_init(&s, &c, 10, &err) != 0);
    sampler_cfg_default(&c);
    c.temperature = -1.0f;
    CHECK(sampler_init(&s, &c, 10, &err) != 0);
}

/* the plain scan sampler_argmax must agree with: the first index of the largest value */
static int32_t argmax_scan(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* sampler_argmax's lanes give the plain scan's index on every length (1 .. 70 and a vocabulary's),
 * with ties, signed zeros, infinities and NaN anywhere, the first element's too */
TEST(sampler_argmax_is_the_plain_scan)
{
    rng r;
    rng_seed(&r, 7);
    static float v[4099];
    int bad = 0;
    for (int t = 0; t < 20000 && !bad; t++) {
        int n = t < 70 ? t + 1 : 1 + (int)(rng_next(&r) % 4099);
        for (int i = 0; i < n; i++) {
            uint64_t k = rng_next(&r);
            float x = (float)(int)(k % 7) - 3.0f;
            switch ((k >> 8) % 40) {
            case 0: x = -0.0f; break;
            case 1: x = NAN; break;
            case 2: x = -INFINITY; break;
            case 3: x = (k >> 16) % 100 ? x : INFINITY; break;
            default: break;
            }
            v[i] = x;
        }
        int32_t a = sampler_argmax(v, n), e = argmax_scan(v, n);
        if (a != e) {
            CHECKF(0, "length %d (trial %d): %d where the scan gives %d", n, t, a, e);
            bad = 1;
        }
    }
}
