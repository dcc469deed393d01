/* w4a16.h — fused W4A16 linear layers on CUDA: y[M,N] = x[M,K] @ W[K,N] with
 * W kept INT4 on the device (AWQ group quantization, W = (q - z) * s per group
 * of G rows of K) and x, y fp16. See docs/KERNELS.md for the kernels, the
 * device weight layout and the measured dispatch.
 *
 * Usage:
 *     struct w4a16_weight *w;
 *     char err[256];
 *     if (w4a16_upload(&layer->down, W4A16_LAYOUT_PLAIN, &w, err, sizeof err)) ...
 *     size_t ws = w4a16_workspace_bytes(w, max_rows);    // optional split-K space
 *     void *d_ws; cudaMalloc(&d_ws, ws);
 *     w4a16_linear(w, d_x, m, d_y, W4A16_EPI_NONE, d_ws, ws, stream, err, sizeof err);
 *     ...
 *     w4a16_free(w);
 *
 * Layouts (chosen at upload):
 *   W4A16_LAYOUT_PLAIN    y[M, N] = x @ W (+ bias[N] with W4A16_EPI_BIAS).
 *   W4A16_LAYOUT_GATE_UP  for the fused gate|up matrix (N = 2 * inter; the
 *                         checkpoint's columns [0, inter) are gate, [inter, N)
 *                         up). The upload interleaves them so one tile holds
 *                         matching gate/up columns; the only valid epilogue is
 *                         W4A16_EPI_SILU_MUL (optionally | W4A16_EPI_BIAS),
 *                         which writes y[M, inter] = silu(x@Wg + bg) * (x@Wu + bu).
 *
 * Shapes: K % 64 == 0, G % 64 == 0 (AWQ uses G = 128), K % G == 0, N % 8 == 0
 * (GATE_UP: inter % 8 == 0). M >= 1 is any size. x and y are device pointers,
 * fp16 bit patterns, row-major, 16-byte aligned (cudaMalloc'd + multiples of 8
 * elements per row are).
 *
 * Workspace: kernels may split K across blocks for small M; the partial sums
 * (fp32) go to the caller's workspace and are added in a fixed order (results
 * are bitwise deterministic for a given M). For large M (>= 256 on H100) the
 * fastest path dequantizes W into the workspace as a transient fp16 copy
 * (K*N*2 bytes, + M*N*2 for GATE_UP) and calls cuBLAS; nothing persistent is
 * kept. ws may be NULL / too small: the call then uses fewer splits or the
 * INT4 tensor-core GEMM instead (still correct, possibly slower).
 * w4a16_workspace_bytes() says what the fastest choice needs; one buffer can
 * be shared by all layers of a stream (size it for the largest). The cuBLAS
 * path uses one cuBLAS handle per calling host thread (created on first use).
 *
 * Errors: negative errno with a message in err (NULL ok): -EINVAL for shapes
 * and arguments, -ENOMEM / -EIO from CUDA (every CUDA call is checked).
 *
 * Programmatic dependent launch (sm_90+, on by default; AWQD_CUDA_PDL=0 or
 * w4a16_pdl(0) turns it off): the skinny / decode / tc64 kernels are launched
 * with cudaLaunchAttributeProgrammaticStreamSerialization, so they may start
 * while the previous kernel on the stream is still running. Before their
 * `griddepcontrol.wait` they read only the weight (qweight, scales, zeros,
 * bias: constant after upload) and prefetch it; x, y, the workspace and the
 * split-K counters are touched only after the wait, which returns once the
 * previous kernel has completed and its writes are visible. What a caller
 * must know:
 *   - Do not modify a weight (re-upload into it, free it) while calls on it
 *     may be in flight: that was already the rule, PDL widens the window to
 *     "until the previous kernel on the stream has finished" before the call.
 *   - The previous kernel need not know about PDL. If it executes
 *     `griddepcontrol.launch_dependents` (cudaTriggerProgrammaticLaunchCompletion)
 *     ours can start earlier; ours execute it after their main loop, so a PDL
 *     kernel that follows can prefetch its constant data meanwhile — it must
 *     itself wait (cudaGridDependencySynchronize) before reading our y.
 *   - Stream capture into a CUDA graph keeps the launch attribute (the graph
 *     gets a programmatic dependency edge); tested in tests/gpu/test_w4a16.c.
 *   - The cuBLAS path (large M) launches normally (full serialization).
 *
 * Thread safety: a weight is read-only after upload except for its split-K
 * arrival counters: one weight must not run on two streams at the same time
 * (each tensor-parallel rank owns its own weights). Any host thread may call. */
