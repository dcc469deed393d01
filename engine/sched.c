/* sched.c — the engine (engine.h): model loading and the scheduler thread.
 *
 * One scheduler thread runs steps. A step:
 *   1. takes new requests and cancellations (under the lock),
 *   2. ends cancelled requests (their KV blocks go back to the pool now),
 *   3. builds a batch under a token budget (max_batch_tokens): first one decode
 *      token for every running sequence (preempting the most recently admitted
 *      request, by recompute, when blocks run out), then prefill chunks of
 *      running sequences, then admits waiting requests in FIFO order while
 *      their prompt fits in the free blocks (above a watermark) and the
 *      sequence limit allows,
 *   4. runs the forward pass (model_group_forward_out): rows that are only
 *      sampled come back as candidates (MODEL_LOGITS_SAMPLE: the top K tokens
 *      and the softmax sums per row, from ops->sample_topk), prompt-logprob
 *      rows as full logits,
 *   5. samples (sampler_finish on the candidates; the full row from
 *      model_group_sample_row_logits when they do not decide), detokenizes,
 *      checks stops, and posts events.
 *
 * n > 1 choices: the prompt is prefilled once, in choice 0; when its last
 * chunk is done the other choices fork its KV blocks (kv_seq_fork, shared full
 * blocks + a copied partial one) and every choice samples its first token from
 * the same logits row.
 *
 * Preemption by recompute: a preempted request gives back all its blocks and
 * goes to the front of the waiting queue; its tokens (prompt + generated) are
 * kept and prefilled again when it is readmitted.
 *
 * ===================================================================== */
#include "engine/engine.h"

#include "config/cfg.h"
#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/sched_text.h"
#include "engine/tok.h"
#include "engine/util.h"
#ifdef AWQD_CUDA
#include "kernels/cuda/mem_plan.h"
#endif

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT_LP_CHUNK 16 /* prompt rows per step when prompt logprobs are asked */
#define MAX_CANCELS 4096

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

struct sreq;

struct seq {
    struct sreq *rq;
    int choice;
    int active;                 /* scheduled (choices > 0 wait for the fork) */
    int finished;
    struct kv_seq kv;
    int32_t *toks;              /* [cap_toks] prompt then output */
    int n_toks, cap_toks;
    int n_cached;               /* tokens whose K/V is in the cache */
    int n_out;                  /* output tokens */
    struct stop_text st;
    /* this step */
    int step_n;                 /* tokens scheduled */
    int step_logits;            /* enum model_logits */
    int step_srow;              /* its SAMPLE row in this step's forward, -1 */
    /* penalty history (requests with penalties): toks[0..hist_n) are in it */
    struct sampler_hist hist;
    int hist_n;
};

struct sreq {
    uint64_t id;
    struct engine_request r;    /* copy; pointers refer to the owned copies below */
    int32_t *prompt;
    char *stops[ENGINE_MAX_STOP];
    int32_t *stop_ids;
    struct logit_bias *bias;    /* [n_logit_bias + room for min_tokens bans] */
    int n_bias;
    uint64_t seed;
    struct seq *seqs;           /* [r.n] */
    int forked;
    int prompt_lp_done;
    int prompt_lp_next;         /* prompt positions whose logprobs were posted */
    int n_finished;
    int cancelled;
    int completion_tokens;
    uint64_t t_submit, t_sched;
    struct sreq *next;
};

struct engine {
    struct engine_opts o;
    struct engine_info info;
    struct ckpt *ck;
    struct model_group *mg;
    struct tok *tok;
    struct kv kv;
    struct sampler sampler;
    int eos[CKPT_MAX_EOS + 1];
    int n_eos;
    int step_tokens;            /* per-step token budget */
    int watermark;              /* blocks kept free at admission */

    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    struct sreq *incoming, *incoming_tail;
    int n_incoming;
    uint64_t cancels[MAX_CANCELS];
    int n_cancels;
    int cancel_all;
    int stopping;
    struct engine_event *ev_head, *ev_tail;
    struct engine_stats st;
    uint64_t next_id;
    /* scheduler thread only */
    struct sreq *waiting;       /* FIFO */
    struct sreq *running;       /* admission order */
    int n_waiting_sched;
    float *logits;
    size_t logits_cap;          /* floats */
    /* sampling candidates of this step's SAMPLE rows (engine/model.h model_out) */
    int use_cands;              /* AWQD_SAMPLE_CANDIDATES=0 turns them off */
    int cand_k;                 /* most candidates per row (AWQD_SAMPLE_K, default SAMPLE_MAX_K) */
    int step_k;                 /* this step's candidates per row: the most any staged row
                                   needs (sampler_cands_needed), <= cand_k */
    int tp;
    int n_srows, cap_srows;
    float *s_inv_t;             /* [cap_srows] */
    int32_t *s_race;            /* [3 * cap_srows] race triples (sampler_race_row) */
    int32_t *s_adj_start;       /* [cap_srows + 1] */
    int32_t *s_adj;             /* [2 * cap_adj] */
    float *s_adj_raw;           /* [cap_adj] */
    size_t cap_adj;
    float *s_cands;             /* [tp, cap_srows, SAMPLE_ROW_FLOATS(cand_k)] */
    float *s_row;               /* [vocab] full row of SAMPLE row s_row_idx (fallback) */
    int s_row_idx;
    struct sample_cands *s_cd;
    uint64_t c_cand, c_full;    /* tokens sampled from candidates / from full rows */
    struct batch_seq *bseqs;
    struct seq **bmap;
    int cap_b;
    atomic_int active;
    uint64_t c_prompt, c_gen, c_preempt, c_steps; /* counters, copied into st per step */
};

/* ------------------------------------------------------------------------ */
/* Options, info                                                            */
/* ------------------------------------------------------------------------ */

void engine_opts_defaults(struct engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = CFG_BACKEND_AUTO;
    o->tp = 1;
    o->max_batch_tokens = 4096;
    o->max_num_seqs = 256;
    o->max_waiting = 1024;
    o->kv_block_size = 16;
    o->gpu_memory_fraction = 0.9;
}

const char *engine_finish_name(enum engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    case ENGINE_FINISH_ERROR: return "error";
    default: return "none";
    }
}

const struct engine_info *engine_get_info(const struct engine *e) { return &e->info; }
struct tok *engine_tok(const struct engine *e) { return e->tok; }

/* ------------------------------------------------------------------------ */
/* Init / free                                                              */
/* ------------------------------------------------------------------------ */

static void *sched_main(void *arg);

