/* cfg.c — the settings table and its three readers (JSON, flags, help). */
#include "config/cfg.h"
#include "engine/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_STR, K_INT, K_LONG, K_DBL, K_BACKEND, K_LOGLEVEL, K_DEVICES };

struct setting {
    const char *key;    /* JSON key; the flag is "--" + key with '_' -> '-' */
    enum kind kind;
    size_t off;         /* offset in struct cfg */
    double min, max;    /* numeric range (inclusive) */
    const char *help;
};

#define F(field) offsetof(struct cfg, field)
static const struct setting SETTINGS[] = {
    {"model", K_STR, F(model), 0, 0, "model directory (a Hugging Face AWQ checkpoint)"},
    {"served_model_name", K_STR, F(served_model_name), 0, 0,
     "model name in the API (default: the model directory's name)"},
    {"host", K_STR, F(host), 0, 0, "address to listen on"},
    {"port", K_INT, F(port), 1, 65535, "TCP port"},
    {"backend", K_BACKEND, F(backend), 0, 0, "auto | cpu | cuda (auto: cuda when a GPU is present)"},
    {"tp", K_INT, F(tp), 1, CFG_MAX_DEVICES, "tensor-parallel size (GPUs, or threads on the CPU backend)"},
    {"devices", K_DEVICES, F(devices), 0, 255, "CUDA device ids, e.g. \"0,1\" (default 0..tp-1)"},
    {"max_model_len", K_INT, F(max_model_len), 0, 1 << 22,
     "longest prompt + completion in tokens (0: the model's maximum)"},
    {"max_batch_tokens", K_INT, F(max_batch_tokens), 16, 1 << 20, "tokens per engine step"},
    {"max_num_seqs", K_INT, F(max_num_seqs), 1, 4096, "sequences decoded at once"},
    {"max_waiting", K_INT, F(max_waiting), 1, 1 << 20, "queued requests before 429"},
    {"gpu_memory_fraction", K_DBL, F(gpu_memory_fraction), 0.05, 1.0,
     "share of GPU memory for weights, workspace and KV cache"},
    {"kv_block_size", K_INT, F(kv_block_size), 1, 256, "tokens per KV-cache block"},
    {"kv_cache_tokens", K_INT, F(kv_cache_tokens), 0, 1 << 26,
     "KV-cache capacity in tokens (0: auto; on GPUs what gpu_memory_fraction leaves)"},
    {"cpu_threads", K_INT, F(cpu_threads), 0, 1024, "CPU backend threads (0: the CPUs of the affinity mask, shared by the ranks)"},
    {"api_key", K_STR, F(api_key), 0, 0, "require 'Authorization: Bearer KEY' on /v1/*"},
    {"api_key_file", K_STR, F(api_key_file), 0, 0, "read the API key from this file"},
    {"max_body_bytes", K_LONG, F(max_body_bytes), 1024, 1073741824.0, "request body limit in bytes (413)"},
    {"max_header_bytes", K_INT, F(max_header_bytes), 1024, 1 << 20, "request header limit in bytes (431)"},
    {"max_connections", K_INT, F(max_connections), 1, 1 << 20, "open connections at most"},
    {"idle_timeout_s", K_INT, F(idle_timeout_s), 1, 86400, "keep-alive idle timeout in seconds"},
    {"request_timeout_s", K_INT, F(request_timeout_s), 1, 3600,
     "seconds a request may take to arrive whole (408)"},
    {"shutdown_timeout_s", K_DBL, F(shutdown_timeout_s), 0, 86400,
     "on SIGTERM, seconds given to in-flight requests"},
    {"log_level", K_LOGLEVEL, F(log_level), 0, 0, "debug | info | warn | error"},
};
#undef F
#define N_SETTINGS (sizeof SETTINGS / sizeof SETTINGS[0])

static const char *BACKENDS[] = {"auto", "cpu", "cuda"};
static const char *LEVELS[] = {"debug", "info", "warn", "error"};

const char *cfg_backend_name(int b) { return b >= 0 && b < 3 ? BACKENDS[b] : "?"; }

