/*
 * worker.c -- the agent's one worker thread: a curl multi loop that also
 * drains the inbox (new turns, tool results, cancels), fires timers, and
 * keeps one turn at a time running per conversation ("lanes").
 */
#include "worker.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"

/* Turns of one conversation: the running one, then the waiting ones in order. */
struct lane {
    turn *active;
    turn *queue_head, *queue_tail;
    char id[]; /* the conversation id */
};

static const char *lane_key(const void *e) { return ((const struct lane *)e)->id; }

#define EXPIRY_SWEEP_MS 1000

/* ---- the turn lists ---------------------------------------------------- */

static void ready_push(parley_agent *a, turn *t)
{
    t->ready_next = NULL;
    t->in_ready = 1;
    if (a->ready_tail)
        a->ready_tail->ready_next = t;
    else
        a->ready_head = t;
    a->ready_tail = t;
}

/* A turn may end (cancelled) before it began: take it off the ready list. */
static void ready_unlink(parley_agent *a, turn *t)
{
    if (!t->in_ready)
        return;
    turn *prev = NULL;
    for (turn *it = a->ready_head; it; prev = it, it = it->ready_next) {
        if (it != t)
            continue;
        if (prev)
            prev->ready_next = t->ready_next;
        else
            a->ready_head = t->ready_next;
        if (a->ready_tail == t)
            a->ready_tail = prev;
        break;
    }
    t->in_ready = 0;
}

static void all_link(parley_agent *a, turn *t)
{
    t->all_prev = NULL;
    t->all_next = a->all_head;
    if (a->all_head)
        a->all_head->all_prev = t;
    a->all_head = t;
}

static void all_unlink(parley_agent *a, turn *t)
{
    if (t->all_prev)
        t->all_prev->all_next = t->all_next;
    else if (a->all_head == t)
        a->all_head = t->all_next;
    if (t->all_next)
        t->all_next->all_prev = t->all_prev;
    t->all_prev = t->all_next = NULL;
}

/*
 * A new turn: stateless ones begin at once, others wait for their conversation.
 * Its deadline runs from acceptance, so time queued behind the conversation's
 * other turns counts: a host can bound async_process-to-done by turn_timeout_ms.
 */
static void schedule(parley_agent *a, turn *t)
{
    all_link(a, t);
    if (timer_arm(&a->timers, &t->deadline, t->accepted_mono_ms + (uint64_t)a->opts.turn_timeout_ms)) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (!t->conversation_id) {
        ready_push(a, t);
        return;
    }
    struct lane *l = dict_find(a->lanes, t->conversation_id);
    if (!l) {
        size_t n = strlen(t->conversation_id);
        l = calloc(1, sizeof *l + n + 1);
        if (l)
            memcpy(l->id, t->conversation_id, n + 1); /* the key: set before dict_add reads it */
        if (!l || dict_add(a->lanes, l) != 0) {
            free(l);
            turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
            return;
        }
    }
    t->lane = l;
    if (!l->active) {
        l->active = t;
        ready_push(a, t);
    } else {
        t->lane_next = NULL;
        if (l->queue_tail)
            l->queue_tail->lane_next = t;
        else
            l->queue_head = t;
        l->queue_tail = t;
    }
}

void worker_forget(turn *t)
{
    parley_agent *a = t->agent;
    pthread_mutex_lock(&a->box->mu);
    dict_remove(a->box->live, t->id_key);
    pthread_mutex_unlock(&a->box->mu);
    atomic_fetch_sub(&a->metrics.in_flight, 1);
}

static void lane_unlink_waiting(struct lane *l, turn *t)
{
    turn **pp = &l->queue_head, *prev = NULL;
    while (*pp && *pp != t) {
        prev = *pp;
        pp = &(*pp)->lane_next;
    }
    if (!*pp)
        return;
    *pp = t->lane_next;
    if (l->queue_tail == t)
        l->queue_tail = prev;
}