/* Sizes the KV cache for `backend` and starts the model group (all ranks). */
static int load_group(struct engine *e, const struct model_config *cfg, const char *backend,
                      int mml, int bs, long *n_blocks_out, char *err, size_t errlen) {
    const struct engine_opts *o = &e->o;
    /* KV blocks: kv_cache_tokens when given; else on CUDA the memory plan
     * (below), on the CPU enough for 8 full-length sequences within 1 GiB
     * (K and V of every layer, fp32). */
    int blocks_per_seq = (mml + bs - 1) / bs;
    size_t block_bytes = (size_t)2 * cfg->n_layers * cfg->n_kv_heads * cfg->head_dim * bs *
                         (strcmp(backend, "cpu") == 0 ? 4 : 2);
    long n_blocks;
    if (o->kv_cache_tokens > 0) {
        n_blocks = (o->kv_cache_tokens + bs - 1) / bs;
    } else {
        n_blocks = (long)blocks_per_seq * 8;
        if (n_blocks < 256) n_blocks = 256;
        long cap = (long)((1ull << 30) / (block_bytes ? block_bytes : 1));
        if (n_blocks > cap) n_blocks = cap;
    }
#ifdef AWQD_CUDA
    /* On GPUs the KV cache takes what the memory plan leaves after weights and
     * workspace within gpu_memory_fraction; with several ranks, the smallest. */
    if (strcmp(backend, "cuda") == 0 && o->kv_cache_tokens <= 0) {
        int tp = o->tp > 0 ? o->tp : 1;
        long fewest = -1;
        for (int r = 0; r < tp; r++) {
            struct cuda_mem_plan plan;
            int dev = o->n_devices ? o->devices[r] : r;
            int rc = cuda_mem_plan_make(cfg, tp, dev, o->gpu_memory_fraction, bs, e->step_tokens,
                                        o->max_num_seqs, &plan, err, errlen);
            if (rc) return rc;
            if (r == 0) {
                log_info("engine: memory plan of GPU %d (rank 0 of %d):", dev, tp);
                cuda_mem_plan_print(&plan, stderr);
            }
            if (fewest < 0 || plan.n_blocks < fewest) fewest = plan.n_blocks;
        }
        n_blocks = fewest;
    }
#endif
    if (n_blocks < 2) n_blocks = 2;
    if (n_blocks > (1L << 24)) n_blocks = 1L << 24;
    struct model_group_opts go;
    model_group_opts_default(&go);
    go.backend = backend;
    go.tp = o->tp > 0 ? o->tp : 1;
    go.devices = o->n_devices ? o->devices : NULL;
    go.cpu_threads = o->cpu_threads;
    go.model.n_blocks = (int)n_blocks;
    go.model.block_size = bs;
    go.model.max_tokens = e->step_tokens;
    go.model.max_seqs = o->max_num_seqs > ENGINE_MAX_N ? o->max_num_seqs : ENGINE_MAX_N;
    go.model.max_blocks_per_seq = blocks_per_seq;
    log_info("engine: loading %s (%s, tp=%d, %ld KV blocks of %d tokens, max_model_len %d)",
             o->model_dir, backend, go.tp, n_blocks, bs, mml);
    *n_blocks_out = n_blocks;
    return model_group_init(e->ck, &go, &e->mg, err, errlen);
}

int engine_init(struct engine **out, const struct engine_opts *o, char *err, size_t errlen) {
    *out = NULL;
    if (!o->model_dir || !o->model_dir[0])
        return util_err(err, errlen, -EINVAL, "no model given (--model DIR)");
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return util_err(err, errlen, -ENOMEM, "out of memory");
    e->o = *o;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    int rc = ckpt_open(o->model_dir, &e->ck, err, errlen);
    if (rc) goto fail;
    const struct model_config *cfg = ckpt_config(e->ck);

    const char *slash = strrchr(o->model_dir, '/');
    const char *base = slash && slash[1] ? slash + 1 : o->model_dir;
    snprintf(e->info.model_name, sizeof e->info.model_name, "%s", base);
    size_t bl = strlen(e->info.model_name);
    while (bl > 1 && e->info.model_name[bl - 1] == '/') e->info.model_name[--bl] = 0;
    e->info.vocab = cfg->vocab;
    int mml = o->max_model_len > 0 ? o->max_model_len : cfg->max_position;
    if (mml > cfg->max_position && cfg->max_position > 0) mml = cfg->max_position;
    e->info.max_model_len = mml;
    int bs = o->kv_block_size > 0 ? o->kv_block_size : 16;
    e->info.kv_block_size = bs;
    e->info.max_waiting = o->max_waiting;

    /* backend */
    const char *backend = "cpu";
#ifdef AWQD_CUDA
    if (o->backend == CFG_BACKEND_CUDA) {
        backend = "cuda";
    } else if (o->backend == CFG_BACKEND_AUTO) {
        if (cuda_device_count() > 0) backend = "cuda";
        else log_info("engine: backend auto: no CUDA device found, using the CPU backend");
    }
#else
    if (o->backend == CFG_BACKEND_CUDA) {
        rc = util_err(err, errlen, -ENOTSUP, "backend cuda: this binary was built without CUDA");
        goto fail;
    }
#endif
    e->info.backend = backend;

    e->step_tokens = o->max_batch_tokens > 0 ? o->max_batch_tokens : 4096;
    long n_blocks = 0;
    rc = load_group(e, cfg, backend, mml, bs, &n_blocks, err, errlen);
#ifdef AWQD_CUDA
    if (rc && o->backend == CFG_BACKEND_AUTO && strcmp(backend, "cuda") == 0) {
        log_warn("engine: the CUDA backend failed (%s); falling back to the CPU backend", err);
        backend = "cpu";
        e->info.backend = backend;
        rc = load_group(e, cfg, backend, mml, bs, &n_blocks, err, errlen);
    }
#endif
    if (rc) goto fail;
    e->info.kv_blocks_total = (int)n_blocks;
    if ((rc = kv_init(&e->kv, (int)n_blocks, bs)) != 0) {
        util_err(err, errlen, rc, "engine: KV block table: out of memory");
        goto fail;
    }
    if ((rc = sampler_init(&e->sampler, cfg->vocab)) != 0 ||
        !(e->s_cd = malloc(sizeof *e->s_cd)) || !(e->s_row = malloc(sizeof(float) * (size_t)cfg->vocab))) {
        util_err(err, errlen, rc ? rc : -ENOMEM, "engine: sampler: out of memory");
        rc = rc ? rc : -ENOMEM;
        goto fail;
    }
    {
        const char *kv = getenv("AWQD_SAMPLE_K");
        e->use_cands = !util_env_is_zero("AWQD_SAMPLE_CANDIDATES");
        e->cand_k = kv ? atoi(kv) : SAMPLE_MAX_K;
        if (e->cand_k < 1 || e->cand_k > SAMPLE_MAX_K) e->cand_k = SAMPLE_MAX_K;
        e->tp = model_group_tp(e->mg);
        e->s_row_idx = -1;
    }
    for (int i = 0; i < cfg->n_eos && i < CKPT_MAX_EOS; i++) e->eos[e->n_eos++] = cfg->eos_ids[i];

    /* tokenizer (optional: without one only token-id prompts work) */
    char terr[256];
    if (tok_load(o->model_dir, &e->tok, terr, sizeof terr) < 0) {
        log_warn("engine: no tokenizer (%s): only token-id prompts will work", terr);
        e->tok = NULL;
    } else if (e->n_eos == 0 && tok_eos_id(e->tok) >= 0) {
        e->eos[e->n_eos++] = tok_eos_id(e->tok);
    }
    e->watermark = (int)(n_blocks / 100);
    if (e->watermark < 1) e->watermark = 1;
    e->st.kv_blocks_total = (int)n_blocks;
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc ? rc : -EINVAL;
}

