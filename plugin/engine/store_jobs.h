/*
 * store_jobs.h -- the store threads of an agent whose store blocks (disk,
 * network: store_backend.blocking).  The worker never waits on such a store:
 * it queues a job here and goes on running the other turns; a store thread
 * runs the job and posts it back through the inbox (inbox_post + wakeup), the
 * way tool results come back.  Reads (loads) and writes (appends, expiry
 * sweeps) have a thread each, so a slow write never delays a turn's load.
 * With a non-blocking store (memory) there are no store threads: the turn
 * calls the store inline.
 *
 * Ownership: a job is the worker's until store_jobs_submit, the store
 * thread's while it runs, and the worker's again once it is taken from the
 * inbox (the worker frees it).  A job copies its key; an APPEND job borrows
 * the turn's messages, so its turn waits for it (turn.h).  `owner` is read
 * and written by the worker only: NULL means nobody waits for the result.
 */
#ifndef PARLEY_STORE_JOBS_H
#define PARLEY_STORE_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "engine/inbox.h"
#include "context/window.h"
#include "engine/reply_context.h"
#include "store/store.h"

typedef struct turn turn;
typedef struct store_jobs store_jobs;

/* LOAD takes the conversation's lease first when the store has leases (store.h
 * v2); RELEASE_LEASE gives back one a turn holds without having committed. */
typedef enum store_job_kind {
    STORE_JOB_LOAD,
    STORE_JOB_APPEND,
    STORE_JOB_EXPIRE,
    STORE_JOB_RELEASE_LEASE,
    STORE_JOB_SET_CONTEXT     /* the context record in turn.context (the job's own copy) */
} store_job_kind;

typedef struct store_job {
    inbox_note note;          /* first member: how the job comes back to the worker */
    store_job_kind kind;
    turn *owner;              /* worker only; NULL: the result goes nowhere */
    struct store_job *queue_next;

    /* what to do (LOAD, APPEND: key; LOAD: last_turns; APPEND: turn) */
    char *conversation_id, *persona, *interface_type; /* copies */
    size_t last_turns;        /* LOAD: max_history_turns (0 = no bound) */
    int plan_window;          /* LOAD: read the context record and load from its start */
    int summarize;            /* LOAD with plan_window: also what the summary has not folded */
    store_turn turn;          /* messages[] owned by the job, their JSON borrowed */
    char *expected;           /* SET_CONTEXT: the record it replaces (owned), NULL: any */
    size_t expected_len;
    uint64_t now_ms;

    /* what came of it, set by the store thread */
    parley_status status;
    char *err;                /* malloc'd, or NULL */
    pbuf loaded;              /* LOAD: the messages, "m1,m2," */
    size_t nmessages;         /* LOAD */
    ctx_window ctx;           /* LOAD with plan_window: the window found (moves to the turn) */
    int lease_taken;          /* LOAD: the lease is now held (give it back when the turn ends) */
    /* LOAD of a turn with reply_to: the turn it names, asked in the same store
     * call (reply_context.h); its result moves to the turn */
    reply_context reply;
    size_t window_turns;      /* the turns sent: where "in the window" ends */
    uint64_t lease_retry_ms;  /* LOAD, status PARLEY_ERR_BUSY: another holder's lease has this left */
} store_job;

/* The job for one store call (now_ms is taken when it runs); NULL on OOM. */
store_job *store_job_new(store_job_kind kind, const store_key *key);
void store_job_free(store_job *job);

/* Start the threads for store `s`, posting results to `box`; NULL on failure. */
store_jobs *store_jobs_start(store *s, inbox *box);
/* Queue a job (0), or -1 when the thread is stopping (the job stays the caller's). */
int store_jobs_submit(store_jobs *q, store_job *job);
/* Finish the jobs running, drop the queued ones (nobody waits for them: the
 * worker has ended every turn), join the threads, free.  NULL is a no-op. */
void store_jobs_stop(store_jobs *q);

#endif
