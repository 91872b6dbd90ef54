/* fuzz_hub_revision.c — the hub's revision answer (hub/hub.h, hub_repo_parse) on arbitrary bytes:
 * an error, or a resolution whose commit is 40 hex, whose paths stay inside their folder and are
 * sorted and unique, and whose every file has a hash; never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    hub_repo r;
    if (hub_repo_parse((const char *)data, size, "fuzz/repo", &r, &err) != 0)
        return 0;
    if (strlen(r.commit) != 40)
        abort();
    for (int i = 0; i < r.n_files; i++) {
        const hub_file *f = &r.files[i];
        if (!f->path[0] || f->path[0] == '/' || strstr(f->path, "..") == f->path || (!f->sha256[0] && !f->blob_id[0]))
            abort();
        if (i && strcmp(r.files[i - 1].path, f->path) >= 0)
            abort();
        if (hub_repo_file(&r, f->path) != f)
            abort();
    }
    hub_repo_free(&r);
    return 0;
}
