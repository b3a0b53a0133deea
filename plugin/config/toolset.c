/* toolset.c -- see toolset.h. */
#include "config/toolset.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json_oom.h"
#include "lib/utf8.h"

struct toolset {
    char **names;
    size_t count;
    char *json; /* OpenAI tools array */
};

static char *err_msg(const char *fmt, size_t i, const char *detail)
{
    char *s = NULL;
    if (asprintf(&s, fmt, i, detail) < 0)
        s = NULL;
    return s;
}

static int valid_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 64)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int toolset_has(const toolset *t, const char *name)
{
    for (size_t i = 0; t && i < t->count; i++)
        if (strcmp(t->names[i], name) == 0)
            return 1;
    return 0;
}

/* Turn one declaration (either form) into OpenAI's form (*out), or explain why not. */
static parley_status normalise(json_t *decl, size_t i, json_t **out, char **err)
{
    *out = NULL;
    if (!json_is_object(decl)) {
        *err = err_msg("tool %zu: must be an object%s", i, "");
        return PARLEY_ERR_INVALID_INPUT;
    }
    json_t *fn = decl;
    json_t *type = json_object_get(decl, "type");
    if (type) {
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
            *err = err_msg("tool %zu: type must be \"function\"%s", i, "");
            return PARLEY_ERR_INVALID_INPUT;
        }
        fn = json_object_get(decl, "function");
        if (!json_is_object(fn)) {
            *err = err_msg("tool %zu: 'function' must be an object%s", i, "");
            return PARLEY_ERR_INVALID_INPUT;
        }
    }
    json_t *name = json_object_get(fn, "name");
    json_t *desc = json_object_get(fn, "description");
    json_t *params = json_object_get(fn, "parameters");
    if (!json_is_string(name) || !valid_name(json_string_value(name))) {
        *err = err_msg("tool %zu: 'name' must match [A-Za-z0-9_-]{1,64}%s", i, "");
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (desc && !json_is_string(desc)) {
        *err = err_msg("tool %zu ('%s'): 'description' must be a string", i, json_string_value(name));
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (params && !json_is_object(params)) {
        *err = err_msg("tool %zu ('%s'): 'parameters' must be a JSON Schema object", i,
                       json_string_value(name));
        return PARLEY_ERR_INVALID_INPUT;
    }
    json_t *out_fn = json_pack("{s:O}", "name", name);
    int failed = !out_fn; /* a member left out would offer the model another tool */
    if (desc && !failed)
        failed = json_object_set(out_fn, "description", desc) != 0;
    if (!failed)
        failed = params ? json_object_set(out_fn, "parameters", params) != 0
                        : json_object_set_new(out_fn, "parameters",
                                              json_pack("{s:s,s:{}}", "type", "object",
                                                        "properties")) != 0;
    if (failed) {
        json_decref(out_fn);
        return PARLEY_ERR_NO_MEMORY;
    }
    *out = json_pack("{s:s,s:o}", "type", "function", "function", out_fn);
    return *out ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

parley_status toolset_parse(const char *json_text, const toolset *base, toolset **result,
                            char **err)
{
    *result = NULL;
    *err = NULL;
    parley_status st = PARLEY_ERR_INVALID_INPUT;
    json_error_t jerr;
    const char *text = json_text ? json_text : "[]";
    json_t *arr = json_loads(text, 0, &jerr);
    json_t *out = base ? json_loads(base->json, 0, NULL) : json_array();
    toolset *t = calloc(1, sizeof *t);
    if (!t || !out || (!arr && json_load_oom_text(&jerr, text, strlen(text))))
        goto oom;
    if (!arr) {
        if (asprintf(err, "tools are not valid JSON: %s", utf8_mend(jerr.text)) < 0)
            *err = NULL;
        goto fail;
    }
    if (!json_is_array(arr)) {
        *err = strdup("tools must be a JSON array");
        goto fail;
    }
    size_t total = (base ? base->count : 0) + json_array_size(arr);
    t->names = calloc(total ? total : 1, sizeof *t->names);
    if (!t->names)
        goto oom;
    for (size_t i = 0; base && i < base->count; i++)
        if (!(t->names[t->count++] = strdup(base->names[i])))
            goto oom;
    size_t i;
    json_t *decl;
    json_array_foreach(arr, i, decl) {
        json_t *norm;
        parley_status nst = normalise(decl, i, &norm, err);
        if (nst != PARLEY_OK) {
            st = nst;
            goto fail;
        }
        const char *name = json_string_value(json_object_get(json_object_get(norm, "function"), "name"));
        if (toolset_has(t, name)) {
            *err = err_msg("tool %zu: duplicate name '%s'", i, name);
            json_decref(norm);
            goto fail;
        }
        t->names[t->count++] = strdup(name);
        if (json_array_append_new(out, norm) != 0 || !t->names[t->count - 1])
            goto oom;
    }
    t->json = json_dumps_whole(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!t->json)
        goto oom;
    json_decref(arr);
    json_decref(out);
    *result = t;
    return PARLEY_OK;
oom:
    free(*err);
    *err = strdup("out of memory");
    st = PARLEY_ERR_NO_MEMORY;
fail:
    json_decref(arr);
    json_decref(out);
    toolset_free(t);
    return *err ? st : PARLEY_ERR_NO_MEMORY;
}

void toolset_free(toolset *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->count; i++)
        free(t->names[i]);
    free(t->names);
    free(t->json);
    free(t);
}

const char *toolset_json(const toolset *t) { return t && t->json ? t->json : "[]"; }
