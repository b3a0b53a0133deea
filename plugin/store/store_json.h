/*
 * store_json.h -- the history JSON the ABI returns (history_get, turn_get,
 * conversations_list), written the same way by every backend, so that the
 * same content prints the same bytes whatever the store.
 *
 * Timestamps are ISO 8601 UTC with milliseconds: "2026-11-22T19:31:00.123Z".
 * Every function appends to `b` (check b->oom once at the end).
 */
#ifndef PARLEY_STORE_JSON_H
#define PARLEY_STORE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "../buf.h"

/* "2026-11-22T19:31:00.123Z", quoted. */
void store_json_timestamp(pbuf *b, uint64_t ms);

/* {"turn_id":..,"started_at":..,"finished_at":..,"messages":[<messages>]}
 * where `messages` is the turn's message objects joined by ',' (verbatim). */
void store_json_turn(pbuf *b, const char *turn_id, uint64_t started_ms, uint64_t finished_ms,
                     const char *messages, size_t messages_len);

/* {"conversation_id":..,"created_at":..,"last_used_at":..  -- no closing brace:
 * the caller adds ,"turns":[...]} or ,"turns":N}. */
void store_json_conversation_head(pbuf *b, const char *conversation_id, uint64_t created_ms,
                                  uint64_t last_used_ms);

#endif
