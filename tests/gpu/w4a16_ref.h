/* w4a16_ref.h — host-side helpers of the W4A16 kernel tests, written apart
 * from the code they check: fp32 <-> fp16 bit conversions (round to nearest
 * even, subnormals, inf), the AWQ nibble order of a packed int32, a random
 * AWQ layer and its exact dequantization. */
#ifndef AWQD_TESTS_GPU_W4A16_REF_H
#define AWQD_TESTS_GPU_W4A16_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ckpt.h"

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

/* A random AWQ layer [K, N], group G: packed qweight/qzeros from rnd, scales
 * in [0.005, 0.015), bias in [-1, 1) when asked; l points at the arrays. */
struct ref_layer {
    struct awq_linear l;
    uint32_t *qw, *qz;
    uint16_t *sc, *bias;
};

static inline float ref_unit(uint32_t (*rnd)(void)) { /* [0, 1) */
    return (float)(rnd() & 0xffffff) / 16777216.0f;
}

/* 0, or -1 when out of memory (what was allocated is freed) */
static inline int ref_layer_make(struct ref_layer *h, int K, int N, int G, int with_bias,
                                 uint32_t (*rnd)(void)) {
    memset(h, 0, sizeof *h);
    size_t nq = (size_t)K * (N / 8), nz = (size_t)(K / G) * (N / 8), ns = (size_t)(K / G) * N;
    h->qw = malloc(nq * 4);
    h->qz = malloc(nz * 4);
    h->sc = malloc(ns * 2);
    if (with_bias) h->bias = malloc((size_t)N * 2);
    if (!h->qw || !h->qz || !h->sc || (with_bias && !h->bias)) {
        free(h->qw);
        free(h->qz);
        free(h->sc);
        free(h->bias);
        memset(h, 0, sizeof *h);
        return -1;
    }
    for (size_t i = 0; i < nq; i++) h->qw[i] = rnd() ^ (rnd() << 16);
    for (size_t i = 0; i < nz; i++) h->qz[i] = rnd() ^ (rnd() << 16);
    for (size_t i = 0; i < ns; i++) h->sc[i] = h_from_f(0.005f + 0.01f * ref_unit(rnd));
    if (with_bias)
        for (int i = 0; i < N; i++) h->bias[i] = h_from_f(2.f * ref_unit(rnd) - 1.f);
    h->l.k = K;
    h->l.n = N;
    h->l.group = G;
    h->l.qweight = h->qw;
    h->l.qzeros = h->qz;
    h->l.scales = h->sc;
    h->l.bias = h->bias;
    return 0;
}

static inline void ref_layer_free(struct ref_layer *h) {
    free(h->qw);
    free(h->qz);
    free(h->sc);
    free(h->bias);
}

/* W[K, N] fp32 = (q - z) * s exactly (the fp16 scale widened), or NULL */
static inline float *ref_dequant(const struct awq_linear *l) {
    int K = l->k, N = l->n, G = l->group, n8 = N / 8;
    float *w = malloc((size_t)K * N * 4);
    if (!w) return NULL;
    for (int k = 0; k < K; k++) {
        const uint32_t *qr = l->qweight + (size_t)k * n8, *zr = l->qzeros + (size_t)(k / G) * n8;
        const uint16_t *sr = l->scales + (size_t)(k / G) * N;
        float *wr = w + (size_t)k * N;
        for (int n = 0; n < N; n++) {
            int q = (int)((qr[n / 8] >> (4 * REF_AWQ_ORDER[n % 8])) & 15);
            int z = (int)((zr[n / 8] >> (4 * REF_AWQ_ORDER[n % 8])) & 15);
            wr[n] = (float)(q - z) * f_from_h(sr[n]);
        }
    }
    return w;
}

#endif
