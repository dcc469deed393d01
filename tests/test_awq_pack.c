/* test_awq_pack.c — AWQ packing and RTN quantization against AutoAWQ's own
 * output (../shared/fixtures/awq-pack-vectors.safetensors). */
#include "tests/harness/test.h"

#include "engine/awq_pack.h"
#include "engine/ckpt.h"
#include "engine/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

struct vec {
    int n, k;
    uint16_t *weight;   /* fp16 [N, K] */
    uint16_t *scales;   /* fp16 [K/128, N] */
    int32_t *zeros;     /* int32 [K/128, N] */
    uint32_t *qweight;  /* int32 [K, N/8] */
    uint32_t *qzeros;   /* int32 [K/128, N/8] */
    uint16_t *dequant;  /* fp16 [K, N] */
};

static void *copy_of(const struct safetensors *st, const char *x, const char *what) {
    char nm[64];
    snprintf(nm, sizeof nm, "%s.%s", x, what);
    const struct st_tensor *t = safetensors_find(st, nm);
    if (!t) return NULL;
    void *p = malloc(t->nbytes);
    memcpy(p, t->data, t->nbytes);
    return p;
}

static int load_vec(const struct safetensors *st, const char *x, struct vec *v) {
    char nm[64];
    snprintf(nm, sizeof nm, "%s.weight", x);
    const struct st_tensor *t = safetensors_find(st, nm);
    if (!t) return -1;
    v->n = (int)t->shape[0];
    v->k = (int)t->shape[1];
    v->weight = copy_of(st, x, "weight");
    v->scales = copy_of(st, x, "scales");
    v->zeros = copy_of(st, x, "zeros");
    v->qweight = copy_of(st, x, "qweight");
    v->qzeros = copy_of(st, x, "qzeros");
    v->dequant = copy_of(st, x, "dequant");
    return (v->scales && v->zeros && v->qweight && v->qzeros && v->dequant) ? 0 : -1;
}

static void free_vec(struct vec *v) {
    free(v->weight);
    free(v->scales);
    free(v->zeros);
    free(v->qweight);
    free(v->qzeros);
    free(v->dequant);
}

static struct safetensors *open_vectors(void) {
    const char *p = test_fixture("awq-pack-vectors.safetensors");
    if (access(p, R_OK)) return NULL;
    struct safetensors *st = NULL;
    char err[512];
    if (safetensors_open(p, &st, err, sizeof err))
        test_fail(__FILE__, __LINE__, "%s", err);
    return st;
}

static const char *k_names[3] = {"a", "b", "c"};

TEST(awq_pack, pack_bit_identical_to_autoawq) {
    struct safetensors *st = open_vectors();
    if (!st) { if (test_failed()) return; TEST_SKIP("fixtures not installed"); }
    for (int i = 0; i < 3; i++) {
        struct vec v;
        ASSERT(load_vec(st, k_names[i], &v) == 0);
        int G = 128, ng = v.k / G;
        uint16_t *wt = malloc((size_t)G * v.n * 2);
        int32_t *raw = malloc((size_t)v.k * v.n * 4);
        uint8_t *codes = malloc((size_t)v.k * v.n), *zc = malloc((size_t)ng * v.n);
        uint32_t *qw = malloc((size_t)v.k * v.n / 2), *qz = malloc((size_t)ng * v.n / 2);
        for (size_t j = 0; j < (size_t)ng * v.n; j++) zc[j] = (uint8_t)v.zeros[j];
        for (int g = 0; g < ng; g++) {
            for (int r = 0; r < G; r++)
                for (int c = 0; c < v.n; c++)
                    wt[(size_t)r * v.n + c] = v.weight[(size_t)c * v.k + g * G + r];
            awq_codes_group(wt, G, v.n, (size_t)v.n, v.scales + (size_t)g * v.n,
                            zc + (size_t)g * v.n, raw + (size_t)g * G * v.n);
        }
        int spilled = 0;
        for (size_t j = 0; j < (size_t)v.k * v.n; j++) {
            spilled += raw[j] < 0 || raw[j] > 15;
            codes[j] = (uint8_t)(raw[j] < 0 ? 0 : raw[j] > 15 ? 15 : raw[j]);
        }
        awq_pack_autoawq(raw, v.k, v.n, qw);
        awq_pack(zc, ng, v.n, qz);
        int bad = 0;
        for (size_t j = 0; j < (size_t)v.k * v.n / 8; j++) bad += qw[j] != v.qweight[j];
        ASSERT_MSG(bad == 0, "%s: %d of %d qweight words differ", k_names[i], bad, v.k * v.n / 8);
        ASSERT_MSG(memcmp(qz, v.qzeros, (size_t)ng * v.n / 2) == 0, "%s: qzeros differ",
                   k_names[i]);
        /* with no out-of-range code the clamped packer agrees too */
        uint32_t *qw2 = malloc((size_t)v.k * v.n / 2);
        awq_pack(codes, v.k, v.n, qw2);
        int differ = 0;
        for (size_t j = 0; j < (size_t)v.k * v.n / 8; j++) differ += qw2[j] != v.qweight[j];
        ASSERT_MSG(differ <= spilled, "%s: %d words differ, %d spilled codes", k_names[i], differ,
                   spilled);
        free(qw2);
        /* unpacking gives the codes back (where AutoAWQ did not spill) */
        uint8_t *back = malloc((size_t)v.k * v.n);
        awq_unpack(v.qweight, v.k, v.n, back);
        int bad_codes = 0;
        for (size_t j = 0; j < (size_t)v.k * v.n; j++) bad_codes += back[j] != codes[j];
        ASSERT_MSG(bad_codes <= 2 * spilled, "%s: %d codes differ", k_names[i], bad_codes);
        awq_unpack(v.qzeros, ng, v.n, back);
        for (size_t j = 0; j < (size_t)ng * v.n; j++) ASSERT(back[j] == (uint8_t)v.zeros[j]);
        /* and dequantization through awq_dequant gives AutoAWQ's dequant (fp16-rounded) */
        struct awq_linear l = {.k = v.k, .n = v.n, .group = G, .qweight = v.qweight,
                               .qzeros = v.qzeros, .scales = v.scales};
        float *w = malloc((size_t)v.k * v.n * sizeof *w);
        awq_dequant(&l, w);
        for (size_t j = 0; j < (size_t)v.k * v.n; j++)
            ASSERT_MSG(f32_to_fp16(w[j]) == v.dequant[j], "%s dequant[%zu]", k_names[i], j);
        free(w);
        free(back);
        free(wt);
        free(raw);
        free(codes);
        free(zc);
        free(qw);
        free(qz);
        free_vec(&v);
    }
    safetensors_close(st);
}

