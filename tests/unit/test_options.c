/* test_options.c -- option parsing, validation messages, schema, and docs/options.md. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/utf8.h"
#include "config/options.h"
#include "provider/provider.h"
#include "config/toolset.h"

/* How many tools t offers: the length of its `tools` array (toolset.h keeps no count). */
static size_t tools_in(const toolset *t)
{
    json_t *a = json_loads(toolset_json(t), 0, NULL);
    size_t n = json_array_size(a);
    json_decref(a);
    return n;
}

/* Parse and expect failure with a message containing `needle`. */
static void expect_error(const char *json, const char *needle)
{
    parley_options o;
    char *err = NULL;
    parley_status rc = provider_options_parse(json, &o, &err);
    CHECK(rc == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && strstr(err, needle) && utf8_valid(err, strlen(err)));
    if (!err || !strstr(err, needle) || !utf8_valid(err, strlen(err)))
        fprintf(stderr, "  options %s\n  error   %s\n  wanted  %s\n", json, err ? err : "(none)", needle);
    free(err);
}

static void test_provider_options(void)
{
    parley_options o;
    char *err = NULL;
    expect_error("{\"model\":\"m\",\"provider\":\"gemini\"}",
                 "option 'provider': must be \"openai\", \"anthropic\" or \"ollama\" (got \"gemini\")");
    expect_error("{\"model\":\"m\",\"max_tokens_field\":\"tokens\"}", "option 'max_tokens_field'");
    /* valid JSON but no object: refused as such, not taken for out of memory (fuzz_options) */
    expect_error("8", "options");
    expect_error(" \"text\"", "options");
    expect_error("[1]", "options must be a JSON object");
    expect_error("{\"model\":\"m\",\"extra_body\":[1]}", "option 'extra_body': must be an object or null");
    expect_error("{\"model\":\"m\",\"extra_body\":{\"top_k\":2,\"messages\":[]}}",
                 "option 'extra_body': key 'messages' is one Parley sends itself");
    expect_error("{\"model\":\"m\",\"keep_alive\":true}",
                 "option 'keep_alive': must be a string, a number or null");
    expect_error("{\"model\":\"m\",\"think\":1}", "option 'think': must be a boolean, a string or null");
    expect_error("{\"model\":\"m\",\"provider\":\"anthropic\",\"thinking_budget_tokens\":2048,"
                 "\"max_tokens\":1024}",
                 "option 'thinking_budget_tokens': must be less than max_tokens (1024)");
    /* the budget is Anthropic's (anthropic_check_options): the other APIs ignore it */
    CHECK(provider_options_parse("{\"model\":\"m\",\"thinking_budget_tokens\":2048,"
                                 "\"max_tokens\":1024}", &o, &err) == PARLEY_OK);
    options_free(&o);
    expect_error("{\"model\":\"m\",\"thinking_budget_tokens\":100}", "from 1024 to");
    expect_error("{\"model\":\"m\",\"provider\":\"anthropic\",\"thinking_budget_tokens\":2048,"
                 "\"temperature\":0.5}", "option 'temperature': Anthropic's extended thinking");
    CHECK(options_parse("{\"model\":\"m\",\"provider\":\"ollama\",\"keep_alive\":-1,"
                        "\"think\":\"high\",\"extra_body\":{\"top_k\":20}}", &o, &err) == PARLEY_OK);
    CHECK_STR(o.keep_alive, "-1");
    CHECK_STR(o.think, "\"high\"");
    CHECK_STR(o.extra_body, "{\"top_k\":20}");
    options_free(&o);
}

