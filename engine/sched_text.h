/* sched_text.h — the text side of one generated sequence (scheduler-internal):
 * token bytes come in, text goes out that
 *   - is valid UTF-8 and never splits a character across two deltas (bytes
 *     that can only become a character later wait; bytes that never can
 *     become U+FFFD),
 *   - never contains any part of a stop string: a tail that could be the
 *     start of a stop string waits until it is decided, even across tokens.
 *
 *     struct stop_text st; stop_text_init(&st, stops, n_stops, include_stop);
 *     int hit = stop_text_feed(&st, bytes, n, &out);   // appends safe text to out
 *     ... hit: a stop string matched; generation finishes with "stop" ...
 *     stop_text_flush(&st, &out);                      // at the end: the rest
 *     stop_text_free(&st);
 *
 * Thread safety: none (one sequence, the scheduler thread). */
#ifndef AWQD_SCHED_TEXT_H
#define AWQD_SCHED_TEXT_H

#include <stddef.h>

struct text_buf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
};

int text_buf_append(struct text_buf *b, const char *s, size_t n);
void text_buf_free(struct text_buf *b);

struct stop_text {
    struct text_buf pending;     /* bytes not yet emitted */
    const char *const *stops;    /* [n_stops] NUL-terminated (not owned) */
    int n_stops;
    int include_stop;
    int stopped;
};

void stop_text_init(struct stop_text *st, const char *const *stops, int n_stops,
                    int include_stop);
/* Returns 1 when a stop string matched (the text up to it, plus the stop
 * string when include_stop, is appended to out; later feeds are ignored), 0
 * otherwise, -ENOMEM. */
int stop_text_feed(struct stop_text *st, const char *bytes, size_t n, struct text_buf *out);
/* Emits what is pending (incomplete UTF-8 as U+FFFD). */
int stop_text_flush(struct stop_text *st, struct text_buf *out);
void stop_text_free(struct stop_text *st);

#endif