#ifndef AWQD_W4A16_H
#define AWQD_W4A16_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct awq_linear;   /* engine/ckpt.h */
struct w4a16_weight; /* device copy of one AWQ linear; opaque */

enum w4a16_layout { W4A16_LAYOUT_PLAIN = 0, W4A16_LAYOUT_GATE_UP = 1 };

enum w4a16_epilogue {
    W4A16_EPI_NONE = 0,
    W4A16_EPI_BIAS = 1,     /* + bias[n] (the weight must have a bias) */
    W4A16_EPI_SILU_MUL = 2, /* GATE_UP layout only: y = silu(gate) * up, [M, N/2] */
};

/* Forces one kernel (for benchmarks and tests); W4A16_KERNEL_AUTO = dispatch. */
enum w4a16_kernel {
    W4A16_KERNEL_AUTO = 0,
    W4A16_KERNEL_SKINNY = 1, /* streaming tensor-core GEMV, M <= 32, split-K */
    W4A16_KERNEL_TC64 = 2,   /* pipelined tensor-core GEMM, block tile 128 n x 64 m */
    W4A16_KERNEL_TC128 = 3,  /* pipelined tensor-core GEMM, block tile 128 n x 128 m */
    W4A16_KERNEL_CUBLAS = 4, /* large M: dequantize into the workspace + cuBLAS FP16 GEMM */
    /* 5: the CUDA-core GEMV of sessions 1-2, removed (measured slower than SKINNY) */
    W4A16_KERNEL_DECODE = 6, /* decode kernel, M <= 16, group 128: whole columns per block, a
                                register ring of weight loads, no split-K (falls back to SKINNY
                                where it does not apply); the dispatch's choice for M <= 2 (and
                                M <= 4 up to K = 8192), see w4a16_decode_kernel */
    W4A16_KERNEL_WGMMA = 8,  /* sm_90a INT4 GEMM (wgmma, A = weights from registers), large M;
                                kernels/cuda/w4a16_gemm.cu. Falls back to TC64 where unavailable. */
};

/* Copies one AWQ linear (host memory, AutoAWQ packing) to the current device,
 * repacked for the kernels (still 4 bits per weight; docs/KERNELS.md). */
int w4a16_upload(const struct awq_linear *l, enum w4a16_layout layout,
                 struct w4a16_weight **out, char *err, size_t errlen);

/* A host buffer that w4a16_upload_staged repacks into and copies from,
 * kept across the linears of a load: pinned (page-locked) where the
 * driver gives it, grown to the largest linear, so that no linear pays
 * for fresh pages nor for a copy from pageable memory. Zero-initialize;
 * w4a16_stage_free when the load is done. One per thread. */
struct w4a16_stage {
    void *p;
    size_t cap;
    int pinned;
};
int w4a16_upload_staged(const struct awq_linear *l, enum w4a16_layout layout,
                        struct w4a16_stage *st, struct w4a16_weight **out, char *err,
                        size_t errlen);
void w4a16_stage_free(struct w4a16_stage *st);
void w4a16_free(struct w4a16_weight *w); /* NULL ok */

/* K, N (as in the checkpoint), output columns (N, or N/2 for GATE_UP), device
 * bytes held. */
