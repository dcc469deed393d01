/* test_sampler.c — the sampler on synthetic logits: greedy, temperature,
 * top-k / top-p / min-p masks, penalties, logit_bias, seeds, logprobs, and
 * the draw (the exponential race: its definition, a chi-square fit). The candidate
 * path (sampler_finish) is checked against this reference in
 * test_sample_cands.c. */
#include "tests/harness/test.h"

#include <math.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "kernels/cpu/sample_cpu.h"

#define N_DRAWS 20000

/* Draws N_DRAWS tokens with seeds 0..N-1 and checks the frequencies against
 * the expected distribution want[vocab] (0 = must never appear). */
static void check_dist(const struct sampling_params *p0, const float *logits, int vocab,
                       const int32_t *prompt, int np, const int32_t *out, int no,
                       const double *want) {
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, vocab), 0);
    int *cnt = calloc((size_t)vocab, sizeof *cnt);
    struct sampling_params p = *p0;
    for (int i = 0; i < N_DRAWS; i++) {
        struct sample_result r;
        p.seed = (uint64_t)i * 7919u + 1;
        ASSERT_EQ_INT(sampler_sample(&s, &p, logits, prompt, np, out, no, &r), 0);
        ASSERT(r.token >= 0 && r.token < vocab);
        cnt[r.token]++;
    }
    for (int t = 0; t < vocab; t++) {
        double f = (double)cnt[t] / N_DRAWS;
        if (want[t] == 0) {
            ASSERT_MSG(cnt[t] == 0, "token %d drawn %d times, should be masked", t, cnt[t]);
        } else {
            double tol = 5 * sqrt(want[t] * (1 - want[t]) / N_DRAWS) + 1e-3;
            ASSERT_MSG(fabs(f - want[t]) <= tol, "token %d: frequency %.4f, expected %.4f", t, f,
                       want[t]);
        }
    }
    free(cnt);
    sampler_free(&s);
}

/* softmax(l / T) restricted to mask (NULL: all), renormalised */
static void softmax_masked(const float *l, int n, double T, const int *mask, double *out) {
    double mx = -1e30, sum = 0;
    for (int i = 0; i < n; i++)
        if ((!mask || mask[i]) && l[i] > mx) mx = l[i];
    for (int i = 0; i < n; i++) {
        out[i] = (!mask || mask[i]) ? exp((l[i] - mx) / T) : 0;
        sum += out[i];
    }
    for (int i = 0; i < n; i++) out[i] /= sum;
}

static const float L6[6] = {2.0f, 1.5f, 1.0f, 0.2f, -0.5f, -3.0f};

TEST(sampler, greedy_is_argmax_lowest_id_on_ties) {
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, 5), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    float l[5] = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
    struct sample_result r;
    for (uint64_t seed = 0; seed < 5; seed++) {
        p.seed = seed;
        ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, &r), 0);
        ASSERT_EQ_INT(r.token, 1);
    }
    sampler_free(&s);
}

TEST(sampler, temperature_distribution) {
    struct sampling_params p;
    sampling_params_default(&p);
    double want[6];
    softmax_masked(L6, 6, 1.0, NULL, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
    ASSERT_OK_SO_FAR();
    p.temperature = 0.5f;
    softmax_masked(L6, 6, 0.5, NULL, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
    ASSERT_OK_SO_FAR();
    p.temperature = 2.0f;
    softmax_masked(L6, 6, 2.0, NULL, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
}

TEST(sampler, top_k_large_vocab_is_the_k_best) {
    /* heap selection on a large vocabulary with ties: exactly the k best (ties
     * broken towards lower ids), and n_logprobs -1 computes no logprob */
    enum { V = 20000, K = 37 };
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7919) % 1000) / 100.0f; /* many ties */
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_k = K;
    p.temperature = 50.0f; /* nearly flat: every kept token gets drawn */
    p.n_logprobs = -1;
    /* the K best: value 9.99 has 20 ids, 9.98 the next 20: keep all of 9.99 and the
     * 17 lowest ids of 9.98 */
    int *hit = calloc(V, sizeof *hit);
    for (int i = 0; i < 1000; i++) {
        struct sample_result r;
        p.seed = (uint64_t)i;
        ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, &r), 0);
        ASSERT(isnan(r.logprob));
        hit[r.token]++;
    }
    int n999 = 0, n998 = 0, distinct = 0, max998 = -1, min_excluded998 = V;
    for (int i = 0; i < V; i++) {
        int v = (i * 7919) % 1000;
        if (v == 998 && !hit[i] && i < min_excluded998) min_excluded998 = i;
        if (!hit[i]) continue;
        distinct++;
        ASSERT_MSG(v >= 998, "token %d (value %d) is not among the %d best", i, v, K);
        if (v == 999) n999++;
        else n998++, max998 = i > max998 ? i : max998;
    }
    ASSERT_EQ_INT(distinct, K);
    ASSERT_EQ_INT(n999, 20);
    ASSERT_EQ_INT(n998, 17);
    ASSERT(max998 < min_excluded998);
    free(hit);
    free(l);
    sampler_free(&s);
}

