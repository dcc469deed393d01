/* api.c — /v1/completions JSON in and out (see api.h). */
#include "server/api.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

int api_err(struct api_error *e, int status, const char *type, const char *param, const char *code,
            const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

char *api_error_json(const struct api_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    size_t ml;
    char *msg = api_utf8_sanitize(e->message, strlen(e->message), &ml);
    cJSON_AddStringToObject(o, "message", msg ? msg : "error");
    free(msg);
    cJSON_AddStringToObject(o, "type", e->type[0] ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

/* Length of the valid UTF-8 character at s (n bytes available), 0 if invalid
 * or incomplete. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) return 0;
    return len;
}

int api_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_char(p + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

char *api_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, j = 0;
    while (i < n) {
        size_t l = utf8_char(p + i, n - i);
        if (l && !(l == 1 && p[i] == 0)) {
            memcpy(o + j, p + i, l);
            j += l;
            i += l;
        } else {
            if (l == 1) { i++; continue; } /* NUL: dropped */
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i++;
        }
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}

/* ------------------------------------------------------------------------ */
/* Request parsing                                                          */
/* ------------------------------------------------------------------------ */

#define BAD(param, ...) api_err(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static const char *json_type(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "invalid";
}

/* A number field: absent or null keeps *out. Range [lo, hi] (lo exclusive
 * when lo_open). */
static int get_num(const cJSON *root, const char *key, double lo, double hi, int lo_open,
                   double *out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v))
        return BAD(key, "%s must be a number %s %g and %g, got %s", key,
                   lo_open ? "greater than" : "between", lo, hi, json_type(v));
    double x = v->valuedouble;
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
        return BAD(key, "%s must be %s %g and %g, got %.17g", key,
                   lo_open ? "greater than" : "between", lo, hi, x);
    *out = x;
    return 0;
}

static int get_int(const cJSON *root, const char *key, double lo, double hi, long long *out,
                   struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble))
        return BAD(key, "%s must be an integer between %.0f and %.0f, got %s", key, lo, hi,
                   cJSON_IsNumber(v) ? "a fraction" : json_type(v));
    double x = v->valuedouble;
    if (x < lo || x > hi)
        return BAD(key, "%s must be an integer between %.0f and %.0f, got %.0f", key, lo, hi, x);
    *out = (long long)x;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, int *out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return BAD(key, "%s must be true or false, got %s", key, json_type(v));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int is_int_value(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static int parse_id_list(const cJSON *arr, int vocab, struct api_prompt *p, const char *param,
                         struct api_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return BAD(param, "%s: the prompt is empty", param);
    p->ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!p->ids) return api_err(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        if (!is_int_value(t))
            return BAD(param, "%s[%d] must be a token id (an integer 0 to %d), got %s", param, i,
                       vocab - 1, cJSON_IsNumber(t) ? "a fraction" : json_type(t));
        if (t->valuedouble < 0 || t->valuedouble >= vocab)
            return BAD(param, "%s[%d] = %.0f is not a valid token id: allowed 0 to %d", param, i,
                       t->valuedouble, vocab - 1);
        p->ids[i++] = (int32_t)t->valuedouble;
    }
    p->n_ids = n;
    return 0;
}

