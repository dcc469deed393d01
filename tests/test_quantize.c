/* test_quantize.c — `awqd quantize`: an fp16 checkpoint quantizes to exactly
 * the AWQ checkpoint mkmodel writes from the same weights; bf16 input works;
 * bad inputs fail with a message; the seed's ak48 file converts losslessly. */
#include "tests/harness/test.h"

#include "engine/ckpt.h"
#include "engine/mkmodel.h"
#include "engine/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

static void spec(struct mkmodel_spec *s) {
    mkmodel_preset("tiny", s);
    snprintf(s->name, sizeof s->name, "test-q");
    s->vocab = 512;
    s->hidden = 256;
    s->intermediate = 512;
    s->n_layers = 2;
    s->tie_embeddings = 0;
    s->shard_bytes = 0;
}

static const char *mk(const struct mkmodel_spec *s, const char *name, uint64_t seed) {
    static char dir[6][600];
    static int k;
    char *d = dir[k++ % 6], err[512];
    snprintf(d, 600, "%s/%s", test_tmpdir(), name);
    if (mkmodel_write(s, d, seed, 0, NULL, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return NULL;
    }
    return d;
}

static int awqd(const char *args, char **out) {
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_awqd_bin(), args);
    return test_run(cmd, out);
}

/* Every tensor of dir a equals the one of the same name in dir b. */
static void same_tensors(const char *a, const char *b) {
    struct safetensors *x, *y;
    char err[512];
    if (safetensors_open_dir(a, &x, err, sizeof err)) { test_fail(__FILE__, __LINE__, "%s", err); return; }
    if (safetensors_open_dir(b, &y, err, sizeof err)) {
        safetensors_close(x);
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    if (x->n_tensors != y->n_tensors)
        test_fail(__FILE__, __LINE__, "%d vs %d tensors", x->n_tensors, y->n_tensors);
    for (int i = 0; i < x->n_tensors && !test_failed(); i++) {
        const struct st_tensor *s = &x->tensors[i], *t = safetensors_find(y, s->name);
        if (!t) { test_fail(__FILE__, __LINE__, "%s missing in %s", s->name, b); break; }
        if (s->dtype != t->dtype || s->nbytes != t->nbytes || memcmp(s->data, t->data, s->nbytes))
            test_fail(__FILE__, __LINE__, "%s differs", s->name);
    }
    safetensors_close(x);
    safetensors_close(y);
}

TEST(quantize, fp16_to_awq_matches_mkmodel) {
    struct mkmodel_spec s;
    spec(&s);
    const char *awq = mk(&s, "awq", 5);
    s.unquantized = 1;
    const char *fp = mk(&s, "fp16", 5);
    ASSERT(awq && fp);
    char args[1500], *out = NULL, outdir[600];
    snprintf(outdir, sizeof outdir, "%s/quantized", test_tmpdir());
    snprintf(args, sizeof args, "quantize %s %s --threads 2", fp, outdir);
    ASSERT_MSG(awqd(args, &out) == 0, "%s", out ? out : "");
    free(out);
    same_tensors(awq, outdir);
    ASSERT_OK_SO_FAR();
    struct ckpt *ck;
    char err[512];
    ASSERT_MSG(ckpt_open(outdir, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->group_size, 128);
    ckpt_close(ck);
    /* already quantized: refused */
    snprintf(args, sizeof args, "quantize %s %s/again", outdir, test_tmpdir());
    ASSERT_EQ_INT(awqd(args, &out), 1);
    ASSERT_CONTAINS(out, "already AWQ-quantized");
    free(out);
    /* a group that does not divide: refused */
    snprintf(args, sizeof args, "quantize %s %s/g --group 96", fp, test_tmpdir());
    ASSERT_EQ_INT(awqd(args, &out), 1);
    ASSERT_CONTAINS(out, "group 96");
    free(out);
    snprintf(args, sizeof args, "quantize /nonexistent/in %s/x", test_tmpdir());
    ASSERT_EQ_INT(awqd(args, &out), 1);
    ASSERT_CONTAINS(out, "/nonexistent/in/config.json");
    free(out);
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

TEST(quantize, bf16_input) {
    struct mkmodel_spec s;
    spec(&s);
    s.unquantized = 1;
    const char *fp = mk(&s, "fp16b", 9);
    ASSERT(fp);
    /* rewrite every fp16 tensor as bf16 */
    char p[700], err[512];
    snprintf(p, sizeof p, "%s/model.safetensors", fp);
    struct safetensors *st;
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    struct st_desc *d = calloc((size_t)st->n_tensors, sizeof *d);
    void **bufs = calloc((size_t)st->n_tensors, sizeof *bufs);
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        uint16_t *b = malloc(t->nbytes);
        const uint16_t *h = t->data;
        for (int64_t k = 0; k < t->numel; k++) b[k] = to_bf16(fp16_to_f32(h[k]));
        bufs[i] = b;
        d[i] = (struct st_desc){.name = t->name, .dtype = ST_BF16, .ndim = t->ndim, .data = b};
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
    }
    char bdir[600], np[700];
    snprintf(bdir, sizeof bdir, "%s/bf16", test_tmpdir());
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", bdir, fp, bdir);
    ASSERT(test_run(cmd, NULL) == 0);
    snprintf(np, sizeof np, "%s/model.safetensors", bdir);
    int rc = safetensors_write(np, d, st->n_tensors, err, sizeof err);
    for (int i = 0; i < st->n_tensors; i++) free(bufs[i]);
    free(bufs);
    free(d);
    ASSERT_MSG(rc == 0, "%s", err);
    char *out = NULL, args[1500], qdir[600];
    snprintf(qdir, sizeof qdir, "%s/bf16q", test_tmpdir());
    snprintf(args, sizeof args, "quantize %s %s", bdir, qdir);
    ASSERT_MSG(awqd(args, &out) == 0, "%s", out ? out : "");
    free(out);
    struct ckpt *ck;
    ASSERT_MSG(ckpt_open(qdir, &ck, err, sizeof err) == 0, "%s", err);
    struct model_weights w;
    ASSERT_MSG(ckpt_load(ck, 0, 1, &w, err, sizeof err) == 0, "%s", err);
    /* down_proj of layer 1 dequantizes close to the original weights */
    const struct st_tensor *src = safetensors_find(st, "model.layers.1.mlp.down_proj.weight");
    ASSERT(src);
    const struct awq_linear *l = &w.layers[1].down;
    float *dw = malloc((size_t)l->k * l->n * sizeof *dw);
    awq_dequant(l, dw);
    double err2 = 0, ref2 = 0;
    const uint16_t *h = src->data;
    for (int k = 0; k < l->k; k++)
        for (int n = 0; n < l->n; n++) {
            double a = dw[(size_t)k * l->n + n], b = fp16_to_f32(h[(size_t)n * l->k + k]);
            err2 += (a - b) * (a - b);
            ref2 += b * b;
        }
    free(dw);
    ASSERT(sqrt(err2 / ref2) < 0.15); /* 4-bit RTN: ~10% relative error */
    ASSERT(sqrt(err2 / ref2) > 0.01);
    model_weights_free(&w);
    ckpt_close(ck);
    safetensors_close(st);
}

/* ---- ak48 ---------------------------------------------------------------- */

static void put32(FILE *f, int32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

static void put_tensor(FILE *f, const struct safetensors *st, const char *name) {
    const struct st_tensor *t = safetensors_find(st, name);
    if (!t) { test_fail(__FILE__, __LINE__, "no %s", name); return; }
    fwrite(t->data, 1, t->nbytes, f);
}

/* Serialises an HF Qwen3 AWQ checkpoint as the seed's ak48 .bin (section 8.1). */
static void write_ak48(const char *dir, const struct mkmodel_spec *s, const char *path) {
    struct safetensors *st;
    char err[512], nm[256];
    if (safetensors_open_dir(dir, &st, err, sizeof err)) { test_fail(__FILE__, __LINE__, "%s", err); return; }
    FILE *f = fopen(path, "wb");
    unsigned char hdr[256] = {0};
    fwrite(hdr, 1, 256, f);
    fseek(f, 0, SEEK_SET);
    put32(f, 0x616b3438);
    put32(f, 5);
    int32_t v[7] = {s->hidden, s->intermediate, s->n_layers, s->n_heads, s->n_kv_heads, s->vocab,
                    s->max_position};
    for (int i = 0; i < 7; i++) put32(f, v[i]);
    fputc(s->tie_embeddings ? 1 : 0, f);
    put32(f, s->head_dim);
    put32(f, s->group);
    fseek(f, 256, SEEK_SET);
    for (int l = 0; l < s->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        put_tensor(f, st, nm);
    }
    for (int l = 0; l < s->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        put_tensor(f, st, nm);
    }
    put_tensor(f, st, "model.norm.weight");
    put_tensor(f, st, "model.embed_tokens.weight");
    const char *w[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj", "mlp.down_proj", "mlp.up_proj"};
    const char *part[3] = {"qweight", "qzeros", "scales"};
    for (int i = 0; i < 7; i++)
        for (int l = 0; l < s->n_layers; l++)
            for (int p = 0; p < 3; p++) {
                snprintf(nm, sizeof nm, "model.layers.%d.%s.%s", l, w[i], part[p]);
                put_tensor(f, st, nm);
            }
    if (!s->tie_embeddings) put_tensor(f, st, "lm_head.weight");
    for (int l = 0; l < s->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
        put_tensor(f, st, nm);
    }
    for (int l = 0; l < s->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
        put_tensor(f, st, nm);
    }
    fclose(f);
    safetensors_close(st);
}

TEST(quantize, ak48_converts_losslessly) {
    struct mkmodel_spec s;
    spec(&s);
    const char *src = mk(&s, "ak-src", 21);
    ASSERT(src);
    char bin[600], out[600], args[1500], *o = NULL;
    snprintf(bin, sizeof bin, "%s/model.bin", test_tmpdir());
    write_ak48(src, &s, bin);
    ASSERT_OK_SO_FAR();
    snprintf(out, sizeof out, "%s/from-ak48", test_tmpdir());
    snprintf(args, sizeof args, "quantize --from-ak48 %s %s", bin, out);
    ASSERT_MSG(awqd(args, &o) == 0, "%s", o ? o : "");
    free(o);
    same_tensors(src, out);
    ASSERT_OK_SO_FAR();
    struct ckpt *ck;
    char err[512];
    ASSERT_MSG(ckpt_open(out, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->family, FAMILY_QWEN3);
    ASSERT_EQ_INT(ckpt_config(ck)->n_layers, 2);
    ckpt_close(ck);
    /* inspect / the loader point at the converter */
    snprintf(args, sizeof args, "inspect %s", bin);
    ASSERT_EQ_INT(awqd(args, &o), 1);
    ASSERT_CONTAINS(o, "quantize --from-ak48");
    free(o);
    /* truncated and foreign files fail with a message */
    ASSERT(truncate(bin, 300000) == 0);
    snprintf(args, sizeof args, "quantize --from-ak48 %s %s/t", bin, test_tmpdir());
    ASSERT_EQ_INT(awqd(args, &o), 1);
    ASSERT_CONTAINS(o, "truncated");
    free(o);
    FILE *f = fopen(bin, "r+b");
    ASSERT(f);
    fputc('X', f);
    fclose(f);
    ASSERT_EQ_INT(awqd(args, &o), 1);
    ASSERT_CONTAINS(o, "is not ak48");
    free(o);
    ASSERT(truncate(bin, 10) == 0);
    ASSERT_EQ_INT(awqd(args, &o), 1);
    ASSERT_CONTAINS(o, "256-byte header");
    free(o);
}
