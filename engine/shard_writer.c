/* shard_writer.c — parallel writer of a checkpoint's safetensors shards. */
#include "engine/shard_writer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/awq_pack.h"
#include "engine/util.h"

#define SW_MAX_THREADS 64

struct shard_writer {
    int n, n_shards;
    uint64_t total;               /* bytes of all tensors */
    struct st_writer **w;         /* [n_shards] */
    int *shard, *local;           /* [n] shard of each tensor, index inside it */
    struct sw_unit *u;            /* [n_units] queued work */
    int n_units, cap;
    sw_unit_fn fn;
    void *ctx;
    int next;                     /* atomic: next unit */
    int failed;                   /* atomic */
    int done_threads;             /* atomic */
    uint64_t done;                /* atomic: bytes written */
    char err[512];
    pthread_mutex_t err_lock;
};

static uint64_t tensor_bytes(const struct st_desc *d) {
    uint64_t nb = st_dtype_size(d->dtype);
    for (int i = 0; i < d->ndim; i++) nb *= (uint64_t)d->shape[i];
    return nb;
}

int sw_plan_shards(const struct st_desc *t, int n, uint64_t max_bytes, int *shard,
                   uint64_t *total) {
    uint64_t in_shard = 0, sum = 0;
    int s = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = tensor_bytes(&t[i]);
        if (max_bytes && in_shard > 0 && in_shard + nb > max_bytes) {
            s++;
            in_shard = 0;
        }
        in_shard += nb;
        shard[i] = s;
        sum += nb;
    }
    if (total) *total = sum;
    return s + 1;
}