int w4a16_k(const struct w4a16_weight *w);
int w4a16_n(const struct w4a16_weight *w);
int w4a16_out_cols(const struct w4a16_weight *w);
size_t w4a16_device_bytes(const struct w4a16_weight *w);

/* The device arrays and plan facts of a weight (w4a16.cu "Device weight
 * layout"), for kernels in other files (w4a16_chain.cu). Valid while w is. */
struct w4a16_view {
    const void *qw;      /* uint4 [n16a / 8][kc][8][32] */
    const uint32_t *sc;  /* [kg][n16a][8] half2 */
    const uint8_t *zr;   /* [kg][n16a][8] */
    const uint16_t *bias; /* or NULL */
    int k, n, group, gate_up, out_cols, n16a, kc, kg;
    int sms, cc_major, smem_optin;
};
void w4a16_view_of(const struct w4a16_weight *w, struct w4a16_view *v);

/* A second device copy of a weight (device-to-device; benchmarks that must
 * stream more bytes than the L2 holds). Freed with w4a16_free. */
int w4a16_clone(const struct w4a16_weight *src, struct w4a16_weight **out, char *err,
                size_t errlen);

/* Workspace bytes that let every call with M <= max_m use its preferred split. */
size_t w4a16_workspace_bytes(const struct w4a16_weight *w, int max_m);

/* Workspace bytes that let the wgmma GEMM's calls of any M use stream-K on
 * this weight's device (w4a16_gemm_sk_workspace; 0 where it does not run). */
size_t w4a16_stream_k_bytes(const struct w4a16_weight *w);

/* y = epilogue(x @ W). x: fp16 [m, K] device; y: fp16 [m, out_cols] device.
 * Enqueued on stream s; returns once launched. */
int w4a16_linear(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                 int epilogue, void *workspace, size_t ws_bytes, cudaStream_t s,
                 char *err, size_t errlen);

/* ZM (session 69; on by default): the zero point taken out through the sums of x
 * per group of 128 columns, which the decode kernel makes itself (one more mma a
 * k16 step with A = ones gives every lane the sums of its rows, in the registers
 * where the group's correction needs them); the codes enter the mma as LOP3 makes
 * them, without the zero point's HSUB2. At MT = 1 (M <= 8), in the plain,
 * persistent, K-split, NORM and tensor-parallel sum variants, where the
 * tiles per block and K take it (w4a16.cu dc_zm_form), up to v rows
 * (AWQD_W4A16_DC_ZM, default 8; 0 off). v < 0 only reads; returns the value
 * in force. */
int w4a16_decode_zm(int v);
unsigned long w4a16_zm_launches(void); /* the decode kernel's ZM launches so far, both forms (tests) */
/* ZM1 (session 70; on by default): at M = 1 the sums by one mma a group of 128
 * (the columns of x's fragment, all the same row there, take different pieces
 * of the group) instead of one a k16 step: at one tile a block where a warp's
 * range is one or two ring turns (K = 4096, 8192), and in place of the k16-step
 * sums on the persistent grid, the K split and plain ranges of at most 4 groups
 * (dc_plan.h dc_zm_form). v: 1 that rule, 2 wherever ZM runs at M = 1 (for
 * measurements), 0 off (ZM's k16-step form where its rule takes it); v < 0
 * only reads; returns the value in force (AWQD_W4A16_DC_ZM1). Off with ZM. */
int w4a16_decode_zm1(int v);
unsigned long w4a16_zm1_launches(void); /* the ZM1 launches so far (tests) */

/* The residual add + RMSNorm that precedes a decode-sized linear, fused into
 * the decode kernel's prologue: every block builds x = RMSNorm(rin + delta) *
 * norm_w (eps; add_rmsnorm's arithmetic) for itself and block 0 writes rout =
 * rin + delta; then y = epilogue(x @ W) as w4a16_linear. rin, delta, rout:
 * fp16 [m, K] (delta may be NULL: rout = rin; rout must differ from both);
 * norm_w: fp16 [K]. Saves the add_rmsnorm kernel and its x round trip.
 * -ENOTSUP (nothing launched) when the decode kernel does not take (w, m)
 * or m > 2 (measured slower there), AWQD_W4A16_DECODE=0, ...: run
 * add_rmsnorm and w4a16_linear. */
