/* metrics.c — Prometheus text rendering (see metrics.h). */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_init(struct histogram *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, b, sizeof(double) * (size_t)n);
}

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
    static const double itl[] = {0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
    static const double e2e[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                                 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0};
    hist_init(&m->ttft, ttft, (int)(sizeof ttft / sizeof ttft[0]));
    hist_init(&m->itl, itl, (int)(sizeof itl / sizeof itl[0]));
    hist_init(&m->e2e, e2e, (int)(sizeof e2e / sizeof e2e[0]));
    hist_init(&m->queue, e2e, (int)(sizeof e2e / sizeof e2e[0]));
}

void histogram_observe(struct histogram *h, double s) {
    if (!(s >= 0)) s = 0;
    int i = 0;
    while (i < h->n_bounds && s > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->count++;
}

void metrics_count_status(struct metrics *m, int status) {
    int c = status / 100;
    if (c >= 1 && c <= 5) m->http_by_class[c]++;
    if (status == 429) m->rejected_queue_full++;
}

struct out {
    char *s;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->s ? o->s + o->len : NULL, o->s ? o->cap - o->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (o->s && o->len + (size_t)n < o->cap) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap ? o->cap * 2 : 8192;
        while (cap < o->len + (size_t)n + 1) cap *= 2;
        char *ns = realloc(o->s, cap);
        if (!ns) return;
        o->s = ns;
        o->cap = cap;
    }
}

static void hist(struct out *o, const char *name, const char *help, const struct histogram *h) {
    put(o, "# HELP awqd:%s %s\n# TYPE awqd:%s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(o, "awqd:%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(o, "awqd:%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    put(o, "awqd:%s_sum %.6f\nawqd:%s_count %llu\n", name, h->sum, name,
        (unsigned long long)h->count);
}

static void gauge(struct out *o, const char *name, const char *help, double v) {
    put(o, "# HELP awqd:%s %s\n# TYPE awqd:%s gauge\nawqd:%s %.17g\n", name, help, name, name, v);
}

static void counter(struct out *o, const char *name, const char *help, uint64_t v) {
    put(o, "# HELP awqd:%s %s\n# TYPE awqd:%s counter\nawqd:%s %llu\n", name, help, name, name,
        (unsigned long long)v);
}

char *metrics_render(const struct metrics *m, const struct engine_stats *st, int loading,
                     size_t *len) {
    struct out o = {0};
    struct engine_stats z = {0};
    if (!st) st = &z;
    gauge(&o, "model_loaded", "1 once the model is loaded and the server is ready", !loading);
    gauge(&o, "num_requests_running", "requests with sequences in the running batch", st->running);
    gauge(&o, "num_requests_waiting", "requests waiting to be scheduled", st->waiting);
    gauge(&o, "kv_cache_usage_perc", "fraction of KV-cache blocks in use (0 to 1)",
          st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    gauge(&o, "kv_cache_blocks_used", "KV-cache blocks in use", st->kv_blocks_used);
    gauge(&o, "kv_cache_blocks_total", "KV-cache blocks in the pool", st->kv_blocks_total);
    counter(&o, "prompt_tokens_total", "prompt tokens prefilled (recomputes not counted)",
            st->prompt_tokens);
    counter(&o, "generation_tokens_total", "tokens generated", st->generation_tokens);
    counter(&o, "num_preemptions_total", "requests preempted (recompute)", st->preemptions);
    counter(&o, "engine_steps_total", "scheduler steps run", st->steps);
    put(&o, "# HELP awqd:request_success_total choices finished, by finish reason\n"
            "# TYPE awqd:request_success_total counter\n");
    static const char *names[5] = {"none", "stop", "length", "cancelled", "error"};
    for (int i = 1; i < 5; i++)
        put(&o, "awqd:request_success_total{finished_reason=\"%s\"} %llu\n", names[i],
            (unsigned long long)m->finished[i]);
    put(&o, "# HELP awqd:http_responses_total HTTP answers by status class\n"
            "# TYPE awqd:http_responses_total counter\n");
    for (int c = 2; c <= 5; c++)
        put(&o, "awqd:http_responses_total{code=\"%dxx\"} %llu\n", c,
            (unsigned long long)m->http_by_class[c]);
    counter(&o, "requests_rejected_queue_full_total", "requests answered 429 (waiting queue full)",
            m->rejected_queue_full);
    hist(&o, "time_to_first_token_seconds", "time from request arrival to the first token",
         &m->ttft);
    hist(&o, "inter_token_latency_seconds", "time between two tokens of one choice", &m->itl);
    hist(&o, "e2e_request_latency_seconds", "time from request arrival to the last byte",
         &m->e2e);
    hist(&o, "request_queue_time_seconds", "time from submission to the first scheduler step",
         &m->queue);
    if (len) *len = o.len;
    return o.s;
}
