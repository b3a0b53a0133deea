/*
 * recording.h -- what a turn keeps of each step, apart from the state machine
 * that decides the steps (turn.c).  Two records grow side by side:
 *
 *   t->rec.messages  the turn's messages in the stored form (the neutral, Chat
 *                Completions-shaped JSON of docs/history.md), comma-joined,
 *                each indexed in t->rec.index with its id, role and time;
 *                what turn_commit hands the store (record_store_messages)
 *   t->rec.steps     the JSON array of steps the host gets in steps_json
 *                (reasoning, tool calls, tool results, the answer)
 *
 * None of these fails: out of memory is sticky in the buffers' oom flags,
 * and the turn checks t->rec.messages.oom before it sends or commits, so a
 * message cut short is never stored.
 */
#ifndef PARLEY_TURN_RECORDING_H
#define PARLEY_TURN_RECORDING_H

#include "provider/llm_reply.h"
#include "store/store.h"
#include "turn/turn.h"

/* The input's user message (with its images as content parts); with images
   that history keeps in another form, also t->rec.stored_user. */
void record_user_message(turn *t);

/* The assistant message asking for t->tool.calls (the round's calls, taken from
   `reply`), and a tool_call step per call. */
void record_tool_calls(turn *t, const llm_reply *reply);

/* One tool message and one tool_result step per call of the round. */
void record_tool_results(turn *t);

/* The answer: its message and its step; t->rec.answer becomes a copy of `content`. */
void record_answer(turn *t, const llm_reply *reply, const char *content);

/* The store's view of the turn's messages: a malloc'd array of t->rec.nmessages,
   its JSON borrowed from the turn (or t->rec.stored_user); NULL out of memory. */
store_message *record_store_messages(const turn *t);

#endif
