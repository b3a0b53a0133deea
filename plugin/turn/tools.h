/*
 * tools.h -- a tool round on the host's side: the calls a reply asked for
 * (t->tool.calls), each checked (a known tool, arguments a JSON object, a host that
 * runs tools) and handed to the host's tool_call callback with a handle, and
 * what came back turned into the tool message's content (size and UTF-8
 * checked, errors in one JSON shape).  The state machine (turn.c) decides
 * when: it records the round, arms the tool timeout and asks the model again;
 * these functions never end the turn: -1 means out of memory, and the caller
 * ends it.
 */
#ifndef PARLEY_TURN_TOOLS_H
#define PARLEY_TURN_TOOLS_H

#include "provider/llm_reply.h"
#include "turn/turn.h"

/* The reply's calls become the round's (t->tool.calls; their strings are taken from
   `reply`), each with an id no call of the turn had.  0, or -1. */
int tools_take(turn *t, llm_reply *reply);

/* Hand every call that can go to the host to it; the others get their error
   content now.  t->tool.pending: the calls whose results are still to come.
   0, or -1 (the calls handed over so far are detached by tools_detach). */
int tools_send(turn *t);

/* The host's result for h's call, as its content.  0, or -1. */
int tools_take_result(turn *t, parley_tool_call *h);

/* tool_timeout_ms passed: every call still out fails with a timeout error.  0, or -1. */
int tools_time_out(turn *t);

/* Drop the turn's claim on every handle the host holds: a later result is discarded. */
void tools_detach(turn *t);

/* Free the round's calls. */
void tools_free(turn *t);

#endif
