/* reply_context.c -- see reply_context.h. */
#include "engine/reply_context.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json_keys.h"
#include "lib/utf8.h"

static parley_status refuse(char **err, const char *why)
{
    *err = pstr_printf("input 'reply_to_json': %s", why);
    return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

parley_status reply_context_parse(const char *json, reply_context *rc, char **err)
{
    memset(rc, 0, sizeof *rc);
    json_error_t jerr;
    json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    const char *key = NULL;
    json_t *value = NULL;
    parley_status rc_out = PARLEY_OK;
    if (!json_is_object(o) || json_object_size(o) != 1) {
        rc_out = refuse(err, "must be {\"turn_id\": \"<uuid>\"} or "
                             "{\"interface_message_id\": \"<id>\"}");
        goto out;
    }
    static const char *const known[] = {"turn_id", "interface_message_id", NULL};
    if ((rc_out = json_keys_check(o, known, "input 'reply_to_json'", err)) != PARLEY_OK)
        goto out;
    json_object_foreach(o, key, value) {
        break; /* the one key */
    }
    const char *s = json_string_value(value);
    size_t n = s ? json_string_length(value) : 0;
    if (strcmp(key, "turn_id") == 0) {
        if (!s || n != UUID_STR_LEN - 1 || !uuid_valid(s)) {
            rc_out = refuse(err, "\"turn_id\" must be a turn id (a UUID string)");
            goto out;
        }
        if (!(rc->turn_id = strdup(s))) {
            rc_out = PARLEY_ERR_NO_MEMORY;
            goto out;
        }
        for (char *p = rc->turn_id; *p; p++) /* turn ids are minted in lower case */
            *p = (char)tolower((unsigned char)*p);
    } else { /* "interface_message_id" */
        if (!s || n == 0 || n > STORE_MAX_INTERFACE_MESSAGE_ID || !utf8_valid(s, n)) {
            char *why = pstr_printf("\"interface_message_id\" must be a string of 1 to %d bytes",
                                    STORE_MAX_INTERFACE_MESSAGE_ID);
            rc_out = refuse(err, why ? why : "bad interface_message_id");
            free(why);
            goto out;
        }
        if (!(rc->interface_message_id = strdup(s)))
            rc_out = PARLEY_ERR_NO_MEMORY;
    }
out:
    if (rc_out == PARLEY_ERR_NO_MEMORY && !*err)
        *err = pstr_printf("out of memory");
    json_decref(o);
    return rc_out;
}

int reply_context_wanted(const reply_context *rc)
{
    return rc->turn_id || rc->interface_message_id;
}

int reply_context_copy_target(reply_context *dst, const reply_context *src)
{
    memset(dst, 0, sizeof *dst);
    dst->turn_id = src->turn_id ? strdup(src->turn_id) : NULL;
    dst->interface_message_id = src->interface_message_id ? strdup(src->interface_message_id) : NULL;
    if ((src->turn_id && !dst->turn_id) || (src->interface_message_id && !dst->interface_message_id)) {
        reply_context_free(dst);
        return -1;
    }
    return 0;
}

void reply_context_take_result(reply_context *dst, reply_context *src)
{
    pbuf swap = dst->messages;
    dst->messages = src->messages;
    src->messages = swap;
    dst->outcome = src->outcome;
    dst->nmessages = src->nmessages;
    memcpy(dst->found_turn_id, src->found_turn_id, sizeof dst->found_turn_id);
}

void reply_context_free(reply_context *rc)
{
    free(rc->turn_id);
    free(rc->interface_message_id);
    pbuf_free(&rc->messages);
    memset(rc, 0, sizeof *rc);
}

parley_status reply_context_load(store *s, const store_key *key, size_t window_turns,
                                 uint64_t now_ms, reply_context *rc, char **err)
{
    int in_window = 0;
    char found[STORE_ID_LEN + 1] = "";
    pbuf_reset(&rc->messages);
    rc->nmessages = 0;
    parley_status st = store_load_turn(s, key, rc->turn_id, rc->interface_message_id, window_turns,
                                    now_ms, &rc->messages, &rc->nmessages, found, &in_window, err);
    if (st == PARLEY_ERR_NOT_FOUND) {
        free(*err);
        *err = NULL;
        pbuf_reset(&rc->messages);
        rc->nmessages = 0;
        rc->outcome = REPLY_NOT_FOUND;
        return PARLEY_OK;
    }
    if (st != PARLEY_OK)
        return st;
    memcpy(rc->found_turn_id, found, sizeof rc->found_turn_id);
    rc->outcome = in_window ? REPLY_IN_WINDOW : REPLY_INCLUDED;
    if (in_window) { /* nothing to send twice */
        pbuf_reset(&rc->messages);
        rc->nmessages = 0;
    }
    return rc->messages.oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

const char *reply_outcome_name(reply_outcome o)
{
    switch (o) {
    case REPLY_INCLUDED:
        return "included";
    case REPLY_IN_WINDOW:
        return "in_window";
    case REPLY_NOT_FOUND:
        return "not_found";
    default:
        return NULL;
    }
}