int w4a16_linear_norm_ok(const struct w4a16_weight *w, int m); /* 1: it would launch */
int w4a16_linear_norm(const struct w4a16_weight *w, const uint16_t *rin, const uint16_t *delta,
                      uint16_t *rout, const uint16_t *norm_w, float eps, int m, uint16_t *y,
                      int epilogue_flags, cudaStream_t s, char *err, size_t errlen);

/* A row-parallel linear followed by the tensor-parallel all-reduce of its
 * output, in one kernel (comm/cuda fills the descriptor; docs/
 * TENSOR_PARALLEL.md "The all-reduce fused into the linear"): the decode
 * kernel's epilogue stores each of its output tiles (fp16, as w4a16_linear
 * would write them) into every peer's exchange area over NVLink, waits for
 * the peers' same tiles in its own area (the data is its own flag, as in the
 * push all-reduce), adds the ranks' tiles in rank order in fp32 and writes
 * the sum to y: bitwise what w4a16_linear followed by the push all-reduce
 * gives, on every rank, without the all-reduce kernel.
 *
 * Exchange area of rank q and one parity: fp16 [size][W4A16_SUM_CAP], rows
 * = source rank; source r's slot of output tile t (16 columns) is the 128
 * halves at r * W4A16_SUM_CAP + t * 128, 4 per lane of the warp that made
 * it (its rows 2c, 2c + 1 x columns r, r + 8 of the tile), -0.0 while idle.
 * Consecutive calls must alternate the parity, and two calls on the same
 * parity need an exchange of every rank (any all-reduce) between them; the
 * model alternates by call site (o_proj even, down_proj odd). Every rank
 * must make the same calls with the same shapes and m (the decision below
 * depends on them only). A wait leaves on ctl[0] (the group's abort word)
 * or after timeout_ns, recording rank + 1 in ctl[1] (as the push kernel). */
#define W4A16_SUM_MAX_RANKS 8
#define W4A16_SUM_CAP 131072 /* halves per source and parity: N <= 16384 */
struct w4a16_sum {
    uint16_t *area[W4A16_SUM_MAX_RANKS]; /* rank q's exchange area of this parity (device q) */
    uint16_t *mine;                      /* area[rank] (read where the index is not constant) */
    volatile int *ctl;                   /* mapped host [2]: abort, timed-out rank + 1 */
    unsigned long long timeout_ns;       /* 0: no limit */
    int rank, size;
};
/* 1 when w4a16_linear_sum takes (w, m): the decode kernel with one mma column
 * block (m <= 8) and at most 2 blocks per SM (all of the grid resident at
 * once: a waiting block never holds back a peer's block), a plain layout, N
 * <= 16384, the decode kernel on. */
int w4a16_linear_sum_ok(const struct w4a16_weight *w, int m);
int w4a16_linear_sum(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                     int epilogue_flags, const struct w4a16_sum *xs, void *workspace,
                     size_t ws_bytes, cudaStream_t s, char *err, size_t errlen);

/* Same with a forced kernel and split count (ksplit <= 0: automatic). */
int w4a16_linear_ex(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                    int epilogue, enum w4a16_kernel kernel, int ksplit, void *workspace,
                    size_t ws_bytes, cudaStream_t s, char *err, size_t errlen);

/* The kernel and split that w4a16_linear picks for m rows (for logs/benchmarks). */
void w4a16_choice(const struct w4a16_weight *w, int m, enum w4a16_kernel *kernel,
                  int *ksplit);

/* Programmatic dependent launch (PDL, sm_90+). mode 1: on, 0: off, < 0: only
 * query. Returns the mode now in effect (process-wide; default on unless the
 * environment has AWQD_CUDA_PDL=0). See "Programmatic dependent launch" above. */
