/* ckpt.c — see ckpt.h. Opening (config.json, generation_config.json,
 * quantization_config, tensor inventory) and loading (one rank's shard, built
 * by a plan of 2-D block copies run on a few threads). */
#include "engine/ckpt.h"

#include "engine/ckpt_internal.h"
#include "engine/safetensors.h"
#include "engine/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ======================================================================== */
/* fp16 / bf16                                                               */

float fp16_to_f32(uint16_t h) {
    /* exponent/mantissa moved into place and rescaled by 2^112: exact for
     * normal and subnormal halves; inf/NaN get the all-ones exponent */
    uint32_t em = (uint32_t)(h & 0x7fff) << 13, x;
    float f;
    if (em >= 0x0f800000u) {
        x = em | 0x7f800000u;
    } else {
        memcpy(&f, &em, 4);
        f *= 0x1p112f;
        memcpy(&x, &f, 4);
    }
    x |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x1ff); /* NaN */
    if (ax >= 0x477ff000) return sign | 0x7c00;          /* >= 65520 rounds to inf */
    if (ax >= 0x38800000) {                               /* normal half */
        uint32_t v = ax - 0x38000000;
        v += 0xfff + ((v >> 13) & 1);
        return sign | (uint16_t)(v >> 13);
    }
    if (ax < 0x33000000) return sign;                     /* <= 2^-25 rounds to 0 */
    uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    int s = 126 - (int)e;                                 /* 14..24 */
    uint32_t h = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float bf16_to_f32(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ======================================================================== */
/* AWQ                                                                       */

static const int k_awq_order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

void awq_dequant(const struct awq_linear *l, float *w) {
    int n8 = l->n / 8;
    for (int k = 0; k < l->k; k++) {
        const uint32_t *qrow = l->qweight + (size_t)k * n8;
        const uint32_t *zrow = l->qzeros + (size_t)(k / l->group) * n8;
        const uint16_t *srow = l->scales + (size_t)(k / l->group) * l->n;
        float *out = w + (size_t)k * l->n;
        for (int c = 0; c < n8; c++) {
            uint32_t q = qrow[c], z = zrow[c];
            for (int j = 0; j < 8; j++) {
                int sh = 4 * k_awq_order[j];
                int qi = (int)((q >> sh) & 0xf), zi = (int)((z >> sh) & 0xf);
                out[8 * c + j] = (float)(qi - zi) * fp16_to_f32(srow[8 * c + j]);
            }
        }
    }
}

/* ======================================================================== */
/* config.json                                                               */

/* A JSON number as an int without undefined behaviour: NaN -> -1, clamped. */
static int dbl_int(double d) {
    if (!(d == d)) return -1;
    if (d >= 2147483647.0) return 2147483647;
    if (d <= -2147483648.0) return -2147483647 - 1;
    return (int)d;
}

static const cJSON *jget(const cJSON *o, const char *k) {
    return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

/* Integer field: missing/null -> def (or an error when required). */
static int jint(const cJSON *o, const char *key, int def, int required, int *out, char *err,
                size_t errlen) {
    const cJSON *j = jget(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (required)
            return util_err(err, errlen, -EINVAL, "config.json: missing \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= -1 && j->valuedouble <= (double)(1 << 30)) ||
        j->valuedouble != (double)(int)j->valuedouble)
        return util_err(err, errlen, -EINVAL, "config.json: \"%s\" is not an integer in range",
                        key);
    *out = (int)j->valuedouble;
    return 0;
}

static double jnum(const cJSON *o, const char *key, double def) {
    const cJSON *j = jget(o, key);
    return cJSON_IsNumber(j) ? j->valuedouble : def;
}

static int jbool(const cJSON *o, const char *key, int def) {
    const cJSON *j = jget(o, key);
    if (cJSON_IsBool(j)) return cJSON_IsTrue(j);
    if (cJSON_IsNumber(j)) return j->valuedouble != 0;
    return def;
}

/* eos_token_id: an int or a list of ints. Returns 1 when present. */
static int parse_ids(const cJSON *j, int *ids, int *n, int max) {
    if (cJSON_IsNumber(j)) {
        ids[0] = dbl_int(j->valuedouble);
        *n = 1;
        return 1;
    }
    if (cJSON_IsArray(j)) {
        int k = 0;
        for (const cJSON *x = j->child; x && k < max; x = x->next)
            if (cJSON_IsNumber(x)) ids[k++] = dbl_int(x->valuedouble);
        *n = k;
        return k > 0;
    }
    return 0;
}

static int parse_rope(const cJSON *root, struct rope_config *r, char *err, size_t errlen) {
    const cJSON *rp = jget(root, "rope_parameters");
    const cJSON *rs = jget(root, "rope_scaling");
    memset(r, 0, sizeof *r);
    r->theta = 10000.0;
    if (cJSON_IsObject(rp)) r->theta = jnum(rp, "rope_theta", r->theta);
    r->theta = jnum(root, "rope_theta", r->theta);
    if (!(r->theta > 0))
        return util_err(err, errlen, -EINVAL, "config.json: rope_theta must be positive");
    const cJSON *sc = cJSON_IsObject(rs) ? rs : (cJSON_IsObject(rp) ? rp : NULL);
    if (!sc) return 0;
    const cJSON *ty = jget(sc, "rope_type");
    if (!cJSON_IsString(ty)) ty = jget(sc, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "default";
    if (strcmp(t, "default") == 0) return 0;
    if (strcmp(t, "llama3") == 0) {
        r->type = ROPE_LLAMA3;
        r->factor = jnum(sc, "factor", 8.0);
        r->low_freq_factor = jnum(sc, "low_freq_factor", 1.0);
        r->high_freq_factor = jnum(sc, "high_freq_factor", 4.0);
        r->original_max_position = dbl_int(jnum(sc, "original_max_position_embeddings", 8192));
        if (!(r->factor > 0) || !(r->low_freq_factor > 0) ||
            !(r->high_freq_factor > r->low_freq_factor) || r->original_max_position <= 0)
            return util_err(err, errlen, -EINVAL,
                            "config.json: llama3 rope scaling needs factor > 0, "
                            "high_freq_factor > low_freq_factor > 0 and "
                            "original_max_position_embeddings > 0");
        return 0;
    }
    return util_err(err, errlen, -EINVAL,
                    "config.json: rope scaling type \"%.40s\" is not supported "
                    "(supported: default, llama3)", t);
}

static int parse_quant(const cJSON *root, struct ckpt *ck, int allow_unquantized, char *err,
                       size_t errlen) {
    struct model_config *c = &ck->cfg;
    const cJSON *q = jget(root, "quantization_config");
    if (!q || cJSON_IsNull(q)) {
        if (!allow_unquantized)
            return util_err(err, errlen, -ENOTSUP,
                            "config.json has no quantization_config: this is an unquantized "
                            "(fp16/bf16) checkpoint; awqd serves AWQ int4 (quant_method awq, "
                            "version gemm) — convert it with `awqd quantize IN OUT`");
        c->quantized = 0;
        c->bits = 16;
        c->group_size = 0;
        c->zero_point = 0;
        return 0;
    }
    if (!cJSON_IsObject(q))
        return util_err(err, errlen, -EINVAL, "config.json: quantization_config is not an object");
    const cJSON *m = jget(q, "quant_method");
    const char *method = cJSON_IsString(m) ? m->valuestring : "(none)";
    if (strcasecmp(method, "awq") != 0)
        return util_err(err, errlen, -ENOTSUP,
                        "unsupported quantization: quant_method \"%.40s\"; supported: awq "
                        "(version gemm, 4 bits, zero point)", method);
    const cJSON *v = jget(q, "version");
    const char *ver = cJSON_IsString(v) ? v->valuestring : "gemm";
    if (strcasecmp(ver, "gemm") != 0)
        return util_err(err, errlen, -ENOTSUP,
                        "unsupported AWQ version \"%.40s\" (its packing differs); supported: "
                        "awq version gemm", ver);
    int bits = -1, group = -2; /* jint sets them; initialised for -O3's flow analysis */
    int rc = jint(q, "bits", -1, 0, &bits, err, errlen);
    if (!rc && bits < 0) rc = jint(q, "w_bit", 4, 0, &bits, err, errlen);
    if (rc) return rc;
    rc = jint(q, "group_size", -2, 0, &group, err, errlen);
    if (!rc && group == -2) rc = jint(q, "q_group_size", 128, 0, &group, err, errlen);
    if (rc) return rc;
    if (bits != 4)
        return util_err(err, errlen, -ENOTSUP,
                        "unsupported AWQ bits %d; supported: 4", bits);
    if (group <= 0 || group % 8 != 0 || group > 4096)
        return util_err(err, errlen, -ENOTSUP,
                        "unsupported AWQ group_size %d (group_size -1 / per-channel is not "
                        "supported); supported: a positive multiple of 8, typically 128", group);
    int zp = jbool(q, "zero_point", 1);
    if (!zp)
        return util_err(err, errlen, -ENOTSUP,
                        "unsupported AWQ zero_point false; supported: zero_point true");
    const cJSON *mn = jget(q, "modules_to_not_convert");
    if (cJSON_IsArray(mn)) {
        static const char *lin[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                    "gate_proj", "up_proj", "down_proj", "self_attn", "mlp",
                                    "layers"};
        for (const cJSON *x = mn->child; x; x = x->next) {
            if (!cJSON_IsString(x)) continue;
            for (size_t i = 0; i < sizeof lin / sizeof *lin; i++)
                if (strstr(lin[i], x->valuestring) || strstr(x->valuestring, lin[i]))
                    return util_err(err, errlen, -ENOTSUP,
                                    "quantization_config.modules_to_not_convert lists \"%.60s\", "
                                    "which leaves decoder projections in fp16; awqd needs every "
                                    "q/k/v/o/gate/up/down projection in AWQ int4",
                                    x->valuestring);
        }
    }
    c->quantized = 1;
    c->bits = bits;
    c->group_size = group;
    c->zero_point = 1;
    return 0;
}

static int parse_config(struct ckpt *ck, int allow_unquantized, char *err, size_t errlen) {
    struct model_config *c = &ck->cfg;
    char path[4096];
    char *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", ck->dir);
    int rc = util_read_file(path, 16u << 20, &text, &len, err, errlen);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return util_err(err, errlen, -EINVAL, "%s: not a JSON object", path);
    }
    memset(c, 0, sizeof *c);

    /* family */
    const cJSON *mt = jget(root, "model_type");
    const cJSON *ar = jget(root, "architectures");
    const char *arch = (cJSON_IsArray(ar) && cJSON_IsString(ar->child)) ? ar->child->valuestring : "";
    const char *mts = cJSON_IsString(mt) ? mt->valuestring : "";
    if (!strcmp(mts, "qwen3") || (!*mts && !strcmp(arch, "Qwen3ForCausalLM")))
        c->family = FAMILY_QWEN3, snprintf(c->model_type, sizeof c->model_type, "qwen3");
    else if (!strcmp(mts, "qwen2") || (!*mts && !strcmp(arch, "Qwen2ForCausalLM")))
        c->family = FAMILY_QWEN2, snprintf(c->model_type, sizeof c->model_type, "qwen2");
    else if (!strcmp(mts, "llama") || (!*mts && !strcmp(arch, "LlamaForCausalLM")))
        c->family = FAMILY_LLAMA, snprintf(c->model_type, sizeof c->model_type, "llama");
    else if (!strcmp(mts, "mistral") || (!*mts && !strcmp(arch, "MistralForCausalLM")))
        c->family = FAMILY_LLAMA, snprintf(c->model_type, sizeof c->model_type, "mistral");
    else {
        rc = util_err(err, errlen, -ENOTSUP,
                      "unsupported model: model_type \"%.40s\", architectures \"%.60s\"; "
                      "supported: qwen3, qwen2 (Qwen2/Qwen2.5), llama (Llama/Llama-3), mistral",
                      *mts ? mts : "(none)", *arch ? arch : "(none)");
        goto out;
    }

    if ((rc = jint(root, "hidden_size", 0, 1, &c->hidden, err, errlen)) ||
        (rc = jint(root, "intermediate_size", 0, 1, &c->intermediate, err, errlen)) ||
        (rc = jint(root, "num_hidden_layers", 0, 1, &c->n_layers, err, errlen)) ||
        (rc = jint(root, "num_attention_heads", 0, 1, &c->n_heads, err, errlen)) ||
        (rc = jint(root, "num_key_value_heads", c->n_heads, 0, &c->n_kv_heads, err, errlen)) ||
        (rc = jint(root, "vocab_size", 0, 1, &c->vocab, err, errlen)) ||
        (rc = jint(root, "max_position_embeddings", 4096, 0, &c->max_position, err, errlen)))
        goto out;
    if (c->hidden <= 0 || c->intermediate <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
        c->n_kv_heads <= 0 || c->vocab <= 0 || c->max_position <= 0 || c->n_layers > 4096) {
        rc = util_err(err, errlen, -EINVAL,
                      "config.json: sizes must be positive (hidden_size %d, intermediate_size "
                      "%d, num_hidden_layers %d, num_attention_heads %d, num_key_value_heads "
                      "%d, vocab_size %d, max_position_embeddings %d)", c->hidden,
                      c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab,
                      c->max_position);
        goto out;
    }
    const cJSON *hd = jget(root, "head_dim");
    if (hd && !cJSON_IsNull(hd)) {
        if ((rc = jint(root, "head_dim", 0, 1, &c->head_dim, err, errlen))) goto out;
    } else {
        if (c->hidden % c->n_heads) {
            rc = util_err(err, errlen, -EINVAL,
                          "config.json: hidden_size %d is not divisible by num_attention_heads %d"
                          " and no head_dim is given", c->hidden, c->n_heads);
            goto out;
        }
        c->head_dim = c->hidden / c->n_heads;
    }
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > 1024) {
        rc = util_err(err, errlen, -EINVAL, "config.json: head_dim %d must be even, 2..1024",
                      c->head_dim);
        goto out;
    }
    if (c->n_heads % c->n_kv_heads) {
        rc = util_err(err, errlen, -EINVAL,
                      "config.json: num_attention_heads %d is not a multiple of "
                      "num_key_value_heads %d", c->n_heads, c->n_kv_heads);
        goto out;
    }
    if ((int64_t)c->n_heads * c->head_dim > (1 << 20)) {
        rc = util_err(err, errlen, -EINVAL, "config.json: heads x head_dim too large");
        goto out;
    }
    c->rms_eps = jnum(root, "rms_norm_eps", 1e-6);
    if (!(c->rms_eps > 0) || c->rms_eps > 1) {
        rc = util_err(err, errlen, -EINVAL, "config.json: rms_norm_eps must be in (0, 1]");
        goto out;
    }
    c->tie_embeddings = jbool(root, "tie_word_embeddings", 0);
    int attn_bias = jbool(root, "attention_bias", 0);
    c->qkv_bias = c->family == FAMILY_QWEN2 ? 1 : attn_bias;
    ck->o_bias = c->family == FAMILY_QWEN2 ? 0 : attn_bias;
    c->qk_norm = c->family == FAMILY_QWEN3;
    if (jbool(root, "mlp_bias", 0)) {
        rc = util_err(err, errlen, -ENOTSUP, "config.json: mlp_bias true is not supported");
        goto out;
    }
    /* sliding-window attention is not implemented: refuse configs that use it */
    {
        const cJSON *sw = jget(root, "sliding_window");
        int use_sw = c->family == FAMILY_LLAMA ? 1 : jbool(root, "use_sliding_window", 0);
        if (use_sw && cJSON_IsNumber(sw) && sw->valuedouble > 0 &&
            sw->valuedouble < c->max_position) {
            rc = util_err(err, errlen, -ENOTSUP,
                          "config.json: sliding-window attention (sliding_window %d < "
                          "max_position_embeddings %d) is not supported",
                          dbl_int(sw->valuedouble), c->max_position);
            goto out;
        }
    }
    if ((rc = parse_rope(root, &c->rope, err, errlen))) goto out;
    if ((rc = parse_quant(root, ck, allow_unquantized, err, errlen))) goto out;

    c->bos_id = -1;
    c->n_eos = 0;
    const cJSON *b = jget(root, "bos_token_id");
    if (cJSON_IsNumber(b)) c->bos_id = dbl_int(b->valuedouble);
    parse_ids(jget(root, "eos_token_id"), c->eos_ids, &c->n_eos, CKPT_MAX_EOS);
    /* generation_config.json overrides */
    snprintf(path, sizeof path, "%s/generation_config.json", ck->dir);
    if (access(path, R_OK) == 0) {
        char e2[256];
        if (util_read_file(path, 1u << 20, &text, &len, e2, sizeof e2) == 0) {
            cJSON *g = cJSON_ParseWithLength(text, len);
            free(text);
            if (cJSON_IsObject(g)) {
                int ids[CKPT_MAX_EOS], n = 0;
                if (parse_ids(jget(g, "eos_token_id"), ids, &n, CKPT_MAX_EOS)) {
                    memcpy(c->eos_ids, ids, sizeof ids);
                    c->n_eos = n;
                }
                const cJSON *gb = jget(g, "bos_token_id");
                if (cJSON_IsNumber(gb)) c->bos_id = dbl_int(gb->valuedouble);
            } else {
                log_warn("%s: not a JSON object, ignored", path);
            }
            cJSON_Delete(g);
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* ======================================================================== */
/* tensor inventory                                                          */

static const char *const k_attn_proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
static const char *const k_mlp_proj[3] = {"gate_proj", "up_proj", "down_proj"};

void ckpt_linear_shape(const struct model_config *c, int proj, int *k, int *n) {
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    switch (proj) {
    case CKPT_Q: *k = c->hidden; *n = q; break;
    case CKPT_K:
    case CKPT_V: *k = c->hidden; *n = kv; break;
    case CKPT_O: *k = q; *n = c->hidden; break;
    case CKPT_GATE:
    case CKPT_UP: *k = c->hidden; *n = c->intermediate; break;
    default: *k = c->intermediate; *n = c->hidden; break;
    }
}

void ckpt_linear_name(int layer, int proj, char *buf, size_t len) {
    if (proj <= CKPT_O)
        snprintf(buf, len, "model.layers.%d.self_attn.%s", layer, k_attn_proj[proj]);
    else
        snprintf(buf, len, "model.layers.%d.mlp.%s", layer, k_mlp_proj[proj - CKPT_GATE]);
}

/* Checks that `name` exists with the given shape; want_float: fp16 expected
 * (bf16 / fp32 accepted and converted), else int32. */
int ckpt_check_tensor(const struct ckpt *ck, const char *name, int want_float, int ndim,
                      int64_t d0, int64_t d1, const struct st_tensor **out, char *err,
                      size_t errlen) {
    const struct st_tensor *t = safetensors_find(ck->st, name);
    int64_t shape[2] = {d0, d1};
    char want[128], got[128];
    st_format_type(want_float ? ST_F16 : ST_I32, ndim, shape, want, sizeof want);
    if (!t)
        return util_err(err, errlen, -ENOENT, "%s: missing tensor %s (expected %s)", ck->dir, name,
                        want);
    int dt_ok = want_float ? (t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F32)
                           : t->dtype == ST_I32;
    int sh_ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (!dt_ok || !sh_ok)
        return util_err(err, errlen, -EINVAL, "%s: expected %s, found %s (in %s)", name, want,
                        st_format_type(t->dtype, t->ndim, t->shape, got, sizeof got),
                        safetensors_file_of(ck->st, t));
    if (out) *out = t;
    return 0;
}

static int check_inventory(struct ckpt *ck, char *err, size_t errlen) {
    const struct model_config *c = &ck->cfg;
    char nm[256], base[200];
    int rc;
    int G = c->group_size;
    if ((rc = ckpt_check_tensor(ck, "model.embed_tokens.weight", 1, 2, c->vocab, c->hidden, NULL,
                                err, errlen)))
        return rc;
    if (!c->tie_embeddings &&
        (rc = ckpt_check_tensor(ck, "lm_head.weight", 1, 2, c->vocab, c->hidden, NULL, err,
                                errlen)))
        return rc;
    if ((rc = ckpt_check_tensor(ck, "model.norm.weight", 1, 1, c->hidden, 0, NULL, err, errlen)))
        return rc;
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        if ((rc = ckpt_check_tensor(ck, nm, 1, 1, c->hidden, 0, NULL, err, errlen))) return rc;
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        if ((rc = ckpt_check_tensor(ck, nm, 1, 1, c->hidden, 0, NULL, err, errlen))) return rc;
        if (c->qk_norm) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
            if ((rc = ckpt_check_tensor(ck, nm, 1, 1, c->head_dim, 0, NULL, err, errlen)))
                return rc;
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            if ((rc = ckpt_check_tensor(ck, nm, 1, 1, c->head_dim, 0, NULL, err, errlen)))
                return rc;
        }
        for (int p = 0; p < CKPT_NPROJ; p++) {
            int K, N;
            ckpt_linear_shape(c, p, &K, &N);
            ckpt_linear_name(l, p, base, sizeof base);
            if (c->quantized) {
                if (K % G || N % 8)
                    return util_err(err, errlen, -EINVAL,
                                    "%s: shape [%d, %d] does not fit AWQ: in_features must be a "
                                    "multiple of group_size %d and out_features of 8",
                                    base, K, N, G);
                snprintf(nm, sizeof nm, "%s.qweight", base);
                if ((rc = ckpt_check_tensor(ck, nm, 0, 2, K, N / 8, NULL, err, errlen))) return rc;
                snprintf(nm, sizeof nm, "%s.qzeros", base);
                if ((rc = ckpt_check_tensor(ck, nm, 0, 2, K / G, N / 8, NULL, err, errlen)))
                    return rc;
                snprintf(nm, sizeof nm, "%s.scales", base);
                if ((rc = ckpt_check_tensor(ck, nm, 1, 2, K / G, N, NULL, err, errlen)))
                    return rc;
            } else {
                snprintf(nm, sizeof nm, "%s.weight", base);
                if ((rc = ckpt_check_tensor(ck, nm, 1, 2, N, K, NULL, err, errlen))) return rc;
            }
            int has_bias = (p <= CKPT_V && c->qkv_bias) || (p == CKPT_O && ck->o_bias);
            if (has_bias) {
                snprintf(nm, sizeof nm, "%s.bias", base);
                if ((rc = ckpt_check_tensor(ck, nm, 1, 1, N, 0, NULL, err, errlen))) return rc;
            }
        }
    }
    return 0;
}

/* ======================================================================== */
/* open / close                                                              */

int ckpt_open_ex(const char *dir, int allow_unquantized, struct ckpt **out, char *err,
                 size_t errlen) {
    *out = NULL;
    if (!dir || !*dir) return util_err(err, errlen, -EINVAL, "no model directory given");
    struct ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) return util_err(err, errlen, -ENOMEM, "out of memory");
    ck->dir = strdup(dir);
    if (!ck->dir) { free(ck); return util_err(err, errlen, -ENOMEM, "out of memory"); }
    size_t dl = strlen(ck->dir);
    while (dl > 1 && ck->dir[dl - 1] == '/') ck->dir[--dl] = 0;
    int rc;
    struct stat sb;
    if (stat(ck->dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        /* a file, not a directory: say what it is */
        unsigned char magic[4] = {0};
        FILE *f = fopen(ck->dir, "rb");
        size_t got = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if (got == 4 && magic[0] == 0x38 && magic[1] == 0x34 && magic[2] == 0x6b && magic[3] == 0x61)
            rc = util_err(err, errlen, -ENOTSUP,
                          "%s is the seed's ak48 export; convert it into a model directory with "
                          "`awqd quantize --from-ak48 %s OUTDIR`", ck->dir, ck->dir);
        else
            rc = util_err(err, errlen, -ENOTDIR,
                          "%s is a file; a model is a directory with config.json and safetensors",
                          ck->dir);
        goto fail;
    }
    rc = parse_config(ck, allow_unquantized, err, errlen);
    if (rc) goto fail;
    rc = safetensors_open_dir(ck->dir, &ck->st, err, errlen);
    if (rc) goto fail;
    rc = check_inventory(ck, err, errlen);
    if (rc) goto fail;
    *out = ck;
    return 0;
fail:
    ckpt_close(ck);
    return rc;
}

int ckpt_open(const char *dir, struct ckpt **out, char *err, size_t errlen) {
    return ckpt_open_ex(dir, 0, out, err, errlen);
}

const struct model_config *ckpt_config(const struct ckpt *ck) { return &ck->cfg; }
const struct safetensors *ckpt_safetensors(const struct ckpt *ck) { return ck->st; }
const char *ckpt_dir(const struct ckpt *ck) { return ck->dir; }

void ckpt_close(struct ckpt *ck) {
    if (!ck) return;
    safetensors_close(ck->st);
    free(ck->dir);
    free(ck);
}
