/* bench_e2e.c — `awqd bench e2e`: the whole model on one GPU, or on tp GPUs
 * (CUDA backend).
 *
 *   awqd bench e2e --model DIR [--batches 1,8,32,64] [--contexts 512,4096]
 *                  [--prompts 128,1024,4096] [--steps 16] [--fraction 0.9]
 *                  [--tp N [--devices a,b,..] [--comm-off]]
 *
 * Measures, through model_group_forward exactly as the scheduler calls it
 * (host staging, uploads, logits of every sequence downloaded each step):
 *   - decode tokens/s at each batch size and context (each sequence has its
 *     own KV blocks, `past` = context; the KV contents are whatever the
 *     cache holds: timing does not depend on the values);
 *   - TTFT: one forward over a whole prompt of P tokens with the last row's
 *     logits (median of 3);
 *   - GPU memory in use after loading.
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

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/util.h"
#include "kernels/cuda/mem_plan.h"

#define E2E_MAX_LIST 16

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
    "                      [--tp N [--devices a,b,..] [--comm-off]]\n"
    "(a list may be `none`)\n"
    "Decode tokens/s per batch size and context, TTFT per prompt length and GPU\n"
    "memory of the model on GPU 0 (or sharded over --tp GPUs: --devices, default\n"
    "0..N-1), each next to its roofline (measured copy rate and cuBLAS fp16 GEMM\n"
    "rate; per rank with --tp). --comm-off also times decode with every all-reduce\n"
    "made a no-op and prints the all-reduce time per step and its share.\n"
    "Make a model with `awqd mkmodel qwen3-8b DIR`.\n";

/* Decode steps of batch B at context C (each sequence its own blocks); the
 * mean seconds per step over `steps` after 2 warm-up steps, or < 0 when the
 * KV cache cannot hold the case (-1) or a forward failed (-2, message
 * printed). */
