/* json_schema.c -- see json_schema.h. */
#include "lib/json_schema.h"

#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_oom.h"

/* Deeper than any schema a host writes; bounds recursion through $ref cycles. */
#define MAX_DEPTH 64

static const char *const TYPES[] = {"object", "array", "string", "number", "integer", "boolean",
                                    "null", NULL};

/* Where a check stands: the root (for $ref), the value's path, the depth. */
typedef struct walk {
    const json_t *root;
    pbuf path;
    int depth;
    char *err;
} walk;

/* The error at the current path; none (out of memory, walk_result says) when the path
 * could not be kept whole: a message naming the wrong place would mislead. */
static int fail(walk *w, const char *fmt, const char *a, const char *b)
{
    if (!w->err && !w->path.oom)
        w->err = pstr_printf(fmt, w->path.len ? w->path.data : "$", a ? a : "", b ? b : "");
    return -1;
}

/* ---- the schema itself ---- */

static int known_type(const char *t)
{
    for (int i = 0; TYPES[i]; i++)
        if (strcmp(t, TYPES[i]) == 0)
            return 1;
    return 0;
}

/* "#", "#/$defs/NAME" or "#/definitions/NAME" in the root schema, else NULL. */
static const json_t *resolve_ref(const json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    static const char *const bases[][2] = {{"#/$defs/", "$defs"},
                                            {"#/definitions/", "definitions"}};
    for (size_t i = 0; i < 2; i++) {
        size_t n = strlen(bases[i][0]);
        if (strncmp(ref, bases[i][0], n) == 0 && !strchr(ref + n, '/'))
            return json_object_get(json_object_get(root, bases[i][1]), ref + n);
    }
    return NULL;
}

static int check_schema(walk *w, const json_t *s);

/* Enter `key` (a member name, or NULL: keep the path) of the schema being checked. */
static int check_sub(walk *w, const char *key, const json_t *s)
{
    size_t len = w->path.len;
    if (key)
        pbuf_printf(&w->path, "%s%s", len ? "." : "", key);
    int rc = check_schema(w, s);
    w->path.len = len;
    if (w->path.data)
        w->path.data[len] = '\0';
    return rc;
}