static void test_defaults(void)
{
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\"}", &o, &err) == PARLEY_OK);
    CHECK(err == NULL);
    CHECK(o.base_url == NULL); /* the provider's default (provider/provider.h) */
    CHECK(o.provider == NULL); /* the registry's first, set by provider_options_parse */
    CHECK(o.strip_think_tags == 1 && o.prompt_cache == 1 && o.num_ctx == 8192);
    CHECK_STR(o.max_tokens_field, "max_tokens");
    CHECK(o.extra_body == NULL && o.keep_alive == NULL && o.think == NULL);
    CHECK(o.reasoning_effort == NULL && o.thinking_budget_tokens == 0);
    CHECK(o.max_history_turns == 20);
    CHECK(o.history_keep_turns == -1); /* null: the same as max_history_turns */
    CHECK_STR(o.history_store, "memory");
    CHECK_STR(o.history_sync, "normal");
    CHECK(o.max_tool_iterations == 10);
    CHECK(o.auto_create_conversation_id == 0);
    CHECK(o.stream == 0);
    CHECK(o.verify_tls == 1);
    CHECK(o.temperature < 0 && o.top_p < 0 && o.max_tokens == 0); /* unset: not sent */
    CHECK(o.api_key == NULL);
    CHECK_STR(o.tools_json, "[]");
    options_free(&o);
    CHECK(provider_options_parse("{\"model\":\"m\"}", &o, &err) == PARLEY_OK);
    CHECK_STR(o.provider, provider_registry[0]->name);
    options_free(&o);
    /* null is not a provider (the option has a default, but is not nullable) */
    expect_error("{\"model\":\"m\",\"provider\":null}", "option 'provider'");
}

static void test_values(void)
{
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\",\"base_url\":\"https://x.example/v1///\",\"temperature\":0.5,"
                        "\"max_history_turns\":0,\"api_key\":\"k\",\"stream\":true,\"top_p\":null}",
                        &o, &err) == PARLEY_OK);
    CHECK_STR(o.base_url, "https://x.example/v1"); /* trailing slashes trimmed */
    CHECK(o.temperature == 0.5);
    CHECK(o.max_history_turns == 0);
    CHECK_STR(o.api_key, "k");
    CHECK(o.stream == 1);
    CHECK(o.top_p < 0);
    options_free(&o);
    CHECK(options_parse("{\"model\":\"m\",\"history_keep_turns\":0,\"history_sync\":\"full\","
                        "\"history_store\":\"memory\"}", &o, &err) == PARLEY_OK);
    CHECK(o.history_keep_turns == 0);
    CHECK_STR(o.history_sync, "full");
    options_free(&o);

    setenv("PARLEY_TEST_KEY", "from-env", 1);
    CHECK(options_parse("{\"model\":\"m\",\"api_key_env\":\"PARLEY_TEST_KEY\"}", &o, &err) == PARLEY_OK);
    CHECK_STR(o.api_key, "from-env");
    options_free(&o);
}

/* A key given where the variable's name goes is refused without quoting it. */
static void expect_key_refused(const char *value)
{
    char json[256];
    snprintf(json, sizeof json, "{\"model\":\"m\",\"api_key_env\":\"%s\"}", value);
    parley_options o;
    char *err = NULL;
    CHECK(options_parse(json, &o, &err) == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && strstr(err, "option 'api_key_env': the value looks like an API key"));
    CHECK(err && !strstr(err, value));
    CHECK(err && !strstr(err, value + 8)); /* not even a part after the well-known prefix */
    if (err && strstr(err, value))
        fprintf(stderr, "  quoted the key: %s\n", err);
    free(err);
}

static void test_key_as_variable_name(void)
{
    expect_key_refused("sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv");
    expect_key_refused("sk-ant-api03-Xy12Zw34Vu56Ts78");
    expect_key_refused("gsk_a1B2c3D4e5F6g7H8i9J0k1L2m3N4");
    expect_key_refused("0123456789abcdef0123456789abcdef");
    expect_key_refused("a0123456789abcdef0123456789abcde");
    /* an ordinary name, unset, is still named */
    unsetenv("my_openai_key_2");
    expect_error("{\"model\":\"m\",\"api_key_env\":\"my_openai_key_2\"}",
                 "environment variable 'my_openai_key_2' is not set");
    unsetenv("home_assistant_openai_key_2");
    expect_error("{\"model\":\"m\",\"api_key_env\":\"home_assistant_openai_key_2\"}",
                 "'home_assistant_openai_key_2' is not set");
    expect_error("{\"model\":\"m\",\"api_key_env\":\"\"}", "environment variable '' is not set");
    unsetenv("PARLEY_KITCHEN_ASSISTANT_OPENAI_API_KEY_2");
    expect_error("{\"model\":\"m\",\"api_key_env\":\"PARLEY_KITCHEN_ASSISTANT_OPENAI_API_KEY_2\"}",
                 "'PARLEY_KITCHEN_ASSISTANT_OPENAI_API_KEY_2' is not set");
}

