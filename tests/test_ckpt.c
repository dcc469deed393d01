/* test_ckpt.c — checkpoints: the three fixtures load at tp=1 with their
 * config; fused q|k|v and gate|up equal the source projections; shards at
 * tp=2 and tp=4 reassemble to the unsharded tensors; a corpus of broken
 * checkpoints each gives its own message. */
#include "tests/harness/test.h"

#include "engine/ckpt.h"
#include "engine/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* independent reference: dequantize straight from the file's tensors       */

/* AutoAWQ packs column order_map[i] into nibble i. */
static const int k_order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static int nibble_of_col(int j) {
    for (int i = 0; i < 8; i++)
        if (k_order_map[i] == j) return i;
    return -1;
}

/* W[K, N] fp32 of projection `base` from the safetensors directly. */
static float *ref_dequant(const struct safetensors *st, const char *base, int *K, int *N) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.qweight", base);
    const struct st_tensor *q = safetensors_find(st, nm);
    snprintf(nm, sizeof nm, "%s.qzeros", base);
    const struct st_tensor *z = safetensors_find(st, nm);
    snprintf(nm, sizeof nm, "%s.scales", base);
    const struct st_tensor *s = safetensors_find(st, nm);
    if (!q || !z || !s) return NULL;
    int k = (int)q->shape[0], n = (int)q->shape[1] * 8, g = k / (int)z->shape[0];
    float *w = malloc((size_t)k * n * sizeof *w);
    const uint32_t *qd = q->data, *zd = z->data;
    const uint16_t *sd = s->data;
    for (int r = 0; r < k; r++)
        for (int c = 0; c < n; c++) {
            int sh = 4 * nibble_of_col(c % 8);
            int qi = (int)((qd[(size_t)r * (n / 8) + c / 8] >> sh) & 15);
            int zi = (int)((zd[(size_t)(r / g) * (n / 8) + c / 8] >> sh) & 15);
            float sc = s->dtype == ST_F16 ? fp16_to_f32(sd[(size_t)(r / g) * n + c])
                                          : bf16_to_f32(sd[(size_t)(r / g) * n + c]);
            w[(size_t)r * n + c] = (float)(qi - zi) * sc;
        }
    *K = k;
    *N = n;
    return w;
}

static float *dq(const struct awq_linear *l) {
    float *w = malloc((size_t)l->k * l->n * sizeof *w);
    awq_dequant(l, w);
    return w;
}

/* ------------------------------------------------------------------------ */
/* fp16                                                                      */

TEST(ckpt, fp16_conversion_exact) {
    /* every fp16 survives fp16 -> f32 -> fp16 (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        uint16_t back = f32_to_fp16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            ASSERT_MSG((back & 0x7c00) == 0x7c00 && (back & 0x3ff), "NaN %04x -> %04x", h, back);
        } else {
            ASSERT_MSG(back == h, "%04x -> %g -> %04x", h, f, back);
        }
    }
    ASSERT_EQ_INT(f32_to_fp16(1.0f), 0x3c00);
    ASSERT_EQ_INT(f32_to_fp16(65504.0f), 0x7bff);
    ASSERT_EQ_INT(f32_to_fp16(65520.0f), 0x7c00);     /* ties up to inf */
    ASSERT_EQ_INT(f32_to_fp16(65519.0f), 0x7bff);
    ASSERT_EQ_INT(f32_to_fp16(5.9604645e-08f), 0x0001); /* 2^-24 */
    ASSERT_EQ_INT(f32_to_fp16(2.9802322e-08f), 0x0000); /* 2^-25 ties to even 0 */
    ASSERT_EQ_INT(f32_to_fp16(-2.0f), 0xc000);
    /* round to nearest even between two fp16 neighbours: 1 + 2^-11 is a tie */
    ASSERT_EQ_INT(f32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);
    ASSERT_EQ_INT(f32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);
    ASSERT_NEAR(fp16_to_f32(0x3555), 0.33325195, 1e-8);
    ASSERT_NEAR(bf16_to_f32(0x3f80), 1.0, 0);
    ASSERT_NEAR(bf16_to_f32(0xc0a0), -5.0, 0);
}

/* ------------------------------------------------------------------------ */
/* fixtures                                                                  */

static int open_fixture(const char *name, struct ckpt **ck) {
    char err[512];
    const char *dir = test_fixture(name);
    if (access(dir, R_OK)) return 1;
    int rc = ckpt_open(dir, ck, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "ckpt_open %s: %s", dir, err);
    return rc ? -1 : 0;
}

static const char *k_proj[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                "mlp.down_proj"};

