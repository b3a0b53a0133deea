/* worker.c -- see worker.h. */
#include "api/worker.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "lib/clock.h"
#include "lib/dict.h"
#include "lib/host_log.h"
#include "engine/store_jobs.h"
#include "engine/timer_heap.h"
#include "turn/turn.h"

/* Turns of one conversation: the running one, then the waiting ones in order. */
struct lane {
    turn *active;
    turn *queue_head, *queue_tail;
    char id[]; /* the conversation id */
};

static const char *lane_key(const void *e) { return ((const struct lane *)e)->id; }

#define EXPIRY_SWEEP_MS 1000
#define EPOLL_BATCH 256

struct worker {
    inbox *box;
    int epoll_fd;            /* the loop waits here: curl's sockets and the inbox's wakeup */
    http_pool pool;          /* the transfers, at most max_connections at once */
    timer_heap timers;
    dict *lanes;             /* conversation id -> lane: one turn at a time per conversation */
    turn *all_head;          /* every turn the worker holds */
    turn *ready_head;        /* turns whose conversation is free: begin them next */
    turn *ready_tail;
    int stopping;            /* the worker is cancelling everything */
    store *store;
    store_jobs *jobs;        /* the store threads, when the store blocks */
    uint64_t idle_timeout_ms;
    uint64_t next_expiry_sweep_ms;
    int expiry_in_flight;    /* a sweep job is with the store threads */
    const parley_host *host;
    agent_counters *metrics;
    persona_metrics *persona_metrics;
    turn_env env;            /* what every turn sees */
    ctx_agent ctx;           /* env.ctx points here */
    pthread_t thread;
};

/* ---- the turn lists ---------------------------------------------------- */

static void ready_push(worker *w, turn *t)
{
    t->link.ready_next = NULL;
    t->link.in_ready = 1;
    if (w->ready_tail)
        w->ready_tail->link.ready_next = t;
    else
        w->ready_head = t;
    w->ready_tail = t;
}

/* A turn may end (cancelled) before it began: take it off the ready list. */
static void ready_unlink(worker *w, turn *t)
{
    if (!t->link.in_ready)
        return;
    turn *prev = NULL;
    for (turn *it = w->ready_head; it; prev = it, it = it->link.ready_next) {
        if (it != t)
            continue;
        if (prev)
            prev->link.ready_next = t->link.ready_next;
        else
            w->ready_head = t->link.ready_next;
        if (w->ready_tail == t)
            w->ready_tail = prev;
        break;
    }
    t->link.in_ready = 0;
}

static void all_link(worker *w, turn *t)
{
    t->link.all_prev = NULL;
    t->link.all_next = w->all_head;
    if (w->all_head)
        w->all_head->link.all_prev = t;
    w->all_head = t;
}

static void all_unlink(worker *w, turn *t)
{
    if (t->link.all_prev)
        t->link.all_prev->link.all_next = t->link.all_next;
    else if (w->all_head == t)
        w->all_head = t->link.all_next;
    if (t->link.all_next)
        t->link.all_next->link.all_prev = t->link.all_prev;
    t->link.all_prev = t->link.all_next = NULL;
}

/*
 * A new turn: stateless ones begin at once, others wait for their conversation.
 * Its deadline runs from acceptance, so time queued behind the conversation's
 * other turns counts: a host can bound async_process-to-done by turn_timeout_ms.
 */
