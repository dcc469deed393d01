/* sampler.h — turning one row of logits into the next token, on the host.
 *
 * Order of the transformations (vLLM's): logit_bias -> repetition penalty
 * (tokens of prompt and output: positive logits / r, negative * r) ->
 * presence and frequency penalties (output tokens: - presence - frequency *
 * count) -> temperature (0: greedy, argmax of the processed logits, lowest id
 * on ties) -> min_p (drop p < min_p * p_max) -> top_k -> top_p (smallest set of
 * most likely tokens whose renormalised mass reaches top_p) -> draw.
 *
 * Randomness: the uniform draw for output token i of a request is a hash of
 * (seed, i) — it does not depend on what else is in the batch, on the thread,
 * or on earlier draws, so the same seed gives the same tokens.
 *
 * Logprobs: by default `logprob` and the top-N alternatives are the RAW model
 * logprobs (log_softmax of the logits as given, before bias, penalties and
 * temperature) — what vLLM returns by default. With logprobs_processed they
 * are the log_softmax of the processed logits (after bias, penalties and
 * temperature, before the top-k / top-p / min-p masks; greedy: temperature 1)
 * — vLLM's "processed_logprobs" mode.
 *
 * Usage:
 *     struct sampler s;  sampler_init(&s, vocab);
 *     struct sampling_params p;  sampling_params_default(&p);  p.temperature = 0.7f;
 *     struct sample_result r;
 *     sampler_sample(&s, &p, logits, prompt, n_prompt, out, n_out, &r);
 *     sampler_free(&s);
 *
 * Thread safety: a struct sampler is scratch memory for one thread at a time;
 * use one per thread. */
#ifndef AWQD_SAMPLER_H
#define AWQD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLER_MAX_LOGPROBS 20

struct logit_bias {
    int32_t token;
    float bias;                   /* added to the logit; -INFINITY bans the token */
};

struct sampling_params {
    float temperature;            /* 0: greedy */
    int top_k;                    /* <= 0: off */
    float top_p;                  /* 1: off; in (0, 1] */
    float min_p;                  /* 0: off; in [0, 1] */
    float repetition_penalty;     /* 1: off; > 0 */
    float presence_penalty;       /* 0: off */
    float frequency_penalty;      /* 0: off */
    const struct logit_bias *logit_bias; /* [n_logit_bias], ids outside the vocab ignored */
    int n_logit_bias;
    uint64_t seed;                /* the request's seed (server: random when unset) */
    int n_logprobs;               /* top-N alternatives wanted, 0..SAMPLER_MAX_LOGPROBS;
                                     -1: no logprobs at all (saves a pass over the vocab) */
    int logprobs_processed;       /* 0: raw model logprobs (default); 1: processed */
};

struct sample_result {
    int32_t token;
    float logprob;                /* logprob of `token` (NAN when n_logprobs < 0) */
    int n_top;                    /* = n_logprobs */
    int32_t top_ids[SAMPLER_MAX_LOGPROBS];   /* most likely first (raw logits) */
    float top_logprobs[SAMPLER_MAX_LOGPROBS];
};

struct sampler {
    int vocab;
    float *work;                  /* [vocab] processed logits, then probabilities */
    int32_t *cand;                /* [vocab] candidate ids */
    int32_t *counts;              /* [vocab] output token counts (kept all zero between calls) */
    uint8_t *seen;                /* [vocab] token in prompt or output (kept zero) */
    float *proc;                  /* [vocab] processed logits / T (logprobs_processed) */
};

void sampling_params_default(struct sampling_params *p);
/* -EINVAL with a message naming the field when a value is out of range. */
int sampling_params_check(const struct sampling_params *p, char *err, size_t errlen);

int sampler_init(struct sampler *s, int vocab);  /* 0 / -ENOMEM / -EINVAL */
void sampler_free(struct sampler *s);

/* Samples output token number n_output (0-based) of a request.
 * logits: fp32 [vocab] (not modified); prompt [n_prompt] and output
 * [n_output] feed the penalties (ids outside the vocab ignored). */
int sampler_sample(struct sampler *s, const struct sampling_params *p, const float *logits,
                   const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                   struct sample_result *res);

/* Logprob of `token` and the top n_top (<= SAMPLER_MAX_LOGPROBS) under
 * log_softmax(logits[vocab]) into res (token, logprob, n_top, top_*): for
 * prompt logprobs (echo), where nothing is sampled. */
void sampler_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                      struct sample_result *res);

/* The uniform draw in [0, 1) used for (seed, index); exposed for tests. */
double sampler_uniform(uint64_t seed, uint64_t index);

#endif
