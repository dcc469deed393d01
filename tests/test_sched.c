/* test_sched.c — scheduler pieces that run without a model: the stop-string
 * and UTF-8 text stream (engine/sched_text.c). The scheduler itself is tested
 * end to end through the daemon (tests/test_server.c). */
#include "engine/sched_text.h"
#include "tests/harness/test.h"

#include <stdlib.h>

/* Feeds pieces one by one; returns the concatenated output and, in *hit, the
 * index of the piece that hit a stop (-1 none). Checks every delta is valid
 * UTF-8 on its own. */
static char *run(const char *const *stops, int n_stops, int include, const char **pieces,
                 int n, int *hit) {
    struct stop_text st;
    stop_text_init(&st, stops, n_stops, include);
    struct text_buf all = {0};
    *hit = -1;
    for (int i = 0; i < n; i++) {
        struct text_buf out = {0};
        int r = stop_text_feed(&st, pieces[i], strlen(pieces[i]), &out);
        if (out.len) {
            /* every delta is whole characters: its first byte is not a continuation */
            if (((unsigned char)out.data[0] & 0xc0) == 0x80) *hit = -100;
            text_buf_append(&all, out.data, out.len);
        }
        text_buf_free(&out);
        if (r == 1) {
            *hit = i;
            break;
        }
    }
    if (*hit == -1) stop_text_flush(&st, &all);
    stop_text_free(&st);
    if (!all.data) text_buf_append(&all, "", 0);
    return all.data;
}

TEST(sched, stop_string_split_across_tokens) {
    const char *stops[] = {"STOP", "\n\n"};
    const char *p1[] = {"Hello ", "wor", "ld S", "TO", "P more"};
    int hit;
    char *s = run(stops, 2, 0, p1, 5, &hit);
    ASSERT_STR_EQ(s, "Hello world ");
    ASSERT_EQ_INT(hit, 4);
    free(s);
    s = run(stops, 2, 1, p1, 5, &hit);
    ASSERT_STR_EQ(s, "Hello world STOP");
    free(s);
    /* a near miss is released once decided */
    const char *p2[] = {"ST", "OX", "!"};
    s = run(stops, 2, 0, p2, 3, &hit);
    ASSERT_STR_EQ(s, "STOX!");
    ASSERT_EQ_INT(hit, -1);
    free(s);
    const char *p3[] = {"a\n", "\nb"};
    s = run(stops, 2, 0, p3, 2, &hit);
    ASSERT_STR_EQ(s, "a");
    ASSERT_EQ_INT(hit, 1);
    free(s);
}

TEST(sched, stop_text_never_leaks_prefix) {
    /* while undecided, nothing of the stop string's start is emitted */
    const char *stops[] = {"abc"};
    struct stop_text st;
    stop_text_init(&st, stops, 1, 0);
    struct text_buf out = {0};
    ASSERT_EQ_INT(stop_text_feed(&st, "xa", 2, &out), 0);
    ASSERT_STR_EQ(out.data, "x");
    ASSERT_EQ_INT(stop_text_feed(&st, "b", 1, &out), 0);
    ASSERT_STR_EQ(out.data, "x");
    ASSERT_EQ_INT(stop_text_feed(&st, "c", 1, &out), 1);
    ASSERT_STR_EQ(out.data, "x");
    text_buf_free(&out);
    stop_text_free(&st);
}

TEST(sched, utf8_never_split) {
    const char *stops[] = {"zz"};
    /* "你" = e4 bd a0, "😀" = f0 9f 98 80, fed byte-wise */
    const char *p[] = {"\xe4", "\xbd", "\xa0", "\xf0\x9f", "\x98", "\x80", "!"};
    int hit;
    char *s = run(stops, 1, 0, p, 7, &hit);
    ASSERT_EQ_INT(hit, -1);
    ASSERT_STR_EQ(s, "\xe4\xbd\xa0\xf0\x9f\x98\x80!");
    free(s);
    /* invalid bytes become U+FFFD; a truncated tail at the end too */
    const char *q[] = {"a\xff", "b\xe4\xbd"};
    s = run(stops, 1, 0, q, 2, &hit);
    ASSERT_STR_EQ(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    free(s);
    /* a truncated character followed by another: one U+FFFD for the maximal
     * invalid subpart (as Hugging Face decodes), the same with and without a
     * stop string cutting right after it */
    const char *m[] = {"\xe4\xbd", "\xed\x9d\x91", "x"};
    s = run(stops, 1, 0, m, 3, &hit);
    ASSERT_STR_EQ(s, "\xef\xbf\xbd\xed\x9d\x91x");
    free(s);
    const char *stops3[] = {"\xed\x9d\x91"};
    s = run(stops3, 1, 0, m, 3, &hit);
    ASSERT_STR_EQ(s, "\xef\xbf\xbd");
    ASSERT_EQ_INT(hit, 1);
    free(s);
    /* a stop string after a multi-byte character split across tokens */
    const char *stops2[] = {"\xe5\xa5\xbd"}; /* 好 */
    const char *r[] = {"\xe4\xbd", "\xa0\xe5", "\xa5", "\xbd"};
    s = run(stops2, 1, 0, r, 4, &hit);
    ASSERT_STR_EQ(s, "\xe4\xbd\xa0");
    ASSERT_EQ_INT(hit, 3);
    free(s);
}