TEST(awq_pack, rtn_scales_zeros_match_autoawq) {
    struct safetensors *st = open_vectors();
    if (!st) { if (test_failed()) return; TEST_SKIP("fixtures not installed"); }
    for (int i = 0; i < 3; i++) {
        struct vec v;
        ASSERT(load_vec(st, k_names[i], &v) == 0);
        int G = 128, ng = v.k / G;
        uint32_t *qw = malloc((size_t)v.k * v.n / 2), *qz = malloc((size_t)ng * v.n / 2);
        uint16_t *sc = malloc((size_t)ng * v.n * 2);
        ASSERT(awq_quantize_linear(v.weight, v.n, v.k, G, qw, qz, sc) == 0);
        int bad_s = 0, bad_q = 0;
        for (size_t j = 0; j < (size_t)ng * v.n; j++) bad_s += sc[j] != v.scales[j];
        ASSERT_MSG(bad_s == 0, "%s: %d of %d scales differ", k_names[i], bad_s, ng * v.n);
        ASSERT_MSG(memcmp(qz, v.qzeros, (size_t)ng * v.n / 2) == 0, "%s: zeros differ", k_names[i]);
        /* AutoAWQ's one unclamped 16 in b spills into a neighbour; ours clamps */
        for (size_t j = 0; j < (size_t)v.k * v.n / 8; j++) bad_q += qw[j] != v.qweight[j];
        ASSERT_MSG(bad_q <= (i == 1 ? 1 : 0), "%s: %d of %d qweight words differ", k_names[i], bad_q,
                   v.k * v.n / 8);
        free(qw);
        free(qz);
        free(sc);
        free_vec(&v);
    }
    safetensors_close(st);
}

TEST(awq_pack, order_and_roundtrip) {
    /* codes 0..7 in one word: column j at nibble awq_order[j] */
    uint8_t c[8] = {0, 1, 2, 3, 4, 5, 6, 7}, back[8];
    uint32_t p;
    awq_pack(c, 1, 8, &p);
    ASSERT_EQ_INT(p, 0x75316420u);
    awq_unpack(&p, 1, 8, back);
    ASSERT(memcmp(c, back, 8) == 0);
    /* random round trip */
    uint8_t big[64 * 24], big2[64 * 24];
    uint32_t pk[64 * 3];
    uint32_t s = 12345;
    for (int i = 0; i < 64 * 24; i++) { s = s * 1664525u + 1013904223u; big[i] = (uint8_t)(s >> 28); }
    awq_pack(big, 64, 24, pk);
    awq_unpack(pk, 64, 24, big2);
    ASSERT(memcmp(big, big2, sizeof big) == 0);
    /* RTN round trip: error within one step of the group's scale */
    uint16_t w[8 * 256];
    for (int i = 0; i < 8 * 256; i++) w[i] = f32_to_fp16(0.05f * sinf((float)i * 0.37f));
    uint32_t qw[256], qz[2];
    uint16_t sc[16];
    ASSERT(awq_quantize_linear(w, 8, 256, 128, qw, qz, sc) == 0);
    struct awq_linear l = {.k = 256, .n = 8, .group = 128, .qweight = qw, .qzeros = qz, .scales = sc};
    float out[8 * 256];
    awq_dequant(&l, out);
    for (int kk = 0; kk < 256; kk++)
        for (int nn = 0; nn < 8; nn++) {
            float step = fp16_to_f32(sc[(kk / 128) * 8 + nn]);
            ASSERT(step > 0 && step < 0.01f);
            ASSERT_NEAR(out[kk * 8 + nn], fp16_to_f32(w[nn * 256 + kk]), step);
        }
    /* a constant group does not divide by zero */
    uint16_t cst[8 * 128];
    for (int i = 0; i < 8 * 128; i++) cst[i] = 0x3c00;
    ASSERT(awq_quantize_linear(cst, 8, 128, 128, qw, qz, sc) == 0);
    ASSERT(fp16_to_f32(sc[0]) > 0);
    ASSERT(awq_quantize_linear(w, 8, 100, 128, qw, qz, sc) != 0);
}
