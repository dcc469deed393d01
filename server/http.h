/* http.h — the HTTP/1.1 server: libuv TCP on one loop thread, llhttp parsing,
 * keep-alive, Content-Length and chunked request bodies, limits and timeouts.
 *
 * Usage (all on the loop thread):
 *     struct http_server *s;
 *     struct http_limits lim = {...};
 *     http_server_init(&s, loop, &lim, on_request, ud, err, sizeof err);
 *     http_server_listen(s, "127.0.0.1", 8000, err, sizeof err);
 *     ... uv_run(loop) ...
 *     http_server_stop_accepting(s);   // drain: no new connections
 *     http_server_close_all(s);        // close every connection
 *     http_server_free(s);             // after the handles are closed (run the loop)
 *
 * A complete request is handed to on_request(ud, conn, req). The handler
 * answers exactly once, now or later (from the same loop thread): with
 * http_respond() (whole body), or http_stream_begin() + http_stream_write() ...
 * + http_stream_end() (chunked transfer encoding, e.g. server-sent events).
 * While a request is being answered the connection keeps reading (so that a
 * disconnect is seen) but parses nothing more (pipelined bytes wait, bounded).
 *
 * A handler that answers later registers http_conn_on_abort(): if the client
 * goes away first, that callback runs (once, on the loop thread) and from then
 * on the conn pointer is dead: the handler must not touch it again.
 *
 * Errors the layer answers itself: 400 malformed HTTP, 408 slow request
 * (request_timeout_s from its first byte), 413 body over max_body_bytes, 431
 * header block over max_header_bytes, 503 over max_connections. An idle
 * keep-alive connection is closed after idle_timeout_s.
 *
 * Every answered request produces one access-log line (log_info):
 *     access conn=3 "POST /v1/completions" 200 bytes=512 ms=12.3 <note>
 * where <note> is what the handler set with http_conn_note().
 *
 * The process must ignore SIGPIPE (serve_run does): a write to a client that
 * went away then fails with EPIPE and the connection is closed.
 *
 * Thread safety: none; everything runs on the loop thread. */
#ifndef AWQD_HTTP_H
#define AWQD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct http_limits {
    long max_body_bytes;      /* 413 beyond */
    int max_header_bytes;     /* 431 beyond (request line + header fields + values) */
    int max_connections;      /* 503 + close beyond */
    double idle_timeout_s;    /* idle keep-alive connection: closed silently */
    double request_timeout_s; /* a request must arrive whole within this: 408 */
};

#define HTTP_MAX_HEADERS 64

struct http_header {
    char *name;  /* lower-cased */
    char *value; /* leading/trailing blanks stripped */
};

struct http_req {
    const char *method;       /* "GET", "POST", ... */
    char *url;                /* as sent, NUL-terminated */
    char *path;               /* url without the query string */
    struct http_header headers[HTTP_MAX_HEADERS];
    int n_headers;
    char *body;               /* NUL-terminated (the NUL is not counted); may hold NULs */
    size_t body_len;
    uint64_t t_start_ns;      /* first byte of the request (util_now_ns clock) */
    int keep_alive;
};

struct http_server;
struct http_conn;

typedef void (*http_request_fn)(void *ud, struct http_conn *c, struct http_req *req);
typedef void (*http_abort_fn)(void *ud);

int http_server_init(struct http_server **out, uv_loop_t *loop, const struct http_limits *lim,
                     http_request_fn on_request, void *ud, char *err, size_t errlen);
/* Binds and listens (IPv4 or IPv6 literal host). port 0 picks a free port:
 * http_server_port() tells which. */
int http_server_listen(struct http_server *s, const char *host, int port, char *err,
                       size_t errlen);
int http_server_port(const struct http_server *s);
/* Stops accepting new connections (closes the listening socket). */
void http_server_stop_accepting(struct http_server *s);
/* Closes idle connections now and makes busy ones close after their answer. */
void http_server_close_idle(struct http_server *s);
/* Closes every connection now (busy ones are aborted). */
void http_server_close_all(struct http_server *s);
/* Open connections, and connections with a request being answered. */
int http_server_n_conns(const struct http_server *s);
int http_server_n_busy(const struct http_server *s);
/* Frees the server; every handle must be closed (close_all + stop_accepting,
 * then let the loop run their close callbacks). */
void http_server_free(struct http_server *s);

/* Header lookup by lower-case name; NULL when absent. */
const char *http_req_header(const struct http_req *r, const char *name);

/* Whole answer. extra_headers: NULL or lines each ending in "\r\n". */
void http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *extra_headers);
/* Streaming answer with Transfer-Encoding: chunked. */
void http_stream_begin(struct http_conn *c, int status, const char *content_type,
                       const char *extra_headers);
/* Returns 0, or -EPIPE when the client is too slow (more than a bounded amount
 * is queued); the caller should then abort its work. */
int http_stream_write(struct http_conn *c, const char *data, size_t len);
void http_stream_end(struct http_conn *c);

void http_conn_on_abort(struct http_conn *c, http_abort_fn fn, void *ud);
/* Text appended to this request's access-log line (copied). */
void http_conn_note(struct http_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A number for the connection, for logs. */
uint64_t http_conn_id(const struct http_conn *c);

const char *http_status_text(int status);

#endif
