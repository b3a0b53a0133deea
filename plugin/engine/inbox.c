/* inbox.c -- see inbox.h. */
#include "engine/inbox.h"

#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>


struct inbox {
    pthread_mutex_t mu;
    int refs;               /* the agent + one per tool-call handle not yet completed */
    int alive;              /* 0 once closed: submissions and completions refused */
    int stop;               /* destroy() asked the worker to stop */
    int stop_taken;         /* ... and the worker has taken that */
    int wake_fd;            /* eventfd: the worker polls it */
    int woken;              /* no wakeup needed: written since the worker's inbox_sleep, or
                               the worker has not slept since its last take */
    inbox_entry *submitted_head; /* accepted turns not yet taken by the worker */
    inbox_entry *submitted_tail;
    parley_tool_call *completed; /* newest first */
    inbox_note *notes;      /* newest first */
    uint64_t *cancels;      /* request ids whose cancel was asked */
    size_t ncancels, cancels_cap;
    dict *live;             /* request id (its 8 bytes) -> entry, from submit until forget */
};

/* Live turns are keyed by the bytes of their request id: no text per turn. */
static const char *live_key(const void *e) { return (const char *)&((const inbox_entry *)e)->id; }

inbox *inbox_new(void)
{
    inbox *box = calloc(1, sizeof *box);
    if (!box)
        return NULL;
    box->live = dict_new_fixed(live_key, sizeof(parley_request_id));
    box->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!box->live || box->wake_fd < 0 || pthread_mutex_init(&box->mu, NULL) != 0) {
        dict_free(box->live);
        if (box->wake_fd >= 0)
            close(box->wake_fd);
        free(box);
        return NULL;
    }
    box->refs = 1;
    box->alive = 1;
    return box;
}

/* Claim the wakeup (the caller holds the lock): 1 when the caller must write
 * it, 0 when one is already pending or the worker will take before it waits. */
static int wake_claim_locked(inbox *box)
{
    if (box->woken)
        return 0;
    box->woken = 1;
    return 1;
}

static void wake_write(inbox *box)
{
    uint64_t one = 1;
    if (write(box->wake_fd, &one, sizeof one) < 0) {
        /* EAGAIN cannot happen (the count never nears its maximum) */
    }
}

/* Wake the worker from under the lock: for callers whose box may be freed
 * once they unlock (a tool result or a store thread's note racing destroy). */
static void wake_locked(inbox *box)
{
    if (wake_claim_locked(box))
        wake_write(box);
}

void inbox_unref(inbox *box)
{
    pthread_mutex_lock(&box->mu);
    int last = --box->refs == 0;
    pthread_mutex_unlock(&box->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&box->mu);
    close(box->wake_fd);
    dict_free(box->live);
    free(box->cancels);
    free(box);
}

/* ---- host threads ---- */

parley_status inbox_submit(inbox *box, inbox_entry *e)
{
    parley_status st = PARLEY_OK;
    int wake = 0;
    pthread_mutex_lock(&box->mu);
    if (!box->alive || box->stop) {
        st = PARLEY_ERR_CANCELLED;
    } else if (dict_add(box->live, e) != 0) {
        st = PARLEY_ERR_NO_MEMORY;
    } else {
        e->next = NULL;
        if (box->submitted_tail)
            box->submitted_tail->next = e;
        else
            box->submitted_head = e;
        box->submitted_tail = e;
        wake = wake_claim_locked(box);
    }
    pthread_mutex_unlock(&box->mu);
    /* Written after unlocking, so the worker it wakes does not find the lock
     * still held (a futex wait and wake per turn).  The box cannot go away
     * meanwhile: the host's agent holds it, and destroy overlaps no call. */
    if (wake)
        wake_write(box);
    return st;
}

parley_status inbox_cancel(inbox *box, parley_request_id id)
{
    parley_status st = PARLEY_OK;
    pthread_mutex_lock(&box->mu);
    if (!dict_find(box->live, (const char *)&id)) {
        st = PARLEY_ERR_NOT_FOUND;
    } else {
        if (box->ncancels == box->cancels_cap) {
            size_t cap = box->cancels_cap ? box->cancels_cap * 2 : 8;
            uint64_t *c = realloc(box->cancels, cap * sizeof *c);
            if (c) {
                box->cancels = c;
                box->cancels_cap = cap;
            }
        }
        if (box->ncancels < box->cancels_cap) {
            box->cancels[box->ncancels++] = id;
            wake_locked(box);
        } else {
            st = PARLEY_ERR_NO_MEMORY;
        }
    }
    pthread_mutex_unlock(&box->mu);
    return st;
}

