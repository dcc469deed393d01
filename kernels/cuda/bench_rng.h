/* bench_rng.h — the random data of `awqd bench kernels` and `awqd bench
 * chain`: xorshift64, 32 bits of each step (state >> 16); each benchmark
 * seeds its own. Header-only, host code. */
#pragma once

#include <stdint.h>

struct bench_rng {
    uint64_t s;
    uint32_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return (uint32_t)(s >> 16);
    }
};
