/* ngram.c — the n-gram drafter (draft.h): prompt lookup over the session's own sequence.
 *
 * The guess is what followed, the last time, the longest recent n-gram of the sequence (2 to
 * NGRAM_MAX tokens) that occurred before: code and chat repeat names, lines and whole passages of
 * the prompt. The continuation runs on into the guesses themselves, so a loop of p tokens is
 * guessed k ahead, not p. Needs no model, costs one backward scan per step (a few ms at a million
 * tokens, against a pass of seconds), and proposes plain guesses (q = 1), classed by the match's
 * length (draft.h: cls). Stateless between steps, so a rejected guess or a new prompt needs
 * nothing undone.
 */
#include <stdlib.h>

#include "engine/draft.h"

enum { NGRAM_MAX = 8, NGRAM_MIN = 2 };

typedef struct ngram {
    drafter d;
} ngram;

static int ngram_propose(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **q, errbuf *err)
{
    (void)err;
    *q = NULL;
    if (n < NGRAM_MIN + 1 || k < 1)
        return 0;
    int best_len = 0, best_at = -1; /* the match ends at best_at (exclusive): what follows is proposed */
    for (int i = n - 2; i >= 0 && best_len < NGRAM_MAX; i--) {
        if (seq[i] != seq[n - 1])
            continue;
        int len = 1;
        while (len < NGRAM_MAX && i - len >= 0 && seq[i - len] == seq[n - 1 - len])
            len++;
        if (len > best_len) { /* the most recent of the longest */
            best_len = len;
            best_at = i + 1;
        }
    }
    if (best_len < NGRAM_MIN)
        return 0;
    d->cls = best_len >= 6 ? 2 : best_len >= 4 ? 1 : 0; /* a longer match repeats more surely */
    /* The continuation, read from the sequence extended by the guesses themselves: a match that
     * ends less than k tokens back (a loop, a repeated line) goes on repeating, not stop short. */
    for (int m = 0; m < k; m++)
        out[m] = best_at + m < n ? seq[best_at + m] : out[best_at + m - n];
    return k;
}

static void ngram_feedback(drafter *d, int proposed, int accepted)
{
    (void)d;
    (void)proposed;
    (void)accepted;
}

static void ngram_reset(drafter *d) { (void)d; }

static void ngram_free(drafter *d) { free(d); }

int draft_ngram_new(const draft_ctx *c, drafter **out, errbuf *err)
{
    (void)c;
    ngram *g = calloc(1, sizeof *g);
    if (!g)
        return errbuf_set(err, "n-gram drafter: out of memory");
    g->d = (drafter){.name = "ngram",
                     .propose = ngram_propose,
                     .feedback = ngram_feedback,
                     .reset = ngram_reset,
                     .free = ngram_free};
    *out = &g->d;
    return 0;
}
