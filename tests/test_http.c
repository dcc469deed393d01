/* test_http.c — the HTTP layer (server/http.c) on its own: a loop thread runs
 * an http_server with a small test handler; the tests talk raw TCP to it. */
#include "server/http.h"
#include "engine/util.h"
#include "tests/harness/test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

struct fixture {
    uv_loop_t loop;
    uv_async_t stop;
    struct http_server *srv;
    pthread_t th;
    int port;
    int aborted; /* handler saw an abort */
    uv_timer_t later;
    struct http_conn *later_conn;
    int stream_left;
};

static struct fixture F;

static void later_abort(void *ud) {
    struct fixture *f = ud;
    f->aborted++;
    f->later_conn = NULL;
    uv_timer_stop(&f->later);
}

static void on_later(uv_timer_t *t) {
    struct fixture *f = t->data;
    if (!f->later_conn) return;
    if (f->stream_left > 0) {
        char line[64];
        int n = snprintf(line, sizeof line, "data: %d\n\n", f->stream_left);
        http_stream_write(f->later_conn, line, (size_t)n);
        if (--f->stream_left == 0) {
            http_stream_end(f->later_conn);
            f->later_conn = NULL;
        } else {
            uv_timer_start(&f->later, on_later, 20, 0);
        }
        return;
    }
    http_respond(f->later_conn, 200, "text/plain", "late", 4, NULL);
    f->later_conn = NULL;
}

static void handler(void *ud, struct http_conn *c, struct http_req *r) {
    struct fixture *f = ud;
    if (strcmp(r->path, "/slow") == 0) { /* answers after 300 ms */
        f->later_conn = c;
        f->stream_left = 0;
        http_conn_on_abort(c, later_abort, f);
        uv_timer_start(&f->later, on_later, 300, 0);
        return;
    }
    if (strcmp(r->path, "/stream") == 0) {
        f->later_conn = c;
        f->stream_left = 3;
        http_conn_on_abort(c, later_abort, f);
        http_stream_begin(c, 200, "text/event-stream", NULL);
        uv_timer_start(&f->later, on_later, 20, 0);
        return;
    }
    if (strcmp(r->path, "/aborted") == 0) {
        char b[32];
        int n = snprintf(b, sizeof b, "%d", f->aborted);
        http_respond(c, 200, "text/plain", b, (size_t)n, NULL);
        return;
    }
    char body[256];
    const char *x = http_req_header(r, "x-test");
    int n = snprintf(body, sizeof body, "%s %s len=%zu x=%s", r->method, r->path, r->body_len,
                     x ? x : "-");
    http_respond(c, 200, "text/plain", body, (size_t)n, "X-Extra: 1\r\n");
}

static void on_stop(uv_async_t *a) {
    struct fixture *f = a->data;
    http_server_stop_accepting(f->srv);
    http_server_close_all(f->srv);
    uv_close((uv_handle_t *)&f->stop, NULL);
    uv_close((uv_handle_t *)&f->later, NULL);
}

static void *loop_main(void *arg) {
    struct fixture *f = arg;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void start(double request_timeout, double idle_timeout, int max_conns) {
    memset(&F, 0, sizeof F);
    log_set_level(LOG_WARN);
    signal(SIGPIPE, SIG_IGN); /* as serve_run does: writes to gone clients fail with EPIPE */
    uv_loop_init(&F.loop);
    struct http_limits lim = {.max_body_bytes = 4096, .max_header_bytes = 2048,
                              .max_connections = max_conns, .idle_timeout_s = idle_timeout,
                              .request_timeout_s = request_timeout};
    char err[256];
    ASSERT(http_server_init(&F.srv, &F.loop, &lim, handler, &F, err, sizeof err) == 0);
    ASSERT_MSG(http_server_listen(F.srv, "127.0.0.1", 0, err, sizeof err) == 0, "%s", err);
    F.port = http_server_port(F.srv);
    uv_async_init(&F.loop, &F.stop, on_stop);
    F.stop.data = &F;
    uv_timer_init(&F.loop, &F.later);
    F.later.data = &F;
    pthread_create(&F.th, NULL, loop_main, &F);
}

static void stop(void) {
    uv_async_send(&F.stop);
    pthread_join(F.th, NULL);
    http_server_free(F.srv);
    uv_loop_close(&F.loop);
}

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* Reads until `want` occurrences of needle were seen, EOF, or timeout_ms.
 * Returns malloc'd text; *eof set when the peer closed. */
static char *recv_until(int fd, const char *needle, int want, int timeout_ms, int *eof) {
    size_t cap = 65536, len = 0;
    char *b = calloc(1, cap);
    if (eof) *eof = 0;
    uint64_t t_end = util_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int seen = 0;
        for (const char *p = b; needle && (p = strstr(p, needle)); p++) seen++;
        if (needle && seen >= want) break;
        uint64_t now = util_now_ns();
        if (now >= t_end) break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, (int)((t_end - now) / 1000000ull) + 1) <= 0) continue;
        ssize_t r = recv(fd, b + len, cap - len - 1, 0);
        if (r <= 0) {
            if (eof) *eof = 1;
            break;
        }
        len += (size_t)r;
        b[len] = 0;
        if (len + 1 >= cap) break;
    }
    return b;
}

