/* sampler.c — logits processing and seeded sampling on the host. */
#include "engine/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"
#include "kernels/cpu/sample_cpu.h"

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
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    if (!s->prob || !s->work || !s->cand || !s->counts || !s->seen) {
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
    free(s->prob);
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

uint64_t sampler_race_key(uint64_t seed, uint64_t n_output) {
    return splitmix64(splitmix64(seed) ^ splitmix64(n_output ^ 0x5851f42d4c957f2dull));
}

double sampler_race_score(uint64_t key, int32_t id, float w, float inv_t) {
    return sample_race_score(key, id, w, inv_t);
}

void sampler_race_row(const struct sampling_params *p, int n_output, int32_t race[3]) {
    uint64_t key = sampler_race_key(p->seed, (uint64_t)n_output);
    race[0] = (int32_t)(uint32_t)key;
    race[1] = (int32_t)(uint32_t)(key >> 32);
    race[2] = p->temperature > 0.0f;
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

float sampler_inv_t(const struct sampling_params *p) {
    return p->temperature > 0.0f ? 1.0f / p->temperature : 1.0f;
}

int sampler_cands_needed(const struct sampling_params *p, int n_adj, int cap) {
    int need = 1;
    if (p->n_logprobs > 0) {
        need = p->n_logprobs;
        /* the raw top N can be pushed out of the w order by adjustments */
        if (n_adj > 0 && !p->logprobs_processed) need = cap;
    }
    if (p->temperature > 0.0f) {
        if (p->top_k > 0) need = need > p->top_k ? need : p->top_k;
        else if (p->top_p < 1.0f || p->min_p > 0) need = cap;
    }
    return need < cap ? need : cap;
}

/* The k best of c[0..n) (cmp_desc_r's order) sorted into c[0..k). */
static void sorted_prefix(int32_t *c, int n, int k, const float *w) {
    if (k >= n) {
        sort_cands(c, n, w);
        return;
    }
    select_top(c, n, k, w);
    sort_cands(c, k, w);
}

/* Processed logprobs: (w - mx) * inv_t - log(sum), top n_top by w. */
static void processed_logprobs(const float *w, int V, float mx, float inv_t, double sum,
                               int32_t token, int n_top, struct sample_result *res) {
    if (n_top > SAMPLER_MAX_LOGPROBS) n_top = SAMPLER_MAX_LOGPROBS;
    if (n_top < 0) n_top = 0;
    double ls = log(sum);
#define PLP(v) (mx > -INFINITY ? (float)((double)(((v) - mx) * inv_t) - ls) : -INFINITY)
    res->token = token;
    res->logprob = PLP(w[token]);
    res->n_top = n_top;
    int n = 0;
    for (int i = 0; i < V && n_top > 0; i++) {
        float v = w[i];
        if (n == n_top && !(v > w[res->top_ids[n - 1]])) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > w[res->top_ids[j - 1]]) {
            res->top_ids[j] = res->top_ids[j - 1];
            j--;
        }
        res->top_ids[j] = i;
    }
    for (int i = 0; i < n; i++) res->top_logprobs[i] = PLP(w[res->top_ids[i]]);
#undef PLP
}

int sampler_sample(struct sampler *s, const struct sampling_params *p, const float *logits,
                   const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                   struct sample_result *res) {
    int V = s->vocab;
    float *w = s->work, *prob = s->prob;
    int32_t *cand = s->cand;
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

    float inv_t = sampler_inv_t(p);
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (w[i] > mx) mx = w[i];
    double total = 0; /* sum of prob over the vocabulary, id order */
    int have_total = 0;
    int32_t token;
    if (p->temperature <= 0.0f) {
        /* greedy: argmax, lowest id on ties */
        token = 0;
        for (int i = 1; i < V; i++)
            if (w[i] > w[token]) token = i;
    } else if (mx == -INFINITY) {
        /* everything banned: fall back to the raw argmax */
        token = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[token]) token = i;
    } else {
        uint64_t key = sampler_race_key(p->seed, (uint64_t)n_output);
        int filt = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0;
        int n = 0;
        if (!filt) {
            /* every token with a finite w races (those whose expf term
             * underflows to 0 can never win: they trail by > 100) */
            for (int i = 0; i < V; i++) cand[i] = i;
            n = V;
        } else {
            for (int i = 0; i < V; i++) {
                prob[i] = expf((w[i] - mx) * inv_t);
                total += prob[i];
            }
            have_total = 1;
            /* min_p relative to the most likely token (whose unnormalised p is 1);
             * candidates: every token above it with nonzero probability */
            float thresh = p->min_p > 0 ? p->min_p : 0.0f;
            for (int i = 0; i < V; i++)
                if (prob[i] > 0 && prob[i] >= thresh) cand[n++] = i;
            int restricted = p->min_p > 0; /* sums over the kept set, in order */
            int sorted = 0;                /* cand[0..sorted) = the best, in order */
            if (p->top_k > 0 && p->top_k <= n) { /* (== n: the same set, summed in order) */
                if (p->top_p < 1.0f) sorted_prefix(cand, n, p->top_k, w);
                else select_top(cand, n, p->top_k, w); /* the set is enough: no order */
                n = p->top_k;
                sorted = p->top_p < 1.0f ? n : 0;
                restricted = 1;
            }
            if (p->top_p < 1.0f) {
                if (restricted && sorted < n) {
                    sort_cands(cand, n, w);
                    sorted = n;
                }
                double kept = 0;
                if (restricted)
                    for (int i = 0; i < n; i++) kept += prob[cand[i]];
                else
                    kept = total;
                /* the smallest prefix reaching top_p * kept: sorted only as far
                 * as needed (select the best 256, then 4x more, ...) */
                double cum = 0, target = p->top_p * kept;
                int k = 0;
                while (k < n) {
                    if (k >= sorted) {
                        int L = sorted ? sorted * 4 : 256;
                        if (L > n) L = n;
                        sorted_prefix(cand, n, L, w);
                        sorted = L;
                    }
                    cum += prob[cand[k++]];
                    if (cum >= target) break;
                }
                n = k;
            }
        }
        /* the race over cand[0..n): the highest score, lowest id on ties */
        token = -1;
        double best = -INFINITY;
        for (int i = 0; i < n; i++) {
            int32_t t = cand[i];
            if ((double)w[t] * (double)inv_t + SAMPLE_RACE_GMAX < best) continue; /* cannot win */
            double sc = sample_race_score(key, t, w[t], inv_t);
            if (sc > best || (sc == best && token >= 0 && sc > -INFINITY && t < token)) best = sc, token = t;
        }
        if (token < 0) { /* no finite w (a +inf bias): the raw argmax */
            token = 0;
            for (int i = 1; i < V; i++)
                if (logits[i] > logits[token]) token = i;
        }
    }
    res->token = token;
    if (p->n_logprobs < 0) {
        res->logprob = NAN;
    } else if (p->logprobs_processed) {
        if (!have_total && mx > -INFINITY)
            for (int i = 0; i < V; i++) total += expf((w[i] - mx) * inv_t);
        processed_logprobs(w, V, mx, inv_t, total, token, p->n_logprobs, res);
    } else {
        sampler_logprobs(logits, V, token, p->n_logprobs, res);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Candidates                                                               */
/* ------------------------------------------------------------------------ */


static double get_double(const float *src) {
    double d;
    memcpy(&d, src, sizeof d);
    return d;
}

void sampler_cands_merge(struct sample_cands *c, const float *const *rows, int tp, int k,
                         int vocab, float inv_t) {
    c->n = 0;
    c->complete = 0;
    c->adj = NULL;
    c->adj_raw = NULL;
    c->n_adj = 0;
    float mw = -INFINITY, mr = -INFINITY;
    for (int r = 0; r < tp; r++) {
        if (rows[r][0] > mw) mw = rows[r][0];
        if (rows[r][3] > mr) mr = rows[r][3];
    }
    double sw = 0, sr = 0;
    for (int r = 0; r < tp; r++) {
        if (rows[r][0] > -INFINITY) sw += get_double(rows[r] + 1) * (double)expf((rows[r][0] - mw) * inv_t);
        if (rows[r][3] > -INFINITY) sr += get_double(rows[r] + 4) * (double)expf(rows[r][3] - mr);
    }
    c->max_w = mw;
    c->max_raw = mr;
    /* the race: the highest score over the ranks, lowest id on ties */
    c->race_id = -1;
    c->race_score = -INFINITY;
    c->race_w = c->race_raw = -INFINITY;
    for (int r = 0; r < tp; r++) {
        int32_t id;
        memcpy(&id, rows[r] + 7, sizeof id);
        double sc = get_double(rows[r] + 8);
        if (id < 0) continue;
        if (c->race_id < 0 || sc > c->race_score || (sc == c->race_score && id < c->race_id)) {
            c->race_id = id;
            c->race_score = sc;
            c->race_w = rows[r][10];
            c->race_raw = rows[r][11];
        }
    }
    c->sum_w = sw;
    c->sum_raw = sr;
    int pos[64] = {0}, nv[64], total = 0;
    AWQD_ASSERT(tp >= 1 && tp <= 64 && k >= 1 && k <= SAMPLE_MAX_K);
    for (int r = 0; r < tp; r++) {
        memcpy(&nv[r], rows[r] + 6, sizeof nv[r]);
        AWQD_ASSERT(nv[r] >= 0 && nv[r] <= k);
        total += nv[r];
    }
    int want = total < k ? total : k;
    for (int i = 0; i < want; i++) {
        int best = -1;
        uint64_t bk = 0;
        for (int r = 0; r < tp; r++) {
            if (pos[r] >= nv[r]) continue;
            int32_t id;
            memcpy(&id, rows[r] + SAMPLE_HDR + 2 * k + pos[r], sizeof id);
            uint64_t key = sample_order_key(rows[r][SAMPLE_HDR + pos[r]], id);
            if (best < 0 || key > bk) best = r, bk = key;
        }
        const float *rr = rows[best];
        c->w[i] = rr[SAMPLE_HDR + pos[best]];
        c->raw[i] = rr[SAMPLE_HDR + k + pos[best]];
        memcpy(&c->ids[i], rr + SAMPLE_HDR + 2 * k + pos[best], sizeof c->ids[i]);
        pos[best]++;
    }
    c->n = want;
    c->complete = want == vocab;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* a before b in the logprobs order: value desc, then id asc */
static int lp_before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

int sampler_finish(const struct sampling_params *p, const struct sample_cands *c, int n_output,
                   struct sample_result *res) {
    int n = c->n;
    if (n < 1) return SAMPLER_NEED_FULL;
    float inv_t = sampler_inv_t(p);
    float prob[SAMPLE_MAX_K];
    int tj;                       /* the token's candidate index, -1: not a candidate */
    int32_t token;
    float tw, traw;               /* its w and raw logit */
    if (p->temperature <= 0.0f) {
        tj = 0;
        token = c->ids[0];
    } else {
        if (!(c->max_w > -INFINITY)) return SAMPLER_NEED_FULL; /* all banned: raw argmax */
        int filt = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0;
        int wj = -1; /* the backend's race winner among the candidates */
        for (int j = 0; j < n && c->race_id >= 0 && wj < 0; j++)
            if (c->ids[j] == c->race_id) wj = j;
        if (!filt) {
            /* every finite token races: the backend's winner is the token */
            if (c->race_id < 0) return SAMPLER_NEED_FULL;
            tj = wj;
            token = c->race_id;
        } else {
            /* The allowed set is a prefix of the candidates' order. known: it
             * is exactly the first nset candidates; else it contains them. */
            float thresh = p->min_p > 0 ? p->min_p : 0.0f;
            for (int j = 0; j < n; j++) prob[j] = expf((c->w[j] - c->max_w) * inv_t);
            int nc = 0; /* the kept set C is a prefix: prob falls along the list */
            while (nc < n && prob[nc] > 0 && prob[nc] >= thresh) nc++;
            int known = nc < n || c->complete; /* all of C is here */
            int restricted = p->min_p > 0, nset = nc;
            if (p->top_k > 0 && nc >= p->top_k) {
                nset = p->top_k;
                restricted = known = 1;
            } else if (p->top_k > 0 && !known) {
                restricted = 1; /* top_k may cut C beyond the candidates */
            }
            if (p->top_p < 1.0f) {
                double total = c->sum_w;
                if (known && !restricted) { /* C = every token with p > 0: the id-order sum */
                    int32_t ord[SAMPLE_MAX_K];
                    memcpy(ord, c->ids, sizeof(int32_t) * (size_t)nc);
                    qsort(ord, (size_t)nc, sizeof *ord, cmp_i32);
                    total = 0;
                    for (int i = 0; i < nc; i++)
                        for (int j = 0; j < nc; j++)
                            if (c->ids[j] == ord[i]) {
                                total += prob[j];
                                break;
                            }
                }
                /* kept: exact, or (restricted, not known) a lower bound, which
                 * gives a lower bound of the prefix */
                double kept = 0;
                if (restricted)
                    for (int j = 0; j < nset; j++) kept += prob[j];
                else
                    kept = total;
                double cum = 0, target = p->top_p * kept;
                int k = 0;
                while (k < nset) {
                    cum += prob[k++];
                    if (cum >= target) break;
                }
                if (cum >= target || known) {
                    nset = k;
                    if (!restricted) known = 1;
                }
            }
            if (wj >= 0 && wj < nset) { /* the overall winner is allowed: it wins */
                tj = wj;
            } else {
                if (!known) return SAMPLER_NEED_FULL;
                uint64_t key = sampler_race_key(p->seed, (uint64_t)n_output);
                double best = -INFINITY;
                tj = -1;
                for (int j = 0; j < nset; j++) {
                    double sc = sample_race_score(key, c->ids[j], c->w[j], inv_t);
                    if (sc > best || (sc == best && tj >= 0 && sc > -INFINITY && c->ids[j] < c->ids[tj]))
                        best = sc, tj = j;
                }
                if (tj < 0) return SAMPLER_NEED_FULL;
            }
            token = c->ids[tj];
        }
    }
    if (tj >= 0) {
        tw = c->w[tj];
        traw = c->raw[tj];
    } else {
        tw = c->race_w;
        traw = c->race_raw;
    }

    struct sample_result r;
    memset(&r, 0, sizeof r);
    r.token = token;
    if (p->n_logprobs < 0) {
        r.logprob = NAN;
        *res = r;
        return 0;
    }
    int N = p->n_logprobs > SAMPLER_MAX_LOGPROBS ? SAMPLER_MAX_LOGPROBS : p->n_logprobs;
    r.n_top = N;
    if (p->logprobs_processed) {
        /* the top N by w are the first N candidates */
        if (N > n && !c->complete) return SAMPLER_NEED_FULL;
        double ls = log(c->sum_w);
        float mx = c->max_w;
#define PLP(v) (mx > -INFINITY ? (float)((double)(((v) - mx) * inv_t) - ls) : -INFINITY)
        r.logprob = PLP(tw);
        for (int j = 0; j < N && j < n; j++) {
            r.top_ids[j] = c->ids[j];
            r.top_logprobs[j] = PLP(c->w[j]);
        }
#undef PLP
        *res = r;
        return 0;
    }
    double lse = c->max_raw > -INFINITY ? c->max_raw + log(c->sum_raw) : INFINITY;
    r.logprob = (float)((double)traw - lse);
    /* raw top N: the first N candidates the adjustments did not touch (their
     * raw order is the list's order), merged with the adjusted tokens */
    int nt = 0;
    for (int j = 0; j < n && nt < N; j++) {
        int adjusted = 0;
        for (int e = 0; e < c->n_adj && !adjusted; e++) adjusted = (c->adj[2 * e] >> 2) == c->ids[j];
        if (adjusted) continue;
        r.top_ids[nt] = c->ids[j];
        r.top_logprobs[nt] = c->raw[j]; /* raw for now */
        nt++;
    }
    if (nt < N && !c->complete) return SAMPLER_NEED_FULL;
    for (int e = 0; e < c->n_adj && N > 0; e++) {
        int32_t id = c->adj[2 * e] >> 2;
        if (e > 0 && (c->adj[2 * e - 2] >> 2) == id) continue;
        float v = c->adj_raw[e];
        if (nt == N && !lp_before(v, id, r.top_logprobs[nt - 1], r.top_ids[nt - 1])) continue;
        int j = nt < N ? nt++ : nt - 1;
        while (j > 0 && lp_before(v, id, r.top_logprobs[j - 1], r.top_ids[j - 1])) {
            r.top_ids[j] = r.top_ids[j - 1];
            r.top_logprobs[j] = r.top_logprobs[j - 1];
            j--;
        }
        r.top_ids[j] = id;
        r.top_logprobs[j] = v;
    }
    for (int j = 0; j < nt; j++) r.top_logprobs[j] = (float)((double)r.top_logprobs[j] - lse);
    *res = r;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* History and adjustments                                                  */
/* ------------------------------------------------------------------------ */

void sampler_hist_free(struct sampler_hist *h) {
    free(h->tok);
    free(h->cnt);
    memset(h, 0, sizeof *h);
}

int sampler_hist_add(struct sampler_hist *h, int32_t t, int is_output) {
    int lo = 0, hi = h->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (h->tok[mid] < t) lo = mid + 1;
        else hi = mid;
    }
    if (lo < h->n && h->tok[lo] == t) {
        if (is_output) h->cnt[lo]++;
        return 0;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 64;
        int32_t *a = realloc(h->tok, sizeof *a * (size_t)cap);
        if (!a) return -ENOMEM;
        h->tok = a;
        int32_t *b = realloc(h->cnt, sizeof *b * (size_t)cap);
        if (!b) return -ENOMEM;
        h->cnt = b;
        h->cap = cap;
    }
    memmove(h->tok + lo + 1, h->tok + lo, sizeof *h->tok * (size_t)(h->n - lo));
    memmove(h->cnt + lo + 1, h->cnt + lo, sizeof *h->cnt * (size_t)(h->n - lo));
    h->tok[lo] = t;
    h->cnt[lo] = is_output ? 1 : 0;
    h->n++;
    return 0;
}

int sampler_adj_max(const struct sampling_params *p, const struct sampler_hist *h) {
    return (p->n_logit_bias > 0 ? p->n_logit_bias : 0) + 2 * (h ? h->n : 0);
}

static void put_adj(int32_t *adj, int *n, int32_t tok, int op, float v) {
    adj[2 * *n] = tok * 4 + op;
    memcpy(&adj[2 * *n + 1], &v, sizeof v);
    (*n)++;
}

int sampler_adj_build(const struct sampling_params *p, const struct sampler_hist *h, int vocab,
                      int32_t *adj) {
    int nb = p->n_logit_bias > 0 ? p->n_logit_bias : 0;
    /* bias entries sorted by token, stable (insertion sort: lists are short) */
    int *ord = nb ? malloc(sizeof *ord * (size_t)nb) : NULL;
    if (nb && !ord) return -ENOMEM;
    int m = 0;
    for (int i = 0; i < nb; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t < 0 || t >= vocab) continue;
        int j = m++;
        while (j > 0 && p->logit_bias[ord[j - 1]].token > t) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    int rep = p->repetition_penalty != 1.0f;
    int pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    int hn = h && (rep || pf) ? h->n : 0;
    int n = 0, i = 0, j = 0;
    while (i < m || j < hn) {
        int32_t t;
        if (i < m && (j >= hn || p->logit_bias[ord[i]].token <= h->tok[j])) t = p->logit_bias[ord[i]].token;
        else t = h->tok[j];
        while (i < m && p->logit_bias[ord[i]].token == t) {
            put_adj(adj, &n, t, SAMPLE_ADJ_ADD, p->logit_bias[ord[i]].bias);
            i++;
        }
        while (j < hn && h->tok[j] < t) j++; /* (never: t is the smaller head) */
        if (j < hn && h->tok[j] == t) {
            if (t >= 0 && t < vocab) {
                if (rep) put_adj(adj, &n, t, SAMPLE_ADJ_REP, p->repetition_penalty);
                if (pf && h->cnt[j] > 0)
                    put_adj(adj, &n, t, SAMPLE_ADJ_SUB,
                            p->presence_penalty + p->frequency_penalty * (float)h->cnt[j]);
            }
            j++;
        }
    }
    free(ord);
    return n;
}
