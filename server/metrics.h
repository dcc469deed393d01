/* metrics.h — the daemon's Prometheus metrics (`GET /metrics`, text format
 * 0.0.4, every name prefixed "awqd:"). Counters and histograms are kept here
 * (loop thread); engine gauges are read from engine_stats() at render time.
 *
 * Thread safety: none; the loop thread owns it. */
#ifndef AWQD_METRICS_H
#define AWQD_METRICS_H

#include "engine/engine.h"

#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_BUCKETS 24

struct histogram {
    int n_bounds;
    double bounds[METRICS_MAX_BUCKETS]; /* upper bounds in seconds, ascending */
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket (not cumulative), + the +Inf one */
    double sum;
    uint64_t count;
};

struct metrics {
    struct histogram ttft;          /* time to first token */
    struct histogram itl;           /* inter-token latency */
    struct histogram e2e;           /* end-to-end request latency */
    struct histogram queue;         /* time waiting before the first step */
    uint64_t finished[5];           /* choices finished, by enum engine_finish */
    uint64_t http_by_class[6];      /* answers by status class: [2] = 2xx ... [5] = 5xx */
    uint64_t rejected_queue_full;   /* 429 */
};

void metrics_init(struct metrics *m);
void histogram_observe(struct histogram *h, double seconds);
void metrics_count_status(struct metrics *m, int status);

/* Renders everything (with the engine's gauges when st != NULL) into a
 * malloc'd NUL-terminated string. */
char *metrics_render(const struct metrics *m, const struct engine_stats *st, int loading,
                     size_t *len);

#endif
