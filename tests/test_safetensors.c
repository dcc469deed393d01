/* test_safetensors.c — safetensors reader/writer: round trip, the fixtures,
 * every malformed-header case with its message, shards, and a bounded fuzz of
 * header mutations (run under ASan in CI). */
#include "tests/harness/test.h"

#include "engine/safetensors.h"
#include "engine/util.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes 8-byte length + header + data_len zero bytes (or a custom length). */
static void write_raw(const char *path, const char *hdr, size_t data_len, int64_t force_len) {
    FILE *f = fopen(path, "wb");
    if (!f) { test_fail(__FILE__, __LINE__, "fopen %s", path); return; }
    uint64_t n = force_len >= 0 ? (uint64_t)force_len : strlen(hdr);
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
}

static const char *tmp(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, 512, "%s/%s", test_tmpdir(), name);
    return b;
}

/* Expect safetensors_open(path) to fail with a message containing `needle`. */
static void expect_bad(const char *path, const char *needle) {
    struct safetensors *st = NULL;
    char err[512] = "";
    int rc = safetensors_open(path, &st, err, sizeof err);
    if (rc == 0) {
        safetensors_close(st);
        test_fail(__FILE__, __LINE__, "%s opened, expected an error with \"%s\"", path, needle);
        return;
    }
    if (!strstr(err, needle))
        test_fail(__FILE__, __LINE__, "error \"%s\" lacks \"%s\"", err, needle);
    if (rc >= 0) test_fail(__FILE__, __LINE__, "rc %d not negative", rc);
}

TEST(safetensors, write_read_roundtrip) {
    float a[6] = {1, 2, 3, 4, 5, 6.5f};
    int32_t b[4] = {-1, 7, 1 << 30, 0};
    uint16_t c[3] = {0x3c00, 0x4000, 0xbc00};
    struct st_desc d[3] = {
        {.name = "x.float", .dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "a \"quoted\" name", .dtype = ST_I32, .ndim = 1, .shape = {4}, .data = b},
        {.name = "h", .dtype = ST_F16, .ndim = 1, .shape = {3}, .data = c},
    };
    char err[512];
    const char *p = tmp("rt.safetensors");
    ASSERT_MSG(safetensors_write(p, d, 3, err, sizeof err) == 0, "%s", err);
    struct safetensors *st;
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st->n_tensors, 3);
    const struct st_tensor *t = safetensors_find(st, "x.float");
    ASSERT(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    ASSERT(t->nbytes == sizeof a && memcmp(t->data, a, sizeof a) == 0);
    t = safetensors_find(st, "a \"quoted\" name");
    ASSERT(t && t->dtype == ST_I32 && memcmp(t->data, b, sizeof b) == 0);
    t = safetensors_find(st, "h");
    ASSERT(t && t->numel == 3 && memcmp(t->data, c, sizeof c) == 0);
    ASSERT(safetensors_find(st, "nope") == NULL);
    ASSERT_STR_EQ(safetensors_file_of(st, t), "rt.safetensors");
    ASSERT_EQ_INT(st->total_bytes, sizeof a + sizeof b + sizeof c);
    safetensors_close(st);
    /* the header is 8-aligned so data starts aligned */
    FILE *f = fopen(p, "rb");
    ASSERT(f);
    unsigned char lb[8];
    ASSERT(fread(lb, 1, 8, f) == 8);
    fclose(f);
    ASSERT_EQ_INT(lb[0] % 8, 0);
}

TEST(safetensors, streaming_writer_any_order) {
    struct st_desc d[2] = {
        {.name = "a", .dtype = ST_I32, .ndim = 2, .shape = {4, 4}},
        {.name = "b", .dtype = ST_F16, .ndim = 1, .shape = {10}},
    };
    char err[512];
    const char *p = tmp("stream.safetensors");
    struct st_writer *w;
    ASSERT_MSG(st_writer_open(p, d, 2, &w, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st_writer_tensor_bytes(w, 0), 64);
    int32_t rows[16];
    for (int i = 0; i < 16; i++) rows[i] = i * 3;
    ASSERT(st_writer_put(w, 0, 32, rows + 8, 32, err, sizeof err) == 0);
    ASSERT(st_writer_put(w, 0, 0, rows, 32, err, sizeof err) == 0);
    ASSERT(st_writer_put(w, 1, 0, rows, 21, err, sizeof err) != 0); /* past the end */
    ASSERT_CONTAINS(err, "outside");
    ASSERT(st_writer_close(w, err, sizeof err) == 0);
    struct safetensors *st;
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    ASSERT(memcmp(safetensors_find(st, "a")->data, rows, 64) == 0);
    safetensors_close(st);
}

TEST(safetensors, reads_pack_vectors_fixture) {
    struct safetensors *st;
    char err[512];
    const char *p = test_fixture("awq-pack-vectors.safetensors");
    if (access(p, R_OK)) TEST_SKIP("fixtures not installed");
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st->n_tensors, 18);
    const struct st_tensor *t = safetensors_find(st, "b.qweight");
    ASSERT(t && t->dtype == ST_I32 && t->shape[0] == 384 && t->shape[1] == 28);
    t = safetensors_find(st, "a.weight");
    ASSERT(t && t->dtype == ST_F16 && t->shape[0] == 64 && t->shape[1] == 256);
    safetensors_close(st);
}

