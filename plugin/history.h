/*
 * history.h -- the in-memory conversation store of one agent.
 *
 * A conversation is an ordered list of committed turns; a turn is the user
 * message plus every message the agent produced during it (assistant
 * tool-call messages, tool results, the final answer), stored as compact
 * OpenAI Chat Completions message JSON, comma-joined, in ONE allocation per
 * turn.  Rendering a request is then a memcpy per turn, and a turn -- the
 * unit of truncation -- can never be split: a tool result is never sent
 * without the call that asked for it, nor a call without its results.
 *
 * Bounds: at most max_turns turns per conversation (older ones dropped at
 * commit; 0 = unlimited), at most max_conversations conversations (the least
 * recently used is evicted), and conversations idle longer than idle_timeout
 * are forgotten (0 = never).  "Used" means "a turn was committed": reading
 * (render, dumps) never changes what a dump shows, so a failed turn leaves
 * every dump byte-identical.
 *
 * Thread-safe: every function takes the store's mutex, so hosts may dump
 * while the worker renders and commits.
 */
#ifndef PARLEY_HISTORY_H
#define PARLEY_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

typedef struct history history;

typedef struct history_limits {
    size_t max_turns;          /* per conversation; 0 = unlimited */
    size_t max_conversations;  /* >= 1 */
    uint64_t idle_timeout_ms;  /* 0 = never expire */
} history_limits;

/* One finished turn, as turn.c hands it to history_commit (borrowed). */
typedef struct history_turn_in {
    const char *turn_id;       /* 36-char UUID */
    uint64_t started_ms;       /* wall clock, ms since the epoch */
    uint64_t finished_ms;
    const char *messages;      /* "{...},{...},..." : nmessages JSON objects joined by ',' */
    size_t messages_len;
    size_t nmessages;          /* >= 1 */
} history_turn_in;

history *history_new(const history_limits *limits); /* NULL on OOM */
void history_free(history *h);

/*
 * Append the stored messages of conversation `id` to `out` (each message
 * followed by ','), oldest first, and return how many were appended.  An
 * unknown id, or one idle past the timeout at `now_ms` (it is then
 * forgotten), appends nothing and returns 0.
 */
size_t history_render(history *h, const char *id, uint64_t now_ms, pbuf *out);

/*
 * Commit a turn to conversation `id`, creating the conversation if needed,
 * then drop turns beyond max_turns and evict least-recently-used
 * conversations beyond max_conversations (never `id` itself).  Returns 0, or
 * -1 on OOM with the store unchanged.
 */
int history_commit(history *h, const char *id, const history_turn_in *turn, uint64_t now_ms);

/* Forget conversations idle past the timeout at now_ms; returns how many. */
size_t history_expire(history *h, uint64_t now_ms);

/*
 * JSON dumps, malloc'd into *out.  Timestamps are ISO 8601 UTC with
 * milliseconds ("2026-11-22T19:31:00.123Z").
 *   conversation: {"conversation_id":..,"created_at":..,"last_used_at":..,
 *                  "turns":[{"turn_id":..,"started_at":..,"finished_at":..,
 *                            "messages":[...]}]}
 *   turn:         {"conversation_id":..,"turn":{...as above...}}
 *   list:         {"conversations":[{"conversation_id":..,"created_at":..,
 *                  "last_used_at":..,"turns":N}, ...]}  most recently used first
 * Return 0, -1 when not found (or expired at now_ms), -2 on OOM.
 */
int history_dump_conversation(history *h, const char *id, uint64_t now_ms, char **out);
int history_dump_turn(history *h, const char *turn_id, uint64_t now_ms, char **out);
int history_dump_list(history *h, uint64_t now_ms, char **out);

/* Forget one conversation (0, or -1 if unknown) or, with id NULL, all (0). */
int history_clear(history *h, const char *id);

typedef struct history_stats {
    size_t conversations;
    size_t turns;
    size_t message_bytes;   /* bytes of stored message JSON */
    size_t evicted;         /* conversations evicted by max_conversations, ever */
    size_t expired;         /* conversations forgotten by idle timeout, ever */
} history_stats;
void history_get_stats(history *h, history_stats *out);

#endif
