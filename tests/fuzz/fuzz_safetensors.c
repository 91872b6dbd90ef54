/* fuzz_safetensors.c — the safetensors header parser on arbitrary bytes: it must return an
 * error or a set of tensors whose byte ranges lie inside the input, never crash or read out of
 * bounds. */
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_tensor *t = NULL;
    int n = 0;
    errbuf err;
    if (st_parse(data, size, "fuzz", 0, &t, &n, &err) == 0) {
        for (int i = 0; i < n; i++) { /* every view must be readable */
            volatile uint8_t sink = 0;
            if (t[i].end > t[i].begin)
                sink ^= t[i].data[0] ^ t[i].data[t[i].end - t[i].begin - 1];
            (void)sink;
            if (t[i].data < data || t[i].data + (t[i].end - t[i].begin) > data + size)
                abort();
        }
    }
    for (int i = 0; i < n; i++)
        free(t[i].name);
    free(t);
    return 0;
}
