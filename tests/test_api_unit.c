/* test_api_unit.c — the /v1/completions schema (server/api.c) without a
 * daemon: validation of every field, error shape, response and SSE shape. */
#include "server/api.h"
#include "tests/harness/test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

static const struct api_limits LIM = {.model_name = "tiny", .vocab = 1000, .max_model_len = 128};

/* Parses body; expects status (0 = success) and, on error, param and a
 * message containing `msg`. */
static void expect(const char *body, int status, const char *param, const char *msg) {
    struct api_completion rq;
    struct api_error e;
    int rc = api_parse_completion(body, strlen(body), &LIM, &rq, &e);
    int all_ids = 1;
    for (int i = 0; rc == 0 && i < rq.n_prompts; i++) all_ids &= rq.prompts[i].ids != NULL;
    if (rc == 0 && all_ids) rc = api_check_lengths(&rq, &LIM, &e);
    api_completion_free(&rq);
    if (status == 0) {
        ASSERT_MSG(rc == 0, "%s: expected success, got %d %s", body, e.status, e.message);
        return;
    }
    ASSERT_MSG(rc != 0, "%s: expected %d, got success", body, status);
    ASSERT_MSG(e.status == status, "%s: status %d != %d (%s)", body, e.status, status, e.message);
    if (param) ASSERT_MSG(strcmp(e.param, param) == 0, "%s: param \"%s\" != \"%s\"", body, e.param, param);
    if (msg) ASSERT_MSG(strstr(e.message, msg), "%s: message \"%s\" lacks \"%s\"", body, e.message, msg);
    char *j = api_error_json(&e);
    cJSON *o = cJSON_Parse(j);
    ASSERT(o);
    cJSON *er = cJSON_GetObjectItem(o, "error");
    ASSERT(cJSON_IsString(cJSON_GetObjectItem(er, "message")));
    ASSERT(cJSON_IsString(cJSON_GetObjectItem(er, "type")));
    ASSERT(cJSON_GetObjectItem(er, "param"));
    ASSERT(cJSON_GetObjectItem(er, "code"));
    cJSON_Delete(o);
    free(j);
}

TEST(api_unit, valid_requests) {
    expect("{\"model\":\"tiny\",\"prompt\":\"hi\"}", 0, NULL, NULL);
    expect("{\"model\":\"tiny\",\"prompt\":[\"a\",\"b\"],\"n\":2,\"stream\":true,"
           "\"stream_options\":{\"include_usage\":true}}", 0, NULL, NULL);
    expect("{\"model\":\"tiny\",\"prompt\":[1,2,3],\"max_tokens\":5,\"temperature\":0,"
           "\"top_p\":0.5,\"logprobs\":5,\"echo\":true,\"stop\":[\"a\",\"bb\"],"
           "\"presence_penalty\":-2,\"frequency_penalty\":2,\"logit_bias\":{\"5\":-100},"
           "\"seed\":-7,\"user\":\"u\",\"top_k\":-1,\"min_p\":0.1,\"repetition_penalty\":1.2,"
           "\"ignore_eos\":true,\"min_tokens\":2,\"stop_token_ids\":[7],"
           "\"skip_special_tokens\":false,\"include_stop_str_in_output\":true,"
           "\"best_of\":1,\"suffix\":null,\"unknown_field\":{}}", 0, NULL, NULL);
    expect("{\"model\":\"tiny\",\"prompt\":[[1,2],[3]],\"max_tokens\":null}", 0, NULL, NULL);

    struct api_completion rq;
    struct api_error e;
    const char *b = "{\"model\":\"tiny\",\"prompt\":[[1,2],[3]],\"stop\":\"x\",\"seed\":3,"
                    "\"logit_bias\":{\"9\":1.5}}";
    ASSERT(api_parse_completion(b, strlen(b), &LIM, &rq, &e) == 0);
    ASSERT_EQ_INT(rq.n_prompts, 2);
    ASSERT_EQ_INT(rq.prompts[0].n_ids, 2);
    ASSERT_EQ_INT(rq.prompts[1].ids[0], 3);
    ASSERT_EQ_INT(rq.params.max_tokens, 16);
    ASSERT_EQ_INT(rq.params.n_stop, 1);
    ASSERT_STR_EQ(rq.params.stop[0], "x");
    ASSERT_EQ_INT(rq.params.has_seed, 1);
    ASSERT_EQ_INT(rq.params.seed, 3);
    ASSERT_EQ_INT(rq.params.n_logit_bias, 1);
    ASSERT_EQ_INT(rq.params.logit_bias_ids[0], 9);
    ASSERT_NEAR(rq.params.logit_bias_vals[0], 1.5, 1e-6);
    ASSERT_EQ_INT(rq.logprobs, -1);
    api_completion_free(&rq);
}