static double decode_case(struct model_group *g, struct kv *kv, struct kv_seq *seqs,
                          struct batch_seq *bs, const int32_t *toks, float *logits, int B, int C,
                          int steps) {
    char err[512];
    int ok = 1;
    for (int s = 0; s < B && ok; s++) ok = kv_seq_reserve(kv, &seqs[s], C + steps + 3) == 0;
    if (!ok) {
        for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
        return -1;
    }
    double t_run = 0;
    for (int it = 0; it < steps + 2; it++) { /* 2 warm-up steps */
        int past = C + it;
        for (int s = 0; s < B; s++)
            bs[s] = (struct batch_seq){toks + s, 1, past, seqs[s].blocks, seqs[s].n_blocks,
                                       MODEL_LOGITS_LAST};
        struct batch b = {bs, B};
        double a = now_s();
        if (model_group_forward(g, &b, logits, err, sizeof err)) {
            fprintf(stderr, "awqd bench e2e: %s\n", err);
            for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
            return -2;
        }
        if (it >= 2) t_run += now_s() - a;
    }
    for (int s = 0; s < B; s++) kv_seq_free(kv, &seqs[s]);
    return t_run / steps;
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
    int steps = 16;
    double fraction = 0.90;
    int tp = 1, devices[E2E_MAX_LIST] = {0}, nd = 0, comm_off = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"batches", required_argument, 0, 'b'},
                                         {"contexts", required_argument, 0, 'c'},
                                         {"prompts", required_argument, 0, 'p'},
                                         {"steps", required_argument, 0, 's'},
                                         {"fraction", required_argument, 0, 'f'},
                                         {"tp", required_argument, 0, 't'},
                                         {"devices", required_argument, 0, 'd'},
                                         {"comm-off", no_argument, 0, 'o'},
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
        case 't': tp = atoi(optarg); break;
        case 'd': nd = util_parse_int_list(optarg, devices, E2E_MAX_LIST); break;
        case 'o': comm_off = 1; break;
        default: fprintf(stderr, "%s", usage); return 2;
        }
    }
    if (!model_dir || nb < 0 || nc < 0 || np < 0 || steps < 1 || !(fraction > 0 && fraction <= 1) ||
        tp < 1 || tp > E2E_MAX_LIST || (nd && nd != tp)) {
        fprintf(stderr, "%s", usage);
        if (nd && nd != tp) fprintf(stderr, "--devices lists %d devices for --tp %d\n", nd, tp);
        return 2;
    }
    for (int r = 0; !nd && r < tp; r++) devices[r] = r;

    char err[512];
    struct ckpt *ck = NULL;
    struct model_group *g = NULL;
    int status = 1;
    float *logits = NULL;
    int32_t *toks = NULL;
    struct kv kv = {0};
    struct kv_seq *seqs = NULL;
    struct batch_seq *bs = NULL;
    if (ckpt_open(model_dir, &ck, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        return 1;
    }
    const struct model_config *cfg = ckpt_config(ck);
    const int V = cfg->vocab, bsz = 16;
    int max_b = 1, max_c = 1, max_p = 1;
    for (int i = 0; i < nb; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    for (int i = 0; i < nc; i++) max_c = contexts[i] > max_c ? contexts[i] : max_c;
    for (int i = 0; i < np; i++) max_p = prompts[i] > max_p ? prompts[i] : max_p;

    /* rooflines, measured before the model takes the memory */
    double copy_gbs = 0, gemm_tf = 0;
    if (cuda_measure_rates(devices[0], &copy_gbs, &gemm_tf, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    struct cuda_mem_plan plan;
    int T = max_p > max_b ? max_p : max_b;
    if (cuda_mem_plan_make(cfg, tp, devices[0], fraction, bsz, T, max_b, &plan, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    cuda_mem_plan_print(&plan, stdout);
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
    go.model.max_seqs = max_b;
    int mbp = (max_c + steps + 4 + bsz - 1) / bsz, pb = (max_p + bsz - 1) / bsz;
    go.model.max_blocks_per_seq = mbp > pb ? mbp : pb;
    double t0 = now_s();
    if (model_group_init(ck, &go, &g, err, sizeof err)) {
        fprintf(stderr, "awqd bench e2e: %s\n", err);
        goto out;
    }
    double t_load = now_s() - t0;
    uint64_t used = 0, total = 0;
    cuda_mem_in_use(devices[0], &used, &total);
    printf("model %s: tp=%d, loaded in %.1f s; GPU memory in use %.2f GB of %.2f GB on device %d "
           "(%d KV blocks allocated)\n",
           model_dir, tp, t_load, used / 1e9, total / 1e9, devices[0], n_blocks);
    printf("rooflines: copy %.0f GB/s (read + write), cuBLAS fp16 GEMM %.0f TFLOP/s\n", copy_gbs,
           gemm_tf);

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
    toks = malloc((size_t)(T + max_b) * sizeof(int32_t));
    seqs = calloc((size_t)max_b, sizeof *seqs);
    bs = calloc((size_t)max_b, sizeof *bs);
    if (!logits || !toks || !seqs || !bs) goto oom;
    for (int i = 0; i < T + max_b; i++) toks[i] = rand_tok(V);

    /* TTFT */
    if (np) printf("\n| prompt tokens | TTFT ms (median of 3) | roofline ms | prefill tok/s |\n|---|---|---|---|\n");
    for (int pi = np ? -1 : 0; pi < np; pi++) {
        int P = pi < 0 ? 16 : prompts[pi]; /* pi = -1: warm-up */
        double t[3];
        for (int r = 0; r < 3; r++) {
            struct kv_seq s = {0};
            if (kv_seq_reserve(&kv, &s, P)) {
                fprintf(stderr, "awqd bench e2e: out of KV blocks for a %d-token prompt\n", P);
                goto out;
            }
            struct batch_seq q = {toks, P, 0, s.blocks, s.n_blocks, MODEL_LOGITS_LAST};
            struct batch b = {&q, 1};
            double a = now_s();
            int rc = model_group_forward(g, &b, logits, err, sizeof err);
            t[r] = now_s() - a;
            kv_seq_free(&kv, &s);
            if (rc) {
                fprintf(stderr, "awqd bench e2e: %s\n", err);
                goto out;
            }
        }
        if (pi < 0) continue;
        qsort(t, 3, sizeof t[0], cmp_double);
        double flops = 2.0 * lin_params * P + attn_flops_coef * (double)P * P / 2;
        double roof = w_step / (copy_gbs * 1e9);
        if (flops / (gemm_tf * 1e12) > roof) roof = flops / (gemm_tf * 1e12);
        printf("| %d | %.1f | %.1f | %.0f |\n", P, t[1] * 1e3, roof * 1e3, P / t[1]);
    }

    /* decode */
    if (nb && nc)
        printf("\n| batch | context | decode tok/s | ms/step | roofline tok/s | bytes/step GB |\n"
               "|---|---|---|---|---|---|\n");
    double step_ms[E2E_MAX_LIST][E2E_MAX_LIST]; /* [context][batch], < 0: not run */
    for (int ci = 0; ci < nc; ci++)
        for (int bi = 0; bi < nb; bi++) {
            int B = batches[bi], C = contexts[ci];
            double step = decode_case(g, &kv, seqs, bs, toks, logits, B, C, steps);
            step_ms[ci][bi] = step * 1e3;
            if (step == -2) goto out;
            if (step < 0) {
                printf("| %d | %d | (skipped: KV does not fit) | | | |\n", B, C);
                continue;
            }
            double bytes = w_step + (double)B * (C + 2 + steps / 2.0) * kv_tok;
            double roof = B / (bytes / (copy_gbs * 1e9));
            printf("| %d | %d | %.0f | %.2f | %.0f | %.2f |\n", B, C, B / step, step * 1e3, roof,
                   bytes / 1e9);
            fflush(stdout);
        }
    if (kv_free_blocks(&kv) != n_blocks) {
        fprintf(stderr, "awqd bench e2e: KV blocks leaked\n");
        goto out;
    }

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
        printf("\nall-reduce time per decode step (tp=%d): the step with every all-reduce a no-op "
               "(AWQD_ALLREDUCE=off, model loaded again) subtracted from the step above; %d "
               "all-reduces per step of batch x %d fp16 each\n",
               tp, 2 * cfg->n_layers + 1, cfg->hidden);
        printf("| batch | context | ms/step | ms/step, no all-reduce | all-reduce ms/step | share | "
               "us per all-reduce |\n|---|---|---|---|---|---|---|\n");
        for (int ci = 0; ci < nc; ci++)
            for (int bi = 0; bi < nb; bi++) {
                int B = batches[bi], C = contexts[ci];
                if (step_ms[ci][bi] < 0) continue;
                double off = decode_case(g, &kv, seqs, bs, toks, logits, B, C, steps);
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
    free(seqs);
    free(bs);
    free(logits);
    free(toks);
    model_group_free(g);
    ckpt_close(ck);
    return status;
}
#endif
