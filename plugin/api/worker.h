/*
 * worker.h -- an agent's worker thread: an epoll loop (curl's sockets, the
 * inbox's wakeup) that drives the HTTP pool (llm_http.h), drains the
 * inbox (new turns, tool results, cancels, store results), fires timers,
 * keeps one turn at a time running per conversation ("lanes"), and is the
 * only caller of the turn events (turn.h).  For a store that blocks it also
 * owns the store threads (store_jobs.h) and sends the idle-expiry sweeps there.
 */
#ifndef PARLEY_WORKER_H
#define PARLEY_WORKER_H

#include <parley/plugin.h>
#include <stdint.h>

#include "engine/counters.h"
#include "engine/inbox.h"
#include "config/persona.h"
#include "store/store.h"

typedef struct worker worker;

typedef struct worker_setup {
    store *store;              /* borrowed; outlives the worker */
    const parley_host *host;   /* borrowed; outlives the worker */
    agent_counters *metrics;   /* borrowed; outlives the worker */
    persona_metrics *persona_metrics; /* borrowed; outlives the worker */
    uint64_t idle_timeout_ms;  /* the store's; 0: no expiry sweeps */
    size_t max_connections;    /* to the LLM server at once (the HTTP pool's cap) */
} worker_setup;

/* Start the thread (and the store threads when the store blocks).  NULL with *err. */
worker *worker_start(const worker_setup *setup, char **err);
/* 1 when the calling thread is w's: the host is inside one of its callbacks. */
int worker_is_current(const worker *w);
/* Where host threads post to this worker. */
inbox *worker_inbox(worker *w);
/* destroy(): end every turn (cancelled, or the outcome of an append in
 * flight), each with its done callback; join the threads; free. */
void worker_stop(worker *w);

#endif
