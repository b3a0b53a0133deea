/*
 * budget.h -- the turn's side of the context window (context/window.h): what
 * it may send (its budget: the window, the reserve, the factor), what its
 * request costs in tokens, the cuts that keep it within the budget (planned
 * before the first request, or after the server said the prompt did not fit)
 * and the cached prefix the next request should extend.  The state machine
 * (turn.c) decides when: these functions read and cut t->ctx and log and
 * count what they cut, but never send a request or end the turn.
 */
#ifndef PARLEY_TURN_BUDGET_H
#define PARLEY_TURN_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "context/window.h"
#include "provider/llm_reply.h"
#include "turn/turn.h"

/* What the turn may send: the window, the reserve, the turn bound, the factor. */
ctx_budget budget_of(const turn *t);

/* The request body (t->req.body) in estimated tokens, images counted apart. */
int64_t budget_body_tokens(const turn *t, double factor);

/* The bytes of t->ctx.history that are the window (reply context may follow). */
size_t budget_window_len(const turn *t);

/* What comes before the history in every request of the turn, for the cache
 * break check: the prompt (the turn note comes after the history; malloc'd;
 * NULL on OOM). */
char *budget_stable_prompt(const turn *t);

/* Before the turn's first request: keep the window within the budget.  1 when
 * the history changed (render the request again). */
int budget_plan(turn *t);

/* The server refused the prompt as longer than its window: learn the window
 * from its answer and cut the window's oldest turns, once per turn.  1 when
 * cut (send again); 0 when that cannot help (the turn fails with
 * context_overflow, its history unchanged). */
int budget_overflow_cut(turn *t);

/* 1 when the reply's usage `u` says the server silently dropped the start of
 * the prompt (provider truncates_silently). */
int budget_truncated(const turn *t, const llm_usage *u);

/* After a silent truncation: the server read `read` tokens; cut the window's
 * oldest turns to what it keeps, once per turn.  1 when cut (send again). */
int budget_truncation_cut(turn *t, long long read);

#endif