void cfg_defaults(struct cfg *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->host, "127.0.0.1");
    c->port = 8000;
    c->backend = CFG_BACKEND_AUTO;
    c->tp = 1;
    c->max_batch_tokens = 4096;
    c->max_num_seqs = 256;
    c->max_waiting = 1024;
    c->gpu_memory_fraction = 0.90;
    c->kv_block_size = 16;
    c->max_body_bytes = 8L << 20;
    c->max_header_bytes = 16384;
    c->max_connections = 1024;
    c->idle_timeout_s = 60;
    c->request_timeout_s = 30;
    c->shutdown_timeout_s = 30;
    c->log_level = LOG_INFO;
}

static const struct setting *find(const char *key) {
    char norm[64];
    size_t n = strlen(key);
    if (n >= sizeof norm) return NULL;
    for (size_t i = 0; i <= n; i++) norm[i] = key[i] == '-' ? '_' : key[i];
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strcmp(SETTINGS[i].key, norm) == 0) return &SETTINGS[i];
    return NULL;
}

static int enum_index(const char *v, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) return i;
    return -1;
}

static int range_err(const struct setting *s, const char *origin, const char *v, char *err,
                     size_t errlen) {
    return util_err(err, errlen, -EINVAL, "%s: %s = %s is out of range: allowed %g to %g", origin,
                    s->key, v, s->min, s->max);
}

/* Sets s from its text form (flags) — JSON numbers come here too, printed. */
static int set_text(struct cfg *c, const struct setting *s, const char *v, const char *origin,
                    char *err, size_t errlen) {
    char *p = (char *)c + s->off;
    char *end;
    switch (s->kind) {
    case K_STR:
        if (strlen(v) >= CFG_STR)
            return util_err(err, errlen, -EINVAL, "%s: %s is longer than %d bytes", origin, s->key,
                            CFG_STR - 1);
        strcpy(p, v);
        return 0;
    case K_INT:
    case K_LONG: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno)
            return util_err(err, errlen, -EINVAL, "%s: %s must be an integer, got \"%s\"", origin,
                            s->key, v);
        if ((double)x < s->min || (double)x > s->max) return range_err(s, origin, v, err, errlen);
        if (s->kind == K_INT) *(int *)p = (int)x;
        else *(long *)p = (long)x;
        return 0;
    }
    case K_DBL: {
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return util_err(err, errlen, -EINVAL, "%s: %s must be a number, got \"%s\"", origin,
                            s->key, v);
        if (x < s->min || x > s->max) return range_err(s, origin, v, err, errlen);
        *(double *)p = x;
        return 0;
    }
    case K_BACKEND:
    case K_LOGLEVEL: {
        const char **names = s->kind == K_BACKEND ? BACKENDS : LEVELS;
        int n = s->kind == K_BACKEND ? 3 : 4;
        int i = enum_index(v, names, n);
        if (i < 0)
            return util_err(err, errlen, -EINVAL, "%s: %s = \"%s\" is not one of: %s", origin,
                            s->key, v, s->kind == K_BACKEND ? "auto, cpu, cuda"
                                                            : "debug, info, warn, error");
        *(int *)p = i;
        return 0;
    }
    case K_DEVICES: {
        int ids[CFG_MAX_DEVICES];
        int n = util_parse_int_list(v, ids, CFG_MAX_DEVICES);
        if (n < 0)
            return util_err(err, errlen, -EINVAL,
                            "%s: devices must be a list of up to %d device ids like \"0,1\", got \"%s\"",
                            origin, CFG_MAX_DEVICES, v);
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] > 255)
                return util_err(err, errlen, -EINVAL, "%s: devices: id %d out of range 0 to 255",
                                origin, ids[i]);
            for (int j = 0; j < i; j++)
                if (ids[i] == ids[j])
                    return util_err(err, errlen, -EINVAL, "%s: devices: id %d listed twice", origin,
                                    ids[i]);
        }
        memcpy(c->devices, ids, sizeof(int) * (size_t)n);
        c->n_devices = n;
        return 0;
    }
    }
    return -EINVAL;
}

