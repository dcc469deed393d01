/* shard_writer.h — writes a planned list of tensors into a checkpoint's
 * safetensors shards (and the index when there is more than one) with a pool
 * of threads. The caller cuts the work into units (a range of rows, one AWQ
 * group, ...) and supplies the function that computes a unit's bytes; the
 * writer owns the files, the shard names, the thread pool, the first error
 * and the progress line. Used by `awqd mkmodel` (engine/mkmodel.c) and
 * `awqd quantize` (engine/cmd_quantize.c).
 *
 * Usage:
 *     int shard[n];
 *     uint64_t total;
 *     int n_shards = sw_plan_shards(t, n, 4000000000ull, shard, &total);
 *     struct shard_writer *w;
 *     if (sw_open(outdir, t, n, shard, n_shards, &w, err, sizeof err)) ...
 *     sw_add_unit(w, (struct sw_unit){.t = i, .a = 0, .b = rows});  ...
 *     rc = sw_run(w, threads, my_unit_fn, my_ctx, "mkmodel qwen3-8b", err, sizeof err);
 *     rc = sw_close(w, rc, err, sizeof err);
 *
 * Inside my_unit_fn(ctx, w, u): compute, then sw_put(w, t, byte_off, data,
 * len) for each piece (any tensor, e.g. a qweight's scales too); on a
 * failure call sw_fail(w, "message") or return the negative result of
 * sw_put. The first failure stops the other threads and is what sw_run
 * reports.
 *
 * Thread safety: sw_put / sw_fail from any unit function at once; the rest
 * from one thread. */
#ifndef AWQD_SHARD_WRITER_H
#define AWQD_SHARD_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/safetensors.h"

struct shard_writer;

/* One piece of work: tensor t, a caller-defined range [a, b) and kind. */
struct sw_unit {
    int t;
    int kind;
    int64_t a, b;
};

/* Computes a unit and writes its bytes with sw_put. 0 / negative. */
typedef int (*sw_unit_fn)(void *ctx, struct shard_writer *w, const struct sw_unit *u);

/* Assigns tensors to shards in order, starting a new shard when the next
 * tensor would take the current one past max_bytes (0: one shard). shard:
 * [n] out; *total: all tensor bytes. Returns the number of shards. */
int sw_plan_shards(const struct st_desc *t, int n, uint64_t max_bytes, int *shard,
                   uint64_t *total);

/* The file name of shard s of n_shards: "model.safetensors" or
 * "model-00001-of-00003.safetensors". */
void sw_shard_name(int n_shards, int s, char *buf, size_t len);

/* Creates the shard files in outdir (an existing folder) for tensors t[n]
 * (data unused) placed by shard[n], and the index when n_shards > 1; a stale
 * single file or index from an earlier run is removed first. */
int sw_open(const char *outdir, const struct st_desc *t, int n, const int *shard, int n_shards,
            struct shard_writer **out, char *err, size_t errlen);

/* Queues a unit for sw_run. 0 / -ENOMEM. */
int sw_add_unit(struct shard_writer *w, struct sw_unit u);

/* Runs every queued unit on `threads` threads (0: one per CPU, at most 64).
 * label != NULL: a progress line on stderr every 2 s and a summary when the
 * tensors total 1 GiB or more. Returns 0 or the first failure (message in
 * err). */
int sw_run(struct shard_writer *w, int threads, sw_unit_fn fn, void *ctx, const char *label,
           char *err, size_t errlen);

/* Writes len bytes at byte offset off of tensor t. 0, or -EIO after
 * recording the error (the run then stops). */
int sw_put(struct shard_writer *w, int t, size_t off, const void *data, size_t len);

/* One AWQ group: round-to-nearest quantizes wf (fp32, fp16-exact, [N, G]:
 * G consecutive input rows k of each of the N output columns; awq_pack.h)
 * and writes rows [g * G, (g + 1) * G) of the qweight tensor t_qw and row g
 * of t_qz (qzeros) and t_sc (scales). 0, -ENOMEM or -EIO. */
int sw_put_awq_group(struct shard_writer *w, int t_qw, int t_qz, int t_sc, int64_t g, int G,
                     int N, const float *wf);

/* Records a failure (the first one wins) and stops the run. */
void sw_fail(struct shard_writer *w, const char *msg);

/* Closes (finishes) every shard and frees w (NULL ok). rc: the caller's
 * status so far; returns it, or a close failure when rc was 0. */
int sw_close(struct shard_writer *w, int rc, char *err, size_t errlen);

#endif