static int check_members(walk *w, const json_t *s, const char *key)
{
    const json_t *m = json_object_get(s, key);
    if (!m)
        return 0;
    if (!json_is_object(m))
        return fail(w, "%s%s: '%s' must be an object of schemas", "", key);
    const char *name;
    const json_t *sub;
    json_object_foreach((json_t *)m, name, sub) {
        size_t len = w->path.len;
        pbuf_printf(&w->path, "%s%s", len ? "." : "", key);
        int rc = check_sub(w, name, sub);
        w->path.len = len;
        if (w->path.data)
            w->path.data[len] = '\0';
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int check_list(walk *w, const json_t *s, const char *key)
{
    const json_t *l = json_object_get(s, key);
    if (!l)
        return 0;
    if (!json_is_array(l) || json_array_size(l) == 0)
        return fail(w, "%s%s: '%s' must be a non-empty array of schemas", "", key);
    size_t i;
    const json_t *sub;
    json_array_foreach(l, i, sub) {
        char at[48];
        snprintf(at, sizeof at, "%s[%zu]", key, i);
        if (check_sub(w, at, sub) != 0)
            return -1;
    }
    return 0;
}

static int check_type(walk *w, const json_t *type)
{
    if (!type)
        return 0;
    if (json_is_string(type))
        return known_type(json_string_value(type))
                   ? 0 : fail(w, "%s: unknown type '%s'%s", json_string_value(type), NULL);
    size_t i;
    const json_t *t;
    if (!json_is_array(type) || json_array_size(type) == 0)
        return fail(w, "%s: 'type' must be a type name or a non-empty array of them%s%s", NULL,
                    NULL);
    json_array_foreach(type, i, t) {
        if (!json_is_string(t) || !known_type(json_string_value(t)))
            return fail(w, "%s: 'type' lists something that is not a JSON type%s%s", NULL, NULL);
    }
    return 0;
}

static int check_numbers(walk *w, const json_t *s)
{
    static const char *const counts[] = {"minItems", "maxItems", "minLength", "maxLength",
                                         "minProperties", "maxProperties", NULL};
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum", NULL};
    for (int i = 0; counts[i]; i++) {
        const json_t *v = json_object_get(s, counts[i]);
        if (v && !(json_is_integer(v) && json_integer_value(v) >= 0))
            return fail(w, "%s: '%s' must be a non-negative integer%s", counts[i], NULL);
    }
    for (int i = 0; bounds[i]; i++) {
        const json_t *v = json_object_get(s, bounds[i]);
        if (v && !json_is_number(v))
            return fail(w, "%s: '%s' must be a number%s", bounds[i], NULL);
    }
    return 0;
}

static int check_schema(walk *w, const json_t *s)
{
    if (json_is_boolean(s))
        return 0;
    if (!json_is_object(s))
        return fail(w, "%s: a schema must be a JSON object%s%s", NULL, NULL);
    if (++w->depth > MAX_DEPTH) {
        w->depth--;
        return fail(w, "%s: nested more than 64 deep%s%s", NULL, NULL);
    }
    int rc = check_type(w, json_object_get(s, "type"));
    const json_t *req = json_object_get(s, "required"), *v;
    size_t i;
    if (rc == 0 && req && !json_is_array(req))
        rc = fail(w, "%s: 'required' must be an array of property names%s%s", NULL, NULL);
    json_array_foreach(req, i, v) {
        if (rc == 0 && !json_is_string(v))
            rc = fail(w, "%s: 'required' must be an array of property names%s%s", NULL, NULL);
    }
    if (rc == 0 && json_object_get(s, "enum") && !json_is_array(json_object_get(s, "enum")))
        rc = fail(w, "%s: 'enum' must be an array%s%s", NULL, NULL);
    const json_t *ref = json_object_get(s, "$ref");
    if (rc == 0 && ref && (!json_is_string(ref) || !resolve_ref(w->root, json_string_value(ref))))
        rc = fail(w, "%s: '$ref' must name a schema of this one's $defs (\"#/$defs/NAME\")%s%s",
                  NULL, NULL);
    if (rc == 0)
        rc = check_numbers(w, s);
    if (rc == 0)
        rc = check_members(w, s, "properties");
    if (rc == 0)
        rc = check_members(w, s, "$defs");
    if (rc == 0)
        rc = check_members(w, s, "definitions");
    static const char *const subs[] = {"items", "additionalProperties", "not", NULL};
    for (int k = 0; rc == 0 && subs[k]; k++)
        if (json_object_get(s, subs[k]))
            rc = check_sub(w, subs[k], json_object_get(s, subs[k]));
    static const char *const lists[] = {"prefixItems", "anyOf", "oneOf", "allOf", NULL};
    for (int k = 0; rc == 0 && lists[k]; k++)
        rc = check_list(w, s, lists[k]);
    w->depth--;
    return rc;
}

/* What a walk that returned rc says: PARLEY_OK, or its error with *err (malloc'd). */
static parley_status walk_result(walk *w, int rc, char **err)
{
    pbuf_free(&w->path);
    if (rc == 0) {
        free(w->err);
        *err = NULL;
        return PARLEY_OK;
    }
    *err = w->err ? w->err : pstr_printf("out of memory");
    return w->err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

parley_status json_schema_check(const json_t *schema, char **err)
{
    walk w = {.root = schema};
    pbuf_puts(&w.path, "schema");
    return walk_result(&w, check_schema(&w, schema), err);
}

/* ---- a value against it ---- */

static int validate(walk *w, const json_t *s, const json_t *v);

/* A value as short JSON text for a message (malloc'd). */
static char *shown(const json_t *v)
{
    char *s = json_dumps_whole(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (s && strlen(s) > 80)
        strcpy(s + 77, "...");
    return s;
}

static const char *type_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int is_type(const json_t *v, const char *t)
{
    if (strcmp(t, "integer") == 0) { /* 2.0 is an integer to JSON Schema */
        double d = json_is_real(v) ? json_real_value(v) : 0.5;
        return json_is_integer(v) || (d > -9e15 && d < 9e15 && d == (double)(long long)d);
    }
    if (strcmp(t, "number") == 0)
        return json_is_number(v);
    if (strcmp(t, "object") == 0)
        return json_is_object(v);
    if (strcmp(t, "array") == 0)
        return json_is_array(v);
    if (strcmp(t, "string") == 0)
        return json_is_string(v);
    if (strcmp(t, "boolean") == 0)
        return json_is_boolean(v);
    return json_is_null(v);
}

static int validate_type(walk *w, const json_t *type, const json_t *v)
{
    if (!type)
        return 0;
    if (json_is_string(type)) {
        if (is_type(v, json_string_value(type)))
            return 0;
        return fail(w, "%s: must be of type %s (got %s)", json_string_value(type), type_of(v));
    }
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) {
        if (is_type(v, json_string_value(t)))
            return 0;
    }
    char *names = shown(type);
    int rc = fail(w, "%s: must be of type %s (got %s)", names ? names : "?", type_of(v));
    free(names);
    return rc;
}

static int validate_enum(walk *w, const json_t *s, const json_t *v)
{
    const json_t *e = json_object_get(s, "enum"), *c = json_object_get(s, "const"), *x;
    size_t i;
    if (c && !json_equal(c, v)) {
        char *want = shown(c), *got = shown(v);
        int rc = fail(w, "%s: must be %s (got %s)", want, got);
        free(want);
        free(got);
        return rc;
    }
    if (!e)
        return 0;
    json_array_foreach(e, i, x) {
        if (json_equal(x, v))
            return 0;
    }
    char *want = shown(e), *got = shown(v);
    int rc = fail(w, "%s: must be one of %s (got %s)", want, got);
    free(want);
    free(got);
    return rc;
}

/* Enter member `key` or element `index` of the value. */
static int validate_at(walk *w, const json_t *s, const json_t *v, const char *key, size_t index)
{
    size_t len = w->path.len;
    if (!len)
        pbuf_putc(&w->path, '$');
    if (key)
        pbuf_printf(&w->path, ".%s", key);
    else
        pbuf_printf(&w->path, "[%zu]", index);
    int rc = validate(w, s, v);
    w->path.len = len;
    if (w->path.data)
        w->path.data[len] = '\0';
    return rc;
}

static int count_bound(walk *w, const json_t *s, const char *min, const char *max, size_t n,
                       const char *what)
{
    const json_t *lo = json_object_get(s, min), *hi = json_object_get(s, max);
    char text[64];
    if (lo && (json_int_t)n < json_integer_value(lo)) {
        snprintf(text, sizeof text, "%lld", (long long)json_integer_value(lo));
        return fail(w, "%s: must have at least %s %s", text, what);
    }
    if (hi && (json_int_t)n > json_integer_value(hi)) {
        snprintf(text, sizeof text, "%lld", (long long)json_integer_value(hi));
        return fail(w, "%s: must have at most %s %s", text, what);
    }
    return 0;
}

static int validate_object(walk *w, const json_t *s, const json_t *v)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *extra = json_object_get(s, "additionalProperties");
    const json_t *req = json_object_get(s, "required"), *x;
    size_t i;
    json_array_foreach(req, i, x) {
        if (!json_object_get(v, json_string_value(x)))
            return fail(w, "%s: lacks the required property '%s'%s", json_string_value(x), NULL);
    }
    if (count_bound(w, s, "minProperties", "maxProperties", json_object_size(v), "properties"))
        return -1;
    const char *key;
    const json_t *m;
    json_object_foreach((json_t *)v, key, m) {
        const json_t *sub = json_object_get(props, key);
        if (!sub && json_is_false(extra))
            return fail(w, "%s: has the property '%s', which the schema does not allow%s", key,
                        NULL);
        if (!sub)
            sub = json_is_object(extra) ? extra : NULL;
        if (sub && validate_at(w, sub, m, key, 0) != 0)
            return -1;
    }
    return 0;
}

static int validate_array(walk *w, const json_t *s, const json_t *v)
{
    if (count_bound(w, s, "minItems", "maxItems", json_array_size(v), "items"))
        return -1;
    const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
        const json_t *sub = i < json_array_size(prefix) ? json_array_get(prefix, i) : items;
        if (sub && validate_at(w, sub, x, NULL, i) != 0)
            return -1;
    }
    return 0;
}

/* Length in characters (code points) of UTF-8 text, as JSON Schema counts it. */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    return chars;
}

