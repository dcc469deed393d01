/* sampler.h — turning one row of logits into the next token, on the host.
 *
 * Order of the transformations (vLLM's): logit_bias -> repetition penalty
 * (tokens of prompt and output: positive logits / r, negative * r) ->
 * presence and frequency penalties (output tokens: - presence - frequency *
 * count) -> temperature (0: greedy, argmax of the processed logits, lowest id
 * on ties) -> min_p (drop p < min_p * p_max) -> top_k -> top_p (smallest set of
 * most likely tokens whose renormalised mass reaches top_p) -> draw.
 *
 * Order of tokens (top_k, top_p): by processed logit w descending, then id
 * ascending. Probabilities p = expf((w - max w) / T) (fp32), sums in double:
 * over the whole vocabulary in id order when no mask applies (`total`), else
 * over the kept tokens in the order above. top_p keeps the smallest prefix
 * whose mass reaches top_p * kept.
 *
 * The draw: an exponential race (Gumbel-max). The token is the allowed token
 * with the highest score (double)w * inv_t - log(-log(u)), lowest id on equal
 * scores, u in (0, 1) a hash of (sampler_race_key(seed, n_output), token id)
 * (kernels/ops.h, sampling; sampler_race_score). Allowed: every finite w when
 * no filter applies, else the min_p / top_k / top_p set. This is an exact
 * sample of softmax(w / T) over the set; it depends only on (seed, n_output,
 * id) — not on the batch, the thread, earlier draws or where the race runs
 * (host over candidates, host over the full row, backend over the vocabulary:
 * identical except that CUDA's log may differ by 1 ulp, which can change a
 * winner only when two scores lie within ~1e-15 relative).
 *
 * Logprobs: by default `logprob` and the top-N alternatives are the RAW model
 * logprobs (log_softmax of the logits as given, before bias, penalties and
 * temperature) — what vLLM returns by default. With logprobs_processed they
 * are the log-probabilities of the processed logits at temperature T,
 * (w - max w) / T - log(sum of p) (before the top-k / top-p / min-p masks;
 * greedy: T = 1) — vLLM's "processed_logprobs" mode.
 *
 * Candidates (the GPU path): ops->sample_topk (kernels/ops.h) gives per row
 * the top-K tokens by w with w and raw values, the max / sum of exps of w and
 * of the raw logits, and the race winner over every finite w (per-row key
 * from sampler_race_row); sampler_cands_merge joins the tensor-parallel
 * ranks' lists (race: best score), sampler_finish completes the draw from
 * them. It returns the result sampler_sample would return, or
 * SAMPLER_NEED_FULL when the candidates do not decide it: a filtered set
 * (top_k > K, min_p / top_p keeping more than the candidates) reaching beyond
 * them while the overall race winner is not a candidate; top-N raw logprobs
 * pushed out of the candidates by adjustments; all tokens banned at T > 0; no
 * race winner. With no filter the token is the op's race winner: never a
 * fallback. Equality: on the CPU backend at tp = 1 everything is computed as
 * sampler_sample does, bit for bit; elsewhere (CUDA's expf / log and
 * summation order, tp > 1 merging) `total` differs by ~1e-7 relative, which
 * can move a top_p cut only when top_p * total lies within that of a
 * cumulative boundary, race scores by ~1 ulp, and logprobs by ~1e-6.
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

#include "kernels/ops.h"

#define SAMPLER_MAX_LOGPROBS 20
#define SAMPLER_NEED_FULL 1      /* sampler_finish: the candidates do not decide */

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
    float *work;                  /* [vocab] processed logits */
    int32_t *cand;                /* [vocab] candidate ids */
    int32_t *counts;              /* [vocab] output token counts (kept all zero between calls) */
    uint8_t *seen;                /* [vocab] token in prompt or output (kept zero) */
    float *prob;                  /* [vocab] expf((w - max) / T) */
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

/* A uniform in [0, 1) from (seed, index) (splitmix64; no longer used by the
 * draw, kept for tests and callers). */
double sampler_uniform(uint64_t seed, uint64_t index);

/* The race of output token n_output of a request with this seed: its key,
 * and each token's score (kernels/ops.h, sampling: (double)w * inv_t -
 * log(-log(u(key, id))); -inf when w is not finite). */
