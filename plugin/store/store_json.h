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

#include "lib/buf.h"
#include "store/store.h"

/* "2026-11-22T19:31:00.123Z", quoted. */
void store_json_timestamp(pbuf *b, uint64_t ms);

/* {"turn_id":..,"started_at":..,"finished_at":..[,"tokens":N],"messages":[<messages>]}
 * where `messages` is the turn's message objects joined by ',' (verbatim) and
 * tokens its stored size (store_turn.tokens; written only when known, not 0). */
void store_json_turn(pbuf *b, const char *turn_id, uint64_t started_ms, uint64_t finished_ms,
                     uint32_t tokens, const char *messages, size_t messages_len);

/* {"conversation_id":..[,"persona":..][,"interface_type":..],"created_at":..,
 * "last_used_at":..  -- no closing brace: the caller adds ,"turns":[...]} or
 * ,"turns":N}.  persona and interface_type are written only when not empty
 * (the default key prints as it always did). */
void store_json_conversation_head(pbuf *b, const char *conversation_id, const char *persona,
                                  size_t persona_len, const char *interface_type,
                                  size_t interface_len, uint64_t created_ms,
                                  uint64_t last_used_ms);

/* One message of a query or a lookup:
 * {"message_id","conversation_id","interface_type","persona","turn_id","role",
 *  "created_at"[,"interface_message_id"][,"metadata":<object verbatim>],
 *  "message":<json verbatim>}; the two optional keys only when not empty. */
void store_json_message(pbuf *b, const char *message_id, const char *conversation_id,
                        size_t conversation_id_len, const char *persona, size_t persona_len,
                        const char *interface_type, size_t interface_len, const char *turn_id,
                        const char *role, uint64_t created_ms, const char *json,
                        size_t json_len, const char *interface_message_id,
                        size_t interface_message_id_len, const char *metadata,
                        size_t metadata_len);

/* A conversation's lifetime, right after store_json_conversation_head:
 * ,"last_message_at":..|null,"message_count":N,"turn_count":N,
 *  "participants":["user","assistant","tool","system"] (the roles seen, in
 *  that order).  Written by get_conversation and list in every backend. */
void store_json_lifetime(pbuf *b, const store_lifetime *life);

/* How many JSON objects `text` is, joined by ',' (one trailing ',' allowed: load()'s form),
 * or -1 when it is anything else.  Stored messages are what Parley wrote, but a file or a
 * Redis key can be changed behind its back: a row holding {"role":"user"}],"x":[{ must not
 * be spliced into the JSON the ABI returns, nor into a request.  Linear and allocation-free
 * for what Parley writes (json_scan.h); jansson decides what the scanner leaves to it. */
long store_json_object_list(const char *text, size_t len);

/* The status and message for a conversation holding such a message:
 * "<store>: conversation '<id>' holds a damaged message (not a JSON object); clear it". */
parley_status store_json_damaged(const char *store_name, const char *conversation_id,
                                 size_t conversation_id_len, char **err);

/* Does the message object `json` have a string "content" holding `needle`
 * (ASCII case-insensitive; needle as plain text, not JSON-escaped)?  The
 * same rule for every backend. */
int store_json_content_matches(const char *json, size_t json_len, const char *needle);

#endif
