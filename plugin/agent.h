/*
 * agent.h -- one agent instance: its options, its history, and its worker.
 *
 * Ownership and threads, in one picture:
 *
 *   host threads --async_process/cancel/complete_tool_call--> inbox (mutex)
 *                                                               |  wakeup
 *   worker thread: drains the inbox, runs every turn, owns every curl
 *   handle, every timer and every turn; calls every host callback.
 *
 *   history: its own mutex; the worker renders and commits, hosts dump.
 *
 * The inbox is reference-counted apart from the agent because tool-call
 * handles may outlive the agent (the host must complete each one, even after
 * destroy): a late completion then finds a dead inbox and is dropped.
 */
#ifndef PARLEY_AGENT_H
#define PARLEY_AGENT_H

#include <curl/curl.h>
#include <parley/plugin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "dict.h"
#include "history.h"
#include "llm_http.h"
#include "options.h"
#include "timer_heap.h"
#include "toolset.h"

typedef struct turn turn;

typedef struct inbox {
    pthread_mutex_t mu;
    int refs;               /* the agent + one per tool-call handle not yet completed */
    int alive;              /* 0 once the worker stopped: submissions refused */
    int stop;               /* destroy() asked the worker to stop */
    CURLM *multi;           /* woken with curl_multi_wakeup while alive */
    turn *submitted_head;   /* accepted turns not yet picked up by the worker */
    turn *submitted_tail;
    parley_tool_call *completed; /* completed tool calls not yet picked up */
    uint64_t *cancels;      /* request ids whose cancel was asked */
    size_t ncancels, cancels_cap;
    dict *live;             /* request id (text) -> turn, from accept until its callback */
} inbox;

/* Tool-call handle; the host holds its id instead (tool_handle.h). */
struct parley_tool_call {
    char key[24];           /* its id as text: key in the process-wide registry */
    inbox *box;
    turn *owner;            /* NULL once detached (turn ended, or timed out waiting) */
    size_t index;           /* which call of the owner's current round */
    char *result;
    int is_error;
    parley_tool_call *next; /* in inbox.completed */
};

typedef struct agent_counters {
    atomic_uint_fast64_t turns_accepted, turns_ok, turns_failed, turns_cancelled;
    /* tokens, as the servers counted them, over every request */
    atomic_uint_fast64_t tokens_prompt, tokens_completion, tokens_cache_read;
    atomic_uint_fast64_t tokens_cache_creation, tokens_reasoning;
    atomic_uint_fast64_t answers_cut_short; /* turns whose answer hit max_tokens */
    atomic_uint_fast64_t llm_requests, llm_retries, tool_calls, tool_errors, tool_timeouts;
    atomic_uint_fast64_t rejected_busy, rejected_invalid;
    atomic_int_fast64_t in_flight;
} agent_counters;

struct parley_agent {
    parley_host host;
    parley_options opts;
    toolset *tools;          /* from the options; read-only after create */
    const struct provider *prov; /* the `provider` option's codec */
    history *hist;
    http_config http;        /* shared by every request; read-only after create */
    struct curl_slist *headers;
    char *url;
    char *display_url;       /* url without credentials, query or fragment: for messages */
    inbox *box;
    pthread_t thread;
    atomic_uint_fast64_t next_request_id;
    agent_counters metrics;

    /* ---- owned by the worker thread ---- */
    http_pool pool;          /* the transfers, at most max_connections at once */
    CURLM *multi;            /* pool.multi */
    timer_heap timers;
    dict *lanes;             /* conversation id -> lane: one turn at a time per conversation */
    turn *all_head;          /* every turn the worker holds */
    turn *ready_head;        /* turns whose conversation is free: begin them next */
    turn *ready_tail;
    int stopping;            /* the worker is cancelling everything */
    struct reaped_transfer { http_call *call; CURLcode result; } *reaped; /* reap batch */
    size_t reaped_cap;
    uint64_t next_expiry_sweep_ms;
};

/* Logging through the host's callback (any thread). */
void agent_log(parley_agent *a, parley_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Worker (worker.c). */
int worker_start(parley_agent *a);
void worker_stop(parley_agent *a); /* cancel everything, join */
void inbox_unref(inbox *box);

#endif