TEST(sampler, top_k_mask) {
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_k = 3;
    int mask[6] = {1, 1, 1, 0, 0, 0};
    double want[6];
    softmax_masked(L6, 6, 1.0, mask, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
    ASSERT_OK_SO_FAR();
    p.top_k = 1; /* top_k 1 == greedy */
    int m1[6] = {1, 0, 0, 0, 0, 0};
    softmax_masked(L6, 6, 1.0, m1, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
}

TEST(sampler, top_p_mask) {
    /* probabilities 0.5 0.3 0.15 0.05 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: keep two */
    double want[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    check_dist(&p, l, 4, NULL, 0, NULL, 0, want);
    ASSERT_OK_SO_FAR();
    p.top_p = 0.9f; /* keep three */
    double w3[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    check_dist(&p, l, 4, NULL, 0, NULL, 0, w3);
    ASSERT_OK_SO_FAR();
    /* top_k then top_p on the renormalised top-k mass: top_k 2 -> 0.625, 0.375;
     * top_p 0.6 keeps only the first */
    p.top_k = 2;
    p.top_p = 0.6f;
    double w1[4] = {1, 0, 0, 0};
    check_dist(&p, l, 4, NULL, 0, NULL, 0, w1);
}

TEST(sampler, top_p_large_vocab_matches_full_sort) {
    /* a long tail of tiny probabilities exercises the cut-off shortcut */
    enum { V = 5000 };
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = -0.002f * i;
    double *want = calloc(V, sizeof *want);
    double *all = malloc(V * sizeof *all);
    softmax_masked(l, V, 1.0, NULL, all);
    double cum = 0;
    int k = 0;
    while (k < V) {
        cum += all[k++];
        if (cum >= 0.5) break;
    }
    for (int i = 0; i < k; i++) want[i] = all[i] / cum;
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_p = 0.5f;
    /* check masks only (the per-token frequencies are too small to test) */
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    int below = 0;
    for (int i = 0; i < 2000; i++) {
        struct sample_result r;
        p.seed = (uint64_t)i;
        ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, &r), 0);
        ASSERT_MSG(r.token < k, "token %d outside the nucleus of %d", r.token, k);
        below += r.token < k / 2;
    }
    /* about 58% of the nucleus mass lies in its first half */
    double half = 0;
    for (int i = 0; i < k / 2; i++) half += want[i];
    ASSERT_NEAR(below / 2000.0, half, 0.045);
    sampler_free(&s);
    free(l);
    free(want);
    free(all);
}

TEST(sampler, min_p_mask) {
    struct sampling_params p;
    sampling_params_default(&p);
    p.min_p = 0.3f; /* keep p >= 0.3 * p_max: exp(l - 2) >= 0.3 -> l >= 0.796 */
    int mask[6] = {1, 1, 1, 0, 0, 0};
    double want[6];
    softmax_masked(L6, 6, 1.0, mask, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
}

TEST(sampler, penalties) {
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, 3), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    struct sample_result r;
    /* repetition: positive logits are divided */
    float a[3] = {2.0f, 1.9f, 0.0f};
    int32_t out0[1] = {0};
    ASSERT_EQ_INT(sampler_sample(&s, &p, a, NULL, 0, out0, 1, &r), 0);
    ASSERT_EQ_INT(r.token, 0);
    p.repetition_penalty = 1.2f;
    ASSERT_EQ_INT(sampler_sample(&s, &p, a, NULL, 0, out0, 1, &r), 0);
    ASSERT_EQ_INT(r.token, 1);
    /* ... negative ones multiplied; prompt tokens count too */
    float b[3] = {-1.0f, -1.1f, -5.0f};
    ASSERT_EQ_INT(sampler_sample(&s, &p, b, out0, 1, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.token, 1);
    p.repetition_penalty = 1.0f;
    /* frequency: minus count * f on output tokens only */
    float c[3] = {1.0f, 0.5f, 0.0f};
    int32_t out00[2] = {0, 0};
    p.frequency_penalty = 0.3f;
    ASSERT_EQ_INT(sampler_sample(&s, &p, c, NULL, 0, out00, 2, &r), 0);
    ASSERT_EQ_INT(r.token, 1); /* 1 - 0.6 < 0.5 */
    ASSERT_EQ_INT(sampler_sample(&s, &p, c, out00, 2, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.token, 0); /* prompt tokens do not count */
    p.frequency_penalty = 0;
    p.presence_penalty = 0.3f;
    ASSERT_EQ_INT(sampler_sample(&s, &p, c, NULL, 0, out00, 2, &r), 0);
    ASSERT_EQ_INT(r.token, 0); /* 1 - 0.3 > 0.5 */
    p.presence_penalty = 0.6f;
    ASSERT_EQ_INT(sampler_sample(&s, &p, c, NULL, 0, out00, 2, &r), 0);
    ASSERT_EQ_INT(r.token, 1);
    /* the scratch state is clean afterwards: no penalty without history */
    p.presence_penalty = 0;
    ASSERT_EQ_INT(sampler_sample(&s, &p, c, NULL, 0, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.token, 0);
    sampler_free(&s);

    /* frequency penalty reshapes the sampled distribution exactly */
    sampling_params_default(&p);
    p.frequency_penalty = 0.5f;
    int32_t hist[3] = {0, 0, 1};
    float pen[6];
    for (int i = 0; i < 6; i++) pen[i] = L6[i];
    pen[0] -= 1.0f;
    pen[1] -= 0.5f;
    double want[6];
    softmax_masked(pen, 6, 1.0, NULL, want);
    check_dist(&p, L6, 6, NULL, 0, hist, 3, want);
}

TEST(sampler, logit_bias) {
    struct sampling_params p;
    sampling_params_default(&p);
    struct logit_bias lb[3] = {{0, -INFINITY}, {4, 3.0f}, {99, 5.0f} /* out of vocab: ignored */};
    p.logit_bias = lb;
    p.n_logit_bias = 3;
    float biased[6];
    for (int i = 0; i < 6; i++) biased[i] = L6[i];
    biased[4] += 3.0f;
    int mask[6] = {0, 1, 1, 1, 1, 1};
    double want[6];
    softmax_masked(biased, 6, 1.0, mask, want);
    check_dist(&p, L6, 6, NULL, 0, NULL, 0, want);
    ASSERT_OK_SO_FAR();
    /* greedy honours the bias too, and logprobs stay raw */
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, 6), 0);
    p.temperature = 0;
    struct sample_result r;
    ASSERT_EQ_INT(sampler_sample(&s, &p, L6, NULL, 0, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.token, 4);
    double raw[6];
    softmax_masked(L6, 6, 1.0, NULL, raw);
    ASSERT_NEAR(r.logprob, log(raw[4]), 1e-5);
    sampler_free(&s);
}

TEST(sampler, seeds_reproduce_independent_of_other_calls) {
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = sinf((float)i) * 2;
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p, q;
    sampling_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 1234;
    q = p;
    q.seed = 999;
    int32_t a[32], b[32], other[32];
    for (int i = 0; i < 32; i++) { /* alone */
        struct sample_result r;
        sampler_sample(&s, &p, l, NULL, 0, a, i, &r);
        a[i] = r.token;
    }
    for (int i = 0; i < 32; i++) { /* interleaved with another request */
        struct sample_result r;
        sampler_sample(&s, &q, l, NULL, 0, other, i, &r);
        other[i] = r.token;
        sampler_sample(&s, &p, l, NULL, 0, b, i, &r);
        b[i] = r.token;
    }
    int diff_other = 0;
    for (int i = 0; i < 32; i++) {
        ASSERT_EQ_INT(a[i], b[i]);
        diff_other += a[i] != other[i];
    }
    ASSERT(diff_other > 0); /* another seed gives another sequence */
    ASSERT(sampler_uniform(1, 0) != sampler_uniform(1, 1));
    ASSERT(sampler_uniform(1, 0) != sampler_uniform(2, 0));
    ASSERT(sampler_uniform(5, 5) == sampler_uniform(5, 5));
    sampler_free(&s);
}

TEST(sampler, logprobs_consistent) {
    enum { V = 12 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = cosf((float)i * 1.3f) * 3;
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0.7f;
    p.n_logprobs = V;
    p.seed = 3;
    struct sample_result r;
    ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.n_top, V);
    double sum = 0;
    int found = 0;
    for (int i = 0; i < V; i++) {
        sum += exp(r.top_logprobs[i]);
        if (i) ASSERT(r.top_logprobs[i] <= r.top_logprobs[i - 1]);
        ASSERT_NEAR(r.top_logprobs[i] - r.top_logprobs[0], l[r.top_ids[i]] - l[r.top_ids[0]], 1e-5);
        if (r.top_ids[i] == r.token) {
            found = 1;
            ASSERT_NEAR(r.top_logprobs[i], r.logprob, 1e-6);
        }
    }
    ASSERT(found);
    ASSERT_NEAR(sum, 1.0, 1e-5); /* raw logprobs: temperature does not enter */
    p.n_logprobs = 3;
    ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, &r), 0);
    ASSERT_EQ_INT(r.n_top, 3);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    ASSERT_EQ_INT(r.top_ids[0], best);
    sampler_free(&s);
}

TEST(sampler, params_check) {
    struct sampling_params p;
    sampling_params_default(&p);
    char err[128];
    ASSERT_EQ_INT(sampling_params_check(&p, err, sizeof err), 0);
    p.top_p = 0;
    ASSERT(sampling_params_check(&p, err, sizeof err) < 0);
    ASSERT_CONTAINS(err, "top_p");
    sampling_params_default(&p);
    p.temperature = -1;
    ASSERT(sampling_params_check(&p, err, sizeof err) < 0);
    ASSERT_CONTAINS(err, "temperature");
    sampling_params_default(&p);
    p.n_logprobs = SAMPLER_MAX_LOGPROBS + 1;
    ASSERT(sampling_params_check(&p, err, sizeof err) < 0);
    p.n_logprobs = -1; /* none */
    ASSERT_EQ_INT(sampling_params_check(&p, err, sizeof err), 0);
    p.n_logprobs = -2;
    ASSERT(sampling_params_check(&p, err, sizeof err) < 0);
}

TEST(sampler, processed_logprobs_and_prompt_logprobs) {
    enum { V = 6 };
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0.5f;
    p.top_k = 2; /* masks do not enter processed logprobs */
    p.n_logprobs = V;
    p.logprobs_processed = 1;
    struct logit_bias lb = {3, 1.0f};
    p.logit_bias = &lb;
    p.n_logit_bias = 1;
    p.seed = 11;
    struct sample_result r;
    ASSERT_EQ_INT(sampler_sample(&s, &p, L6, NULL, 0, NULL, 0, &r), 0);
    float proc[V];
    for (int i = 0; i < V; i++) proc[i] = (L6[i] + (i == 3 ? 1.0f : 0.0f)) / 0.5f;
    double want[V];
    softmax_masked(proc, V, 1.0, NULL, want);
    for (int i = 0; i < V; i++) ASSERT_NEAR(r.top_logprobs[i], log(want[r.top_ids[i]]), 1e-5);
    ASSERT_NEAR(r.logprob, log(want[r.token]), 1e-5);
    /* prompt logprobs: plain log_softmax, any token */
    struct sample_result q;
    sampler_logprobs(L6, V, 5, 2, &q);
    softmax_masked(L6, V, 1.0, NULL, want);
    ASSERT_EQ_INT(q.token, 5);
    ASSERT_NEAR(q.logprob, log(want[5]), 1e-5);
    ASSERT_EQ_INT(q.n_top, 2);
    ASSERT_EQ_INT(q.top_ids[0], 0);
    ASSERT_EQ_INT(q.top_ids[1], 1);
    sampler_free(&s);
}

TEST(sampler, draw_is_the_exponential_race) {
    /* the draw for (seed, n_output) is the argmax over the allowed tokens of
     * (double)w * inv_t - log(-log(u(key, id))), lowest id on equal scores */
    enum { V = 6 };
    const float l[V] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0.9f;
    p.n_logprobs = -1;
    float it = sampler_inv_t(&p);
    int32_t out3[3] = {0, 0, 0};
    for (uint64_t seed = 0; seed < 200; seed++) {
        p.seed = seed;
        uint64_t key = sampler_race_key(seed, 3);
        int want = -1;
        double best = -INFINITY;
        for (int i = 0; i < V; i++) {
            double u = sample_race_uniform(key, i);
            ASSERT(u > 0 && u < 1);
            double sc = (double)l[i] * (double)it - log(-log(u));
            ASSERT(sc == sampler_race_score(key, i, l[i], it));
            if (sc > best) best = sc, want = i;
        }
        struct sample_result r;
        ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, out3, 3, &r), 0);
        ASSERT_MSG(r.token == want, "seed %llu: token %d, race gives %d", (unsigned long long)seed,
                   r.token, want);
        /* top_k 2 keeps {1, 3} (the tie at 2.0): the race over those two */
        p.top_k = 2;
        ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, out3, 3, &r), 0);
        double s1 = sampler_race_score(key, 1, l[1], it), s3 = sampler_race_score(key, 3, l[3], it);
        ASSERT_EQ_INT(r.token, s3 > s1 ? 3 : 1);
        p.top_k = 0;
    }
    sampler_free(&s);
    /* a wider, peaked row (the host prunes tokens that cannot win: the
     * brute-force argmax must agree) */
    enum { W = 3000 };
    float *lw = malloc(sizeof(float) * W);
    for (int i = 0; i < W; i++) lw[i] = (float)((i * 7919 % 1000) / 25.0 - 20.0); /* -20..20, ties */
    ASSERT_EQ_INT(sampler_init(&s, W), 0);
    for (uint64_t seed = 0; seed < 40; seed++) {
        p.seed = seed;
        p.temperature = (const float[]){0.3f, 1.0f, 4.0f, 25.0f}[seed % 4];
        it = sampler_inv_t(&p);
        uint64_t key = sampler_race_key(seed, 3);
        int want = -1;
        double best = -INFINITY;
        for (int i = 0; i < W; i++) {
            double sc = sampler_race_score(key, i, lw[i], it);
            if (sc > best) best = sc, want = i;
        }
        struct sample_result r;
        ASSERT_EQ_INT(sampler_sample(&s, &p, lw, NULL, 0, out3, 3, &r), 0);
        ASSERT_EQ_INT(r.token, want);
    }
    free(lw);
    /* the uniform's extremes stay inside (0, 1): g is always finite */
    ASSERT(sampler_race_score(0, 0, 1e30f, 1.0f) > 0 && isfinite(sampler_race_score(0, 0, 1e30f, 1.0f)));
    ASSERT(sampler_race_score(1, 2, INFINITY, 1.0f) == -INFINITY);
    ASSERT(sampler_race_score(1, 2, -INFINITY, 1.0f) == -INFINITY);
    sampler_free(&s);
}

