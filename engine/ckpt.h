/* ckpt.h — checkpoints: a Hugging Face AWQ model directory (config.json,
 * generation_config.json, safetensors single-file or sharded) read into the
 * layout the forward pass uses, optionally as one tensor-parallel rank's shard.
 *
 * Usage:
 *     struct ckpt *ck;
 *     char err[512];
 *     if (ckpt_open("models/tiny", &ck, err, sizeof err)) { puts(err); ... }
 *     const struct model_config *cfg = ckpt_config(ck);
 *     struct model_weights w;
 *     if (ckpt_load(ck, rank, tp, &w, err, sizeof err)) { ... }
 *     ... use w (host memory) ...
 *     model_weights_free(&w);
 *     ckpt_close(ck);
 *
 * Weights are host memory: fp16 tensors as uint16_t bit patterns, AWQ tensors
 * exactly as AutoAWQ packs them (see ../shared/design/AWQ_FORMAT.md). A backend
 * copies (and may repack) them into its own memory; the CUDA backend keeps them
 * INT4. Fused matrices (q|k|v, gate|up) are concatenated along N at load.
 *
 * Thread safety: a struct ckpt may be used by one thread at a time; ckpt_load
 * for different ranks may run on different threads once ckpt_open returned. */
#ifndef AWQD_CKPT_H
#define AWQD_CKPT_H

#include <stddef.h>
#include <stdint.h>

enum model_family { FAMILY_QWEN3 = 0, FAMILY_QWEN2 = 1, FAMILY_LLAMA = 2 };

enum rope_type { ROPE_DEFAULT = 0, ROPE_LLAMA3 = 1 };

struct rope_config {
    double theta;                 /* rope_theta (base) */
    enum rope_type type;
    double factor;                /* llama3: scaling factor (e.g. 8) */
    double low_freq_factor;       /* llama3 (e.g. 1) */
    double high_freq_factor;      /* llama3 (e.g. 4) */
    int original_max_position;    /* llama3: original_max_position_embeddings */
};

#define CKPT_MAX_EOS 8

struct model_config {
    enum model_family family;
    char model_type[32];          /* "qwen3", "qwen2", "llama", "mistral" */
    int hidden;                   /* hidden_size */
    int intermediate;             /* intermediate_size */
    int n_layers;                 /* num_hidden_layers */
    int n_heads;                  /* num_attention_heads */
    int n_kv_heads;               /* num_key_value_heads */
    int head_dim;                 /* explicit (Qwen3) or hidden / n_heads */
    int vocab;                    /* vocab_size (rows of embed / lm_head) */
    double rms_eps;               /* rms_norm_eps */
    int tie_embeddings;           /* lm_head == embed_tokens */
    int max_position;             /* max_position_embeddings */
    int qkv_bias;                 /* q/k/v have biases (Qwen2) */
    int qk_norm;                  /* per-head q_norm/k_norm before RoPE (Qwen3) */
    struct rope_config rope;
    /* quantization_config */
    int quantized;                /* 1 for AWQ gemm, 0 for an fp16/bf16 checkpoint */
    int bits;                     /* 4 */
    int group_size;               /* 128 */
    int zero_point;               /* 1 */
    /* generation_config.json / config.json */
    int eos_ids[CKPT_MAX_EOS];
    int n_eos;
    int bos_id;                   /* -1 when none */
};

/* One AWQ linear layer y[M,N] = x[M,K] @ W[K,N], W = (q - z) * s per group.
 * Host memory; owned by the struct model_weights it belongs to. */
struct awq_linear {
    int k, n, group;              /* in features, out features, group size */
    const uint32_t *qweight;      /* int32 [K, N/8], 8 nibbles along N, AWQ order */
    const uint32_t *qzeros;       /* int32 [K/G, N/8], same packing */
    const uint16_t *scales;       /* fp16  [K/G, N] */
    const uint16_t *bias;         /* fp16  [N], or NULL */
};

