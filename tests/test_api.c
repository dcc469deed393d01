/* test_api.c — malformed and hostile requests against a running daemon (CPU
 * backend, tiny model): each gets the right status and the OpenAI error shape
 * {"error":{"message","type","param","code"}}, and /health stays 200. */
#include "tests/test_server_util.h"

#include <cjson/cJSON.h>

/* The error body must be {"error":{"message": str, "type": str, "param", "code"}}. */
static void check_error_shape(const char *resp, const char *what) {
    cJSON *o = cJSON_Parse(su_body(resp));
    ASSERT_MSG(o, "%s: error body is not JSON: %.300s", what, resp);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    int ok = cJSON_IsObject(e) && cJSON_IsString(cJSON_GetObjectItem(e, "message")) &&
             cJSON_IsString(cJSON_GetObjectItem(e, "type")) && cJSON_GetObjectItem(e, "param") &&
             cJSON_GetObjectItem(e, "code");
    cJSON_Delete(o);
    ASSERT_MSG(ok, "%s: not the OpenAI error shape: %.300s", what, su_body(resp));
}

struct hostile {
    const char *what;
    int status;
    const char *body;      /* POST /v1/completions with this body (NULL: raw) */
    const char *raw;       /* a raw request instead */
    const char *must;      /* the message must contain this (NULL: any) */
};

