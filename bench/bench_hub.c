/* bench_hub.c — the hub client's download rate (hub/hub.h): one repo fetched into an empty folder
 * with N files in flight, every byte hashed and checked as in `deltafin setup`.
 *
 *   build/bench/bench_hub ENDPOINT REPO DIR PARALLEL
 *
 * Prints one line: files, bytes, seconds, GB/s. bench/bench_hub.sh runs it against
 * tests/hub/testhub.py beside a curl of one file (the link's rate through the same hub).
 */
#include <stdio.h>
#include <stdlib.h>

#include "hub/hub.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: bench_hub ENDPOINT REPO DIR PARALLEL\n");
        return 2;
    }
    hub_opts o;
    hub_opts_default(&o);
    o.endpoint = argv[1];
    o.parallel = atoi(argv[4]);
    o.progress = 0;
    errbuf err;
    hub *h;
    hub_repo r;
    hub_stats st;
    if (hub_init(&h, &o, &err) || hub_repo_resolve(h, argv[2], "main", &r, &err)) {
        fprintf(stderr, "bench_hub: %s\n", err.msg);
        return 1;
    }
    int rc = hub_download(h, &r, NULL, 0, argv[3], &st, &err);
    if (rc)
        fprintf(stderr, "bench_hub: %s\n", err.msg);
    else
        printf("parallel %d: %d files, %.3f GB in %.2f s, %.2f GB/s (%d retries)\n", o.parallel, st.files_fetched,
               (double)st.bytes_fetched / 1e9, st.seconds, (double)st.bytes_fetched / 1e9 / st.seconds, st.retries);
    hub_repo_free(&r);
    hub_free(h);
    return rc ? 1 : 0;
}
