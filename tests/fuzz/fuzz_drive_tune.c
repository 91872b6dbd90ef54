/* fuzz_drive_tune.c — a drive tuning file (store/io.h, deltafin-drive.json) on arbitrary bytes:
 * an error, or a request size, depth and rates inside the ranges the I/O engine accepts;
 * never a crash. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/jsonr.h"
#include "store/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    errbuf err;
    json_t *j = jsonr_load_buf((const char *)data, size, "fuzz", &err);
    if (!j)
        return 0;
    io_cfg c;
    io_cfg_default(&c);
    if (io_tune_parse(&c, 3, j, "fuzz", &err) == 1 &&
        (c.drive_chunk[3] < 4096 || c.drive_chunk[3] % 4096 || c.drive_chunk[3] > (64u << 20) ||
         c.drive_depth[3] < 1 || c.drive_depth[3] > 256 || !(c.drive_best_gbps[3] >= 0) ||
         !(c.drive_cold_gbps[3] >= 0) || !(c.drive_sustained_gbps[3] >= 0)))
        abort();
    json_decref(j);
    return 0;
}
