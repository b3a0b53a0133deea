/*
 * selector.h -- the JSON a host passes to the *_by history functions to name
 * one conversation beyond its bare id: {"conversation_id", "interface_type"?,
 * "persona"?}.  Absent interface_type / persona are "" (none), as for a turn
 * whose input leaves them NULL.
 */
#ifndef PARLEY_SELECTOR_H
#define PARLEY_SELECTOR_H

#include <jansson.h>

#include "plugin_status.h"
#include "store/store.h"

typedef struct selector {
    store_key key;
    int every_persona; /* persona "*" (allowed only where the caller says) */
    json_t *root;      /* owns the strings key points into */
} selector;

/* Read `json` into *sel; allow_every_persona admits persona "*".
 * PARLEY_ERR_INVALID_INPUT with *err (malloc'd) naming the key otherwise. */
parley_status selector_parse(const char *json, int allow_every_persona, selector *sel,
                             char **err);
void selector_free(selector *sel);

#endif