static int parse_prompt(const cJSON *v, const struct api_limits *lim, struct api_completion *rq,
                        struct api_error *e) {
    if (!v || cJSON_IsNull(v))
        return BAD("prompt", "prompt is required: a string, a list of strings, a list of token "
                             "ids or a list of lists of token ids");
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return BAD("prompt", "prompt is empty");
        rq->prompts[0].text = strdup(v->valuestring);
        if (!rq->prompts[0].text) return api_err(e, 500, "server_error", NULL, NULL, "out of memory");
        rq->n_prompts = 1;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return BAD("prompt", "prompt must be a string, a list of strings, a list of token ids or "
                             "a list of lists of token ids, got %s", json_type(v));
    int n = cJSON_GetArraySize(v);
    if (n == 0) return BAD("prompt", "prompt is an empty list");
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(first)) {
        rq->n_prompts = 1;
        return parse_id_list(v, lim->vocab, &rq->prompts[0], "prompt", e);
    }
    if (n > API_MAX_PROMPTS)
        return BAD("prompt", "prompt lists %d prompts: at most %d per request", n, API_MAX_PROMPTS);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char param[32];
        snprintf(param, sizeof param, "prompt[%d]", i);
        if (cJSON_IsString(first)) {
            if (!cJSON_IsString(it))
                return BAD("prompt", "%s must be a string like prompt[0], got %s", param,
                           json_type(it));
            if (!it->valuestring[0]) return BAD("prompt", "%s is empty", param);
            rq->prompts[i].text = strdup(it->valuestring);
            if (!rq->prompts[i].text)
                return api_err(e, 500, "server_error", NULL, NULL, "out of memory");
        } else if (cJSON_IsArray(first)) {
            if (!cJSON_IsArray(it))
                return BAD("prompt", "%s must be a list of token ids like prompt[0], got %s",
                           param, json_type(it));
            rq->n_prompts = i + 1;
            if (parse_id_list(it, lim->vocab, &rq->prompts[i], param, e)) {
                snprintf(e->param, sizeof e->param, "prompt");
                return -EINVAL;
            }
        } else {
            return BAD("prompt", "prompt must be a string, a list of strings, a list of token "
                                 "ids or a list of lists of token ids; prompt[0] is %s",
                       json_type(first));
        }
        i++;
        rq->n_prompts = i;
    }
    return 0;
}

static int parse_stop(const cJSON *v, struct api_completion *rq, struct api_error *e) {
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *one = NULL;
    int n;
    if (cJSON_IsString(v)) {
        one = v;
        n = 1;
    } else if (cJSON_IsArray(v)) {
        n = cJSON_GetArraySize(v);
        if (n > ENGINE_MAX_STOP)
            return BAD("stop", "stop lists %d strings: at most %d", n, ENGINE_MAX_STOP);
    } else {
        return BAD("stop", "stop must be a string or a list of up to %d strings, got %s",
                   ENGINE_MAX_STOP, json_type(v));
    }
    for (int i = 0; i < n; i++) {
        const cJSON *s = one ? one : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s))
            return BAD("stop", "stop[%d] must be a string, got %s", i, json_type(s));
        size_t l = strlen(s->valuestring);
        if (l == 0) return BAD("stop", "stop strings must not be empty");
        if (l > ENGINE_MAX_STOP_LEN)
            return BAD("stop", "stop strings are at most %d bytes, got %zu", ENGINE_MAX_STOP_LEN,
                       l);
        memcpy(rq->stop_buf[i], s->valuestring, l + 1);
        rq->params.stop[i] = rq->stop_buf[i];
    }
    rq->params.n_stop = n;
    return 0;
}

static int parse_logit_bias(const cJSON *v, int vocab, struct api_completion *rq,
                            struct api_error *e) {
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v))
        return BAD("logit_bias", "logit_bias must be an object mapping token ids to numbers "
                                 "between -100 and 100, got %s", json_type(v));
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (n >= ENGINE_MAX_LOGIT_BIAS)
            return BAD("logit_bias", "logit_bias has more than %d entries", ENGINE_MAX_LOGIT_BIAS);
        char *end;
        const char *k = it->string ? it->string : "";
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= vocab)
            return BAD("logit_bias", "logit_bias key \"%.40s\" is not a token id (0 to %d)", k,
                       vocab - 1);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100)
            return BAD("logit_bias", "logit_bias[\"%ld\"] must be a number between -100 and 100",
                       id);
        rq->bias_ids[n] = (int32_t)id;
        rq->bias_vals[n] = (float)it->valuedouble;
        n++;
    }
    rq->params.n_logit_bias = n;
    rq->params.logit_bias_ids = rq->bias_ids;
    rq->params.logit_bias_vals = rq->bias_vals;
    return 0;
}

static int parse_stop_ids(const cJSON *v, int vocab, struct api_completion *rq,
                          struct api_error *e) {
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v))
        return BAD("stop_token_ids", "stop_token_ids must be a list of token ids, got %s",
                   json_type(v));
    int n = cJSON_GetArraySize(v);
    if (n > ENGINE_MAX_STOP_IDS)
        return BAD("stop_token_ids", "stop_token_ids lists %d ids: at most %d", n,
                   ENGINE_MAX_STOP_IDS);
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(v, i);
        if (!is_int_value(t) || t->valuedouble < 0 || t->valuedouble >= vocab)
            return BAD("stop_token_ids", "stop_token_ids[%d] must be a token id 0 to %d", i,
                       vocab - 1);
        rq->stop_ids[i] = (int32_t)t->valuedouble;
    }
    rq->params.n_stop_ids = n;
    rq->params.stop_ids = rq->stop_ids;
    return 0;
}

