/* w4a16_gemm.h — internal: the Hopper (sm_90a) INT4 x FP16 GEMM for many rows
 * (prefill, large batches), called by w4a16.cu's dispatch. Not a public API:
 * callers use w4a16_linear() (w4a16.h); tests and benchmarks may force a tile
 * configuration with w4a16_gemm_config().
 *
 * It reads the repacked weight exactly as made by w4a16_upload (w4a16.cu,
 * "Device weight layout"): qw uint4 [N16a/8][KC][8][32], sc half2
 * [KG][N16a][8], zr uint8 [KG][N16a][8], bias fp16 [N16a*16] (physical order).
 * See docs/KERNELS.md "Large M (Session 3)". */
#ifndef AWQD_W4A16_GEMM_H
#define AWQD_W4A16_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One call: y = epilogue(x @ W). Pointers are device pointers. */
struct w4a16_gemm_args {
    const void *qw;       /* uint4 [n16a/8][kc][8][32] */
    const uint32_t *sc;   /* half2 [kg][n16a][8] */
    const uint8_t *zr;    /* uint8 [kg][n16a][8] */
    const uint16_t *bias; /* fp16 [n16a*16] physical order, or NULL (no bias epilogue) */
    int *cnt;             /* split-K arrival counters (zero between calls), cnt_len of them */
    int cnt_len;
    int k, group;         /* K (multiple of 64), AWQ group (multiple of 64) */
    int n16, n16a, kc;    /* n16 tiles used / allocated (multiple of 8), K/64 */
    int n;                /* PLAIN: valid output columns (N) */
    int ldy;              /* output row stride: N (PLAIN) or N/2 (GATE_UP) */
    int gate_up;          /* 1: y = silu(gate) * up (interleaved gate|up layout) */
    int sms;              /* multiprocessors of the device */
    const uint16_t *x;    /* fp16 [m, k], 16-byte aligned */
    uint16_t *y;          /* fp16 [m, ldy] */
    int m;                /* rows of x (tokens), >= 1 */
    int ksplit;           /* > 0: force this K split (rounded to whole chunks), else automatic */
};

/* 1 when this build has the sm_90a kernel and the current device can run it
 * (compute capability 9.0). */
int w4a16_gemm_available(void);

/* Workspace bytes the automatic configuration needs for m rows (split-K
 * partial sums; 0 when it does not split). */
size_t w4a16_gemm_workspace(const struct w4a16_gemm_args *a);

/* Workspace bytes stream-K needs (one parked piece per block of its
 * one-per-SM grid at the largest tile, 1 x 256 or 2 x 128) on a device of sms
 * SMs; 0 where the GEMM is not available here or stream-K is off
 * (AWQD_W4A16_GEMM_SK=0). A smaller workspace runs those calls with whole
 * tiles (still correct, slower). */
size_t w4a16_gemm_sk_workspace(int sms);

/* Enqueues the GEMM on s. pdl: launch with programmatic stream serialization
 * (the kernel prefetches weights before griddepcontrol.wait and reads x after).
 * A workspace smaller than w4a16_gemm_workspace() lowers the split (still
 * correct). Returns 0 or a negative errno with a message in err. */
int w4a16_gemm_run(const struct w4a16_gemm_args *a, void *ws, size_t ws_bytes, int pdl,
                   cudaStream_t s, char *err, size_t errlen);