static void schedule(worker *w, turn *t)
{
    t->env = &w->env;
    all_link(w, t);
    if (timer_arm(&w->timers, &t->deadline,
                  t->accepted_mono_ms + (uint64_t)t->cfg->opts.turn_timeout_ms) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (!t->conv.conversation_id) {
        ready_push(w, t);
        return;
    }
    struct lane *l = dict_find(w->lanes, t->conv.conversation_id);
    if (!l) {
        size_t n = strlen(t->conv.conversation_id);
        l = calloc(1, sizeof *l + n + 1);
        if (l)
            memcpy(l->id, t->conv.conversation_id,
                   n + 1); /* the key: set before dict_add reads it */
        if (!l || dict_add(w->lanes, l) != 0) {
            free(l);
            turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
            return;
        }
    }
    t->link.lane = l;
    if (!l->active) {
        l->active = t;
        ready_push(w, t);
    } else {
        t->link.lane_next = NULL;
        if (l->queue_tail)
            l->queue_tail->link.lane_next = t;
        else
            l->queue_head = t;
        l->queue_tail = t;
    }
}

/* The turn is about to call back: it is no longer live (cancel finds it no more). */
static void forget(worker *w, turn *t)
{
    inbox_forget(w->box, &t->submitted);
    atomic_fetch_sub(&w->metrics->in_flight, 1);
}

static void lane_unlink_waiting(struct lane *l, turn *t)
{
    turn **pp = &l->queue_head, *prev = NULL;
    while (*pp && *pp != t) {
        prev = *pp;
        pp = &(*pp)->link.lane_next;
    }
    if (!*pp)
        return;
    *pp = t->link.lane_next;
    if (l->queue_tail == t)
        l->queue_tail = prev;
}

/* The turn has called back: start the next turn of its conversation, free it. */
static void release(worker *w, turn *t)
{
    struct lane *l = t->link.lane;
    if (l) {
        if (l->active == t) {
            l->active = l->queue_head;
            if (l->active) {
                l->queue_head = l->active->link.lane_next;
                if (!l->queue_head)
                    l->queue_tail = NULL;
                if (!w->stopping)
                    ready_push(w, l->active);
            }
        } else {
            lane_unlink_waiting(l, t);
        }
        if (!l->active && !l->queue_head) {
            dict_remove(w->lanes, l->id);
            free(l);
        }
    }
    ready_unlink(w, t);
    all_unlink(w, t);
    turn_free(t);
}

/* env->ended: the one way a turn tells the worker it is over. */
static void on_turn_ended(void *worker_ud, turn *t)
{
    worker *w = worker_ud;
    forget(w, t);
    turn_report(t);
    release(w, t);
}

/* ---- the inbox ----------------------------------------------------------- */

/* A store job came back: hand its result to the turn waiting for it, if any. */
static void on_store_job(worker *w, store_job *job)
{
    turn *t = job->owner;
    if (job->kind == STORE_JOB_EXPIRE) {
        w->expiry_in_flight = 0;
        if (job->status != PARLEY_OK)
            host_log(w->host, PARLEY_LOG_WARN, "history expiry: %s",
                     job->err ? job->err : "failed");
    } else if (job->kind == STORE_JOB_RELEASE_LEASE) {
        /* nothing to report */
    } else if (!t && job->kind == STORE_JOB_LOAD && job->lease_taken) {
        /* its turn ended while it loaded: give the lease back (RELEASE_LEASE) */
        store_key key = {job->conversation_id, job->persona, job->interface_type};
        store_job *release = store_job_new(STORE_JOB_RELEASE_LEASE, &key);
        if (release && store_jobs_submit(w->jobs, release) != 0)
            store_job_free(release);
    } else if (t && job->kind == STORE_JOB_LOAD) {
        pbuf swap = t->ctx.history; /* the loaded messages become the turn's history */
        t->ctx.history = job->loaded;
        t->ctx.nhistory = job->nmessages;
        job->loaded = swap;
        ctx_window window = t->ctx.window; /* and what it found of the window */
        t->ctx.window = job->ctx;
        job->ctx = window;
        t->lease.held = job->lease_taken;
        t->lease.retry_ms = job->lease_retry_ms;
        reply_context_take_result(&t->in.reply, &job->reply);
        turn_on_history(t, job->status, job->err);
    } else if (t) {
        turn_on_committed(t, job->status, job->err);
    }
    store_job_free(job);
}

static void on_tool_results(parley_tool_call *completed)
{
    while (completed) {
        parley_tool_call *h = completed;
        completed = h->next;
        if (h->owner) /* still wanted: only the worker clears owner, so no lock needed */
            turn_on_tool_result(h->owner, h);
        inbox_handle_free(h);
    }
}

static void on_store_jobs(worker *w, inbox_note *notes)
{
    while (notes) {
        inbox_note *n = notes;
        notes = n->next;
        on_store_job(w, (store_job *)n);
    }
}

/* Take what the host threads left in the inbox; returns 1 when asked to stop. */
static int drain_inbox(worker *w)
{
    inbox_batch b;
    inbox_take(w->box, &b);
    while (b.submitted) {
        turn *t = b.submitted->owner;
        b.submitted = b.submitted->next;
        schedule(w, t);
    }
    on_tool_results(b.completed);
    on_store_jobs(w, b.notes);
    for (size_t i = 0; i < b.ncancels; i++) {
        turn *t = inbox_find_live(w->box, b.cancels[i]);
        if (t) /* every live turn was scheduled above, so the worker holds it */
            turn_cancel(t, "cancelled by the host");
    }
    free(b.cancels);
    return b.stop;
}

/* ---- the loop -------------------------------------------------------------- */

static void begin_ready_turns(worker *w)
{
    while (w->ready_head) {
        turn *t = w->ready_head;
        w->ready_head = t->link.ready_next;
        if (!w->ready_head)
            w->ready_tail = NULL;
        t->link.in_ready = 0;
        turn_begin(t);
    }
}

static void fire_timers(worker *w)
{
    uint64_t now = clock_mono_ms();
    ptimer *p;
    while ((p = timer_pop_due(&w->timers, now))) {
        turn_on_timer(p->owner, p);
    }
}

/*
 * Read every finished transfer first, then act on them: ending a turn removes
 * its easy handle, and libcurl searches the unread messages on each removal,
 * so handling them one by one while reading costs O(batch^2).  Safe because
 * ending one turn never frees another turn's transfer.
 */
static void reap_transfers(worker *w)
{
    size_t n;
    http_done *done = http_pool_take_done(&w->pool, &n);
    for (size_t i = 0; i < n; i++)
        turn_on_http_done(done[i].call->owner, done[i].result);
}

/* Wait up to wait_ms for curl's sockets or the inbox, and let curl act on its sockets. */
static void wait_for_events(worker *w, int wait_ms)
{
    struct epoll_event evs[EPOLL_BATCH];
    int n = epoll_wait(w->epoll_fd, evs, EPOLL_BATCH, wait_ms);
    for (int i = 0; i < n; i++) {
        if (evs[i].data.u64 != HTTP_POOL_NOT_MINE) /* else the inbox: inbox_take comes next */
            http_pool_on_socket(&w->pool, evs[i].data.u64, evs[i].events);
    }
}

/* Forget idle conversations about once a second: inline, or on a store thread. */
static void sweep_history(worker *w)
{
    if (!w->idle_timeout_ms || w->expiry_in_flight)
        return;
    uint64_t now = clock_mono_ms();
    if (now < w->next_expiry_sweep_ms)
        return;
    w->next_expiry_sweep_ms = now + EXPIRY_SWEEP_MS;
    if (w->jobs) {
        store_job *job = store_job_new(STORE_JOB_EXPIRE, NULL);
        if (job && store_jobs_submit(w->jobs, job) == 0)
            w->expiry_in_flight = 1;
        else
            store_job_free(job);
        return;
    }
    char *err = NULL;
    if (store_expire(w->store, clock_wall_ms(), NULL, &err) != PARLEY_OK)
        host_log(w->host, PARLEY_LOG_WARN, "history expiry: %s", err ? err : "failed");
    free(err);
}

/*
 * destroy(): every turn still held ends, exactly once: cancelled, or -- for
 * a turn whose append is with a store thread -- with that append's
 * outcome, which is waited for (the job borrows the turn's messages).  The
 * inbox stays open meanwhile (it already refuses new turns): a host may
 * complete a tool call, even from a done callback, and its handle must wait
 * in the inbox until its turn has let go of it.
 */
static void cancel_everything(worker *w)
{
    inbox_batch b;
    inbox_take(w->box, &b);
    w->stopping = 1;
    for (turn *t = w->ready_head; t; t = t->link.ready_next)
        t->link.in_ready = 0;
    w->ready_head = w->ready_tail = NULL; /* all of them are on the all list too */
    while (b.submitted) {
        turn *t = b.submitted->owner;
        b.submitted = b.submitted->next;
        t->env = &w->env;
        all_link(w, t);
    }
    free(b.cancels);
    on_tool_results(b.completed);
    on_store_jobs(w, b.notes);
    for (turn *t = w->all_head, *next; t; t = next) {
        next = t->link.all_next; /* ending t frees t only */
        turn_cancel(t, "the agent was destroyed");
    }
    while (w->all_head) { /* appends in flight: wait for their outcome */
        wait_for_events(w, inbox_sleep(w->box) ? 100 : 0);
        inbox_take(w->box, &b);
        free(b.cancels);
        on_tool_results(b.completed);
        on_store_jobs(w, b.notes);
    }

    /* No turn holds a handle now: later completions just free theirs. */
    inbox_close(w->box, &b);
    free(b.cancels);
    on_tool_results(b.completed);
    on_store_jobs(w, b.notes);
}

/* The worker whose thread this is (NULL on every other thread): how a call
 * from inside a host callback is told apart from one on the host's threads. */
static __thread const worker *current_worker;

int worker_is_current(const worker *w) { return w && current_worker == w; }

static void *worker_main(void *arg)
{
    worker *w = arg;
    current_worker = w;
    for (;;) {
        if (drain_inbox(w))
            break;
        begin_ready_turns(w);
        fire_timers(w);
        http_pool_run_timers(&w->pool);
        reap_transfers(w);
        begin_ready_turns(w);
        sweep_history(w);
        uint64_t now = clock_mono_ms();
        int64_t wait = timer_next_in(&w->timers, now);
        int64_t curl_wait = http_pool_next_timer_in(&w->pool, now);
        if (wait < 0 || wait > EXPIRY_SWEEP_MS)
            wait = EXPIRY_SWEEP_MS;
        if (curl_wait >= 0 && curl_wait < wait)
            wait = curl_wait;
        if (w->ready_head || (wait > 0 && !inbox_sleep(w->box)))
            wait = 0; /* work is waiting: look, do not sleep */
        wait_for_events(w, (int)wait);
    }
    cancel_everything(w);
    return NULL;
}

static void worker_free(worker *w)
{
    ctx_agent_stop(&w->ctx); /* a window discovery still asking the server */
    store_jobs_stop(w->jobs); /* after the worker: no turn waits for a job now */
    if (w->box)
        inbox_unref(w->box);
    http_pool_cleanup(&w->pool); /* before the epoll set its sockets are in */
    if (w->epoll_fd >= 0)
        close(w->epoll_fd);
    dict_free(w->lanes);
    timer_heap_free(&w->timers);
    free(w);
}

worker *worker_start(const worker_setup *setup, char **err)
{
    *err = NULL;
    worker *w = calloc(1, sizeof *w);
    if (!w) {
        *err = pstr_printf("out of memory");
        return NULL;
    }
    w->store = setup->store;
    w->host = setup->host;
    w->metrics = setup->metrics;
    w->persona_metrics = setup->persona_metrics;
    w->idle_timeout_ms = setup->idle_timeout_ms;
    w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    w->box = inbox_new();
    if (w->epoll_fd < 0 || !w->box) {
        *err = pstr_printf("could not create the worker's event descriptors: %s", strerror(errno));
        worker_free(w);
        return NULL;
    }
    struct epoll_event wake = {.events = EPOLLIN | EPOLLET, .data.u64 = HTTP_POOL_NOT_MINE};
    if (http_pool_init(&w->pool, setup->max_connections, w->epoll_fd) != 0 ||
        !(w->lanes = dict_new(lane_key)) ||
        epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, inbox_wake_fd(w->box), &wake) != 0) {
        *err = pstr_printf("out of memory");
        worker_free(w);
        return NULL;
    }
    if (store_blocking(w->store) && !(w->jobs = store_jobs_start(w->store, w->box))) {
        *err = pstr_printf("could not start the store threads");
        worker_free(w);
        return NULL;
    }
    w->env = (turn_env){
        .pool = &w->pool,
        .timers = &w->timers,
        .store = w->store,
        .jobs = w->jobs,
        .box = w->box,
        .host = w->host,
        .metrics = w->metrics,
        .persona_metrics = w->persona_metrics,
        .ended = on_turn_ended,
        .worker = w,
        .ctx = &w->ctx,
    };
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        *err = pstr_printf("could not start the worker thread");
        worker_free(w);
        return NULL;
    }
    return w;
}

inbox *worker_inbox(worker *w) { return w->box; }

void worker_stop(worker *w)
{
    inbox_stop(w->box);
    pthread_join(w->thread, NULL);
    worker_free(w);
}
