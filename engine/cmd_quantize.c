/* cmd_quantize.c — `awqd quantize IN OUT [--group N] [--threads N]`:
 * round-to-nearest AWQ quantization (zero point per group, AutoAWQ's
 * pseudo_quantize_tensor, engine/awq_pack.h) of an fp16/bf16/fp32 Hugging Face
 * checkpoint of a supported family, written in the AWQ gemm format.
 *
 * `awqd quantize --from-ak48 FILE.bin OUT [--tokenizer DIR]` converts the
 * seed's single-file "ak48" export (Qwen3, already AWQ int4) into the same HF
 * layout, so everything else only ever reads HF checkpoints.
 *
 * Output: config.json (+ quantization_config), tokenizer / generation files
 * copied, model.safetensors or 4 GB shards + model.safetensors.index.json.
 * Work is split into AWQ groups / row blocks run on a few threads. */
#include "engine/awq_pack.h"
#include "engine/ckpt.h"
#include "engine/mkmodel.h"
#include "engine/safetensors.h"
#include "engine/shard_writer.h"
#include "engine/util.h"
#include "server/cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_BYTES 4000000000ull

/* ======================================================================== */
/* output plan                                                               */

enum okind {
    OUT_COPY,      /* src (src_dtype, numel elements) -> d.dtype (fp16 or the same int) */
    OUT_QWEIGHT,   /* quantize w [n, k] (w_dtype) into this qweight and its qz / sc */
    OUT_QAUX,      /* qzeros / scales: written by their qweight's units */
};

struct otensor {
    struct st_desc d;             /* output name (owned), dtype, shape */
    enum okind kind;
    const void *src;              /* OUT_COPY / OUT_QWEIGHT: source data */
    enum st_dtype src_dtype;
    int k, n, qz, sc;             /* OUT_QWEIGHT */
};

struct oplan {
    struct otensor *t;
    int n, cap;
};

static int oadd(struct oplan *p, const char *name, enum st_dtype dt, int ndim, int64_t d0,
                int64_t d1, enum okind kind, const void *src, enum st_dtype sdt) {
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 256;
        struct otensor *nt = realloc(p->t, (size_t)nc * sizeof *nt);
        if (!nt) return -1;
        p->t = nt;
        p->cap = nc;
    }
    struct otensor *o = &p->t[p->n];
    memset(o, 0, sizeof *o);
    o->d.name = strdup(name);
    if (!o->d.name) return -1;
    o->d.dtype = dt;
    o->d.ndim = ndim;
    o->d.shape[0] = d0;
    o->d.shape[1] = d1;
    o->kind = kind;
    o->src = src;
    o->src_dtype = sdt;
    return p->n++;
}

static void oplan_free(struct oplan *p) {
    for (int i = 0; i < p->n; i++) free((char *)p->t[i].d.name);
    free(p->t);
    memset(p, 0, sizeof *p);
}

/* ======================================================================== */
/* running the plan (engine/shard_writer.h does the files and the threads)   */

struct qctx {
    const struct oplan *p;
    int group;
};

static uint16_t to_fp16(const void *src, enum st_dtype dt, size_t i) {
    if (dt == ST_F16) {
        uint16_t v;
        memcpy(&v, (const char *)src + 2 * i, 2);
        return v;
    }
    if (dt == ST_BF16) {
        uint16_t v;
        memcpy(&v, (const char *)src + 2 * i, 2);
        return f32_to_fp16(bf16_to_f32(v));
    }
    float f;
    memcpy(&f, (const char *)src + 4 * i, 4);
    return f32_to_fp16(f);
}

