/*
 * json_schema.h -- checking a model's structured answer against the JSON
 * Schema the host asked for (parley_input.response_format_json).
 *
 * Servers that constrain decoding to a schema (OpenAI strict mode, llama.cpp
 * grammars, Ollama `format`, Anthropic's tools) still let through answers
 * that do not match it: a cut-short answer, a server that ignores the
 * constraint, a model that fills a forced tool loosely.  A host that asked
 * for data must get that data or a clear failure, so Parley checks the
 * answer itself.  jansson parses; this walks the parsed value against the
 * keywords such schemas use in practice (OpenAI's and Anthropic's supported
 * subset, what Home Assistant's voluptuous-openapi and Pydantic produce):
 * type, properties, required, additionalProperties, items, prefixItems, enum,
 * const, anyOf, oneOf, allOf, minItems/maxItems, minLength/maxLength,
 * minimum/maximum and their exclusive forms, and local $ref into $defs or
 * definitions.  Other keywords (format, pattern, description, ...) are
 * annotations here: accepted, not enforced.
 */
#ifndef PARLEY_JSON_SCHEMA_H
#define PARLEY_JSON_SCHEMA_H

#include <jansson.h>

#include "lib/plugin_status.h"

/*
 * Is `schema` a schema this checker can apply?  PARLEY_OK, or
 * PARLEY_ERR_INVALID_INPUT (NO_MEMORY) with *err (malloc'd) naming the
 * offending place ("properties.color.type: unknown type 'colour'").
 */
parley_status json_schema_check(const json_t *schema, char **err);

/*
 * Does `value` match `schema` (one that passed json_schema_check)?  PARLEY_OK,
 * or PARLEY_ERR_INVALID_INPUT (NO_MEMORY) with *err (malloc'd) saying where and
 * why, as a path from the root ("$.items[2].color: must be one of \"red\",
 * \"green\" (got \"blue\")").
 */
parley_status json_schema_validate(const json_t *schema, const json_t *value, char **err);

#endif
