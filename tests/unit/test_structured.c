/* test_structured.c -- structured output: the schema checker (lib/json_schema.c), the
 * input's response format (config/response_format.c) and how each codec sends it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config/options.h"
#include "config/response_format.h"
#include "lib/json_schema.h"
#include "provider/provider.h"

static json_t *J(const char *text)
{
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    if (!v)
        fprintf(stderr, "bad test JSON: %s\n", text);
    return v;
}

/* Validate `value` against `schema`: NULL when it matches, else the message (static). */
static const char *why(const char *schema, const char *value)
{
    static char out[512];
    json_t *s = J(schema), *v = J(value);
    char *err = NULL;
    CHECK(json_schema_check(s, &err) == PARLEY_OK);
    free(err);
    parley_status rc = json_schema_validate(s, v, &err);
    snprintf(out, sizeof out, "%s", err ? err : "");
    free(err);
    json_decref(s);
    json_decref(v);
    return rc == PARLEY_OK ? NULL : out;
}

#define MATCHES(s, v) CHECK(why(s, v) == NULL)
#define FAILS(s, v, words)                                                              \
    do {                                                                                \
        const char *w_ = why(s, v);                                                     \
        CHECK(w_ && strstr(w_, words));                                                 \
        if (w_ && !strstr(w_, words))                                                   \
            fprintf(stderr, "  got: %s\n  expected to contain: %s\n", w_, words);      \
    } while (0)

static void test_validate(void)
{
    const char *light = "{\"type\":\"object\",\"properties\":{"
                        "\"room\":{\"type\":\"string\",\"minLength\":2},"
                        "\"colour\":{\"enum\":[\"red\",\"green\"]},"
                        "\"level\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100},"
                        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2},"
                        "\"note\":{\"type\":[\"string\",\"null\"]}},"
                        "\"required\":[\"room\",\"colour\"],\"additionalProperties\":false}";
    MATCHES(light, "{\"room\":\"hall\",\"colour\":\"red\",\"level\":3.0,\"note\":null}");
    FAILS(light, "{\"colour\":\"red\"}", "$: lacks the required property 'room'");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"blue\"}",
          "$.colour: must be one of [\"red\",\"green\"] (got \"blue\")");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"red\",\"level\":101}",
          "$.level: must be at most 100");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"red\",\"level\":1.5}",
          "$.level: must be of type integer (got a number)");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"red\",\"tags\":[\"a\",7]}",
          "$.tags[1]: must be of type string (got an integer)");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"red\",\"tags\":[\"a\",\"b\",\"c\"]}",
          "$.tags: must have at most 2 items");
    FAILS(light, "{\"room\":\"h\",\"colour\":\"red\"}", "$.room: must have at least 2 characters");
    FAILS(light, "{\"room\":\"hall\",\"colour\":\"red\",\"x\":1}",
          "has the property 'x', which the schema does not allow");
    FAILS(light, "[]", "$: must be of type object (got an array)");
    /* Characters, not bytes: "é" is one. */
    MATCHES("{\"type\":\"string\",\"maxLength\":2}", "\"\xc3\xa9\xc3\xa9\"");
    /* $ref into $defs, anyOf, oneOf, const, additionalProperties as a schema. */
    const char *refs = "{\"type\":\"object\",\"$defs\":{\"id\":{\"type\":\"integer\"}},"
                       "\"properties\":{\"a\":{\"$ref\":\"#/$defs/id\"},"
                       "\"b\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"boolean\"}]},"
                       "\"c\":{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]},"
                       "\"d\":{\"const\":\"x\"}},"
                       "\"additionalProperties\":{\"type\":\"number\"}}";
    MATCHES(refs, "{\"a\":1,\"b\":true,\"c\":1.5,\"d\":\"x\",\"z\":2}");
    FAILS(refs, "{\"a\":\"1\"}", "$.a: must be of type integer");
    FAILS(refs, "{\"b\":1}", "$.b: matches none of the anyOf schemas");
    FAILS(refs, "{\"c\":2}", "$.c: matches more than one of the oneOf schemas");
    FAILS(refs, "{\"d\":\"y\"}", "$.d: must be \"x\" (got \"y\")");
    FAILS(refs, "{\"z\":\"2\"}", "$.z: must be of type number");
    /* Keywords that are annotations here are accepted, not enforced. */
    MATCHES("{\"type\":\"string\",\"format\":\"date-time\",\"pattern\":\"^x$\"}", "\"y\"");
}

