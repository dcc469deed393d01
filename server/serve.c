/* serve.c — the daemon (see serve.h). */
#include "server/serve.h"

#include "engine/engine.h"
#include "engine/tok.h"
#include "engine/util.h"
#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <uv.h>

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

enum state { ST_LOADING, ST_READY, ST_DRAINING, ST_FAILED };

struct job;

struct daemon {
    const struct cfg *cfg;
    uv_loop_t *loop;
    struct http_server *http;
    uv_async_t wake;              /* engine events are ready */
    uv_signal_t sigterm, sigint;
    uv_timer_t tick;              /* loading: EXTEND_TIMEOUT_USEC; draining: done yet? */
    uv_work_t load_work;
    enum state state;
    int exit_code;
    uint64_t drain_deadline_ns;
    int drain_forced;
    struct engine *eng;
    struct tok *tok;
    char load_err[512];
    char model_name[256];
    char api_key[CFG_STR];
    int max_model_len;
    int vocab;
    struct metrics m;
    struct job *jobs;             /* in flight */
    int n_jobs;
    uint64_t next_job;
};

struct job {
    struct daemon *d;
    struct job *prev, *next;
    struct http_conn *conn;       /* NULL once the client went away */
    struct api_completion rq;
    char id[48];
    long created;
    uint64_t t_start_ns;
    int n_choices;                /* n_prompts * n */
    struct api_choice *choices;   /* [n_choices] */
    uint64_t *ch_last_ns;         /* [n_choices] time of the last token (ITL) */
    size_t *ch_offset;            /* [n_choices] streaming text_offset */
    uint64_t sub_ids[API_MAX_PROMPTS];
    int n_sub, n_ended;
    int tokenizing;               /* on the thread pool */
    int failed;                   /* answered with an error already */
    int stream_dead;
    int stream_started;           /* SSE headers sent (with the first chunk) */
    int error_seen;
    char error_msg[160];
    int prompt_tokens, completion_tokens;
    uint64_t t_first_ns, t_queue_ns;
    uv_work_t work;
    struct api_error tok_err;
    int tok_rc;
};

/* ------------------------------------------------------------------------ */
/* Answers                                                                  */
/* ------------------------------------------------------------------------ */

static void reply(struct daemon *d, struct http_conn *c, int status, const char *ctype,
                  const char *body, size_t len, const char *extra) {
    metrics_count_status(&d->m, status);
    http_respond(c, status, ctype, body, len, extra);
}

static void reply_json(struct daemon *d, struct http_conn *c, int status, const char *json,
                       const char *extra) {
    reply(d, c, status, "application/json", json, strlen(json), extra);
}

static void reply_error(struct daemon *d, struct http_conn *c, const struct api_error *e) {
    char *j = api_error_json(e);
    const char *extra = NULL;
    if (e->status == 429 || e->status == 503) extra = "Retry-After: 1\r\n";
    if (e->status == 401) extra = "WWW-Authenticate: Bearer\r\n";
    http_conn_note(c, "error=\"%.120s\"", e->message);
    reply_json(d, c, e->status, j ? j : "{}", extra);
    free(j);
}

static void reply_err(struct daemon *d, struct http_conn *c, int status, const char *type,
                      const char *param, const char *code, const char *msg) {
    struct api_error e;
    api_err(&e, status, type, param, code, "%s", msg);
    reply_error(d, c, &e);
}

/* ------------------------------------------------------------------------ */
/* Jobs                                                                     */
/* ------------------------------------------------------------------------ */

static void job_free(struct job *j) {
    struct daemon *d = j->d;
    if (j->prev) j->prev->next = j->next;
    else if (d->jobs == j) d->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    d->n_jobs--;
    if (j->choices)
        for (int i = 0; i < j->n_choices; i++) api_choice_free(&j->choices[i]);
    free(j->choices);
    free(j->ch_last_ns);
    free(j->ch_offset);
    api_completion_free(&j->rq);
    free(j);
}

