/* bench_e2e.c — `awqd bench e2e`: the whole model on one GPU, or on tp GPUs
 * (CUDA backend).
 *
 *   awqd bench e2e --model DIR [--batches 1,8,32,64] [--contexts 512,4096]
 *                  [--prompts 128,1024,4096] [--steps 16] [--fraction 0.9]
 *                  [--sampling greedy,t1[,full]] [--chunk N,..]
 *                  [--tp N [--devices a,b,..] [--comm-off]] [--settle-ms 1000]
 *
 * Measures, through model_group_forward_out exactly as the scheduler
 * (engine/sched.c) calls it:
 *   - decode tokens/s at each batch size and context (each sequence has its
 *     own KV blocks, `past` = context; the KV contents are whatever the
 *     cache holds: timing does not depend on the values), per sampling mode:
 *       greedy, t1  every row is MODEL_LOGITS_SAMPLE (the server's path:
 *                   ops->sample_topk candidates + the race on the GPU, the
 *                   host finishes each row with sampler_cands_merge +
 *                   sampler_finish, the full row only on SAMPLER_NEED_FULL),
 *                   at temperature 0 / 1.0 (the server's default); the
 *                   sampled token is the next step's input;
 *       full        the old path: MODEL_LOGITS_LAST, every sequence's fp32
 *                   logits row downloaded each step, nothing sampled;
 *   - TTFT: forwards over a prompt of P tokens (one forward, or chunks of
 *     --chunk tokens as the scheduler's chunked prefill does) whose last row
 *     is sampled in the first --sampling mode (median of 3);
 *   - GPU memory in use after loading and after the runs, and the workspace
 *     the memory plan itemizes.
 * With --tp N the model is sharded over N GPUs (model_group's worker threads,
 * comm/cuda all-reduces); rooflines are per rank (each reads its shard).
 * --comm-off then loads the model a second time with AWQD_ALLREDUCE=off (every
 * all-reduce a no-op: wrong sums, same work otherwise; graphs captured
 * without them) and times the same decode cases again: the difference is the
 * all-reduce time per step (waits for the slowest rank included), printed
 * with its share of the step.
 * Each figure is printed next to its roofline: decode = bytes read per step
 * (INT4 linears with scales/zeros, the fp16 lm_head, norms, and every
 * sequence's K/V) / measured copy rate; TTFT = max(weight bytes / copy rate,
 * FLOPs / measured cuBLAS fp16 GEMM rate). */
#include "engine/bench.h"
#include "server/cmd.h"

#ifndef AWQD_CUDA
int bench_e2e(int argc, char **argv) { return cmd_not_built("bench e2e", "the CUDA backend"); }
#else

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/ckpt.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/util.h"
#include "kernels/cuda/mem_plan.h"

#define E2E_MAX_LIST 16

/* How a forward's last rows are consumed (--sampling). */
enum e2e_mode { MODE_GREEDY = 0, MODE_T1, MODE_FULL, MODE_COUNT };
static const char *const mode_name[MODE_COUNT] = {"greedy", "t1", "full"};
static const char *const mode_desc[MODE_COUNT] = {
    "greedy: GPU candidates (sample_topk) + host finish, temperature 0",
    "t1: GPU candidates + race (sample_topk) + host finish, temperature 1.0",
    "full: every row's fp32 logits downloaded (MODEL_LOGITS_LAST), no sampling"};

