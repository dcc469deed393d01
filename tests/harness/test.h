/* test.h — the awqd test harness.
 *
 * One file per feature under tests/ (CPU, `make test`) or tests/gpu/ (`make
 * test-gpu`). A test registers itself; there is no central list to edit:
 *
 *     #include "tests/harness/test.h"
 *     TEST(kv, alloc_and_free) {
 *         ASSERT_EQ_INT(kv_free_blocks(&kv), 16);
 *     }
 *
 * A failed ASSERT prints file, line and the values, and returns from the test.
 * Helpers that assert should return void and be followed by `if (test_failed())
 * return;` at the call site. TEST_SKIP("why") marks a test skipped (e.g. a
 * fixture that is not installed) — it is counted, never silently passed.
 *
 * The runner forks each test (AWQD_TEST_NOFORK=1 runs them in-process, for gdb),
 * kills one that runs past AWQD_TEST_TIMEOUT seconds (default 300), and ends with
 * the line "N passed, N failed, N skipped". Arguments filter tests by substring
 * of "suite.name". */
#ifndef AWQD_TEST_H
#define AWQD_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct test_case {
    const char *suite;
    const char *name;
    void (*fn)(void);
    struct test_case *next;
};

void test_register(struct test_case *tc);
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);
int test_failed(void);

/* Paths of things the tests need, resolved from the environment:
 *   test_fixture(rel)  -> $AWQD_FIXTURES/rel  (default: ../shared/fixtures)
 *   test_awqd_bin()    -> $AWQD_BIN           (default: build/awqd)
 *   test_tmpdir()      -> a fresh directory for this test, removed afterwards
 * Returned strings are valid until the test ends. */
const char *test_fixture(const char *rel);
const char *test_awqd_bin(void);
const char *test_tmpdir(void);
/* Runs a shell command; returns its exit status (or -1). Output into *out
 * (malloc'd, NUL-terminated; caller frees) when out != NULL. */
int test_run(const char *cmd, char **out);

/* Running maximum of errors that keeps a NaN: 1 when e should replace max
 * (e is larger, or e is a NaN and max is not); test_err_max(max, e) is the
 * new maximum. fmax and `if (!(e <= max)) max = e` both lose a NaN to a
 * later finite error, so a NaN result could pass a tolerance check. */
static inline int test_err_above(double max, double e) { return max == max && !(e <= max); }
static inline double test_err_max(double max, double e) { return test_err_above(max, e) ? e : max; }

#define TEST(suite, name)                                                       \
    static void test_##suite##_##name(void);                                    \
    __attribute__((constructor)) static void test_reg_##suite##_##name(void) {  \
        static struct test_case tc = {#suite, #name, test_##suite##_##name, 0}; \
        test_register(&tc);                                                     \
    }                                                                           \
    static void test_##suite##_##name(void)

#define TEST_SKIP(why) do { test_skip(why); return; } while (0)

#define ASSERT(cond) do { if (!(cond)) {                                        \
    test_fail(__FILE__, __LINE__, "ASSERT(%s)", #cond); return; } } while (0)

#define ASSERT_MSG(cond, ...) do { if (!(cond)) {                               \
    test_fail(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)

#define ASSERT_EQ_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); \
    if (a_ != b_) { test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld",     \
                              #a, #b, a_, b_); return; } } while (0)

#define ASSERT_STR_EQ(a, b) do { const char *a_ = (a), *b_ = (b);              \
    if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                    \
        test_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,     \
                  a_ ? a_ : "(null)", b_ ? b_ : "(null)"); return; } } while (0)

#define ASSERT_CONTAINS(hay, needle) do { const char *h_ = (hay), *n_ = (needle); \
    if (!h_ || !strstr(h_, n_)) { test_fail(__FILE__, __LINE__,                 \
        "%s contains \"%s\": got \"%.400s\"", #hay, n_, h_ ? h_ : "(null)");    \
        return; } } while (0)

#define ASSERT_NEAR(a, b, tol) do { double a_ = (a), b_ = (b), t_ = (tol);     \
    if (!(fabs(a_ - b_) <= t_)) { test_fail(__FILE__, __LINE__,                 \
        "|%s - %s| <= %g: %.9g vs %.9g", #a, #b, t_, a_, b_); return; } } while (0)

/* Propagate a failure out of a helper that asserted. */
#define ASSERT_OK_SO_FAR() do { if (test_failed()) return; } while (0)

#endif
