/* util.h — small things every module uses: logging, error messages into a
 * caller's buffer, reading whole files, monotonic time.
 *
 * Thread safety: all functions may be called from any thread. */
#ifndef AWQD_UTIL_H
#define AWQD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Log level for the process (default LOG_INFO); lines go to stderr as
 * "2026-11-21T19:22:01.123Z INFO  message". */
void log_set_level(enum log_level lv);
enum log_level log_get_level(void);
int log_level_parse(const char *s, enum log_level *out); /* 0 ok, -EINVAL */
void log_msg(enum log_level lv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* Writes a message into err[errlen] (when err != NULL) and returns rc, so
 * failure paths read `return util_err(err, errlen, -EINVAL, "bad %s", x);` */
int util_err(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Opens path read-only (close-on-exec) as a regular file: *fd and its *size
 * on success; else -errno (-EINVAL for a directory or device) and a message
 * naming the file, nothing left open. */
int util_open_regular(const char *path, int *fd, size_t *size, char *err, size_t errlen);

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len excludes the
 * NUL). Fails with -errno and a message naming the file; refuses files larger
 * than max_bytes (0 = no limit) with -EFBIG. */
int util_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                   char *err, size_t errlen);

/* Writes data[0..len) to path (created or truncated), then, when
 * newline, a '\n'. Fails with -errno / -EIO and a message naming the file. */
int util_write_file(const char *path, const void *data, size_t len, int newline, char *err,
                    size_t errlen);

/* Monotonic time in nanoseconds and seconds. */
uint64_t util_now_ns(void);
double util_now_s(void);

/* Invariant check: always on, prints file/line and aborts. Never for input. */
#define AWQD_ASSERT(c) do { if (!(c)) util_assert_fail(#c, __FILE__, __LINE__); } while (0)
void util_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* 1 when environment variable `name` is "0": the switches that are on
 * unless set to 0 (AWQD_CUDA_GRAPHS=0, AWQD_COMM_PDL=0, ...). */
int util_env_is_zero(const char *name);

/* The CPUs this thread may run on: its affinity mask (systemd's
 * CPUAffinity=, taskset, a cgroup cpuset), else the online count; at least
 * 1, and at most cap where cap > 0. The default for every thread count. */
int util_cpus(int cap);

/* Parses "1,2,3" into ints; returns the count or -EINVAL / -E2BIG. */
int util_parse_int_list(const char *s, int *out, int max);

/* Finds the top-level member `key` of a one-line JSON object (already
 * validated, e.g. by cJSON) whose value is a string, and decodes it into a
 * malloc'd, NUL-terminated buffer (*olen bytes, which may include NULs from
 * \u0000, where cJSON would stop). Lone surrogates become U+FFFD. 0, or -1
 * when the key is absent, not a string, or the line malformed. */
int util_json_string_member(const char *line, size_t len, const char *key, char **out,
                            size_t *olen);

#endif
