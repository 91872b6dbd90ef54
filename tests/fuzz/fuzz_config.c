/* fuzz_config.c — config.json parsing for every family on arbitrary bytes: an error or a
 * consistent hparams (ids inside the vocabulary, sizes and factors in range), never a crash. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/jsonr.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    json_t *cfg = jsonr_load_buf((const char *)data, size, "fuzz", &err);
    if (!cfg)
        return 0;
    hparams *hp = malloc(sizeof *hp);
    if (model_config(hp, cfg, "fuzz", &err) == 0) {
        if (hp->n_layers < 1 || hp->n_layers > MODEL_MAX_LAYERS || hp->hidden < 1 || hp->vocab < 1)
            abort();
        for (int i = 0; i < hp->n_eos; i++) /* every special id a config names is a token */
            if (hp->eos_ids[i] < 0 || hp->eos_ids[i] >= hp->vocab)
                abort();
        if (hp->bos_id >= hp->vocab || hp->ctx_len < 0 || !(hp->routed_scale > 0.0f && hp->routed_scale <= 1000.0f))
            abort();
    }
    free(hp);
    json_decref(cfg);
    return 0;
}