static int run_qunit(void *ctx, struct shard_writer *w, const struct sw_unit *u) {
    const struct qctx *c = ctx;
    const struct otensor *o = &c->p->t[u->t];
    if (o->kind == OUT_COPY) {
        size_t esz = st_dtype_size(o->d.dtype);
        size_t cnt = (size_t)(u->b - u->a);
        if (o->d.dtype != ST_F16 || o->src_dtype == ST_F16)
            return sw_put(w, u->t, (size_t)u->a * esz, (const char *)o->src + (size_t)u->a * esz,
                          cnt * esz);
        uint16_t *buf = malloc(cnt * 2);
        if (!buf) return -ENOMEM;
        for (size_t i = 0; i < cnt; i++) buf[i] = to_fp16(o->src, o->src_dtype, (size_t)u->a + i);
        int rc = sw_put(w, u->t, (size_t)u->a * 2, buf, cnt * 2);
        free(buf);
        return rc;
    }
    /* OUT_QWEIGHT: group u->a of W [K, N] = weight^T, weight [N, K] */
    int G = c->group, K = o->k, N = o->n;
    int64_t g = u->a, k0 = g * G;
    float *wf = malloc((size_t)G * N * 4);     /* fp32 (fp16-exact) [N, G]: rows of weight */
    if (!wf) return -ENOMEM;
    for (int n = 0; n < N; n++)
        for (int r = 0; r < G; r++)
            wf[(size_t)n * G + r] =
                fp16_to_f32(to_fp16(o->src, o->src_dtype, (size_t)n * K + (size_t)(k0 + r)));
    int rc = sw_put_awq_group(w, u->t, o->qz, o->sc, g, G, N, wf);
    free(wf);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text, char *err,
                      size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return util_write_file(path, text, strlen(text), 1, err, errlen);
}

/* Writes the planned tensors into outdir (shards + index) with `threads`. */
static int write_plan(struct oplan *p, const char *outdir, int group, int threads, char *err,
                      size_t errlen) {
    struct st_desc *sd = calloc((size_t)p->n + 1, sizeof *sd);
    int *shard = calloc((size_t)p->n + 1, sizeof *shard);
    struct shard_writer *w = NULL;
    int rc = 0;
    if (!sd || !shard) { rc = util_err(err, errlen, -ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < p->n; i++) sd[i] = p->t[i].d;
    int n_shards = sw_plan_shards(sd, p->n, SHARD_BYTES, shard, NULL);
    if ((rc = sw_open(outdir, sd, p->n, shard, n_shards, &w, err, errlen))) goto out;
    /* units: one AWQ group of a quantized weight, or 1M elements of a copy */
    for (int i = 0; i < p->n && !rc; i++) {
        const struct otensor *o = &p->t[i];
        int64_t rows = 1, step = 1 << 20;
        if (o->kind == OUT_QAUX) continue;
        if (o->kind == OUT_QWEIGHT) {
            rows = o->k / group;
            step = 1;
        } else {
            for (int d = 0; d < o->d.ndim; d++) rows *= o->d.shape[d];
        }
        for (int64_t a = 0; a < rows && !rc; a += step)
            if (sw_add_unit(w, (struct sw_unit){i, 0, a, a + step < rows ? a + step : rows}))
                rc = util_err(err, errlen, -ENOMEM, "out of memory");
    }
    struct qctx c = {.p = p, .group = group};
    if (!rc) rc = sw_run(w, threads, run_qunit, &c, "quantize", err, errlen);
out:
    rc = sw_close(w, rc, err, errlen);
    free(sd);
    free(shard);
    return rc;
}

static int mkdir_out(const char *dir, char *err, size_t errlen) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return util_err(err, errlen, -errno, "%s: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return util_err(err, errlen, -ENOTDIR, "%s: not a directory", dir);
    return 0;
}

static void copy_if_exists(const char *in, const char *out, const char *name) {
    char src[4096], dst[4096], e[256], *buf;
    size_t len;
    snprintf(src, sizeof src, "%s/%s", in, name);
    if (access(src, R_OK)) return;
    if (util_read_file(src, 0, &buf, &len, e, sizeof e)) return;
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    if (util_write_file(dst, buf, len, 0, e, sizeof e)) log_warn("%s", e);
    free(buf);
}

static cJSON *quant_config(int group) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "bits", 4);
    cJSON_AddNumberToObject(q, "group_size", group);
    cJSON_AddNullToObject(q, "modules_to_not_convert");
    cJSON_AddStringToObject(q, "quant_method", "awq");
    cJSON_AddStringToObject(q, "version", "gemm");
    cJSON_AddBoolToObject(q, "zero_point", 1);
    return q;
}

