/* model_fixture.h — the three fixture checkpoints of ../shared/fixtures and
 * their Hugging Face references, run through a model_group the way the
 * scheduler would. Shared by tests/test_model.c, tests/test_tp.c and
 * tests/gpu/test_model_cuda.c (linked into both test binaries).
 *
 *     struct mt_fixture f;
 *     if (mt_fixture_open("qwen3-tiny-awq", &f) == 1) TEST_SKIP("...");
 *     struct model_group *g;
 *     if (mt_group(&f, "cpu", 1, 64, 256, &g)) ...;
 *     struct mt_result r;
 *     mt_run(g, &f, 64, NULL, 256, &r);
 *     mt_check_reference(&f, &r);
 *     mt_result_free(&r); model_group_free(g); mt_fixture_close(&f);
 *
 * Failures are reported with test_fail (the caller checks test_failed()). */
#ifndef AWQD_TEST_MODEL_FIXTURE_H
#define AWQD_TEST_MODEL_FIXTURE_H

#include <stdint.h>

#include "engine/model.h"
#include "engine/safetensors.h"

#define MT_GREEDY 24
#define MT_PROMPTS 4

struct mt_fixture {
    const char *name;
    struct ckpt *ck;
    struct safetensors *ref;
    int vocab;
    int n;                        /* prompts */
    int32_t *prompt[MT_PROMPTS];
    int plen[MT_PROMPTS];
    const float *logits[MT_PROMPTS];   /* [plen, vocab] */
    const int32_t *greedy[MT_PROMPTS]; /* [24] */
};

/* Results of one run: per prompt, its prompt logits and greedy tokens. */
struct mt_result {
    float *logits[MT_PROMPTS];    /* [plen, vocab] */
    int32_t tokens[MT_PROMPTS][MT_GREEDY];
};

/* 0 ok, 1 fixture missing (skip), -1 broken (test_fail called). */
int mt_fixture_open(const char *name, struct mt_fixture *f);
void mt_fixture_close(struct mt_fixture *f);

/* A model group on `backend` ("cpu", "cuda") with tp ranks, n_blocks KV
 * blocks of 16 and max_tokens rows per step. 0 or the init error. */
int mt_group(struct mt_fixture *f, const char *backend, int tp, int n_blocks, int max_tokens,
             struct model_group **g);
/* mt_group with rows per lm_head call = logit_chunk (0: the default) */
int mt_group_chunk(struct mt_fixture *f, const char *backend, int tp, int n_blocks, int max_tokens,
                   int logit_chunk, struct model_group **g);

/* Runs the prompts as a scheduler would (see the definition); checks that
 * every KV block is free afterwards. */
void mt_run(struct model_group *g, struct mt_fixture *f, int chunk, const int *start,
            int max_tokens, struct mt_result *r);
void mt_result_free(struct mt_result *r);

/* Logits within 1e-3 of the largest |logit| of each position; tokens exact. */
void mt_check_reference(struct mt_fixture *f, struct mt_result *r);
/* Two runs agree: tokens exactly, logits within tol of the largest |logit|. */
void mt_check_same(struct mt_fixture *f, struct mt_result *a, struct mt_result *b, double tol);

int mt_argmax(const float *x, int n);

#endif