void worker_release(turn *t)
{
    parley_agent *a = t->agent;
    struct lane *l = t->lane;
    if (l) {
        if (l->active == t) {
            l->active = l->queue_head;
            if (l->active) {
                l->queue_head = l->active->lane_next;
                if (!l->queue_head)
                    l->queue_tail = NULL;
                if (!a->stopping)
                    ready_push(a, l->active);
            }
        } else {
            lane_unlink_waiting(l, t);
        }
        if (!l->active && !l->queue_head) {
            dict_remove(a->lanes, l->id);
            free(l);
        }
    }
    ready_unlink(a, t);
    all_unlink(a, t);
    turn_free(t);
}

/* ---- the inbox ----------------------------------------------------------- */

void inbox_unref(inbox *box)
{
    pthread_mutex_lock(&box->mu);
    int last = --box->refs == 0;
    pthread_mutex_unlock(&box->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&box->mu);
    dict_free(box->live);
    free(box->cancels);
    free(box);
}

static void free_handle(parley_tool_call *h)
{
    inbox *box = h->box;
    free(h->result);
    free(h);
    inbox_unref(box);
}

/* Take what the host threads left in the inbox; returns 1 when asked to stop. */
static int drain_inbox(parley_agent *a)
{
    inbox *box = a->box;
    pthread_mutex_lock(&box->mu);
    turn *submitted = box->submitted_head;
    box->submitted_head = box->submitted_tail = NULL;
    parley_tool_call *completed = box->completed;
    box->completed = NULL;
    uint64_t *cancels = box->cancels;
    size_t ncancels = box->ncancels;
    box->cancels = NULL;
    box->ncancels = box->cancels_cap = 0;
    int stop = box->stop;
    pthread_mutex_unlock(&box->mu);

    while (submitted) {
        turn *t = submitted;
        submitted = t->inbox_next;
        schedule(a, t);
    }
    /* Completions arrive newest first; answer them in the order they came. */
    parley_tool_call *ordered = NULL;
    while (completed) {
        parley_tool_call *h = completed;
        completed = h->next;
        h->next = ordered;
        ordered = h;
    }
    while (ordered) {
        parley_tool_call *h = ordered;
        ordered = h->next;
        if (h->owner) /* still wanted: only the worker clears owner, so no lock needed */
            turn_on_tool_result(h->owner, h);
        free_handle(h);
    }
    for (size_t i = 0; i < ncancels; i++) {
        char key[24];
        snprintf(key, sizeof key, "%llu", (unsigned long long)cancels[i]);
        pthread_mutex_lock(&box->mu);
        turn *t = dict_find(box->live, key);
        pthread_mutex_unlock(&box->mu);
        if (t) /* every live turn was scheduled above, so the worker holds it */
            turn_end(t, PARLEY_ERR_CANCELLED, "cancelled by the host");
    }
    free(cancels);
    return stop;
}

/* ---- the loop -------------------------------------------------------------- */

static void begin_ready_turns(parley_agent *a)
{
    while (a->ready_head) {
        turn *t = a->ready_head;
        a->ready_head = t->ready_next;
        if (!a->ready_head)
            a->ready_tail = NULL;
        t->in_ready = 0;
        turn_begin(t);
    }
}

static void fire_timers(parley_agent *a)
{
    uint64_t now = clock_mono_ms();
    ptimer *p;
    while ((p = timer_pop_due(&a->timers, now))) {
        turn_on_timer(p->owner, p);
    }
}

/*
 * Read every finished transfer first, then act on them: ending a turn removes
 * its easy handle, and libcurl searches the unread messages on each removal,
 * so handling them one by one while reading costs O(batch^2).  Safe because
 * ending one turn never frees another turn's transfer.
 */
