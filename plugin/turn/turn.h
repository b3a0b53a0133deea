/*
 * turn.h -- one conversation turn, from accepted input to committed history.
 *
 * The data path, top to bottom (host thread first, then the worker; the
 * worker is the only caller of the turn_* events below):
 *
 *   turn_input_accept (host thread, turn_input.c) validate + copy the input,
 *                     resolve its history key, take a reference to the
 *                     agent's config snapshot; inbox_submit hands it over
 *   (worker arrival)  QUEUED: the turn deadline runs from acceptance; the
 *                     turn waits for its conversation's earlier turns (lanes)
 *   turn_begin        LOADING: load its conversation's window from the
 *                     store (the context record, then the turns from the
 *                     window's start: ctx_load, context/window.h; in the
 *                     same store call, the turn reply_to names: reply_context.h)
 *                     on the store threads when the store blocks (store_jobs.h);
 *                     LEASE_WAIT while another host holds the conversation
 *   turn_on_history   add a replied-to turn older than the window after the
 *                     history, record the user message, then
 *   turn_request      REQUESTING: render the request (first cutting the window's
 *                     oldest turns to fit the budget: budget.c), start the HTTP call
 *   turn_on_http_done decode the reply (or BACKOFF and retry / fail; or, told the
 *                     prompt did not fit, cut the window (budget.c) and send again)
 *     -> tool calls: TOOLS: dispatch to the host (tools.c) -> turn_on_tool_result
 *        -> all results in: back to turn_request (tool_choice "none" once
 *           max_tool_iterations rounds are spent)
 *     -> text: COMMITTING: append the whole turn to the store
 *   turn_on_committed the store has it: end OK (or the store's error); or,
 *                     reported OK, SUMMARIZING turns that left the window
 *                     (then SUMMARY_SAVING its record: summary.c) before it ends
 *   turn_end          ENDED: stop everything, tell the worker (env->ended),
 *                     which forgets the turn, calls turn_report (the host's
 *                     done callback, exactly once) and frees it
 *
 * What each step leaves (the messages to commit, the host's steps) is
 * written by recording.c; the tool round's host side is tools.c's; the
 * context window's budget and cuts are budget.c's; the summary's requests and
 * record summary.c's.  Which step comes next, and what the turn waits for, is
 * turn.c's alone: t->phase (turn_phase below), changed only there.
 *
 * Any failure ends in turn_end(error) before the commit: nothing is stored,
 * so history is exactly as it was.  A turn reported ok is in the store.
 *
 * Waiting on the store: the job owns copies of what it reads and writes
 * except the committed messages, which it borrows from the turn; so a turn
 * is never freed while its append is in flight.  A cancel, the turn
 * deadline or destroy() while LOADING ends the turn at once (the job comes
 * back to nobody and is dropped).  While COMMITTING they wait for the
 * append's outcome, and the turn reports what is true: ok if the store took
 * it, the store's error if not -- never "cancelled" for a stored turn.
 *
 * The turn sees the agent through a narrow context (turn_env: timers, the
 * HTTP pool, the store, the host, metrics) and its own config
 * snapshot (options, tools, HTTP settings), never the agent itself.
 */
#ifndef PARLEY_TURN_H
#define PARLEY_TURN_H

#include <curl/curl.h>
#include <parley/plugin.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "context/window.h"
#include "engine/config.h"
#include "engine/counters.h"
#include "provider/image.h"
#include "engine/inbox.h"
#include "http/llm_http.h"
#include "provider/llm_reply.h"
#include "provider/overflow.h"
#include "provider/provider.h"
#include "config/response_format.h"
#include "engine/reply_context.h"
#include "store/store.h"
#include "engine/timer_heap.h"
#include "lib/uuid.h"

typedef struct lane lane;
typedef struct store_jobs store_jobs;
typedef struct store_job store_job;

/* What every turn of an agent shares; owned by the worker, used on its thread. */
typedef struct turn_env {
    http_pool *pool;           /* the worker's transfers (llm_http.h) */
    timer_heap *timers;
    store *store;
    store_jobs *jobs;          /* the store threads; NULL: the store is called inline */
    inbox *box;                /* tool-call handles */
    const parley_host *host;   /* tool_call and log callbacks */
    agent_counters *metrics;
    persona_metrics *persona_metrics; /* per-persona counters (persona.h) */
    void (*ended)(void *worker, turn *t); /* the turn ended: report it and free it */
    void *worker;
    ctx_agent *ctx;            /* what the agent learned of the model's tokens and window */
} turn_env;

/*
 * Where a turn is: what it waits for, and so what its `wait` timer means.  One
 * function changes it (turn_enter, turn.c), which checks the move in debug
 * builds.  The order is the data path's; a turn may skip phases (a stateless
 * turn loads nothing, an answer without tools runs none) and may go back to
 * REQUESTING (after a backoff, a tool round, or a context overflow).
 */
