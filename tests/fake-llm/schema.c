/* Structured output: the JSON a model constrained to a schema would answer
 * (OpenAI json_schema / json_object content, Ollama `format`, an Anthropic
 * forced tool's input or output_config), generated from the schema so a test
 * can predict it, and the schema_mismatch fault's answer that breaks it. */
#include "fakellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const json_t *resolve(const json_t *root, const json_t *s)
{
    for (int hops = 0; hops < 16; hops++) {
        const char *ref = jstr_member(s, "$ref");
        if (!ref)
            return s;
        if (strcmp(ref, "#") == 0)
            s = root;
        else if (strncmp(ref, "#/$defs/", 8) == 0)
            s = json_object_get(json_object_get(root, "$defs"), ref + 8);
        else if (strncmp(ref, "#/definitions/", 14) == 0)
            s = json_object_get(json_object_get(root, "definitions"), ref + 14);
        else
            return NULL;
    }
    return NULL;
}

/* The schema's type: its "type" (the first that is not "null"), else what its keywords say. */
static const char *type_of(const json_t *s)
{
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t))
        return json_string_value(t);
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x) {
        if (strcmp(json_string_value(x), "null") != 0)
            return json_string_value(x);
    }
    if (json_array_size(t))
        return "null";
    if (json_object_get(s, "properties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems"))
        return "array";
    return "string";
}

static json_t *example(const json_t *root, const json_t *s, const char *hint, int depth);

static json_t *example_number(const json_t *s, bool integer)
{
    json_t *lo = json_object_get(s, "minimum"), *xlo = json_object_get(s, "exclusiveMinimum");
    json_t *hi = json_object_get(s, "maximum"), *xhi = json_object_get(s, "exclusiveMaximum");
    double v = integer ? 1 : 1.5;
    if (lo)
        v = json_number_value(lo);
    else if (xlo)
        v = json_number_value(xlo) + 1;
    if (hi && v > json_number_value(hi))
        v = json_number_value(hi);
    if (xhi && v >= json_number_value(xhi))
        v = json_number_value(xhi) - 1;
    return integer ? json_integer((json_int_t)v) : json_real(v);
}

static json_t *example_string(const json_t *s, const char *hint)
{
    buf_t b = {0};
    buf_printf(&b, "fake %s", hint && *hint ? hint : "text");
    json_t *min = json_object_get(s, "minLength"), *max = json_object_get(s, "maxLength");
    while (min && b.len < (size_t)json_integer_value(min))
        buf_append(&b, "x", 1);
    if (max && b.len > (size_t)json_integer_value(max))
        b.len = (size_t)json_integer_value(max);
    json_t *out = json_stringn(b.data ? b.data : "", b.len);
    buf_free(&b);
    return out;
}

static json_t *example(const json_t *root, const json_t *s, const char *hint, int depth)
{
    s = resolve(root, s);
    if (!json_is_object(s) || depth > 32)
        return json_null();
    if (json_object_get(s, "const"))
        return json_incref(json_object_get(s, "const"));
    if (json_array_size(json_object_get(s, "enum")))
        return json_incref(json_array_get(json_object_get(s, "enum"), 0));
    static const char *const combos[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++)
        if (json_array_size(json_object_get(s, combos[k])))
            return example(root, json_array_get(json_object_get(s, combos[k]), 0), hint,
                           depth + 1);
    const char *t = type_of(s);
    if (strcmp(t, "object") == 0) {
        json_t *o = json_object();
        const char *key;
        json_t *sub;
        json_object_foreach(json_object_get(s, "properties"), key, sub)
            json_object_set_new(o, key, example(root, sub, key, depth + 1));
        return o;
    }
    if (strcmp(t, "array") == 0) {
        json_t *a = json_array(), *prefix = json_object_get(s, "prefixItems");
        json_int_t n = json_object_get(s, "minItems") ? json_integer_value(json_object_get(s, "minItems")) : 1;
        json_t *max = json_object_get(s, "maxItems");
        if (n < (json_int_t)json_array_size(prefix))
            n = (json_int_t)json_array_size(prefix);
        if (max && n > json_integer_value(max))
            n = json_integer_value(max);
        for (json_int_t i = 0; i < n; i++) {
            const json_t *item = (size_t)i < json_array_size(prefix) ? json_array_get(prefix, (size_t)i)
                                                                     : json_object_get(s, "items");
            json_array_append_new(a, item ? example(root, item, hint, depth + 1) : json_string("x"));
        }
        return a;
    }
    if (strcmp(t, "integer") == 0 || strcmp(t, "number") == 0)
        return example_number(s, strcmp(t, "integer") == 0);
    if (strcmp(t, "boolean") == 0)
        return json_true();
    if (strcmp(t, "null") == 0)
        return json_null();
    return example_string(s, hint);
}

/* Break an object answer: drop its first required property, or give its first property a
 * value of another type. */
static void mismatch(const json_t *schema, json_t *answer)
{
    const char *req = json_string_value(json_array_get(json_object_get(schema, "required"), 0));
    if (req && json_object_get(answer, req)) {
        json_object_del(answer, req);
        return;
    }
    void *it = json_object_iter(answer);
    if (it) {
        json_t *v = json_object_iter_value(it);
        json_object_iter_set_new(answer, it, json_is_string(v) ? json_integer(42)
                                                               : json_string("not-the-type"));
    } else {
        json_object_set_new(answer, "unexpected", json_true());
    }
}

char *schema_answer(const json_t *schema, const char *user_text, bool broken)
{
    json_t *v;
    if (schema) {
        v = example(schema, schema, NULL, 0);
    } else { /* JSON mode: any object */
        v = json_pack("{s:s}", "answer", user_text);
    }
    if (broken && json_is_object(v))
        mismatch(schema ? resolve(schema, schema) : NULL, v);
    size_t len;
    char *s = json_dump_compact(v, &len);
    json_decref(v);
    return s;
}
