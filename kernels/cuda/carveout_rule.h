/* carveout_rule.h — the shared-memory carveout a kernel launch asks of its
 * SMs (kernels/cuda/carveout.cuh adds it to every launch of the CUDA
 * backend). Plain C, shared with a CPU test (tests/test_carveout.c).
 *
 * An SM splits its L1 / shared-memory array into one configuration (0, 8,
 * 16, 32, 64, 100, 132, 164, 196 or 228 KB of shared memory on an H100 /
 * H200), changeable only while the SM is idle, and blocks of kernels that
 * ask for different configurations do not share an SM (as measured here:
 * the stamps below). Left to the driver,
 * each kernel's configuration is sized by its own occupancy, so with
 * programmatic dependent launch the next kernel's blocks could not land
 * beside the previous kernel's last ones even where registers and shared
 * memory were free: at batch 1 the decode attention's CTAs entered only as
 * the q|k|v linear's blocks left (H200, session 60 stamps: median entry
 * 13.6 us into a Qwen3-8B layer, 8.5 us with this rule). So every launch
 * asks for the same floor (AWQD_CUDA_CARVEOUT_PCT percent of the SM's
 * largest configuration, default 72), or more where its own blocks need
 * it: the blocks an SM holds of it (registers, threads, shared memory; at
 * most as many as its grid puts on each SM) times each block's shared
 * memory and the 1 KB the runtime reserves a block. The driver rounds a
 * percentage up to a configuration; 72% of 228 KB is just over 164 KB
 * (which configuration that gives was not read back).
 *
 * Measured (session 60, against the driver's choice in one binary, three
 * runs; docs/PERFORMANCE.md "Session 60"): Qwen3-8B (H200) batch 1 / 2 /
 * 4 / 8 / 16 / 32 / 64 0.978 / 0.985 / 0.995 / 0.995 / 0.986 / 0.968 /
 * 1.002x a step at context 512; qwen3-32b (64 layers, 2x H200, two runs) at
 * tp = 2 batch 1 / 2 / 4 0.979 / 0.985 / 0.990x, batch 8 1.011x, at tp = 1
 * 1.000-1.006x. A floor of 58% measured about the same (0.984x at batch
 * 1). One value for every kernel whatever it needs was worse: 100% (L1 28
 * KB) 1.02-1.04x at batch 1-8; 50% 0.98x at batch 1-4 but 1.06-1.17x from
 * batch 8 (the kernels that need more lost blocks). The kernels alone
 * (bench kernels, back to back) do not change. */
#ifndef AWQD_CARVEOUT_RULE_H
#define AWQD_CARVEOUT_RULE_H

#define CARVEOUT_DEFAULT_PCT 72

/* What the rule knows of a kernel launch. */
struct carveout_launch {
    int regs;            /* registers per thread (0: unknown) */
    int static_smem;     /* static shared memory per block, bytes */
    long long dyn_smem;  /* dynamic shared memory per block, bytes */
    int threads;         /* threads per block */
    long long blocks;    /* blocks of the grid */
    int sm_smem;         /* the most shared memory an SM gives, bytes (233472 on H100 / H200) */
    int sms;             /* the device's SMs */
};

/* The carveout in percent of sm_smem: the floor, or more where the launch's
 * blocks need it; -1 where floor_pct is not 1..100 or nothing is known (the
 * driver's choice). */
static inline int carveout_pct(const struct carveout_launch *l, int floor_pct) {
    if (floor_pct <= 0 || floor_pct > 100 || l->sm_smem <= 0 || l->sms <= 0 || l->threads <= 0) return -1;
    const int warps = (l->threads + 31) / 32;
    const long long per = l->dyn_smem + l->static_smem + 1024;
    long long b = 2048 / l->threads; /* blocks an SM holds of it */
    if (b > 32) b = 32;
    if (l->regs > 0) {
        const long long br = 65536 / ((long long)(l->regs * 32 + 255) / 256 * 256 * warps);
        if (br < b) b = br;
    }
    if (l->sm_smem / per < b) b = l->sm_smem / per;
    const long long spread = (l->blocks + l->sms - 1) / l->sms; /* blocks the grid puts on an SM */
    if (spread < b) b = spread;
    const long long need = b * per;
    const int pct = need >= l->sm_smem ? 100 : (int)((need * 100 + l->sm_smem - 1) / l->sm_smem);
    return pct > floor_pct ? pct : floor_pct;
}

#endif
