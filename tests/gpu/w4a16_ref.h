/* w4a16_ref.h — host-side helpers of the W4A16 kernel tests, written apart
 * from the code they check: fp32 <-> fp16 bit conversions (round to nearest
 * even, subnormals, inf) and the AWQ nibble order of a packed int32. */
#ifndef AWQD_TESTS_GPU_W4A16_REF_H
#define AWQD_TESTS_GPU_W4A16_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* column n of a packed int32 of 8 columns sits at nibble REF_AWQ_ORDER[n % 8] */
static const int REF_AWQ_ORDER[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static inline uint16_t h_from_f(float f) { /* fp32 -> fp16, round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffffu;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float f_from_h(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, man = h & 0x3ffu, x;
    if (e == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    if (e == 31) x = sign | 0x7f800000u | (man << 13);
    else x = sign | ((e - 15 + 127) << 23) | (man << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#endif