/* Host state of the sampled modes (what the scheduler keeps per step). */
struct e2e_samp {
    int tp, k, V, cap;            /* cap: rows */
    float *inv_t;                 /* [cap] */
    int32_t *race;                /* [3 * cap] */
    int32_t *adj_start;           /* [cap + 1] all 0: no adjustments */
    float *cands;                 /* [tp, cap, SAMPLE_ROW_FLOATS(k)] */
    struct sample_cands *cd;
    float *row;                   /* [V] the fallback's full row */
    int32_t *hist;                /* [cap, hist_len] each row's sampled tokens */
    int hist_len;
    struct sampler sampler;
    long n_cand, n_full;          /* rows decided from candidates / the full row */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_list(const char *s, int *out) {
    if (!strcmp(s, "none")) return 0;
    int n = util_parse_int_list(s, out, E2E_MAX_LIST);
    for (int i = 0; i < n; i++)
        if (out[i] < 1) return -1;
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rng = 12345;
static int32_t rand_tok(int vocab) {
    rng = rng * 1664525u + 1013904223u;
    return (int32_t)((rng >> 8) % (uint32_t)vocab);
}

static const char *usage =
    "usage: awqd bench e2e --model DIR [--batches 1,8,32,64] [--contexts 512,4096]\n"
    "                      [--prompts 128,1024,4096] [--steps 16] [--fraction 0.9]\n"
    "                      [--sampling greedy,t1[,full]] [--chunk N,..]\n"
    "                      [--tp N [--devices a,b,..] [--comm-off]] [--settle-ms 1000]\n"
    "                      [--max-model-len N]\n"
    "(a list may be `none`)\n"
    "Decode tokens/s per batch size and context, TTFT per prompt length and GPU\n"
    "memory of the model on GPU 0 (or sharded over --tp GPUs: --devices, default\n"
    "0..N-1), each next to its roofline (measured copy rate and cuBLAS fp16 GEMM\n"
    "rate; per rank with --tp). --comm-off also times decode with every all-reduce\n"
    "made a no-op and prints the all-reduce time per step and its share.\n"
    "--sampling: how each step's rows are consumed, one decode column per mode:\n"
    "  greedy / t1  GPU sampling candidates + host finish as `awqd serve` does\n"
    "               (temperature 0 / 1.0; default: greedy,t1)\n"
    "  full         the full fp32 logits of every row downloaded (the old bench)\n"
    "TTFT samples its last row in the first mode. --chunk: TTFT also with the\n"
    "prompt prefilled in chunks of N tokens (the scheduler's chunked prefill);\n"
    "the model's row workspace is sized for max(largest chunk or prompt, batch).\n"
    "Make a model with `awqd mkmodel qwen3-8b DIR`.\n"
    "--settle-ms: pause between the TTFT runs and the decode table (the GPU's\n"
    "power cap, engaged by long prefills, releases; 0: none)\n"
    "--max-model-len: size the sequences' block tables for N tokens, as `awqd\n"
    "serve` does for its max_model_len (default: the model's max_position, as\n"
    "serve's default; at most that)\n";

static void samp_params(enum e2e_mode mode, int row, struct sampling_params *p) {
    sampling_params_default(p);
    p->temperature = mode == MODE_T1 ? 1.0f : 0.0f;
    p->seed = 1000 + (uint64_t)row;
    p->n_logprobs = 0; /* the server's default: the sampled token's logprob only */
}

/* Stages rows [0, n) of a SAMPLE forward (sched.c stage_sample_row). */
static void samp_stage(struct e2e_samp *sp, enum e2e_mode mode, int n, int n_out,
                       struct model_out *mo) {
    for (int i = 0; i < n; i++) {
        struct sampling_params p;
        samp_params(mode, i, &p);
        sp->inv_t[i] = sampler_inv_t(&p);
        sampler_race_row(&p, n_out, sp->race + 3 * (size_t)i);
        sp->adj_start[i + 1] = 0;
        int k = sampler_cands_needed(&p, 0, SAMPLE_MAX_K); /* as sched.c stages rows */
        if (i == 0 || k > sp->k) sp->k = k;
    }
    sp->adj_start[0] = 0;
    *mo = (struct model_out){.logits = NULL, .k = sp->k, .inv_t = sp->inv_t, .race = sp->race,
                             .adj_start = sp->adj_start, .adj = NULL, .cands = sp->cands,
                             .adj_raw = NULL};
}

/* Finishes rows [0, n) after the forward (sched.c sample_into): merge the
 * ranks' candidates, sampler_finish, the full row when undecided. The
 * tokens go to next[i]; 0 / -1 (message printed). */
static int samp_finish(struct e2e_samp *sp, struct model_group *g, enum e2e_mode mode, int n,
                       int n_out, int32_t *next) {
    size_t RF = SAMPLE_ROW_FLOATS(sp->k);
    for (int i = 0; i < n; i++) {
        struct sampling_params p;
        samp_params(mode, i, &p);
        const float *rows[E2E_MAX_LIST];
        for (int r = 0; r < sp->tp; r++) rows[r] = sp->cands + ((size_t)r * n + i) * RF;
        sampler_cands_merge(sp->cd, rows, sp->tp, sp->k, sp->V, sampler_inv_t(&p));
        sp->cd->adj = NULL;
        sp->cd->adj_raw = NULL;
        sp->cd->n_adj = 0;
        struct sample_result res;
        int32_t *h = sp->hist + (size_t)i * sp->hist_len;
        int no = n_out < sp->hist_len ? n_out : sp->hist_len;
        if (sampler_finish(&p, sp->cd, n_out, &res) == 0) {
            sp->n_cand++;
        } else {
            char err[256];
            if (model_group_sample_row_logits(g, i, sp->row, err, sizeof err) ||
                sampler_sample(&sp->sampler, &p, sp->row, NULL, 0, h, no, &res)) {
                fprintf(stderr, "awqd bench e2e: the full-row sample fallback failed: %s\n", err);
                return -1;
            }
            sp->n_full++;
        }
        if (n_out < sp->hist_len) h[n_out] = res.token;
        next[i] = res.token;
    }
    return 0;
}

/* One forward of batch b in `mode` (logits: host [rows, V] for MODE_FULL);
 * the sampled tokens into next (sampled modes). 0 / -2 (message printed). */
static int run_forward(struct model_group *g, struct batch_seq *bs, int n, enum e2e_mode mode,
                       struct e2e_samp *sp, float *logits, int n_out, int32_t *next) {
    char err[512];
    struct batch b = {bs, n};
    int rc;
    if (mode == MODE_FULL) {
        rc = model_group_forward(g, &b, logits, err, sizeof err);
    } else {
        struct model_out mo;
        samp_stage(sp, mode, n, n_out, &mo);
        rc = model_group_forward_out(g, &b, &mo, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        return -2;
    }
    if (mode != MODE_FULL && samp_finish(sp, g, mode, n, n_out, next)) return -2;
    return 0;
}

/* Decode steps of batch B at context C (each sequence its own blocks); the
 * mean seconds per step over `steps` after 2 warm-up steps, or < 0 when the
 * KV cache cannot hold the case (-1) or a forward failed (-2, message
 * printed). Sampled modes feed each sequence its sampled token. */
static double decode_case(struct model_group *g, struct kv *kv, struct kv_seq *seqs,
                          struct batch_seq *bs, int32_t *cur, float *logits, struct e2e_samp *sp,
                          enum e2e_mode mode, int B, int C, int steps) {
    int ok = 1;
    for (int s = 0; s < B && ok; s++) ok = kv_seq_reserve(kv, &seqs[s], C + steps + 3) == 0;
    if (!ok) {
        for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
        return -1;
    }
    double t_run = 0;
    for (int it = 0; it < steps + 2; it++) { /* 2 warm-up steps */
        int past = C + it;
        int lm = mode == MODE_FULL ? MODEL_LOGITS_LAST : MODEL_LOGITS_SAMPLE;
        for (int s = 0; s < B; s++)
            bs[s] = (struct batch_seq){cur + s, 1, past, seqs[s].blocks, seqs[s].n_blocks, lm};
        double a = now_s();
        if (run_forward(g, bs, B, mode, sp, logits, it, cur)) {
            for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
            return -2;
        }
        if (it >= 2) t_run += now_s() - a;
    }
    for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
    return t_run / steps;
}

/* TTFT of a P-token prompt prefilled in chunks of at most `chunk` tokens
 * (the last chunk's last row sampled in `mode`): seconds, or < 0. */
static double ttft_case(struct model_group *g, struct kv *kv, const int32_t *toks, int P,
                        int chunk, float *logits, struct e2e_samp *sp, enum e2e_mode mode) {
    struct kv_seq s = {0};
    if (kv_seq_reserve(kv, &s, P)) {
        fprintf(stderr, "awqd bench e2e: out of KV blocks for a %d-token prompt\n", P);
        return -1;
    }
    int32_t next = 0;
    double a = now_s();
    int rc = 0;
    for (int done = 0; done < P && !rc;) {
        int n = P - done < chunk ? P - done : chunk;
        int last = done + n == P;
        struct batch_seq q = {toks + done, n, done, s.blocks, s.n_blocks,
                              !last ? MODEL_LOGITS_NONE
                              : mode == MODE_FULL ? MODEL_LOGITS_LAST : MODEL_LOGITS_SAMPLE};
        rc = run_forward(g, &q, 1, last ? mode : MODE_FULL, sp, logits, 0, &next);
        done += n;
    }
    double t = now_s() - a;
    kv_seq_free(kv, &s);
    return rc ? -2 : t;
}

static int parse_modes(const char *s, int *modes) {
    int n = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int m = -1;
        for (int i = 0; i < MODE_COUNT; i++)
            if (!strcmp(t, mode_name[i])) m = i;
        if (m < 0 || n == MODE_COUNT) return -1;
        modes[n++] = m;
    }
    return n;
}

static int samp_init(struct e2e_samp *sp, int tp, int V, int cap, int hist_len) {
    memset(sp, 0, sizeof *sp);
    sp->tp = tp;
    sp->k = SAMPLE_MAX_K;
    sp->V = V;
    sp->cap = cap;
    sp->hist_len = hist_len;
    sp->inv_t = malloc(sizeof(float) * (size_t)cap);
    sp->race = malloc(sizeof(int32_t) * 3 * (size_t)cap);
    sp->adj_start = calloc((size_t)cap + 1, sizeof(int32_t));
    sp->cands = malloc(sizeof(float) * (size_t)tp * cap * SAMPLE_ROW_FLOATS(sp->k));
    sp->cd = malloc(sizeof *sp->cd);
    sp->row = malloc(sizeof(float) * (size_t)V);
    sp->hist = calloc((size_t)cap * hist_len, sizeof(int32_t));
    if (sampler_init(&sp->sampler, V)) return -1;
    return sp->inv_t && sp->race && sp->adj_start && sp->cands && sp->cd && sp->row && sp->hist
               ? 0 : -1;
}

static void samp_free(struct e2e_samp *sp) {
    free(sp->inv_t);
    free(sp->race);
    free(sp->adj_start);
    free(sp->cands);
    free(sp->cd);
    free(sp->row);
    free(sp->hist);
    sampler_free(&sp->sampler);
}

int bench_e2e(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("%s", usage);
        return 0;
    }
    const char *model_dir = NULL;
    int batches[E2E_MAX_LIST] = {1, 8, 32, 64}, nb = 4;
    int contexts[E2E_MAX_LIST] = {512, 4096}, nc = 2;
    int prompts[E2E_MAX_LIST] = {128, 1024, 4096}, np = 3;
    int chunks[E2E_MAX_LIST] = {0}, nk = 0;
    int modes[MODE_COUNT] = {MODE_GREEDY, MODE_T1}, nm = 2;
    int steps = 16, settle_ms = 1000;
    double fraction = 0.90;
    int tp = 1, devices[E2E_MAX_LIST] = {0}, nd = 0, comm_off = 0, max_model_len = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"batches", required_argument, 0, 'b'},
                                         {"contexts", required_argument, 0, 'c'},
                                         {"prompts", required_argument, 0, 'p'},
                                         {"steps", required_argument, 0, 's'},
                                         {"fraction", required_argument, 0, 'f'},
                                         {"sampling", required_argument, 0, 'S'},
                                         {"chunk", required_argument, 0, 'k'},
                                         {"tp", required_argument, 0, 't'},
                                         {"devices", required_argument, 0, 'd'},
                                         {"comm-off", no_argument, 0, 'o'},
                                         {"settle-ms", required_argument, 0, 'P'},
                                         {"max-model-len", required_argument, 0, 'L'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'b': nb = parse_list(optarg, batches); break;
        case 'c': nc = parse_list(optarg, contexts); break;
        case 'p': np = parse_list(optarg, prompts); break;
        case 's': steps = atoi(optarg); break;
        case 'f': fraction = atof(optarg); break;
        case 'S': nm = parse_modes(optarg, modes); break;
        case 'k': nk = parse_list(optarg, chunks); break;
        case 't': tp = atoi(optarg); break;
        case 'd': nd = util_parse_int_list(optarg, devices, E2E_MAX_LIST); break;
        case 'o': comm_off = 1; break;
        case 'P': settle_ms = atoi(optarg); break;
        case 'L': max_model_len = atoi(optarg); break;
        default: fprintf(stderr, "%s", usage); return 2;
        }
    }
    if (!model_dir || nb < 0 || nc < 0 || np < 0 || nk < 0 || nm < 1 || steps < 1 ||
        !(fraction > 0 && fraction <= 1) || tp < 1 || tp > E2E_MAX_LIST || (nd && nd != tp) ||
        max_model_len < 0) {
        fprintf(stderr, "%s", usage);
        if (nd && nd != tp) fprintf(stderr, "--devices lists %d devices for --tp %d\n", nd, tp);
        if (nm < 1) fprintf(stderr, "--sampling: a list of greedy, t1, full\n");
        return 2;
    }
    for (int r = 0; !nd && r < tp; r++) devices[r] = r;

    char err[512];
    struct ckpt *ck = NULL;
    struct model_group *g = NULL;
    int status = 1;
    float *logits = NULL;
    int32_t *toks = NULL, *cur = NULL;
    struct kv kv = {0};
    struct kv_seq *seqs = NULL;
    struct batch_seq *bs = NULL;
    struct e2e_samp sp;
    memset(&sp, 0, sizeof sp);
    if (ckpt_open(model_dir, &ck, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        return 1;
    }
    const struct model_config *cfg = ckpt_config(ck);
    const int V = cfg->vocab, bsz = 16;
    int max_b = 1, max_c = 1, max_p = 1, max_k = 0;
    for (int i = 0; i < nb; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    for (int i = 0; i < nc; i++) max_c = contexts[i] > max_c ? contexts[i] : max_c;
    for (int i = 0; i < np; i++) max_p = prompts[i] > max_p ? prompts[i] : max_p;
    for (int i = 0; i < nk; i++) max_k = chunks[i] > max_k ? chunks[i] : max_k;

    /* rooflines, measured before the model takes the memory */
    double copy_gbs = 0, gemm_tf = 0;
    if (cuda_measure_rates(devices[0], &copy_gbs, &gemm_tf, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    struct cuda_mem_plan plan;
    /* sequences the model holds: at least ENGINE_MAX_N, as `awqd serve` sizes it (engine/sched.c),
     * so that the decode graph buckets are the server's: the model's limit, min(sequences, rows),
     * is always its last bucket, and a limit of 9-15 replays batch 9..limit at M = limit instead of
     * 16 (Qwen3-8B batch 9 / 12 ~1.15x a step, H200, session 55) */
    const int S = max_b > ENGINE_MAX_N ? max_b : ENGINE_MAX_N;
    /* rows of one forward: the largest chunk (or whole prompt without --chunk) or batch, and at
     * least S (a decode step of S sequences) */
    int T = nk ? max_k : max_p;
    if (T < S) T = S;
    if (cuda_mem_plan_make(cfg, tp, devices[0], fraction, bsz, T, S, &plan, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    cuda_mem_plan_print(&plan, stdout);
    for (int i = 0; i < nk; i++) { /* what each chunk size would cost (the plan's formula) */
        struct cuda_mem_plan pk;
        int Tk = chunks[i] > S ? chunks[i] : S;
        if (!cuda_mem_plan_make(cfg, tp, devices[0], fraction, bsz, Tk, S, &pk, NULL, 0))
            printf("  (max_tokens %d: workspace %.3f GB, weights + workspace %.3f GB = %.3f GiB)\n",
                   Tk, pk.workspace / 1e9, (pk.weights + pk.workspace) / 1e9,
                   (pk.weights + pk.workspace) / 1073741824.0);
    }
    int per_seq = (max_c + steps + 4 + bsz - 1) / bsz;
    int need = max_b * per_seq + (max_p + bsz - 1) / bsz + 4;
    int n_blocks = need < plan.n_blocks ? need : plan.n_blocks;
    if (n_blocks < need)
        printf("note: the plan holds %d KV blocks, the largest case needs %d: cases that do not fit are skipped\n",
               plan.n_blocks, need);

    struct model_group_opts go;
    model_group_opts_default(&go);
    go.backend = "cuda";
    go.tp = tp;
    go.devices = devices;
    go.model.n_blocks = n_blocks;
    go.model.block_size = bsz;
    go.model.max_tokens = T;
    go.model.max_seqs = S;
    /* the block tables as `awqd serve` sizes them (engine/sched.c: max_model_len, default and
     * at most max_position) and at least as long as the bench's longest sequence */
    int mml = max_model_len > 0 ? max_model_len : cfg->max_position;
    if (mml > cfg->max_position && cfg->max_position > 0) mml = cfg->max_position;
    int mbp = (max_c + steps + 4 + bsz - 1) / bsz, pb = (max_p + bsz - 1) / bsz, lb = (mml + bsz - 1) / bsz;
    go.model.max_blocks_per_seq = mbp > pb ? mbp : pb;
    if (lb > go.model.max_blocks_per_seq) go.model.max_blocks_per_seq = lb;
    uint64_t used0 = 0, used = 0, total = 0;
    cuda_mem_in_use(devices[0], &used0, &total);
    double t0 = now_s();
    if (model_group_init(ck, &go, &g, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    double t_load = now_s() - t0;
    cuda_mem_in_use(devices[0], &used, &total);
    uint64_t kv_alloc = cuda_mem_plan_kv_alloc(&plan, n_blocks); /* K/V buffers, 2 MiB pages */
    printf("model %s: tp=%d, loaded in %.1f s; GPU memory in use %.2f GB of %.2f GB on device %d "
           "(%d KV blocks allocated = %.3f GB)\n",
           model_dir, tp, t_load, used / 1e9, total / 1e9, devices[0], n_blocks, kv_alloc / 1e9);
    printf("measured after loading: %.3f GB more than before = KV buffers %.3f GB + %.3f GB "
           "(weights %.3f GB planned + the workspace allocated so far + context growth)\n",
           (used - used0) / 1e9, kv_alloc / 1e9, ((double)used - used0 - kv_alloc) / 1e9,
           plan.weights / 1e9);
    printf("rooflines: copy %.0f GB/s (read + write), cuBLAS fp16 GEMM %.0f TFLOP/s\n", copy_gbs,
           gemm_tf);
    printf("sampling modes:");
    for (int i = 0; i < nm; i++) printf("%s %s", i ? ";" : "", mode_desc[modes[i]]);
    printf("\n");

    /* bytes every decode step reads regardless of the batch: INT4 linears, lm_head, norms
     * (one rank's share: the plan is per rank) */
    double H = cfg->hidden;
    double w_step = (double)plan.weights_int4 + (double)V * H * 2 / tp + cfg->n_layers * 4.0 * H;
    double kv_tok = (double)plan.kv_block_bytes / bsz;
    /* FLOPs per prompt token of the linears (2 * params) */
    double lin_params = (double)plan.weights_int4 * 2.0; /* ~0.5 byte per weight */
    double attn_flops_coef = 4.0 * cfg->n_layers * cfg->n_heads * cfg->head_dim; /* x P^2 / 2 */

    if (kv_init(&kv, n_blocks, bsz)) goto oom;
    logits = malloc((size_t)(max_b > 1 ? max_b : 1) * V * sizeof(float));
    toks = malloc((size_t)(max_p + max_b) * sizeof(int32_t));
    cur = malloc((size_t)max_b * sizeof(int32_t));
    seqs = calloc((size_t)max_b, sizeof *seqs);
    bs = calloc((size_t)max_b, sizeof *bs);
    if (!logits || !toks || !cur || !seqs || !bs || samp_init(&sp, tp, V, max_b, steps + 2))
        goto oom;
    for (int i = 0; i < max_p + max_b; i++) toks[i] = rand_tok(V);

    /* TTFT (sampled in the first mode), for each chunk size */
    enum e2e_mode m0 = (enum e2e_mode)modes[0];
    int chunk_list[E2E_MAX_LIST + 1], n_chunk = 0;
    chunk_list[n_chunk++] = T; /* one forward when the prompt fits */
    for (int i = 0; i < nk; i++)
        if (chunks[i] < T) chunk_list[n_chunk++] = chunks[i];
    if (np)
        printf("\n| prompt tokens | chunk | TTFT ms (median of 3, last row: %s) | roofline ms | "
               "prefill tok/s |\n|---|---|---|---|---|\n", mode_name[m0]);
    for (int pi = np ? -1 : 0; pi < np; pi++)
        for (int ki = 0; ki < n_chunk; ki++) {
            int P = pi < 0 ? 16 : prompts[pi]; /* pi = -1: warm-up */
            int ch = chunk_list[ki];
            if (pi < 0 && ki > 0) break;
            if (ki > 0 && ch >= P) continue; /* the same as one forward */
            double t[3];
            for (int r = 0; r < 3; r++) {
                t[r] = ttft_case(g, &kv, toks, P, ch, logits, &sp, m0);
                if (t[r] < 0) goto out;
            }
            if (pi < 0) continue;
            qsort(t, 3, sizeof t[0], cmp_double);
            double flops = 2.0 * lin_params * P + attn_flops_coef * (double)P * P / 2;
            double roof = w_step / (copy_gbs * 1e9);
            if (flops / (gemm_tf * 1e12) > roof) roof = flops / (gemm_tf * 1e12);
            printf("| %d | %d | %.1f | %.1f | %.0f |\n", P, ch < P ? ch : P, t[1] * 1e3,
                   roof * 1e3, P / t[1]);
            fflush(stdout);
        }

    /* decode, one column per sampling mode. After the prefills, a pause:
     * a 4096-token prefill engages the GPU's power cap (H100: SM clock
     * 1755 MHz, nvidia-smi reason sw_power_cap), which was still releasing
     * during the next ~0.3 s of batch-1 decode (about 2% fewer tokens/s,
     * docs/PERFORMANCE.md session 9); the decode table measures decode. */
    if (nb && nc && np && settle_ms > 0) usleep((useconds_t)settle_ms * 1000);
    if (nb && nc) {
        printf("\n| batch | context |");
        for (int i = 0; i < nm; i++) printf(" %s tok/s (ms/step) |", mode_name[modes[i]]);
        printf(" roofline tok/s | bytes/step GB |\n|---|---|");
        for (int i = 0; i < nm; i++) printf("---|");
        printf("---|---|\n");
    }
    double step_ms[E2E_MAX_LIST][E2E_MAX_LIST]; /* [context][batch] of the first mode, < 0: not run */
    for (int ci = 0; ci < nc; ci++)
        for (int bi = 0; bi < nb; bi++) {
            int B = batches[bi], C = contexts[ci];
            printf("| %d | %d |", B, C);
            double step = 0;
            for (int mi = 0; mi < nm; mi++) {
                for (int s = 0; s < B; s++) cur[s] = toks[s];
                step = decode_case(g, &kv, seqs, bs, cur, logits, &sp, (enum e2e_mode)modes[mi],
                                   B, C, steps);
                if (mi == 0) step_ms[ci][bi] = step * 1e3;
                if (step == -2) goto out;
                if (step < 0) break;
                printf(" %.0f (%.2f) |", B / step, step * 1e3);
                fflush(stdout);
            }
            if (step < 0) {
                printf(" (skipped: KV does not fit) |\n");
                continue;
            }
            double bytes = w_step + (double)B * (C + 2 + steps / 2.0) * kv_tok;
            double roof = B / (bytes / (copy_gbs * 1e9));
            printf(" %.0f | %.2f |\n", roof, bytes / 1e9);
            fflush(stdout);
        }
    if (kv_free_blocks(&kv) != n_blocks) {
        fprintf(stderr, "awqd bench e2e: KV blocks leaked\n");
        goto out;
    }
    if (sp.n_cand + sp.n_full)
        printf("sampled rows: %ld decided from the GPU candidates, %ld from the full row "
               "(SAMPLER_NEED_FULL)\n", sp.n_cand, sp.n_full);
    cuda_mem_in_use(devices[0], &used, &total);
    printf("measured after the runs: weights + workspace = %.3f GB = %.3f GiB (in use %.3f GB "
           "more than before loading, minus the KV buffers' %.3f GB; planned %.3f GB = weights "
           "%.3f + workspace %.3f); GPU memory in use %.2f GB\n",
           ((double)used - used0 - kv_alloc) / 1e9,
           ((double)used - used0 - kv_alloc) / 1073741824.0, (used - used0) / 1e9,
           kv_alloc / 1e9, (plan.weights + plan.workspace) / 1e9, plan.weights / 1e9,
           plan.workspace / 1e9, used / 1e9);

    /* the same decode cases with every all-reduce a no-op */
    if (comm_off && tp > 1 && nb && nc) {
        model_group_free(g);
        g = NULL;
        const char *prev = getenv("AWQD_ALLREDUCE");
        char *saved = prev ? strdup(prev) : NULL;
        setenv("AWQD_ALLREDUCE", "off", 1);
        int rc = model_group_init(ck, &go, &g, err, sizeof err);
        if (saved) {
            setenv("AWQD_ALLREDUCE", saved, 1);
            free(saved);
        } else {
            unsetenv("AWQD_ALLREDUCE");
        }
        if (rc) {
            fprintf(stderr, "awqd bench e2e: %s\n", err);
            goto out;
        }
        printf("\nall-reduce time per decode step (tp=%d, sampling %s): the step with every "
               "all-reduce a no-op (AWQD_ALLREDUCE=off, model loaded again) subtracted from the "
               "step above; %d all-reduces per step of batch x %d fp16 each\n",
               tp, mode_name[m0], 2 * cfg->n_layers + 1, cfg->hidden);
        printf("| batch | context | ms/step | ms/step, no all-reduce | all-reduce ms/step | share | "
               "us per all-reduce |\n|---|---|---|---|---|---|---|\n");
        for (int ci = 0; ci < nc; ci++)
            for (int bi = 0; bi < nb; bi++) {
                int B = batches[bi], C = contexts[ci];
                if (step_ms[ci][bi] < 0) continue;
                for (int s = 0; s < B; s++) cur[s] = toks[s];
                double off = decode_case(g, &kv, seqs, bs, cur, logits, &sp, m0, B, C, steps);
                if (off == -2) goto out;
                if (off < 0) continue;
                double with = step_ms[ci][bi], wo = off * 1e3, d = with - wo;
                printf("| %d | %d | %.3f | %.3f | %.3f | %.1f%% | %.2f |\n", B, C, with, wo, d,
                       100.0 * d / with, d * 1e3 / (2 * cfg->n_layers + 1));
                fflush(stdout);
            }
    }
    status = 0;
    goto out;
oom:
    fprintf(stderr, "awqd bench e2e: out of memory\n");
out:
    if (kv.free_list) kv_free(&kv);
    samp_free(&sp);
    free(seqs);
    free(bs);
    free(logits);
    free(toks);
    free(cur);
    model_group_free(g);
    ckpt_close(ck);
    return status;
}
#endif