TEST(http, keepalive_and_pipelining) {
    start(5, 5, 16);
    ASSERT_OK_SO_FAR();
    int fd = dial();
    ASSERT(fd >= 0);
    const char *r1 = "GET /a?q=1 HTTP/1.1\r\nHost: x\r\nX-Test:  hello \r\n\r\n";
    send_all(fd, r1, strlen(r1));
    char *out = recv_until(fd, "x=hello", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "HTTP/1.1 200 OK");
    ASSERT_CONTAINS(out, "GET /a len=0 x=hello");
    ASSERT_CONTAINS(out, "Connection: keep-alive");
    ASSERT_CONTAINS(out, "X-Extra: 1");
    free(out);
    /* two pipelined requests in one write, the second with a body */
    const char *r2 = "GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                     "POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    send_all(fd, r2, strlen(r2));
    out = recv_until(fd, "HTTP/1.1 200", 2, 2000, NULL);
    ASSERT_CONTAINS(out, "GET /b len=0");
    ASSERT_CONTAINS(out, "POST /c len=5");
    ASSERT(strstr(out, "GET /b") < strstr(out, "POST /c"));
    free(out);
    close(fd);
    stop();
}

TEST(http, chunked_body_and_split_writes) {
    start(5, 5, 16);
    ASSERT_OK_SO_FAR();
    int fd = dial();
    const char *r = "POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    /* byte by byte: the parser must cope with any split */
    for (size_t i = 0; i < strlen(r); i++) send_all(fd, r + i, 1);
    char *out = recv_until(fd, "len=11", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "POST /chunked len=11");
    free(out);
    close(fd);
    stop();
}

TEST(http, limits_431_413_400) {
    start(5, 5, 16);
    ASSERT_OK_SO_FAR();
    int eof;
    /* header block over 2048 bytes */
    int fd = dial();
    char big[4096];
    int n = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'a', 3000);
    memcpy(big + n + 3000, "\r\n\r\n", 5);
    send_all(fd, big, strlen(big));
    char *out = recv_until(fd, NULL, 0, 2000, &eof);
    ASSERT_CONTAINS(out, "HTTP/1.1 431");
    ASSERT_CONTAINS(out, "\"error\":{\"message\"");
    ASSERT_CONTAINS(out, "Connection: close");
    ASSERT(eof);
    free(out);
    close(fd);
    /* Content-Length over the body limit: answered before the body */
    fd = dial();
    const char *r = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    send_all(fd, r, strlen(r));
    out = recv_until(fd, NULL, 0, 2000, &eof);
    ASSERT_CONTAINS(out, "HTTP/1.1 413");
    ASSERT(eof);
    free(out);
    close(fd);
    /* chunked body growing over the limit */
    fd = dial();
    r = "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, r, strlen(r));
    char chunk[1100];
    n = snprintf(chunk, sizeof chunk, "400\r\n");
    memset(chunk + n, 'z', 1024);
    memcpy(chunk + n + 1024, "\r\n", 2);
    for (int i = 0; i < 6; i++) send_all(fd, chunk, (size_t)n + 1026);
    out = recv_until(fd, NULL, 0, 2000, &eof);
    ASSERT_CONTAINS(out, "HTTP/1.1 413");
    free(out);
    close(fd);
    /* garbage */
    fd = dial();
    r = "GARBAGE\x01\x02 / HTTP/9.9\r\n\r\n";
    send_all(fd, r, strlen(r));
    out = recv_until(fd, NULL, 0, 2000, &eof);
    ASSERT_CONTAINS(out, "HTTP/1.1 400");
    ASSERT_CONTAINS(out, "malformed HTTP request");
    free(out);
    close(fd);
    /* the server still answers */
    fd = dial();
    r = "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, r, strlen(r));
    out = recv_until(fd, "len=0", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "GET /ok len=0");
    free(out);
    close(fd);
    stop();
}

