/* fuzz_stream_journal.c — a streamed install's journal (engine/stream.h, stream_journal_scan) on
 * arbitrary bytes: only well-formed lines come out, each with a kind B, V or R and a name without
 * spaces or newlines; never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stream.h"

static void on(void *ctx, char kind, uint64_t xxh3, const char *name)
{
    (void)xxh3;
    if ((kind != 'B' && kind != 'V' && kind != 'R') || !name[0] || strchr(name, ' ') || strchr(name, '\n'))
        abort();
    (*(int *)ctx)++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int n = 0;
    stream_journal_scan((const char *)data, size, on, &n);
    return 0;
}