uint64_t sampler_race_key(uint64_t seed, uint64_t n_output);
double sampler_race_score(uint64_t key, int32_t id, float w, float inv_t);
/* The op's race triple (ops.h sample_batch.race) of a row: key low, key
 * high, and 1 when p samples (temperature > 0), 0 for greedy. */
void sampler_race_row(const struct sampling_params *p, int n_output, int32_t race[3]);

/* ------------------------------------------------------------------------ */
/* Candidates (ops->sample_topk)                                            */
/* ------------------------------------------------------------------------ */

/* One row's candidates, merged over the ranks. */
struct sample_cands {
    int n;                        /* candidates, best first (w desc, id asc) */
    int complete;                 /* 1: they are every token of the vocabulary */
    int32_t ids[SAMPLE_MAX_K];
    float w[SAMPLE_MAX_K];        /* processed logits (bias, penalties; before T) */
    float raw[SAMPLE_MAX_K];      /* raw logits */
    float max_w, max_raw;         /* over the vocabulary */
    double sum_w;                 /* sum of expf((w - max_w) * inv_t) (the row's inv_t) */
    double sum_raw;               /* sum of expf(raw - max_raw) */
    int32_t race_id;              /* the race winner over every finite w (-1: none / no race);
                                     valid only for the key sampler_finish is called with
                                     (sampler_race_key(p->seed, n_output)): set it to -1
                                     when the op raced with another key */
    double race_score;            /* its score */
    float race_w, race_raw;       /* its w and raw logit */
    /* the row's adjustments as given to the op, and the raw logit of each
     * entry's token (for the raw top-N when adjustments moved tokens) */
    const int32_t *adj;           /* [2 * n_adj] */
    const float *adj_raw;         /* [n_adj] */
    int n_adj;
};

/* The 1 / T the op must be given for p: 1 / temperature, 1 for greedy. */
float sampler_inv_t(const struct sampling_params *p);

/* How many candidates (1..cap) a row with p and n_adj adjustment entries
 * needs so that sampler_finish usually decides it: 1 for greedy and for an
 * unfiltered draw (the op's race winner is the token), n_logprobs for the
 * alternatives, top_k when it is the only cut, cap for top_p / min_p (their
 * set's size depends on the row) and for raw logprobs of an adjusted row.
 * Any count is exact: too few only sends the row to the full-row path. */
int sampler_cands_needed(const struct sampling_params *p, int n_adj, int cap);

/* Fills c (ids, values, stats; adj fields left NULL / 0) from the rows the op
 * wrote on each rank: rank_rows[r] = rank r's SAMPLE_ROW_FLOATS(k) floats. */
void sampler_cands_merge(struct sample_cands *c, const float *const *rank_rows, int tp, int k,
                         int vocab, float inv_t);

/* Output token number n_output from candidates: 0 with res as sampler_sample
 * would fill it, or SAMPLER_NEED_FULL (res untouched). */
int sampler_finish(const struct sampling_params *p, const struct sample_cands *c, int n_output,
                   struct sample_result *res);

/* Token history of one sequence for the penalties, kept incrementally:
 * distinct tokens ascending, each with its count in the output (0: prompt
 * only). */
struct sampler_hist {
    int32_t *tok;                 /* [n] ascending */
    int32_t *cnt;                 /* [n] */
    int n, cap;
};
void sampler_hist_free(struct sampler_hist *h);   /* and zeroes it */
int sampler_hist_add(struct sampler_hist *h, int32_t token, int is_output); /* 0 / -ENOMEM */

/* Most adjustment entries sampler_adj_build writes for p and h (h may be NULL). */
int sampler_adj_max(const struct sampling_params *p, const struct sampler_hist *h);
/* The row's adjustments for ops->sample_topk (kernels/ops.h: 2 int32 per
 * entry, grouped by token in application order): p's logit_bias, then the
 * repetition penalty on every history token, then presence + frequency *
 * count on output tokens — what sampler_sample applies for the prompt and
 * output that built h. Ids outside [0, vocab) are dropped. Returns the count. */
int sampler_adj_build(const struct sampling_params *p, const struct sampler_hist *h, int vocab,
                      int32_t *adj);

#endif
