/* store_jobs.c -- see store_jobs.h. */
#include "engine/store_jobs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"

/*
 * Two threads, one queue each: reads (LOAD) and writes (APPEND, EXPIRE).
 * A slow write (an fsync) then delays the writes queued behind it, never a
 * turn that only needs to read its history.  Safe because the worker runs
 * one turn at a time per conversation: a conversation's next load is queued
 * only after its previous append came back.  Each queue is FIFO.
 */
typedef struct job_queue {
    struct store_jobs *owner;
    pthread_t thread;
    pthread_cond_t cv;
    store_job *head, *tail;
    int started;
} job_queue;

enum { READS, WRITES, NQUEUES };

struct store_jobs {
    store *store;
    inbox *box;
    pthread_mutex_t mu;       /* guards both queues and `stopping` */
    job_queue queues[NQUEUES];
    int stopping;
};

store_job *store_job_new(store_job_kind kind, const store_key *key)
{
    store_job *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    job->kind = kind;
    if (key) {
        job->conversation_id = strdup(key->conversation_id);
        job->persona = strdup(key->persona ? key->persona : "");
        job->interface_type = strdup(key->interface_type ? key->interface_type : "");
        if (!job->conversation_id || !job->persona || !job->interface_type) {
            store_job_free(job);
            return NULL;
        }
    }
    return job;
}

void store_job_free(store_job *job)
{
    if (!job)
        return;
    free(job->conversation_id);
    free(job->persona);
    free(job->interface_type);
    free((void *)job->turn.messages);
    if (job->kind == STORE_JOB_SET_CONTEXT)
        free((void *)job->turn.context); /* its own copy */
    free(job->expected);
    free(job->err);
    pbuf_free(&job->loaded);
    ctx_window_free(&job->ctx);
    reply_context_free(&job->reply);
    free(job);
}

static void run(store *s, store_job *job)
{
    store_key key = {job->conversation_id, job->persona, job->interface_type};
    job->now_ms = clock_wall_ms();
    switch (job->kind) {
    case STORE_JOB_LOAD:
        if (store_shared(s)) {
            job->status = store_lease_acquire(s, &key, &job->lease_retry_ms, &job->err);
            if (job->status != PARLEY_OK)
                break; /* BUSY: the turn tries again later */
            job->lease_taken = 1;
        }
        job->status = job->plan_window
                          ? ctx_load(s, &key, job->last_turns, job->summarize, job->now_ms,
                                     &job->loaded, &job->nmessages, &job->ctx, &job->err)
                          : store_load(s, &key, job->last_turns, job->now_ms, &job->loaded,
                                       &job->nmessages, &job->err);
        if (job->status == PARLEY_OK && reply_context_wanted(&job->reply))
            job->status = reply_context_load(s, &key,
                                             ctx_reply_window(&job->ctx, job->window_turns),
                                             job->now_ms, &job->reply, &job->err);
        break;
    case STORE_JOB_RELEASE_LEASE:
        store_lease_release(s, &key);
        job->status = PARLEY_OK;
        break;
    case STORE_JOB_SET_CONTEXT:
        job->status = store_context_set(s, &key, job->turn.context, job->turn.context_len,
                                        job->expected, job->expected_len, job->now_ms,
                                        &job->err);
        break;
    case STORE_JOB_APPEND:
        job->status = store_append(s, &key, &job->turn, job->now_ms, &job->err);
        break;
    case STORE_JOB_EXPIRE:
        job->status = store_expire(s, job->now_ms, NULL, &job->err);
        break;
    }
}

static void *store_thread(void *arg)
{
    job_queue *jq = arg;
    store_jobs *q = jq->owner;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!jq->head && !q->stopping)
            pthread_cond_wait(&jq->cv, &q->mu);
        if (q->stopping)
            break;
        store_job *job = jq->head;
        jq->head = job->queue_next;
        if (!jq->head)
            jq->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        run(q->store, job);
        if (inbox_post(q->box, &job->note) != 0)
            store_job_free(job); /* the worker is gone: nobody waits for it */
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

store_jobs *store_jobs_start(store *s, inbox *box)
{
    store_jobs *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->store = s;
    q->box = box;
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        free(q);
        return NULL;
    }
    for (int i = 0; i < NQUEUES; i++) {
        job_queue *jq = &q->queues[i];
        jq->owner = q;
        if (pthread_cond_init(&jq->cv, NULL) != 0)
            break;
        if (pthread_create(&jq->thread, NULL, store_thread, jq) != 0) {
            pthread_cond_destroy(&jq->cv);
            break;
        }
        jq->started = 1;
    }
    if (!q->queues[NQUEUES - 1].started) {
        store_jobs_stop(q);
        return NULL;
    }
    return q;
}

int store_jobs_submit(store_jobs *q, store_job *job)
{
    int rc = -1;
    /* A lease is given back on the read thread, ahead of the next turn's LOAD. */
    int read = job->kind == STORE_JOB_LOAD || job->kind == STORE_JOB_RELEASE_LEASE;
    job_queue *jq = &q->queues[read ? READS : WRITES];
    job->queue_next = NULL;
    pthread_mutex_lock(&q->mu);
    if (!q->stopping) {
        if (jq->tail)
            jq->tail->queue_next = job;
        else
            jq->head = job;
        jq->tail = job;
        pthread_cond_signal(&jq->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

void store_jobs_stop(store_jobs *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    for (int i = 0; i < NQUEUES; i++)
        if (q->queues[i].started)
            pthread_cond_signal(&q->queues[i].cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < NQUEUES; i++) {
        job_queue *jq = &q->queues[i];
        if (!jq->started)
            continue;
        pthread_join(jq->thread, NULL);
        pthread_cond_destroy(&jq->cv);
        for (store_job *job = jq->head, *next; job; job = next) {
            next = job->queue_next;
            store_job_free(job);
        }
    }
    pthread_mutex_destroy(&q->mu);
    free(q);
}
