/* sampler.c — logits processing and seeded sampling on the host. */
#include "engine/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"

void sampling_params_default(struct sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

int sampling_params_check(const struct sampling_params *p, char *err, size_t errlen) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return util_err(err, errlen, -EINVAL, "temperature must be >= 0, got %g", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return util_err(err, errlen, -EINVAL, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return util_err(err, errlen, -EINVAL, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
        return util_err(err, errlen, -EINVAL, "repetition_penalty must be > 0, got %g",
                        p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return util_err(err, errlen, -EINVAL, "presence/frequency_penalty must be finite");
    if (p->n_logprobs < -1 || p->n_logprobs > SAMPLER_MAX_LOGPROBS)
        return util_err(err, errlen, -EINVAL, "logprobs must be in [-1, %d], got %d",
                        SAMPLER_MAX_LOGPROBS, p->n_logprobs);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return util_err(err, errlen, -EINVAL, "bad logit_bias");
    return 0;
}

int sampler_init(struct sampler *s, int vocab) {
    memset(s, 0, sizeof *s);
    if (vocab < 1) return -EINVAL;
    s->vocab = vocab;
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->seen = calloc((size_t)vocab, 1);
    s->proc = malloc((size_t)vocab * sizeof *s->proc);
    if (!s->proc || !s->work || !s->cand || !s->counts || !s->seen) {
        sampler_free(s);
        return -ENOMEM;
    }
    return 0;
}

void sampler_free(struct sampler *s) {
    free(s->work);
    free(s->cand);
    free(s->counts);
    free(s->seen);
    free(s->proc);
    memset(s, 0, sizeof *s);
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double sampler_uniform(uint64_t seed, uint64_t index) {
    uint64_t h = splitmix64(splitmix64(seed) ^ splitmix64(index ^ 0x5851f42d4c957f2dull));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* qsort has no context argument in C11; qsort_r (glibc, _GNU_SOURCE) does. */
static int cmp_desc_r(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const float *w = ctx;
    if (w[x] > w[y]) return -1;
    if (w[x] < w[y]) return 1;
    return (x > y) - (x < y);
}

static void sort_cands(int32_t *c, int n, const float *w) {
    qsort_r(c, (size_t)n, sizeof *c, cmp_desc_r, (void *)w);
}

/* a ranks below b: lower w, or equal w and higher id */
static int worse(const float *w, int32_t a, int32_t b) {
    return w[a] < w[b] || (w[a] == w[b] && a > b);
}

static void sift_down(int32_t *h, int n, int i, const float *w) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(w, h[l], h[m])) m = l;
        if (r < n && worse(w, h[r], h[m])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Moves the k best of c[0..n) (by cmp_desc_r's order) to c[0..k), in heap
 * order; O(n log k). Returns k. */
static int select_top(int32_t *c, int n, int k, const float *w) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i, w); /* min-heap of the first k */
    for (int i = k; i < n; i++) {
        if (worse(w, c[0], c[i])) {
            c[0] = c[i];
            sift_down(c, k, 0, w);
        }
    }
    return k;
}

void sampler_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                      struct sample_result *res) {
    if (n_top > SAMPLER_MAX_LOGPROBS) n_top = SAMPLER_MAX_LOGPROBS;
    if (n_top < 0) n_top = 0;
    res->token = token;
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab && mx > -INFINITY; i++) sum += expf(logits[i] - mx);
    double lse = mx > -INFINITY ? mx + log(sum) : INFINITY; /* all -inf: every logprob -inf */
    res->logprob = (float)((double)logits[token] - lse);
    res->n_top = n_top;
    /* top N by insertion into a small sorted array (N <= 20) */
    int n = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float v = logits[i];
        if (n == n_top && !(v > logits[res->top_ids[n - 1]])) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > logits[res->top_ids[j - 1]]) {
            res->top_ids[j] = res->top_ids[j - 1];
            j--;
        }
        res->top_ids[j] = i;
    }
    for (int i = 0; i < n; i++) res->top_logprobs[i] = (float)((double)logits[res->top_ids[i]] - lse);
}

int sampler_sample(struct sampler *s, const struct sampling_params *p, const float *logits,
                   const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                   struct sample_result *res) {
    int V = s->vocab;
    float *w = s->work;
    memset(res, 0, sizeof *res);
    memcpy(w, logits, (size_t)V * sizeof *w);

    /* logit_bias */
    for (int i = 0; i < p->n_logit_bias; i++) {
        int t = p->logit_bias[i].token;
        if (t >= 0 && t < V) w[t] += p->logit_bias[i].bias;
    }
    /* penalties */
    int rep = p->repetition_penalty != 1.0f;
    int pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (rep || pf) {
        for (int i = 0; i < n_output; i++) {
            int t = output[i];
            if (t >= 0 && t < V) s->counts[t]++, s->seen[t] = 1;
        }
        if (rep)
            for (int i = 0; i < n_prompt; i++) {
                int t = prompt[i];
                if (t >= 0 && t < V) s->seen[t] = 1;
            }
        /* visit each distinct token once: prompt then output ids, clearing as we go */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++) {
                int t = ids[i];
                if (t < 0 || t >= V || !s->seen[t]) continue;
                if (rep) w[t] = w[t] > 0 ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
                if (pf && s->counts[t] > 0)
                    w[t] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
                s->seen[t] = 0;
                s->counts[t] = 0;
            }
        }
    }

    /* processed logprobs: log_softmax of the processed logits at T (T = 1
     * for greedy), before any mask */
    if (p->logprobs_processed && p->n_logprobs >= 0) {
        float t = p->temperature > 0.0f ? p->temperature : 1.0f;
        for (int i = 0; i < V; i++) s->proc[i] = w[i] / t;
    }

    int32_t token;
    if (p->temperature <= 0.0f) {
        /* greedy: argmax, lowest id on ties */
        token = 0;
        for (int i = 1; i < V; i++)
            if (w[i] > w[token]) token = i;
    } else {
        /* probabilities at temperature T */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (w[i] > mx) mx = w[i];
        if (mx == -INFINITY) { /* everything banned: fall back to the raw argmax */
            token = 0;
            for (int i = 1; i < V; i++)
                if (logits[i] > logits[token]) token = i;
            goto done;
        }
        float inv_t = 1.0f / p->temperature;
        double total = 0;
        for (int i = 0; i < V; i++) {
            w[i] = expf((w[i] - mx) * inv_t);
            total += w[i];
        }
        /* min_p relative to the most likely token (whose unnormalised p is 1) */
        float thresh = p->min_p > 0 ? p->min_p : 0.0f;
        /* candidates: all tokens above thresh with nonzero probability */
        int n = 0;
        double kept = 0;
        for (int i = 0; i < V; i++)
            if (w[i] > 0 && w[i] >= thresh) s->cand[n++] = i, kept += w[i];
        int need_sort = p->top_k > 0 && p->top_k < n;
        need_sort |= p->top_p < 1.0f;
        if (need_sort) {
            /* top_p only needs the tokens above a small cut when they already
             * hold top_p of the mass (they come first in sorted order) */
            if (p->top_p < 1.0f && !(p->top_k > 0 && p->top_k < n)) {
                float cut = (float)(1e-4 * total);
                int m = 0;
                double mass = 0;
                for (int i = 0; i < n; i++)
                    if (w[s->cand[i]] >= cut) mass += w[s->cand[i]], m++;
                if (mass >= p->top_p * kept && m > 0) {
                    int k = 0;
                    for (int i = 0; i < n; i++)
                        if (w[s->cand[i]] >= cut) s->cand[k++] = s->cand[i];
                    n = k; /* `kept` stays the full mass for the top_p test */
                }
            }
            if (p->top_k > 0 && p->top_k < n) {
                n = select_top(s->cand, n, p->top_k, w);
                kept = 0;
                for (int i = 0; i < n; i++) kept += w[s->cand[i]];
            }
            sort_cands(s->cand, n, w);
            if (p->top_p < 1.0f) {
                double cum = 0, target = p->top_p * kept;
                int k = 0;
                while (k < n) {
                    cum += w[s->cand[k++]];
                    if (cum >= target) break;
                }
                n = k;
            }
        }
        double mass = 0;
        for (int i = 0; i < n; i++) mass += w[s->cand[i]];
        double u = sampler_uniform(p->seed, (uint64_t)n_output) * mass, cum = 0;
        token = s->cand[n - 1];
        for (int i = 0; i < n; i++) {
            cum += w[s->cand[i]];
            if (u < cum) {
                token = s->cand[i];
                break;
            }
        }
    }
done:
    res->token = token;
    if (p->n_logprobs >= 0)
        sampler_logprobs(p->logprobs_processed ? s->proc : logits, V, token, p->n_logprobs, res);
    else
        res->logprob = NAN;
    return 0;
}
