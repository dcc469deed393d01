/* runner.c — main() of the test binaries: runs every registered test (see
 * test.h), each in a forked child with a timeout, and prints the summary line
 * "N passed, N failed, N skipped" that CI reads. */
#include "tests/harness/test.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct test_case *g_tests;
static int g_failed;  /* in the process running the test */
static int g_skipped;
static char g_tmpdir[512];
static char g_pathbuf[8][1024];
static int g_pathidx;

enum { EXIT_PASS = 0, EXIT_FAIL = 1, EXIT_SKIP = 77 };

void test_register(struct test_case *tc) {
    /* append, so tests run in file order within a file */
    struct test_case **p = &g_tests;
    while (*p) p = &(*p)->next;
    *p = tc;
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    g_failed = 1;
}

void test_skip(const char *why) {
    fprintf(stderr, "    skipped: %s\n", why);
    g_skipped = 1;
}

int test_failed(void) { return g_failed; }

static char *pathbuf(void) { return g_pathbuf[g_pathidx++ % 8]; }

const char *test_fixture(const char *rel) {
    const char *root = getenv("AWQD_FIXTURES");
    char *b = pathbuf();
    snprintf(b, 1024, "%s/%s", root && *root ? root : "../shared/fixtures", rel);
    return b;
}

const char *test_awqd_bin(void) {
    const char *b = getenv("AWQD_BIN");
    return b && *b ? b : "build/awqd";
}

const char *test_tmpdir(void) {
    if (!g_tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s/awqd-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_tmpdir)) {
            test_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
            g_tmpdir[0] = 0;
            return "/nonexistent";
        }
    }
    return g_tmpdir;
}

int test_run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) { pclose(p); return -1; }
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void cleanup_tmpdir(void) {
    if (g_tmpdir[0] && !getenv("AWQD_TEST_KEEP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "    could not remove %s\n", g_tmpdir);
    }
    g_tmpdir[0] = 0;
}

static int run_inline(struct test_case *t) {
    g_failed = g_skipped = 0;
    t->fn();
    cleanup_tmpdir();
    return g_failed ? EXIT_FAIL : g_skipped ? EXIT_SKIP : EXIT_PASS;
}

static int matches(struct test_case *t, int argc, char **argv) {
    if (argc < 2) return 1;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", t->suite, t->name);
    for (int i = 1; i < argc; i++)
        if (strstr(full, argv[i])) return 1;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int nofork = getenv("AWQD_TEST_NOFORK") != NULL;
    int timeout = getenv("AWQD_TEST_TIMEOUT") ? atoi(getenv("AWQD_TEST_TIMEOUT")) : 300;
    int passed = 0, failed = 0, skipped = 0;
    double t_all = now_s();
    for (struct test_case *t = g_tests; t; t = t->next) {
        if (!matches(t, argc, argv)) continue;
        fprintf(stderr, "%s.%s ...\n", t->suite, t->name);
        double t0 = now_s();
        int rc;
        if (nofork) {
            rc = run_inline(t);
        } else {
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0) {
                alarm((unsigned)timeout);
                _exit(run_inline(t));
            }
            int st = 0;
            if (pid < 0 || waitpid(pid, &st, 0) < 0) {
                rc = EXIT_FAIL;
            } else if (WIFEXITED(st)) {
                rc = WEXITSTATUS(st);
            } else {
                fprintf(stderr, "    killed by signal %d (%s)\n", WTERMSIG(st),
                        WTERMSIG(st) == SIGALRM ? "timeout" : strsignal(WTERMSIG(st)));
                rc = EXIT_FAIL;
            }
        }
        const char *verdict = rc == EXIT_PASS ? "ok" : rc == EXIT_SKIP ? "skip" : "FAIL";
        fprintf(stderr, "%s.%s %s (%.2fs)\n", t->suite, t->name, verdict, now_s() - t0);
        if (rc == EXIT_PASS) passed++;
        else if (rc == EXIT_SKIP) skipped++;
        else failed++;
    }
    fprintf(stderr, "(%.1fs)\n", now_s() - t_all);
    fflush(stderr);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