int api_parse_completion(const char *body, size_t len, const struct api_limits *lim,
                         struct api_completion *rq, struct api_error *e) {
    memset(rq, 0, sizeof *rq);
    memset(e, 0, sizeof *e);
    struct engine_request *p = &rq->params;
    p->n = 1;
    p->max_tokens = 16;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->repetition_penalty = 1.0f;
    p->logprobs = -1;
    p->skip_special_tokens = 1;
    rq->logprobs = -1;

    if (len == 0) return BAD(NULL, "the request body is empty: send a JSON object");
    if (!api_utf8_valid(body, len)) return BAD(NULL, "the request body is not valid UTF-8");
    if (memchr(body, 0, len)) return BAD(NULL, "the request body contains a NUL byte");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= body && at <= body + len ? (long)(at - body) : -1;
        return BAD(NULL, "the request body is not valid JSON (error near byte %ld)", off);
    }
    int rc = -EINVAL;
    if (!cJSON_IsObject(root)) {
        BAD(NULL, "the request body must be a JSON object, got %s", json_type(root));
        goto out;
    }
    /* trailing garbage after the object */
    if (end) {
        while (end < body + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
            end++;
        if (end < body + len) {
            BAD(NULL, "the request body has data after the JSON object (byte %ld)",
                (long)(end - body));
            goto out;
        }
    }

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!model || cJSON_IsNull(model)) {
        BAD("model", "model is required (GET /v1/models lists \"%s\")", lim->model_name);
        goto out;
    }
    if (!cJSON_IsString(model)) {
        BAD("model", "model must be a string, got %s", json_type(model));
        goto out;
    }
    if (strcmp(model->valuestring, lim->model_name) != 0) {
        api_err(e, 404, "invalid_request_error", "model", "model_not_found",
                "The model `%.200s` does not exist. This server serves `%.200s`.",
                model->valuestring, lim->model_name);
        goto out;
    }
    snprintf(rq->model, sizeof rq->model, "%s", model->valuestring);

    /* unsupported OpenAI fields */
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(root, "best_of");
    if (bo && !cJSON_IsNull(bo) && !(is_int_value(bo) && bo->valuedouble == 1)) {
        BAD("best_of", "best_of is not supported by this server (only 1 or null)");
        goto out;
    }
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (sfx && !cJSON_IsNull(sfx) && !(cJSON_IsString(sfx) && !sfx->valuestring[0])) {
        BAD("suffix", "suffix is not supported by this server (insertion needs a fill-in-the-"
                      "middle model)");
        goto out;
    }

    if (parse_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), lim, rq, e)) goto out;

    long long ll;
    double d;
    if (get_bool(root, "echo", &rq->echo, e)) goto out;
    ll = p->max_tokens;
    if (get_int(root, "max_tokens", rq->echo ? 0 : 1, lim->max_model_len, &ll, e)) goto out;
    p->max_tokens = (int)ll;
    d = p->temperature;
    if (get_num(root, "temperature", 0, 2, 0, &d, e)) goto out;
    p->temperature = (float)d;
    d = p->top_p;
    if (get_num(root, "top_p", 0, 1, 1, &d, e)) goto out;
    p->top_p = (float)d;
    ll = 1;
    if (get_int(root, "n", 1, ENGINE_MAX_N, &ll, e)) goto out;
    p->n = (int)ll;
    if (p->n * rq->n_prompts > API_MAX_CHOICES) {
        BAD("n", "n (%d) x prompts (%d) is more than %d choices", p->n, rq->n_prompts,
            API_MAX_CHOICES);
        goto out;
    }
    if (get_bool(root, "stream", &rq->stream, e)) goto out;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            BAD("stream_options", "stream_options must be an object, got %s", json_type(so));
            goto out;
        }
        if (!rq->stream) {
            BAD("stream_options", "stream_options is only allowed when stream is true");
            goto out;
        }
        if (get_bool(so, "include_usage", &rq->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            goto out;
        }
    }
    ll = -1;
    if (get_int(root, "logprobs", 0, ENGINE_MAX_LOGPROBS, &ll, e)) goto out;
    rq->logprobs = (int)ll;
    p->logprobs = rq->logprobs;
    p->prompt_logprobs = rq->echo && rq->logprobs >= 0;
    if (parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), rq, e)) goto out;
    d = 0;
    if (get_num(root, "presence_penalty", -2, 2, 0, &d, e)) goto out;
    p->presence_penalty = (float)d;
    d = 0;
    if (get_num(root, "frequency_penalty", -2, 2, 0, &d, e)) goto out;
    p->frequency_penalty = (float)d;
    if (parse_logit_bias(cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), lim->vocab, rq, e))
        goto out;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        if (!is_int_value(seed) || fabs(seed->valuedouble) > 9007199254740992.0) {
            BAD("seed", "seed must be an integer (|seed| <= 2^53), got %s",
                cJSON_IsNumber(seed) ? "a fraction or a huge number" : json_type(seed));
            goto out;
        }
        p->has_seed = 1;
        p->seed = (uint64_t)(int64_t)seed->valuedouble;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user)) {
        if (!cJSON_IsString(user)) {
            BAD("user", "user must be a string, got %s", json_type(user));
            goto out;
        }
        snprintf(rq->user, sizeof rq->user, "%s", user->valuestring);
    }
    /* extensions */
    ll = 0;
    if (get_int(root, "top_k", -1, 1 << 30, &ll, e)) goto out;
    p->top_k = ll < 0 ? 0 : (int)ll;
    d = 0;
    if (get_num(root, "min_p", 0, 1, 0, &d, e)) goto out;
    p->min_p = (float)d;
    d = 1;
    if (get_num(root, "repetition_penalty", 0, 2, 1, &d, e)) goto out;
    p->repetition_penalty = (float)d;
    if (get_bool(root, "ignore_eos", &p->ignore_eos, e)) goto out;
    ll = 0;
    if (get_int(root, "min_tokens", 0, p->max_tokens, &ll, e)) goto out;
    p->min_tokens = (int)ll;
    if (parse_stop_ids(cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids"), lim->vocab, rq, e))
        goto out;
    if (get_bool(root, "skip_special_tokens", &p->skip_special_tokens, e)) goto out;
    if (get_bool(root, "include_stop_str_in_output", &p->include_stop_str_in_output, e)) goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int api_check_lengths(const struct api_completion *rq, const struct api_limits *lim,
                      struct api_error *e) {
    for (int i = 0; i < rq->n_prompts; i++) {
        const struct api_prompt *p = &rq->prompts[i];
        if (p->n_ids <= 0) {
            if (rq->n_prompts > 1) return BAD("prompt", "prompt[%d] is empty after tokenization", i);
            return BAD("prompt", "prompt is empty after tokenization");
        }
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] < 0 || p->ids[k] >= lim->vocab)
                return BAD("prompt", "token id %d at position %d is out of range 0 to %d",
                           p->ids[k], k, lim->vocab - 1);
        long total = (long)p->n_ids + rq->params.max_tokens;
        if (total > lim->max_model_len)
            return api_err(e, 400, "invalid_request_error", "prompt", "context_length_exceeded",
                           "This model's maximum context length is %d tokens. However, you "
                           "requested %ld tokens (%d in the prompt, %d for the completion). "
                           "Please reduce the prompt or max_tokens.",
                           lim->max_model_len, total, p->n_ids, rq->params.max_tokens);
    }
    return 0;
}