static void test_check(void)
{
    static const struct { const char *schema, *words; } bad[] = {
        {"{\"type\":\"colour\"}", "schema: unknown type 'colour'"},
        {"{\"properties\":{\"a\":{\"type\":1}}}", "schema.properties.a: 'type' must be"},
        {"{\"required\":\"a\"}", "'required' must be an array"},
        {"{\"$ref\":\"#/$defs/none\"}", "'$ref' must name a schema"},
        {"{\"anyOf\":[]}", "'anyOf' must be a non-empty array"},
        {"{\"minItems\":-1}", "'minItems' must be a non-negative integer"},
        {"[]", "a schema must be a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *s = J(bad[i].schema);
        char *err = NULL;
        CHECK(json_schema_check(s, &err) == PARLEY_ERR_INVALID_INPUT && err && strstr(err, bad[i].words));
        if (err && !strstr(err, bad[i].words))
            fprintf(stderr, "  got: %s\n", err);
        free(err);
        json_decref(s);
    }
    /* A $ref cycle is bounded, not a stack overflow. */
    json_t *s = J("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}");
    json_t *v = J("1");
    char *err = NULL;
    CHECK(json_schema_validate(s, v, &err) == PARLEY_ERR_INVALID_INPUT && err && strstr(err, "nested more than 64"));
    free(err);
    json_decref(s);
    json_decref(v);
}

static void test_parse(void)
{
    char *err = NULL;
    response_format *rf = NULL;
    CHECK(response_format_parse("{}", &rf, &err) == PARLEY_OK);
    CHECK(rf && strcmp(rf->name, "response") == 0 && !rf->schema && !rf->strict);
    response_format_free(rf);
    CHECK(response_format_parse("{\"name\":\"x-1\",\"strict\":true,\"description\":\"d\","
                                "\"schema\":{\"type\":\"object\"}}", &rf, &err) == PARLEY_OK);
    CHECK(rf && strcmp(rf->name, "x-1") == 0 && rf->schema && rf->strict &&
          strcmp(rf->description, "d") == 0);
    response_format_free(rf);
    static const struct { const char *text, *words; } bad[] = {
        {"[]", "must be a JSON object"},
        {"{\"name\":\"\"}", "name: must be 1 to 64"},
        {"{\"strict\":1}", "strict: must be true or false"},
        {"{\"schema\":{\"type\":\"string\"}}", "must describe a JSON object"},
        {"{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":[]}}}",
         "schema.properties.a: a schema must be a JSON object"},
        {"{\"name\":\"a\",\"name\":\"b\"}", "must be a JSON object"},
        {"{\"format\":{}}", "unknown key \"format\" (expected name, schema, strict, description)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rf = NULL;
        CHECK(response_format_parse(bad[i].text, &rf, &err) == PARLEY_ERR_INVALID_INPUT && !rf && err &&
              strstr(err, bad[i].words));
        if (err && !strstr(err, bad[i].words))
            fprintf(stderr, "  got: %s\n", err);
        free(err);
    }
}