static void test_errors(void)
{
    expect_error("", "not valid JSON");
    expect_error("[1]", "must be a JSON object");
    expect_error("{}", "option 'model': required");
    expect_error("{\"model\":\"m\",\"colour\":1}", "option 'colour': unknown option");
    expect_error("{\"model\":\"m\",\"temperature\":3}", "option 'temperature': must be a number from 0 to 2");
    expect_error("{\"model\":\"m\",\"temperature\":\"hot\"}", "option 'temperature': must be a number");
    expect_error("{\"model\":\"m\",\"max_history_turns\":-1}", "option 'max_history_turns'");
    expect_error("{\"model\":\"m\",\"max_history_turns\":1.5}", "option 'max_history_turns': must be an integer");
    expect_error("{\"model\":\"m\",\"max_history_turns\":null}", "option 'max_history_turns'");
    expect_error("{\"model\":\"m\",\"stream\":1}", "option 'stream': must be true or false");
    /* only the scheme is quoted: the rest of a store URL may hold a password */
    expect_error("{\"model\":\"m\",\"history_store\":\"rediss://:hunter2@h:1\"}",
                 "option 'history_store': unknown store \"rediss\" (expected");
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\",\"history_store\":\"rediss://:hunter2@h:1\"}", &o, &err) == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && !strstr(err, "hunter2"));
    free(err);
    expect_error("{\"model\":\"m\",\"history_store\":\"memoryx\"}", "option 'history_store'");
    expect_error("{\"model\":\"m\",\"history_sync\":\"FULL\"}", "option 'history_sync'");
    expect_error("{\"model\":\"m\",\"history_keep_turns\":-1}", "option 'history_keep_turns'");
    expect_error("{\"model\":\"m\",\"base_url\":\"ftp://x\"}", "option 'base_url'");
    expect_error("{\"model\":7}", "option 'model': must be a string");
    expect_error("{\"model\":\"m\",\"tools\":{}}", "option 'tools': must be an array");
    expect_error("{\"model\":\"m\",\"api_key\":\"a\",\"api_key_env\":\"B\"}", "not both");
    unsetenv("PARLEY_TEST_UNSET");
    expect_error("{\"model\":\"m\",\"api_key_env\":\"PARLEY_TEST_UNSET\"}", "'PARLEY_TEST_UNSET' is not set");
    expect_error("{\"model\":\"m\",\"api_key\":\"a\\nb\"}", "option 'api_key'");
    /* a value quoted in part is cut at a character, never inside one */
    expect_error("{\"model\":\"m\",\"tool_choice\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                 "aaaaaaaaaaaaaaa\xc3\xa9\"}", "(got \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                 "aaaaaaaaaaaa...\")");
    expect_error("{\"model\":\"m\",\"history_images\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9\"}",
                 "(got \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...\")");
    test_key_as_variable_name();
}

/* A misspelt option names the one it most likely meant; a far-off key does not guess. */
static void test_did_you_mean(void)
{
    expect_error("{\"model\":\"m\",\"temprature\":1}",
                 "option 'temprature': unknown option (did you mean 'temperature'?)");
    expect_error("{\"model\":\"m\",\"Temperature\":1}", "(did you mean 'temperature'?)");
    expect_error("{\"model\":\"m\",\"max_history\":5}", "(did you mean 'max_history_turns'?)");
    expect_error("{\"model\":\"m\",\"baseurl\":\"x\"}", "(did you mean 'base_url'?)");
    expect_error("{\"model\":\"m\",\"strem\":true}", "(did you mean 'stream'?)");
    expect_error("{\"modle\":\"m\"}", "(did you mean 'model'?)");
    /* Nothing close: no suggestion at all. */
    parley_options o;
    const char *far[] = {"{\"model\":\"m\",\"colour\":1}", "{\"model\":\"m\",\"x\":1}",
                         "{\"model\":\"m\",\"\":1}"};
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
        char *err = NULL;
        CHECK(options_parse(far[i], &o, &err) == PARLEY_ERR_INVALID_OPTIONS);
        CHECK(err && strstr(err, "unknown option") && !strstr(err, "did you mean"));
        free(err);
    }
    /* A very long key is compared cheaply and gets no suggestion. */
    char big[4096];
    snprintf(big, sizeof big, "{\"model\":\"m\",\"%0*d\":1}", 3000, 0);
    char *err = NULL;
    CHECK(options_parse(big, &o, &err) == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && !strstr(err, "did you mean"));
    free(err);
}