static void job_cancel_subs(struct job *j) {
    for (int i = 0; i < j->n_sub; i++) engine_cancel(j->d->eng, j->sub_ids[i]);
}

static void on_client_gone(void *ud) {
    struct job *j = ud;
    j->conn = NULL;
    job_cancel_subs(j);
    if (!j->tokenizing && j->n_sub == j->n_ended) job_free(j);
}

static const char *token_text(void *ud, int32_t id, char *buf, size_t len) {
    struct daemon *d = ud;
    size_t bl = 0;
    const char *b = d->tok ? tok_token_bytes(d->tok, id, &bl) : NULL;
    if (!b) {
        snprintf(buf, len, "<%d>", id);
        return buf;
    }
    if (bl > len / 3 - 1) bl = len / 3 - 1;
    size_t ol;
    char *s = api_utf8_sanitize(b, bl, &ol);
    if (!s) return "";
    memcpy(buf, s, ol + 1);
    free(s);
    return buf;
}

/* The SSE headers go out with the first chunk, so that time-to-first-byte is
 * time to the first token, and an early failure can still be a plain error. */
static void stream_start(struct job *j) {
    if (j->stream_started || !j->conn) return;
    j->stream_started = 1;
    metrics_count_status(&j->d->m, 200);
    char extra[160];
    snprintf(extra, sizeof extra, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nX-Request-Id: %s\r\n",
             j->id);
    http_stream_begin(j->conn, 200, "text/event-stream", extra);
}

static void stream_send(struct job *j, char *chunk) {
    if (!chunk) return;
    stream_start(j);
    if (j->conn && !j->stream_dead && http_stream_write(j->conn, chunk, strlen(chunk)) != 0) {
        /* the client does not read: give up on it */
        j->stream_dead = 1;
        job_cancel_subs(j);
    }
    free(chunk);
}

/* Echo: the prompt's text in front of each choice. */
static int job_echo(struct job *j) {
    struct daemon *d = j->d;
    int n = j->rq.params.n;
    for (int p = 0; p < j->rq.n_prompts; p++) {
        struct api_prompt *pr = &j->rq.prompts[p];
        char *text = NULL;
        size_t tl = 0;
        if (pr->text) {
            text = strdup(pr->text);
            tl = text ? strlen(text) : 0;
        } else if (d->tok) {
            if (tok_decode(d->tok, pr->ids, (size_t)pr->n_ids, 0, &text, &tl, NULL, 0) < 0)
                text = NULL;
        }
        if (!text) continue;
        for (int c = 0; c < n; c++) {
            int ci = p * n + c;
            if (j->rq.stream) {
                size_t off = 0;
                stream_send(j, api_format_chunk(j->id, j->created, d->model_name, ci, text, tl,
                                                NULL, 0, -1, &off, ENGINE_FINISH_NONE, token_text,
                                                d));
            } else {
                api_choice_append_text(&j->choices[ci], text, tl);
            }
        }
        free(text);
    }
    return 0;
}