void api_completion_free(struct api_completion *rq) {
    for (int i = 0; i < API_MAX_PROMPTS; i++) {
        free(rq->prompts[i].text);
        free(rq->prompts[i].ids);
        rq->prompts[i].text = NULL;
        rq->prompts[i].ids = NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* Output                                                                   */
/* ------------------------------------------------------------------------ */

int api_choice_append_text(struct api_choice *ch, const char *s, size_t n) {
    if (ch->text_len + n + 1 > ch->text_cap) {
        size_t cap = ch->text_cap ? ch->text_cap * 2 : 256;
        while (cap < ch->text_len + n + 1) cap *= 2;
        char *t = realloc(ch->text, cap);
        if (!t) return -ENOMEM;
        ch->text = t;
        ch->text_cap = cap;
    }
    memcpy(ch->text + ch->text_len, s, n);
    ch->text_len += n;
    ch->text[ch->text_len] = 0;
    return 0;
}

int api_choice_append_tokens(struct api_choice *ch, const struct engine_token *t, int n,
                             int is_prompt) {
    if (ch->n_toks + n > ch->cap_toks) {
        int cap = ch->cap_toks ? ch->cap_toks * 2 : 32;
        while (cap < ch->n_toks + n) cap *= 2;
        struct engine_token *nt = realloc(ch->toks, sizeof *nt * (size_t)cap);
        if (!nt) return -ENOMEM;
        ch->toks = nt;
        ch->cap_toks = cap;
    }
    memcpy(ch->toks + ch->n_toks, t, sizeof *t * (size_t)n);
    ch->n_toks += n;
    if (is_prompt) ch->n_prompt_toks += n;
    return 0;
}

void api_choice_free(struct api_choice *ch) {
    free(ch->text);
    free(ch->toks);
    memset(ch, 0, sizeof *ch);
}

const char *api_finish_reason(enum engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_NONE: return NULL;
    default: return "stop";
    }
}

static cJSON *lp_number(double x) {
    if (!isfinite(x)) return x < 0 ? cJSON_CreateNumber(-9999.0) : cJSON_CreateNull();
    return cJSON_CreateNumber(x);
}

/* The logprobs object for toks[0..n). */
static cJSON *logprobs_json(const struct engine_token *toks, int n, size_t *text_offset,
                            api_token_text_fn tt, void *tt_ud) {
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(o, "text_offset");
    char buf[512];
    for (int i = 0; i < n; i++) {
        const struct engine_token *t = &toks[i];
        const char *s = tt(tt_ud, t->id, buf, sizeof buf);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)*text_offset));
        *text_offset += strlen(s);
        if (isnan(t->logprob)) {
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(tlp, lp_number(t->logprob));
        cJSON *m = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            char b2[512];
            const char *ks = tt(tt_ud, t->top_ids[k], b2, sizeof b2);
            if (!cJSON_GetObjectItemCaseSensitive(m, ks))
                cJSON_AddItemToObject(m, ks, lp_number(t->top_logprobs[k]));
        }
        cJSON_AddItemToArray(top, m);
    }
    return o;
}

