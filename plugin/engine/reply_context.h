/*
 * reply_context.h -- a turn that replies to an earlier turn of its
 * conversation (input reply_to_json, docs/history.md "Reply context").
 *
 * The input names the turn, by turn id or by the interface id of one of its
 * messages.  When the turn loads its history the store is asked in the same
 * call (store.h v4 load_turn, on the store read thread for a blocking store)
 * whether that turn is inside the window of history sent.  If it is older,
 * its messages, whole (tool steps included), are sent after the history and
 * before the new user message, and a note after that message's text says so
 * (REPLY_CONTEXT_NOTE).  They are sent, never stored again.
 */
#ifndef PARLEY_REPLY_CONTEXT_H
#define PARLEY_REPLY_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "store/store.h"
#include "lib/uuid.h"

typedef enum reply_outcome {
    REPLY_NONE,      /* the input named no reply_to, or it was not looked up yet */
    REPLY_INCLUDED,  /* older than the window: its messages are sent again */
    REPLY_IN_WINDOW, /* already among the turns sent */
    REPLY_NOT_FOUND  /* no such turn in this conversation (or the store cannot say) */
} reply_outcome;

typedef struct reply_context {
    /* what reply_to names: exactly one is set when the input has reply_to */
    char *turn_id;
    char *interface_message_id;
    /* what the store said */
    reply_outcome outcome;
    pbuf messages;              /* INCLUDED: the turn's messages as load() gives them, "m,m," */
    size_t nmessages;
    char found_turn_id[UUID_STR_LEN];
} reply_context;

/* What the turn note (turn.c) of a request carrying a replied-to turn says. */
#define REPLY_CONTEXT_NOTE                                                                  \
    "The user's latest message replies to an earlier exchange of this conversation; that " \
    "exchange is repeated just before the latest message."

/* Parse and check an input's reply_to_json into rc (zeroed first): exactly one
 * of {"turn_id": a UUID} or {"interface_message_id": 1..256 bytes}.  PARLEY_OK;
 * PARLEY_ERR_INVALID_INPUT with *err (malloc'd, naming reply_to_json) when it is
 * not that; PARLEY_ERR_NO_MEMORY with *err "out of memory". */
parley_status reply_context_parse(const char *json, reply_context *rc, char **err);

/* 1 when the input named a turn to reply to. */
int reply_context_wanted(const reply_context *rc);

/* dst (zeroed) names what src names: a copy for a store job.  0, or -1 on OOM. */
int reply_context_copy_target(reply_context *dst, const reply_context *src);

/* Move what the store said from src (a store job's) into dst (the turn's). */
void reply_context_take_result(reply_context *dst, reply_context *src);

void reply_context_free(reply_context *rc);

/* Ask the store which turn rc names, and whether it is among the last
 * window_turns turns of key (0 = all); sets rc->outcome (and the messages
 * when INCLUDED).  Any thread: it is a store call.  PARLEY_OK, or the
 * store's error (*err malloc'd); an unknown turn is not an error. */
parley_status reply_context_load(store *s, const store_key *key, size_t window_turns,
                                 uint64_t now_ms, reply_context *rc, char **err);

/* "included", "in_window", "not_found", or NULL for REPLY_NONE. */
const char *reply_outcome_name(reply_outcome o);

#endif
