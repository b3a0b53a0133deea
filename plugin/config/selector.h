/*
 * selector.h -- the JSON a host passes to the *_by history functions to name
 * one conversation beyond its bare id: {"conversation_id", "interface_type"?,
 * "persona"?}.  Absent interface_type / persona are "" (none), as for a turn
 * whose input leaves them NULL.  message_find's selector adds
 * "interface_message_id"; append_message's message names its conversation
 * the same way, beside keys of its own.
 */
#ifndef PARLEY_SELECTOR_H
#define PARLEY_SELECTOR_H

#include <jansson.h>

#include "lib/plugin_status.h"
#include "store/store.h"

typedef struct selector {
    store_key key;
    int every_persona; /* persona "*" (allowed only where the caller says) */
    const char *interface_message_id; /* with SELECTOR_INTERFACE_MESSAGE_ID; NULL if absent */
    json_t *root;      /* owns the strings key points into */
    const char *bad_key; /* after a refusal: the key at fault (static), "selector" for the whole */
} selector;

/* What selector_parse admits beyond {"conversation_id","interface_type","persona"}. */
#define SELECTOR_EVERY_PERSONA 1        /* persona "*" */
#define SELECTOR_INTERFACE_MESSAGE_ID 2 /* "interface_message_id" (1..256 bytes) */
#define SELECTOR_OTHER_KEYS 4           /* keys it does not know: the caller checks them */

/* Read `json` into *sel, admitting what `flags` says.
 * PARLEY_ERR_INVALID_INPUT with *err (malloc'd) naming the key otherwise. */
parley_status selector_parse(const char *json, int flags, selector *sel, char **err);
void selector_free(selector *sel);

/* A string of 1..max bytes of UTF-8 without NUL, and without control characters
 * unless controls_ok (a key part: no; an interface's message id: yes). */
int selector_valid_string(const json_t *v, size_t max, int controls_ok);

#endif
