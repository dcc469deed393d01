/* safetensors.h — read (mmap) and write Hugging Face safetensors files.
 *
 * Reading:
 *     struct safetensors *st;
 *     char err[512];
 *     if (safetensors_open_dir("models/tiny", &st, err, sizeof err)) { puts(err); ... }
 *     const struct st_tensor *t = safetensors_find(st, "model.norm.weight");
 *     if (t && t->dtype == ST_F16) { const uint16_t *x = t->data; ... t->shape[0] ... }
 *     safetensors_close(st);
 *
 * safetensors_open maps one file; safetensors_open_dir maps a model directory:
 * `model.safetensors.index.json` (shards named by its weight_map) when present,
 * else `model.safetensors`. Every header is validated before anything is
 * returned: 8-byte length within the file and at most 100 MiB, JSON object,
 * known dtype names, integer shapes, shape x dtype size == data_offsets range,
 * ranges inside the file and not overlapping, no duplicate names. A malformed
 * file gives an error naming the file (and the tensor), never a crash.
 * Tensor data points into a read-only private mapping that lives until
 * safetensors_close. It is as aligned as the file makes it: files written by
 * Hugging Face and by safetensors_write pad the header to 8 bytes (check
 * ((uintptr_t)t->data % 4) before reading int32/fp32 in place, or memcpy).
 *
 * Writing: safetensors_write writes tensors held in memory in one call (to
 * PATH.tmp, then renamed). For files too big for memory, st_writer_open writes
 * the header and sizes the file; threads then fill tensor bytes with
 * st_writer_put (pwrite, any order, thread-safe) and st_writer_close finishes.
 *
 * Thread safety: a struct safetensors is immutable after open; any number of
 * threads may read it. st_writer_put may be called from several threads. */
#ifndef AWQD_SAFETENSORS_H
#define AWQD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* as the reference implementation */

enum st_dtype {
    ST_F16 = 0, ST_BF16, ST_F32, ST_F64,
    ST_I8, ST_I16, ST_I32, ST_I64,
    ST_U8, ST_U16, ST_U32, ST_U64,
    ST_BOOL, ST_F8_E4M3, ST_F8_E5M2,
    ST_NDTYPES
};

/* "F16" etc. as in the file; "?" for an invalid value. */
const char *st_dtype_name(enum st_dtype dt);
/* "fp16", "bf16", "fp32", "int32", ... for messages. */
const char *st_dtype_pretty(enum st_dtype dt);
size_t st_dtype_size(enum st_dtype dt);
/* Parses a file dtype name; 0 ok, -EINVAL when unknown. */
int st_dtype_parse(const char *s, enum st_dtype *out);

struct st_tensor {
    const char *name;                /* owned by the struct safetensors */
    enum st_dtype dtype;
    int ndim;                        /* 0..ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;                   /* product of shape (1 for a scalar) */
    const void *data;                /* inside the mapping; nbytes long */
    size_t nbytes;
    int file;                        /* index of the file that holds it */
};

struct safetensors {
    int n_tensors;
    struct st_tensor *tensors;       /* [n_tensors], sorted by name */
    int n_files;
    char **file_paths;               /* [n_files] */
    size_t total_bytes;              /* sum of the tensors' nbytes */
    void *priv;
};

int safetensors_open(const char *path, struct safetensors **out, char *err, size_t errlen);
int safetensors_open_dir(const char *dir, struct safetensors **out, char *err,
                         size_t errlen);
/* NULL when absent. O(log n). */
const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
/* Base name of the file holding t (for messages). */
const char *safetensors_file_of(const struct safetensors *st, const struct st_tensor *t);
void safetensors_close(struct safetensors *st);

/* Formats "int32 [12288, 512]" into buf; returns buf. */
char *st_format_type(enum st_dtype dt, int ndim, const int64_t *shape, char *buf, size_t len);

/* One tensor to write. data is read by safetensors_write, ignored by st_writer_open. */
struct st_desc {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;                /* numel * dtype size bytes */
};

int safetensors_write(const char *path, const struct st_desc *t, int n, char *err,
                      size_t errlen);

struct st_writer;
/* Creates PATH (truncating), writes the header (tensors laid out in the given
 * order, 8-aligned data) and sizes the file. */
int st_writer_open(const char *path, const struct st_desc *t, int n, struct st_writer **out,
                   char *err, size_t errlen);
/* Writes len bytes at byte offset `off` inside tensor i. Thread-safe. */
int st_writer_put(struct st_writer *w, int i, size_t off, const void *data, size_t len,
                  char *err, size_t errlen);
size_t st_writer_tensor_bytes(const struct st_writer *w, int i);
/* fsyncs nothing, closes; returns the first write error if any. */
int st_writer_close(struct st_writer *w, char *err, size_t errlen);

#endif