typedef enum turn_phase {
    TURN_QUEUED,         /* accepted: waits for its lane and the worker (turn_begin) */
    TURN_LOADING,        /* the history load (with the lease, if shared) is in flight: `job` */
    TURN_LEASE_WAIT,     /* another host holds the conversation's lease: `wait` runs until the
                            load is tried again */
    TURN_REQUESTING,     /* the model's HTTP request is in flight: `http`; `wait` is its
                            first-byte, stream idle or after-[DONE] timer */
    TURN_BACKOFF,        /* a failed request waits on `wait` before its retry */
    TURN_TOOLS,          /* the host runs the round's calls: `wait` is tool_timeout_ms */
    TURN_COMMITTING,     /* the append is in flight: only its outcome ends the turn */
    TURN_SUMMARIZING,    /* committed and reported: the summary's request is in flight */
    TURN_SUMMARY_SAVING, /* and then the context record that holds it */
    TURN_ENDED,          /* turn_end ran: the worker reports and frees it */
} turn_phase;

/* The phase's name, for messages: "queued", "loading", ... */
const char *turn_phase_name(turn_phase p);

/* One tool call of the current round. */
typedef struct turn_call {
    char *id, *name, *arguments;
    parley_tool_call *handle; /* while the host holds it */
    char *content;            /* the tool message content, once known */
    int is_error;
} turn_call;

/* Where one message of this turn lies in `messages`, and what the store indexes. */
typedef struct turn_message {
    size_t offset, len;
    const char *role;         /* static: "user", "assistant", "tool", "system" */
    uint64_t created_ms;
    char id[UUID_STR_LEN];
} turn_message;

/*
 * One turn.  The groups, in the order the data path fills them: who it is
 * for, what the host gave, the history it is sent with, the requests, the
 * tool rounds, what it records, and how it ended; the phase, the two timers
 * and the store job are the state machine's own (turn.c).
 */
struct turn {
    const turn_env *env;      /* set when the worker takes the turn */
    agent_config *cfg;        /* the agent's snapshot at acceptance (a reference) */
    const parley_options *opts; /* what its requests use: &cfg->opts, or conv.persona_opts */
    parley_request_id id;
    char turn_id[UUID_STR_LEN];
    int append;               /* append_message's turn (turn_append.h): no model; its one
                                 message (metadata, interface_message_id below) goes straight
                                 to the commit */

    /* where it is, and what it waits for */
    turn_phase phase;         /* (turn_enter): what `wait` and `job` mean */
    ptimer deadline;          /* turn_timeout_ms after acceptance (armed by the worker on arrival) */
    ptimer wait;              /* lease wait, stream timers, retry backoff or tool timeout */
    store_job *job;           /* the store job in flight, NULL when none */
    uint64_t accepted_mono_ms; /* when async_process took it: the deadline's start */
    uint64_t started_wall_ms;

    /* whose conversation: the history key (store.h) and the persona */
    struct turn_conv {
        char *conversation_id; /* NULL: stateless */
        const char *persona;  /* with the id, the history key: persona_name or "" */
        const char *interface_type; /* the input carries them: "" or own_interface_type */
        char *own_interface_type;
        char *persona_name;   /* the input's persona, NULL for none */
        const persona_spec *persona_def; /* its settings, in cfg; NULL: the agent's own */
        parley_options *persona_opts; /* with a persona: cfg->opts with its overrides (a
                                 shallow copy: strings borrowed from cfg), else NULL; out of
                                 line, since most turns have no persona (turn_apply_persona) */
        persona_counters *counters; /* the persona's metrics; NULL without a persona (or OOM) */
        series_counters *series; /* its (persona, interface_type) metrics, from turn_begin */
    } conv;

    /* the input, copied */
    struct turn_in {
        char *text, *extra_system_prompt, *context_json;
        char *language, *device_id, *satellite_id, *agent_id;
        char *metadata;       /* the input's metadata_json, compact; kept with the user message */
        char *interface_message_id; /* kept with the user message */
        image_list images;    /* the input's images, checked */
        response_format *format; /* the input's response_format_json, or NULL: a text answer */
        reply_context reply;  /* the turn reply_to names, and what the load found of it */
        toolset *own_tools;   /* config tools + the input's tools, when it had any */
        const toolset *tools; /* what this turn offers the model */
        uint64_t host_time_ms; /* the input's timestamp (0: none): the turn's messages are
                                 stored on the host's clock (turn_clock_ms) */
    } in;

    /* the host's callbacks */
    struct turn_host {
        parley_done_fn done;
        parley_delta_fn on_delta;
        parley_delta_fn on_reasoning;
        void *user_data;
    } host;

