/* cmd_generate.c — `awqd generate`: one prompt through the model, prefilled in
 * chunks, then decoded token by token with the sampler. For checks against
 * reference outputs (--logits-out, --json) and quick manual runs. */
#include "server/cmd.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/sampler.h"
#include "engine/tok.h"
#include "engine/util.h"
#ifdef AWQD_CUDA
#include "kernels/cuda/mem_plan.h"
#endif

#define GEN_MAX_PROMPT 65536

static const char *usage =
    "usage: awqd generate --model DIR [--backend cpu|cuda] (--prompt-ids 1,2,3 | --prompt TEXT)\n"
    "                     [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
    "                     [--seed S] [--ignore-eos] [--json] [--logits-out FILE]\n"
    "                     [--chunk N] [--threads N] [--tp N] [--devices 0,1,..] [--block-size N]\n"
    "\n"
    "Runs one prompt: prefill in chunks of --chunk tokens (default 64), then decode\n"
    "--max-tokens tokens (default 16), stopping at an end-of-sequence token unless\n"
    "--ignore-eos. Temperature 0 (the default) is greedy; --seed makes sampling\n"
    "reproducible. --json prints {prompt_ids, output_ids, finish_reason, text}; text\n"
    "is there when the model directory has a tokenizer.json. --logits-out FILE writes\n"
    "a safetensors file with one F32 tensor `logits` [prompt length, vocab]: the\n"
    "logits at every prompt position. --tp N runs N tensor-parallel ranks on threads\n"
    "(CPU backend) or N GPUs (--backend cuda; --devices lists one CUDA device per rank,\n"
    "default 0..N-1). --threads: CPU threads per rank (default: cores / tp).\n"
    "Tokens are sampled from the top-256 candidates the backend computes\n"
    "(ops->sample_topk), falling back to the full logits row when they do not\n"
    "decide; AWQD_SAMPLE_CANDIDATES=0 downloads full rows instead (same tokens).\n";

struct gen_args {
    const char *model, *backend, *prompt_ids, *prompt, *logits_out;
    int max_tokens, top_k, ignore_eos, json, chunk, threads, tp, block_size;
    int devices[64], n_devices;       /* --devices: one CUDA device per rank */
    float temperature, top_p, min_p;
    unsigned long long seed;
};

static int parse_args(int argc, char **argv, struct gen_args *a) {
    memset(a, 0, sizeof *a);
    a->backend = "cpu";
    a->max_tokens = 16;
    a->top_p = 1.0f;
    a->chunk = 64;
    a->tp = 1;
    a->block_size = 16;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"backend", required_argument, 0, 'b'},
        {"prompt-ids", required_argument, 0, 'i'},  {"prompt", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'},  {"temperature", required_argument, 0, 't'},
        {"top-p", required_argument, 0, 'P'},       {"top-k", required_argument, 0, 'k'},
        {"min-p", required_argument, 0, 'M'},       {"seed", required_argument, 0, 's'},
        {"ignore-eos", no_argument, 0, 'e'},        {"json", no_argument, 0, 'j'},
        {"logits-out", required_argument, 0, 'l'},  {"chunk", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 'T'},     {"tp", required_argument, 0, 'r'},
        {"block-size", required_argument, 0, 'B'},  {"devices", required_argument, 0, 'D'},
        {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'b': a->backend = optarg; break;
        case 'i': a->prompt_ids = optarg; break;
        case 'p': a->prompt = optarg; break;
        case 'n': a->max_tokens = (int)strtol(optarg, &end, 10); break;
        case 't': a->temperature = strtof(optarg, &end); break;
        case 'P': a->top_p = strtof(optarg, &end); break;
        case 'k': a->top_k = (int)strtol(optarg, &end, 10); break;
        case 'M': a->min_p = strtof(optarg, &end); break;
        case 's': a->seed = strtoull(optarg, &end, 10); break;
        case 'e': a->ignore_eos = 1; break;
        case 'j': a->json = 1; break;
        case 'l': a->logits_out = optarg; break;
        case 'c': a->chunk = (int)strtol(optarg, &end, 10); break;
        case 'T': a->threads = (int)strtol(optarg, &end, 10); break;
        case 'r': a->tp = (int)strtol(optarg, &end, 10); break;
        case 'B': a->block_size = (int)strtol(optarg, &end, 10); break;
        case 'D':
            a->n_devices = util_parse_int_list(optarg, a->devices, 64);
            if (a->n_devices < 1) {
                fprintf(stderr, "awqd generate: bad device list \"%s\" (e.g. 0,1)\n", optarg);
                return -EINVAL;
            }
            break;
        default:
            fprintf(stderr, "awqd generate: unknown or incomplete option %s\n%s", argv[optind - 1],
                    usage);
            return -EINVAL;
        }
        if (end && (*end || end == optarg)) {
            fprintf(stderr, "awqd generate: bad value \"%s\" for %s\n", optarg, argv[optind - 1]);
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "awqd generate: unexpected argument \"%s\"\n%s", argv[optind], usage);
        return -EINVAL;
    }
    const char *bad = NULL;
    if (!a->model) bad = "--model is required";
    else if (!a->prompt_ids == !a->prompt) bad = "give exactly one of --prompt-ids and --prompt";
    else if (a->max_tokens < 0) bad = "--max-tokens must be >= 0";
    else if (a->chunk < 1) bad = "--chunk must be >= 1";
    else if (a->tp < 1 || a->tp > 64) bad = "--tp must be in 1..64";
    else if (a->block_size < 1 || a->block_size > 1024) bad = "--block-size must be in 1..1024";
    else if (a->threads < 0) bad = "--threads must be >= 0";
    else if (a->n_devices && a->n_devices != a->tp) bad = "--devices must list one device per rank (--tp)";
    if (bad) {
        fprintf(stderr, "awqd generate: %s\n%s", bad, usage);
        return -EINVAL;
    }
    return 0;
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    return arr;
}

