/* pool.c — the CPU backend's thread pool: n-1 workers plus the caller share
 * the chunks of one job at a time; a generation counter wakes the workers and
 * a countdown tells the caller when the last chunk is done. */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct cpu_pool {
    int n_threads;                /* including the caller */
    pthread_t *threads;           /* [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t wake;          /* workers wait for a new generation */
    pthread_cond_t done;          /* caller waits for active == 0 */
    unsigned long gen;            /* bumped per job */
    int stop;
    int active;                   /* workers still inside the current job */
    /* the current job */
    void (*fn)(void *arg, int begin, int end);
    void *arg;
    int n, chunk;
    int next;                     /* next unclaimed index (under mu) */
};

static int claim(struct cpu_pool *p, int *b, int *e) {
    pthread_mutex_lock(&p->mu);
    int ok = p->next < p->n;
    if (ok) {
        *b = p->next;
        *e = p->next + p->chunk < p->n ? p->next + p->chunk : p->n;
        p->next = *e;
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

static void *worker(void *arg) {
    struct cpu_pool *p = arg;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        int b, e;
        while (claim(p, &b, &e)) p->fn(p->arg, b, e);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

int cpu_pool_init(struct cpu_pool **out, int n_threads) {
    *out = NULL;
    struct cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (p->n_threads > 1) {
        p->threads = calloc((size_t)p->n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            cpu_pool_free(p);
            return -ENOMEM;
        }
        for (int i = 0; i < p->n_threads - 1; i++) {
            if (pthread_create(&p->threads[i], NULL, worker, p)) {
                p->n_threads = i + 1; /* joins the i started ones */
                cpu_pool_free(p);
                return -EAGAIN;
            }
        }
    }
    *out = p;
    return 0;
}

void cpu_pool_free(struct cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int cpu_pool_threads(const struct cpu_pool *p) { return p->n_threads; }

void cpu_pool_run(struct cpu_pool *p, int n, int min_chunk,
                  void (*fn)(void *arg, int begin, int end), void *arg) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    if (p->n_threads <= 1 || n <= min_chunk) {
        fn(arg, 0, n);
        return;
    }
    int chunk = (n + p->n_threads * 4 - 1) / (p->n_threads * 4);
    if (chunk < min_chunk) chunk = min_chunk;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    p->next = 0;
    p->active = p->n_threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    int b, e;
    while (claim(p, &b, &e)) fn(arg, b, e);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