/* The request body a codec renders for one user message with `rf`. */
static json_t *render(const char *prov, const char *extra_options, const response_format *rf,
                      const char *tools)
{
    char text[512];
    snprintf(text, sizeof text, "{\"provider\":\"%s\",\"model\":\"m\"%s}", prov,
             extra_options);
    parley_options o;
    char *err = NULL;
    CHECK(options_parse(text, &o, &err) == PARLEY_OK);
    free(err);
    json_t *messages = J("[{\"role\":\"user\",\"content\":\"hi\"}]"), *history = J("[]");
    provider_request r = {.system = "s", .history = history, .messages = messages,
                          .tools_json = tools, .response_format = rf};
    pbuf body = PBUF_INIT;
    CHECK(provider_find(prov)->encode(&body, &o, &r, &err) == 0);
    json_t *out = json_loads(body.data ? body.data : "", 0, NULL);
    CHECK(out != NULL);
    pbuf_free(&body);
    json_decref(messages);
    json_decref(history);
    options_free(&o);
    return out;
}

/* got equals the JSON text `want`. */
static int json_is(const json_t *got, const char *want)
{
    json_t *w = J(want);
    int same = json_equal(got, w);
    json_decref(w);
    return same;
}

static void test_codecs(void)
{
    char *err = NULL;
    response_format *rf = NULL;
    response_format_parse(
        "{\"name\":\"answer\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
        "\"string\"}}}}", &rf, &err);
    json_t *schema = rf ? rf->schema : NULL;
    const char *tool = "[{\"type\":\"function\",\"function\":{\"name\":\"t\",\"parameters\":"
                       "{\"type\":\"object\"}}}]";

    json_t *b = render("openai", "", rf, "[]");
    json_t *js = json_object_get(json_object_get(b, "response_format"), "json_schema");
    CHECK_STR(json_string_value(json_object_get(json_object_get(b, "response_format"), "type")),
              "json_schema");
    CHECK_STR(json_string_value(json_object_get(js, "name")), "answer");
    CHECK(json_equal(json_object_get(js, "schema"), schema));
    CHECK(json_is_false(json_object_get(js, "strict")));
    json_decref(b);

    b = render("ollama", "", rf, "[]");
    CHECK(json_equal(json_object_get(b, "format"), schema));
    json_decref(b);

    /* Anthropic: a forced answer tool, after the host's tools (and their cache breakpoint). */
    b = render("anthropic", "", rf, "[]");
    json_t *tools = json_object_get(b, "tools");
    CHECK(json_array_size(tools) == 1);
    CHECK(json_equal(json_object_get(json_array_get(tools, 0), "input_schema"), schema));
    CHECK(json_is(json_object_get(b, "tool_choice"), "{\"type\":\"tool\",\"name\":\"answer\"}"));
    json_decref(b);
    b = render("anthropic", "", rf, tool);
    tools = json_object_get(b, "tools");
    CHECK(json_array_size(tools) == 2);
    CHECK(json_object_get(json_array_get(tools, 0), "cache_control") != NULL);
    CHECK(json_object_get(json_array_get(tools, 1), "cache_control") == NULL);
    CHECK_STR(json_string_value(json_object_get(json_object_get(b, "tool_choice"), "type")),
              "any");
    json_decref(b);
    /* With thinking: output_config, no forced tool. */
    b = render("anthropic", ",\"thinking_budget_tokens\":1024", rf, "[]");
    CHECK(json_object_get(b, "tools") == NULL && json_object_get(b, "tool_choice") == NULL);
    CHECK(json_equal(json_object_get(json_object_get(json_object_get(b, "output_config"),
                                                     "format"), "schema"), schema));
    json_decref(b);
    response_format_free(rf);

    /* No schema: JSON mode. */
    response_format_parse("{}", &rf, &err);
    b = render("openai", "", rf, "[]");
    CHECK(json_is(json_object_get(b, "response_format"), "{\"type\":\"json_object\"}"));
    json_decref(b);
    b = render("ollama", "", rf, "[]");
    CHECK_STR(json_string_value(json_object_get(b, "format")), "json");
    json_decref(b);
    response_format_free(rf);
}

int main(void)
{
    test_validate();
    test_check();
    test_parse();
    test_codecs();
    return check_report();
}