    /* the context: the history sent before this turn's messages (context/window.h) */
    struct turn_ctx {
        pbuf history;         /* the last turns of the conversation, loaded at turn_begin */
        size_t nhistory;      /* how many messages that is */
        json_t *history_msgs; /* the same, parsed once for a codec that needs it parsed */
        ctx_window window;    /* where that history starts, its turns, this turn's cuts */
        int planned;          /* the window was checked against the budget (first request) */
        int overflow_retried; /* 1: sent again after a context-overflow answer; 2: answered */
        int truncated;        /* accounting a reply to a silently truncated prompt */
        long long last_prompt; /* the last reply's prompt tokens as the server counted them */
        size_t last_bytes;    /* and its request's body length */
        llm_overflow overflow; /* the sizes of the last context-overflow answer (the turn
                                 ended or may end with PARLEY_ERR_CONTEXT_OVERFLOW); zero
                                 otherwise */
        size_t summary_ahead; /* summarizing ahead of the next cut: the turns it covers */
    } ctx;

    /* the model's requests */
    struct turn_req {
        pbuf body;            /* the current request body */
        http_call *http;
        provider_stream *stream;
        char *stream_error;
        int streamed;         /* this request's stream gave the host text: it is not retried */
        int attempt;          /* retries of the current request */
        int requests;         /* HTTP requests started, failed and retried ones too */
        llm_usage usage;      /* summed over the turn's requests */
        char *stop_reason;    /* the last reply's finish_reason */
    } req;

    /* the tool rounds (tools.c) */
    struct turn_tool {
        turn_call *calls;     /* the current round's */
        size_t ncalls, pending; /* pending: results still to come */
        dict *ids;            /* the ids of every call of the turn so far (llm_reply_claim_ids) */
        int rounds;
    } tool;

    /* what it keeps (recording.c) */
    struct turn_rec {
        pbuf messages;        /* this turn's messages, comma-joined: what gets committed */
        turn_message *index;  /* one per message of `messages` */
        size_t nmessages, index_cap;
        pbuf stored_user;     /* the user message as stored, when it differs from the sent
                                 one (images as placeholders); empty: the same */
        pbuf steps;           /* the steps JSON array being built */
        char *answer;         /* the final answer, once the model gave it */
        char *structured;     /* the answer checked against in.format->schema, compact JSON */
    } rec;

    /* a shared store's lease on the conversation (store.h v2) */
    struct turn_lease {
        int held;
        int waits;            /* times the lease was busy: the wait grows with it */
        uint64_t retry_ms;    /* from a LOAD job that found the lease busy: the holder's time
                                 left */
    } lease;

    /* the end */
    struct turn_ending {
        parley_status status; /* set by turn_end, for turn_report */
        const char *message;  /* borrowed: valid only while turn_end runs */
        int reported;         /* the host's done callback ran (turn_report: once) */
    } end;

    /* worker bookkeeping */
    struct turn_link {
        lane *lane;
        turn *lane_next;      /* next in its conversation's queue */
        turn *ready_next;     /* next in the worker's list of turns to begin */
        int in_ready;         /* on that list */
        turn *all_prev, *all_next;
    } link;
    inbox_entry submitted;    /* how the inbox holds it (inbox.h) */
};

void turn_free(turn *t);

/* Now, on the clock the turn's messages are stored with: when the input gave a timestamp,
 * that time for its first message (the user's, or the appended one) and that time plus the
 * time since the turn began for the rest; else the wall clock. */
uint64_t turn_clock_ms(const turn *t);

/* The host's timestamp `text` (NULL: none) as t->in.host_time_ms: PARLEY_OK;
 * PARLEY_ERR_INVALID_INPUT with *err (malloc'd) naming `field` when it is not an RFC 3339
 * time after 1970 (t->in.host_time_ms stays 0); or PARLEY_ERR_NO_MEMORY. */
parley_status turn_set_host_time(turn *t, const char *text, const char *field, char **err);

/* Set t->opts from t->cfg and t->conv.persona_def: 0, or -1 out of memory. */
int turn_apply_persona(turn *t);

/* The turn's request as it stands (system prompt, history, its messages, tools, t->opts),
 * rendered by its codec into t->req.body: 0, or -1 with *err (malloc'd; NULL out of
 * memory).  Also summary.c's, for the summary made ahead of the next cut. */
int turn_render_request(turn *t, char **err);

/* Worker-thread events. */
void turn_begin(turn *t);
/* The conversation's history is in t->ctx.history (status PARLEY_OK), or could not be read. */
void turn_on_history(turn *t, parley_status status, const char *message);
void turn_on_http_done(turn *t, CURLcode code);
void turn_on_tool_result(turn *t, parley_tool_call *h);
void turn_on_timer(turn *t, ptimer *which);
/* The store took the turn (PARLEY_OK), or refused it (nothing stored). */
void turn_on_committed(turn *t, parley_status status, const char *message);
/* Cancel (host or destroy): ends the turn unless its append is in flight. */
void turn_cancel(turn *t, const char *message);
void turn_end(turn *t, parley_status status, const char *message);

/* Called by the worker from env->ended: the host's done callback, once. */
void turn_report(turn *t);

#endif
