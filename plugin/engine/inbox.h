/*
 * inbox.h -- the hand-off from host threads to an agent's worker thread, and
 * the lifetime of the tool-call handles given to the host.
 *
 *   host threads: inbox_submit (a new turn), inbox_cancel (a request id),
 *                 inbox_complete_tool_call (a result)        -- mutex + wakeup
 *   worker:       inbox_take (everything posted since last time)
 *
 * The wakeup is an eventfd the worker polls (inbox_wake_fd), written only
 * while the worker waits or is about to (inbox_sleep), at most once per wait
 * however much is posted: a worker still busy takes what came before it waits.
 *
 * The inbox is reference-counted apart from the agent because tool-call
 * handles may outlive the agent (the host must complete each one, even after
 * destroy): a late completion then finds a dead inbox and is dropped.
 *
 * Every accepted turn is "live" (found by its request id) from inbox_submit
 * until inbox_forget, which the worker calls just before the turn's done
 * callback: a cancel after that finds nothing.
 */
#ifndef PARLEY_INBOX_H
#define PARLEY_INBOX_H

#include <parley/plugin.h>
#include <pthread.h>
#include <stdint.h>

#include "lib/dict.h"

typedef struct turn turn;
typedef struct inbox inbox;

/* Tool-call handle; the host holds its id instead (tool_handle.h). */
struct parley_tool_call {
    char key[24];           /* its id as text: key in the process-wide registry */
    inbox *box;
    turn *owner;            /* NULL once detached (turn ended, or timed out waiting) */
    size_t index;           /* which call of the owner's current round */
    char *result;
    int is_error;
    parley_tool_call *next; /* in the inbox's completed list */
};

/* What a turn embeds to be submitted and looked up by request id: the inbox
 * needs nothing else of a turn, so it never sees struct turn's layout. */
typedef struct inbox_entry {
    uint64_t id;              /* the turn's request id; set before inbox_submit */
    turn *owner;              /* the turn this entry is part of */
    struct inbox_entry *next; /* in the submitted list */
} inbox_entry;

/* Whatever a completion from another thread carries back to the worker
 * (store jobs): the first member of the poster's struct. */
typedef struct inbox_note {
    struct inbox_note *next;
} inbox_note;

/* What the worker takes in one go; see inbox_take. */
typedef struct inbox_batch {
    inbox_entry *submitted;        /* in submission order, linked by next */
    parley_tool_call *completed;   /* in completion order */
    inbox_note *notes;             /* in posting order */
    uint64_t *cancels;             /* request ids, malloc'd */
    size_t ncancels;
    int stop;                      /* destroy() asked the worker to stop */
} inbox_batch;

inbox *inbox_new(void);  /* one reference (the agent's); NULL on OOM or no descriptor */
void inbox_unref(inbox *box);

/* Host threads.  PARLEY_OK, or CANCELLED (stopping) / NO_MEMORY: the turn stays the caller's. */
parley_status inbox_submit(inbox *box, inbox_entry *e);
parley_status inbox_cancel(inbox *box, parley_request_id id); /* NOT_FOUND if not live */
parley_status inbox_complete_tool_call(parley_tool_call *h, const char *result, int is_error);

/* Any thread (a store thread): hand `note` to the worker.  0, or -1 once the
 * inbox is closed (the worker is gone: the caller keeps the note). */
int inbox_post(inbox *box, inbox_note *note);

/* destroy(): refuse new turns and wake the worker to stop. */
void inbox_stop(inbox *box);

/* ---- the worker ---- */
/* Signalled when something was posted.  Watch it edge-triggered (EPOLLIN |
 * EPOLLET), then inbox_take: each wakeup is a write, so a new edge, and it is
 * never read back (a read per wakeup was a system call per turn).  Its count
 * grows by one at most once per inbox_sleep that found nothing: it cannot fill. */
int inbox_wake_fd(const inbox *box);
void inbox_take(inbox *box, inbox_batch *out);
/* The worker is about to wait for events: 1 when nothing was posted since its
 * last inbox_take (what comes now writes the wakeup), 0 when something was
 * (then it takes that instead of waiting).  Until it says so, posts write no
 * wakeup: a busy worker takes them before it waits anyway. */
int inbox_sleep(inbox *box);
turn *inbox_find_live(inbox *box, parley_request_id id);
void inbox_forget(inbox *box, const inbox_entry *e);   /* no longer live */

/* A handle for call `index` of `owner` (counts a reference to the inbox); NULL on OOM. */
parley_tool_call *inbox_handle_new(inbox *box, turn *owner, size_t index);
/* The turn no longer waits for it: a later completion just frees it. */
void inbox_handle_detach(parley_tool_call *h);
/* Free a handle the worker took from a batch. */
void inbox_handle_free(parley_tool_call *h);

/* After the last turn ended: refuse everything from now on; returns the
 * completions still waiting and the turns never taken (the caller ends them). */
void inbox_close(inbox *box, inbox_batch *out);

#endif
