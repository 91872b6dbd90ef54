/* fuzz_tok_encode.c — encoding arbitrary bytes with the real vocabularies ($DF_TEST_DATA/tokenizers,
 * default build/testdata: tests/testdata.sh unpacks tests/data there; run from the repository root). The first byte picks the tokenizer and the special-token mode.
 * Checked: the ids' bytes are the input (NFC of it for Qwen3), decoding gives valid UTF-8, and the
 * streaming detokenizer gives exactly the decoded text. The tokenizers are loaded once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok.h"
#include "tokenizer/tok_unicode.h"

static tok *toks[3];

static void load(void)
{
    static const char *names[] = {"kimi-k3-standin", "qwen3", "cl100k"};
    const char *root = getenv("DF_TEST_DATA"); /* tests/run.sh lays the data out there */
    for (int i = 0; i < 3; i++) {
        errbuf err;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", root ? root : "build/testdata", names[i]);
        if (!toks[i] && tok_load(&toks[i], dir, &err)) {
            fprintf(stderr, "fuzz_tok_encode: %s (run tests/testdata.sh, from the repository root)\n", err.msg);
            exit(1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    load();
    int which = data[0] % 3, mode = (data[0] / 3) % 3;
    const tok *t = toks[which];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    tok_ids ids = {0};
    errbuf err;
    if (tok_encode(t, text, n, (tok_special)mode, &ids, &err))
        abort();
    size_t total = 0, l;
    for (size_t i = 0; i < ids.n; i++) {
        if (!tok_token_bytes(t, ids.v[i], &l))
            abort();
        total += l;
    }
    uint8_t *want = (uint8_t *)text, *got = malloc(total + 1);
    size_t wl = n, o = 0;
    if (which == 1 && toku_nfc((const uint8_t *)text, n, &want, &wl))
        abort();
    for (size_t i = 0; i < ids.n; i++) {
        const uint8_t *b = tok_token_bytes(t, ids.v[i], &l);
        memcpy(got + o, b, l);
        o += l;
    }
    /* with specials matched, the special's name stands for its text: still the same bytes */
    if (o != wl || memcmp(got, want, wl))
        abort();
    char *dec;
    size_t dl;
    if (tok_decode(t, ids.v, ids.n, 0, &dec, &dl, &err))
        abort();
    for (size_t i = 0; i < dl;) {
        int cl;
        if (toku_next((const uint8_t *)dec + i, (const uint8_t *)dec + dl, &cl) == TOKU_INVALID)
            abort();
        i += (size_t)cl;
    }
    tok_stream s;
    if (tok_stream_init(&s, t, 0, &err))
        abort();
    char *acc = malloc(3 * total + 16);
    size_t al = 0;
    for (size_t i = 0; i < ids.n; i++) {
        const char *p = tok_stream_feed(&s, ids.v[i], &l);
        memcpy(acc + al, p, l);
        al += l;
    }
    const char *p = tok_stream_flush(&s, &l);
    memcpy(acc + al, p, l);
    al += l;
    if (al != dl || memcmp(acc, dec, dl))
        abort();
    tok_stream_free(&s);
    free(acc);
    free(dec);
    free(got);
    if (want != (uint8_t *)text)
        free(want);
    tok_ids_free(&ids);
    return 0;
}