/* What a settings form needs from the schema, for EVERY option: a title and a
 * group (options_ui.c); secrets write-only, URLs as uri, items for arrays. */
static void test_schema_presentation(void)
{
    char *text = provider_options_schema();
    json_t *schema = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(schema != NULL);
    json_t *props = json_object_get(schema, "properties");
    const char *name;
    json_t *p;
    json_object_foreach(props, name, p) {
        const char *title = json_string_value(json_object_get(p, "title"));
        const char *group = json_string_value(json_object_get(p, "x-group"));
        CHECK(title && *title);
        CHECK(group && (strcmp(group, "basic") == 0 || strcmp(group, "advanced") == 0));
        if (!title || !*title || !group)
            fprintf(stderr, "  option '%s' has no title/group: add its row to plugin/config/options_ui.c\n",
                    name);
        const char *type = json_string_value(json_object_get(p, "type"));
        if (type && strcmp(type, "array") == 0)
            CHECK(json_is_object(json_object_get(p, "items")));
    }
    json_t *key = json_object_get(props, "api_key");
    CHECK(json_is_true(json_object_get(key, "writeOnly")));
    CHECK_STR(json_string_value(json_object_get(key, "format")), "password");
    CHECK_STR(json_string_value(json_object_get(json_object_get(props, "base_url"), "format")), "uri");
    CHECK(json_object_get(json_object_get(props, "model"), "writeOnly") == NULL);
    /* Every store history_store accepts is named where a settings form shows it. */
    const char *stores = json_string_value(
        json_object_get(json_object_get(props, "history_store"), "description"));
    CHECK(stores && strstr(stores, "\"memory\"") && strstr(stores, "\"sqlite:PATH\"") &&
          strstr(stores, "redis://"));
    json_t *items = json_object_get(json_object_get(props, "tools"), "items");
    CHECK_STR(json_string_value(json_object_get(items, "type")), "object");
    CHECK_STR(json_string_value(json_object_get(json_object_get(props, "model"), "x-group")), "basic");

    /* Every example is a valid configuration. */
    json_t *examples = json_object_get(schema, "examples");
    CHECK(json_array_size(examples) >= 1);
    size_t i;
    json_t *ex;
    json_array_foreach(examples, i, ex) {
        char *ex_text = json_dumps(ex, JSON_COMPACT);
        parley_options o;
        char *err = NULL;
        setenv("OPENAI_API_KEY", "sk-test", 0);
        CHECK(ex_text && options_parse(ex_text, &o, &err) == PARLEY_OK);
        if (err)
            fprintf(stderr, "  example %zu: %s\n", i, err);
        else
            options_free(&o);
        free(err);
        free(ex_text);
    }
    json_decref(schema);
    free(text);
}