static void reap_transfers(parley_agent *a)
{
    CURLMsg *msg;
    int left;
    size_t n = 0;
    while ((msg = curl_multi_info_read(a->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        http_call *c = http_call_of(msg->easy_handle);
        if (!c)
            continue;
        if (n == a->reaped_cap) {
            size_t cap = a->reaped_cap ? a->reaped_cap * 2 : 64;
            void *p = realloc(a->reaped, cap * sizeof *a->reaped);
            if (!p) { /* no room to batch: handle this one now */
                turn_on_http_done(c->owner, msg->data.result);
                continue;
            }
            a->reaped = p;
            a->reaped_cap = cap;
        }
        a->reaped[n].call = c;
        a->reaped[n].result = msg->data.result;
        n++;
    }
    for (size_t i = 0; i < n; i++)
        turn_on_http_done(a->reaped[i].call->owner, a->reaped[i].result);
}

static void sweep_history(parley_agent *a)
{
    if (a->opts.history_idle_timeout_s <= 0)
        return;
    uint64_t now = clock_mono_ms();
    if (now < a->next_expiry_sweep_ms)
        return;
    a->next_expiry_sweep_ms = now + EXPIRY_SWEEP_MS;
    history_expire(a->hist, clock_wall_ms());
}

/*
 * destroy(): every turn still held ends cancelled, exactly once.  The inbox
 * stays alive while they end (box->stop already refuses new turns): a host
 * may complete a tool call meanwhile, even from a done callback, and its
 * handle must wait in the inbox until its turn has let go of it.
 */
static void cancel_everything(parley_agent *a)
{
    inbox *box = a->box;
    pthread_mutex_lock(&box->mu);
    turn *submitted = box->submitted_head;
    box->submitted_head = box->submitted_tail = NULL;
    pthread_mutex_unlock(&box->mu);

    a->stopping = 1;
    for (turn *t = a->ready_head; t; t = t->ready_next)
        t->in_ready = 0;
    a->ready_head = a->ready_tail = NULL; /* all of them are on the all list too */
    while (submitted) {
        turn *t = submitted;
        submitted = t->inbox_next;
        all_link(a, t);
    }
    while (a->all_head)
        turn_end(a->all_head, PARLEY_ERR_CANCELLED, "the agent was destroyed");

    /* No turn holds a handle now: later completions just free theirs. */
    pthread_mutex_lock(&box->mu);
    box->alive = 0;
    parley_tool_call *completed = box->completed;
    box->completed = NULL;
    pthread_mutex_unlock(&box->mu);
    while (completed) {
        parley_tool_call *h = completed;
        completed = h->next;
        free_handle(h);
    }
}

static void *worker_main(void *arg)
{
    parley_agent *a = arg;
    for (;;) {
        if (drain_inbox(a))
            break;
        begin_ready_turns(a);
        fire_timers(a);
        int running = 0;
        curl_multi_perform(a->multi, &running);
        reap_transfers(a);
        begin_ready_turns(a);
        sweep_history(a);
        int64_t wait = timer_next_in(&a->timers, clock_mono_ms());
        if (wait < 0 || wait > EXPIRY_SWEEP_MS)
            wait = EXPIRY_SWEEP_MS;
        if (a->ready_head)
            wait = 0;
        curl_multi_poll(a->multi, NULL, 0, (int)wait, NULL);
    }
    cancel_everything(a);
    return NULL;
}

int worker_start(parley_agent *a)
{
    if (http_pool_init(&a->pool, (size_t)a->opts.max_connections) != 0)
        return -1;
    a->multi = a->pool.multi;
    a->lanes = dict_new(lane_key);
    if (!a->multi || !a->lanes)
        return -1;
    a->box->multi = a->multi;
    if (pthread_create(&a->thread, NULL, worker_main, a) != 0)
        return -1;
    return 0;
}

void worker_stop(parley_agent *a)
{
    pthread_mutex_lock(&a->box->mu);
    a->box->stop = 1;
    curl_multi_wakeup(a->multi);
    pthread_mutex_unlock(&a->box->mu);
    pthread_join(a->thread, NULL);
}
