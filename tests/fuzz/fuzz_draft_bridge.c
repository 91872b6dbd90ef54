/* fuzz_draft_bridge.c — the Qwen drafter's bridge back to the target's tokens (draft.h:
 * draft_bridge) over arbitrary texts, with the bundled K3 tokenizer and the Qwen3 drafter's (run
 * from the repository root). Byte 0 picks the tokenizer, bytes 1 and 2 cut the rest into the
 * target's text so far, the draft's text and a continuation. Checked: no crash; the proposals
 * spell a prefix of the draft's text; and the target's tokenizer, given the text with the
 * continuation, begins with the tail's tokens and the proposals (whole tokens only). The Qwen3
 * tokenizer's NFC and the K3 one's slicing are covered by tok_stable_len refusing (no guess). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/draft.h"
#include "tokenizer/tok.h"

static tok *toks[2];

static void load(void)
{
    static const char *const dirs[2] = {"models/default", "models/default-qwen3-drafter"};
    for (int i = 0; i < 2; i++) {
        errbuf err;
        if (!toks[i] && tok_load(&toks[i], dirs[i], &err)) {
            fprintf(stderr, "fuzz_draft_bridge: %s (run from the repository root)\n", err.msg);
            exit(1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    load();
    const tok *t = toks[data[0] & 1];
    const char *s = (const char *)data + 3;
    size_t n = size - 3, a = n ? data[1] % (n + 1) : 0, b = a + (n - a ? data[2] % (n - a + 1) : 0);
    tok_ids tail = {0}, sc = {0}, full = {0};
    int32_t out[16];
    errbuf err;
    if (tok_encode(t, s, a, TOK_SPECIAL_NONE, &tail, &err) == 0) {
        /* the tail as the target has it: the bytes of its tokens, then the draft */
        char *text = malloc(n + 1);
        size_t at = 0;
        for (size_t i = 0; i < tail.n; i++) {
            size_t l;
            const uint8_t *p = tok_token_bytes(t, tail.v[i], &l);
            memcpy(text + at, p, l);
            at += l;
        }
        memcpy(text + a, s + a, n - a);
        /* (text a pre-tokenizer drops is no tail the target could hold) */
        int m = at == a && !memcmp(text, s, a) ? draft_bridge(t, tail.v, (int)tail.n, text, b, 16, &sc, out, &err) : 0;
        if (m > 0) {
            size_t end = a;
            for (int i = 0; i < m; i++) {
                size_t l;
                const uint8_t *p = tok_token_bytes(t, out[i], &l);
                if (!p || end + l > b || memcmp(p, text + end, l))
                    abort(); /* a proposal that is not the draft's own text */
                end += l;
            }
            if (tok_encode(t, text, n, TOK_SPECIAL_NONE, &full, &err) == 0 &&
                (full.n < tail.n + (size_t)m || (tail.n && memcmp(full.v, tail.v, sizeof(int32_t) * tail.n)) ||
                 memcmp(full.v + tail.n, out, sizeof(int32_t) * (size_t)m)))
                abort(); /* what followed re-tokenized a proposal */
        }
        free(text);
    }
    tok_ids_free(&tail);
    tok_ids_free(&sc);
    tok_ids_free(&full);
    return 0;
}