/* Checks w (one rank) against the unsharded source tensors. */
static void check_rank(const struct ckpt *ck, const struct model_weights *w) {
    const struct model_config *c = ckpt_config(ck);
    const struct safetensors *st = ckpt_safetensors(ck);
    int hd = c->head_dim, r = w->rank;
    int nh = w->n_heads, nkv = w->n_kv_heads, ks = w->kv_head_start, in = w->intermediate;
    /* GQA: every local query head's KV head is local */
    int group = c->n_heads / c->n_kv_heads;
    for (int i = 0; i < nh; i++) {
        int kvh = (r * nh + i) / group;
        ASSERT_MSG(kvh >= ks && kvh < ks + nkv, "rank %d q head %d needs kv head %d, has [%d,%d)",
                   r, r * nh + i, kvh, ks, ks + nkv);
    }
    /* vocabulary rows */
    const struct st_tensor *emb = safetensors_find(st, "model.embed_tokens.weight");
    ASSERT(emb && emb->dtype == ST_F16);
    for (int v = 0; v < w->vocab_rows; v++) {
        int gv = w->vocab_start + v;
        const uint16_t *row = w->embed + (size_t)v * c->hidden;
        if (gv < c->vocab) {
            ASSERT_MSG(memcmp(row, (const uint16_t *)emb->data + (size_t)gv * c->hidden,
                              (size_t)c->hidden * 2) == 0, "embed row %d", gv);
        } else {
            for (int i = 0; i < c->hidden; i++) ASSERT_MSG(row[i] == 0, "padding row %d", gv);
        }
    }
    if (c->tie_embeddings) {
        ASSERT(w->lm_head == w->embed);
    } else {
        const struct st_tensor *lm = safetensors_find(st, "lm_head.weight");
        ASSERT(lm && w->lm_head != w->embed);
        int real = c->vocab - w->vocab_start;
        if (real > w->vocab_rows) real = w->vocab_rows;
        if (real > 0)
            ASSERT(memcmp(w->lm_head, (const uint16_t *)lm->data +
                          (size_t)w->vocab_start * c->hidden, (size_t)real * c->hidden * 2) == 0);
    }
    const struct st_tensor *fn = safetensors_find(st, "model.norm.weight");
    ASSERT(memcmp(w->final_norm, fn->data, (size_t)c->hidden * 2) == 0);

    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        char base[7][128], nm[200];
        float *full[7];
        int K[7], N[7];
        for (int p = 0; p < 7; p++) {
            snprintf(base[p], sizeof base[p], "model.layers.%d.%s", l, k_proj[p]);
            full[p] = ref_dequant(st, base[p], &K[p], &N[p]);
            ASSERT_MSG(full[p] != NULL, "%s missing", base[p]);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        ASSERT(memcmp(L->attn_norm, safetensors_find(st, nm)->data, (size_t)c->hidden * 2) == 0);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        ASSERT(memcmp(L->mlp_norm, safetensors_find(st, nm)->data, (size_t)c->hidden * 2) == 0);
        if (c->qk_norm) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
            ASSERT(L->q_norm && memcmp(L->q_norm, safetensors_find(st, nm)->data, (size_t)hd * 2) == 0);
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            ASSERT(L->k_norm && memcmp(L->k_norm, safetensors_find(st, nm)->data, (size_t)hd * 2) == 0);
        } else {
            ASSERT(!L->q_norm && !L->k_norm);
        }
        /* q|k|v columns of this rank's heads */
        ASSERT_EQ_INT(L->qkv.k, c->hidden);
        ASSERT_EQ_INT(L->qkv.n, (nh + 2 * nkv) * hd);
        ASSERT_EQ_INT(L->qkv.group, c->group_size);
        float *wq = dq(&L->qkv);
        const struct st_tensor *bias[3] = {0};
        for (int p = 0; p < 3 && c->qkv_bias; p++) {
            snprintf(nm, sizeof nm, "%.120s.bias", base[p]);
            bias[p] = safetensors_find(st, nm);
        }
        ASSERT((L->qkv.bias != NULL) == (c->qkv_bias != 0));
        for (int j = 0; j < L->qkv.n; j++) {
            int p, gc;
            if (j < nh * hd) p = 0, gc = r * nh * hd + j;
            else if (j < (nh + nkv) * hd) p = 1, gc = ks * hd + j - nh * hd;
            else p = 2, gc = ks * hd + j - (nh + nkv) * hd;
            for (int k = 0; k < c->hidden; k++)
                if (wq[(size_t)k * L->qkv.n + j] != full[p][(size_t)k * N[p] + gc]) {
                    test_fail(__FILE__, __LINE__, "layer %d rank %d qkv[%d][%d] != %s[%d][%d]", l,
                              r, k, j, base[p], k, gc);
                    break;
                }
            if (L->qkv.bias)
                ASSERT_MSG(L->qkv.bias[j] == ((const uint16_t *)bias[p]->data)[gc],
                           "qkv bias %d", j);
        }
        free(wq);
        /* o: this rank's rows; bias on rank 0 only */
        ASSERT_EQ_INT(L->o.k, nh * hd);
        ASSERT_EQ_INT(L->o.n, c->hidden);
        float *wo = dq(&L->o);
        ASSERT(memcmp(wo, full[3] + (size_t)r * nh * hd * c->hidden,
                      (size_t)nh * hd * c->hidden * sizeof(float)) == 0);
        free(wo);
        if (r > 0) ASSERT(L->o.bias == NULL);
        /* gate|up */
        ASSERT_EQ_INT(L->gate_up.n, 2 * in);
        float *wg = dq(&L->gate_up);
        for (int j = 0; j < 2 * in; j++) {
            int p = j < in ? 4 : 5, gc = r * in + (j < in ? j : j - in);
            for (int k = 0; k < c->hidden; k++)
                if (wg[(size_t)k * 2 * in + j] != full[p][(size_t)k * N[p] + gc]) {
                    test_fail(__FILE__, __LINE__, "layer %d rank %d gate_up[%d][%d]", l, r, k, j);
                    break;
                }
        }
        free(wg);
        ASSERT(L->gate_up.bias == NULL);
        /* down: rows */
        ASSERT_EQ_INT(L->down.k, in);
        float *wd = dq(&L->down);
        ASSERT(memcmp(wd, full[6] + (size_t)r * in * c->hidden,
                      (size_t)in * c->hidden * sizeof(float)) == 0);
        free(wd);
        for (int p = 0; p < 7; p++) free(full[p]);
        ASSERT_OK_SO_FAR();
    }
}