/* Forces a configuration for later calls (tests, benchmarks; process-wide):
 * mt in {1, 2} (block = 128 * mt weight rows), bn in {64, 128} (tokens
 * per block; mt 1 x bn 256 in modes 3-5 only), ksplit >= 1, mode 0 = wgmma (a
 * split of 2..8 reduced inside a thread-block cluster, no workspace), 1 =
 * mma.sync (same tiles and data path; split through the workspace), 2 =
 * wgmma with the split through the workspace, 3 = the warp-specialized
 * kernel (producer warpgroup + two wgmma consumer warpgroups, persistent
 * grid; ksplit <= 8, reduced in a cluster; bitwise mode 0's result), 4 =
 * mode 3 with x by TMA in natural k order and the weight words gathered
 * in natural k order (not bitwise mode 3's: other k in each k16 step; at split 1
 * its tiles end in TMA bulk stores where the ring keeps enough stages,
 * AWQD_W4A16_GEMM_TS=0 turns them off; same results), 5 = mode 4
 * with the weights dequantized into shared memory by the producer warpgroup
 * (bitwise mode 4's; slower, an experiment), 6 = mode 4 at bn 64 with the
 * pipelined consumer loop and a split of 2..8 reduced by all of its blocks
 * through the workspace instead of a cluster (bitwise mode 4's at the same
 * split; needs the workspace, the counters and tiles x splits <= the SMs,
 * else it runs as mode 4), 7 = mode 6 with three consumer warpgroups and
 * tiles of 192 rows (mt 1, bn 64; sessions 36-37). The automatic choice
 * uses mode 4 with its modelled tile and split, and mode 6 or 7 at M <= 64
 * where its grid fills the SMs (gemm_sk.h gk_dr_pick; AWQD_W4A16_GEMM_DR=0:
 * neither, AWQD_W4A16_GEMM_WG3=0: not mode 7) (mode 5 with AWQD_W4A16_GEMM_SS=1, mode
 * 3 with AWQD_W4A16_GEMM_NAT=0, mode 0 with AWQD_W4A16_GEMM_WS=0). mt = 0
 * restores the automatic choice. ksplit = 0 with mode 4: stream-K at split 1
 * (where the workspace holds a piece per SM and there are at least 2 chunk
 * steps per SM; else split 1 with whole tiles).
 * The environment variable AWQD_W4A16_GEMM_CFG="mt,bn,ksplit,mode" sets the
 * same at the first call. Returns 0, or -EINVAL for an unsupported tuple. */
int w4a16_gemm_config(int mt, int bn, int ksplit, int mode);

/* 1 when mode 4's automatic choice may use stream-K (AWQD_W4A16_GEMM_SK=0:
 * never). It applies only where x (m x k fp16) takes at most
 * W4A16_GEMM_SK_X_MAX_BYTES (well inside L2; w4a16_gemm.cu sk_fits). */
int w4a16_gemm_stream_k(void);
#define W4A16_GEMM_SK_X_MAX_BYTES ((size_t)32 << 20)

/* Calls so far (process-wide) that ran mode 4's stream-K: equal shares of
 * the chunk steps per block, tiles cut between blocks summed by their head
 * block from pieces parked in the workspace (tests, benchmarks). */
unsigned long w4a16_gemm_sk_launches(void);

/* Calls so far (process-wide) that ran mode 6: a split reduced by all of
 * its blocks through the workspace (tests, benchmarks). */
unsigned long w4a16_gemm_dr_launches(void);

/* XP (session 51): x copied permuted within each 64-deep chunk into the
 * repacked weight words' k order (one small kernel before the GEMM, the copy
 * at the workspace's end) so that the consumer loops of modes 4, 6 and 7
 * read each weight word as stored instead of gathering it in natural k
 * order; results as mode 3's. mode: 0 off, 1 (default) where nat_rule.h's
 * nat_xp_takes says (gate|up, M <= 64, K N >= 56 Mi), 2 on every mode 4 / 6 / 7
 * call, 3 as 2 without the copy (x read as if permuted: wrong results;
 * timing only); each only where the call's workspace also holds the copy
 * (w4a16_gemm_workspace counts it). < 0 only asks. Process-wide;
 * AWQD_W4A16_GEMM_XP sets it at the first call. Returns the mode now. */
int w4a16_gemm_xp(int mode);

/* Calls so far (process-wide) that ran XP (tests, benchmarks). */
unsigned long w4a16_gemm_xp_launches(void);

/* The configuration a call with these arguments uses (after any forcing). */
void w4a16_gemm_choice(const struct w4a16_gemm_args *a, int *mt, int *bn, int *ksplit, int *mode);

/* The mode the automatic choice runs: 4 (default), 5 with
 * AWQD_W4A16_GEMM_SS=1, 3 with AWQD_W4A16_GEMM_NAT=0, 0 with
 * AWQD_W4A16_GEMM_WS=0. */
int w4a16_gemm_auto_mode(void);

#ifdef __cplusplus
}
#endif

#endif
