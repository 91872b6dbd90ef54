/* fuzz_tok_chat.c — chat rendering of arbitrary JSON requests in the K3 and Qwen3 formats (thinking
 * on and off): an error or ids, never a crash; the K3 prompt always ends with its generation
 * prompt's <|sep|>. The vocabularies come from $DF_TEST_DATA (default build/testdata). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tok.h"

static tok *k3, *qw;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    if (!k3) {
        const char *root = getenv("DF_TEST_DATA"); /* tests/run.sh lays the data out there */
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/tokenizers/kimi-k3-standin", root ? root : "build/testdata");
        snprintf(b, sizeof b, "%s/tokenizers/qwen3", root ? root : "build/testdata");
        if (tok_load(&k3, a, &err) || tok_load(&qw, b, &err)) {
            fprintf(stderr, "fuzz_tok_chat: %s (run tests/testdata.sh, from the repository root)\n", err.msg);
            exit(1);
        }
    }
    json_error_t je;
    json_t *req = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!req)
        return 0;
    for (int think = 0; think < 2; think++) {
        tok_chat_opts o;
        tok_chat_opts_init(&o);
        o.thinking = think;
        tok_ids ids = {0};
        if (tok_chat_encode(k3, req, &o, &ids, &err) == 0 && (ids.n == 0 || ids.v[ids.n - 1] != 200003))
            abort();
        ids.n = 0;
        tok_chat_encode(qw, req, &o, &ids, &err);
        tok_ids_free(&ids);
    }
    json_decref(req);
    return 0;
}
