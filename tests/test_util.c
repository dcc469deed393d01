/* test_util.c — engine/util.c helpers without a suite of their own:
 * util_cpus, the default thread count of the CPU backend, the checkpoint
 * reader, the shard writer and the CUDA upload's repack, which follows the
 * affinity mask (systemd's CPUAffinity=, taskset) rather than the machine's
 * online count. */
#include <pthread.h>
#include <sched.h>
#include "tests/harness/test.h"

#include "engine/util.h"

TEST(util, cpus_is_the_affinity_mask_capped) {
    cpu_set_t set;
    ASSERT_EQ_INT(sched_getaffinity(0, sizeof set, &set), 0);
    const int n = CPU_COUNT(&set);
    ASSERT(n >= 1);
    ASSERT_EQ_INT(util_cpus(0), n);
    ASSERT_EQ_INT(util_cpus(1), 1);
    ASSERT_EQ_INT(util_cpus(n + 5), n);
    ASSERT_EQ_INT(util_cpus(-3), n); /* no cap */
}

static void *pinned_count(void *arg) {
    *(int *)arg = util_cpus(0);
    return NULL;
}

TEST(util, cpus_follows_a_narrowed_mask) {
    cpu_set_t set;
    ASSERT_EQ_INT(sched_getaffinity(0, sizeof set, &set), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &set)) first = c;
    ASSERT(first >= 0);
    /* a thread started with a one-CPU mask (as under taskset -c N) */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    pthread_attr_t attr;
    ASSERT_EQ_INT(pthread_attr_init(&attr), 0);
    ASSERT_EQ_INT(pthread_attr_setaffinity_np(&attr, sizeof one, &one), 0);
    int got = -1;
    pthread_t th;
    const int rc = pthread_create(&th, &attr, pinned_count, &got);
    pthread_attr_destroy(&attr);
    ASSERT_EQ_INT(rc, 0);
    pthread_join(th, NULL);
    ASSERT_EQ_INT(got, 1);
}