int cmd_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("%s", usage);
        return 0;
    }
    struct gen_args a;
    if (parse_args(argc, argv, &a)) return 2;

    char err[512];
    int status = 1, rc;
    struct ckpt *ck = NULL;
    struct model_group *g = NULL;
    struct tok *tk = NULL;
    struct kv kv = {0};
    struct kv_seq seq = {0};
    struct sampler smp = {0};
    int32_t *ids = NULL; /* prompt then output: [n_prompt + max_tokens] */
    float *logits = NULL, *all_logits = NULL;
    float *cands = NULL, *row = NULL;  /* [tp, SAMPLE_ROW_FLOATS(<= SAMPLE_MAX_K)]; [V] fallback row */
    struct sample_cands *cd = NULL;
    char *text = NULL;
    int n_prompt = 0, n_out = 0;

    if ((rc = ckpt_open(a.model, &ck, err, sizeof err))) {
        fprintf(stderr, "awqd generate: %s\n", err);
        goto out;
    }
    const struct model_config *cfg = ckpt_config(ck);
    int V = cfg->vocab;

    /* tokenizer, when the model directory has one */
    {
        char terr[256], path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", a.model);
        FILE *f = fopen(path, "r");
        if (f) {
            fclose(f);
            if (tok_load(a.model, &tk, terr, sizeof terr)) {
                if (a.prompt) {
                    fprintf(stderr, "awqd generate: %s\n", terr);
                    goto out;
                }
                tk = NULL; /* ids given: text output is optional */
            }
        }
    }

    /* prompt */
    ids = malloc(((size_t)GEN_MAX_PROMPT + (size_t)a.max_tokens) * sizeof *ids);
    if (!ids) goto oom;
    if (a.prompt_ids) {
        int *tmp = malloc(GEN_MAX_PROMPT * sizeof *tmp);
        if (!tmp) goto oom;
        n_prompt = util_parse_int_list(a.prompt_ids, tmp, GEN_MAX_PROMPT);
        for (int i = 0; i < n_prompt; i++) ids[i] = tmp[i];
        free(tmp);
        if (n_prompt <= 0) {
            fprintf(stderr, "awqd generate: --prompt-ids: expected a comma-separated list of ids\n");
            status = 2;
            goto out;
        }
    } else {
        if (!tk) {
            fprintf(stderr, "awqd generate: --prompt needs a tokenizer.json in %s (or use --prompt-ids)\n",
                    a.model);
            status = 2;
            goto out;
        }
        int32_t *t = NULL;
        size_t n = 0;
        if ((rc = tok_encode(tk, a.prompt, strlen(a.prompt), 1, &t, &n, err, sizeof err))) {
            fprintf(stderr, "awqd generate: %s\n", err);
            goto out;
        }
        if (n == 0 || n > GEN_MAX_PROMPT) {
            free(t);
            fprintf(stderr, "awqd generate: the prompt has %zu tokens (1..%d)\n", n, GEN_MAX_PROMPT);
            goto out;
        }
        memcpy(ids, t, n * sizeof *ids);
        n_prompt = (int)n;
        free(t);
    }
    for (int i = 0; i < n_prompt; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "awqd generate: prompt token %d is out of range (vocab %d)\n", ids[i], V);
            status = 2;
            goto out;
        }
    int max_ctx = n_prompt + a.max_tokens;
    if (max_ctx > cfg->max_position) max_ctx = cfg->max_position;
    if (n_prompt > max_ctx) {
        fprintf(stderr, "awqd generate: the prompt (%d tokens) exceeds the context length %d\n",
                n_prompt, cfg->max_position);
        status = 2;
        goto out;
    }

    /* model on tp ranks, KV for this one sequence */
    struct model_group_opts go;
    model_group_opts_default(&go);
    go.backend = a.backend;
    go.tp = a.tp;
    go.devices = a.n_devices ? a.devices : NULL;
    go.cpu_threads = a.threads;
    int chunk = a.chunk;
    go.model.block_size = a.block_size;
    go.model.n_blocks = (max_ctx + a.block_size - 1) / a.block_size + 1;
    go.model.max_tokens = chunk;
    go.model.max_seqs = 1;
    go.model.max_blocks_per_seq = go.model.n_blocks;
