/* env_knob.h — the CUDA backend's process-wide dispatch knobs: a value read
 * from the environment on first use, which a C entry point (for tests and
 * measurements) may set instead. Host C++ only (kernels/cuda/w4a16.cu,
 * w4a16_gemm.cu). Reads and writes are relaxed atomics: the worker threads
 * of a tensor-parallel group read them concurrently, and a value set
 * before the first read wins over the environment. */
#ifndef AWQD_ENV_KNOB_H
#define AWQD_ENV_KNOB_H

#include <stdlib.h>

#include <atomic>

extern "C" {
#include "engine/util.h"
}

/* An on/off switch: on unless its variable is "0". */
struct env_switch {
    std::atomic<int> v; /* -1: not read yet */
    const char *env;
};

/* The mode in effect */
static inline int switch_get(env_switch *sw) {
    int v = sw->v.load(std::memory_order_relaxed);
    if (v < 0) {
        int expect = -1;
        sw->v.compare_exchange_strong(expect, util_env_is_zero(sw->env) ? 0 : 1);
        v = sw->v.load(std::memory_order_relaxed);
    }
    return v;
}

/* mode >= 0 sets it (any non-zero: on), < 0 only queries; returns the mode in effect */
static inline int switch_set(env_switch *sw, int mode) {
    if (mode >= 0) sw->v.store(mode ? 1 : 0, std::memory_order_relaxed);
    return switch_get(sw);
}

/* An integer in [lo, hi]: its variable's value (atoi) when in range, else def. */
struct env_knob {
    std::atomic<int> v; /* lo - 1: not read yet (ENV_KNOB_INIT) */
    const char *env;
    int def, lo, hi;
};
#define ENV_KNOB_INIT(env, def, lo, hi) {{(lo) - 1}, env, def, lo, hi}

static inline int knob_get(env_knob *k) {
    int v = k->v.load(std::memory_order_relaxed);
    if (v < k->lo) {
        const char *e = getenv(k->env);
        int r = e ? atoi(e) : k->def;
        if (r < k->lo || r > k->hi) r = k->def;
        int expect = v;
        k->v.compare_exchange_strong(expect, r);
        v = k->v.load(std::memory_order_relaxed);
    }
    return v;
}

/* v in [lo, hi] sets it, anything else only queries; returns the value in effect */
static inline int knob_set(env_knob *k, int v) {
    if (v >= k->lo && v <= k->hi) k->v.store(v, std::memory_order_relaxed);
    return knob_get(k);
}

#endif
