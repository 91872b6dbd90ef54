/* test_main.c — runs every registered test (or those whose name contains argv[1]) and prints
 * one line per test and a closing "N passed, N failed". Exit status 0 only if none failed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/timer.h"
#include "test.h"

enum { MAX_TESTS = 1024 };
static struct {
    const char *name;
    test_fn fn;
} tests[MAX_TESTS];
static int ntests;
static int cur_failed, cur_skipped;
static char skip_msg[256];
static char cur_msg[1024];
static char tmpdir[256];

void test_register(const char *name, test_fn fn)
{
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    if (cur_failed)
        return;
    cur_failed = 1;
    int n = snprintf(cur_msg, sizeof cur_msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cur_msg + n, sizeof cur_msg - (size_t)n, fmt, ap);
    va_end(ap);
}

int test_failed(void) { return cur_failed; }

void test_skip(const char *why)
{
    cur_skipped = 1;
    snprintf(skip_msg, sizeof skip_msg, "%s", why);
}

const char *test_data(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("DF_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "build/testdata", rel); /* tests/testdata.sh */
    return buf;
}

const char *test_tmpdir(void)
{
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/deltafin-test-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return tmpdir;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int main(int argc, char **argv)
{
    int pass = 0, fail = 0;
    (void)cmp;
    for (int i = 0; i < ntests; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1]))
            continue;
        cur_failed = cur_skipped = 0;
        cur_msg[0] = 0;
        double t0 = timer_now();
        tests[i].fn();
        double dt = timer_now() - t0;
        if (cur_skipped && !cur_failed) {
            printf("skip %s: %s\n", tests[i].name, skip_msg);
        } else if (cur_failed) {
            fail++;
            printf("FAIL %s: %s\n", tests[i].name, cur_msg);
        } else {
            pass++;
            printf("ok   %s (%.2fs)\n", tests[i].name, dt);
        }
        fflush(stdout);
    }
    if (tmpdir[0]) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
