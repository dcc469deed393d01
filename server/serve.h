/* serve.h — the daemon: binds the socket, loads the model (on the libuv
 * thread pool, /health answers 503 meanwhile), routes requests, runs
 * /v1/completions against the engine, drains on SIGTERM/SIGINT, talks to
 * systemd (READY=1, STOPPING=1, EXTEND_TIMEOUT_USEC while loading).
 *
 * Routes: GET /health, GET /v1/models, GET /metrics, POST /v1/completions.
 *
 * Threads: serve_run runs the libuv loop on the calling thread; the engine
 * runs its scheduler thread; text prompts longer than SERVE_INLINE_TOKENIZE
 * bytes are tokenized on the libuv thread pool. */
#ifndef AWQD_SERVE_H
#define AWQD_SERVE_H

#include "config/cfg.h"

#define SERVE_INLINE_TOKENIZE 2048 /* bytes of prompt text tokenized on the loop thread */

/* Runs until SIGTERM/SIGINT (drained: returns 0) or a fatal error (a message
 * is logged; returns 1). */
int serve_run(const struct cfg *c);

#endif