#ifdef AWQD_CUDA
    if (!strcmp(a.backend, "cuda") && a.tp == 1) { /* the plan a server would use (stderr) */
        struct cuda_mem_plan plan;
        if (cuda_mem_plan_make(cfg, 1, 0, 0.90, a.block_size, chunk, 1, &plan, err, sizeof err) == 0)
            cuda_mem_plan_print(&plan, stderr);
        else
            fprintf(stderr, "awqd generate: %s\n", err);
    }
#endif
    if ((rc = model_group_init(ck, &go, &g, err, sizeof err))) {
        fprintf(stderr, "awqd generate: %s\n", err);
        goto out;
    }
    if (kv_init(&kv, go.model.n_blocks, a.block_size) || sampler_init(&smp, V)) goto oom;
    logits = malloc((size_t)chunk * V * sizeof *logits);
    if (!logits) goto oom;
    /* sampling from candidates (engine/sampler.h) unless disabled or the
     * prompt logits are written (those need every row in full) */
    int use_cands = !util_env_is_zero("AWQD_SAMPLE_CANDIDATES") && !a.logits_out;
    int tp = model_group_tp(g), n_from_cands = 0, n_full = 0;
    cands = malloc(sizeof(float) * (size_t)tp * SAMPLE_ROW_FLOATS(SAMPLE_MAX_K));
    row = malloc(sizeof(float) * (size_t)V);
    cd = malloc(sizeof *cd);
    if (!cands || !row || !cd) goto oom;
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = a.temperature;
    sp.top_p = a.top_p;
    sp.top_k = a.top_k;
    sp.min_p = a.min_p;
    sp.seed = a.seed;
    sp.n_logprobs = -1; /* not printed */
    if ((rc = sampling_params_check(&sp, err, sizeof err))) {
        fprintf(stderr, "awqd generate: %s\n", err);
        status = 2;
        goto out;
    }
    float inv_t = sampler_inv_t(&sp);
    const int K = sampler_cands_needed(&sp, 0, SAMPLE_MAX_K); /* as the scheduler asks */
    int32_t no_adj[2] = {0, 0};
    int32_t race[3]; /* this step's race (the key follows n_out) */
    sampler_race_row(&sp, 0, race);
    struct model_out mo = {.logits = logits, .k = K, .inv_t = &inv_t, .adj_start = no_adj,
                           .cands = cands, .race = race};
    if (a.logits_out) {
        all_logits = malloc((size_t)n_prompt * V * sizeof *all_logits);
        if (!all_logits) goto oom;
    }

    /* prefill */
    int pos = 0;
    while (pos < n_prompt) {
        int n = n_prompt - pos < chunk ? n_prompt - pos : chunk;
        if ((rc = kv_seq_reserve(&kv, &seq, pos + n))) {
            fprintf(stderr, "awqd generate: out of KV blocks\n");
            goto out;
        }
        int last = pos + n == n_prompt;
        struct batch_seq s = {ids + pos, n, pos, seq.blocks, seq.n_blocks,
                              a.logits_out ? MODEL_LOGITS_ALL
                              : last       ? (use_cands ? MODEL_LOGITS_SAMPLE : MODEL_LOGITS_LAST)
                                           : MODEL_LOGITS_NONE};
        struct batch b = {&s, 1};
        if ((rc = model_group_forward_out(g, &b, &mo, err, sizeof err))) {
            fprintf(stderr, "awqd generate: %s\n", err);
            goto out;
        }
        if (a.logits_out) memcpy(all_logits + (size_t)pos * V, logits, (size_t)n * V * sizeof *logits);
        pos += n;
    }
    const float *cur = a.logits_out ? all_logits + (size_t)(n_prompt - 1) * V : logits;

    /* decode */
    const char *finish = "length";
    while (n_out < a.max_tokens) {
        if (n_prompt + n_out >= cfg->max_position) break;
        struct sample_result r;
        int decided = 0;
        if (use_cands) { /* this step's row came back as candidates */
            const float *rr[64];
            for (int k = 0; k < tp; k++) rr[k] = cands + (size_t)k * SAMPLE_ROW_FLOATS(K);
            sampler_cands_merge(cd, rr, tp, K, V, inv_t);
            decided = sampler_finish(&sp, cd, n_out, &r) == 0;
            if (!decided) {
                if ((rc = model_group_sample_row_logits(g, 0, row, err, sizeof err))) {
                    fprintf(stderr, "awqd generate: %s\n", err);
                    goto out;
                }
                cur = row;
            }
        }
        if (decided) n_from_cands++;
        else n_full++, sampler_sample(&smp, &sp, cur, ids, n_prompt, ids + n_prompt, n_out, &r);
        ids[n_prompt + n_out++] = r.token;
        int is_eos = 0;
        for (int e = 0; e < cfg->n_eos; e++) is_eos |= r.token == cfg->eos_ids[e];
        if (is_eos && !a.ignore_eos) {
            finish = "stop";
            break;
        }
        if (n_out == a.max_tokens || n_prompt + n_out >= cfg->max_position) break;
        int p = n_prompt + n_out - 1; /* position of the token just sampled */
        sampler_race_row(&sp, n_out, race); /* the next forward's row samples token n_out */
        if ((rc = kv_seq_reserve(&kv, &seq, p + 1))) {
            fprintf(stderr, "awqd generate: out of KV blocks\n");
            goto out;
        }
        struct batch_seq s = {ids + p, 1, p, seq.blocks, seq.n_blocks,
                              use_cands ? MODEL_LOGITS_SAMPLE : MODEL_LOGITS_LAST};
        struct batch b = {&s, 1};
        if ((rc = model_group_forward_out(g, &b, &mo, err, sizeof err))) {
            fprintf(stderr, "awqd generate: %s\n", err);
            goto out;
        }
        cur = logits;
    }

    if (getenv("AWQD_SAMPLE_STATS"))
        fprintf(stderr, "awqd generate: %d tokens sampled from candidates, %d from full rows\n",
                n_from_cands, n_full);
    if (tk) {
        size_t tl = 0;
        if (tok_decode(tk, ids + n_prompt, (size_t)n_out, 1, &text, &tl, err, sizeof err)) text = NULL;
    }
    if (a.logits_out) {
        struct st_desc d = {"logits", ST_F32, 2, {n_prompt, V}, all_logits};
        if ((rc = safetensors_write(a.logits_out, &d, 1, err, sizeof err))) {
            fprintf(stderr, "awqd generate: %s\n", err);
            goto out;
        }
    }
    if (a.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "prompt_ids", ids_json(ids, n_prompt));
        cJSON_AddItemToObject(o, "output_ids", ids_json(ids + n_prompt, n_out));
        cJSON_AddStringToObject(o, "finish_reason", finish);
        if (text) cJSON_AddStringToObject(o, "text", text);
        char *js = cJSON_PrintUnformatted(o);
        if (js) printf("%s\n", js);
        free(js);
        cJSON_Delete(o);
    } else {
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", ids[n_prompt + i]);
        printf("\n");
        if (text) printf("%s\n", text);
    }
    status = 0;
    goto out;
oom:
    fprintf(stderr, "awqd generate: out of memory\n");
out:
    kv_seq_free(&kv, &seq);
    if (kv.free_list) kv_free(&kv);
    sampler_free(&smp);
    model_group_free(g);
    if (ck) ckpt_close(ck);
    if (tk) tok_free(tk);
    free(text);
    free(ids);
    free(logits);
    free(all_logits);
    free(cands);
    free(row);
    free(cd);
    return status;
}