TEST(http, slow_request_408_and_idle_close) {
    start(1, 1, 16);
    ASSERT_OK_SO_FAR();
    int eof;
    int fd = dial();
    const char *r = "GET / HTTP/1.1\r\nHost: x\r\n"; /* never finished: slow loris */
    send_all(fd, r, strlen(r));
    uint64_t t0 = util_now_ns();
    char *out = recv_until(fd, NULL, 0, 4000, &eof);
    double s = (double)(util_now_ns() - t0) / 1e9;
    ASSERT_CONTAINS(out, "HTTP/1.1 408");
    ASSERT(eof);
    ASSERT_MSG(s > 0.5 && s < 3.0, "408 after %.2f s", s);
    free(out);
    close(fd);
    /* idle connection: closed silently after idle_timeout_s */
    fd = dial();
    out = recv_until(fd, NULL, 0, 4000, &eof);
    ASSERT(eof);
    ASSERT_STR_EQ(out, "");
    free(out);
    close(fd);
    stop();
}

TEST(http, max_connections_503) {
    start(5, 5, 2);
    ASSERT_OK_SO_FAR();
    int a = dial(), b = dial();
    usleep(100000);
    int c = dial();
    int eof;
    char *out = recv_until(c, NULL, 0, 2000, &eof);
    ASSERT_CONTAINS(out, "HTTP/1.1 503");
    free(out);
    close(c);
    close(a);
    usleep(100000);
    /* a slot is free again */
    int d = dial();
    const char *r = "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(d, r, strlen(r));
    out = recv_until(d, "len=0", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "200 OK");
    free(out);
    close(d);
    close(b);
    stop();
}

TEST(http, expect_continue_stream_and_abort) {
    start(5, 5, 16);
    ASSERT_OK_SO_FAR();
    int fd = dial();
    const char *r = "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n";
    send_all(fd, r, strlen(r));
    char *out = recv_until(fd, "100 Continue", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "HTTP/1.1 100 Continue");
    free(out);
    send_all(fd, "abc", 3);
    out = recv_until(fd, "len=3", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "POST /e len=3");
    free(out);
    /* a chunked streaming answer */
    r = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, r, strlen(r));
    out = recv_until(fd, "0\r\n\r\n", 1, 3000, NULL);
    ASSERT_CONTAINS(out, "Transfer-Encoding: chunked");
    ASSERT_CONTAINS(out, "data: 3\n\n");
    ASSERT_CONTAINS(out, "data: 1\n\n\r\n0\r\n\r\n");
    free(out);
    close(fd);
    /* a client that leaves while its request is being answered: abort runs */
    fd = dial();
    r = "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, r, strlen(r));
    usleep(50000);
    close(fd);
    usleep(400000);
    fd = dial();
    r = "GET /aborted HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, r, strlen(r));
    out = recv_until(fd, "\r\n\r\n1", 1, 2000, NULL);
    ASSERT_CONTAINS(out, "\r\n\r\n1");
    free(out);
    close(fd);
    stop();
}

/* Random bytes on many connections: the server answers or closes, and still
 * serves a valid request afterwards. */
TEST(http, random_garbage_survives) {
    start(1, 1, 1024);
    ASSERT_OK_SO_FAR();
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200; i++) {
        int fd = dial();
        ASSERT(fd >= 0);
        char buf[600];
        size_t n = 1 + (size_t)(i * 7 % 599);
        /* half start like a request, then garbage */
        size_t k = 0;
        if (i % 2) k = (size_t)snprintf(buf, sizeof buf, "POST /v1/x HTTP/1.1\r\nContent-Length: 9\r\n");
        for (; k < n; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[k] = (char)(x & 0xff);
        }
        send_all(fd, buf, n);
        if (i % 3 == 0) send_all(fd, "\r\n\r\n", 4);
        close(fd);
    }
    int fd = dial();
    const char *r = "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, r, strlen(r));
    char *out = recv_until(fd, "len=0", 1, 3000, NULL);
    ASSERT_CONTAINS(out, "GET /ok len=0");
    free(out);
    close(fd);
    stop();
}