int engine_start(struct engine *e, char *err, size_t errlen) {
    int rc = pthread_create(&e->th, NULL, sched_main, e);
    if (rc) return util_err(err, errlen, -rc, "engine: cannot start the scheduler thread");
    e->started = 1;
    return 0;
}

static void req_free(struct sreq *q) {
    if (!q) return;
    if (q->seqs) {
        for (int i = 0; i < q->r.n; i++) {
            free(q->seqs[i].toks);
            stop_text_free(&q->seqs[i].st);
            sampler_hist_free(&q->seqs[i].hist);
        }
    }
    free(q->seqs);
    free(q->prompt);
    for (int i = 0; i < ENGINE_MAX_STOP; i++) free(q->stops[i]);
    free(q->stop_ids);
    free(q->bias);
    free(q);
}

void engine_stop(struct engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    e->cancel_all = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->started = 0;
}

void engine_free(struct engine *e) {
    if (!e) return;
    engine_stop(e);
    for (struct engine_event *ev = e->ev_head, *n; ev; ev = n) {
        n = ev->next;
        engine_event_free(ev);
    }
    struct sreq *lists[3] = {e->incoming, e->waiting, e->running};
    for (int i = 0; i < 3; i++)
        for (struct sreq *q = lists[i], *n; q; q = n) {
            n = q->next;
            req_free(q);
        }
    if (e->mg) model_group_free(e->mg);
    if (e->ck) ckpt_close(e->ck);
    if (e->tok) tok_free(e->tok);
    if (e->kv.free_list) kv_free(&e->kv);
    if (e->sampler.work) sampler_free(&e->sampler);
    if (e->c_cand + e->c_full)
        log_info("engine: sampled %llu tokens from candidates, %llu from full rows",
                 (unsigned long long)e->c_cand, (unsigned long long)e->c_full);
    free(e->s_inv_t);
    free(e->s_race);
    free(e->s_adj_start);
    free(e->s_adj);
    free(e->s_adj_raw);
    free(e->s_cands);
    free(e->s_row);
    free(e->s_cd);
    free(e->logits);
    free(e->bseqs);
    free(e->bmap);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* ------------------------------------------------------------------------ */
/* Submit / cancel / poll / stats (any thread)                              */
/* ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id, char *err,
                  size_t errlen) {
    const struct engine_info *in = &e->info;
    if (r->n_prompt < 1) return util_err(err, errlen, -EINVAL, "prompt is empty");
    if (r->n < 1 || r->n > ENGINE_MAX_N)
        return util_err(err, errlen, -EINVAL, "n must be 1 to %d", ENGINE_MAX_N);
    if (r->max_tokens < 0 || (long)r->n_prompt + r->max_tokens > in->max_model_len)
        return util_err(err, errlen, -EINVAL,
                        "prompt (%d tokens) + max_tokens (%d) exceeds the context of %d tokens",
                        r->n_prompt, r->max_tokens, in->max_model_len);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= in->vocab)
            return util_err(err, errlen, -EINVAL, "token id %d at position %d out of range 0 to %d",
                            r->prompt[i], i, in->vocab - 1);
    if (r->n_stop < 0 || r->n_stop > ENGINE_MAX_STOP || r->n_stop_ids < 0 ||
        r->n_stop_ids > ENGINE_MAX_STOP_IDS || r->n_logit_bias < 0 ||
        r->n_logit_bias > ENGINE_MAX_LOGIT_BIAS || r->logprobs > ENGINE_MAX_LOGPROBS)
        return util_err(err, errlen, -EINVAL, "request limits exceeded");
    /* blocks a single sequence would need at its longest */
    int need = kv_blocks_for(&e->kv, r->n_prompt + r->max_tokens);
    if (need > e->info.kv_blocks_total)
        return util_err(err, errlen, -EINVAL,
                        "prompt + max_tokens needs %d KV blocks; the cache has %d", need,
                        e->info.kv_blocks_total);

    struct sreq *q = calloc(1, sizeof *q);
    if (!q) return util_err(err, errlen, -ENOMEM, "out of memory");
    q->r = *r;
    q->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
    q->seqs = calloc((size_t)r->n, sizeof *q->seqs);
    q->bias = malloc(sizeof *q->bias * (size_t)(r->n_logit_bias + r->n_stop_ids + e->n_eos + 1));
    if (r->n_stop_ids) q->stop_ids = malloc(sizeof(int32_t) * (size_t)r->n_stop_ids);
    int oom = !q->prompt || !q->seqs || !q->bias || (r->n_stop_ids && !q->stop_ids);
    for (int i = 0; i < r->n_stop && !oom; i++) {
        q->stops[i] = strndup(r->stop[i], ENGINE_MAX_STOP_LEN);
        oom = !q->stops[i];
    }
    if (oom) {
        req_free(q);
        return util_err(err, errlen, -ENOMEM, "out of memory");
    }
    memcpy(q->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (r->n_stop_ids) memcpy(q->stop_ids, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop_ids);
    for (int i = 0; i < r->n_logit_bias; i++) {
        q->bias[i].token = r->logit_bias_ids[i];
        q->bias[i].bias = r->logit_bias_vals[i];
    }
    q->n_bias = r->n_logit_bias;
    q->r.prompt = q->prompt;
    q->r.stop_ids = q->stop_ids;
    q->r.logit_bias_ids = NULL;
    q->r.logit_bias_vals = NULL;
    for (int i = 0; i < ENGINE_MAX_STOP; i++) q->r.stop[i] = q->stops[i];
    q->t_submit = util_now_ns();
    for (int c = 0; c < r->n; c++) {
        struct seq *s = &q->seqs[c];
        s->rq = q;
        s->choice = c;
        s->active = c == 0;
        stop_text_init(&s->st, (const char *const *)q->stops, r->n_stop,
                       r->include_stop_str_in_output);
    }
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        req_free(q);
        return util_err(err, errlen, -ESHUTDOWN, "the engine is shutting down");
    }
    if (e->n_incoming + e->st.waiting >= e->o.max_waiting) {
        pthread_mutex_unlock(&e->mu);
        req_free(q);
        return util_err(err, errlen, -EAGAIN, "the waiting queue is full (%d requests)",
                        e->o.max_waiting);
    }
    q->id = ++e->next_id;
    q->seed = r->has_seed ? r->seed : mix64(q->id ^ util_now_ns());
    if (e->incoming_tail) e->incoming_tail->next = q;
    else e->incoming = q;
    e->incoming_tail = q;
    e->n_incoming++;
    atomic_fetch_add(&e->active, 1);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (id) *id = q->id;
    return 0;
}