TEST(api_unit, invalid_requests) {
    expect("", 400, NULL, "empty");
    expect("{", 400, NULL, "not valid JSON");
    expect("[1,2]", 400, NULL, "JSON object");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\"} x", 400, NULL, "after the JSON");
    expect("{\"model\":\"tiny\",\"prompt\":\"\xff\"}", 400, NULL, "UTF-8");
    expect("{\"prompt\":\"a\"}", 400, "model", "required");
    expect("{\"model\":3,\"prompt\":\"a\"}", 400, "model", "string");
    expect("{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404, "model", "does not exist");
    expect("{\"model\":\"tiny\"}", 400, "prompt", "required");
    expect("{\"model\":\"tiny\",\"prompt\":\"\"}", 400, "prompt", "empty");
    expect("{\"model\":\"tiny\",\"prompt\":[]}", 400, "prompt", "empty");
    expect("{\"model\":\"tiny\",\"prompt\":{}}", 400, "prompt", "an object");
    expect("{\"model\":\"tiny\",\"prompt\":[1,-1]}", 400, "prompt", "not a valid token id");
    expect("{\"model\":\"tiny\",\"prompt\":[1,1000]}", 400, "prompt", "allowed 0 to 999");
    expect("{\"model\":\"tiny\",\"prompt\":[1,2.5]}", 400, "prompt", "fraction");
    expect("{\"model\":\"tiny\",\"prompt\":[\"a\",3]}", 400, "prompt", "prompt[1]");
    expect("{\"model\":\"tiny\",\"prompt\":[[1],[]]}", 400, "prompt", "empty");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", "between 1 and 128");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "max_tokens", "a string");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"max_tokens\":1.5}", 400, "max_tokens", "fraction");
    expect("{\"model\":\"tiny\",\"prompt\":[1,2,3],\"max_tokens\":126}", 400, "prompt",
           "maximum context length is 128 tokens. However, you requested 129 tokens (3 in the prompt, 126");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"temperature\":2.5}", 400, "temperature", "between 0 and 2");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"temperature\":true}", 400, "temperature", "a boolean");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", "greater than 0");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"n\":0}", 400, "n", "between 1 and 16");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"n\":17}", 400, "n", "between 1 and 16");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", "true or false");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400,
           "stream_options", "only allowed when stream");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
           400, "stream_options.include_usage", "true or false");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":6}", 400, "logprobs", "between 0 and 5");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "at most 4");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stop\":[1]}", 400, "stop", "a number");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", "empty");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"presence_penalty\":3}", 400, "presence_penalty", "-2 and 2");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"frequency_penalty\":-2.1}", 400, "frequency_penalty", "-2 and 2");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", "not a token id");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", "-100 and 100");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias", "object");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"seed\":1.5}", 400, "seed", "integer");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"user\":5}", 400, "user", "string");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", "not supported");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"suffix\":\"x\"}", 400, "suffix", "not supported");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"top_k\":-2}", 400, "top_k", "between -1");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"min_p\":1.5}", 400, "min_p", "between 0 and 1");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty", "greater than 0");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"min_tokens\":20}", 400, "min_tokens", "between 0 and 16");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"stop_token_ids\":[1000]}", 400, "stop_token_ids", "0 to 999");
    expect("{\"model\":\"tiny\",\"prompt\":\"a\",\"ignore_eos\":\"no\"}", 400, "ignore_eos", "true or false");
}

static const char *tok_text(void *ud, int32_t id, char *buf, size_t len) {
    snprintf(buf, len, "<%d>", id);
    return buf;
}

TEST(api_unit, response_shapes) {
    struct api_choice ch[2] = {0};
    ASSERT(api_choice_append_text(&ch[0], "hello", 5) == 0);
    struct engine_token t = {.id = 7, .logprob = -0.5f, .n_top = 2, .top_ids = {7, 8},
                             .top_logprobs = {-0.5f, -1.5f}};
    struct engine_token p0 = {.id = 3, .logprob = NAN};
    api_choice_append_tokens(&ch[0], &p0, 1, 1);
    api_choice_append_tokens(&ch[0], &t, 1, 0);
    ch[0].finish = ENGINE_FINISH_LENGTH;
    ch[1].finish = ENGINE_FINISH_STOP;
    char *s = api_format_completion("cmpl-1", 1700000000, "tiny", ch, 2, 2, 4, 3, tok_text, NULL);
    cJSON *o = cJSON_Parse(s);
    ASSERT(o);
    ASSERT_STR_EQ(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    ASSERT_STR_EQ(cJSON_GetObjectItem(o, "id")->valuestring, "cmpl-1");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    ASSERT_STR_EQ(cJSON_GetObjectItem(c0, "text")->valuestring, "hello");
    ASSERT_STR_EQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
    ASSERT(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)));
    ASSERT_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble, -0.5, 1e-6);
    ASSERT_STR_EQ(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 1)->valuestring, "<7>");
    ASSERT_EQ_INT(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valuedouble, 3);
    cJSON *top1 = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 1);
    ASSERT_NEAR(cJSON_GetObjectItem(top1, "<8>")->valuedouble, -1.5, 1e-6);
    cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 1);
    ASSERT_STR_EQ(cJSON_GetObjectItem(c1, "finish_reason")->valuestring, "stop");
    ASSERT_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valuedouble, 7);
    cJSON_Delete(o);
    free(s);
    api_choice_free(&ch[0]);
    api_choice_free(&ch[1]);

    size_t off = 0;
    s = api_format_chunk("cmpl-1", 1, "tiny", 1, "h\"i", 3, &t, 1, 0, &off, ENGINE_FINISH_NONE,
                         tok_text, NULL);
    ASSERT(strncmp(s, "data: {", 7) == 0);
    ASSERT(strcmp(s + strlen(s) - 2, "\n\n") == 0);
    o = cJSON_Parse(s + 6);
    ASSERT(o);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    ASSERT_STR_EQ(cJSON_GetObjectItem(c0, "text")->valuestring, "h\"i");
    ASSERT_EQ_INT(cJSON_GetObjectItem(c0, "index")->valuedouble, 1);
    ASSERT(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    ASSERT_EQ_INT(off, 3);
    cJSON_Delete(o);
    free(s);
    s = api_format_usage_chunk("cmpl-1", 1, "tiny", 5, 6);
    o = cJSON_Parse(s + 6);
    ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    ASSERT_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valuedouble, 6);
    cJSON_Delete(o);
    free(s);
}

