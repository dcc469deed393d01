/* api.h — the OpenAI /v1/completions wire format: JSON in (parse + validate
 * into a typed request), JSON out (responses, SSE chunks, errors). Pure
 * functions over memory: no sockets, no engine calls, so they are unit-tested
 * on their own (tests/test_api_unit.c).
 *
 *     struct api_completion rq; struct api_error ae;
 *     if (api_parse_completion(body, len, &lim, &rq, &ae)) -> answer ae.status with
 *         api_error_json(&ae)
 *     ... tokenize the text prompts (rq.prompts[i].text -> .ids) ...
 *     api_check_lengths(&rq, &lim, &ae)
 *     ... rq.params is the engine_request template (prompt filled per prompt) ...
 *     api_completion_free(&rq);
 *
 * Thread safety: all functions are reentrant. */
#ifndef AWQD_API_H
#define AWQD_API_H

#include "engine/engine.h"

#include <stddef.h>
#include <stdint.h>

#define API_MAX_PROMPTS 64      /* prompts per request */
#define API_MAX_CHOICES 128     /* prompts x n */

struct api_error {
    int status;                 /* HTTP status */
    char type[40];              /* "invalid_request_error", "authentication_error", ... */
    char param[64];             /* the field at fault, "" = null */
    char code[48];              /* "" = null */
    char message[512];
};

struct api_limits {
    const char *model_name;     /* the served name; other names: 404 */
    int vocab;                  /* ids must be < vocab */
    int max_model_len;          /* prompt + max_tokens <= this */
};

struct api_prompt {
    char *text;                 /* text prompt (NULL when given as ids) */
    int32_t *ids;               /* token ids (given, or after tokenization) */
    int n_ids;
};

struct api_completion {
    char model[256];
    int n_prompts;
    struct api_prompt prompts[API_MAX_PROMPTS];
    int stream;
    int include_usage;          /* stream_options.include_usage */
    int echo;
    int logprobs;               /* -1 = null */
    char user[256];
    /* template for every prompt (prompt/n_prompt/ud filled later); its
     * pointers refer to the storage below */
    struct engine_request params;
    char stop_buf[ENGINE_MAX_STOP][ENGINE_MAX_STOP_LEN + 1];
    int32_t stop_ids[ENGINE_MAX_STOP_IDS];
    int32_t bias_ids[ENGINE_MAX_LOGIT_BIAS];
    float bias_vals[ENGINE_MAX_LOGIT_BIAS];
};

/* Sets *e (status, type "invalid_request_error", param, message) and returns -EINVAL. */
int api_err(struct api_error *e, int status, const char *type, const char *param, const char *code,
            const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* {"error":{"message","type","param","code"}} — malloc'd, caller frees. */
char *api_error_json(const struct api_error *e);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int api_utf8_valid(const char *s, size_t n);

/* Parses and validates a /v1/completions body. 0, or -EINVAL with *e set
 * (400 naming the field and the allowed range; 404 unknown model). Token-id
 * prompts are range-checked here; text prompts are left for tokenization. */
int api_parse_completion(const char *body, size_t len, const struct api_limits *lim,
                         struct api_completion *rq, struct api_error *e);
/* After tokenization: every prompt non-empty, prompt + max_tokens within the
 * context (the message gives the numbers), ids < vocab. */
int api_check_lengths(const struct api_completion *rq, const struct api_limits *lim,
                      struct api_error *e);
void api_completion_free(struct api_completion *rq);

/* ---- output --------------------------------------------------------------- */

/* Token text for logprobs (valid UTF-8, written into buf). */
typedef const char *(*api_token_text_fn)(void *ud, int32_t id, char *buf, size_t len);

/* The accumulated result of one choice. */
struct api_choice {
    char *text;                 /* valid UTF-8 */
    size_t text_len, text_cap;
    struct engine_token *toks;  /* with logprobs: every token (prompt first when echo) */
    int n_toks, cap_toks;
    int n_prompt_toks;          /* of toks, how many are prompt tokens */
    enum engine_finish finish;
    int completion_tokens;
    size_t text_offset;         /* running text_offset for the next token */
};

int api_choice_append_text(struct api_choice *ch, const char *s, size_t n);
int api_choice_append_tokens(struct api_choice *ch, const struct engine_token *t, int n,
                             int is_prompt);
void api_choice_free(struct api_choice *ch);

/* "stop" / "length" (cancelled and error read "stop" / "length" never leak). */
const char *api_finish_reason(enum engine_finish f);

/* Non-streaming answer: the whole object. choices[n_choices] in index order.
 * logprobs: -1 for null. Returns malloc'd JSON. */
char *api_format_completion(const char *id, long created, const char *model,
                            const struct api_choice *choices, int n_choices, int logprobs,
                            int prompt_tokens, int completion_tokens, api_token_text_fn tt,
                            void *tt_ud);

/* One SSE event "data: {...}\n\n" for a streamed choice: text delta and the
 * tokens it covers (logprobs >= 0: a logprobs object for them; text_offset is
 * taken from and advanced in *text_offset), finish NONE for null. */
char *api_format_chunk(const char *id, long created, const char *model, int index,
                       const char *text, size_t text_len, const struct engine_token *toks,
                       int n_toks, int logprobs, size_t *text_offset, enum engine_finish finish,
                       api_token_text_fn tt, void *tt_ud);
/* The usage chunk ("choices": []) of stream_options.include_usage. */
char *api_format_usage_chunk(const char *id, long created, const char *model,
                             int prompt_tokens, int completion_tokens);

/* Replaces invalid UTF-8 in s[0..n) with U+FFFD; malloc'd, NUL-terminated. */
char *api_utf8_sanitize(const char *s, size_t n, size_t *out_len);

#endif