int w4a16_pdl(int mode);

/* Split-K reduction of the skinny (decode) kernel inside a thread-block
 * cluster through distributed shared memory (sm_90+, up to 8 splits; no
 * workspace, no atomics; bitwise the same result as the workspace path).
 * mode 1: on, 0: off (workspace + arrival counter), < 0: only query. Returns
 * the mode in effect (process-wide; default on unless AWQD_W4A16_CLUSTER=0). */
int w4a16_cluster_reduce(int mode);

/* The decode kernel (W4A16_KERNEL_DECODE; docs/KERNELS.md) in the automatic
 * dispatch for M <= 2 (M <= 4 up to K = 8192). mode 1: on, 0: off (the skinny
 * kernel), < 0: only query. Returns the mode in effect (process-wide; default
 * ON — measured 1.0-1.8x the skinny kernel there on H200 — unless
 * AWQD_W4A16_DECODE=0). Results differ from the skinny kernel's in rounding
 * only (another summation order); each is deterministic. It needs no
 * workspace. */
int w4a16_decode_kernel(int mode);
/* 1 when the decode kernel can run (w, m) at all (its launch plan exists:
 * M <= 16, group 128, x in shared memory); forced where it cannot,
 * w4a16_linear_ex runs the skinny kernel. For benchmarks. */
int w4a16_decode_applies(const struct w4a16_weight *w, int m);
/* The decode kernel's persistent grid (kernels/cuda/dc_plan.h, dc_ps_plan):
 * where its plain grid needs more than one wave of blocks, fewer blocks
 * each stream several column tiles through one register ring (measured
 * 0.85-0.94x the time on Qwen3-8B gate|up at M = 1-8, H200). mode 1: on,
 * 0: off, < 0: only query; returns the mode in effect (process-wide;
 * default ON unless AWQD_W4A16_DC_PS=0). Each column is still summed by
 * one block's 8 warps in the same order: where the tiles per block stay
 * the same, the results are bitwise those of the plain grid. */
int w4a16_decode_persistent(int mode);
/* From how many rows the decode kernel stages x group by group at M <= 8
 * (each of a warp's first groups its own cp.async group, so that its first
 * column multiplies them while the later ones arrive; at M >= 9 always):
 * min_m 1..99 sets it (process-wide), anything else only queries; returns the value in
 * effect (default 6 unless AWQD_W4A16_DC_XP_MIN_M says otherwise). The
 * values are bitwise the same either way. */
int w4a16_decode_x_groups(int min_m);
/* The decode kernel's cluster K split (kernels/cuda/dc_plan.h,
 * dc_plan_cluster): two blocks (a thread-block cluster) a column, each
 * staging x of half of K, rank 0 adding the other's sums. mode 0: where
 * dc_cl_takes says (K = 8192 at M = 12-24, the default), 1: never, 2:
 * wherever it applies (M = 9-24, K / 128 even; for measurements); < 0 only
 * queries. Returns the mode in effect (process-wide; AWQD_W4A16_DC_CL sets
 * the default). The results differ from the one-block kernel's in rounding
 * only (the halves added last). */
int w4a16_decode_cluster(int mode);
/* The decode kernel's K split through global memory at M <= 8 (dc_plan.h,
 * dc_plan_gs, dc_gs_pick): two or three plain blocks a column of two or
 * four tiles, each a part of K, the last to arrive adding them in order (the plain and
 * the tensor-parallel sum variants; not the norm prologue), where the
 * workspace passed holds their sums (w4a16_workspace_bytes counts them).
 * v = 1: by its rule (the default), 0: never, 10 ks + tb (ks = 2 or 3
 * blocks a column of tb = 2 or 4 tiles) wherever that grid is one wave (for
 * measurements); other values only query. Returns the value in effect
 * (AWQD_W4A16_DC_KS sets the default). The results differ from the
 * one-block kernel's in rounding only (the pieces added last).
 * w4a16_decode_ksplit_launches counts its launches. */
