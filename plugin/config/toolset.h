/*
 * toolset.h -- the tools offered to the model: declared by the host in the
 * `tools` option and/or per turn in the input, validated once, kept as the
 * OpenAI `tools` array text ready to paste into a request.
 */
#ifndef PARLEY_TOOLSET_H
#define PARLEY_TOOLSET_H

#include <stddef.h>

#include "lib/plugin_status.h"

typedef struct toolset toolset;

/*
 * Parse a JSON array of tools, each {"name","description"?,"parameters"?} or
 * OpenAI's {"type":"function","function":{...}}.  Names must match
 * [A-Za-z0-9_-]{1,64} and be unique (also against `base`, which may be
 * NULL); parameters must be a JSON Schema object (default: an empty object
 * schema).  PARLEY_OK with *out the merged set (base's tools first), or
 * PARLEY_ERR_INVALID_INPUT (NO_MEMORY) with *out NULL and *err (malloc'd).
 */
parley_status toolset_parse(const char *json_array, const toolset *base, toolset **out,
                            char **err);
void toolset_free(toolset *t);

int toolset_has(const toolset *t, const char *name);
/* The OpenAI `tools` array as compact JSON text, "[]" when empty. */
const char *toolset_json(const toolset *t);

#endif