int cfg_set(struct cfg *c, const char *key, const char *value, char *err, size_t errlen) {
    const struct setting *s = find(key);
    if (!s) return util_err(err, errlen, -EINVAL, "unknown setting \"%s\"", key);
    char origin[80];
    snprintf(origin, sizeof origin, "--%s", key);
    return set_text(c, s, value, origin, err, errlen);
}

static int set_json(struct cfg *c, const struct setting *s, const cJSON *v, const char *origin,
                    char *err, size_t errlen) {
    char buf[64];
    switch (s->kind) {
    case K_STR:
    case K_BACKEND:
    case K_LOGLEVEL:
        if (!cJSON_IsString(v))
            return util_err(err, errlen, -EINVAL, "%s: %s must be a string", origin, s->key);
        return set_text(c, s, v->valuestring, origin, err, errlen);
    case K_INT:
    case K_LONG:
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            return util_err(err, errlen, -EINVAL, "%s: %s must be an integer", origin, s->key);
        if (v->valuedouble < s->min || v->valuedouble > s->max) {
            snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
            return range_err(s, origin, buf, err, errlen);
        }
        snprintf(buf, sizeof buf, "%.0f", v->valuedouble);
        return set_text(c, s, buf, origin, err, errlen);
    case K_DBL:
        if (!cJSON_IsNumber(v))
            return util_err(err, errlen, -EINVAL, "%s: %s must be a number", origin, s->key);
        snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
        return set_text(c, s, buf, origin, err, errlen);
    case K_DEVICES: {
        if (cJSON_IsString(v)) return set_text(c, s, v->valuestring, origin, err, errlen);
        if (!cJSON_IsArray(v))
            return util_err(err, errlen, -EINVAL, "%s: devices must be an array of integers",
                            origin);
        char list[256] = "";
        size_t len = 0;
        int n = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
                e->valuedouble < 0 || e->valuedouble > 255)
                return util_err(err, errlen, -EINVAL,
                                "%s: devices must be an array of integers 0 to 255", origin);
            if (++n > CFG_MAX_DEVICES)
                return util_err(err, errlen, -EINVAL, "%s: devices: more than %d entries", origin,
                                CFG_MAX_DEVICES);
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", n > 1 ? "," : "",
                                    (int)e->valuedouble);
        }
        return set_text(c, s, list, origin, err, errlen);
    }
    }
    return -EINVAL;
}

int cfg_load_json(struct cfg *c, const char *json, const char *origin, char *err, size_t errlen) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at ? (long)(at - json) : -1;
        return util_err(err, errlen, -EINVAL, "%s: not valid JSON (near byte %ld)", origin, off);
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = util_err(err, errlen, -EINVAL, "%s: the config must be a JSON object", origin);
        goto out;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        const struct setting *s = item->string ? find(item->string) : NULL;
        if (!s || strchr(item->string, '-')) {
            rc = util_err(err, errlen, -EINVAL, "%s: unknown key \"%s\" (see config/awqd.example.json)",
                          origin, item->string ? item->string : "");
            goto out;
        }
        if ((rc = set_json(c, s, item, origin, err, errlen)) != 0) goto out;
    }
out:
    cJSON_Delete(root);
    return rc;
}

int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen) {
    char *text;
    int rc = util_read_file(path, 1 << 20, &text, NULL, err, errlen);
    if (rc) return rc;
    rc = cfg_load_json(c, text, path, err, errlen);
    free(text);
    return rc;
}