/* ======================================================================== */
/* HF fp16/bf16 -> AWQ                                                       */

static const char *const k_proj_names[7] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

/* Is `name` "model.layers.<i>.<proj>.weight" of one of the seven projections? */
static int is_linear_weight(const char *name) {
    int layer, off = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &off) != 1 || off == 0) return 0;
    const char *rest = name + off;
    for (int i = 0; i < 7; i++) {
        size_t l = strlen(k_proj_names[i]);
        if (!strncmp(rest, k_proj_names[i], l) && !strcmp(rest + l, ".weight")) return 1;
    }
    return 0;
}

static int quantize_hf(const char *in, const char *out, int group, int threads, char *err,
                       size_t errlen) {
    struct ckpt *ck;
    int rc = ckpt_open_ex(in, 1, &ck, err, errlen);
    if (rc) return rc;
    const struct model_config *c = ckpt_config(ck);
    const struct safetensors *st = ckpt_safetensors(ck);
    struct oplan p = {0};
    cJSON *cfg = NULL;
    if (c->quantized) {
        rc = util_err(err, errlen, -EINVAL, "%s is already AWQ-quantized", in);
        goto out;
    }
    int q = c->n_heads * c->head_dim;
    if (c->hidden % group || q % group || c->intermediate % group) {
        rc = util_err(err, errlen, -EINVAL,
                      "cannot quantize with group %d: hidden_size %d, heads x head_dim %d and "
                      "intermediate_size %d must be multiples of it", group, c->hidden, q,
                      c->intermediate);
        goto out;
    }
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        int isf = t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F32;
        if (is_linear_weight(t->name)) {
            char base[300], nm[320];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
            int N = (int)t->shape[0], K = (int)t->shape[1];
            if (N % 8) {
                rc = util_err(err, errlen, -EINVAL, "%s: out_features %d not a multiple of 8",
                              t->name, N);
                goto out;
            }
            snprintf(nm, sizeof nm, "%s.qweight", base);
            int iq = oadd(&p, nm, ST_I32, 2, K, N / 8, OUT_QWEIGHT, t->data, t->dtype);
            snprintf(nm, sizeof nm, "%s.qzeros", base);
            int iz = oadd(&p, nm, ST_I32, 2, K / group, N / 8, OUT_QAUX, NULL, ST_I32);
            snprintf(nm, sizeof nm, "%s.scales", base);
            int is = oadd(&p, nm, ST_F16, 2, K / group, N, OUT_QAUX, NULL, ST_F16);
            if (iq < 0 || iz < 0 || is < 0) { rc = util_err(err, errlen, -ENOMEM, "out of memory"); goto out; }
            p.t[iq].k = K;
            p.t[iq].n = N;
            p.t[iq].qz = iz;
            p.t[iq].sc = is;
        } else if (strstr(t->name, "rotary_emb.inv_freq")) {
            continue; /* a buffer some exporters save; recomputed from the config */
        } else {
            if (oadd(&p, t->name, isf ? ST_F16 : t->dtype, t->ndim, t->shape[0],
                     t->ndim > 1 ? t->shape[1] : 0, OUT_COPY, t->data, t->dtype) < 0) {
                rc = util_err(err, errlen, -ENOMEM, "out of memory");
                goto out;
            }
            if (t->ndim > 2) {
                rc = util_err(err, errlen, -EINVAL, "%s: %d-D tensors are not supported", t->name,
                              t->ndim);
                goto out;
            }
        }
    }
    if ((rc = mkdir_out(out, err, errlen))) goto out;
    /* config.json: the input's, plus quantization_config */
    {
        char path[4096], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/config.json", in);
        if ((rc = util_read_file(path, 16u << 20, &text, &len, err, errlen))) goto out;
        cfg = cJSON_ParseWithLength(text, len);
        free(text);
        if (!cfg) { rc = util_err(err, errlen, -EINVAL, "%s: bad JSON", path); goto out; }
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
        cJSON_AddStringToObject(cfg, "torch_dtype", "float16");
        cJSON_AddItemToObject(cfg, "quantization_config", quant_config(group));
        char *t = cJSON_Print(cfg);
        rc = t ? write_text(out, "config.json", t, err, errlen) : -ENOMEM;
        free(t);
        if (rc) goto out;
    }
    static const char *extra[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "vocab.json", "merges.txt",
                                  "tokenizer.model", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) copy_if_exists(in, out, extra[i]);
    rc = write_plan(&p, out, group, threads, err, errlen);