void engine_cancel(struct engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels < MAX_CANCELS) e->cancels[e->n_cancels++] = id;
    else e->cancel_all = 1; /* never expected; errs on the safe side */
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

struct engine_event *engine_poll(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    struct engine_event *h = e->ev_head;
    e->ev_head = e->ev_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    return h;
}

void engine_event_free(struct engine_event *ev) {
    if (!ev) return;
    free(ev->text);
    free(ev->tokens);
    free(ev);
}

void engine_stats(struct engine *e, struct engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    st->waiting += e->n_incoming;
    pthread_mutex_unlock(&e->mu);
}

int engine_active(struct engine *e) { return atomic_load(&e->active); }

/* ------------------------------------------------------------------------ */
/* Events (scheduler thread): collected per step, posted at its end         */
/* ------------------------------------------------------------------------ */

struct evlist {
    struct engine_event *head, *tail;
};

static struct engine_event *ev_new(struct evlist *l, struct sreq *q, enum engine_event_kind k,
                                   int choice) {
    struct engine_event *ev = calloc(1, sizeof *ev);
    if (!ev) return NULL; /* dropped: the consumer sees END eventually (see post) */
    ev->kind = k;
    ev->ud = q->r.ud;
    ev->req_id = q->id;
    ev->choice = choice;
    ev->t_ns = util_now_ns();
    ev->t_submit_ns = q->t_submit;
    ev->t_sched_ns = q->t_sched;
    ev->prompt_tokens = q->r.n_prompt;
    if (l->tail) l->tail->next = ev;
    else l->head = ev;
    l->tail = ev;
    return ev;
}

static void post(struct engine *e, struct evlist *l) {
    if (!l->head) return;
    pthread_mutex_lock(&e->mu);
    if (e->ev_tail) e->ev_tail->next = l->head;
    else e->ev_head = l->head;
    e->ev_tail = l->tail;
    pthread_mutex_unlock(&e->mu);
    l->head = l->tail = NULL;
    if (e->o.notify) e->o.notify(e->o.notify_ud);
}

/* ------------------------------------------------------------------------ */
/* Sequences                                                                */
/* ------------------------------------------------------------------------ */

static int seq_push(struct seq *s, int32_t t) {
    if (s->n_toks + 1 > s->cap_toks) {
        int cap = s->cap_toks ? s->cap_toks * 2 : 64;
        int32_t *n = realloc(s->toks, sizeof *n * (size_t)cap);
        if (!n) return -ENOMEM;
        s->toks = n;
        s->cap_toks = cap;
    }
    s->toks[s->n_toks++] = t;
    return 0;
}

static int seq_set_prompt(struct seq *s, const int32_t *p, int n) {
    s->cap_toks = n + 64;
    s->toks = malloc(sizeof(int32_t) * (size_t)s->cap_toks);
    if (!s->toks) return -ENOMEM;
    memcpy(s->toks, p, sizeof(int32_t) * (size_t)n);
    s->n_toks = n;
    return 0;
}

static void seq_release(struct engine *e, struct seq *s) { kv_seq_free(&e->kv, &s->kv); }

/* Finishes one choice: flushes its text, posts FINISH, frees its blocks. */
static void seq_finish(struct engine *e, struct evlist *l, struct seq *s, enum engine_finish f,
                       const char *msg) {
    if (s->finished) return;
    struct sreq *q = s->rq;
    s->finished = 1;
    s->active = 0;
    seq_release(e, s);
    struct text_buf out = {0};
    if (f != ENGINE_FINISH_CANCELLED) stop_text_flush(&s->st, &out);
    if (out.len) {
        struct engine_event *ev = ev_new(l, q, ENGINE_EV_TOKENS, s->choice);
        if (ev) {
            ev->text = out.data;
            ev->text_len = out.len;
            out.data = NULL;
        }
    }
    text_buf_free(&out);
    struct engine_event *ev = ev_new(l, q, ENGINE_EV_FINISH, s->choice);
    if (ev) {
        ev->finish = f;
        ev->completion_tokens = s->n_out;
        if (msg) snprintf(ev->message, sizeof ev->message, "%s", msg);
    }
    q->n_finished++;
    q->completion_tokens += s->n_out;
    /* before the fork the other choices only wait for choice 0's prompt */
    if (!q->forked && s->choice == 0)
        for (int c = 1; c < q->r.n; c++) seq_finish(e, l, &q->seqs[c], f, msg);
}

static void list_remove(struct sreq **head, struct sreq *q) {
    for (struct sreq **p = head; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            q->next = NULL;
            return;
        }
}

/* Ends a request (all choices finished or cancelled): END event, freed. */
static void req_end(struct engine *e, struct evlist *l, struct sreq *q) {
    struct engine_event *ev = ev_new(l, q, ENGINE_EV_END, 0);
    if (ev) ev->completion_tokens = q->completion_tokens;
    req_free(q);
    atomic_fetch_sub(&e->active, 1);
}

static void req_finish_all(struct engine *e, struct evlist *l, struct sreq *q, enum engine_finish f,
                           const char *msg) {
    for (int c = 0; c < q->r.n; c++) seq_finish(e, l, &q->seqs[c], f, msg);
}

/* Gives back every block of q; its tokens stay for the recompute. */
static void req_preempt(struct engine *e, struct sreq *q) {
    for (int c = 0; c < q->r.n; c++) {
        struct seq *s = &q->seqs[c];
        seq_release(e, s);
        s->n_cached = 0;
    }
    e->c_preempt++;
    log_debug("engine: preempted request %llu (recompute)", (unsigned long long)q->id);
}