/* One decoder layer of one rank's shard. */
struct layer_weights {
    const uint16_t *attn_norm;    /* fp16 [hidden] input_layernorm */
    const uint16_t *mlp_norm;     /* fp16 [hidden] post_attention_layernorm */
    const uint16_t *q_norm;       /* fp16 [head_dim], Qwen3 only, else NULL */
    const uint16_t *k_norm;       /* fp16 [head_dim], Qwen3 only, else NULL */
    struct awq_linear qkv;        /* [hidden, (nh + 2*nkv) * head_dim]: q | k | v columns
                                     (this rank's heads); bias q|k|v when qkv_bias */
    struct awq_linear o;          /* [nh * head_dim, hidden]: row-parallel (this rank's rows) */
    struct awq_linear gate_up;    /* [hidden, 2 * inter]: gate | up columns (this rank's) */
    struct awq_linear down;       /* [inter, hidden]: row-parallel */
};

/* The weights of one rank (tp = 1: the whole model). */
struct model_weights {
    struct model_config cfg;      /* the full model's config */
    int rank, tp;
    int n_heads;                  /* query heads on this rank */
    int n_kv_heads;               /* KV heads on this rank (replicated when tp > kv heads) */
    int kv_head_start;            /* first global KV head on this rank */
    int intermediate;             /* intermediate columns on this rank */
    int vocab_start, vocab_rows;  /* this rank's vocabulary rows [start, start + rows);
                                     tp = 1: [0, vocab). Rows past cfg.vocab (padding
                                     when vocab % tp != 0) are zero. */
    const uint16_t *embed;        /* fp16 [vocab_rows, hidden] */
    const uint16_t *lm_head;      /* fp16 [vocab_rows, hidden]; == embed when tied */
    const uint16_t *final_norm;   /* fp16 [hidden] */
    struct layer_weights *layers; /* [n_layers] */
    void *priv;                   /* owned buffers and mappings; model_weights_free */
};

struct ckpt;

/* Opens a model directory: parses config.json (+ generation_config.json),
 * checks the quantization, maps the safetensors file(s) and validates their
 * headers. Refuses unsupported families / quantizations with a message that
 * says what was found and what is supported. allow_unquantized: accept an
 * fp16/bf16 checkpoint (for `awqd quantize`); otherwise it is refused. */
int ckpt_open(const char *dir, struct ckpt **out, char *err, size_t errlen);
int ckpt_open_ex(const char *dir, int allow_unquantized, struct ckpt **out, char *err,
                 size_t errlen);
const struct model_config *ckpt_config(const struct ckpt *ck);
void ckpt_close(struct ckpt *ck);

/* Loads rank `rank` of `tp` into *w (tp = 1, rank = 0: everything). Checks
 * every tensor's dtype and shape ("model.layers.3.mlp.down_proj.qweight:
 * expected int32 [12288, 512], found int32 [12288, 256]") and that the shapes
 * divide (column-parallel N/tp % 8, row-parallel (K/tp) % group, heads). */
int ckpt_load(struct ckpt *ck, int rank, int tp, struct model_weights *w, char *err,
              size_t errlen);
void model_weights_free(struct model_weights *w);

/* Additions (checkpoint engineer) ------------------------------------------ */

/* Bytes the struct model_weights of (rank, tp) holds, without loading: the
 * per-GPU weight bytes `awqd inspect --tp N` reports. Same divisibility checks
 * and messages as ckpt_load. */
int ckpt_rank_bytes(const struct ckpt *ck, int rank, int tp, uint64_t *bytes, char *err,
                    size_t errlen);
/* The mapped safetensors of the checkpoint (engine/safetensors.h), e.g. for
 * `awqd quantize` reading an unquantized one. Valid until ckpt_close. */
struct safetensors;
const struct safetensors *ckpt_safetensors(const struct ckpt *ck);
/* The directory given to ckpt_open (without a trailing '/'). */
const char *ckpt_dir(const struct ckpt *ck);

/* Dequantizes one AWQ linear into w[K, N] fp32 (the CPU reference's view). */
void awq_dequant(const struct awq_linear *l, float *w);

/* fp16 <-> fp32 conversion (bit patterns), exact, round-to-nearest-even. */
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t b);

#endif
