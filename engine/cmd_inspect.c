/* cmd_inspect.c — `awqd inspect DIR [--json] [--tp N]`: what a checkpoint
 * holds (family, shapes, quantization, tensors and bytes by kind) and the
 * weight bytes each GPU gets at --tp N. Exit 0 when the model loads, 1 with
 * the loader's message otherwise, 2 on usage errors. */
#include "engine/ckpt.h"
#include "engine/safetensors.h"
#include "server/cmd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: awqd inspect DIR [--json] [--tp N]\n"
            "\n"
            "Checks a Hugging Face AWQ checkpoint the way the server loads it and prints\n"
            "its family, shapes, quantization, tensor count, bytes by kind (int4 linear\n"
            "= qweight + qzeros + scales, fp16 other) and, with --tp N, the weight bytes\n"
            "of each tensor-parallel rank. --json prints one JSON object. Exit status 0\n"
            "when the model loads, 1 with the reason when it does not.\n");
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static const char *family_name(enum model_family f) {
    switch (f) {
    case FAMILY_QWEN3: return "qwen3";
    case FAMILY_QWEN2: return "qwen2";
    default: return "llama";
    }
}

int cmd_inspect(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *dir = NULL;
    int json = 0, tp = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--tp")) {
            char *end = NULL;
            tp = i + 1 < argc ? (int)strtol(argv[++i], &end, 10) : 0;
            if (tp < 1 || tp > 1024 || (end && *end)) {
                fprintf(stderr, "awqd inspect: --tp needs a positive integer\n");
                return 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "awqd inspect: unknown option %s\n", argv[i]);
            return 2;
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "awqd inspect: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    char err[1024];
    struct ckpt *ck;
    if (ckpt_open(dir, &ck, err, sizeof err)) {
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 0);
            cJSON_AddStringToObject(o, "error", err);
            char *t = cJSON_PrintUnformatted(o);
            if (t) printf("%s\n", t);
            free(t);
            cJSON_Delete(o);
        }
        fprintf(stderr, "awqd inspect: %s\n", err);
        return 1;
    }
    const struct model_config *c = ckpt_config(ck);
    const struct safetensors *st = ckpt_safetensors(ck);
    uint64_t int4 = 0, fp16 = 0, other = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (ends_with(t->name, ".qweight") || ends_with(t->name, ".qzeros") ||
            ends_with(t->name, ".scales"))
            int4 += t->nbytes;
        else if (t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F32)
            fp16 += t->nbytes;
        else
            other += t->nbytes;
    }
    int ntp = tp ? tp : 1;
    uint64_t *rank_bytes = calloc((size_t)ntp, sizeof *rank_bytes);
    int rc = 0;
    if (!rank_bytes) {
        fprintf(stderr, "awqd inspect: out of memory\n");
        ckpt_close(ck);
        return 1;
    }
    for (int r = 0; r < ntp && !rc; r++)
        rc = ckpt_rank_bytes(ck, r, ntp, &rank_bytes[r], err, sizeof err);
    if (rc) {
        fprintf(stderr, "awqd inspect: %s\n", err);
        free(rank_bytes);
        ckpt_close(ck);
        return 1;
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "model_type", c->model_type);
        cJSON_AddStringToObject(o, "family", family_name(c->family));
        cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
        cJSON_AddNumberToObject(o, "hidden_size", c->hidden);
        cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate);
        cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
        cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_heads);
        cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
        cJSON_AddNumberToObject(o, "vocab_size", c->vocab);
        cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position);
        cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_embeddings);
        cJSON_AddBoolToObject(o, "qkv_bias", c->qkv_bias);
        cJSON_AddBoolToObject(o, "qk_norm", c->qk_norm);
        cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_eps);
        cJSON_AddNumberToObject(o, "rope_theta", c->rope.theta);
        cJSON_AddStringToObject(o, "rope_type", c->rope.type == ROPE_LLAMA3 ? "llama3" : "default");
        cJSON_AddStringToObject(o, "quant_method", "awq");
        cJSON_AddStringToObject(o, "version", "gemm");
        cJSON_AddNumberToObject(o, "bits", c->bits);
        cJSON_AddNumberToObject(o, "group_size", c->group_size);
        cJSON_AddBoolToObject(o, "zero_point", c->zero_point);
        cJSON *eos = cJSON_AddArrayToObject(o, "eos_token_ids");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(eos, cJSON_CreateNumber(c->eos_ids[i]));
        cJSON_AddNumberToObject(o, "bos_token_id", c->bos_id);
        cJSON_AddNumberToObject(o, "num_files", st->n_files);
        cJSON_AddNumberToObject(o, "num_tensors", st->n_tensors);
        cJSON_AddNumberToObject(o, "int4_bytes", (double)int4);
        cJSON_AddNumberToObject(o, "fp16_bytes", (double)fp16);
        cJSON_AddNumberToObject(o, "other_bytes", (double)other);
        cJSON_AddNumberToObject(o, "total_bytes", (double)st->total_bytes);
        cJSON_AddNumberToObject(o, "tp", ntp);
        cJSON *pr = cJSON_AddArrayToObject(o, "per_rank_bytes");
        for (int r = 0; r < ntp; r++) cJSON_AddItemToArray(pr, cJSON_CreateNumber((double)rank_bytes[r]));
        char *t = cJSON_PrintUnformatted(o);
        if (t) printf("%s\n", t);
        free(t);
        cJSON_Delete(o);
    } else {
        printf("model        %s (%s family)\n", ckpt_dir(ck), family_name(c->family));
        printf("model_type   %s\n", c->model_type);
        printf("shape        hidden %d, intermediate %d, layers %d\n", c->hidden, c->intermediate,
               c->n_layers);
        printf("attention    %d query heads, %d KV heads, head_dim %d%s%s\n", c->n_heads,
               c->n_kv_heads, c->head_dim, c->qkv_bias ? ", q/k/v bias" : "",
               c->qk_norm ? ", q/k norm" : "");
        printf("vocab        %d%s\n", c->vocab, c->tie_embeddings ? " (tied embeddings)" : "");
        printf("rope         theta %g, %s", c->rope.theta,
               c->rope.type == ROPE_LLAMA3 ? "llama3 scaling" : "default");
        if (c->rope.type == ROPE_LLAMA3)
            printf(" (factor %g, low %g, high %g, original %d)", c->rope.factor,
                   c->rope.low_freq_factor, c->rope.high_freq_factor,
                   c->rope.original_max_position);
        printf(", max positions %d\n", c->max_position);
        printf("quantization AWQ gemm, %d bits, group %d, zero point\n", c->bits, c->group_size);
        printf("eos          ");
        for (int i = 0; i < c->n_eos; i++) printf("%s%d", i ? ", " : "", c->eos_ids[i]);
        printf("%s\n", c->n_eos ? "" : "(none)");
        printf("tensors      %d in %d file%s\n", st->n_tensors, st->n_files,
               st->n_files == 1 ? "" : "s");
        printf("bytes        int4 linear %.3f GB, fp16 other %.3f GB%s, total %.3f GB\n",
               int4 / 1e9, fp16 / 1e9, other ? " (+ other)" : "", st->total_bytes / 1e9);
        if (ntp == 1)
            printf("in memory    %.3f GB of weights (tp 1)\n", rank_bytes[0] / 1e9);
        for (int r = 0; r < ntp && ntp > 1; r++)
            printf("rank %d/%-5d %.3f GB of weights\n", r, ntp, rank_bytes[r] / 1e9);
    }
    free(rank_bytes);
    ckpt_close(ck);
    return 0;
}
