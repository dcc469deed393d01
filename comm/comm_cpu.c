/* comm_cpu.c — the single-rank communicator and an in-process group of CPU
 * ranks (threads + a barrier) for tensor-parallel tests on the CPU backend.
 *
 * all_reduce_sum of a group: every rank publishes its buffer, barrier; each
 * rank sums its own slice of the elements over all ranks in rank order into
 * a shared scratch; barrier; every rank copies the scratch back; barrier. The
 * result is bit-identical on every rank. */
#include "comm/comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* --- single rank -------------------------------------------------------- */

static int single_all_reduce(struct comm *c, struct buf *b, size_t n) { return 0; }
static void single_barrier(struct comm *c) {}
static void single_destroy(struct comm *c) { free(c); }

int comm_cpu_single(struct comm **out) {
    struct comm *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return -ENOMEM;
    c->rank = 0;
    c->size = 1;
    c->graph_safe = 1;            /* a no-op: nothing to record */
    c->all_reduce_sum = single_all_reduce;
    c->barrier = single_barrier;
    c->destroy = single_destroy;
    return 0;
}

/* --- in-process group ---------------------------------------------------- */

struct group {
    int size;
    int refs;                     /* handles not yet freed (under mu) */
    pthread_mutex_t mu;
    pthread_barrier_t bar;
    float **bufs;                 /* [size] each rank's published buffer */
    float *scratch;               /* sum, grown as needed by rank 0 */
    size_t scratch_n;
    int error;                    /* sticky: allocation failure */
};

static void group_barrier(struct comm *c) {
    struct group *g = c->priv;
    pthread_barrier_wait(&g->bar);
}

static int group_all_reduce(struct comm *c, struct buf *b, size_t n) {
    struct group *g = c->priv;
    if (b->kind == BUF_I32 || n > b->n) return -EINVAL;
    g->bufs[c->rank] = cpu_f32(b);
    if (c->rank == 0 && g->scratch_n < n) {
        float *s = realloc(g->scratch, n * sizeof(float));
        if (s) {
            g->scratch = s;
            g->scratch_n = n;
        } else {
            g->error = 1;
        }
    }
    pthread_barrier_wait(&g->bar);
    if (g->error) {
        pthread_barrier_wait(&g->bar);
        pthread_barrier_wait(&g->bar);
        return -ENOMEM;
    }
    size_t per = (n + (size_t)g->size - 1) / (size_t)g->size;
    size_t lo = per * (size_t)c->rank, hi = lo + per < n ? lo + per : n;
    for (size_t i = lo; i < hi; i++) {
        float s = 0;
        for (int r = 0; r < g->size; r++) s += g->bufs[r][i];
        g->scratch[i] = s;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(cpu_f32(b), g->scratch, n * sizeof(float));
    pthread_barrier_wait(&g->bar);
    return 0;
}

static void group_destroy(struct comm *c) {
    struct group *g = c->priv;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    free(c);
    if (!last) return;
    pthread_barrier_destroy(&g->bar);
    pthread_mutex_destroy(&g->mu);
    free(g->bufs);
    free(g->scratch);
    free(g);
}

int comm_cpu_group(int size, struct comm **out) {
    if (size < 1) return -EINVAL;
    for (int r = 0; r < size; r++) out[r] = NULL;
    struct group *g = calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    g->size = size;
    g->bufs = calloc((size_t)size, sizeof *g->bufs);
    if (!g->bufs) {
        free(g);
        return -ENOMEM;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
    for (int r = 0; r < size; r++) {
        struct comm *c = calloc(1, sizeof *c);
        if (!c) {
            if (r == 0) {
                pthread_barrier_destroy(&g->bar);
                pthread_mutex_destroy(&g->mu);
                free(g->bufs);
                free(g);
            }
            for (int i = 0; i < r; i++) {
                comm_free(out[i]);
                out[i] = NULL;
            }
            return -ENOMEM;
        }
        c->rank = r;
        c->size = size;
        c->all_reduce_sum = group_all_reduce;
        c->barrier = group_barrier;
        c->destroy = group_destroy;
        c->priv = g;
        g->refs++;
        out[r] = c;
    }
    return 0;
}

void comm_free(struct comm *c) {
    if (c && c->destroy) c->destroy(c);
}