out:
    cJSON_Delete(cfg);
    oplan_free(&p);
    ckpt_close(ck);
    return rc;
}

/* ======================================================================== */
/* ak48 -> HF AWQ                                                            */

#define AK48_MAGIC 0x616b3438u
#define AK48_VERSION 5

static int32_t rd32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static int convert_ak48(const char *in, const char *out, const char *tok_flag, int threads,
                        char *err, size_t errlen) {
    int fd = open(in, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return util_err(err, errlen, -errno, "%s: %s", in, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 256) {
        close(fd);
        return util_err(err, errlen, -EINVAL, "%s: not an ak48 file (shorter than its 256-byte header)", in);
    }
    size_t size = (size_t)sb.st_size;
    const unsigned char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return util_err(err, errlen, -errno, "%s: mmap: %s", in, strerror(errno));
    struct oplan p = {0};
    int rc = 0;
    uint32_t magic = (uint32_t)rd32(m);
    int32_t ver = rd32(m + 4), dim = rd32(m + 8), hid = rd32(m + 12), nl = rd32(m + 16),
            nh = rd32(m + 20), nkv = rd32(m + 24), vocab = rd32(m + 28), seq = rd32(m + 32);
    int shared = m[36];
    int32_t hd = rd32(m + 37), G = rd32(m + 41);
    if (magic != AK48_MAGIC) {
        rc = util_err(err, errlen, -EINVAL, "%s: magic 0x%08x is not ak48 (0x%08x)", in, magic,
                      AK48_MAGIC);
        goto out;
    }
    if (ver != AK48_VERSION) {
        rc = util_err(err, errlen, -ENOTSUP, "%s: ak48 version %d; supported: %d", in, ver,
                      AK48_VERSION);
        goto out;
    }
    if (dim <= 0 || hid <= 0 || nl <= 0 || nh <= 0 || nkv <= 0 || vocab <= 0 || seq <= 0 ||
        hd <= 0 || G <= 0 || dim > (1 << 16) || hid > (1 << 18) || nl > 1024 || nh > 1024 ||
        nkv > nh || nh % nkv || vocab > (1 << 22) || hd > 1024 || G % 8 || shared > 1 ||
        dim % G || hid % G || (nh * hd) % G || (nkv * hd) % 8) {
        rc = util_err(err, errlen, -EINVAL,
                      "%s: implausible ak48 header (dim %d, hidden_dim %d, layers %d, heads %d/%d,"
                      " head_dim %d, vocab %d, group %d)", in, dim, hid, nl, nh, nkv, hd, vocab, G);
        goto out;
    }
    /* walk the layout, checking it fits the file exactly */
    uint64_t off = 256;
    int ok = 1;
#define TAKE(bytes) (off + (uint64_t)(bytes) <= size ? (const void *)(m + (off += (uint64_t)(bytes)) - (uint64_t)(bytes)) : (ok = 0, (const void *)m))
    char nm[256];
    for (int l = 0; l < nl; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        if (oadd(&p, nm, ST_F16, 1, dim, 0, OUT_COPY, TAKE((uint64_t)dim * 2), ST_F16) < 0) goto oom;
    }
    for (int l = 0; l < nl; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        if (oadd(&p, nm, ST_F16, 1, dim, 0, OUT_COPY, TAKE((uint64_t)dim * 2), ST_F16) < 0) goto oom;
    }
    if (oadd(&p, "model.norm.weight", ST_F16, 1, dim, 0, OUT_COPY, TAKE((uint64_t)dim * 2), ST_F16) < 0) goto oom;
    if (oadd(&p, "model.embed_tokens.weight", ST_F16, 2, vocab, dim, OUT_COPY,
             TAKE((uint64_t)vocab * dim * 2), ST_F16) < 0) goto oom;
    /* wq wk wv wo w1(gate) w2(down) w3(up), each all layers */
    static const char *names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                   "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj",
                                   "mlp.up_proj"};
    for (int w = 0; w < 7; w++) {
        int K, N;
        switch (w) {
        case 0: K = dim; N = nh * hd; break;
        case 1: case 2: K = dim; N = nkv * hd; break;
        case 3: K = nh * hd; N = dim; break;
        case 5: K = hid; N = dim; break;
        default: K = dim; N = hid; break;
        }
        for (int l = 0; l < nl; l++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.qweight", l, names[w]);
            if (oadd(&p, nm, ST_I32, 2, K, N / 8, OUT_COPY, TAKE((uint64_t)K * N / 2), ST_I32) < 0) goto oom;
            snprintf(nm, sizeof nm, "model.layers.%d.%s.qzeros", l, names[w]);
            if (oadd(&p, nm, ST_I32, 2, K / G, N / 8, OUT_COPY, TAKE((uint64_t)K / G * N / 2), ST_I32) < 0) goto oom;
            snprintf(nm, sizeof nm, "model.layers.%d.%s.scales", l, names[w]);
            if (oadd(&p, nm, ST_F16, 2, K / G, N, OUT_COPY, TAKE((uint64_t)K / G * N * 2), ST_F16) < 0) goto oom;
        }
    }
    if (!shared &&
        oadd(&p, "lm_head.weight", ST_F16, 2, vocab, dim, OUT_COPY, TAKE((uint64_t)vocab * dim * 2), ST_F16) < 0)
        goto oom;
    for (int l = 0; l < nl; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
        if (oadd(&p, nm, ST_F16, 1, hd, 0, OUT_COPY, TAKE((uint64_t)hd * 2), ST_F16) < 0) goto oom;
    }
    for (int l = 0; l < nl; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
        if (oadd(&p, nm, ST_F16, 1, hd, 0, OUT_COPY, TAKE((uint64_t)hd * 2), ST_F16) < 0) goto oom;
    }
#undef TAKE
    if (!ok || off != size) {
        rc = util_err(err, errlen, -EINVAL,
                      "%s: ak48 file is %zu bytes, its header describes %s%llu bytes — truncated "
                      "or not this layout", in, size, ok ? "" : "more than ", (unsigned long long)off);
        goto out;
    }
    if ((rc = mkdir_out(out, err, errlen))) goto out;
    /* config.json / generation_config.json as Qwen3's (the header has no rope / eps) */
    {
        cJSON *c = cJSON_CreateObject();
        cJSON *a = cJSON_AddArrayToObject(c, "architectures");
        cJSON_AddItemToArray(a, cJSON_CreateString("Qwen3ForCausalLM"));
        cJSON_AddBoolToObject(c, "attention_bias", 0);
        cJSON_AddNumberToObject(c, "bos_token_id", 151643);
        cJSON_AddNumberToObject(c, "eos_token_id", 151645);
        cJSON_AddNumberToObject(c, "head_dim", hd);
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddNumberToObject(c, "hidden_size", dim);
        cJSON_AddNumberToObject(c, "intermediate_size", hid);
        cJSON_AddNumberToObject(c, "max_position_embeddings", seq);
        cJSON_AddStringToObject(c, "model_type", "qwen3");
        cJSON_AddNumberToObject(c, "num_attention_heads", nh);
        cJSON_AddNumberToObject(c, "num_hidden_layers", nl);
        cJSON_AddNumberToObject(c, "num_key_value_heads", nkv);
        cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
        cJSON_AddNumberToObject(c, "rope_theta", 1000000.0);
        cJSON_AddBoolToObject(c, "tie_word_embeddings", shared);
        cJSON_AddStringToObject(c, "torch_dtype", "float16");
        cJSON_AddNumberToObject(c, "vocab_size", vocab);
        cJSON_AddItemToObject(c, "quantization_config", quant_config(G));
        cJSON_AddStringToObject(c, "awqd_converted_from", "ak48");
        char *t = cJSON_Print(c);
        cJSON_Delete(c);
        rc = t ? write_text(out, "config.json", t, err, errlen) : -ENOMEM;
        free(t);
        if (rc) goto out;
        rc = write_text(out, "generation_config.json",
                        "{\"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643]}", err,
                        errlen);
        if (rc) goto out;
    }
    {
        struct mkmodel_spec s;
        mkmodel_preset("qwen3-8b", &s);
        char tdir[4096], e2[1024];
        if (mkmodel_find_tokenizer(&s, tok_flag, tdir, sizeof tdir, e2, sizeof e2) == 0) {
            copy_if_exists(tdir, out, "tokenizer.json");
            copy_if_exists(tdir, out, "tokenizer_config.json");
        } else {
            fprintf(stderr, "awqd quantize: warning: %s\n", e2);
        }
    }
    rc = write_plan(&p, out, G, threads, err, errlen);
    goto out;
oom:
    rc = util_err(err, errlen, -ENOMEM, "out of memory");
out:
    oplan_free(&p);
    munmap((void *)m, size);
    return rc;
}

