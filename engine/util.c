/* util.c — see util.h. */
#include "engine/util.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static volatile int g_level = LOG_INFO;

void log_set_level(enum log_level lv) { g_level = lv; }
enum log_level log_get_level(void) { return (enum log_level)g_level; }

int log_level_parse(const char *s, enum log_level *out) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) { *out = (enum log_level)i; return 0; }
    return -EINVAL;
}

void log_msg(enum log_level lv, const char *fmt, ...) {
    if ((int)lv < g_level) return;
    static const char *tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[lv]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    /* one write() per line so lines from several threads never interleave */
    ssize_t w = write(2, line, len);
    (void)w;
}

int util_err(char *err, size_t errlen, int rc, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int util_write_file(const char *path, const void *data, size_t len, int newline, char *err,
                    size_t errlen) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        return util_err(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    int ok = fwrite(data, 1, len, f) == len && (!newline || fputc('\n', f) != EOF);
    ok = fclose(f) == 0 && ok;
    return ok ? 0 : util_err(err, errlen, -EIO, "%s: write failed", path);
}

int util_open_regular(const char *path, int *fd, size_t *size, char *err, size_t errlen) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        int e = errno;
        return util_err(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return util_err(err, errlen, -EINVAL, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    return 0;
}

int util_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                   char *err, size_t errlen) {
    *out = NULL;
    if (len) *len = 0;
    int fd;
    size_t size;
    int rc = util_open_regular(path, &fd, &size, err, errlen);
    if (rc) return rc;
    if (max_bytes && size > max_bytes) {
        close(fd);
        return util_err(err, errlen, -EFBIG, "%s: %zu bytes, more than the %zu allowed", path, size,
                        max_bytes);
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return util_err(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes", path, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(buf);
        return util_err(err, errlen, -EIO, "%s: short read (%zu of %zu bytes)", path, got, size);
    }
    buf[size] = 0;
    *out = buf;
    if (len) *len = size;
    return 0;
}

uint64_t util_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double util_now_s(void) { return (double)util_now_ns() * 1e-9; }

void util_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "awqd: internal error: assertion `%s` failed at %s:%d\n", expr, file, line);
    abort();
}

int util_env_is_zero(const char *name) {
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}

int util_cpus(int cap) {
    long n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n < 1) n = sysconf(_SC_NPROCESSORS_ONLN); /* more CPUs than cpu_set_t holds, or no mask */
    if (n < 1) n = 1;
    if (cap > 0 && n > cap) n = cap;
    return (int)n;
}

int util_parse_int_list(const char *s, int *out, int max) {
    int n = 0;
    const char *p = s;
    if (!*p) return 0;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < -2147483647L - 1 || v > 2147483647L) return -EINVAL;
        if (n >= max) return -E2BIG;
        out[n++] = (int)v;
        while (*end == ' ') end++;
        if (*end == 0) return n;
        if (*end != ',') return -EINVAL;
        p = end + 1;
        while (*p == ' ') p++;
    }
}

/* ---- one string member of a one-line JSON object, NUL-safe ---------------- */


static int json_hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Decodes the JSON string at *pp (on its opening quote) into out (room for
 * as many bytes as the source has); *pp moves past the closing quote. A lone
 * surrogate becomes U+FFFD, as cJSON would reject it anyway. */
static int json_str(const char **pp, const char *end, char *out, size_t *olen) {
    const char *p = *pp;
    size_t o = 0;
    if (p >= end || *p != '"') return -1;
    for (p++; p < end && *p != '"'; p++) {
        if (*p != '\\') { if (out) out[o] = *p; o++; continue; }
        if (++p >= end) return -1;
        unsigned cp;
        switch (*p) {
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            unsigned lo;
            if (end - p < 5 || json_hex4(p + 1, &cp)) return -1;
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 7 && p[1] == '\\' && p[2] == 'u' && !json_hex4(p + 3, &lo) &&
                lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
            break;
        }
        default: cp = (unsigned char)*p; break; /* \" \\ \/ */
        }
        char b[4];
        size_t k = cp < 0x80 ? (b[0] = (char)cp, 1)
                 : cp < 0x800 ? (b[0] = (char)(0xC0 | (cp >> 6)), b[1] = (char)(0x80 | (cp & 0x3F)), 2)
                 : cp < 0x10000 ? (b[0] = (char)(0xE0 | (cp >> 12)), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
                                   b[2] = (char)(0x80 | (cp & 0x3F)), 3)
                 : (b[0] = (char)(0xF0 | (cp >> 18)), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
                    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), 4);
        if (out) memcpy(out + o, b, k);
        o += k;
    }
    if (p >= end) return -1;
    *pp = p + 1;
    *olen = o;
    return 0;
}

int util_json_string_member(const char *line, size_t len, const char *key, char **out,
                            size_t *olen) {
    size_t keylen = strlen(key);
    const char *p = line, *end = line + len;
    while (p < end && *p != '{') p++;
    p++;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ',')) p++;
        if (p >= end || *p == '}') return -1;
        const char *k = p;
        size_t kl;
        if (json_str(&p, end, NULL, &kl)) return -1;
        int is_key = (size_t)(p - k) == keylen + 2 && memcmp(k + 1, key, keylen) == 0;
        while (p < end && (*p == ' ' || *p == '\t' || *p == ':')) p++;
        if (p < end && *p == '"') {
            const char *v = p;
            size_t vl;
            if (json_str(&p, end, NULL, &vl)) return -1;
            if (is_key) {
                char *b = malloc(vl + 1);
                if (!b) return -1;
                json_str(&v, end, b, &vl);
                b[vl] = 0;
                *out = b;
                *olen = vl;
                return 0;
            }
        } else { /* skip a nested value, minding strings inside it */
            int depth = 0;
            while (p < end && !(depth == 0 && (*p == ',' || *p == '}'))) {
                if (*p == '"') { size_t d; if (json_str(&p, end, NULL, &d)) return -1; continue; }
                if (*p == '[' || *p == '{') depth++;
                if (*p == ']' || *p == '}') depth--;
                p++;
            }
        }
    }
    return -1;
}
