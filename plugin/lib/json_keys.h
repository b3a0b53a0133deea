/*
 * json_keys.h -- the one check that a JSON object a host passes in holds only
 * keys its reader knows (a selector, a query, a persona, a message...).  Every
 * reader refuses an unknown key the same way and lists what it expected from
 * the same list it accepts, so the message cannot drift from the code.
 */
#ifndef PARLEY_JSON_KEYS_H
#define PARLEY_JSON_KEYS_H

#include <jansson.h>

#include "lib/plugin_status.h"

/* Longest part of an unknown key quoted in the message (bytes; utf8_quotable's max). */
#define JSON_KEYS_QUOTE_MAX 64

/*
 * PARLEY_OK when every key of obj is one of `known` (NULL-terminated) or obj
 * is not an object.  Else PARLEY_ERR_INVALID_INPUT with *err (malloc'd):
 * `<what>: unknown key "colour" (expected prompt, model)`, the first unknown
 * key made quotable (utf8_quotable), without "<what>: " when what is NULL
 * (a caller that prefixes its own); or PARLEY_ERR_NO_MEMORY with *err NULL.
 */
parley_status json_keys_check(const json_t *obj, const char *const known[], const char *what,
                              char **err);

#endif