/* Tokenized and checked: hand the prompts to the engine. */
static void job_submit(struct job *j) {
    struct daemon *d = j->d;
    struct api_limits lim = {d->model_name, d->vocab, d->max_model_len};
    struct api_error e;
    if (api_check_lengths(&j->rq, &lim, &e)) {
        reply_error(d, j->conn, &e);
        job_free(j);
        return;
    }
    for (int p = 0; p < j->rq.n_prompts; p++) j->prompt_tokens += j->rq.prompts[p].n_ids;
    for (int p = 0; p < j->rq.n_prompts; p++) {
        struct engine_request r = j->rq.params;
        r.prompt = j->rq.prompts[p].ids;
        r.n_prompt = j->rq.prompts[p].n_ids;
        r.ud = j;
        char err[256];
        int rc = engine_submit(d->eng, &r, &j->sub_ids[j->n_sub], err, sizeof err);
        if (rc) {
            if (rc == -EAGAIN)
                api_err(&e, 429, "rate_limit_error", NULL, "queue_full",
                        "the server is busy: %s; retry later", err);
            else if (rc == -ESHUTDOWN)
                api_err(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
            else
                api_err(&e, 400, "invalid_request_error", "prompt", NULL, "%s", err);
            reply_error(d, j->conn, &e);
            j->conn = NULL;
            j->failed = 1;
            job_cancel_subs(j);
            if (j->n_sub == j->n_ended) job_free(j);
            return;
        }
        j->n_sub++;
    }
    http_conn_on_abort(j->conn, on_client_gone, j);
    http_conn_note(j->conn, "id=%s", j->id);
    if (j->rq.echo) job_echo(j);
}

static int tokenize_prompts(struct daemon *d, struct api_completion *rq, struct api_error *e) {
    for (int p = 0; p < rq->n_prompts; p++) {
        struct api_prompt *pr = &rq->prompts[p];
        if (!pr->text || pr->ids) continue;
        if (!d->tok)
            return api_err(e, 400, "invalid_request_error", "prompt", NULL,
                           "this model has no tokenizer: send the prompt as token ids");
        size_t n = 0;
        char err[256];
        int rc = tok_encode(d->tok, pr->text, strlen(pr->text), 1, &pr->ids, &n, err, sizeof err);
        if (rc < 0)
            return api_err(e, 400, "invalid_request_error", "prompt", NULL,
                           "the prompt could not be tokenized: %s", err);
        pr->n_ids = (int)n;
    }
    return 0;
}

static void tok_work(uv_work_t *w) {
    struct job *j = w->data;
    j->tok_rc = tokenize_prompts(j->d, &j->rq, &j->tok_err);
}

static void tok_after(uv_work_t *w, int status) {
    struct job *j = w->data;
    j->tokenizing = 0;
    if (!j->conn) { /* the client left meanwhile */
        job_free(j);
        return;
    }
    if (status < 0 || j->tok_rc) {
        if (status < 0) api_err(&j->tok_err, 500, "server_error", NULL, NULL, "tokenization failed");
        reply_error(j->d, j->conn, &j->tok_err);
        job_free(j);
        return;
    }
    if (j->d->state != ST_READY) {
        reply_err(j->d, j->conn, 503, "server_error", NULL, NULL, "the server is shutting down");
        job_free(j);
        return;
    }
    job_submit(j);
}

static void handle_completions(struct daemon *d, struct http_conn *c, struct http_req *r) {
    struct api_limits lim = {d->model_name, d->vocab, d->max_model_len};
    struct job *j = calloc(1, sizeof *j);
    if (!j) {
        reply_err(d, c, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    struct api_error e;
    if (api_parse_completion(r->body, r->body_len, &lim, &j->rq, &e)) {
        api_completion_free(&j->rq);
        free(j);
        reply_error(d, c, &e);
        return;
    }
    j->d = d;
    j->conn = c;
    j->t_start_ns = r->t_start_ns;
    j->created = (long)time(NULL);
    snprintf(j->id, sizeof j->id, "cmpl-%016llx%08llx",
             (unsigned long long)(util_now_ns() * 0x9e3779b97f4a7c15ull),
             (unsigned long long)++d->next_job);
    j->n_choices = j->rq.n_prompts * j->rq.params.n;
    j->choices = calloc((size_t)j->n_choices, sizeof *j->choices);
    j->ch_last_ns = calloc((size_t)j->n_choices, sizeof *j->ch_last_ns);
    j->ch_offset = calloc((size_t)j->n_choices, sizeof *j->ch_offset);
    j->next = d->jobs;
    if (d->jobs) d->jobs->prev = j;
    d->jobs = j;
    d->n_jobs++;
    if (!j->choices || !j->ch_last_ns || !j->ch_offset) {
        reply_err(d, c, 500, "server_error", NULL, NULL, "out of memory");
        job_free(j);
        return;
    }
    size_t text_bytes = 0;
    for (int p = 0; p < j->rq.n_prompts; p++)
        if (j->rq.prompts[p].text) text_bytes += strlen(j->rq.prompts[p].text);
    if (text_bytes > SERVE_INLINE_TOKENIZE && d->tok) {
        j->tokenizing = 1;
        j->work.data = j;
        http_conn_on_abort(c, on_client_gone, j);
        if (uv_queue_work(d->loop, &j->work, tok_work, tok_after) == 0) return;
        j->tokenizing = 0;
    }
    if (tokenize_prompts(d, &j->rq, &e)) {
        reply_error(d, c, &e);
        job_free(j);
        return;
    }
    job_submit(j);
}

/* The job's last END arrived: answer. */
static void job_complete(struct job *j) {
    struct daemon *d = j->d;
    double e2e = (double)(util_now_ns() - j->t_start_ns) / 1e9;
    histogram_observe(&d->m.e2e, e2e);
    if (j->conn) {
        http_conn_note(j->conn, "prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f queue_ms=%.1f",
                       j->prompt_tokens, j->completion_tokens,
                       j->t_first_ns ? (double)(j->t_first_ns - j->t_start_ns) / 1e6 : -1.0,
                       (double)j->t_queue_ns / 1e6);
        if (j->rq.stream && !j->stream_started && j->error_seen) {
            reply_err(d, j->conn, 500, "server_error", NULL, NULL, j->error_msg);
        } else if (j->rq.stream) {
            stream_start(j);
            if (j->error_seen) {
                struct api_error e;
                api_err(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                        j->error_msg);
                char *ej = api_error_json(&e);
                if (ej) {
                    size_t n = strlen(ej);
                    char *s = malloc(n + 9);
                    if (s) {
                        snprintf(s, n + 9, "data: %s\n\n", ej);
                        stream_send(j, s);
                    }
                    free(ej);
                }
            }
            if (j->rq.include_usage)
                stream_send(j, api_format_usage_chunk(j->id, j->created, d->model_name,
                                                      j->prompt_tokens, j->completion_tokens));
            stream_send(j, strdup("data: [DONE]\n\n"));
            http_stream_end(j->conn);
        } else if (j->error_seen) {
            reply_err(d, j->conn, 500, "server_error", NULL, NULL, j->error_msg);
        } else {
            char *s = api_format_completion(j->id, j->created, d->model_name, j->choices,
                                            j->n_choices, j->rq.logprobs, j->prompt_tokens,
                                            j->completion_tokens, token_text, d);
            char extra[80];
            snprintf(extra, sizeof extra, "X-Request-Id: %s\r\n", j->id);
            if (s) reply_json(d, j->conn, 200, s, extra);
            else reply_err(d, j->conn, 500, "server_error", NULL, NULL, "out of memory");
            free(s);
        }
    }
    job_free(j);
}

static int job_prompt_index(const struct job *j, uint64_t req_id) {
    for (int i = 0; i < j->n_sub; i++)
        if (j->sub_ids[i] == req_id) return i;
    return 0;
}

static void on_event(struct daemon *d, struct engine_event *ev) {
    struct job *j = ev->ud;
    int pi = job_prompt_index(j, ev->req_id);
    int ci = pi * j->rq.params.n + ev->choice;
    if (ci < 0 || ci >= j->n_choices) ci = 0;
    struct api_choice *ch = &j->choices[ci];
    int live = j->conn && !j->failed;
    switch (ev->kind) {
    case ENGINE_EV_TOKENS:
        if (!ev->is_prompt && ev->n_tokens > 0) {
            if (!j->t_first_ns) {
                j->t_first_ns = ev->t_ns;
                histogram_observe(&d->m.ttft, (double)(ev->t_ns - j->t_start_ns) / 1e9);
            }
            if (j->ch_last_ns[ci])
                histogram_observe(&d->m.itl, (double)(ev->t_ns - j->ch_last_ns[ci]) / 1e9);
            j->ch_last_ns[ci] = ev->t_ns;
        }
        if (!live) break;
        if (j->rq.stream) {
            int lp = j->rq.logprobs;
            if (ev->text_len == 0 && (lp < 0 || ev->n_tokens == 0)) break;
            stream_send(j, api_format_chunk(j->id, j->created, d->model_name, ci, ev->text,
                                            ev->text_len, ev->tokens, ev->n_tokens, lp,
                                            &j->ch_offset[ci], ENGINE_FINISH_NONE, token_text, d));
        } else {
            if (ev->text_len) api_choice_append_text(ch, ev->text, ev->text_len);
            if (j->rq.logprobs >= 0 && ev->n_tokens)
                api_choice_append_tokens(ch, ev->tokens, ev->n_tokens, ev->is_prompt);
        }
        break;
    case ENGINE_EV_FINISH:
        ch->finish = ev->finish;
        ch->completion_tokens = ev->completion_tokens;
        j->completion_tokens += ev->completion_tokens;
        if (ev->finish >= 0 && ev->finish < 5) d->m.finished[ev->finish]++;
        if (ev->finish == ENGINE_FINISH_ERROR) {
            j->error_seen = 1;
            snprintf(j->error_msg, sizeof j->error_msg, "%s", ev->message);
        }
        if (live && j->rq.stream && ev->finish != ENGINE_FINISH_ERROR &&
            ev->finish != ENGINE_FINISH_CANCELLED)
            stream_send(j, api_format_chunk(j->id, j->created, d->model_name, ci, "", 0, NULL, 0,
                                            -1, &j->ch_offset[ci], ev->finish, token_text, d));
        break;
    case ENGINE_EV_END:
        j->n_ended++;
        if (ev->t_sched_ns && ev->t_sched_ns > ev->t_submit_ns) {
            double q = (double)(ev->t_sched_ns - ev->t_submit_ns);
            histogram_observe(&d->m.queue, q / 1e9);
            if (q > (double)j->t_queue_ns) j->t_queue_ns = (uint64_t)q;
        }
        if (j->n_ended == j->n_sub) {
            if (j->failed) job_free(j);
            else job_complete(j);
        }
        break;
    }
}

static void maybe_finish_drain(struct daemon *d);

static void on_wake(uv_async_t *a) {
    struct daemon *d = a->data;
    if (!d->eng) return;
    struct engine_event *ev = engine_poll(d->eng), *next;
    for (; ev; ev = next) {
        next = ev->next;
        on_event(d, ev);
        engine_event_free(ev);
    }
    if (d->state == ST_DRAINING) maybe_finish_drain(d);
}

static void engine_notify(void *ud) { uv_async_send((uv_async_t *)ud); }

/* ------------------------------------------------------------------------ */
/* Routing                                                                  */
/* ------------------------------------------------------------------------ */

/* Constant-time comparison (time depends on the lengths only). */
static int key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    size_t n = la > lb ? la : lb;
    volatile unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < la ? (unsigned char)a[i] : 0;
        unsigned char y = i < lb ? (unsigned char)b[i] : 0;
        diff |= x ^ y;
    }
    return diff == 0;
}

static int authorized(struct daemon *d, const struct http_req *r) {
    if (!d->api_key[0]) return 1;
    const char *h = http_req_header(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, d->api_key);
}

static void handle_models(struct daemon *d, struct http_conn *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *arr = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", d->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "awqd");
    cJSON_AddStringToObject(m, "root", d->cfg->model);
    if (d->max_model_len) cJSON_AddNumberToObject(m, "max_model_len", d->max_model_len);
    cJSON_AddItemToArray(arr, m);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    reply_json(d, c, 200, s ? s : "{}", NULL);
    free(s);
}

static void handle_metrics(struct daemon *d, struct http_conn *c) {
    struct engine_stats st;
    if (d->eng) engine_stats(d->eng, &st);
    size_t len = 0;
    char *s = metrics_render(&d->m, d->eng ? &st : NULL, d->state == ST_LOADING, &len);
    reply(d, c, 200, "text/plain; version=0.0.4; charset=utf-8", s ? s : "", s ? len : 0, NULL);
    free(s);
}

static void on_request(void *ud, struct http_conn *c, struct http_req *r) {
    struct daemon *d = ud;
    const char *p = r->path;
    int get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
    int post = strcmp(r->method, "POST") == 0;
    if (strcmp(p, "/health") == 0) {
        if (!get) goto method;
        if (d->state == ST_READY) reply_json(d, c, 200, "{\"status\":\"ok\"}", NULL);
        else if (d->state == ST_LOADING)
            reply_json(d, c, 503, "{\"status\":\"loading\"}", "Retry-After: 5\r\n");
        else reply_json(d, c, 503, "{\"status\":\"draining\"}", NULL);
        return;
    }
    if (strcmp(p, "/metrics") == 0) {
        if (!get) goto method;
        handle_metrics(d, c);
        return;
    }
    if (strncmp(p, "/v1/", 4) == 0) {
        if (!authorized(d, r)) {
            reply_err(d, c, 401, "invalid_request_error", NULL, "invalid_api_key",
                      "Incorrect or missing API key: send \"Authorization: Bearer KEY\"");
            return;
        }
        if (strcmp(p, "/v1/models") == 0) {
            if (!get) goto method;
            handle_models(d, c);
            return;
        }
        if (strcmp(p, "/v1/completions") == 0) {
            if (!post) goto method;
            if (d->state == ST_LOADING) {
                reply_err(d, c, 503, "server_error", NULL, NULL,
                          "the model is still loading; retry later");
                return;
            }
            if (d->state != ST_READY) {
                reply_err(d, c, 503, "server_error", NULL, NULL, "the server is shutting down");
                return;
            }
            handle_completions(d, c, r);
            return;
        }
    }
    {
        char msg[400];
        snprintf(msg, sizeof msg, "no route for %.8s %.200s (this server has GET /health, "
                                  "GET /metrics, GET /v1/models, POST /v1/completions)",
                 r->method, p);
        reply_err(d, c, 404, "invalid_request_error", NULL, "not_found", msg);
        return;
    }
method:
    reply_err(d, c, 405, "invalid_request_error", NULL, "method_not_allowed",
              "method not allowed on this path");
}

/* ------------------------------------------------------------------------ */
/* Loading, draining, signals                                               */
/* ------------------------------------------------------------------------ */

static void close_all_handles(struct daemon *d) {
    if (d->eng) engine_stop(d->eng); /* no notify on a closed async handle */
    uv_close((uv_handle_t *)&d->wake, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->tick, NULL);
    http_server_stop_accepting(d->http);
    http_server_close_all(d->http);
}

static void maybe_finish_drain(struct daemon *d) {
    if (d->state != ST_DRAINING) return;
    int busy = d->n_jobs + http_server_n_busy(d->http);
    if (busy > 0 && !d->drain_forced && util_now_ns() < d->drain_deadline_ns) return;
    if (busy > 0 && !d->drain_forced) {
        log_warn("shutdown timeout: cancelling %d request(s) still in flight", d->n_jobs);
        d->drain_forced = 1;
        d->drain_deadline_ns = util_now_ns() + 2000000000ull; /* cancels take a step */
        http_server_close_all(d->http);                       /* aborts: engine_cancel */
        return;
    }
    if (busy > 0 && util_now_ns() < d->drain_deadline_ns) return;
    log_info("drained; exiting");
    close_all_handles(d);
}

static void on_tick(uv_timer_t *t) {
    struct daemon *d = t->data;
    if (d->state == ST_LOADING) sd_notify(0, "EXTEND_TIMEOUT_USEC=30000000");
    else if (d->state == ST_DRAINING) maybe_finish_drain(d);
}

static void start_drain(struct daemon *d, const char *why) {
    if (d->state == ST_DRAINING) return;
    int was_loading = d->state == ST_LOADING;
    d->state = ST_DRAINING;
    sd_notify(0, "STOPPING=1");
    log_info("%s: draining (%d request(s) in flight, up to %.0f s)", why, d->n_jobs,
             d->cfg->shutdown_timeout_s);
    d->drain_deadline_ns = util_now_ns() + (uint64_t)(d->cfg->shutdown_timeout_s * 1e9);
    http_server_stop_accepting(d->http);
    http_server_close_idle(d->http);
    uv_timer_start(&d->tick, on_tick, 100, 100);
    if (!was_loading) maybe_finish_drain(d);
}

static void on_signal(uv_signal_t *s, int signum) {
    struct daemon *d = s->data;
    if (d->state == ST_DRAINING) {
        log_warn("second signal: stopping now");
        d->drain_forced = 1;
        d->drain_deadline_ns = 0;
        http_server_close_all(d->http);
        maybe_finish_drain(d);
        return;
    }
    start_drain(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void load_work(uv_work_t *w) {
    struct daemon *d = w->data;
    const struct cfg *c = d->cfg;
    /* testing aid: AWQD_LOAD_DELAY_MS stretches the loading phase so that
     * tests can see /health 503 and signals during loading */
    const char *delay = getenv("AWQD_LOAD_DELAY_MS");
    if (delay && atoi(delay) > 0) uv_sleep((unsigned)atoi(delay));
    struct engine_opts o;
    engine_opts_defaults(&o);
    o.model_dir = c->model;
    o.backend = c->backend;
    o.tp = c->tp;
    o.devices = c->n_devices ? c->devices : NULL;
    o.n_devices = c->n_devices;
    o.max_model_len = c->max_model_len;
    o.max_batch_tokens = c->max_batch_tokens;
    o.max_num_seqs = c->max_num_seqs;
    o.max_waiting = c->max_waiting;
    o.kv_block_size = c->kv_block_size;
    o.kv_cache_tokens = c->kv_cache_tokens;
    o.gpu_memory_fraction = c->gpu_memory_fraction;
    o.cpu_threads = c->cpu_threads;
    o.notify = engine_notify;
    o.notify_ud = &d->wake;
    if (engine_init(&d->eng, &o, d->load_err, sizeof d->load_err) == 0 &&
        engine_start(d->eng, d->load_err, sizeof d->load_err) != 0) {
        engine_free(d->eng);
        d->eng = NULL;
    }
}

static void load_after(uv_work_t *w, int status) {
    struct daemon *d = w->data;
    if (!d->eng) {
        log_error("cannot load the model: %s", d->load_err[0] ? d->load_err : "cancelled");
        d->exit_code = 1;
        d->state = ST_FAILED;
        close_all_handles(d);
        return;
    }
    const struct engine_info *in = engine_get_info(d->eng);
    d->tok = engine_tok(d->eng);
    d->vocab = in->vocab;
    d->max_model_len = in->max_model_len;
    if (d->state == ST_DRAINING) { /* a signal came while loading */
        maybe_finish_drain(d);
        return;
    }
    d->state = ST_READY;
    uv_timer_stop(&d->tick);
    sd_notify(0, "READY=1\nSTATUS=serving");
    log_info("ready: serving \"%s\" on %s:%d (%s backend, max_model_len %d, %d KV blocks of %d)",
             d->model_name, d->cfg->host, http_server_port(d->http), in->backend,
             in->max_model_len, in->kv_blocks_total, in->kv_block_size);
}

static int read_key_file(const char *path, char *out, size_t cap, char *err, size_t errlen) {
    char *text;
    int rc = util_read_file(path, 65536, &text, NULL, err, errlen);
    if (rc) return rc;
    size_t n = strcspn(text, "\r\n");
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\t')) n--;
    if (n == 0 || n >= cap) {
        free(text);
        return util_err(err, errlen, -EINVAL, "%s: the first line must hold the API key", path);
    }
    memcpy(out, text, n);
    out[n] = 0;
    free(text);
    return 0;
}

int serve_run(const struct cfg *c) {
    struct daemon *d = calloc(1, sizeof *d);
    if (!d) return 1;
    char err[512];
    d->cfg = c;
    d->exit_code = 0;
    log_set_level((enum log_level)c->log_level);
    metrics_init(&d->m);
    signal(SIGPIPE, SIG_IGN);
    setenv("UV_THREADPOOL_SIZE", "8", 0);
    if (!c->model[0]) {
        log_error("no model given: --model DIR (or \"model\" in the config file)");
        free(d);
        return 2;
    }
    if (c->api_key_file[0]) {
        if (read_key_file(c->api_key_file, d->api_key, sizeof d->api_key, err, sizeof err)) {
            log_error("%s", err);
            free(d);
            return 2;
        }
    } else {
        snprintf(d->api_key, sizeof d->api_key, "%s", c->api_key);
    }
    if (c->served_model_name[0]) {
        snprintf(d->model_name, sizeof d->model_name, "%.255s", c->served_model_name);
    } else {
        char tmp[CFG_STR];
        snprintf(tmp, sizeof tmp, "%s", c->model);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
        const char *b = strrchr(tmp, '/');
        snprintf(d->model_name, sizeof d->model_name, "%.255s", b ? b + 1 : tmp);
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    d->loop = &loop;
    struct http_limits lim = {.max_body_bytes = c->max_body_bytes,
                              .max_header_bytes = c->max_header_bytes,
                              .max_connections = c->max_connections,
                              .idle_timeout_s = c->idle_timeout_s,
                              .request_timeout_s = c->request_timeout_s};
    if (http_server_init(&d->http, &loop, &lim, on_request, d, err, sizeof err) ||
        http_server_listen(d->http, c->host, c->port, err, sizeof err)) {
        log_error("%s", err);
        if (d->http) {
            http_server_stop_accepting(d->http);
            uv_run(&loop, UV_RUN_DEFAULT);
            http_server_free(d->http);
        }
        uv_loop_close(&loop);
        free(d);
        return 1;
    }
    log_info("listening on %s:%d; loading %s", c->host, http_server_port(d->http), c->model);
    uv_async_init(&loop, &d->wake, on_wake);
    d->wake.data = d;
    uv_signal_init(&loop, &d->sigterm);
    uv_signal_init(&loop, &d->sigint);
    d->sigterm.data = d->sigint.data = d;
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_timer_init(&loop, &d->tick);
    d->tick.data = d;
    uv_timer_start(&d->tick, on_tick, 0, 10000);
    d->state = ST_LOADING;
    d->load_work.data = d;
    uv_queue_work(&loop, &d->load_work, load_work, load_after);

    uv_run(&loop, UV_RUN_DEFAULT);

    if (d->eng) {
        engine_stop(d->eng);
        /* events posted after the last drain (cancelled requests) */
        struct engine_event *ev = engine_poll(d->eng), *next;
        for (; ev; ev = next) {
            next = ev->next;
            engine_event_free(ev);
        }
        engine_free(d->eng);
    }
    while (d->jobs) job_free(d->jobs);
    http_server_free(d->http);
    int rc = uv_loop_close(&loop);
    if (rc) log_warn("loop close: %s", uv_strerror(rc));
    int code = d->exit_code;
    free(d);
    return code;
}
