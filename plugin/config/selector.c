/* selector.c -- see selector.h. */
#include "config/selector.h"

#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_keys.h"
#include "lib/utf8.h"

/* 1..max bytes of UTF-8 without NUL, and without control characters unless allowed
 * (what a turn's input accepts: ids and key parts refuse them, an interface's
 * message id is the interface's own text). */
int selector_valid_string(const json_t *v, size_t max, int controls_ok)
{
    const char *s = json_string_value(v);
    size_t n = s ? json_string_length(v) : 0;
    if (!s || n == 0 || n > max || strlen(s) != n || !utf8_valid(s, n))
        return 0;
    for (size_t i = 0; !controls_ok && i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* A refusal: message NULL is a message that could not be made, so out of memory. */
static parley_status refuse(selector *sel, const char *bad_key, char **err, char *message)
{
    *err = message;
    sel->bad_key = bad_key;
    selector_free(sel);
    return message ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

/* The keys a selector (or append_message's message) knows: a bad_key must be static. */
static const char *const KNOWN_KEYS[] = {"conversation_id", "interface_type", "persona",
                                         "interface_message_id", "role", "content", "metadata"};

/*
 * json is not UTF-8: the top-level key whose member (key or value) holds the first byte
 * that is not, as one of KNOWN_KEYS, else "selector".  A walk over strings and nesting,
 * as far as that byte: enough to name the key, since the text cannot be parsed.
 */
static const char *key_of_bad_byte(const char *json)
{
    size_t n = strlen(json), key_start = 0, key_len = 0, start = 0;
    int depth = 0, in_string = 0, expect_key = 0, is_key = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)json[i];
        if (c >= 0x80) {
            size_t len = utf8_seq_len(json + i, n - i);
            if (len == 0)
                break;
            i += len - 1;
        } else if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"' && (in_string = 0, is_key))
                key_start = start, key_len = i - start;
        } else if (c == '"') {
            in_string = 1;
            is_key = depth == 1 && expect_key;
            start = i + 1;
            expect_key = 0;
        } else if (c == '{' || c == '[') {
            expect_key = ++depth == 1 && c == '{';
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',') {
            expect_key = depth == 1;
        }
    }
    if (in_string && is_key)
        return "selector"; /* the bad byte is in a key: no name to give */
    for (size_t k = 0; k < sizeof KNOWN_KEYS / sizeof KNOWN_KEYS[0]; k++)
        if (strlen(KNOWN_KEYS[k]) == key_len &&
            memcmp(KNOWN_KEYS[k], json + key_start, key_len) == 0)
            return KNOWN_KEYS[k];
    return "selector";
}

parley_status selector_parse(const char *json, int flags, selector *sel, char **err)
{
    memset(sel, 0, sizeof *sel);
    sel->key.persona = "";
    sel->key.interface_type = "";
    json_error_t jerr;
    sel->root = json ? json_loads(json, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr) : NULL;
    if (!sel->root && json && !utf8_valid(json, strlen(json))) {
        const char *key = key_of_bad_byte(json);
        return refuse(sel, key, err, pstr_printf("%s: not valid UTF-8", key));
    }
    if (!json_is_object(sel->root))
        return refuse(sel, "selector", err,
                      pstr_printf("selector: must be a JSON object with \"conversation_id\""));
    if (!(flags & SELECTOR_OTHER_KEYS)) {
        const char *const known[] = {
            "conversation_id", "interface_type", "persona",
            flags & SELECTOR_INTERFACE_MESSAGE_ID ? "interface_message_id" : NULL, NULL};
        char *why = NULL;
        if (json_keys_check(sel->root, known, "selector", &why) != PARLEY_OK)
            return refuse(sel, "selector", err, why);
    }
    const char *key;
    json_t *v;
    json_object_foreach(sel->root, key, v) {
        if (strcmp(key, "conversation_id") == 0) {
            if (!selector_valid_string(v, STORE_MAX_CONVERSATION_ID, 0))
                return refuse(sel, "conversation_id", err,
                              pstr_printf("conversation_id: must be 1 to %d bytes of UTF-8 "
                                          "without control characters",
                                          STORE_MAX_CONVERSATION_ID));
            sel->key.conversation_id = json_string_value(v);
        } else if (strcmp(key, "interface_type") == 0 || strcmp(key, "persona") == 0) {
            int persona = key[0] == 'p';
            const char *name = persona ? "persona" : "interface_type"; /* static, for bad_key */
            if (json_is_string(v) && json_string_length(v) == 0)
                continue; /* "" is "none", as absent */
            if (!selector_valid_string(v, STORE_MAX_CONVERSATION_ID, 0))
                return refuse(sel, name, err,
                              pstr_printf("%s: must be a string of at most %d bytes of UTF-8 "
                                          "without control characters",
                                          name, STORE_MAX_CONVERSATION_ID));
            if (persona && strcmp(json_string_value(v), "*") == 0) {
                if (!(flags & SELECTOR_EVERY_PERSONA))
                    return refuse(sel, name, err,
                                  pstr_printf("persona: \"*\" (every persona) is only for "
                                              "history_clear_by"));
                sel->every_persona = 1;
            }
            *(persona ? &sel->key.persona : &sel->key.interface_type) = json_string_value(v);
        } else if (strcmp(key, "interface_message_id") == 0 &&
                   (flags & SELECTOR_INTERFACE_MESSAGE_ID)) {
            if (!selector_valid_string(v, STORE_MAX_INTERFACE_MESSAGE_ID, 1))
                return refuse(sel, "interface_message_id", err,
                              pstr_printf("interface_message_id: must be 1 to %d bytes of "
                                          "UTF-8", STORE_MAX_INTERFACE_MESSAGE_ID));
            sel->interface_message_id = json_string_value(v);
        }
    }
    if (!sel->key.conversation_id)
        return refuse(sel, "conversation_id", err, pstr_printf("conversation_id: required"));
    return PARLEY_OK;
}

void selector_free(selector *sel)
{
    json_decref(sel->root);
    sel->root = NULL;
}
