/* w4a16_repack.h — an AWQ linear repacked on the host into the W4A16 kernels'
 * device layout (kernels/cuda/w4a16.cu's header comment: n16 tiles of 16
 * physical rows, 64-deep K chunks of 512 bytes per warp, scales as half2 and
 * zeros as nibble pairs per tile row). w4a16_upload copies the result to the
 * GPU as it is.
 *
 * Plain C with no CUDA, so that the CPU build (and CI) tests it against the
 * nibble-by-nibble definition (tests/test_w4a16_repack.c). It reads each
 * checkpoint word once per 8 output words and runs on a pool of threads:
 * the nibble-by-nibble loop it replaced took 0.5-0.8 s per Qwen3-32B
 * gate|up matrix on one thread, and the 64-layer model's load 70 s (H200
 * host, session 26).
 *
 * Thread safety: pure function of its inputs; call from any thread. */
#ifndef AWQD_W4A16_REPACK_H
#define AWQD_W4A16_REPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct awq_linear;

/* The device layout's dimensions of a K x N linear (N columns; gate_up: the
 * interleaved gate|up matrix, N = 2 x intermediate). */
struct w4a16_dims {
    int k, n, group, gate_up;
    int n16;  /* 16-row tiles (gate_up: N / 16; plain: ceil(N / 16)) */
    int n16a; /* n16 rounded up to 8 tiles (a 128-column block) */
    int kc;   /* 64-deep K chunks */
    int kg;   /* groups along K */
};

/* Fills d; 0, or -EINVAL for a shape the layout cannot hold (K % 64, group
 * % 64, K % group, N % 8, gate_up with N % 16). */
int w4a16_dims_of(int k, int n, int group, int gate_up, struct w4a16_dims *d);

/* Element counts of the host buffers w4a16_repack fills. */
size_t w4a16_repack_qw_words(const struct w4a16_dims *d); /* uint32 */
size_t w4a16_repack_sz_count(const struct w4a16_dims *d); /* uint32 scales / uint8 zeros */

/* l (shape d) -> qw [n16a/8][kc][8][32 lanes][4] uint32, sc [kg][n16a][8]
 * half2 pairs, zr [kg][n16a][8] nibble pairs and, when l->bias and hb are
 * set, hb [n16a * 16] fp16 in tile-row order; padding rows are zero. Every
 * output element is written. threads: threads to run on, the caller's
 * included (<= 1, or when the pool cannot start: the calling thread only).
 * 0, or -ENOMEM (nothing written). */
int w4a16_repack(const struct awq_linear *l, const struct w4a16_dims *d, uint32_t *qw, uint32_t *sc,
                 uint8_t *zr, uint16_t *hb, int threads);

#ifdef __cplusplus
}
#endif

#endif