/* ------------------------------------------------------------------------ */
/* Tokens in                                                                */
/* ------------------------------------------------------------------------ */

static int is_in(const int32_t *a, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (a[i] == t) return 1;
    return 0;
}

/* A sampled token: append, text, stops, length. */
static void seq_accept(struct engine *e, struct evlist *l, struct seq *s,
                       const struct sample_result *res) {
    struct sreq *q = s->rq;
    int32_t t = res->token;
    if (seq_push(s, t)) {
        seq_finish(e, l, s, ENGINE_FINISH_ERROR, "out of memory");
        return;
    }
    s->n_out++;
    e->c_gen++;
    int eos = !q->r.ignore_eos && is_in(e->eos, e->n_eos, t);
    int stop_id = is_in(q->stop_ids, q->r.n_stop_ids, t);
    struct text_buf out = {0};
    int hit = 0;
    if (!eos && !stop_id) {
        size_t bl = 0;
        const char *b = NULL;
        if (e->tok && !(q->r.skip_special_tokens && tok_is_special(e->tok, t)))
            b = tok_token_bytes(e->tok, t, &bl);
        hit = stop_text_feed(&s->st, b ? b : "", b ? bl : 0, &out) == 1;
    }
    struct engine_event *ev = ev_new(l, q, ENGINE_EV_TOKENS, s->choice);
    if (ev) {
        ev->text = out.data ? out.data : strdup("");
        ev->text_len = out.len;
        out.data = NULL;
        ev->tokens = calloc(1, sizeof *ev->tokens);
        if (ev->tokens) {
            ev->n_tokens = 1;
            ev->tokens->id = t;
            ev->tokens->logprob = res->logprob;
            int nt = q->r.logprobs > 0 ? q->r.logprobs : 0;
            if (nt > res->n_top) nt = res->n_top;
            ev->tokens->n_top = nt;
            for (int k = 0; k < nt; k++) {
                ev->tokens->top_ids[k] = res->top_ids[k];
                ev->tokens->top_logprobs[k] = res->top_logprobs[k];
            }
        }
    }
    text_buf_free(&out);
    if (eos || stop_id || hit) seq_finish(e, l, s, ENGINE_FINISH_STOP, NULL);
    else if (s->n_out >= q->r.max_tokens || s->n_toks >= e->info.max_model_len)
        seq_finish(e, l, s, ENGINE_FINISH_LENGTH, NULL);
}

/* The sampling parameters of s's next token (min_tokens bans appended to
 * q->bias). */
static void seq_params(struct engine *e, struct seq *s, struct sampling_params *p) {
    struct sreq *q = s->rq;
    sampling_params_default(p);
    p->temperature = q->r.temperature;
    p->top_k = q->r.top_k > 0 ? q->r.top_k : 0;
    p->top_p = q->r.top_p > 0 ? q->r.top_p : 1.0f;
    p->min_p = q->r.min_p;
    p->repetition_penalty = q->r.repetition_penalty > 0 ? q->r.repetition_penalty : 1.0f;
    p->presence_penalty = q->r.presence_penalty;
    p->frequency_penalty = q->r.frequency_penalty;
    p->seed = q->seed + (uint64_t)s->choice;
    p->n_logprobs = q->r.logprobs > 0 ? q->r.logprobs : 0;
    int nb = q->n_bias;
    if (s->n_out < q->r.min_tokens) { /* no EOS / stop id before min_tokens */
        for (int i = 0; i < e->n_eos && !q->r.ignore_eos; i++)
            q->bias[nb++] = (struct logit_bias){e->eos[i], -INFINITY};
        for (int i = 0; i < q->r.n_stop_ids; i++)
            q->bias[nb++] = (struct logit_bias){q->stop_ids[i], -INFINITY};
    }
    p->logit_bias = q->bias;
    p->n_logit_bias = nb;
}

/* Samples s's next token from a full logits row, or (row NULL) from SAMPLE
 * row srow's candidates, falling back to that row's full logits. */
static void sample_into(struct engine *e, struct evlist *l, struct seq *s, const float *row,
                        int srow) {
    struct sreq *q = s->rq;
    struct sampling_params p;
    seq_params(e, s, &p);
    struct sample_result res;
    int n_prompt = q->r.n_prompt, rc = 0;
    if (!row) {
        size_t RF = SAMPLE_ROW_FLOATS(e->step_k);
        const float *rows[64];
        for (int r = 0; r < e->tp && r < 64; r++)
            rows[r] = e->s_cands + ((size_t)r * e->n_srows + srow) * RF;
        struct sample_cands *cd = e->s_cd;
        sampler_cands_merge(cd, rows, e->tp, e->step_k, e->info.vocab, sampler_inv_t(&p));
        cd->adj = e->s_adj + 2 * (size_t)e->s_adj_start[srow];
        cd->adj_raw = e->s_adj_raw + e->s_adj_start[srow];
        cd->n_adj = e->s_adj_start[srow + 1] - e->s_adj_start[srow];
        /* the row raced with the staging sequence's key: a fork sampling its
         * first token from choice 0's row has another seed */
        int32_t race[3];
        sampler_race_row(&p, s->n_out, race);
        if (memcmp(race, e->s_race + 3 * (size_t)srow, sizeof race) != 0) cd->race_id = -1;
        if (sampler_finish(&p, cd, s->n_out, &res) == 0) {
            e->c_cand++;
            seq_accept(e, l, s, &res);
            return;
        }
        if (e->s_row_idx != srow) {
            char err[256];
            if ((rc = model_group_sample_row_logits(e->mg, srow, e->s_row, err, sizeof err))) {
                log_error("engine: logits of a sampling row: %s", err);
                seq_finish(e, l, s, ENGINE_FINISH_ERROR, "sampling failed");
                return;
            }
            e->s_row_idx = srow;
        }
        row = e->s_row;
    }
    e->c_full++;
    rc = sampler_sample(&e->sampler, &p, row, s->toks, n_prompt, s->toks + n_prompt, s->n_out, &res);
    if (rc) {
        seq_finish(e, l, s, ENGINE_FINISH_ERROR, "sampling failed");
        return;
    }
    seq_accept(e, l, s, &res);
}

/* Inputs of s's SAMPLE row: 1 / T and its adjustments (bias, min_tokens bans,
 * penalties from the incrementally kept history). 0 / -ENOMEM. */
