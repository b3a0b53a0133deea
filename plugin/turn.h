/*
 * turn.h -- one conversation turn, from accepted input to committed history.
 *
 * The data path reads top to bottom in turn.c:
 *
 *   turn_new        (host thread) validate + copy the input, mint ids
 *   turn_begin      (worker)      snapshot the conversation's history
 *   turn_request                  render the request, start the HTTP call
 *   turn_on_http_done             decode the reply (or retry / fail)
 *     -> tool calls: turn_dispatch_tools -> host -> turn_on_tool_result
 *        -> all results in: back to turn_request (tool_choice "none" once
 *           max_tool_iterations rounds are spent)
 *     -> text: turn_end(OK): commit to history, result to the host
 *
 * Any failure ends in turn_end(error): nothing is committed, so history is
 * exactly as it was.  Every accepted turn reaches turn_end exactly once.
 */
#ifndef PARLEY_TURN_H
#define PARLEY_TURN_H

#include <parley/plugin.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.h"
#include "buf.h"
#include "llm_reply.h"
#include "provider/provider.h"
#include "timer_heap.h"
#include "uuid.h"

typedef struct lane lane;

/* One tool call of the current round. */
typedef struct turn_call {
    char *id, *name, *arguments;
    parley_tool_call *handle; /* while the host holds it */
    char *content;            /* the tool message content, once known */
    int is_error;
} turn_call;

struct turn {
    parley_agent *agent;
    parley_request_id id;
    char id_key[24];          /* id as text: key in inbox.live */
    char turn_id[UUID_STR_LEN];
    char *conversation_id;    /* NULL: stateless */

    /* the input, copied */
    char *text, *extra_system_prompt, *context_json;
    char *language, *device_id, *satellite_id, *agent_id;
    toolset *own_tools;       /* agent tools + the input's tools, when it had any */
    const toolset *tools;     /* what this turn offers the model */
    parley_delta_fn on_delta;
    parley_delta_fn on_reasoning;
    parley_done_fn done;
    void *user_data;

    /* progress */
    uint64_t accepted_mono_ms;  /* when async_process took it: the deadline's start */
    uint64_t started_wall_ms;
    pbuf history;             /* the conversation's stored messages at turn_begin */
    size_t nhistory;          /* how many messages that is */
    json_t *history_msgs;     /* the same, parsed once for a codec that needs it parsed */
    pbuf messages;            /* this turn's messages, comma-joined: what gets committed */
    size_t nmessages;
    pbuf steps;               /* the steps JSON array being built */
    pbuf body;                /* the current request body */
    char *answer;             /* the final answer, once the model gave it */
    int tool_rounds;
    int attempt;              /* retries of the current request */
    http_call *http;
    provider_stream *stream;
    char *stream_error;
    llm_usage usage;          /* summed over the turn's requests */
    int replies;              /* replies decoded */
    char *stop_reason;        /* the last reply's finish_reason */
    turn_call *calls;
    size_t ncalls, calls_pending;
    int ended;

    ptimer deadline;          /* turn_timeout_ms after acceptance (armed by the worker on arrival) */
    ptimer wait;              /* retry backoff, tool timeout, or stream idle timeout */

    /* worker bookkeeping */
    lane *lane;
    turn *lane_next;          /* next in its conversation's queue */
    turn *ready_next;         /* next in the worker's list of turns to begin */
    int in_ready;             /* on that list */
    turn *all_prev, *all_next;
    turn *inbox_next;
};

/* Validate and copy an input (any thread).  NULL with *status and *err on failure. */
turn *turn_new(parley_agent *a, const parley_input *in, parley_done_fn done, void *user_data,
               parley_status *status, char **err);
void turn_free(turn *t);

/* Worker-thread events. */
void turn_begin(turn *t);
void turn_on_http_done(turn *t, CURLcode code);
void turn_on_tool_result(turn *t, parley_tool_call *h);
void turn_on_timer(turn *t, ptimer *which);
void turn_end(turn *t, parley_status status, const char *message);

#endif
