/* fuzz_manifest.c — a DFSP manifest (store/dfsp.h) on arbitrary bytes: an error, or a manifest
 * whose every copy lies inside its pack and every tensor inside its blob; never a crash. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/jsonr.h"
#include "store/dfsp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    json_t *man = jsonr_load_buf((const char *)data, size, "fuzz", &err);
    if (!man)
        return 0;
    dfsp_manifest *m = malloc(sizeof *m);
    if (m && dfsp_manifest_parse(man, "fuzz", m, &err) == 0) {
        for (int b = 0; b < m->nb; b++) {
            const dfsp_blob *x = &m->b[b];
            for (int c = 0; c < x->ncopies; c++)
                if (x->copy[c].file < 0 || x->copy[c].file >= m->npacks ||
                    x->copy[c].off + blob_padded(x->size) > m->pack_size[x->copy[c].file])
                    abort();
            if (x->first_tensor < 0 || x->first_tensor + x->ntensors > m->nt)
                abort();
            for (int i = 0; i < x->ntensors; i++) {
                const dfsp_tensor *t = &m->t[x->first_tensor + i];
                if (!t->name || t->off + t->len > x->size)
                    abort();
            }
        }
        dfsp_manifest_free(m);
    }
    free(m);
    json_decref(man);
    return 0;
}
