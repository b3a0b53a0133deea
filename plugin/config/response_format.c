/* response_format.c -- see response_format.h. */
#include "config/response_format.h"

#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_keys.h"
#include "lib/json_schema.h"
#include "lib/utf8.h"

void response_format_free(response_format *rf)
{
    if (!rf)
        return;
    free(rf->name);
    free(rf->description);
    json_decref(rf->schema);
    free(rf);
}

/* The name every API accepts for a schema or a tool. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 64 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

/* The schema: an object schema (OpenAI's strict mode and Anthropic's tools both want one). */
static parley_status take_schema(response_format *rf, json_t *schema, char **err)
{
    if (!json_is_object(schema)) {
        *err = pstr_printf("schema: must be a JSON Schema object");
        return PARLEY_ERR_INVALID_INPUT;
    }
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (!type || strcmp(type, "object") != 0) {
        *err = pstr_printf("schema: must describe a JSON object (\"type\": \"object\" at its "
                           "root), as OpenAI and Anthropic require");
        return PARLEY_ERR_INVALID_INPUT;
    }
    parley_status st = json_schema_check(schema, err);
    if (st != PARLEY_OK)
        return st;
    rf->schema = json_incref(schema);
    return PARLEY_OK;
}

static parley_status read_members(response_format *rf, json_t *root, char **err)
{
    static const char *const known[] = {"name", "schema", "strict", "description", NULL};
    parley_status st = json_keys_check(root, known, NULL, err);
    if (st != PARLEY_OK)
        return st;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "name") == 0) {
            if (!json_is_string(v) || !valid_name(json_string_value(v))) {
                *err = pstr_printf("name: must be 1 to 64 letters, digits, '_' or '-'");
                return PARLEY_ERR_INVALID_INPUT;
            }
            free(rf->name);
            rf->name = strdup(json_string_value(v));
        } else if (strcmp(key, "description") == 0) {
            if (!json_is_string(v)) {
                *err = pstr_printf("description: must be a string");
                return PARLEY_ERR_INVALID_INPUT;
            }
            rf->description = strdup(json_string_value(v));
            if (!rf->description)
                return (*err = pstr_printf("out of memory")), PARLEY_ERR_NO_MEMORY;
        } else if (strcmp(key, "strict") == 0) {
            if (!json_is_boolean(v)) {
                *err = pstr_printf("strict: must be true or false");
                return PARLEY_ERR_INVALID_INPUT;
            }
            rf->strict = json_is_true(v);
        } else if (strcmp(key, "schema") == 0) {
            if (!json_is_null(v) && (st = take_schema(rf, v, err)) != PARLEY_OK)
                return st;
        }
    }
    if (!rf->name) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}

parley_status response_format_parse(const char *json_text, response_format **out, char **err)
{
    *out = NULL;
    *err = NULL;
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(root)) {
        *err = pstr_printf("must be a JSON object {\"name\", \"schema\", \"strict\"?}%s%s",
                           root ? "" : ": ", root ? "" : utf8_mend(jerr.text));
        json_decref(root);
        return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
    }
    response_format *rf = calloc(1, sizeof *rf);
    parley_status st = PARLEY_ERR_NO_MEMORY;
    if (rf && (rf->name = strdup(RESPONSE_FORMAT_DEFAULT_NAME)))
        st = read_members(rf, root, err);
    if (st != PARLEY_OK) {
        if (!*err) {
            *err = pstr_printf("out of memory");
            st = PARLEY_ERR_NO_MEMORY;
        }
        response_format_free(rf);
        rf = NULL;
    }
    json_decref(root);
    *out = rf;
    return st;
}
