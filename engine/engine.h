/* engine.h — the engine as the server sees it: load a model, submit typed
 * requests, receive their tokens and text as events, cancel, read stats.
 * No JSON, no sockets, no libuv here: the server owns the wire formats.
 *
 * Usage:
 *     struct engine_opts o; engine_opts_defaults(&o);
 *     o.model_dir = "models/tiny"; o.notify = wake_loop; o.notify_ud = async;
 *     struct engine *e;
 *     if (engine_init(&e, &o, err, sizeof err)) { ... }   // slow: loads the model
 *     engine_start(e, err, sizeof err);                   // starts the scheduler thread
 *     struct engine_request r = {...};                    // prompt ids + params
 *     uint64_t id; engine_submit(e, &r, &id, err, sizeof err);
 *     ... notify() fires (scheduler thread) -> on the consumer thread:
 *     struct engine_event *ev = engine_poll(e);   // a list, oldest first
 *     for (; ev; ev = next) { next = ev->next; ...; engine_event_free(ev); }
 *     engine_stop(e); engine_free(e);
 *
 * Lifecycle of a request: engine_submit copies everything it needs (the
 * caller's buffers may go away). Events for it carry r.ud. Each choice (n of
 * them) gets ENGINE_EV_TOKENS events (text deltas that are whole UTF-8
 * characters and never hold any part of a stop string), then one
 * ENGINE_EV_FINISH with its finish reason; the request then gets exactly one
 * ENGINE_EV_END, after which the engine never mentions r.ud again. A cancelled
 * request (engine_cancel, e.g. the client went away) gets its END at the next
 * scheduler step and its KV blocks are free by then.
 *
 * Threads: engine_submit / engine_cancel / engine_poll / engine_stats may be
 * called from any thread (one consumer should poll). notify is called from the
 * scheduler thread, without engine locks held; it must be cheap and must not
 * call back into the engine (uv_async_send fits). */
#ifndef AWQD_ENGINE_H
#define AWQD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

struct tok;
struct engine;

#define ENGINE_MAX_STOP 4          /* stop strings per request */
#define ENGINE_MAX_STOP_LEN 256    /* bytes per stop string */
#define ENGINE_MAX_STOP_IDS 64     /* stop_token_ids per request */
#define ENGINE_MAX_LOGIT_BIAS 300  /* logit_bias entries per request */
#define ENGINE_MAX_LOGPROBS 5      /* top logprobs per token */
#define ENGINE_MAX_N 16            /* choices per request */

struct engine_opts {
    const char *model_dir;
    int backend;                /* enum cfg_backend (config/cfg.h): auto, cpu, cuda */
    int tp;
    const int *devices;         /* n_devices CUDA ids, or NULL */
    int n_devices;
    int max_model_len;          /* 0: the model's max_position_embeddings */
    int max_batch_tokens;       /* tokens per scheduler step (prefill chunk budget) */
    int max_num_seqs;           /* sequences running at once */
    int max_waiting;            /* waiting requests before -EAGAIN */
    int kv_block_size;          /* tokens per KV block */
    int kv_cache_tokens;        /* KV capacity in tokens (0: auto: CPU 8 full sequences, CUDA the memory plan) */
    double gpu_memory_fraction;
    int cpu_threads;
    void (*notify)(void *ud);   /* events are ready (scheduler thread) */
    void *notify_ud;
};

void engine_opts_defaults(struct engine_opts *o);

/* A request, as the server built it from the JSON. All lengths are checked by
 * engine_submit against the engine's limits (-EINVAL + message). */
struct engine_request {
    const int32_t *prompt;      /* [n_prompt] token ids, each < vocab */
    int n_prompt;               /* >= 1 */
    int n;                      /* choices sharing the prefilled prompt, 1..ENGINE_MAX_N */
    int max_tokens;             /* >= 1 (0 only with echo: nothing generated) */
    /* sampling */
    float temperature;          /* 0 = greedy */
    float top_p;                /* (0, 1] */
    int top_k;                  /* 0 or -1 = off */
    float min_p;                /* [0, 1] */
    float presence_penalty;     /* [-2, 2] */
    float frequency_penalty;    /* [-2, 2] */
    float repetition_penalty;   /* (0, 2], 1 = off */
    int n_logit_bias;
    const int32_t *logit_bias_ids;  /* [n_logit_bias] */
    const float *logit_bias_vals;   /* [n_logit_bias], [-100, 100] */
    int has_seed;
    uint64_t seed;              /* choice i uses seed + i */
    /* output */
    int logprobs;               /* -1: none; 0..5: sampled token's logprob + top-N */
    int prompt_logprobs;        /* echo with logprobs: logprobs of the prompt tokens too */
    int n_stop;
    const char *stop[ENGINE_MAX_STOP];   /* NUL-terminated, 1..ENGINE_MAX_STOP_LEN bytes */
    int n_stop_ids;
    const int32_t *stop_ids;    /* [n_stop_ids] */
    int ignore_eos;
    int min_tokens;             /* no EOS / stop before this many tokens */
    int skip_special_tokens;    /* leave special tokens out of the text */
    int include_stop_str_in_output;
    void *ud;                   /* handed back in every event */
};

