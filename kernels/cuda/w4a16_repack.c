/* w4a16_repack.c — see w4a16_repack.h. */
#include "kernels/cuda/w4a16_repack.h"

#include "engine/awq_pack.h" /* awq_order */
#include "engine/ckpt.h"     /* struct awq_linear */
#include "kernels/cpu/cpu.h" /* cpu_pool */

#include <errno.h>
#include <stdlib.h>

int w4a16_dims_of(int k, int n, int group, int gate_up, struct w4a16_dims *d) {
    if (k <= 0 || n <= 0 || group <= 0 || k % 64 || group % 64 || k % group || n % 8 || (gate_up && n % 16))
        return -EINVAL;
    d->k = k;
    d->n = n;
    d->group = group;
    d->gate_up = gate_up ? 1 : 0;
    d->n16 = gate_up ? n / 16 : (n + 15) / 16;
    d->n16a = (d->n16 + 7) / 8 * 8;
    d->kc = k / 64;
    d->kg = k / group;
    return 0;
}

size_t w4a16_repack_qw_words(const struct w4a16_dims *d) { return (size_t)d->n16a * d->kc * 32 * 4; }
size_t w4a16_repack_sz_count(const struct w4a16_dims *d) { return (size_t)d->kg * d->n16a * 8; }

/* The checkpoint word (index along N / 8) of tile nt's half h (rows 8h ..
 * 8h + 7), or -1 where the half is padding. A half is 8 consecutive,
 * 8-aligned checkpoint columns: plain nt * 16 + 8 h; gate|up the gate (h =
 * 0) or up (h = 1) columns nt * 8 .. nt * 8 + 7 of the intermediate. */
static int half_word(const struct w4a16_dims *d, int nt, int h) {
    if (d->gate_up) {
        const int inter = d->n / 2, j0 = nt * 8;
        if (j0 >= inter) return -1;
        return (h ? inter + j0 : j0) / 8;
    }
    const int c0 = nt * 16 + 8 * h;
    return c0 < d->n ? c0 / 8 : -1;
}

struct repack_job {
    const struct awq_linear *l;
    const struct w4a16_dims *d;
    uint32_t *qw, *sc;
    uint8_t *zr;
    const int *hw; /* [n16a][2] half_word */
};

/* An 8 x 8 matrix of nibbles, word i = row i, nibble p = column p,
 * transposed in place: block swaps of 4, 2 and 1 nibbles. */
