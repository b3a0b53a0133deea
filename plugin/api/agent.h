/*
 * agent.h -- one agent instance: the ABI facade over its config snapshot,
 * its history store and its worker.
 *
 * Ownership and threads, in one picture:
 *
 *   host threads --async_process/cancel/complete_tool_call--> inbox (mutex)
 *                                                               |  wakeup
 *   worker thread (worker.c): drains the inbox, runs every turn, owns every
 *   curl handle, every timer and every turn; calls every host callback.
 *   store threads (store_jobs.c, only for a store that blocks): one loads,
 *   one appends and sweeps, for the worker; results back through the inbox.
 *
 *   config: an immutable snapshot (config.h); each turn holds a reference
 *   from acceptance to its end, so swapping `cfg` changes no turn in flight.
 *   store: thread-safe (store.h); turns load and append, hosts read.
 */
#ifndef PARLEY_AGENT_H
#define PARLEY_AGENT_H

#include <parley/plugin.h>
#include <pthread.h>
#include <stdatomic.h>

#include "engine/config.h"
#include "engine/counters.h"
#include "engine/inbox.h"
#include "store/store.h"
#include "api/worker.h"

struct parley_agent {
    parley_host host;
    pthread_mutex_t cfg_mu;  /* guards the cfg pointer (not the snapshot: that never changes) */
    agent_config *cfg;       /* the current snapshot (one reference) */
    store *store;            /* history_store, opened once per agent */
    worker *worker;
    inbox *box;              /* the worker's; borrowed */
    atomic_uint_fast64_t next_request_id;
    agent_counters metrics;
    persona_metrics persona_metrics; /* per persona, for the agent's life */
};

#endif