/* %M in a body is replaced by the served model name. */
static const struct hostile CASES[] = {
    {"bad JSON", 400, "{\"model\":", NULL, "not valid JSON"},
    {"body is an array", 400, "[1,2,3]", NULL, "JSON object"},
    {"empty body", 400, "", NULL, "empty"},
    {"trailing garbage", 400, "{\"model\":\"%M\",\"prompt\":[1]}xyz", NULL, "after the JSON"},
    {"invalid UTF-8", 400, "{\"model\":\"%M\",\"prompt\":\"a\xc3\x28\"}", NULL, "UTF-8"},
    {"lone surrogate escape", 400, "{\"model\":\"%M\",\"prompt\":\"\\ud800\"}", NULL, NULL},
    {"model wrong type", 400, "{\"model\":7,\"prompt\":[1]}", NULL, "model must be a string"},
    {"model missing", 400, "{\"prompt\":[1]}", NULL, "model is required"},
    {"unknown model", 404, "{\"model\":\"gpt-5\",\"prompt\":[1]}", NULL, "does not exist"},
    {"prompt missing", 400, "{\"model\":\"%M\"}", NULL, "prompt is required"},
    {"empty prompt", 400, "{\"model\":\"%M\",\"prompt\":\"\"}", NULL, "empty"},
    {"empty prompt list", 400, "{\"model\":\"%M\",\"prompt\":[]}", NULL, "empty"},
    {"empty inner list", 400, "{\"model\":\"%M\",\"prompt\":[[1],[]]}", NULL, "empty"},
    {"prompt object", 400, "{\"model\":\"%M\",\"prompt\":{\"a\":1}}", NULL, "an object"},
    {"negative token id", 400, "{\"model\":\"%M\",\"prompt\":[1,-3]}", NULL, "not a valid token id"},
    {"token id past vocab", 400, "{\"model\":\"%M\",\"prompt\":[1,99999999]}", NULL, "not a valid token id"},
    {"fractional token id", 400, "{\"model\":\"%M\",\"prompt\":[1.5]}", NULL, "fraction"},
    {"mixed prompt list", 400, "{\"model\":\"%M\",\"prompt\":[[1],\"a\"]}", NULL, "prompt[1]"},
    {"prompt + max_tokens over the context", 400,
     "{\"model\":\"%M\",\"prompt\":[%L],\"max_tokens\":100}", NULL, "maximum context length is 256"},
    {"max_tokens 0", 400, "{\"model\":\"%M\",\"prompt\":[1],\"max_tokens\":0}", NULL, "max_tokens"},
    {"max_tokens negative", 400, "{\"model\":\"%M\",\"prompt\":[1],\"max_tokens\":-5}", NULL, "max_tokens"},
    {"max_tokens string", 400, "{\"model\":\"%M\",\"prompt\":[1],\"max_tokens\":\"9\"}", NULL, "max_tokens"},
    {"max_tokens huge", 400, "{\"model\":\"%M\",\"prompt\":[1],\"max_tokens\":1e400}", NULL, "max_tokens"},
    {"temperature negative", 400, "{\"model\":\"%M\",\"prompt\":[1],\"temperature\":-1}", NULL, "between 0 and 2"},
    {"temperature too high", 400, "{\"model\":\"%M\",\"prompt\":[1],\"temperature\":9}", NULL, "between 0 and 2"},
    {"top_p over 1", 400, "{\"model\":\"%M\",\"prompt\":[1],\"top_p\":1.5}", NULL, "top_p"},
    {"n zero", 400, "{\"model\":\"%M\",\"prompt\":[1],\"n\":0}", NULL, "between 1 and 16"},
    {"n huge", 400, "{\"model\":\"%M\",\"prompt\":[1],\"n\":1000}", NULL, "between 1 and 16"},
    {"logprobs too many", 400, "{\"model\":\"%M\",\"prompt\":[1],\"logprobs\":20}", NULL, "between 0 and 5"},
    {"five stop strings", 400, "{\"model\":\"%M\",\"prompt\":[1],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", NULL, "at most 4"},
    {"stop number", 400, "{\"model\":\"%M\",\"prompt\":[1],\"stop\":5}", NULL, "stop"},
    {"presence_penalty out of range", 400, "{\"model\":\"%M\",\"prompt\":[1],\"presence_penalty\":5}", NULL, "-2 and 2"},
    {"logit_bias bad key", 400, "{\"model\":\"%M\",\"prompt\":[1],\"logit_bias\":{\"abc\":1}}", NULL, "logit_bias"},
    {"logit_bias bad value", 400, "{\"model\":\"%M\",\"prompt\":[1],\"logit_bias\":{\"1\":500}}", NULL, "-100 and 100"},
    {"seed string", 400, "{\"model\":\"%M\",\"prompt\":[1],\"seed\":\"x\"}", NULL, "seed"},
    {"best_of", 400, "{\"model\":\"%M\",\"prompt\":[1],\"best_of\":3}", NULL, "best_of is not supported"},
    {"suffix", 400, "{\"model\":\"%M\",\"prompt\":[1],\"suffix\":\"end\"}", NULL, "suffix is not supported"},
    {"stream as string", 400, "{\"model\":\"%M\",\"prompt\":[1],\"stream\":\"yes\"}", NULL, "stream"},
    {"stream_options without stream", 400, "{\"model\":\"%M\",\"prompt\":[1],\"stream_options\":{\"include_usage\":true}}", NULL, "stream_options"},
    {"min_tokens over max_tokens", 400, "{\"model\":\"%M\",\"prompt\":[1],\"max_tokens\":4,\"min_tokens\":9}", NULL, "min_tokens"},
    {"stop_token_ids out of range", 400, "{\"model\":\"%M\",\"prompt\":[1],\"stop_token_ids\":[-1]}", NULL, "stop_token_ids"},
    {"top_k below -1", 400, "{\"model\":\"%M\",\"prompt\":[1],\"top_k\":-7}", NULL, "top_k"},
    {"deeply nested JSON", 400, "%N", NULL, NULL},
    {"oversized body", 413, "%B", NULL, NULL},
    {"wrong method", 405, NULL, "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL},
    {"unknown route", 404, NULL, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", NULL},
    {"malformed HTTP", 400, NULL, "POST /v1/completions HTTP/1.1\r\nContent-Length: zz\r\n\r\n", NULL},
    {"bad chunked body", 400, NULL, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", NULL},
    {"header block too large", 431, NULL, "%H", NULL},
    {"NUL in the body", 400, NULL, "%Z", NULL},
};

/* Builds the body / raw request of a case (malloc'd). */
static char *expand(const char *tmpl, const char *model, size_t *len) {
    size_t cap = strlen(tmpl) + 4096;
    if (strstr(tmpl, "%N")) cap += 300000;
    if (strstr(tmpl, "%B")) cap += 200000;
    if (strstr(tmpl, "%H")) cap += 40000;
    char *o = malloc(cap);
    size_t n = 0;
    for (const char *p = tmpl; *p; p++) {
        if (p[0] == '%' && p[1] == 'M') {
            n += (size_t)sprintf(o + n, "%s", model);
            p++;
        } else if (p[0] == '%' && p[1] == 'L') { /* 200 token ids */
            for (int i = 0; i < 200; i++) n += (size_t)sprintf(o + n, "%s%d", i ? "," : "", 1 + i % 50);
            p++;
        } else if (p[0] == '%' && p[1] == 'N') { /* 20000 nested arrays (cJSON refuses > 1000) */
            n += (size_t)sprintf(o + n, "{\"model\":\"%s\",\"prompt\":", model);
            for (int i = 0; i < 20000; i++) o[n++] = '[';
            for (int i = 0; i < 20000; i++) o[n++] = ']';
            o[n++] = '}';
            p++;
        } else if (p[0] == '%' && p[1] == 'B') { /* 150 kB body (limit 64 kB) */
            n += (size_t)sprintf(o + n, "{\"model\":\"%s\",\"prompt\":\"", model);
            memset(o + n, 'a', 150000);
            n += 150000;
            n += (size_t)sprintf(o + n, "\"}");
            p++;
        } else if (p[0] == '%' && p[1] == 'H') {
            n += (size_t)sprintf(o + n, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
            memset(o + n, 'h', 30000);
            n += 30000;
            n += (size_t)sprintf(o + n, "\r\n\r\n");
            p++;
        } else if (p[0] == '%' && p[1] == 'Z') {
            const char *b1 = "{\"model\":\"";
            char body[256];
            size_t bl = (size_t)snprintf(body, sizeof body, "%s%s\",\"prompt\":\"a", b1, model);
            body[bl++] = 0;
            bl += (size_t)sprintf(body + bl, "b\"}");
            n += (size_t)sprintf(o + n, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                        "Connection: close\r\nContent-Length: %zu\r\n\r\n", bl);
            memcpy(o + n, body, bl);
            n += bl;
            p++;
        } else {
            o[n++] = *p;
        }
    }
    o[n] = 0;
    *len = n;
    return o;
}

TEST(api, hostile_requests) {
    struct srv s;
    memset(&s, 0, sizeof s);
    if (su_make_model(&s)) TEST_SKIP("awqd mkmodel tiny is not available");
    ASSERT_MSG(su_start(&s, "--max-model-len 256 --max-body-bytes 65536 --max-header-bytes 8192") == 0,
               "daemon did not start (log %s)", s.log);
    int n_cases = (int)(sizeof CASES / sizeof CASES[0]);
    int failures = 0;
    for (int i = 0; i < n_cases; i++) {
        const struct hostile *h = &CASES[i];
        char *resp = NULL;
        size_t len;
        int st;
        if (h->body) {
            char *body = expand(h->body, s.name, &len);
            size_t cap = len + 512;
            char *raw = malloc(cap);
            int hn = snprintf(raw, cap, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                        "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
            memcpy(raw + hn, body, len);
            st = su_raw(s.port, raw, (size_t)hn + len, &resp, 30);
            free(raw);
            free(body);
        } else {
            char *raw = expand(h->raw, s.name, &len);
            st = su_raw(s.port, raw, len, &resp, 30);
            free(raw);
        }
        if (st != h->status) {
            fprintf(stderr, "    case \"%s\": status %d, want %d: %.300s\n", h->what, st, h->status,
                    resp);
            failures++;
        } else {
            check_error_shape(resp, h->what);
            if (test_failed()) { free(resp); break; }
            if (h->must && !strstr(su_body(resp), h->must)) {
                fprintf(stderr, "    case \"%s\": message lacks \"%s\": %.300s\n", h->what, h->must,
                        su_body(resp));
                failures++;
            }
        }
        free(resp);
        int hs = su_request(s.port, "GET", "/health", NULL, NULL, NULL);
        if (hs != 200) {
            fprintf(stderr, "    after \"%s\": /health = %d\n", h->what, hs);
            failures++;
            break;
        }
    }
    /* slow-loris: a header block that never ends -> 408 after request_timeout_s */
    /* (a separate daemon with a short timeout; see below) */
    ASSERT_MSG(failures == 0, "%d of %d hostile cases wrong", failures, n_cases);
    ASSERT_OK_SO_FAR();
    ASSERT(n_cases >= 40);
    /* nothing left behind */
    ASSERT_EQ_INT(su_wait_metric(s.port, "awqd:kv_cache_blocks_used", 0, 5), 0);
    ASSERT_EQ_INT(su_metric(s.port, "awqd:num_requests_running"), 0);
    /* and a valid request still works */
    char body[256], *resp = NULL;
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":[1,2,3],\"max_tokens\":3}", s.name);
    ASSERT_EQ_INT(su_request(s.port, "POST", "/v1/completions", NULL, body, &resp), 200);
    ASSERT_CONTAINS(resp, "\"object\":\"text_completion\"");
    free(resp);
    int rc = su_stop(&s, 20);
    if (rc != 0) su_print_log(&s);
    ASSERT_EQ_INT(rc, 0);
}

TEST(api, auth_and_slow_loris) {
    struct srv s;
    memset(&s, 0, sizeof s);
    if (su_make_model(&s)) TEST_SKIP("awqd mkmodel tiny is not available");
    char keyfile[700], extra[900];
    snprintf(keyfile, sizeof keyfile, "%s/key", test_tmpdir());
    FILE *f = fopen(keyfile, "w");
    ASSERT(f);
    fputs("s3cret-key\n", f);
    fclose(f);
    snprintf(extra, sizeof extra, "--api-key-file '%s' --request-timeout-s 1", keyfile);
    ASSERT_MSG(su_start(&s, extra) == 0, "daemon did not start (log %s)", s.log);
    char body[256], *resp = NULL;
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":[1,2],\"max_tokens\":2}", s.name);
    /* no key, wrong key, wrong scheme, a prefix of the key: 401 */
    const char *bad[] = {NULL, "Authorization: Bearer wrong\r\n", "Authorization: Basic s3cret-key\r\n",
                         "Authorization: Bearer s3cret\r\n", "Authorization: Bearer s3cret-key-x\r\n"};
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ_INT(su_request(s.port, "POST", "/v1/completions", bad[i], body, &resp), 401);
        check_error_shape(resp, "401");
        ASSERT_CONTAINS(resp, "invalid_api_key");
        free(resp);
        ASSERT_EQ_INT(su_request(s.port, "GET", "/v1/models", bad[i], NULL, NULL), 401);
    }
    ASSERT_EQ_INT(su_request(s.port, "POST", "/v1/completions", "Authorization: Bearer s3cret-key\r\n",
                             body, NULL), 200);
    ASSERT_EQ_INT(su_request(s.port, "GET", "/v1/models", "Authorization: Bearer s3cret-key\r\n", NULL,
                             NULL), 200);
    ASSERT_EQ_INT(su_request(s.port, "GET", "/health", NULL, NULL, NULL), 200);
    /* slow-loris: headers trickle in and never end */
    int fd = su_dial(s.port);
    su_send(fd, "POST /v1/completions HTTP/1.1\r\n", 31);
    double t0 = su_now();
    for (int i = 0; i < 30 && su_now() - t0 < 3; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "X-%d: y\r\n", i);
        if (su_send(fd, line, (size_t)n)) break;
        usleep(100000);
    }
    resp = su_recv(fd, NULL, 5);
    close(fd);
    ASSERT_CONTAINS(resp, "HTTP/1.1 408");
    check_error_shape(resp, "408");
    free(resp);
    ASSERT_EQ_INT(su_request(s.port, "GET", "/health", NULL, NULL, NULL), 200);
    ASSERT_EQ_INT(su_stop(&s, 20), 0);
}