TEST(api_unit, utf8) {
    ASSERT(api_utf8_valid("h\xc3\xa9llo \xe4\xbd\xa0 \xf0\x9f\x98\x80", 15));
    ASSERT(!api_utf8_valid("\xc0\xaf", 2));          /* overlong */
    ASSERT(!api_utf8_valid("\xed\xa0\x80", 3));      /* surrogate */
    ASSERT(!api_utf8_valid("\xe4\xbd", 2));          /* truncated */
    ASSERT(!api_utf8_valid("\xf4\x90\x80\x80", 4));  /* > U+10FFFF */
    size_t n;
    char *s = api_utf8_sanitize("a\xffz", 3, &n);
    ASSERT_STR_EQ(s, "a\xef\xbf\xbdz");
    free(s);
}

/* Random mutations of valid bodies: the parser answers 0 or a 4xx with a
 * well-formed error, never crashes (run under ASan/UBSan too). */
TEST(api_unit, fuzz_mutations) {
    static const char *seeds[] = {
        "{\"model\":\"tiny\",\"prompt\":\"hello\",\"max_tokens\":5,\"stop\":[\"a\",\"b\"]}",
        "{\"model\":\"tiny\",\"prompt\":[[1,2],[3]],\"n\":2,\"logprobs\":3,\"echo\":true}",
        "{\"model\":\"tiny\",\"prompt\":[1,2,3],\"logit_bias\":{\"5\":-1},\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"seed\":9,\"stop_token_ids\":[4]}",
    };
    const char alphabet[] = "{}[]\",:0123456789.-eE \\u\xff\xc3\x80tfnl";
    uint64_t x = 0x12345678abcdefull;
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        const char *s0 = seeds[it % 3];
        size_t n = strlen(s0);
        char buf[512];
        memcpy(buf, s0, n);
        int muts = 1 + (int)(x % 4);
        for (int m = 0; m < muts; m++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t pos = (size_t)(x % (n ? n : 1));
            int op = (int)((x >> 20) % 4);
            char ch = alphabet[(x >> 32) % (sizeof alphabet - 1)];
            if (op == 0 && n > 0) buf[pos] = ch;                                   /* replace */
            else if (op == 1 && n + 1 < sizeof buf) {                              /* insert */
                memmove(buf + pos + 1, buf + pos, n - pos);
                buf[pos] = ch;
                n++;
            } else if (op == 2 && n > 0) {                                         /* delete */
                memmove(buf + pos, buf + pos + 1, n - pos - 1);
                n--;
            } else n = pos;                                                        /* truncate */
        }
        struct api_completion rq;
        struct api_error e;
        int rc = api_parse_completion(buf, n, &LIM, &rq, &e);
        if (rc == 0) {
            int all_ids = 1;
            for (int i = 0; i < rq.n_prompts; i++) all_ids &= rq.prompts[i].ids != NULL;
            if (all_ids) rc = api_check_lengths(&rq, &LIM, &e);
        }
        api_completion_free(&rq);
        if (rc == 0) {
            ok++;
            continue;
        }
        bad++;
        ASSERT_MSG(e.status == 400 || e.status == 404, "status %d for %.*s", e.status, (int)n, buf);
        char *j = api_error_json(&e);
        cJSON *o = cJSON_Parse(j);
        ASSERT_MSG(o, "error JSON does not parse: %s", j);
        cJSON_Delete(o);
        free(j);
    }
    ASSERT(ok > 0 && bad > 0);
}