static int stage_sample_row(struct engine *e, struct seq *s) {
    struct sreq *q = s->rq;
    struct sampling_params p;
    seq_params(e, s, &p);
    int i = e->n_srows;
    if (i + 1 > e->cap_srows) {
        int cap = e->cap_srows ? e->cap_srows * 2 : 64;
        float *a = realloc(e->s_inv_t, sizeof *a * (size_t)cap);
        if (!a) return -ENOMEM;
        e->s_inv_t = a;
        int32_t *rc3 = realloc(e->s_race, sizeof *rc3 * 3 * (size_t)cap);
        if (!rc3) return -ENOMEM;
        e->s_race = rc3;
        int32_t *b = realloc(e->s_adj_start, sizeof *b * (size_t)(cap + 1));
        if (!b) return -ENOMEM;
        e->s_adj_start = b;
        float *c = realloc(e->s_cands, sizeof *c * (size_t)e->tp * (size_t)cap * SAMPLE_ROW_FLOATS(e->cand_k));
        if (!c) return -ENOMEM;
        e->s_cands = c;
        e->cap_srows = cap;
    }
    if (i == 0) e->s_adj_start[0] = 0;
    int pen = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (pen)
        for (; s->hist_n < s->n_toks; s->hist_n++)
            if (sampler_hist_add(&s->hist, s->toks[s->hist_n], s->hist_n >= q->r.n_prompt)) return -ENOMEM;
    size_t need = (size_t)e->s_adj_start[i] + (size_t)sampler_adj_max(&p, pen ? &s->hist : NULL);
    if (need > e->cap_adj) {
        size_t cap = e->cap_adj ? e->cap_adj : 1024;
        while (cap < need) cap *= 2;
        int32_t *a = realloc(e->s_adj, sizeof *a * 2 * cap);
        if (!a) return -ENOMEM;
        e->s_adj = a;
        float *b = realloc(e->s_adj_raw, sizeof *b * cap);
        if (!b) return -ENOMEM;
        e->s_adj_raw = b;
        e->cap_adj = cap;
    }
    int n = sampler_adj_build(&p, pen ? &s->hist : NULL, e->info.vocab, e->s_adj + 2 * (size_t)e->s_adj_start[i]);
    if (n < 0) return n;
    int k = sampler_cands_needed(&p, n, e->cand_k);
    if (i == 0 || k > e->step_k) e->step_k = k;
    e->s_inv_t[i] = sampler_inv_t(&p);
    sampler_race_row(&p, s->n_out, e->s_race + 3 * (size_t)i);
    e->s_adj_start[i + 1] = e->s_adj_start[i] + n;
    s->step_srow = i;
    e->n_srows++;
    return 0;
}

/* Prompt logprobs: row r predicts prompt token pos + 1. */
static void prompt_logprobs(struct engine *e, struct evlist *l, struct sreq *q, int pos0,
                            int n_rows, const float *rows) {
    int V = e->info.vocab;
    int n_prompt = q->r.n_prompt;
    int cnt = 0;
    struct engine_token *toks = calloc((size_t)n_rows + 1, sizeof *toks);
    if (!toks) return;
    if (pos0 == 0 && q->prompt_lp_next == 0) {
        toks[cnt].id = q->prompt[0];
        toks[cnt].logprob = NAN;
        cnt++;
        q->prompt_lp_next = 1;
    }
    for (int r = 0; r < n_rows; r++) {
        int next = pos0 + r + 1;
        if (next >= n_prompt) break;
        if (next < q->prompt_lp_next) continue; /* posted before a preemption */
        q->prompt_lp_next = next + 1;
        const float *x = rows + (size_t)r * V;
        float mx = -INFINITY;
        for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)x[v] - mx);
        double lse = mx + log(sum);
        struct engine_token *t = &toks[cnt++];
        t->id = q->prompt[next];
        t->logprob = (float)(x[t->id] - lse);
        int nt = q->r.logprobs;
        t->n_top = 0;
        for (int k = 0; k < nt; k++) { /* top-k by repeated scan (k <= 5) */
            int best = -1;
            for (int v = 0; v < V; v++) {
                int taken = 0;
                for (int j = 0; j < t->n_top; j++) taken |= t->top_ids[j] == v;
                if (!taken && (best < 0 || x[v] > x[best])) best = v;
            }
            if (best < 0) break;
            t->top_ids[t->n_top] = best;
            t->top_logprobs[t->n_top] = (float)(x[best] - lse);
            t->n_top++;
        }
    }
    for (int c = 0; c < q->r.n && cnt > 0; c++) {
        struct engine_event *ev = ev_new(l, q, ENGINE_EV_TOKENS, c);
        if (!ev) continue;
        ev->is_prompt = 1;
        ev->text = strdup("");
        ev->tokens = malloc(sizeof *toks * (size_t)cnt);
        if (ev->tokens) {
            memcpy(ev->tokens, toks, sizeof *toks * (size_t)cnt);
            ev->n_tokens = cnt;
        }
    }
    free(toks);
}

/* ------------------------------------------------------------------------ */
/* The step                                                                 */
/* ------------------------------------------------------------------------ */

static int ensure_batch_cap(struct engine *e, int n) {
    if (n <= e->cap_b) return 0;
    int cap = e->cap_b ? e->cap_b * 2 : 64;
    while (cap < n) cap *= 2;
    struct batch_seq *b = realloc(e->bseqs, sizeof *b * (size_t)cap);
    if (!b) return -ENOMEM;
    e->bseqs = b;
    struct seq **m = realloc(e->bmap, sizeof *m * (size_t)cap);
    if (!m) return -ENOMEM;
    e->bmap = m;
    e->cap_b = cap;
    return 0;
}

static int running_seqs(struct engine *e) {
    int n = 0;
    for (struct sreq *q = e->running; q; q = q->next)
        for (int c = 0; c < q->r.n; c++) n += !q->seqs[c].finished;
    return n;
}

/* The most recently admitted running request other than `keep`. */
static struct sreq *victim(struct engine *e, struct sreq *keep) {
    struct sreq *v = NULL;
    for (struct sreq *q = e->running; q; q = q->next)
        if (q != keep) v = q;
    return v;
}

static void preempt_to_waiting(struct engine *e, struct sreq *v) {
    list_remove(&e->running, v);
    req_preempt(e, v);
    /* unschedule whatever of it was already in this step's batch */
    for (int c = 0; c < v->r.n; c++) v->seqs[c].step_n = 0;
    v->next = e->waiting;
    e->waiting = v;
    e->n_waiting_sched++;
}