static void test_tools(void)
{
    char *err = NULL;
    toolset *t = NULL;
    CHECK(toolset_parse("[{\"name\":\"turn_on\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"get_state\"}}]", NULL, &t,
                        &err) == PARLEY_OK);
    CHECK(t != NULL);
    CHECK(tools_in(t) == 2);
    CHECK(toolset_has(t, "turn_on") && toolset_has(t, "get_state") && !toolset_has(t, "x"));
    json_t *arr = json_loads(toolset_json(t), 0, NULL);
    CHECK(json_array_size(arr) == 2);
    CHECK_STR(json_string_value(json_object_get(json_array_get(arr, 1), "type")), "function");
    /* A tool without parameters gets an empty object schema: servers require one. */
    CHECK(json_is_object(json_object_get(json_object_get(json_array_get(arr, 1), "function"), "parameters")));
    json_decref(arr);

    toolset *more = NULL;
    CHECK(toolset_parse("[{\"name\":\"extra\"}]", t, &more, &err) == PARLEY_OK);
    CHECK(more && tools_in(more) == 3 && toolset_has(more, "turn_on"));
    toolset_free(more);
    CHECK(toolset_parse("[{\"name\":\"turn_on\"}]", t, &more, &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK(more == NULL);
    CHECK(err && strstr(err, "duplicate"));
    free(err);
    toolset_free(t);

    const char *bad[] = {"[1]", "[{\"name\":\"has space\"}]", "[{\"name\":\"\"}]",
                         "[{\"name\":\"a\",\"parameters\":[]}]", "[{\"type\":\"x\",\"function\":{}}]", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = NULL;
        toolset *none = (toolset *)bad; /* not NULL: a refusal sets it to NULL */
        CHECK(toolset_parse(bad[i], NULL, &none, &err) == PARLEY_ERR_INVALID_INPUT && !none);
        CHECK(err != NULL);
        free(err);
    }
}

/* Every option in the schema is documented in docs/options.md with its default. */
static void test_schema_matches_docs(void)
{
    char *schema_text = provider_options_schema();
    json_error_t jerr;
    json_t *schema = json_loads(schema_text, 0, &jerr);
    CHECK(schema != NULL);
    json_t *props = json_object_get(schema, "properties");
    CHECK(json_object_size(props) >= 25);

    FILE *f = fopen(PARLEY_SOURCE_DIR "/docs/options.md", "r");
    CHECK(f != NULL);
    static char doc[65536];
    size_t n = f ? fread(doc, 1, sizeof doc - 1, f) : 0;
    doc[n] = '\0';
    if (f)
        fclose(f);

    const char *name;
    json_t *p;
    json_object_foreach(props, name, p) {
        char row[256];
        snprintf(row, sizeof row, "| `%s` |", name);
        const char *at = strstr(doc, row);
        CHECK(at != NULL);
        if (!at) {
            fprintf(stderr, "  docs/options.md has no row for '%s'\n", name);
            continue;
        }
        json_t *dflt = json_object_get(p, "default");
        if (!dflt)
            continue; /* required */
        char *d = json_dumps(dflt, JSON_ENCODE_ANY | JSON_COMPACT);
        char cell[512];
        snprintf(cell, sizeof cell, "| `%s` |", d);
        const char *eol = strchr(at, '\n');
        const char *found = strstr(at, cell);
        CHECK(found && (!eol || found < eol));
        if (!found || (eol && found > eol))
            fprintf(stderr, "  docs/options.md: '%s' should show default %s\n", name, d);
        free(d);
    }
    json_decref(schema);
    free(schema_text);
}

/* No parse error quotes the text: with a short key, jansson's "near '...'" is the key. */
static void test_errors_never_quote_the_key(void)
{
    static const char key[] = "sk-Q7x";
    static const char *shapes[] = {
        "{\"model\":\"m\",\"api_key\":%s",      "{\"model\":\"m\",\"api_key\":%s,}",
        "{\"model\":\"m\",\"api_key\":%s \"x\":1}", "{\"model\":\"m\" \"api_key\":%s}",
        "{\"model\":\"m\",\"api_key\":%s}}",     "{\"model\":\"m\",\"api_key\":%s]",
        "{\"model\":\"m\",\"api_key\":[%s}",     "{\"model\":\"m\",\"api_key\":%s:1}",
        "[%s",                                   "%s",
        "{\"model\":\"m\",\"api_key\":%s,\"api_key\":%s}",
        "{\"model\":\"m\",\"api_key\":\"\\u%s\"}", "{%s:1}",
        "{\"model\":\"m\",\"base_url\":\"http://u:%s@[::1/v1\"}",
        "{\"model\":\"m\",\"base_url\":\"http://u:%s@h/v1?q\"}",
    };
    const char *values[] = {"\"sk-Q7x\"", "sk-Q7x", "\"sk-Q7x", "'sk-Q7x'", "sk-Q7x\""};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (size_t j = 0; j < sizeof values / sizeof values[0]; j++) {
            char text[512];
            snprintf(text, sizeof text, shapes[i], values[j], values[j]);
            parley_options o;
            char *err = NULL;
            parley_status rc = options_parse(text, &o, &err);
            if (rc == PARLEY_OK) {
                options_free(&o);
                continue;
            }
            CHECK(err != NULL);
            CHECK(err && !strstr(err, key) && !strstr(err, "Q7x"));
            if (err && strstr(err, "Q7x"))
                fprintf(stderr, "  options %s\n  error   %s\n", text, err);
            free(err);
        }
    }
    /* Where the error is, though, is still said. */
    expect_error("{\"model\":\"m\",\"api_key\":\"sk-Q7x}", "(line 1, column");
}

static void test_duplicate_keys(void)
{
    expect_error("{\"model\":\"a\",\"model\":\"b\"}", "option 'model': given more than once");
    expect_error("{\"model\":\"a\",\"stream\":true,\"stream\":false}",
                 "option 'stream': given more than once");
    /* Not an option's name: not echoed (it could be anything). */
    expect_error("{\"model\":\"a\",\"sk-Q7x\":1,\"sk-Q7x\":2}", "a key is given more than once");
}

static void test_base_url_parsed_by_libcurl(void)
{
    expect_error("{\"model\":\"m\",\"base_url\":\"http://[::1/v1\"}",
                 "option 'base_url': not a URL libcurl can parse");
    expect_error("{\"model\":\"m\",\"base_url\":\"http://exa mple.com/v1\"}", "option 'base_url'");
    expect_error("{\"model\":\"m\",\"base_url\":\"http://h:99999/v1\"}", "option 'base_url'");
    expect_error("{\"model\":\"m\",\"base_url\":\"http://h/v1?key=1\"}", "?query or #fragment");
    expect_error("{\"model\":\"m\",\"base_url\":\"ftp://h/v1\"}", "http:// or https://");
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\",\"base_url\":\"https://[::1]:8443/v1/\"}", &o, &err) == PARLEY_OK);
    CHECK_STR(o.base_url, "https://[::1]:8443/v1");
    CHECK(o.max_connections == 64);
    options_free(&o);
}

