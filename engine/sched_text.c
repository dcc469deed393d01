/* sched_text.c — stop strings and UTF-8 boundaries for streamed text (see
 * sched_text.h). */
#include "engine/sched_text.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int text_buf_append(struct text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return -ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void text_buf_free(struct text_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void stop_text_init(struct stop_text *st, const char *const *stops, int n_stops,
                    int include_stop) {
    memset(st, 0, sizeof *st);
    st->stops = stops;
    st->n_stops = n_stops;
    st->include_stop = include_stop;
}

void stop_text_free(struct stop_text *st) { text_buf_free(&st->pending); }

/* UTF-8 sequence at s[0..n): returns its length when complete and valid;
 * 0 when it is a valid but incomplete start (more bytes may complete it);
 * -k when s[0..k) is a maximal invalid subpart (one U+FFFD, as HF decodes). */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c == 0xe0) { len = 3; lo = 0xa0; }
    else if (c >= 0xe1 && c <= 0xec) len = 3;
    else if (c == 0xed) { len = 3; hi = 0x9f; }
    else if (c >= 0xee && c <= 0xef) len = 3;
    else if (c == 0xf0) { len = 4; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) len = 4;
    else if (c == 0xf4) { len = 4; hi = 0x8f; }
    else return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return -i;
    }
    return len;
}

/* Appends s[0..n) to out as valid UTF-8. final: an incomplete tail becomes
 * U+FFFD; otherwise it is left: returns how many bytes were consumed. */
static size_t emit_utf8(const char *s, size_t n, int final, struct text_buf *out, int *rc) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of valid bytes not yet copied */
    *rc = 0;
    while (i < n) {
        int l = utf8_seq(p + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (l == 0 && !final) break; /* wait for the rest of this character */
        if (text_buf_append(out, s + run, i - run) || text_buf_append(out, "\xef\xbf\xbd", 3)) {
            *rc = -ENOMEM;
            return i;
        }
        /* a maximal invalid subpart, or an incomplete final sequence, is one
         * replacement character */
        i = l == 0 ? n : i + (size_t)(-l);
        run = i;
    }
    if (text_buf_append(out, s + run, i - run)) *rc = -ENOMEM;
    return i;
}

int stop_text_feed(struct stop_text *st, const char *bytes, size_t n, struct text_buf *out) {
    if (st->stopped) return 1;
    if (text_buf_append(&st->pending, bytes, n)) return -ENOMEM;
    const char *buf = st->pending.data;
    size_t len = st->pending.len;
    if (!buf) return 0;
    /* earliest complete stop string */
    const char *hit = NULL;
    size_t hit_len = 0;
    for (int i = 0; i < st->n_stops; i++) {
        const char *f = memmem(buf, len, st->stops[i], strlen(st->stops[i]));
        if (f && (!hit || f < hit)) {
            hit = f;
            hit_len = strlen(st->stops[i]);
        }
    }
    int rc;
    if (hit) {
        size_t upto = (size_t)(hit - buf) + (st->include_stop ? hit_len : 0);
        emit_utf8(buf, upto, 1, out, &rc);
        st->stopped = 1;
        st->pending.len = 0;
        st->pending.data[0] = 0;
        return rc ? rc : 1;
    }
    /* hold back the longest tail that is a prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < st->n_stops; i++) {
        size_t sl = strlen(st->stops[i]);
        size_t maxk = sl - 1 < len ? sl - 1 : len;
        for (size_t k = maxk; k > hold; k--) {
            if (memcmp(buf + len - k, st->stops[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    size_t used = emit_utf8(buf, len - hold, 0, out, &rc);
    if (rc) return rc;
    memmove(st->pending.data, buf + used, len - used);
    st->pending.len = len - used;
    st->pending.data[st->pending.len] = 0;
    return 0;
}

int stop_text_flush(struct stop_text *st, struct text_buf *out) {
    int rc = 0;
    if (!st->stopped && st->pending.len) emit_utf8(st->pending.data, st->pending.len, 1, out, &rc);
    st->pending.len = 0;
    if (st->pending.data) st->pending.data[0] = 0;
    return rc;
}