/* Schedules up to `budget` tokens of s (prefill chunk or decode token). */
static int schedule_seq(struct engine *e, struct seq *s, int budget, int *nb) {
    struct sreq *q = s->rq;
    int pending = s->n_toks - s->n_cached;
    if (pending <= 0 || budget <= 0) return 0;
    int chunk = pending < budget ? pending : budget;
    int want_all = q->r.prompt_logprobs && !q->prompt_lp_done && s->choice == 0 && !q->forked;
    if (want_all && chunk > PROMPT_LP_CHUNK) chunk = PROMPT_LP_CHUNK;
    if (kv_seq_reserve(&e->kv, &s->kv, s->n_cached + chunk) != 0) return -ENOSPC;
    if (ensure_batch_cap(e, *nb + 1)) return -ENOMEM;
    s->step_n = chunk;
    s->step_logits = want_all ? MODEL_LOGITS_ALL
                              : (s->n_cached + chunk == s->n_toks ? MODEL_LOGITS_LAST
                                                                  : MODEL_LOGITS_NONE);
    e->bmap[(*nb)++] = s;
    return chunk;
}

static void step(struct engine *e, struct evlist *l) {
    int budget = e->step_tokens;
    int nb = 0;
    int max_seqs = e->o.max_num_seqs > 0 ? e->o.max_num_seqs : 256;

    /* 1. decode tokens of running sequences (pending == 1) */
    for (struct sreq *q = e->running, *qn; q; q = qn) {
        qn = q->next;
        for (int c = 0; c < q->r.n && budget > 0; c++) {
            struct seq *s = &q->seqs[c];
            if (!s->active || s->finished || s->step_n || s->n_toks - s->n_cached != 1) continue;
            for (;;) {
                int r = schedule_seq(e, s, 1, &nb);
                if (r > 0) {
                    budget -= r;
                    break;
                }
                struct sreq *v = victim(e, q);
                if (r == -ENOSPC && v) {
                    if (v == qn) qn = v->next;
                    /* drop v's entries from the batch */
                    int k = 0;
                    for (int i = 0; i < nb; i++)
                        if (e->bmap[i]->rq != v) e->bmap[k++] = e->bmap[i];
                        else budget += e->bmap[i]->step_n;
                    nb = k;
                    preempt_to_waiting(e, v);
                    continue;
                }
                seq_finish(e, l, s, ENGINE_FINISH_ERROR, "out of KV cache memory");
                break;
            }
        }
    }
    /* 2. prefill chunks of running sequences */
    for (struct sreq *q = e->running; q && budget > 0; q = q->next)
        for (int c = 0; c < q->r.n && budget > 0; c++) {
            struct seq *s = &q->seqs[c];
            if (!s->active || s->finished || s->step_n) continue;
            int r = schedule_seq(e, s, budget, &nb);
            if (r > 0) budget -= r;
        }
    /* 3. admit waiting requests */
    int nrun = running_seqs(e);
    while (e->waiting && budget > 0) {
        struct sreq *q = e->waiting;
        int seqs_needed = 0, blocks = 0;
        for (int c = 0; c < q->r.n; c++) {
            struct seq *s = &q->seqs[c];
            if (s->finished) continue;
            seqs_needed++;
            if (q->forked && s->active) blocks += kv_blocks_for(&e->kv, s->n_toks + 1);
        }
        /* before the fork: the prompt once, plus the partial blocks copied */
        if (!q->forked) blocks = kv_blocks_for(&e->kv, q->r.n_prompt + 1) + q->r.n - 1;
        if (nrun > 0 && nrun + seqs_needed > max_seqs) break;
        int free_b = kv_free_blocks(&e->kv);
        if (free_b - blocks < (e->running ? e->watermark : 0)) {
            if (!e->running && nb == 0 && blocks > e->info.kv_blocks_total) {
                e->waiting = q->next;
                e->n_waiting_sched--;
                q->next = NULL;
                req_finish_all(e, l, q, ENGINE_FINISH_ERROR, "does not fit in the KV cache");
                req_end(e, l, q);
                continue;
            }
            break;
        }
        e->waiting = q->next;
        e->n_waiting_sched--;
        q->next = NULL;
        /* append to running */
        struct sreq **tail = &e->running;
        while (*tail) tail = &(*tail)->next;
        *tail = q;
        if (!q->t_sched) q->t_sched = util_now_ns();
        if (!q->seqs[0].toks && !q->seqs[0].finished) {
            if (seq_set_prompt(&q->seqs[0], q->prompt, q->r.n_prompt)) {
                list_remove(&e->running, q);
                req_finish_all(e, l, q, ENGINE_FINISH_ERROR, "out of memory");
                req_end(e, l, q);
                continue;
            }
            e->c_prompt += (uint64_t)q->r.n_prompt;
        }
        if (q->r.max_tokens == 0 && !q->r.prompt_logprobs) { /* echo only */
            list_remove(&e->running, q);
            req_finish_all(e, l, q, ENGINE_FINISH_LENGTH, NULL);
            req_end(e, l, q);
            continue;
        }
        nrun += seqs_needed;
        for (int c = 0; c < q->r.n && budget > 0; c++) {
            struct seq *s = &q->seqs[c];
            if (!s->active || s->finished) continue;
            int r = schedule_seq(e, s, budget, &nb);
            if (r > 0) budget -= r;
        }
    }
    if (nb == 0) {
        /* nothing could run: KV blocks are held by partly prefilled requests.
         * Preempt the newest; a lone request that cannot grow fails. */
        struct sreq *v = victim(e, NULL);
        if (v && v != e->running) {
            preempt_to_waiting(e, v);
        } else if (v) {
            list_remove(&e->running, v);
            req_finish_all(e, l, v, ENGINE_FINISH_ERROR, "out of KV cache memory");
            req_end(e, l, v);
        }
        return;
    }

    /* 4. forward */
    int rows = 0;
    e->n_srows = 0;
    e->s_row_idx = -1;
    for (int i = 0; i < nb; i++) {
        struct seq *s = e->bmap[i];
        s->step_srow = -1;
        if (s->step_logits == MODEL_LOGITS_LAST && e->use_cands && stage_sample_row(e, s) == 0)
            s->step_logits = MODEL_LOGITS_SAMPLE; /* (out of memory: a full row instead) */
        e->bseqs[i] = (struct batch_seq){.tokens = s->toks + s->n_cached, .n_tokens = s->step_n,
                                         .past = s->n_cached, .blocks = s->kv.blocks,
                                         .n_blocks = s->kv.n_blocks, .logits = s->step_logits};
        rows += s->step_logits == MODEL_LOGITS_ALL ? s->step_n
                : s->step_logits == MODEL_LOGITS_LAST ? 1 : 0;
    }
    size_t need = (size_t)rows * (size_t)e->info.vocab;
    if (need > e->logits_cap) {
        float *nl = realloc(e->logits, need * sizeof(float));
        if (!nl) {
            for (int i = 0; i < nb; i++) e->bmap[i]->step_n = 0;
            log_error("engine: out of memory for %d logit rows", rows);
            return;
        }
        e->logits = nl;
        e->logits_cap = need;
    }
    struct batch b = {e->bseqs, nb};
    char err[256];
    struct model_out mo = {.logits = e->logits, .k = e->n_srows ? e->step_k : e->cand_k, .inv_t = e->s_inv_t, .race = e->s_race,
                           .adj_start = e->s_adj_start, .adj = e->s_adj, .cands = e->s_cands,
                           .adj_raw = e->s_adj_raw};
    int rc = model_group_forward_out(e->mg, &b, &mo, err, sizeof err);
    e->c_steps++;
    if (rc) {
        log_error("engine: forward failed: %s", err);
        for (int i = 0; i < nb; i++) {
            struct seq *s = e->bmap[i];
            s->step_n = 0;
            seq_finish(e, l, s, ENGINE_FINISH_ERROR, "forward pass failed");
        }
        goto ends;
    }

    /* 5. sample */
    int row = 0;
    for (int i = 0; i < nb; i++) {
        struct seq *s = e->bmap[i];
        struct sreq *q = s->rq;
        int n = s->step_n;
        int pos0 = s->n_cached;
        s->n_cached += n;
        s->step_n = 0;
        const float *last = NULL;
        int srow = -1;
        if (s->step_logits == MODEL_LOGITS_SAMPLE) {
            srow = s->step_srow;
        } else if (s->step_logits == MODEL_LOGITS_ALL) {
            prompt_logprobs(e, l, q, pos0, n, e->logits + (size_t)row * e->info.vocab);
            if (s->n_cached >= q->r.n_prompt) q->prompt_lp_done = 1;
            last = s->n_cached == s->n_toks ? e->logits + (size_t)(row + n - 1) * e->info.vocab
                                            : NULL;
            row += n;
        } else if (s->step_logits == MODEL_LOGITS_LAST) {
            last = e->logits + (size_t)row * e->info.vocab;
            row += 1;
        }
        if ((!last && srow < 0) || s->finished) continue;
        if (!q->forked) {
            /* the prompt is in choice 0's blocks: fork the others onto it */
            q->forked = 1;
            if (q->r.max_tokens == 0) {
                req_finish_all(e, l, q, ENGINE_FINISH_LENGTH, NULL);
                continue;
            }
            for (int c = 1; c < q->r.n; c++) {
                struct seq *t = &q->seqs[c];
                if (seq_set_prompt(t, q->prompt, q->r.n_prompt)) {
                    seq_finish(e, l, t, ENGINE_FINISH_ERROR, "out of memory");
                    continue;
                }
                struct kv_copy cp = {-1, -1};
                t->active = 1;
                if (kv_seq_fork(&e->kv, &s->kv, s->n_cached, &t->kv, &cp) == 0) {
                    if (cp.src >= 0) model_group_copy_block(e->mg, cp.dst, cp.src);
                    t->n_cached = s->n_cached;
                    sample_into(e, l, t, last, srow);
                } else {
                    t->n_cached = 0; /* no blocks now: it prefills on its own later */
                }
            }
        }
        sample_into(e, l, s, last, srow);
    }
ends:
    /* requests whose choices are all finished end now */
    for (struct sreq *q = e->running, *qn; q; q = qn) {
        qn = q->next;
        if (q->n_finished == q->r.n) {
            list_remove(&e->running, q);
            req_end(e, l, q);
        }
    }
}

