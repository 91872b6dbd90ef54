/* fuzz_tok_rank.c — the tiktoken rank file parser (Kimi layout) on arbitrary bytes: an error, or a
 * tokenizer that encodes and decodes (token bytes concatenate back to the text), never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    tok *t = tok_new();
    if (!t)
        return 0;
    if (tok_load_tiktoken_buf(t, "fuzz", (const char *)data, size, NULL, NULL, NULL, NULL, &err) == 0 &&
        tok_finish(t, NULL, NULL, NULL, &err) == 0) {
        static const char text[] = "Hello, w\xC3\xB6rld! 123 \xE4\xB8\xAD\xE6\x96\x87 <|reserved_token_300|>\xFF";
        tok_ids ids = {0};
        if (tok_encode(t, text, sizeof text - 1, TOK_SPECIAL_NONE, &ids, &err))
            abort();
        size_t n = 0, l;
        for (size_t i = 0; i < ids.n; i++) {
            const uint8_t *b = tok_token_bytes(t, ids.v[i], &l);
            if (!b || n + l > sizeof text - 1 || memcmp(b, text + n, l))
                abort();
            n += l;
        }
        if (n != sizeof text - 1)
            abort();
        tok_ids_free(&ids);
    }
    tok_free(t);
    return 0;
}