/* Pearson's chi-square of counts[n] against probabilities want[n] (> 0). */
static double chi_square(const int *cnt, const double *want, int n, int draws) {
    double x2 = 0;
    for (int i = 0; i < n; i++) {
        double e = want[i] * draws;
        x2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    return x2;
}

TEST(sampler, race_chi_square) {
    /* one seed, output indices 0..N-1 (each its own race): the frequencies
     * fit softmax(l / T) (restricted by top_k / min_p) by Pearson's test at
     * p = 0.001 (fixed seed: deterministic) */
    enum { V = 10, N = 40000 };
    const float l[V] = {1.0f, 0.3f, -0.4f, 2.1f, 0.0f, 1.5f, -2.0f, 0.8f, 0.8f, -0.9f};
    const double crit[V] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.n_logprobs = -1;
    p.seed = 0x1234abcdull;
    const float temps[3] = {1.0f, 0.6f, 1.7f};
    for (int mode = 0; mode < 4 && !test_failed(); mode++) {
        p.temperature = temps[mode % 3];
        p.top_k = mode == 2 ? 4 : 0;
        p.min_p = mode == 3 ? 0.2f : 0.0f;
        /* the expected distribution over the kept tokens */
        double q[V], mx = -1e30, sum = 0;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        int keep[V], nk = 0;
        for (int i = 0; i < V; i++) {
            double pr = exp((l[i] - mx) / p.temperature);
            int rank = 0;
            for (int j = 0; j < V; j++) rank += l[j] > l[i] || (l[j] == l[i] && j < i);
            keep[i] = (p.top_k == 0 || rank < p.top_k) && pr >= p.min_p;
            q[i] = keep[i] ? pr : 0;
            sum += q[i];
            nk += keep[i];
        }
        int cnt[V] = {0};
        for (int n = 0; n < N; n++) {
            struct sample_result r;
            ASSERT_EQ_INT(sampler_sample(&s, &p, l, NULL, 0, NULL, n, &r), 0);
            cnt[r.token]++;
        }
        int ci[V];
        double cw[V];
        int m = 0;
        for (int i = 0; i < V; i++) {
            if (!keep[i]) {
                ASSERT_MSG(cnt[i] == 0, "mode %d: masked token %d drawn %d times", mode, i, cnt[i]);
                continue;
            }
            ci[m] = cnt[i];
            cw[m++] = q[i] / sum;
        }
        ASSERT(m == nk && m >= 2);
        double x2 = chi_square(ci, cw, m, N);
        ASSERT_MSG(x2 < crit[m - 1], "mode %d (T %g top_k %d min_p %g): chi-square %.2f >= %.2f (df %d)",
                   mode, p.temperature, p.top_k, p.min_p, x2, crit[m - 1], m - 1);
    }
    sampler_free(&s);
}
