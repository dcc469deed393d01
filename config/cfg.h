/* cfg.h — the daemon's settings: one struct, filled from defaults, then a JSON
 * config file (cJSON), then command-line flags, in that order.
 *
 * Every setting has one entry in a table (cfg.c) that gives its JSON key, its
 * flag (the key with '-' for '_'), its type, its allowed range and its help
 * line, so the file format, the flags, `awqd serve --help` and the example
 * config can never disagree. Unknown keys and out-of-range values are refused
 * with a message naming the field and the allowed range.
 *
 * Not thread-safe while being filled; read-only (and shareable) afterwards. */
#ifndef AWQD_CFG_H
#define AWQD_CFG_H

#include <stddef.h>
#include <stdio.h>

#define CFG_MAX_DEVICES 16
#define CFG_STR 512

enum cfg_backend { CFG_BACKEND_AUTO = 0, CFG_BACKEND_CPU, CFG_BACKEND_CUDA };

struct cfg {
    char model[CFG_STR];             /* model directory (HF AWQ checkpoint) */
    char served_model_name[CFG_STR]; /* name in /v1/models; "" = basename of model */
    char host[CFG_STR];              /* listen address, default 127.0.0.1 */
    int port;                        /* default 8000 */
    int backend;                     /* enum cfg_backend; auto = cuda when a GPU is present */
    int tp;                          /* tensor-parallel size */
    int devices[CFG_MAX_DEVICES];    /* CUDA device ids, n_devices of them; none = 0..tp-1 */
    int n_devices;
    int max_model_len;               /* 0 = the model's max_position_embeddings */
    int max_batch_tokens;            /* tokens per scheduler step (prefill chunk budget) */
    int max_num_seqs;                /* sequences running at once */
    int max_waiting;                 /* waiting-queue bound; beyond it 429 */
    double gpu_memory_fraction;      /* share of GPU memory for weights + workspace + KV */
    int kv_block_size;               /* tokens per KV-cache block */
    int kv_cache_tokens;             /* KV capacity in tokens; 0 = auto (GPU: memory plan) */
    int cpu_threads;                 /* CPU backend threads; 0 = all cores */
    char api_key[CFG_STR];           /* Bearer key for the /v1 routes; "" = none */
    char api_key_file[CFG_STR];      /* file holding the key (first line) */
    long max_body_bytes;             /* request body limit (413) */
    int max_header_bytes;            /* header block limit (431) */
    int max_connections;             /* open connections */
    int idle_timeout_s;              /* keep-alive idle timeout */
    int request_timeout_s;           /* a request must arrive whole within this (408) */
    double shutdown_timeout_s;       /* SIGTERM: time given to in-flight requests */
    int log_level;                   /* enum log_level */
};

/* Fills the defaults. */
void cfg_defaults(struct cfg *c);

/* Applies a JSON object (text) / a JSON file. origin names the source in
 * messages. 0 on success, -EINVAL with a message otherwise. */
int cfg_load_json(struct cfg *c, const char *json, const char *origin, char *err, size_t errlen);
int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen);

/* Sets one setting from text, by JSON key ("max_model_len") or flag name
 * ("max-model-len"). */
int cfg_set(struct cfg *c, const char *key, const char *value, char *err, size_t errlen);

/* Parses argv: `--config FILE` is applied first wherever it stands, then every
 * `--flag VALUE` / `--flag=VALUE` in order. Arguments that are not settings are
 * an error unless `rest` is given: then they are collected there (pointers into
 * argv, *n_rest of them) for the caller. */
int cfg_parse_args(struct cfg *c, int argc, char **argv, char **rest, int *n_rest,
                   char *err, size_t errlen);

/* Cross-field checks (e.g. devices vs tp, api_key vs api_key_file). */
int cfg_validate(const struct cfg *c, char *err, size_t errlen);

/* Prints every flag with its range, default and help line. */
void cfg_print_help(FILE *f);

/* Writes the settings as a JSON object that cfg_load_json reads back. */
void cfg_print_json(FILE *f, const struct cfg *c);

/* Writes the example config (every key at its default) as JSON. */
void cfg_print_example(FILE *f);

const char *cfg_backend_name(int backend);

#endif
