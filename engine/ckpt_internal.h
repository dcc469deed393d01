/* ckpt_internal.h — shared between engine/ckpt*.c only (not a public API). */
#ifndef AWQD_CKPT_INTERNAL_H
#define AWQD_CKPT_INTERNAL_H

#include "engine/ckpt.h"
#include "engine/safetensors.h"

#include <stddef.h>
#include <stdint.h>

struct ckpt {
    char *dir;                    /* model directory, no trailing '/' */
    struct model_config cfg;
    struct safetensors *st;       /* all tensors of all shards */
    int o_bias;                   /* o_proj has a bias (attention_bias, not Qwen2) */
};

/* The seven projections of a layer, in this order. */
enum { CKPT_Q = 0, CKPT_K, CKPT_V, CKPT_O, CKPT_GATE, CKPT_UP, CKPT_DOWN, CKPT_NPROJ };

/* in_features K and out_features N of projection `proj`. */
void ckpt_linear_shape(const struct model_config *c, int proj, int *k, int *n);
/* "model.layers.3.self_attn.q_proj" */
void ckpt_linear_name(int layer, int proj, char *buf, size_t len);
/* Finds `name` and checks dtype class (want_float: fp16/bf16/fp32, else int32)
 * and shape [d0] (ndim 1) or [d0, d1]. Message names the tensor and file. */
int ckpt_check_tensor(const struct ckpt *ck, const char *name, int want_float, int ndim,
                      int64_t d0, int64_t d1, const struct st_tensor **out, char *err,
                      size_t errlen);

#endif
