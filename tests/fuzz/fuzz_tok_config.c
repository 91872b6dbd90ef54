/* fuzz_tok_config.c — tokenizer_config.json / config.json handling on arbitrary bytes: special
 * names for Kimi's reserved slots, chat template and format detection, stop ids; then a chat is
 * rendered in whatever format was detected. Errors are fine, crashes are not. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

/* A small rank file: the 256 bytes, then a few merges. */
static char *ranks(size_t *len)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static const char *merges[] = {"ab", "abc", "<|", "|>", "Hi", " the"};
    char *t = malloc(8192), *p = t;
    for (int b = 0; b < 256; b++)
        p += sprintf(p, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    for (int m = 0; m < 6; m++) {
        const uint8_t *s = (const uint8_t *)merges[m];
        size_t n = strlen(merges[m]);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
            *p++ = b64[w >> 18];
            *p++ = b64[(w >> 12) & 63];
            *p++ = i + 1 < n ? b64[(w >> 6) & 63] : '=';
            *p++ = i + 2 < n ? b64[w & 63] : '=';
        }
        p += sprintf(p, " %d\n", 256 + m);
    }
    *len = (size_t)(p - t);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    json_error_t je;
    json_t *cfg = json_loadb((const char *)data, size, 0, &je);
    if (!cfg)
        return 0;
    size_t len;
    char *text = ranks(&len);
    tok *t = tok_new();
    if (text && t && tok_load_tiktoken_buf(t, "ranks", text, len, NULL, NULL, cfg, "fuzz", &err) == 0 &&
        tok_finish(t, cfg, cfg, json_string_value(json_object_get(cfg, "chat_template")), &err) == 0) {
        json_t *req = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
                                 "\"content\": \"Hi <|im_end|>\"}, {\"role\": \"assistant\", \"content\": \"a\", "
                                 "\"tool_calls\": [{\"id\": \"c\", \"function\": {\"name\": \"f\", \"arguments\": "
                                 "\"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c\", \"content\": \"r\"}], "
                                 "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
                                 0, &je);
        tok_ids ids = {0};
        tok_chat_encode(t, req, NULL, &ids, &err);
        const int32_t *st;
        int ns = tok_stop_ids(t, &st);
        for (int i = 0; i < ns; i++)
            if (st[i] < 0 || st[i] >= tok_vocab_size(t))
                abort();
        tok_ids_free(&ids);
        json_decref(req);
    }
    tok_free(t);
    free(text);
    json_decref(cfg);
    return 0;
}