void sw_shard_name(int n_shards, int s, char *buf, size_t len) {
    if (n_shards == 1) snprintf(buf, len, "model.safetensors");
    else snprintf(buf, len, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
}

static int write_index(const char *outdir, const struct st_desc *t, int n, const int *shard,
                       int n_shards, uint64_t total, char *err, size_t errlen) {
    cJSON *ix = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(ix, "metadata"), "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(ix, "weight_map");
    char name[64], path[4096];
    for (int i = 0; i < n; i++) {
        sw_shard_name(n_shards, shard[i], name, sizeof name);
        cJSON_AddStringToObject(wm, t[i].name, name);
    }
    char *text = cJSON_Print(ix);
    cJSON_Delete(ix);
    if (!text) return util_err(err, errlen, -ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", outdir);
    int rc = util_write_file(path, text, strlen(text), 1, err, errlen);
    free(text);
    return rc;
}

int sw_open(const char *outdir, const struct st_desc *t, int n, const int *shard, int n_shards,
            struct shard_writer **out, char *err, size_t errlen) {
    *out = NULL;
    struct shard_writer *w = calloc(1, sizeof *w);
    if (!w) return util_err(err, errlen, -ENOMEM, "out of memory");
    pthread_mutex_init(&w->err_lock, NULL);
    w->n = n;
    w->n_shards = n_shards;
    w->w = calloc((size_t)n_shards, sizeof *w->w);
    w->shard = malloc(((size_t)n + 1) * sizeof *w->shard);
    w->local = malloc(((size_t)n + 1) * sizeof *w->local);
    struct st_desc *sd = calloc((size_t)n + 1, sizeof *sd);
    int rc = 0;
    if (!w->w || !w->shard || !w->local || !sd) {
        rc = util_err(err, errlen, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        w->shard[i] = shard[i];
        w->total += tensor_bytes(&t[i]);
    }
    char path[4096], name[64];
    /* a stale single file or index from an earlier run would shadow the new shards */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", outdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    unlink(path);
    for (int s = 0; s < n_shards; s++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (shard[i] == s) {
                w->local[i] = k;
                sd[k++] = t[i];
            }
        sw_shard_name(n_shards, s, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", outdir, name);
        if ((rc = st_writer_open(path, sd, k, &w->w[s], err, errlen))) goto out;
    }
    if (n_shards > 1)
        rc = write_index(outdir, t, n, shard, n_shards, w->total, err, errlen);
out:
    free(sd);
    if (rc) {
        char e2[8];
        sw_close(w, rc, e2, sizeof e2);
        return rc;
    }
    *out = w;
    return 0;
}

int sw_add_unit(struct shard_writer *w, struct sw_unit u) {
    if (w->n_units == w->cap) {
        int nc = w->cap ? 2 * w->cap : 1024;
        struct sw_unit *nu = realloc(w->u, (size_t)nc * sizeof *nu);
        if (!nu) return -ENOMEM;
        w->u = nu;
        w->cap = nc;
    }
    w->u[w->n_units++] = u;
    return 0;
}

void sw_fail(struct shard_writer *w, const char *msg) {
    pthread_mutex_lock(&w->err_lock);
    if (!w->failed) snprintf(w->err, sizeof w->err, "%s", msg);
    __atomic_store_n(&w->failed, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->err_lock);
}

int sw_put(struct shard_writer *w, int t, size_t off, const void *data, size_t len) {
    char e[512];
    if (st_writer_put(w->w[w->shard[t]], w->local[t], off, data, len, e, sizeof e)) {
        sw_fail(w, e);
        return -EIO;
    }
    __atomic_fetch_add(&w->done, (uint64_t)len, __ATOMIC_RELAXED);
    return 0;
}

int sw_put_awq_group(struct shard_writer *w, int t_qw, int t_qz, int t_sc, int64_t g, int G,
                     int N, const float *wf) {
    uint8_t *codes = malloc((size_t)G * N);    /* [G, N] */
    uint32_t *qw = malloc((size_t)G * N / 2);  /* int32 [G, N/8] */
    uint16_t *sc = malloc((size_t)N * 2);      /* fp16 [N] */
    uint8_t *zc = malloc((size_t)N);           /* [N] */
    uint32_t *qz = malloc((size_t)N / 2);      /* int32 [N/8] */
    int rc = -ENOMEM;
    if (codes && qw && sc && zc && qz) {
        awq_rtn_group_f32(wf, G, N, sc, zc, codes);
        awq_pack(codes, G, N, qw);
        awq_pack(zc, 1, N, qz);
        int64_t k0 = g * G;
        if (!(rc = sw_put(w, t_qw, (size_t)k0 * (size_t)(N / 8) * 4, qw, (size_t)G * N / 2)) &&
            !(rc = sw_put(w, t_qz, (size_t)g * (size_t)(N / 8) * 4, qz, (size_t)N / 2)))
            rc = sw_put(w, t_sc, (size_t)g * (size_t)N * 2, sc, (size_t)N * 2);
    }
    free(codes);
    free(qw);
    free(sc);
    free(zc);
    free(qz);
    return rc;
}

static void *worker(void *arg) {
    struct shard_writer *w = arg;
    for (;;) {
        if (__atomic_load_n(&w->failed, __ATOMIC_RELAXED)) break;
        int i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED);
        if (i >= w->n_units) break;
        int rc = w->fn(w->ctx, w, &w->u[i]);
        if (rc) {
            if (!__atomic_load_n(&w->failed, __ATOMIC_RELAXED)) sw_fail(w, strerror(-rc));
            break;
        }
    }
    __atomic_fetch_add(&w->done_threads, 1, __ATOMIC_RELEASE);
    return NULL;
}

int sw_run(struct shard_writer *w, int threads, sw_unit_fn fn, void *ctx, const char *label,
           char *err, size_t errlen) {
    w->fn = fn;
    w->ctx = ctx;
    int nth = threads > 0 ? threads : util_cpus(0);
    if (nth > SW_MAX_THREADS) nth = SW_MAX_THREADS;
    if (nth > w->n_units) nth = w->n_units > 0 ? w->n_units : 1;
    pthread_t th[SW_MAX_THREADS];
    int started = 0;
    double t0 = util_now_s(), last = t0;
    int progress = label && w->total >= (1ull << 30);
    for (int i = 0; i < nth && nth > 1; i++)
        if (pthread_create(&th[i], NULL, worker, w) == 0) started++;
    if (!started) worker(w);
    while (started && __atomic_load_n(&w->done_threads, __ATOMIC_ACQUIRE) < started) {
        usleep(100000);
        double now = util_now_s();
        if (progress && now - last >= 2.0) {
            last = now;
            uint64_t d = __atomic_load_n(&w->done, __ATOMIC_RELAXED);
            fprintf(stderr, "%s: %5.1f%% (%.2f of %.2f GB written, %.0f MB/s)\n", label,
                    100.0 * (double)d / (double)w->total, d / 1e9, w->total / 1e9,
                    d / 1e6 / (now - t0));
        }
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (w->failed) return util_err(err, errlen, -EIO, "%s", w->err);
    if (progress)
        fprintf(stderr, "%s: wrote %.2f GB in %.1f s with %d threads\n", label, w->total / 1e9,
                util_now_s() - t0, started ? started : 1);
    return 0;
}

int sw_close(struct shard_writer *w, int rc, char *err, size_t errlen) {
    if (!w) return rc;
    for (int s = 0; w->w && s < w->n_shards; s++) {
        char e2[512];
        if (w->w[s] && st_writer_close(w->w[s], e2, sizeof e2) && !rc)
            rc = util_err(err, errlen, -EIO, "%s", e2);
    }
    pthread_mutex_destroy(&w->err_lock);
    free(w->w);
    free(w->shard);
    free(w->local);
    free(w->u);
    free(w);
    return rc;
}