/* The schema's provider names, default and help, and base_url's, are the registry's: a
 * provider added to provider_registry[] shows up in them with no edit to options.c. */
static void test_schema_from_registry(void)
{
    char *text = provider_options_schema();
    json_t *schema = text ? json_loads(text, 0, NULL) : NULL;
    json_t *props = json_object_get(schema, "properties");
    json_t *prov = json_object_get(props, "provider");
    const char *help = json_string_value(json_object_get(prov, "description"));
    const char *url_help =
        json_string_value(json_object_get(json_object_get(props, "base_url"), "description"));
    CHECK(help && url_help);
    CHECK_STR(json_string_value(json_object_get(prov, "default")), provider_registry[0]->name);
    size_t n = 0;
    for (; provider_registry[n]; n++) {
        const provider *p = provider_registry[n];
        CHECK_STR(json_string_value(json_array_get(json_object_get(prov, "enum"), n)), p->name);
        char want[256];
        snprintf(want, sizeof want, "\"%s\" (%s)", p->name, p->summary);
        CHECK(help && strstr(help, want));
        snprintf(want, sizeof want, "%s: %s, ", p->name, p->default_base_url);
        CHECK(url_help && strstr(url_help, want));
        snprintf(want, sizeof want, "<base_url>%s", p->path);
        CHECK(url_help && strstr(url_help, want));
    }
    CHECK(json_array_size(json_object_get(prov, "enum")) == n);
    json_decref(schema);
    free(text);
}

/* jansson's allocations fail from the nth on (json_set_alloc_funcs). */
static long allocs_left;
static void *failing_malloc(size_t n) { return allocs_left-- > 0 ? malloc(n) : NULL; }

/* Out of memory while parsing is PARLEY_ERR_NO_MEMORY saying so, never an option refused
   with "out of memory" (the host would fix options that are right), nor options that are
   right refused as not JSON (jansson words some of its failed allocations as a syntax error,
   or sets no error at all: lib/json_oom.h tells them). */
static void test_out_of_memory(void)
{
    const char *text = "{\"model\":\"m\",\"temperature\":0.5,\"tools\":[],\"provider\":\"ollama\"}";
    long failed = 0;
    for (long n = 0; n < 100000; n++) {
        parley_options o;
        char *err = NULL;
        allocs_left = n;
        json_set_alloc_funcs(failing_malloc, free);
        parley_status st = provider_options_parse(text, &o, &err);
        json_set_alloc_funcs(malloc, free);
        if (st == PARLEY_OK) {
            options_free(&o);
            break;
        }
        failed++;
        int oom_said = err && strcmp(err, "out of memory") == 0;
        CHECK(err != NULL && oom_said == (st == PARLEY_ERR_NO_MEMORY));
        CHECK(st == PARLEY_ERR_NO_MEMORY);
        if (!err || oom_said != (st == PARLEY_ERR_NO_MEMORY) || st != PARLEY_ERR_NO_MEMORY)
            fprintf(stderr, "  after %ld allocations: status %d, %s\n", n, (int)st,
                    err ? err : "(no message)");
        free(err);
    }
    CHECK(failed > 0);
}

/* Options that are refused stay refused out of memory: extra_body and the `tools` option
   are parsed again in the last checks, and a parse that failed for memory skipped the
   check (extra_body's "model" was taken) or said the named tool was not declared. */
