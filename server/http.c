/* http.c — HTTP/1.1 over libuv with llhttp (see http.h). */
#include "server/http.h"

#include "engine/util.h"

#include <ctype.h>
#include <errno.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

enum conn_state {
    CONN_IDLE,    /* waiting for the first byte of a request (keep-alive) */
    CONN_READING, /* a request is arriving */
    CONN_BUSY,    /* the handler is answering */
    CONN_CLOSING, /* uv_close called */
};

/* A growable byte buffer, always NUL-terminated when data != NULL. */
struct buf {
    char *data;
    size_t len, cap;
};

struct http_conn {
    uv_tcp_t tcp; /* first: handle.data also points at the conn */
    uv_timer_t timer;
    struct http_server *srv;
    struct http_conn *prev, *next; /* server's list */
    uint64_t id;
    enum conn_state state;
    int handles_open;              /* closes pending before the conn is freed */
    llhttp_t parser;

    /* the request being parsed / answered */
    struct http_req req;
    struct buf url, field, value, body;
    size_t header_bytes;           /* request line + header bytes so far */
    int error_status;              /* 413 / 431 found inside a parser callback */
    int sent_continue;

    /* bytes received and not yet parsed (pipelined, or read while busy) */
    struct buf pending;
    int reading_stopped;
    int in_process;

    /* the answer */
    int status;
    int streaming;
    int keep_alive;                /* of the answer */
    int close_when_flushed;
    int n_writes;                  /* uv_write requests in flight */
    size_t bytes_out;
    char note[320];
    http_abort_fn abort_fn;
    void *abort_ud;

    char rbuf[16384];              /* read buffer handed to libuv */
};

struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    int listening;
    int listener_open;
    struct http_limits lim;
    http_request_fn on_request;
    void *ud;
    llhttp_settings_t settings;
    struct http_conn *conns;
    int n_conns;
    int draining;
    uint64_t next_id;
    int port;
};