/* ======================================================================== */

static void usage(FILE *f) {
    fprintf(f,
            "usage: awqd quantize IN OUT [--group N] [--threads N]\n"
            "       awqd quantize --from-ak48 FILE.bin OUT [--tokenizer DIR] [--threads N]\n"
            "\n"
            "Round-to-nearest AWQ quantization (4 bits, zero point per group of N input\n"
            "features, default 128) of an fp16/bf16/fp32 Hugging Face checkpoint of a\n"
            "supported family (qwen3, qwen2, llama, mistral), written in the AWQ gemm format\n"
            "awqd serves: q/k/v/o/gate/up/down of every layer become qweight/qzeros/scales;\n"
            "embeddings, lm_head and norms stay fp16. Tokenizer and generation files are\n"
            "copied. (No activation-aware scale search yet: plain RTN.)\n"
            "\n"
            "--from-ak48 converts the seed's single-file ak48 export (Qwen3 AWQ) into a\n"
            "Hugging Face checkpoint directory instead; the Qwen3 tokenizer is copied when\n"
            "found (see awqd mkmodel --help).\n");
}

int cmd_quantize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *pos[2] = {0}, *tok = NULL;
    int npos = 0, group = 128, threads = 0, ak48 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--group") || !strcmp(a, "--threads") || !strcmp(a, "--tokenizer")) &&
            i + 1 >= argc) {
            fprintf(stderr, "awqd quantize: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--group")) {
            group = atoi(argv[++i]);
            if (group < 8 || group % 8 || group > 4096) {
                fprintf(stderr, "awqd quantize: --group must be a multiple of 8 (e.g. 128)\n");
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--tokenizer")) {
            tok = argv[++i];
        } else if (!strcmp(a, "--from-ak48")) {
            ak48 = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "awqd quantize: unknown option %s\n", a);
            return 2;
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "awqd quantize: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    char err[1024];
    double t0 = util_now_s();
    int rc = ak48 ? convert_ak48(pos[0], pos[1], tok, threads, err, sizeof err)
                  : quantize_hf(pos[0], pos[1], group, threads, err, sizeof err);
    if (rc) {
        fprintf(stderr, "awqd quantize: %s\n", err);
        return 1;
    }
    fprintf(stderr, "awqd quantize: wrote %s in %.1f s\n", pos[1], util_now_s() - t0);
    return 0;
}
