/* test.h — the project's small test framework (one binary, tests register themselves).
 *
 *   TEST(name) { CHECK(x == 1); CHECKF(y < 2, "y was %d", y); }
 *
 * A failing CHECK records file:line and the message and ends that test; the runner
 * (test_main.c) prints one line per test and ends with "N passed, N failed".
 * Test data is laid out under build/testdata by tests/testdata.sh from tests/data (bulky cases
 * are committed as .tar.xz); $DF_TEST_DATA overrides the root. The suite never reads ../shared.
 */
#ifndef DF_TESTS_TEST_H
#define DF_TESTS_TEST_H

#include <stdio.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int test_failed(void);
/* Marks the current test skipped (the runner prints "skip name: why" and counts it in neither
 * total). For checks that cannot run here, e.g. an instruction set this CPU lacks. */
void test_skip(const char *why);
/* Path of a file under the test data folder (static buffer, valid until the next call). */
const char *test_data(const char *rel);
/* A fresh temporary directory for this test (removed by the runner at exit). */
const char *test_tmpdir(void);

#define TEST(name)                                                                                       \
    static void name(void);                                                                              \
    __attribute__((constructor)) static void reg_##name(void) { test_register(#name, name); }           \
    static void name(void)

#define CHECK(cond)                                                                                      \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            test_fail(__FILE__, __LINE__, "%s", #cond);                                                  \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

#define CHECKF(cond, ...)                                                                                \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                  \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

#endif