#define PENDING_MAX_WHILE_BUSY (256 * 1024)
#define STREAM_QUEUE_MAX (8u << 20)

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static int buf_append(struct buf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return -ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

static void buf_free(struct buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

static char *buf_take(struct buf *b) { /* hands over the data as a C string */
    char *d = b->data ? b->data : strdup("");
    memset(b, 0, sizeof *b);
    return d;
}

const char *http_status_text(int s) {
    switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

const char *http_req_header(const struct http_req *r, const char *name) {
    for (int i = 0; i < r->n_headers; i++)
        if (strcmp(r->headers[i].name, name) == 0) return r->headers[i].value;
    return NULL;
}

uint64_t http_conn_id(const struct http_conn *c) { return c->id; }

void http_conn_note(struct http_conn *c, const char *fmt, ...) {
    size_t len = strlen(c->note);
    if (len + 2 >= sizeof c->note) return;
    if (len) c->note[len++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note + len, sizeof c->note - len, fmt, ap);
    va_end(ap);
}

void http_conn_on_abort(struct http_conn *c, http_abort_fn fn, void *ud) {
    c->abort_fn = fn;
    c->abort_ud = ud;
}

static void req_reset(struct http_conn *c) {
    struct http_req *r = &c->req;
    free(r->url);
    free(r->path);
    free(r->body);
    for (int i = 0; i < r->n_headers; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    memset(r, 0, sizeof *r);
    buf_free(&c->url);
    buf_free(&c->field);
    buf_free(&c->value);
    buf_free(&c->body);
    c->header_bytes = 0;
    c->error_status = 0;
    c->sent_continue = 0;
    c->status = 0;
    c->streaming = 0;
    c->bytes_out = 0;
    c->note[0] = 0;
}

/* ------------------------------------------------------------------------ */
/* Closing                                                                  */
/* ------------------------------------------------------------------------ */

static void conn_free(struct http_conn *c) {
    struct http_server *s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    req_reset(c);
    buf_free(&c->pending);
    free(c);
}

static void on_handle_closed(uv_handle_t *h) {
    struct http_conn *c = h->data;
    if (--c->handles_open == 0) conn_free(c);
}

static void conn_close(struct http_conn *c) {
    if (c->state == CONN_CLOSING) return;
    int was_busy = c->state == CONN_BUSY;
    c->state = CONN_CLOSING;
    if (was_busy && c->abort_fn) {
        http_abort_fn fn = c->abort_fn;
        c->abort_fn = NULL;
        fn(c->abort_ud);
    }
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

struct wreq {
    uv_write_t w;
    struct http_conn *c;
    char data[];
};

static void on_written(uv_write_t *w, int status) {
    struct wreq *wr = (struct wreq *)w;
    struct http_conn *c = wr->c;
    free(wr);
    c->n_writes--;
    if (c->state == CONN_CLOSING) return;
    if (status < 0) {
        log_debug("conn=%llu write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        conn_close(c);
        return;
    }
    if (c->close_when_flushed && c->n_writes == 0) conn_close(c);
}

/* Queues head (+ body) as one write. */
static int conn_write2(struct http_conn *c, const char *a, size_t alen, const char *b, size_t blen,
                       const char *tail, size_t tlen) {
    if (c->state == CONN_CLOSING) return -EPIPE;
    struct wreq *wr = malloc(sizeof *wr + alen + blen + tlen);
    if (!wr) {
        conn_close(c);
        return -ENOMEM;
    }
    wr->c = c;
    memcpy(wr->data, a, alen);
    if (blen) memcpy(wr->data + alen, b, blen);
    if (tlen) memcpy(wr->data + alen + blen, tail, tlen);
    uv_buf_t ub = uv_buf_init(wr->data, (unsigned)(alen + blen + tlen));
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &ub, 1, on_written);
    if (rc < 0) {
        free(wr);
        conn_close(c);
        return -EPIPE;
    }
    c->n_writes++;
    c->bytes_out += alen + blen + tlen;
    return 0;
}

static void process(struct http_conn *c);
static void arm_idle(struct http_conn *c);
static void read_start(struct http_conn *c);

/* The answer is complete: log it, then keep the connection or close it. */
static void finish(struct http_conn *c) {
    double ms = (double)(util_now_ns() - c->req.t_start_ns) / 1e6;
    log_info("access conn=%llu \"%s %s\" %d bytes=%zu ms=%.1f%s%s", (unsigned long long)c->id,
             c->req.method ? c->req.method : "-", c->req.url ? c->req.url : "-", c->status,
             c->bytes_out, ms, c->note[0] ? " " : "", c->note);
    c->abort_fn = NULL;
    c->abort_ud = NULL;
    if (!c->keep_alive) {
        c->state = CONN_IDLE;
        c->close_when_flushed = 1;
        if (c->n_writes == 0) conn_close(c);
        return;
    }
    req_reset(c);
    c->state = CONN_IDLE;
    arm_idle(c);
    if (c->reading_stopped) {
        c->reading_stopped = 0;
        read_start(c);
    }
    process(c);
}

static int head_keep_alive(struct http_conn *c) {
    return c->req.keep_alive && !c->srv->draining && !c->close_when_flushed;
}

static int format_head(struct http_conn *c, char *h, size_t hlen, int status, const char *ctype,
                       const char *extra, long content_len) {
    char cl[64] = "";
    if (content_len >= 0) snprintf(cl, sizeof cl, "Content-Length: %ld\r\n", content_len);
    return snprintf(h, hlen,
                    "HTTP/1.1 %d %s\r\nServer: awqd\r\nContent-Type: %s\r\n%s%s%s\r\n", status,
                    http_status_text(status), ctype ? ctype : "application/json", cl,
                    content_len >= 0 ? (c->keep_alive ? "Connection: keep-alive\r\n"
                                                      : "Connection: close\r\n")
                                     : (c->keep_alive ? "Transfer-Encoding: chunked\r\n"
                                                        "Connection: keep-alive\r\n"
                                                      : "Transfer-Encoding: chunked\r\n"
                                                        "Connection: close\r\n"),
                    extra ? extra : "");
}

void http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *extra_headers) {
    if (c->state != CONN_BUSY) return;
    c->status = status;
    c->keep_alive = head_keep_alive(c);
    char head[2048];
    int hl = format_head(c, head, sizeof head, status, content_type, extra_headers, (long)len);
    if (hl < 0 || (size_t)hl >= sizeof head) hl = (int)strlen(head);
    conn_write2(c, head, (size_t)hl, body, len, NULL, 0);
    if (c->state == CONN_CLOSING) return;
    finish(c);
}

void http_stream_begin(struct http_conn *c, int status, const char *content_type,
                       const char *extra_headers) {
    if (c->state != CONN_BUSY || c->streaming) return;
    c->status = status;
    c->streaming = 1;
    c->keep_alive = head_keep_alive(c);
    char head[2048];
    int hl = format_head(c, head, sizeof head, status, content_type, extra_headers, -1);
    if (hl < 0 || (size_t)hl >= sizeof head) hl = (int)strlen(head);
    conn_write2(c, head, (size_t)hl, NULL, 0, NULL, 0);
}

int http_stream_write(struct http_conn *c, const char *data, size_t len) {
    if (c->state != CONN_BUSY || !c->streaming) return -EPIPE;
    if (len == 0) return 0;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > STREAM_QUEUE_MAX) return -EPIPE;
    char sz[32];
    int n = snprintf(sz, sizeof sz, "%zx\r\n", len);
    return conn_write2(c, sz, (size_t)n, data, len, "\r\n", 2);
}

void http_stream_end(struct http_conn *c) {
    if (c->state != CONN_BUSY || !c->streaming) return;
    conn_write2(c, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    if (c->state == CONN_CLOSING) return;
    finish(c);
}

/* An error the HTTP layer answers itself; the connection closes after it. */
static void respond_error_close(struct http_conn *c, int status, const char *type,
                                const char *msg) {
    char body[600], clean[300];
    size_t j = 0;
    for (size_t i = 0; msg[i] && j + 1 < sizeof clean; i++) {
        unsigned char ch = (unsigned char)msg[i];
        clean[j++] = (ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\') ? ' ' : (char)ch;
    }
    clean[j] = 0;
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                     clean, type, status);
    c->state = CONN_BUSY;
    c->req.keep_alive = 0;
    if (!c->req.t_start_ns) c->req.t_start_ns = util_now_ns();
    uv_timer_stop(&c->timer);
    http_respond(c, status, "application/json", body, (size_t)n, NULL);
}

/* ------------------------------------------------------------------------ */
/* Parser callbacks                                                         */
/* ------------------------------------------------------------------------ */

#define CONN(p) ((struct http_conn *)(p)->data)

static int count_header(struct http_conn *c, size_t n) {
    c->header_bytes += n;
    if (c->header_bytes > (size_t)c->srv->lim.max_header_bytes) {
        c->error_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(llhttp_t *p) {
    struct http_conn *c = CONN(p);
    uint64_t t0 = c->req.t_start_ns;
    req_reset(c);
    c->req.t_start_ns = t0 ? t0 : util_now_ns();
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    struct http_conn *c = CONN(p);
    if (count_header(c, n)) return -1;
    return buf_append(&c->url, at, n) ? -1 : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    struct http_conn *c = CONN(p);
    if (count_header(c, n)) return -1;
    return buf_append(&c->field, at, n) ? -1 : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    struct http_conn *c = CONN(p);
    if (count_header(c, n)) return -1;
    return buf_append(&c->value, at, n) ? -1 : 0;
}

static int on_header_value_complete(llhttp_t *p) {
    struct http_conn *c = CONN(p);
    struct http_req *r = &c->req;
    if (r->n_headers >= HTTP_MAX_HEADERS) {
        c->error_status = 431;
        return -1;
    }
    char *name = buf_take(&c->field);
    char *value = buf_take(&c->value);
    if (!name || !value) {
        free(name);
        free(value);
        return -1;
    }
    for (char *q = name; *q; q++) *q = (char)tolower((unsigned char)*q);
    size_t vl = strlen(value);
    while (vl && (value[vl - 1] == ' ' || value[vl - 1] == '\t')) value[--vl] = 0;
    size_t lead = strspn(value, " \t");
    if (lead) memmove(value, value + lead, vl - lead + 1);
    r->headers[r->n_headers].name = name;
    r->headers[r->n_headers].value = value;
    r->n_headers++;
    return 0;
}

static int on_header_field_complete(llhttp_t *p) {
    struct http_conn *c = CONN(p);
    /* a header with an empty value never calls on_header_value */
    if (!c->value.data) return buf_append(&c->value, "", 0) ? -1 : 0;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    struct http_conn *c = CONN(p);
    struct http_server *s = c->srv;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > (uint64_t)s->lim.max_body_bytes) {
        c->error_status = 413;
        return -1;
    }
    const char *expect = http_req_header(&c->req, "expect");
    if (expect && strcasecmp(expect, "100-continue") == 0 && !c->sent_continue) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        c->sent_continue = 1;
        conn_write2(c, cont, sizeof cont - 1, NULL, 0, NULL, 0);
        c->bytes_out = 0;
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    struct http_conn *c = CONN(p);
    if (c->body.len + n > (size_t)c->srv->lim.max_body_bytes) {
        c->error_status = 413;
        return -1;
    }
    return buf_append(&c->body, at, n) ? -1 : 0;
}

static int on_message_complete(llhttp_t *p) {
    struct http_conn *c = CONN(p);
    struct http_req *r = &c->req;
    r->method = llhttp_method_name((llhttp_method_t)llhttp_get_method(p));
    r->keep_alive = llhttp_should_keep_alive(p);
    r->url = buf_take(&c->url);
    r->body_len = c->body.len;
    r->body = buf_take(&c->body);
    if (!r->url || !r->body) return -1;
    size_t plen = strcspn(r->url, "?#");
    r->path = strndup(r->url, plen);
    if (!r->path) return -1;
    return HPE_PAUSED;
}

/* ------------------------------------------------------------------------ */
/* Reading and dispatch                                                     */
/* ------------------------------------------------------------------------ */

static void on_timer(uv_timer_t *t) {
    struct http_conn *c = t->data;
    if (c->state == CONN_IDLE) {
        log_debug("conn=%llu idle timeout", (unsigned long long)c->id);
        conn_close(c);
    } else if (c->state == CONN_READING) {
        respond_error_close(c, 408, "invalid_request_error",
                            "the request did not arrive whole within request_timeout_s");
    }
}

static void arm_idle(struct http_conn *c) {
    uv_timer_start(&c->timer, on_timer, (uint64_t)(c->srv->lim.idle_timeout_s * 1000.0), 0);
}

static void dispatch(struct http_conn *c) {
    c->state = CONN_BUSY;
    uv_timer_stop(&c->timer);
    c->close_when_flushed = 0;
    c->srv->on_request(c->srv->ud, c, &c->req);
}

/* Parses what is pending while the connection is not answering a request. */
static void process(struct http_conn *c) {
    if (c->in_process) return;
    c->in_process = 1;
    while ((c->state == CONN_IDLE || c->state == CONN_READING) && c->pending.len > 0) {
        if (c->state == CONN_IDLE) {
            c->state = CONN_READING;
            c->req.t_start_ns = util_now_ns();
            uv_timer_start(&c->timer, on_timer,
                           (uint64_t)(c->srv->lim.request_timeout_s * 1000.0), 0);
        }
        llhttp_errno_t e = llhttp_execute(&c->parser, c->pending.data, c->pending.len);
        if (e == HPE_OK) {
            c->pending.len = 0;
            break;
        }
        if (e == HPE_PAUSED) {
            const char *pos = llhttp_get_error_pos(&c->parser);
            size_t used = (size_t)(pos - c->pending.data);
            if (used > c->pending.len) used = c->pending.len;
            memmove(c->pending.data, c->pending.data + used, c->pending.len - used);
            c->pending.len -= used;
            c->pending.data[c->pending.len] = 0;
            llhttp_resume(&c->parser);
            dispatch(c);
            continue;
        }
        c->pending.len = 0;
        if (c->error_status == 413)
            respond_error_close(c, 413, "invalid_request_error",
                                "request body larger than max_body_bytes");
        else if (c->error_status == 431)
            respond_error_close(c, 431, "invalid_request_error",
                                "request header block larger than max_header_bytes");
        else {
            char msg[200];
            snprintf(msg, sizeof msg, "malformed HTTP request: %s", llhttp_get_error_reason(&c->parser));
            respond_error_close(c, 400, "invalid_request_error", msg);
        }
        break;
    }
    c->in_process = 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
    struct http_conn *c = h->data;
    *b = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
    struct http_conn *c = st->data;
    if (n == 0) return;
    if (n < 0) {
        if (c->state == CONN_BUSY)
            log_info("conn=%llu client went away during the request", (unsigned long long)c->id);
        conn_close(c);
        return;
    }
    if (c->state == CONN_CLOSING) return;
    if (c->close_when_flushed) return; /* answering with close: ignore the rest */
    if (buf_append(&c->pending, b->base, (size_t)n)) {
        conn_close(c);
        return;
    }
    if (c->state == CONN_BUSY) {
        if (c->pending.len > PENDING_MAX_WHILE_BUSY) {
            uv_read_stop(st);
            c->reading_stopped = 1;
        }
        return;
    }
    process(c);
}

static void read_start(struct http_conn *c) {
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_connection(uv_stream_t *ls, int status) {
    struct http_server *s = ls->data;
    if (status < 0) {
        log_warn("accept: %s", uv_strerror(status));
        return;
    }
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    c->id = ++s->next_id;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    if (s->n_conns > s->lim.max_connections) {
        log_warn("conn=%llu refused: %d connections open (max_connections)",
                 (unsigned long long)c->id, s->n_conns - 1);
        respond_error_close(c, 503, "server_error", "too many connections (max_connections)");
        return;
    }
    c->state = CONN_IDLE;
    arm_idle(c);
    read_start(c);
}

/* ------------------------------------------------------------------------ */
/* Server                                                                   */
/* ------------------------------------------------------------------------ */

int http_server_init(struct http_server **out, uv_loop_t *loop, const struct http_limits *lim,
                     http_request_fn on_request, void *ud, char *err, size_t errlen) {
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return util_err(err, errlen, -ENOMEM, "out of memory");
    s->loop = loop;
    s->lim = *lim;
    s->on_request = on_request;
    s->ud = ud;
    llhttp_settings_init(&s->settings);
    s->settings.on_message_begin = on_message_begin;
    s->settings.on_url = on_url;
    s->settings.on_header_field = on_header_field;
    s->settings.on_header_field_complete = on_header_field_complete;
    s->settings.on_header_value = on_header_value;
    s->settings.on_header_value_complete = on_header_value_complete;
    s->settings.on_headers_complete = on_headers_complete;
    s->settings.on_body = on_body;
    s->settings.on_message_complete = on_message_complete;
    *out = s;
    return 0;
}

int http_server_listen(struct http_server *s, const char *host, int port, char *err,
                       size_t errlen) {
    struct sockaddr_storage ss;
    int rc;
    if (strchr(host, ':')) rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss);
    else rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&ss);
    if (rc) return util_err(err, errlen, -EINVAL, "listen: bad host address \"%s\"", host);
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    s->listener_open = 1;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    if (rc)
        return util_err(err, errlen, rc, "listen on %s:%d: %s", host, port, uv_strerror(rc));
    struct sockaddr_storage got;
    int len = sizeof got;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len) == 0)
        s->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                  : ((struct sockaddr_in *)&got)->sin_port);
    s->listening = 1;
    return 0;
}

int http_server_port(const struct http_server *s) { return s->port; }

void http_server_stop_accepting(struct http_server *s) {
    s->draining = 1;
    if (s->listener_open) {
        s->listener_open = 0;
        s->listening = 0;
        uv_close((uv_handle_t *)&s->listener, NULL);
    }
}

void http_server_close_idle(struct http_server *s) {
    s->draining = 1;
    struct http_conn *c = s->conns, *next;
    for (; c; c = next) {
        next = c->next;
        if (c->state == CONN_IDLE && c->n_writes == 0) conn_close(c);
        else if (c->state != CONN_CLOSING) c->close_when_flushed = c->state == CONN_IDLE;
    }
}

void http_server_close_all(struct http_server *s) {
    s->draining = 1;
    struct http_conn *c = s->conns, *next;
    for (; c; c = next) {
        next = c->next;
        conn_close(c);
    }
}

int http_server_n_conns(const struct http_server *s) { return s->n_conns; }

int http_server_n_busy(const struct http_server *s) {
    int n = 0;
    for (const struct http_conn *c = s->conns; c; c = c->next) n += c->state == CONN_BUSY;
    return n;
}

void http_server_free(struct http_server *s) {
    if (!s) return;
    AWQD_ASSERT(s->n_conns == 0);
    free(s);
}
