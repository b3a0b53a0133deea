/*
 * response_format.h -- a turn's structured-output request
 * (parley_input.response_format_json, docs/abi.md "Structured output").
 *
 * The host asks for the answer as JSON matching a schema; each provider
 * codec sends it in its own shape (Chat Completions response_format
 * json_schema, Ollama format, Anthropic a forced tool or output_config), and
 * the turn checks what comes back against the schema (lib/json_schema.h).
 * Parsed and checked once, on the host's thread, when the turn is accepted.
 */
#ifndef PARLEY_RESPONSE_FORMAT_H
#define PARLEY_RESPONSE_FORMAT_H

#include <jansson.h>

#include "lib/plugin_status.h"

typedef struct response_format {
    char *name;        /* ^[a-zA-Z0-9_-]{1,64}$; "response" when not given */
    char *description; /* what the answer is, for the model; NULL = none */
    json_t *schema;    /* a JSON Schema of an object; NULL = any JSON object */
    int strict;        /* Chat Completions json_schema.strict */
} response_format;

/* The name used when the host gives none. */
#define RESPONSE_FORMAT_DEFAULT_NAME "response"

/*
 * Parse {"name"?, "schema"?, "strict"?, "description"?} (JSON text).
 * PARLEY_OK with *out the new format, or PARLEY_ERR_INVALID_INPUT with *out
 * NULL and *err (malloc'd: "name: must be ...", "schema.properties.x.type:
 * unknown type ..."); PARLEY_ERR_NO_MEMORY with *err "out of memory".
 */
parley_status response_format_parse(const char *json_text, response_format **out, char **err);
void response_format_free(response_format *rf);

#endif