enum engine_event_kind {
    ENGINE_EV_TOKENS = 0,  /* new tokens (and text) of one choice */
    ENGINE_EV_FINISH = 1,  /* one choice is done: finish */
    ENGINE_EV_END = 2,     /* the request is done: free what refers to it */
};

enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,      /* EOS, a stop string or a stop token id */
    ENGINE_FINISH_LENGTH,    /* max_tokens or the context length */
    ENGINE_FINISH_CANCELLED, /* engine_cancel / shutdown */
    ENGINE_FINISH_ERROR,     /* e.g. out of KV memory for a single sequence */
};

/* One generated (or prompt) token with its log-probabilities. */
struct engine_token {
    int32_t id;
    float logprob;             /* of this token under the (processed) distribution; NAN for
                                  the first prompt token */
    int n_top;                 /* 0..ENGINE_MAX_LOGPROBS */
    int32_t top_ids[ENGINE_MAX_LOGPROBS];
    float top_logprobs[ENGINE_MAX_LOGPROBS];
};

struct engine_event {
    struct engine_event *next;
    enum engine_event_kind kind;
    void *ud;
    uint64_t req_id;
    int choice;                /* 0..n-1 (TOKENS, FINISH) */
    char *text;                /* TOKENS: text delta, valid UTF-8, NUL-terminated (may be "") */
    size_t text_len;
    int n_tokens;              /* TOKENS: tokens this event covers */
    struct engine_token *tokens; /* [n_tokens]; logprob fields valid when logprobs >= 0 */
    int is_prompt;             /* TOKENS: these are prompt tokens (echo + logprobs) */
    enum engine_finish finish; /* FINISH */
    int prompt_tokens;         /* FINISH, END: usage */
    int completion_tokens;     /* FINISH: this choice; END: all choices */
    uint64_t t_ns;             /* util_now_ns() when produced */
    uint64_t t_submit_ns;      /* when submitted */
    uint64_t t_sched_ns;       /* when first scheduled (queue time = sched - submit); 0 if never */
    char message[160];         /* FINISH with ERROR: why */
};

struct engine_stats {
    int running;               /* requests with sequences in the batch */
    int waiting;               /* requests queued, not yet admitted (incl. preempted) */
    int kv_blocks_total;
    int kv_blocks_used;
    uint64_t prompt_tokens;    /* counters since start */
    uint64_t generation_tokens;
    uint64_t preemptions;
    uint64_t steps;
};

struct engine_info {
    char model_name[256];      /* basename of model_dir */
    int vocab;                 /* token ids are < vocab */
    int max_model_len;         /* prompt + completion limit */
    int kv_block_size;
    int kv_blocks_total;
    int max_waiting;
    const char *backend;       /* "cpu" / "cuda" */
};

int engine_init(struct engine **out, const struct engine_opts *o, char *err, size_t errlen);
const struct engine_info *engine_get_info(const struct engine *e);
/* The model's tokenizer (thread-safe after load), or NULL when it has none. */
struct tok *engine_tok(const struct engine *e);
int engine_start(struct engine *e, char *err, size_t errlen);

/* 0 with *id; -EAGAIN when the waiting queue is full; -EINVAL (message) for a
 * request the engine cannot run (too long, bad ids); -ESHUTDOWN once stopping. */
int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id, char *err,
                  size_t errlen);
/* Cancels a request; its END event follows. Unknown / finished ids: no-op. */
void engine_cancel(struct engine *e, uint64_t id);
/* Takes every queued event (a list, oldest first), or NULL. */
struct engine_event *engine_poll(struct engine *e);
void engine_event_free(struct engine_event *ev);
void engine_stats(struct engine *e, struct engine_stats *st);
/* Requests submitted and not yet ENDed. */
int engine_active(struct engine *e);
/* Cancels everything, stops the scheduler thread (joins it). */
void engine_stop(struct engine *e);
void engine_free(struct engine *e);

const char *engine_finish_name(enum engine_finish f); /* "stop", "length", ... */

#endif