int w4a16_decode_ksplit(int v);
unsigned long w4a16_decode_ksplit_launches(void);
/* How the K split adds its pieces: v = 1 (the default) the column's last
 * rank polls the others' sums in a per-device buffer where the whole grid
 * is resident at once (plain variant, one row tile), 0 the last block to
 * arrive adds them (an arrival counter); other values only query. Returns
 * the value in effect (AWQD_W4A16_GS_POLL sets the default). Bitwise the
 * same results either way. w4a16_decode_ksplit_polls counts the launches
 * that polled. */
int w4a16_decode_ksplit_poll(int v);
unsigned long w4a16_decode_ksplit_polls(void);
/* Bytes of the poll buffer w4a16_upload allocates once a device (with its
 * first weight) on a device of sms SMs. */
size_t w4a16_poll_bytes(int sms);
/* Whether the dispatch also takes the decode kernel with the K split at M
 * = 3-8 where it would not take the one-block plan, or there is none (x of
 * all of K too large): v = 1 yes (the default), 0 no; other values only
 * query (AWQD_W4A16_DC_KSX sets the default). */
int w4a16_decode_ksplit_dispatch(int v);
/* The blocks (a thread-block cluster) the decode kernel's plan gives each
 * column at m rows now (1, or 2 with the cluster K split; the K split
 * through global memory shows in w4a16_decode_describe instead); 0 where
 * the kernel does not apply. */
int w4a16_decode_blocks_per_column(const struct w4a16_weight *w, int m);
/* The decode kernel's launch for (w, m) as it would run now: tiles per
 * block, column blocks (of tb tiles) and the grid in blocks (= cols for the
 * plain grid, < cols for the persistent one, cols x ks for the K split
 * through global memory). 0 where the kernel does not apply.
 * For benchmarks and tests. */
int w4a16_decode_describe(const struct w4a16_weight *w, int m, int *tb, int *cols, int *grid);

/* Dequantize + cuBLAS (W4A16_KERNEL_CUBLAS, chosen from M >= 256) when the
 * workspace is smaller than the whole fp16 copy: mode 1 runs it in column
 * slabs of whole 128-column blocks that fit the workspace (the copy of one
 * slab at a time), 0 falls back to an INT4 GEMM instead (wgmma from M 512 on
 * sm_90a, else tc64), < 0 only queries. Returns the mode in effect
 * (process-wide; default ON — measured faster than the wgmma GEMM for
 * prefill on H200, Qwen3-8B TTFT(1024) 49.7 -> 44.1 ms — unless
 * AWQD_W4A16_SLABS=0).
 * Same dequantized values as the whole-matrix path; the sums may differ in
 * rounding (cuBLAS may pick another algorithm for a narrower GEMM). */
int w4a16_cublas_slabs(int mode);

/* K-slabs within that path: a plain-layout call whose widest column slab
 * would leave cuBLAS under two waves of 128 x 128 tiles dequantizes every
 * column over a range of K at a time instead and accumulates the ranges'
 * products in y (fp16 between ranges). mode 0 / 1 sets (process-wide),
 * < 0 only queries; returns the mode in effect (default ON unless
 * AWQD_W4A16_KSLABS=0). */
int w4a16_cublas_kslabs(int mode);

/* The largest M the automatic dispatch gives the skinny kernel (default 32,
 * at most 64; from there on the tc64 GEMM). m > 0 sets it (process-wide),
 * m <= 0 only queries; returns the value in effect. For tests that need a
 * second, equally valid summation order of the same product (the skinny
 * kernel scales in fp32 per chunk, tc64 multiplies the fp16-rounded
 * dequantized weight): tests/gpu/test_tp_cuda.c measures the fp16 noise
 * floor of a whole model this way. */
int w4a16_skinny_max_m(int m);

#ifdef __cplusplus
}
#endif

#endif