/* Cancelled requests (ids from engine_cancel) end now, blocks freed. */
static void apply_cancels(struct engine *e, struct evlist *l, const uint64_t *ids, int n, int all) {
    struct sreq **lists[2] = {&e->running, &e->waiting};
    for (int li = 0; li < 2; li++) {
        for (struct sreq *q = *lists[li], *qn; q; q = qn) {
            qn = q->next;
            int hit = all;
            for (int i = 0; i < n && !hit; i++) hit = ids[i] == q->id;
            if (!hit) continue;
            list_remove(lists[li], q);
            if (li == 1) e->n_waiting_sched--;
            req_finish_all(e, l, q, ENGINE_FINISH_CANCELLED, NULL);
            req_end(e, l, q);
        }
    }
}

static void *sched_main(void *arg) {
    struct engine *e = arg;
    uint64_t *cancels = malloc(sizeof(uint64_t) * MAX_CANCELS);
    if (!cancels) return NULL;
    for (;;) {
        struct evlist l = {0};
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !e->incoming && !e->n_cancels && !e->cancel_all && !e->running &&
               !e->waiting)
            pthread_cond_wait(&e->cv, &e->mu);
        /* new requests join the waiting queue */
        if (e->incoming) {
            struct sreq **tail = &e->waiting;
            while (*tail) tail = &(*tail)->next;
            *tail = e->incoming;
            e->n_waiting_sched += e->n_incoming;
            e->incoming = e->incoming_tail = NULL;
            e->n_incoming = 0;
        }
        int nc = e->n_cancels, all = e->cancel_all, stopping = e->stopping;
        memcpy(cancels, e->cancels, sizeof(uint64_t) * (size_t)nc);
        e->n_cancels = 0;
        e->cancel_all = 0;
        pthread_mutex_unlock(&e->mu);

        if (nc || all) apply_cancels(e, &l, cancels, nc, all);
        if (stopping) {
            post(e, &l);
            break;
        }
        step(e, &l);

        pthread_mutex_lock(&e->mu);
        int running = 0;
        for (struct sreq *q = e->running; q; q = q->next) running++;
        e->st.running = running;
        e->st.waiting = e->n_waiting_sched;
        e->st.kv_blocks_used = e->kv.n_blocks - kv_free_blocks(&e->kv);
        e->st.prompt_tokens = e->c_prompt;
        e->st.generation_tokens = e->c_gen;
        e->st.preemptions = e->c_preempt;
        e->st.steps = e->c_steps;
        pthread_mutex_unlock(&e->mu);
        post(e, &l);
    }
    pthread_mutex_lock(&e->mu);
    e->st.running = 0;
    e->st.waiting = 0;
    e->st.kv_blocks_used = e->kv.n_blocks - kv_free_blocks(&e->kv);
    pthread_mutex_unlock(&e->mu);
    free(cancels);
    return NULL;
}
