/* fuzz_config.c — config.json parsing for every family on arbitrary bytes: an error or a
 * consistent hparams, never a crash. */
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
    }
    free(hp);
    json_decref(cfg);
    return 0;
}