parley_status inbox_complete_tool_call(parley_tool_call *h, const char *result, int is_error)
{
    char *copy = result ? strdup(result) : NULL;
    parley_status st = result && !copy ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
    inbox *box = h->box;
    int queued = 0;
    pthread_mutex_lock(&box->mu);
    if (box->alive && h->owner) {
        h->result = copy;
        h->is_error = is_error || st != PARLEY_OK;
        h->next = box->completed;
        box->completed = h;
        wake_locked(box);
        queued = 1;
    }
    pthread_mutex_unlock(&box->mu);
    if (!queued) { /* the turn no longer waits for it: just free the handle */
        free(copy);
        free(h);
        inbox_unref(box);
    }
    return st;
}

int inbox_post(inbox *box, inbox_note *note)
{
    int rc = -1;
    pthread_mutex_lock(&box->mu);
    if (box->alive) {
        note->next = box->notes;
        box->notes = note;
        wake_locked(box);
        rc = 0;
    }
    pthread_mutex_unlock(&box->mu);
    return rc;
}

void inbox_stop(inbox *box)
{
    pthread_mutex_lock(&box->mu);
    box->stop = 1;
    wake_locked(box);
    pthread_mutex_unlock(&box->mu);
}

/* ---- the worker ---- */

static parley_tool_call *reverse_calls(parley_tool_call *h)
{
    parley_tool_call *ordered = NULL;
    while (h) {
        parley_tool_call *next = h->next;
        h->next = ordered;
        ordered = h;
        h = next;
    }
    return ordered;
}

static inbox_note *reverse_notes(inbox_note *n)
{
    inbox_note *ordered = NULL;
    while (n) {
        inbox_note *next = n->next;
        n->next = ordered;
        ordered = n;
        n = next;
    }
    return ordered;
}

int inbox_wake_fd(const inbox *box) { return box->wake_fd; }

int inbox_sleep(inbox *box)
{
    pthread_mutex_lock(&box->mu);
    int posted = box->submitted_head || box->completed || box->notes || box->ncancels ||
                 (box->stop && !box->stop_taken);
    if (!posted)
        box->woken = 0; /* from now on a post must wake the worker */
    pthread_mutex_unlock(&box->mu);
    return !posted;
}

/* Move everything posted into `out`; the caller holds the lock. */
static void take_locked(inbox *box, inbox_batch *out)
{
    box->woken = 1; /* the worker takes again before it waits: see inbox_sleep */
    out->submitted = box->submitted_head;
    box->submitted_head = box->submitted_tail = NULL;
    out->completed = box->completed;
    box->completed = NULL;
    out->notes = box->notes;
    box->notes = NULL;
    out->cancels = box->cancels;
    out->ncancels = box->ncancels;
    box->cancels = NULL;
    box->ncancels = box->cancels_cap = 0;
    out->stop = box->stop;
    box->stop_taken = box->stop;
}

void inbox_take(inbox *box, inbox_batch *out)
{
    pthread_mutex_lock(&box->mu);
    take_locked(box, out);
    pthread_mutex_unlock(&box->mu);
    /* Lists are built newest first: hand them out in the order they came. */
    out->completed = reverse_calls(out->completed);
    out->notes = reverse_notes(out->notes);
}

turn *inbox_find_live(inbox *box, parley_request_id id)
{
    pthread_mutex_lock(&box->mu);
    inbox_entry *e = dict_find(box->live, (const char *)&id);
    pthread_mutex_unlock(&box->mu);
    return e ? e->owner : NULL;
}

void inbox_forget(inbox *box, const inbox_entry *e)
{
    pthread_mutex_lock(&box->mu);
    dict_remove(box->live, (const char *)&e->id);
    pthread_mutex_unlock(&box->mu);
}

parley_tool_call *inbox_handle_new(inbox *box, turn *owner, size_t index)
{
    parley_tool_call *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->box = box;
    h->owner = owner;
    h->index = index;
    pthread_mutex_lock(&box->mu);
    box->refs++;
    pthread_mutex_unlock(&box->mu);
    return h;
}

void inbox_handle_detach(parley_tool_call *h)
{
    pthread_mutex_lock(&h->box->mu);
    h->owner = NULL;
    pthread_mutex_unlock(&h->box->mu);
}

void inbox_handle_free(parley_tool_call *h)
{
    inbox *box = h->box;
    free(h->result);
    free(h);
    inbox_unref(box);
}

void inbox_close(inbox *box, inbox_batch *out)
{
    pthread_mutex_lock(&box->mu);
    box->alive = 0;
    take_locked(box, out);
    pthread_mutex_unlock(&box->mu);
    out->completed = reverse_calls(out->completed);
    out->notes = reverse_notes(out->notes);
}