static void load_and_check(struct ckpt *ck, int tp) {
    for (int r = 0; r < tp; r++) {
        struct model_weights w;
        char err[512];
        int rc = ckpt_load(ck, r, tp, &w, err, sizeof err);
        ASSERT_MSG(rc == 0, "rank %d/%d: %s", r, tp, err);
        ASSERT_EQ_INT(w.rank, r);
        ASSERT_EQ_INT(w.tp, tp);
        check_rank(ck, &w);
        model_weights_free(&w);
        ASSERT_OK_SO_FAR();
    }
}

TEST(ckpt, qwen3_fixture_config_and_load) {
    struct ckpt *ck;
    int rc = open_fixture("qwen3-tiny-awq", &ck);
    if (rc > 0) TEST_SKIP("fixtures not installed");
    ASSERT(rc == 0);
    const struct model_config *c = ckpt_config(ck);
    ASSERT_EQ_INT(c->family, FAMILY_QWEN3);
    ASSERT_STR_EQ(c->model_type, "qwen3");
    ASSERT_EQ_INT(c->hidden, 256);
    ASSERT_EQ_INT(c->intermediate, 768);
    ASSERT_EQ_INT(c->n_layers, 3);
    ASSERT_EQ_INT(c->n_heads, 4);
    ASSERT_EQ_INT(c->n_kv_heads, 2);
    ASSERT_EQ_INT(c->head_dim, 128);
    ASSERT_EQ_INT(c->vocab, 512);
    ASSERT_EQ_INT(c->tie_embeddings, 1);
    ASSERT_EQ_INT(c->qk_norm, 1);
    ASSERT_EQ_INT(c->qkv_bias, 0);
    ASSERT_EQ_INT(c->max_position, 4096);
    ASSERT_NEAR(c->rms_eps, 1e-6, 1e-12);
    ASSERT_NEAR(c->rope.theta, 1e6, 0);
    ASSERT_EQ_INT(c->rope.type, ROPE_DEFAULT);
    ASSERT_EQ_INT(c->quantized, 1);
    ASSERT_EQ_INT(c->bits, 4);
    ASSERT_EQ_INT(c->group_size, 128);
    ASSERT_EQ_INT(c->zero_point, 1);
    ASSERT_EQ_INT(c->n_eos, 1);
    ASSERT_EQ_INT(c->eos_ids[0], 2);
    ASSERT_EQ_INT(c->bos_id, 1);
    struct model_weights w;
    char err[512];
    ASSERT_MSG(ckpt_load(ck, 0, 1, &w, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(w.n_heads, 4);
    ASSERT_EQ_INT(w.n_kv_heads, 2);
    ASSERT_EQ_INT(w.kv_head_start, 0);
    ASSERT_EQ_INT(w.intermediate, 768);
    ASSERT_EQ_INT(w.vocab_start, 0);
    ASSERT_EQ_INT(w.vocab_rows, 512);
    ASSERT_EQ_INT(w.layers[0].qkv.n, (4 + 2 * 2) * 128);
    ASSERT_EQ_INT(w.cfg.hidden, 256);
    uint64_t bytes = 0;
    ASSERT(ckpt_rank_bytes(ck, 0, 1, &bytes, err, sizeof err) == 0);
    ASSERT(bytes > 1500000 && bytes < 2000000);
    check_rank(ck, &w);
    model_weights_free(&w);
    ASSERT(w.layers == NULL);
    ckpt_close(ck);
}

TEST(ckpt, qwen2_fixture_sharded_files_biases) {
    struct ckpt *ck;
    int rc = open_fixture("qwen2-tiny-awq", &ck);
    if (rc > 0) TEST_SKIP("fixtures not installed");
    ASSERT(rc == 0);
    const struct model_config *c = ckpt_config(ck);
    ASSERT_EQ_INT(c->family, FAMILY_QWEN2);
    ASSERT_EQ_INT(c->qkv_bias, 1);
    ASSERT_EQ_INT(c->qk_norm, 0);
    ASSERT_EQ_INT(c->tie_embeddings, 0);
    ASSERT_EQ_INT(c->head_dim, 64);
    ASSERT_EQ_INT(c->intermediate, 512);
    ASSERT_EQ_INT(ckpt_safetensors(ck)->n_files, 2);
    load_and_check(ck, 1);
    ckpt_close(ck);
}

TEST(ckpt, llama_fixture_rope_llama3) {
    struct ckpt *ck;
    int rc = open_fixture("llama-tiny-awq", &ck);
    if (rc > 0) TEST_SKIP("fixtures not installed");
    ASSERT(rc == 0);
    const struct model_config *c = ckpt_config(ck);
    ASSERT_EQ_INT(c->family, FAMILY_LLAMA);
    ASSERT_STR_EQ(c->model_type, "llama");
    ASSERT_EQ_INT(c->rope.type, ROPE_LLAMA3);
    ASSERT_NEAR(c->rope.theta, 500000, 0);
    ASSERT_NEAR(c->rope.factor, 8, 0);
    ASSERT_NEAR(c->rope.low_freq_factor, 1, 0);
    ASSERT_NEAR(c->rope.high_freq_factor, 4, 0);
    ASSERT_EQ_INT(c->rope.original_max_position, 8192);
    ASSERT_EQ_INT(c->head_dim, 32);
    ASSERT_EQ_INT(c->n_heads, 8);
    ASSERT_EQ_INT(c->n_kv_heads, 2);
    ASSERT_EQ_INT(c->max_position, 131072);
    ASSERT_NEAR(c->rms_eps, 1e-5, 1e-12);
    ASSERT_EQ_INT(c->qkv_bias, 0);
    ASSERT_EQ_INT(c->qk_norm, 0);
    load_and_check(ck, 1);
    /* intermediate 640 / 2 = 320 rows of down_proj: not a multiple of 128 */
    struct model_weights w;
    char err[512];
    ASSERT(ckpt_load(ck, 0, 2, &w, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "down_proj rows per rank 320");
    ASSERT_CONTAINS(err, "group_size 128");
    ckpt_close(ck);
}

TEST(ckpt, fixtures_shard_tp2_reassembles) {
    const char *names[2] = {"qwen3-tiny-awq", "qwen2-tiny-awq"};
    for (int i = 0; i < 2; i++) {
        struct ckpt *ck;
        int rc = open_fixture(names[i], &ck);
        if (rc > 0) TEST_SKIP("fixtures not installed");
        ASSERT(rc == 0);
        load_and_check(ck, 2);
        ASSERT_OK_SO_FAR();
        char err[512];
        struct model_weights w;
        /* tp=3 does not divide 4 heads; tp=4 cuts o_proj below a group */
        ASSERT(ckpt_load(ck, 0, 3, &w, err, sizeof err) != 0);
        ASSERT_CONTAINS(err, "num_attention_heads 4 is not divisible by 3");
        ASSERT(ckpt_load(ck, 1, 4, &w, err, sizeof err) != 0);
        ASSERT_CONTAINS(err, "not a multiple of group_size 128");
        ASSERT(ckpt_load(ck, 2, 2, &w, err, sizeof err) != 0);
        ASSERT_CONTAINS(err, "bad tensor-parallel rank 2 of tp 2");
        ckpt_close(ck);
    }
}

TEST(ckpt, pack_vectors_dequant_matches_autoawq) {
    struct safetensors *st;
    char err[512];
    const char *p = test_fixture("awq-pack-vectors.safetensors");
    if (access(p, R_OK)) TEST_SKIP("fixtures not installed");
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s.qweight", names[i]);
        const struct st_tensor *q = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.qzeros", names[i]);
        const struct st_tensor *z = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.scales", names[i]);
        const struct st_tensor *s = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.dequant", names[i]);
        const struct st_tensor *d = safetensors_find(st, nm);
        ASSERT(q && z && s && d);
        /* copies: the mapping need not be aligned for uint32 */
        uint32_t *qb = malloc(q->nbytes), *zb = malloc(z->nbytes);
        uint16_t *sb = malloc(s->nbytes);
        memcpy(qb, q->data, q->nbytes);
        memcpy(zb, z->data, z->nbytes);
        memcpy(sb, s->data, s->nbytes);
        struct awq_linear l = {.k = (int)q->shape[0], .n = (int)q->shape[1] * 8, .group = 128,
                               .qweight = qb, .qzeros = zb, .scales = sb};
        float *w = dq(&l);
        const uint16_t *ref = d->data;
        int mism = 0;
        for (size_t k = 0; k < (size_t)l.k * l.n; k++) {
            /* AutoAWQ computes (q - z) * s in fp16: our exact product rounds to it */
            if (f32_to_fp16(w[k]) != ref[k]) mism++;
        }
        ASSERT_MSG(mism == 0, "%s: %d of %d dequantized weights differ", names[i], mism,
                   l.k * l.n);
        free(w);
        free(qb);
        free(zb);
        free(sb);
    }
    safetensors_close(st);
}

/* ------------------------------------------------------------------------ */
/* synthetic checkpoints: tp=4, biases, and a corpus of broken ones          */

#include "engine/mkmodel.h"
#include "engine/util.h"

/* Qwen2 family (q/k/v biases), 8 query / 2 KV heads x 64, untied, vocab not
 * divisible by 4: tp 4 takes 2 query heads and a replicated KV head per rank. */
static void qwen2_spec(struct mkmodel_spec *s) {
    mkmodel_preset("tiny", s);
    snprintf(s->name, sizeof s->name, "test-qwen2");
    s->family = FAMILY_QWEN2;
    s->hidden = 256;
    s->intermediate = 1024;
    s->n_layers = 2;
    s->n_heads = 8;
    s->n_kv_heads = 2;
    s->head_dim = 64;
    s->vocab = 1001;
    s->tie_embeddings = 0;
    s->shard_bytes = 0;
}

static const char *make_model(const struct mkmodel_spec *s, const char *name) {
    static char dir[8][600];
    static int k;
    char *d = dir[k++ % 8];
    char err[512];
    snprintf(d, 600, "%s/%s", test_tmpdir(), name);
    if (mkmodel_write(s, d, 11, 0, NULL, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "mkmodel_write: %s", err);
        return NULL;
    }
    return d;
}

TEST(ckpt, synthetic_tp4_replicated_kv_padded_vocab) {
    struct mkmodel_spec s;
    qwen2_spec(&s);
    const char *d = make_model(&s, "q2");
    ASSERT(d);
    struct ckpt *ck;
    char err[512];
    ASSERT_MSG(ckpt_open(d, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->qkv_bias, 1);
    load_and_check(ck, 1);
    load_and_check(ck, 2);
    load_and_check(ck, 4);
    struct model_weights w;
    ASSERT(ckpt_load(ck, 3, 4, &w, err, sizeof err) == 0);
    ASSERT_EQ_INT(w.vocab_rows, 251);
    ASSERT_EQ_INT(w.vocab_start, 753);
    ASSERT_EQ_INT(w.n_kv_heads, 1);
    ASSERT_EQ_INT(w.kv_head_start, 1);
    ASSERT_EQ_INT(w.n_heads, 2);
    model_weights_free(&w);
    /* tp 8: 1 head x 64 rows of o_proj per rank, less than a group */
    ASSERT(ckpt_load(ck, 0, 8, &w, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "o_proj rows per rank 64");
    ckpt_close(ck);
}

TEST(ckpt, synthetic_llama_attention_bias_once) {
    struct mkmodel_spec s;
    mkmodel_preset("llama3-8b", &s);
    s.hidden = 256;
    s.intermediate = 512;
    s.n_layers = 1;
    s.n_heads = 4;
    s.n_kv_heads = 4;
    s.head_dim = 64;
    s.vocab = 300;
    s.qkv_bias = 1; /* attention_bias: q/k/v and o */
    s.shard_bytes = 0;
    const char *d = make_model(&s, "llb");
    ASSERT(d);
    struct ckpt *ck;
    char err[512];
    ASSERT_MSG(ckpt_open(d, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->rope.type, ROPE_LLAMA3);
    ASSERT_EQ_INT(ckpt_config(ck)->n_eos, 3);
    load_and_check(ck, 2);
    struct model_weights w;
    ASSERT(ckpt_load(ck, 0, 2, &w, err, sizeof err) == 0);
    ASSERT(w.layers[0].o.bias != NULL); /* rank 0 adds the o bias once */
    const struct st_tensor *ob = safetensors_find(ckpt_safetensors(ck), "model.layers.0.self_attn.o_proj.bias");
    ASSERT(ob && memcmp(w.layers[0].o.bias, ob->data, ob->nbytes) == 0);
    model_weights_free(&w);
    ckpt_close(ck);
}

/* --- the broken corpus --------------------------------------------------- */

static void expect_open_fails(const char *dir, const char *needle) {
    struct ckpt *ck = NULL;
    char err[1024] = "";
    int rc = ckpt_open(dir, &ck, err, sizeof err);
    if (rc == 0) {
        ckpt_close(ck);
        test_fail(__FILE__, __LINE__, "%s opened; expected \"%s\"", dir, needle);
        return;
    }
    if (rc > 0) test_fail(__FILE__, __LINE__, "positive rc %d", rc);
    if (!strstr(err, needle)) test_fail(__FILE__, __LINE__, "\"%s\" lacks \"%s\"", err, needle);
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) { test_fail(__FILE__, __LINE__, "fopen %s", path); return; }
    fwrite(data, 1, len, f);
    fclose(f);
}

/* Copies a model directory (config files and safetensors). */
static void copy_dir(const char *src, const char *dst) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    if (test_run(cmd, NULL) != 0) test_fail(__FILE__, __LINE__, "%s failed", cmd);
}

/* Replaces the first `from` with `to` in dir/file. */
static void edit_file(const char *dir, const char *file, const char *from, const char *to) {
    char path[700], err[256], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (util_read_file(path, 0, &text, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    char *at = strstr(text, from);
    if (!at) { free(text); test_fail(__FILE__, __LINE__, "%s not in %s", from, path); return; }
    size_t nl = len - strlen(from) + strlen(to);
    char *out = malloc(nl + 1);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    memcpy(out + pre, to, strlen(to));
    memcpy(out + pre + strlen(to), at + strlen(from), len - pre - strlen(from));
    write_file(path, out, nl);
    free(out);
    free(text);
}

enum mut { MUT_DROP, MUT_DTYPE, MUT_SHAPE };

/* Rewrites dir/model.safetensors with tensor `name` dropped / re-typed / re-shaped. */
static void mutate_tensor(const char *dir, const char *name, enum mut m) {
    char path[700], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct safetensors *st;
    if (safetensors_open(path, &st, err, sizeof err)) { test_fail(__FILE__, __LINE__, "%s", err); return; }
    struct st_desc *d = calloc((size_t)st->n_tensors, sizeof *d);
    void *extra = NULL;
    int n = 0, found = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        struct st_desc x = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(x.shape, t->shape, sizeof x.shape);
        if (!strcmp(t->name, name)) {
            found = 1;
            if (m == MUT_DROP) continue;
            if (m == MUT_DTYPE) x.dtype = ST_F32;
            if (m == MUT_SHAPE) x.shape[x.ndim - 1] /= 2;
            size_t nb = 4;
            for (int k = 0; k < x.ndim; k++) nb *= (size_t)x.shape[k];
            extra = calloc(1, nb + 4);
            x.data = extra;
        }
        d[n++] = x;
    }
    char tmp[720];
    snprintf(tmp, sizeof tmp, "%s/new.safetensors", dir);
    if (!found) test_fail(__FILE__, __LINE__, "no tensor %s", name);
    else if (safetensors_write(tmp, d, n, err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    safetensors_close(st);
    free(d);
    free(extra);
    if (!test_failed()) rename(tmp, path);
}

TEST(ckpt, broken_corpus_specific_messages) {
    struct mkmodel_spec s;
    mkmodel_preset("tiny", &s);
    s.vocab = 640;
    s.n_layers = 2;
    s.shard_bytes = 0;
    const char *good = make_model(&s, "good");
    ASSERT(good);
    char bad[600], path[700];
    snprintf(bad, sizeof bad, "%s/bad", test_tmpdir());
    snprintf(path, sizeof path, "%s/model.safetensors", bad);
    expect_open_fails("/nonexistent/model", "/nonexistent/model/config.json");
    ASSERT_OK_SO_FAR();

    /* truncated file */
    copy_dir(good, bad);
    ASSERT(truncate(path, 100000) == 0);
    expect_open_fails(bad, "model.safetensors: model.");
    expect_open_fails(bad, "truncated file");
    ASSERT_OK_SO_FAR();
    ASSERT(truncate(path, 5) == 0);
    expect_open_fails(bad, "truncated: 5 bytes");
    ASSERT_OK_SO_FAR();

    /* header length past EOF */
    copy_dir(good, bad);
    {
        FILE *f = fopen(path, "r+b");
        ASSERT(f);
        unsigned char big[8] = {0, 0, 0, 0, 1, 0, 0, 0};
        fwrite(big, 1, 8, f);
        fclose(f);
    }
    expect_open_fails(bad, "header length 4294967296 runs past the end of the file");
    ASSERT_OK_SO_FAR();

    /* bad JSON in the header */
    copy_dir(good, bad);
    {
        FILE *f = fopen(path, "r+b");
        ASSERT(f);
        fseek(f, 8 + 32, SEEK_SET); /* the comma after __metadata__ */
        fputc('#', f);
        fclose(f);
    }
    expect_open_fails(bad, "model.safetensors: header is not valid JSON");
    ASSERT_OK_SO_FAR();

    /* overlapping ranges */
    copy_dir(good, bad);
    {
        const char *hdr = "{\"model.embed_tokens.weight\":{\"dtype\":\"F16\",\"shape\":[2,4],"
                          "\"data_offsets\":[0,16]},\"model.norm.weight\":{\"dtype\":\"F16\","
                          "\"shape\":[4],\"data_offsets\":[8,16]}}";
        size_t hl = strlen(hdr);
        unsigned char buf[512] = {0};
        buf[0] = (unsigned char)hl;
        memcpy(buf + 8, hdr, hl);
        write_file(path, buf, 8 + hl + 16);
    }
    expect_open_fails(bad, "tensors model.embed_tokens.weight and model.norm.weight overlap");
    ASSERT_OK_SO_FAR();

    /* wrong dtype */
    copy_dir(good, bad);
    mutate_tensor(bad, "model.layers.1.mlp.down_proj.qweight", MUT_DTYPE);
    ASSERT_OK_SO_FAR();
    expect_open_fails(bad, "model.layers.1.mlp.down_proj.qweight: expected int32 [512, 16], "
                           "found fp32 [512, 16] (in model.safetensors)");
    ASSERT_OK_SO_FAR();

    /* wrong shape */
    copy_dir(good, bad);
    mutate_tensor(bad, "model.layers.0.self_attn.q_proj.scales", MUT_SHAPE);
    ASSERT_OK_SO_FAR();
    expect_open_fails(bad, "model.layers.0.self_attn.q_proj.scales: expected fp16 [1, 512], "
                           "found fp16 [1, 256]");
    ASSERT_OK_SO_FAR();

    /* missing tensor */
    copy_dir(good, bad);
    mutate_tensor(bad, "model.layers.1.self_attn.k_norm.weight", MUT_DROP);
    ASSERT_OK_SO_FAR();
    expect_open_fails(bad, "missing tensor model.layers.1.self_attn.k_norm.weight (expected fp16 [128])");
    ASSERT_OK_SO_FAR();

    /* unsupported quantization versions / methods / bits */
    const char *vers[3] = {"gemv", "gemv_fast", "marlin"};
    for (int i = 0; i < 3; i++) {
        char want[200], to[64];
        copy_dir(good, bad);
        snprintf(to, sizeof to, "\"%s\"", vers[i]);
        edit_file(bad, "config.json", "\"gemm\"", to);
        snprintf(want, sizeof want, "unsupported AWQ version \"%s\"", vers[i]);
        expect_open_fails(bad, want);
        expect_open_fails(bad, "supported: awq version gemm");
        ASSERT_OK_SO_FAR();
    }
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"awq\"", "\"gptq\"");
    expect_open_fails(bad, "quant_method \"gptq\"; supported: awq");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"bits\":\t4", "\"bits\":\t8");
    expect_open_fails(bad, "unsupported AWQ bits 8");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"zero_point\":\ttrue", "\"zero_point\":\tfalse");
    expect_open_fails(bad, "zero_point false");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"modules_to_not_convert\":\tnull",
              "\"modules_to_not_convert\":\t[\"mlp.down_proj\"]");
    expect_open_fails(bad, "modules_to_not_convert lists \"mlp.down_proj\"");
    ASSERT_OK_SO_FAR();

    /* unquantized: refused by ckpt_open, accepted by ckpt_open_ex for quantize */
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"quantization_config\"", "\"quantization_config_was\"");
    expect_open_fails(bad, "awqd quantize");
    ASSERT_OK_SO_FAR();

    /* family / rope / config errors */
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"qwen3\"", "\"gemma3\"");
    expect_open_fails(bad, "model_type \"gemma3\"");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"rope_scaling\":\tnull",
              "\"rope_scaling\":\t{\"rope_type\": \"yarn\", \"factor\": 4}");
    expect_open_fails(bad, "rope scaling type \"yarn\" is not supported");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"use_sliding_window\":\tfalse", "\"use_sliding_window\":\ttrue");
    edit_file(bad, "config.json", "\"sliding_window\":\tnull", "\"sliding_window\":\t1024");
    expect_open_fails(bad, "sliding-window attention (sliding_window 1024");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"num_key_value_heads\":\t2", "\"num_key_value_heads\":\t3");
    expect_open_fails(bad, "not a multiple of num_key_value_heads 3");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"hidden_size\":\t128", "\"hidden_size\":\t-1");
    expect_open_fails(bad, "must be positive");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "{", "[");
    expect_open_fails(bad, "config.json: not a JSON object");
    ASSERT_OK_SO_FAR();
    copy_dir(good, bad);
    edit_file(bad, "config.json", "\"vocab_size\":\t640", "\"vocab_size\":\t641");
    expect_open_fails(bad, "model.embed_tokens.weight: expected fp16 [641, 128], found fp16 [640, 128]");
    ASSERT_OK_SO_FAR();

    /* non-divisible tp on a good model */
    struct ckpt *ck;
    char err[512];
    ASSERT(ckpt_open(good, &ck, err, sizeof err) == 0);
    struct model_weights w;
    ASSERT(ckpt_load(ck, 0, 3, &w, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "tp 3: num_attention_heads 4 is not divisible by 3");
    ASSERT(ckpt_load(ck, 0, 0, &w, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "bad tensor-parallel rank 0 of tp 0");
    ckpt_close(ck);
}

TEST(ckpt, missing_shard_and_unquantized) {
    struct mkmodel_spec s;
    mkmodel_preset("tiny", &s);
    s.vocab = 640;
    s.n_layers = 2;
    s.shard_bytes = 150000;
    const char *d = make_model(&s, "sharded");
    ASSERT(d);
    char p[700];
    snprintf(p, sizeof p, "%s/model-00002-of-00004.safetensors", d);
    ASSERT(access(p, R_OK) == 0);
    ASSERT(unlink(p) == 0);
    expect_open_fails(d, "missing shard model-00002-of-00004.safetensors");
    ASSERT_OK_SO_FAR();
    /* fp16 checkpoint: open_ex accepts, load refuses */
    s.shard_bytes = 0;
    s.unquantized = 1;
    d = make_model(&s, "fp16");
    ASSERT(d);
    expect_open_fails(d, "unquantized");
    ASSERT_OK_SO_FAR();
    struct ckpt *ck;
    char err[512];
    ASSERT_MSG(ckpt_open_ex(d, 1, &ck, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(ckpt_config(ck)->quantized, 0);
    struct model_weights w;
    ASSERT(ckpt_load(ck, 0, 1, &w, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "awqd quantize");
    ckpt_close(ck);
}

/* Random mutations of config.json: ckpt_open either works or explains, and
 * never crashes (ASan/UBSan in CI). Bounded to ~2 s. */
TEST(ckpt, fuzz_config_json) {
    struct mkmodel_spec s;
    mkmodel_preset("tiny", &s);
    s.vocab = 256;
    s.n_layers = 1;
    s.shard_bytes = 0;
    const char *good = make_model(&s, "fz");
    ASSERT(good);
    char path[700], err[1024], *orig;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", good);
    ASSERT(util_read_file(path, 0, &orig, &len, err, sizeof err) == 0);
    static const char *swaps[] = {"-1", "0", "1e999", "-1e999", "2147483648", "null", "\"x\"",
                                  "[]", "{}", "true", "4.5", "99999999999"};
    uint64_t r = 0x1234567887654321ull;
    double t0 = util_now_s();
    int iters = 0, opened = 0;
    char *buf = malloc(len + 64);
    for (; iters < 3000 && util_now_s() - t0 < 2.0; iters++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        size_t n = len;
        memcpy(buf, orig, len);
        if (r % 3 == 0) {
            /* replace a number token with an awkward value */
            size_t pos = (size_t)(r >> 16) % len;
            while (pos < len && !(buf[pos] >= '0' && buf[pos] <= '9')) pos++;
            if (pos < len) {
                size_t end = pos;
                while (end < len && ((buf[end] >= '0' && buf[end] <= '9') || buf[end] == '.' ||
                                     buf[end] == 'e' || buf[end] == '-')) end++;
                const char *w = swaps[(r >> 40) % (sizeof swaps / sizeof *swaps)];
                size_t wl = strlen(w);
                memmove(buf + pos + wl, buf + end, len - end);
                memcpy(buf + pos, w, wl);
                n = len - (end - pos) + wl;
            }
        } else {
            for (int k = 0; k < 1 + (int)(r % 3); k++) {
                r ^= r << 13; r ^= r >> 7; r ^= r << 17;
                buf[(r >> 8) % len] = "{}[]\":,0123456789-.aeflnrstu \t"[(r >> 32) % 31];
            }
        }
        write_file(path, buf, n);
        struct ckpt *ck = NULL;
        if (ckpt_open(good, &ck, err, sizeof err) == 0) {
            opened++;
            ckpt_close(ck);
        } else {
            ASSERT_MSG(err[0], "no message at iteration %d", iters);
        }
    }
    free(buf);
    write_file(path, orig, len);
    free(orig);
    ASSERT(iters > 50);
    ASSERT(opened > 0 && opened < iters);
}

/* fp16 tensors stored as fp32 (exactly) or bf16 (rounded) load as fp16. */
static void rewrite_floats(const char *dir, enum st_dtype to) {
    char path[700], tmp[720], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s/new.safetensors", dir);
    struct safetensors *st;
    if (safetensors_open(path, &st, err, sizeof err)) { test_fail(__FILE__, __LINE__, "%s", err); return; }
    struct st_desc *d = calloc((size_t)st->n_tensors, sizeof *d);
    void **bufs = calloc((size_t)st->n_tensors, sizeof *bufs);
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        d[i] = (struct st_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
        if (t->dtype != ST_F16) continue;
        const uint16_t *h = t->data;
        if (to == ST_F32) {
            float *f = malloc((size_t)t->numel * 4);
            for (int64_t k = 0; k < t->numel; k++) f[k] = fp16_to_f32(h[k]);
            bufs[i] = f;
        } else {
            uint16_t *b = malloc((size_t)t->numel * 2);
            for (int64_t k = 0; k < t->numel; k++) {
                float f = fp16_to_f32(h[k]);
                uint32_t x;
                memcpy(&x, &f, 4);
                b[k] = (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
            }
            bufs[i] = b;
        }
        d[i].dtype = to;
        d[i].data = bufs[i];
    }
    if (safetensors_write(tmp, d, st->n_tensors, err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    for (int i = 0; i < st->n_tensors; i++) free(bufs[i]);
    free(bufs);
    free(d);
    safetensors_close(st);
    if (!test_failed()) rename(tmp, path);
}

TEST(ckpt, fp32_and_bf16_tensors_load_as_fp16) {
    struct mkmodel_spec s;
    mkmodel_preset("tiny", &s);
    s.vocab = 384;
    s.n_layers = 1;
    s.tie_embeddings = 0;
    s.shard_bytes = 0;
    const char *good = make_model(&s, "f16src");
    ASSERT(good);
    char d32[600], d16[600], err[512];
    snprintf(d32, sizeof d32, "%s/f32", test_tmpdir());
    snprintf(d16, sizeof d16, "%s/bf16", test_tmpdir());
    copy_dir(good, d32);
    copy_dir(good, d16);
    rewrite_floats(d32, ST_F32);
    rewrite_floats(d16, ST_BF16);
    ASSERT_OK_SO_FAR();
    struct ckpt *a, *b, *c;
    ASSERT_MSG(ckpt_open(good, &a, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(ckpt_open(d32, &b, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(ckpt_open(d16, &c, err, sizeof err) == 0, "%s", err);
    struct model_weights wa, wb, wc;
    ASSERT(ckpt_load(a, 0, 2, &wa, err, sizeof err) == 0);
    ASSERT(ckpt_load(b, 0, 2, &wb, err, sizeof err) == 0);
    ASSERT(ckpt_load(c, 0, 2, &wc, err, sizeof err) == 0);
    size_t ne = (size_t)wa.vocab_rows * s.hidden;
    ASSERT(memcmp(wa.embed, wb.embed, ne * 2) == 0);
    ASSERT(memcmp(wa.lm_head, wb.lm_head, ne * 2) == 0);
    ASSERT(memcmp(wa.layers[0].q_norm, wb.layers[0].q_norm, 128 * 2) == 0);
    const struct awq_linear *la = &wa.layers[0].qkv, *lb = &wb.layers[0].qkv, *lc = &wc.layers[0].qkv;
    size_t nsc = (size_t)(la->k / la->group) * la->n;
    ASSERT(memcmp(la->scales, lb->scales, nsc * 2) == 0);
    for (size_t i = 0; i < nsc; i++) {
        double x = fp16_to_f32(la->scales[i]), y = fp16_to_f32(lc->scales[i]);
        ASSERT_NEAR(y, x, fabs(x) / 128 + 1e-7);
    }
    for (size_t i = 0; i < ne; i++) {
        double x = fp16_to_f32(wa.embed[i]), y = fp16_to_f32(wc.embed[i]);
        ASSERT_NEAR(y, x, fabs(x) / 128 + 1e-6);
    }
    model_weights_free(&wa);
    model_weights_free(&wb);
    model_weights_free(&wc);
    ckpt_close(a);
    ckpt_close(b);
    ckpt_close(c);
}
