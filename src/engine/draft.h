/* draft.h — drafters: they guess the tokens the target will decide next. The target checks every
 * guess in one verify pass (generate.c), so a drafter only ever changes how fast tokens come,
 * never which: greedy output is the target's argmax at every position, sampled output is
 * distributed as the target's (speculative sampling), and the logits of every emitted position are
 * the bits a plain decode computes.
 *
 * A drafter is an adapter file in src/engine/drafters/ behind this interface:
 *   - ngram  (drafters/ngram.c): the continuation of the longest recent n-gram of the sequence that
 *            occurred before, prompt lookup included; no model;
 *   - qwen   (drafters/qwen.c):  a Qwen3 model with its own tokenizer run as a second engine; its
 *            text is re-encoded with the target's tokenizer and only whole target tokens proposed;
 *   - dspark (drafters/dspark.c): a DSpark block drafter reading the target's taps.
 * The caller owns the drafter; it is driven from the thread that drives the target.
 */
#ifndef DF_ENGINE_DRAFT_H
#define DF_ENGINE_DRAFT_H

#include <stdint.h>

#include "engine/engine.h"

enum { DRAFT_CLASSES = 3 };

typedef struct drafter drafter;

struct drafter {
    const char *name;
    /* Up to k tokens that would follow seq[0..n) (the prompt and every token decided so far; the
     * last one the target has not run yet). Returns how many (0: no guess now). *q gets the
     * drafter's distribution of each [count][vocab] when the guesses were sampled from one, or
     * NULL when they are plain guesses (probability 1 each). */
    int (*propose)(drafter *d, const int32_t *seq, int n, int k, int32_t *out, const float **q, errbuf *err);
    /* How the target ruled on the last proposal: the first `accepted` of `proposed` were kept. */
    void (*feedback)(drafter *d, int proposed, int accepted);
    /* The target layers whose taps (the AttnRes prefix leaving them) the drafter reads, and where
     * they go: every pass of the target session hands them over (engine.h: session_set_tap_sink).
     * n_taps 0: none. */
    const int *taps;
    int n_taps;
    void (*on_taps)(void *d, int pos0, int T, const float *taps);
    void (*reset)(drafter *d);
    void (*free)(drafter *d);
    /* Optional (NULL: nothing to do): a new request on the same drafter, a long-lived one (the
     * server's): the chat it continues (messages, or NULL for raw completion) and whether its
     * prompt opened the thinking channel. */
    int (*begin)(drafter *d, const json_t *messages, int thinking, errbuf *err);
    /* Optional (NULL: unknown, learnt by asking): what an ask would cost before the economics has
     * measured one, in plain target passes of one position: the return value for k guesses once
     * the drafter has caught up with the sequence, *once the extra cost of catching up with the
     * n - (what it has seen) tokens it has not (a model drafter's first ask prefills the whole
     * prompt in its own model; DSpark makes the context rows of the taps waiting). A model drafter
     * estimates it from its active weights against the target's (engine_active_bytes). */
    double (*cost)(drafter *d, int n, int k, double *once);
    /* Set by propose: the class of its guesses (0 .. DRAFT_CLASSES-1), where the drafter knows
     * some guesses are likelier than others (the n-gram one: by the length of its match). The
     * economics measures acceptance per class. 0 for a drafter that does not tell. */
    int cls;
};

/* What generate.c needs to know of the request to make a drafter for it. */
typedef struct draft_ctx {
    engine *target;
    int context;              /* positions the target's session holds: state is reserved for them up
                                 front (within reason), so a decode step allocates nothing (0: grown
                                 on demand) */
    const json_t *messages;   /* a chat request (the Qwen drafter renders it in its own format), or NULL */
    int thinking;             /* the chat's prompt opened the thinking channel */
} draft_ctx;

int draft_ngram_new(const draft_ctx *c, drafter **out, errbuf *err);
/* dir: a Qwen3 model folder with tokenizer.json */
int draft_qwen_new(const draft_ctx *c, const char *dir, drafter **out, errbuf *err);
/* dir: a k3_dspark folder (its tensors only: embedding and lm_head are the target's) */
int draft_dspark_new(const draft_ctx *c, const char *dir, drafter **out, errbuf *err);

/* The drafting options of every generating subcommand (run, serve): --draft, --draft-model,
 * --draft-max. draft_opts_parse consumes argv[*i] as engine_opts_parse does (1 consumed, 0 not a
 * drafting option, -1 bad value, in err). */
typedef struct draft_opts {
    const char *want;  /* "none", "ngram", "qwen", "dspark", "auto" (default) */
    const char *model; /* a drafter model folder, or NULL: those beside the target (DIR-dspark,
                          DIR-qwen3-drafter) */
    int max;           /* the most guesses of a step (default GEN_MAX_DRAFT, 31) */
} draft_opts;
void draft_opts_default(draft_opts *o);
int draft_opts_parse(draft_opts *o, int argc, char **argv, int *i, errbuf *err);
extern const char DRAFT_OPTS_HELP[];
/* The drafters o names for the target of c into out[0..*n) (at most GEN_MAX_DRAFTERS): the
 * caller frees them with draft_close. */
int draft_open(const draft_opts *o, const draft_ctx *c, drafter **out, int *n, errbuf *err);
void draft_close(drafter **d, int n);
/* Calls every drafter's begin (see struct drafter) for a new request. */
int draft_begin(drafter *const *d, int n, const json_t *messages, int thinking, errbuf *err);

/* The Qwen drafter's bridge back to the target's tokens: text[0..len) is the bytes of the target's
 * tokens tail[0..have) followed by the draft's text. Up to k whole target tokens that the draft's
 * text adds after the tail into out: the re-encoding must begin with the tail, and every token
 * proposed ends inside tok_stable_len's prefix, so no continuation of the text re-tokenizes it.
 * Returns the count (0: no guess), -1 on error. scratch: the caller's, reused. */
int draft_bridge(const tok *tt, const int32_t *tail, int have, const char *text, size_t len, int k, tok_ids *scratch,
                 int32_t *out, errbuf *err);

/* The DSpark drafter's whole block for seq[0..n) (its taps handed over by the target session):
 * the block's drafts into ids and their logits [block_size][vocab] (U_k plus the Markov bias of the
 * chain), for checking the engine against the drafter's training code. Returns block_size, 0
 * without context. */
int draft_dspark_logits(drafter *d, const int32_t *seq, int n, float *logits, int32_t *ids, errbuf *err);

#endif