static void test_out_of_memory_late_checks(void)
{
    static const struct { const char *text; parley_status want; } cases[] = {
        {"{\"model\":\"m\",\"extra_body\":{\"model\":\"x\"}}", PARLEY_ERR_INVALID_OPTIONS},
        {"{\"model\":\"m\",\"tools\":[{\"name\":\"oven\"}],\"tool_choice\":\"oven\"}",
         PARLEY_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (long n = 0; n < 100000; n++) {
            parley_options o;
            char *err = NULL;
            allocs_left = n;
            json_set_alloc_funcs(failing_malloc, free);
            parley_status st = provider_options_parse(cases[i].text, &o, &err);
            json_set_alloc_funcs(malloc, free);
            if (st == PARLEY_OK)
                options_free(&o);
            int oom_said = err && strcmp(err, "out of memory") == 0;
            int ok = st == cases[i].want || (st == PARLEY_ERR_NO_MEMORY && oom_said) ||
                     (st == PARLEY_ERR_INVALID_OPTIONS && err && strstr(err, "not valid JSON"));
            CHECK(ok);
            if (!ok)
                fprintf(stderr, "  %s after %ld allocations: status %d, %s\n", cases[i].text, n,
                        (int)st, err ? err : "(no message)");
            free(err);
            if (allocs_left > 0) /* the parse ran to its end with allocations to spare */
                break;
        }
    }
}

/* libcurl's allocations fail from the nth on (curl_global_init_mem, set in main). */
static long curl_allocs_left = -1; /* -1: none fails */
static int curl_alloc_fails(void) { return curl_allocs_left >= 0 && curl_allocs_left-- == 0 ? (curl_allocs_left = 0, 1) : 0; }
static void *curl_test_malloc(size_t n) { return curl_alloc_fails() ? NULL : malloc(n); }
static void *curl_test_realloc(void *p, size_t n) { return curl_alloc_fails() ? NULL : realloc(p, n); }
static char *curl_test_strdup(const char *s) { return curl_alloc_fails() ? NULL : strdup(s); }
static void *curl_test_calloc(size_t n, size_t size) { return curl_alloc_fails() ? NULL : calloc(n, size); }

/* base_url is parsed by libcurl: its running out of memory is NO_MEMORY, not a base_url
   "libcurl cannot parse (A memory function failed)" the host would be told to fix. */
static void test_base_url_out_of_memory(void)
{
    static const struct { const char *text; parley_status want; } cases[] = {
        {"{\"model\":\"m\",\"base_url\":\"https://x.example/v1\"}", PARLEY_OK},
        {"{\"model\":\"m\",\"base_url\":\"ftp://x.example/v1\"}", PARLEY_ERR_INVALID_OPTIONS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long failed = 0;
        for (long n = 0; n < 10000; n++) {
            parley_options o;
            char *err = NULL;
            curl_allocs_left = n;
            parley_status st = provider_options_parse(cases[i].text, &o, &err);
            long left = curl_allocs_left;
            curl_allocs_left = -1;
            if (st == PARLEY_OK)
                options_free(&o);
            int oom_said = err && strcmp(err, "out of memory") == 0;
            int ok = st == cases[i].want ? st == PARLEY_OK || strstr(err, "http:// or https://")
                                         : st == PARLEY_ERR_NO_MEMORY && oom_said;
            CHECK(ok);
            if (!ok)
                fprintf(stderr, "  %s after %ld allocations: status %d, %s\n", cases[i].text, n,
                        (int)st, err ? err : "(no message)");
            free(err);
            if (left > 0)
                break;
            failed++;
        }
        CHECK(failed > 0);
    }
}

int main(void)
{
    CHECK(curl_global_init_mem(CURL_GLOBAL_DEFAULT, curl_test_malloc, free, curl_test_realloc,
                               curl_test_strdup, curl_test_calloc) == CURLE_OK);
    test_defaults();
    test_provider_options();
    test_values();
    test_errors();
    test_did_you_mean();
    test_schema_presentation();
    test_schema_from_registry();
    test_tools();
    test_schema_matches_docs();
    test_errors_never_quote_the_key();
    test_duplicate_keys();
    test_base_url_parsed_by_libcurl();
    test_out_of_memory();
    test_out_of_memory_late_checks();
    test_base_url_out_of_memory();
    curl_global_cleanup();
    return check_report();
}