int cfg_parse_args(struct cfg *c, int argc, char **argv, char **rest, int *n_rest, char *err,
                   size_t errlen) {
    if (n_rest) *n_rest = 0;
    /* --config first, wherever it stands */
    for (int i = 0; i < argc; i++) {
        const char *path = NULL;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) return util_err(err, errlen, -EINVAL, "--config needs a file");
            path = argv[i + 1];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            path = argv[i] + 9;
        }
        if (path) {
            int rc = cfg_load_file(c, path, err, errlen);
            if (rc) return rc;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) { i++; continue; }
        if (strncmp(a, "--config=", 9) == 0) continue;
        const struct setting *s = NULL;
        char key[64];
        const char *val = NULL;
        if (strncmp(a, "--", 2) == 0) {
            const char *eq = strchr(a + 2, '=');
            size_t klen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (klen < sizeof key) {
                memcpy(key, a + 2, klen);
                key[klen] = 0;
                s = strchr(key, '_') ? NULL : find(key);
                if (eq) val = eq + 1;
            }
        }
        if (!s) {
            if (rest) { rest[(*n_rest)++] = argv[i]; continue; }
            return util_err(err, errlen, -EINVAL, "unknown option \"%s\" (see --help)", a);
        }
        if (!val) {
            if (i + 1 >= argc) return util_err(err, errlen, -EINVAL, "--%s needs a value", key);
            val = argv[++i];
        }
        char origin[80];
        snprintf(origin, sizeof origin, "--%s", key);
        int rc = set_text(c, s, val, origin, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int cfg_validate(const struct cfg *c, char *err, size_t errlen) {
    if (c->n_devices && c->n_devices != c->tp)
        return util_err(err, errlen, -EINVAL, "devices lists %d ids but tp is %d: give one per rank",
                        c->n_devices, c->tp);
    if (c->api_key[0] && c->api_key_file[0])
        return util_err(err, errlen, -EINVAL, "api_key and api_key_file are exclusive: give one");
    if (c->max_batch_tokens < c->kv_block_size)
        return util_err(err, errlen, -EINVAL, "max_batch_tokens (%d) must be at least kv_block_size (%d)",
                        c->max_batch_tokens, c->kv_block_size);
    return 0;
}

static void print_value(FILE *f, const struct cfg *c, const struct setting *s, int json) {
    const char *p = (const char *)c + s->off;
    switch (s->kind) {
    case K_STR:
        if (json) { /* escaped by cJSON, so any path reads back */
            cJSON *str = cJSON_CreateString(p);
            char *txt = str ? cJSON_PrintUnformatted(str) : NULL;
            fputs(txt ? txt : "\"\"", f);
            cJSON_free(txt);
            cJSON_Delete(str);
        } else {
            fputs(p, f);
        }
        break;
    case K_INT: fprintf(f, "%d", *(const int *)p); break;
    case K_LONG: fprintf(f, "%ld", *(const long *)p); break;
    case K_DBL: fprintf(f, "%g", *(const double *)p); break;
    case K_BACKEND: fprintf(f, json ? "\"%s\"" : "%s", BACKENDS[*(const int *)p]); break;
    case K_LOGLEVEL: fprintf(f, json ? "\"%s\"" : "%s", LEVELS[*(const int *)p]); break;
    case K_DEVICES:
        fputs(json ? "[" : "", f);
        for (int i = 0; i < c->n_devices; i++) fprintf(f, "%s%d", i ? "," : "", c->devices[i]);
        fputs(json ? "]" : "", f);
        break;
    }
}

void cfg_print_help(FILE *f) {
    struct cfg d;
    cfg_defaults(&d);
    fprintf(f, "Settings (flag = JSON key with '-' for '_'; --config FILE loads a JSON file first):\n");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const struct setting *s = &SETTINGS[i];
        char flag[64];
        size_t j;
        for (j = 0; s->key[j] && j < sizeof flag - 1; j++) flag[j] = s->key[j] == '_' ? '-' : s->key[j];
        flag[j] = 0;
        fprintf(f, "  --%-22s %s", flag, s->help);
        if (s->kind == K_INT || s->kind == K_LONG || s->kind == K_DBL)
            fprintf(f, " [%g..%g]", s->min, s->max);
        fprintf(f, " (default: ");
        print_value(f, &d, s, 0);
        fprintf(f, ")\n");
    }
}

void cfg_print_json(FILE *f, const struct cfg *c) {
    fprintf(f, "{\n");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        fprintf(f, "  \"%s\": ", SETTINGS[i].key);
        print_value(f, c, &SETTINGS[i], 1);
        fprintf(f, "%s\n", i + 1 < N_SETTINGS ? "," : "");
    }
    fprintf(f, "}\n");
}

void cfg_print_example(FILE *f) {
    struct cfg d;
    cfg_defaults(&d);
    cfg_print_json(f, &d);
}
