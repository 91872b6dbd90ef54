/* fuzz_api.c — the server's request reader (server/api.h) on arbitrary bytes: the first byte picks
 * the route (chat, completion, tokenize, detokenize, debug logits), the rest is the body. Either a 4xx/5xx error
 * with a message and an error object that is valid JSON, or a request whose every field is within
 * its documented range; never a crash. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    api_kind kind = (api_kind)(data[0] % 5);
    api_req r;
    api_err e;
    if (api_req_parse(kind, (const char *)data + 1, size - 1, "default", &r, &e) != 0) {
        assert(e.status >= 400 && e.status < 600 && e.msg[0] && e.type);
        char *j = api_err_json(&e);
        assert(j);
        json_t *back = json_loads(j, 0, NULL);
        assert(back && json_is_object(json_object_get(back, "error")));
        json_decref(back);
        free(j);
        assert(!r.body && !r.chat && !r.ids);
        return 0;
    }
    assert(r.body && r.kind == kind);
    assert(r.temperature >= 0 && r.temperature <= 2 && r.top_p > 0 && r.top_p <= 1 && r.min_p >= 0 && r.min_p <= 1);
    assert(r.n_stop >= 0 && r.n_stop <= API_MAX_STOP);
    for (int i = 0; i < r.n_stop; i++)
        assert(r.stop[i] && r.stop_len[i] > 0 && strlen(r.stop[i]) <= r.stop_len[i]);
    assert(r.top_logprobs >= 0 && r.top_logprobs <= API_MAX_TOP_LOGPROBS);
    if (kind == API_CHAT)
        assert(json_array_size(json_object_get(r.chat, "messages")) > 0);
    if (kind == API_COMPLETION)
        assert(r.prompt || r.n_ids > 0);
    for (int i = 0; i < r.n_ids; i++)
        assert(r.ids[i] >= 0);
    api_req_free(&r);
    return 0;
}