static int validate_number(walk *w, const json_t *s, const json_t *v)
{
    static const struct { const char *key, *words; int sign, strict; } bounds[] = {
        {"minimum", "at least", -1, 0}, {"exclusiveMinimum", "more than", -1, 1},
        {"maximum", "at most", 1, 0}, {"exclusiveMaximum", "less than", 1, 1}};
    double x = json_number_value(v);
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        const json_t *b = json_object_get(s, bounds[i].key);
        if (!b)
            continue;
        double lim = json_number_value(b), d = (x - lim) * bounds[i].sign;
        if (d > 0 || (bounds[i].strict && d == 0)) {
            char text[64];
            snprintf(text, sizeof text, "%.17g", lim);
            return fail(w, "%s: must be %s %s", bounds[i].words, text);
        }
    }
    return 0;
}

/* anyOf / oneOf / allOf: how many of the list's schemas the value matches. */
static int validate_combinations(walk *w, const json_t *s, const json_t *v)
{
    static const char *const kinds[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        const json_t *list = json_object_get(s, kinds[k]), *sub;
        if (!list)
            continue;
        size_t i, matched = 0;
        char *first = NULL; /* why the first schema that failed did */
        json_array_foreach(list, i, sub) {
            char *saved = w->err;
            w->err = NULL;
            if (validate(w, sub, v) == 0)
                matched++;
            else if (!first)
                first = w->err;
            else
                free(w->err);
            w->err = saved;
        }
        int rc = 0;
        if (k == 2 && matched < json_array_size(list))
            rc = first ? (w->err = first, first = NULL, -1) : -1;
        else if (matched == 0)
            rc = fail(w, "%s: matches none of the %s schemas (the first: %s)", kinds[k],
                      first ? first : "?");
        else if (k == 1 && matched > 1)
            rc = fail(w, "%s: matches more than one of the %s schemas%s", kinds[k], NULL);
        free(first);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int validate(walk *w, const json_t *s, const json_t *v)
{
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return fail(w, "%s: is not allowed here%s%s", NULL, NULL);
    if (++w->depth > MAX_DEPTH) {
        w->depth--;
        return fail(w, "%s: nested more than 64 deep%s%s", NULL, NULL);
    }
    int rc = 0;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref)
        rc = validate(w, resolve_ref(w->root, json_string_value(ref)), v);
    if (rc == 0)
        rc = validate_type(w, json_object_get(s, "type"), v);
    if (rc == 0)
        rc = validate_enum(w, s, v);
    if (rc == 0 && json_is_object(v))
        rc = validate_object(w, s, v);
    if (rc == 0 && json_is_array(v))
        rc = validate_array(w, s, v);
    if (rc == 0 && json_is_string(v))
        rc = count_bound(w, s, "minLength", "maxLength",
                         utf8_chars(json_string_value(v), json_string_length(v)), "characters");
    if (rc == 0 && json_is_number(v))
        rc = validate_number(w, s, v);
    if (rc == 0)
        rc = validate_combinations(w, s, v);
    if (rc == 0 && json_object_get(s, "not")) {
        char *saved = w->err;
        w->err = NULL;
        int inner = validate(w, json_object_get(s, "not"), v);
        free(w->err);
        w->err = saved;
        if (inner == 0)
            rc = fail(w, "%s: matches the schema under 'not'%s%s", NULL, NULL);
    }
    w->depth--;
    return rc;
}

parley_status json_schema_validate(const json_t *schema, const json_t *value, char **err)
{
    walk w = {.root = schema};
    return walk_result(&w, validate(&w, schema, value), err);
}
