/* fuzz_tok_hfjson.c — the tokenizer.json parser on arbitrary bytes: an error, or a tokenizer whose
 * encoding of a fixed text decodes without a crash. */
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
    if (tok_load_hf_buf(t, "fuzz", (const char *)data, size, &err) == 0 && tok_finish(t, NULL, NULL, NULL, &err) == 0) {
        static const char text[] = "Hello, cafe\xCC\x81 123 \xE4\xB8\xAD\xE6\x96\x87 <|end|>\xFF  x\n";
        tok_ids ids = {0};
        char *s = NULL;
        size_t l;
        if (tok_encode(t, text, sizeof text - 1, TOK_SPECIAL_DEFAULT, &ids, &err) == 0 &&
            tok_decode(t, ids.v, ids.n, 0, &s, &l, &err) != 0)
            abort(); /* ids we produced must decode */
        free(s);
        tok_ids_free(&ids);
    }
    tok_free(t);
    return 0;
}