static cJSON *head(const char *id, long created, const char *model) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

static cJSON *usage_json(int prompt_tokens, int completion_tokens) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens + completion_tokens);
    return u;
}

char *api_format_completion(const char *id, long created, const char *model,
                            const struct api_choice *choices, int n_choices, int logprobs,
                            int prompt_tokens, int completion_tokens, api_token_text_fn tt,
                            void *tt_ud) {
    cJSON *o = head(id, created, model);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < n_choices; i++) {
        const struct api_choice *ch = &choices[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "text", ch->text ? ch->text : "");
        cJSON_AddNumberToObject(c, "index", i);
        if (logprobs >= 0) {
            size_t off = 0;
            cJSON_AddItemToObject(c, "logprobs", logprobs_json(ch->toks, ch->n_toks, &off, tt, tt_ud));
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        const char *fr = api_finish_reason(ch->finish);
        if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(arr, c);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(prompt_tokens, completion_tokens));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *sse(cJSON *o) {
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) return NULL;
    size_t n = strlen(j);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, j, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    cJSON_free(j);
    return s;
}

char *api_format_chunk(const char *id, long created, const char *model, int index,
                       const char *text, size_t text_len, const struct engine_token *toks,
                       int n_toks, int logprobs, size_t *text_offset, enum engine_finish finish,
                       api_token_text_fn tt, void *tt_ud) {
    cJSON *o = head(id, created, model);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    char *t = malloc(text_len + 1);
    if (t) {
        memcpy(t, text ? text : "", text_len);
        t[text_len] = 0;
    }
    cJSON_AddStringToObject(c, "text", t ? t : "");
    free(t);
    cJSON_AddNumberToObject(c, "index", index);
    if (logprobs >= 0 && n_toks > 0)
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(toks, n_toks, text_offset, tt, tt_ud));
    else
        cJSON_AddNullToObject(c, "logprobs");
    const char *fr = api_finish_reason(finish);
    if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(arr, c);
    return sse(o);
}

char *api_format_usage_chunk(const char *id, long created, const char *model,
                             int prompt_tokens, int completion_tokens) {
    cJSON *o = head(id, created, model);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(prompt_tokens, completion_tokens));
    return sse(o);
}