TEST(safetensors, reads_sharded_fixture) {
    struct safetensors *st;
    char err[512];
    const char *dir = test_fixture("qwen2-tiny-awq");
    if (access(dir, R_OK)) TEST_SKIP("fixtures not installed");
    ASSERT_MSG(safetensors_open_dir(dir, &st, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st->n_files, 2);
    const struct st_tensor *t = safetensors_find(st, "lm_head.weight");
    ASSERT(t);
    ASSERT_STR_EQ(safetensors_file_of(st, t), "model-00001-of-00002.safetensors");
    t = safetensors_find(st, "model.layers.1.mlp.down_proj.qweight");
    ASSERT(t && t->shape[0] == 512 && t->shape[1] == 32);
    ASSERT_STR_EQ(safetensors_file_of(st, t), "model-00002-of-00002.safetensors");
    safetensors_close(st);
}

TEST(safetensors, malformed_headers_have_specific_messages) {
    const char *p = tmp("bad.safetensors");
    /* truncated below the length prefix */
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    fputs("abc", f);
    fclose(f);
    expect_bad(p, "truncated");
    ASSERT_OK_SO_FAR();
    /* header length past EOF */
    write_raw(p, "{}", 0, 1000);
    expect_bad(p, "runs past the end");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{}", 0, 0);
    expect_bad(p, "header length 0");
    ASSERT_OK_SO_FAR();
    /* bad JSON */
    write_raw(p, "{\"a\": {\"dtype\": \"F16\",", 16, -1);
    expect_bad(p, "not valid JSON");
    ASSERT_OK_SO_FAR();
    write_raw(p, "[1, 2]", 0, -1);
    expect_bad(p, "not a JSON object");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{} xx", 0, -1);
    expect_bad(p, "trailing bytes");
    ASSERT_OK_SO_FAR();
    /* unknown dtype */
    write_raw(p, "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1);
    expect_bad(p, "unknown dtype \"Q4\"");
    ASSERT_OK_SO_FAR();
    /* shape x dtype != byte range */
    write_raw(p, "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 16, -1);
    expect_bad(p, "w: fp16 [2, 3] needs 12 bytes but data_offsets [0, 10] hold 10");
    ASSERT_OK_SO_FAR();
    /* negative / fractional shape */
    write_raw(p, "{\"w\":{\"dtype\":\"F16\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 4, -1);
    expect_bad(p, "non-negative integers");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{\"w\":{\"dtype\":\"F16\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, -1);
    expect_bad(p, "non-negative integers");
    ASSERT_OK_SO_FAR();
    /* overflowing shape */
    write_raw(p, "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,4096],"
                 "\"data_offsets\":[0,4]}}", 4, -1);
    expect_bad(p, "overflow");
    ASSERT_OK_SO_FAR();
    /* ranges past the end (truncated data) */
    write_raw(p, "{\"w\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, -1);
    expect_bad(p, "run past the end of the file");
    ASSERT_OK_SO_FAR();
    /* reversed offsets */
    write_raw(p, "{\"w\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, -1);
    expect_bad(p, "end before they begin");
    ASSERT_OK_SO_FAR();
    /* overlapping */
    write_raw(p, "{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, -1);
    expect_bad(p, "tensors a and b overlap");
    ASSERT_OK_SO_FAR();
    /* duplicate names */
    write_raw(p, "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_bad(p, "appears twice");
    ASSERT_OK_SO_FAR();
    /* missing fields, wrong types */
    write_raw(p, "{\"a\":{\"dtype\":\"I32\",\"shape\":[1]}}", 8, -1);
    expect_bad(p, "data_offsets");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0]}}", 8, -1);
    expect_bad(p, "two non-negative integers");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{\"a\":3}", 8, -1);
    expect_bad(p, "not an object");
    ASSERT_OK_SO_FAR();
    write_raw(p, "{\"__metadata__\":[1]}", 0, -1);
    expect_bad(p, "__metadata__");
    ASSERT_OK_SO_FAR();
    /* too many dims */
    write_raw(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
              8, -1);
    expect_bad(p, "dimensions");
    ASSERT_OK_SO_FAR();
    /* a good one with metadata, scalar and empty tensor opens */
    write_raw(p, "{\"__metadata__\":{\"format\":\"pt\"},"
                 "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]}}   ", 4, -1);
    struct safetensors *st;
    char err[512];
    ASSERT_MSG(safetensors_open(p, &st, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st->n_tensors, 2);
    ASSERT_EQ_INT(safetensors_find(st, "s")->numel, 1);
    ASSERT_EQ_INT(safetensors_find(st, "e")->numel, 0);
    safetensors_close(st);
    /* a missing file names it */
    expect_bad(tmp("does-not-exist.safetensors"), "does-not-exist.safetensors");
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

TEST(safetensors, index_errors) {
    const char *dir = test_tmpdir();
    char err[512];
    struct safetensors *st;
    /* no weights at all */
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "no model.safetensors");
    int32_t v[2] = {1, 2};
    struct st_desc d = {.name = "a", .dtype = ST_I32, .ndim = 1, .shape = {2}, .data = v};
    ASSERT(safetensors_write(tmp("s1.safetensors"), &d, 1, err, sizeof err) == 0);
    /* missing shard */
    write_text(tmp("model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "missing shard s2.safetensors");
    /* tensor not in the shard the index names */
    d.name = "c";
    ASSERT(safetensors_write(tmp("s2.safetensors"), &d, 1, err, sizeof err) == 0);
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "lists tensor b in s2.safetensors");
    /* path escapes */
    write_text(tmp("model.safetensors.index.json"), "{\"weight_map\":{\"a\":\"../x\"}}");
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "plain file name");
    write_text(tmp("model.safetensors.index.json"), "{\"weight_map\":");
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "not valid JSON");
    /* a good index */
    write_text(tmp("model.safetensors.index.json"),
               "{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    ASSERT_MSG(safetensors_open_dir(dir, &st, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(st->n_tensors, 2);
    ASSERT_STR_EQ(safetensors_file_of(st, safetensors_find(st, "c")), "s2.safetensors");
    safetensors_close(st);
    /* the same tensor in two shards */
    d.name = "a";
    ASSERT(safetensors_write(tmp("s2.safetensors"), &d, 1, err, sizeof err) == 0);
    write_text(tmp("model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"x\":\"s2.safetensors\"}}");
    ASSERT(safetensors_open_dir(dir, &st, err, sizeof err) != 0);
}

/* xorshift for the fuzz loop */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

TEST(safetensors, fuzz_header_mutations) {
    /* a valid seed file with a few tensors */
    int32_t a[12];
    uint16_t h[5];
    memset(a, 0x11, sizeof a);
    memset(h, 0x22, sizeof h);
    struct st_desc d[3] = {
        {.name = "model.layers.0.q.qweight", .dtype = ST_I32, .ndim = 2, .shape = {3, 4}, .data = a},
        {.name = "n", .dtype = ST_F16, .ndim = 1, .shape = {5}, .data = h},
        {.name = "e", .dtype = ST_BF16, .ndim = 2, .shape = {0, 7}, .data = h},
    };
    char err[512];
    const char *seed = tmp("seed.safetensors");
    ASSERT(safetensors_write(seed, d, 3, err, sizeof err) == 0);
    FILE *f = fopen(seed, "rb");
    ASSERT(f);
    unsigned char orig[4096];
    size_t n = fread(orig, 1, sizeof orig, f);
    fclose(f);
    ASSERT(n > 16 && n < sizeof orig);
    const char *p = tmp("fuzz.safetensors");
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static const char tokens[] = "{}[],:\"0123456789-.eE FIUB";
    double t0 = util_now_s();
    int opened = 0, iters = 0;
    for (; iters < 4000; iters++) {
        unsigned char buf[4096];
        memcpy(buf, orig, n);
        size_t len = n;
        int muts = 1 + (int)(rng_next(&s) % 4);
        for (int m = 0; m < muts; m++) {
            uint64_t r = rng_next(&s);
            size_t pos = (size_t)(r >> 8) % len;
            switch (r % 5) {
            case 0: buf[pos] = (unsigned char)(r >> 40); break;               /* random byte */
            case 1: buf[pos] = (unsigned char)tokens[(r >> 32) % (sizeof tokens - 1)]; break;
            case 2: if (pos < 8) buf[pos] ^= (unsigned char)(1u << ((r >> 20) % 8)); break;
            case 3: len = pos > 1 ? pos : 1; break;                            /* truncate */
            default: if (pos >= 8) buf[pos] = buf[8 + (r >> 24) % (len - 8 > 0 ? len - 8 : 1)];
            }
        }
        f = fopen(p, "wb");
        ASSERT(f);
        fwrite(buf, 1, len, f);
        fclose(f);
        struct safetensors *st = NULL;
        if (safetensors_open(p, &st, err, sizeof err) == 0) {
            opened++;
            /* whatever opened must lie inside the file */
            for (int i = 0; i < st->n_tensors; i++) {
                const struct st_tensor *t = &st->tensors[i];
                volatile unsigned char sink = 0;
                const unsigned char *q = t->data;
                for (size_t k = 0; k < t->nbytes; k++) sink ^= q[k];
                (void)sink;
            }
            safetensors_close(st);
        } else {
            ASSERT_MSG(err[0] != 0, "error without a message at iteration %d", iters);
        }
        if (util_now_s() - t0 > 2.0) break;
    }
    ASSERT(iters >= 200);
    ASSERT(opened > 0 && opened < iters); /* both outcomes exercised */
}