static void transpose_nibbles(uint32_t s[8]) {
    for (int i = 0; i < 4; i++) {
        const uint32_t a = s[i], b = s[i + 4];
        s[i] = (a & 0x0000ffffu) | b << 16;
        s[i + 4] = a >> 16 | (b & 0xffff0000u);
    }
    for (int i = 0; i < 8; i += (i & 1) ? 3 : 1) { /* 0, 1, 4, 5 */
        const uint32_t a = s[i], b = s[i + 2];
        s[i] = (a & 0x00ff00ffu) | (b << 8 & 0xff00ff00u);
        s[i + 2] = (a >> 8 & 0x00ff00ffu) | (b & 0xff00ff00u);
    }
    for (int i = 0; i < 8; i += 2) {
        const uint32_t a = s[i], b = s[i + 1];
        s[i] = (a & 0x0f0f0f0fu) | (b << 4 & 0xf0f0f0f0u);
        s[i + 1] = (a >> 4 & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
    }
}

/* qw for the K chunks [kc0, kc1). Word t of lane (r, c) holds, at nibble
 * (j >> 1) * 2 + hi + (j & 1) * 4, W[64 kc + 16 c + 4 t + j][row r + 8 hi]
 * (j = 0..3), and row r of a half is nibble awq_order[r] of its checkpoint
 * word: the 8 checkpoint words of one (c, t) (4 rows x 2 halves), placed
 * as the rows of a nibble matrix in the order of their nibble in the output,
 * transposed, are the 8 output words, word awq_order[r] for row r. */
static void repack_qw(void *arg, int kc0, int kc1) {
    const struct repack_job *jb = arg;
    const struct w4a16_dims *d = jb->d;
    const int n8 = d->n / 8;
    static const int pos[4][2] = {{0, 1}, {4, 5}, {2, 3}, {6, 7}}; /* [j][hi] -> nibble */
    for (int kc = kc0; kc < kc1; kc++)
        for (int nt = 0; nt < d->n16a; nt++) {
            uint32_t *dst = jb->qw + (((size_t)(nt / 8) * d->kc + kc) * 8 + nt % 8) * 128;
            const int w0 = jb->hw[2 * nt], w1 = jb->hw[2 * nt + 1];
            for (int c = 0; c < 4; c++)
                for (int t = 0; t < 4; t++) {
                    uint32_t m[8];
                    for (int j = 0; j < 4; j++) {
                        const uint32_t *row = jb->l->qweight + (size_t)(kc * 64 + 16 * c + 4 * t + j) * n8;
                        m[pos[j][0]] = w0 >= 0 ? row[w0] : 0;
                        m[pos[j][1]] = w1 >= 0 ? row[w1] : 0;
                    }
                    transpose_nibbles(m);
                    for (int r = 0; r < 8; r++) dst[(r * 4 + c) * 4 + t] = m[awq_order[r]];
                }
        }
}

/* sc and zr for the groups [g0, g1): row r of tile nt holds {s(r), s(r +
 * 8)} and z(r) | z(r + 8) << 4 (zeros where a half is padding). */
static void repack_sz(void *arg, int g0, int g1) {
    const struct repack_job *jb = arg;
    const struct w4a16_dims *d = jb->d;
    const int n8 = d->n / 8;
    for (int g = g0; g < g1; g++)
        for (int nt = 0; nt < d->n16a; nt++) {
            const int w0 = jb->hw[2 * nt], w1 = jb->hw[2 * nt + 1];
            const uint16_t *s = jb->l->scales + (size_t)g * d->n;
            const uint32_t z0 = w0 >= 0 ? jb->l->qzeros[(size_t)g * n8 + w0] : 0;
            const uint32_t z1 = w1 >= 0 ? jb->l->qzeros[(size_t)g * n8 + w1] : 0;
            const size_t i0 = ((size_t)g * d->n16a + nt) * 8;
            for (int r = 0; r < 8; r++) {
                const int sh = 4 * awq_order[r];
                const uint32_t slo = w0 >= 0 ? s[w0 * 8 + r] : 0, shi = w1 >= 0 ? s[w1 * 8 + r] : 0;
                jb->sc[i0 + r] = slo | shi << 16;
                jb->zr[i0 + r] = (uint8_t)(((z0 >> sh) & 15u) | ((z1 >> sh) & 15u) << 4);
            }
        }
}

int w4a16_repack(const struct awq_linear *l, const struct w4a16_dims *d, uint32_t *qw, uint32_t *sc,
                 uint8_t *zr, uint16_t *hb, int threads) {
    int *hw = malloc(sizeof(int) * 2 * (size_t)d->n16a);
    if (!hw) return -ENOMEM;
    for (int nt = 0; nt < d->n16a; nt++) {
        hw[2 * nt] = half_word(d, nt, 0);
        hw[2 * nt + 1] = half_word(d, nt, 1);
    }
    struct repack_job jb = {l, d, qw, sc, zr, hw};
    struct cpu_pool *pool = NULL;
    if (threads > 1 && cpu_pool_init(&pool, threads)) pool = NULL; /* then on this thread */
    if (pool) {
        cpu_pool_run(pool, d->kc, 1, repack_qw, &jb);
        cpu_pool_run(pool, d->kg, 1, repack_sz, &jb);
        cpu_pool_free(pool);
    } else {
        repack_qw(&jb, 0, d->kc);
        repack_sz(&jb, 0, d->kg);
    }
    if (hb && l->bias)
        for (int nt = 0; nt < d->n16a; nt++)
            for (int rho = 0; rho < 16; rho++) {
                const int w = hw[2 * nt + rho / 8];
                hb[nt * 16 + rho] = w >= 0 ? l->bias[w * 8 + rho % 8] : 0;
            }
    free(hw);
    return 0;
}
