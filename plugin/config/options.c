/* options.c -- see options.h.  The table below is the single source of truth. */
#include "config/options.h"

#include <curl/curl.h>
#include <jansson.h>
#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_oom.h"
#include "lib/utf8.h"
#include "config/options_ui.h"
#include "store/store.h"

typedef enum { OPT_STRING, OPT_NSTRING, OPT_BOOL, OPT_INT, OPT_NUMBER, OPT_TOOLS, OPT_JSON } opt_type;

typedef struct opt_spec {
    const char *name;
    opt_type type;
    size_t offset;     /* into parley_options */
    double min, max;   /* for OPT_INT / OPT_NUMBER */
    const char *dflt;  /* default as JSON text; "null" = unset */
    const char *doc;
} opt_spec;

/* OPT_JSON options: the JSON types each allows besides null. */
static const struct { const char *name, *types; } JSON_TYPES[] = {
    {"extra_body", "object"}, {"keep_alive", "string,number"}, {"think", "boolean,string"},
    {"personas", "object"}};

/* Options whose string must be one of a few words: the schema lists them ("enum"). */
static const struct { const char *name, *words; } ENUMS[] = {
    {"max_tokens_field", "[\"max_tokens\",\"max_completion_tokens\"]"},
    {"history_images", "[\"placeholder\",\"keep\"]"},
};

static const char *enum_of(const char *name)
{
    for (size_t i = 0; i < sizeof ENUMS / sizeof ENUMS[0]; i++)
        if (strcmp(ENUMS[i].name, name) == 0)
            return ENUMS[i].words;
    return NULL;
}

static const char *json_types_of(const char *name)
{
    for (size_t i = 0; i < sizeof JSON_TYPES / sizeof JSON_TYPES[0]; i++)
        if (strcmp(JSON_TYPES[i].name, name) == 0)
            return JSON_TYPES[i].types;
    return "";
}

#define OFF(f) offsetof(parley_options, f)
#define BIG 9.0e15

static const opt_spec SPECS[] = {
    /* provider and base_url: the names, the default and the URLs in their help are the
       registry's (provider/provider_options.c) */
    {"provider", OPT_STRING, OFF(provider), 0, 0, NULL, "Wire format of the LLM server"},
    {"base_url", OPT_NSTRING, OFF(base_url), 0, 0, "null",
     "API root; null = the provider's default"},
    {"model", OPT_STRING, OFF(model), 0, 0, NULL, "Model name sent with every request (required)"},
    {"api_key", OPT_NSTRING, OFF(api_key), 0, 0, "null",
     "API key sent as 'Authorization: Bearer' (anthropic: 'x-api-key'); never logged"},
    {"api_key_env", OPT_NSTRING, OFF(api_key_env), 0, 0, "null",
     "Name of an environment variable holding the API key (read at create)"},
    {"verify_tls", OPT_BOOL, OFF(verify_tls), 0, 0, "true",
     "Verify the server's TLS certificate (false: for testing only; logs a warning)"},
    {"prompt", OPT_STRING, OFF(prompt), 0, 0,
     "\"You are a helpful voice assistant for a smart home. Answer briefly.\"",
     "System prompt sent first in every request (\"\" for none)"},
    {"temperature", OPT_NUMBER, OFF(temperature), 0, 2, "null", "Sampling temperature; null = server default"},
    {"top_p", OPT_NUMBER, OFF(top_p), 0, 1, "null", "Nucleus sampling; null = server default"},
    {"max_tokens", OPT_INT, OFF(max_tokens), 1, 1048576, "null",
     "Cap on tokens generated per request; null = server default (anthropic, which requires "
     "one: 1024)"},
    {"stream", OPT_BOOL, OFF(stream), 0, 0, "false",
     "Stream answers (SSE) and hand text deltas to the host as they arrive"},
    {"connect_timeout_ms", OPT_INT, OFF(connect_timeout_ms), 1, 600000, "5000",
     "Time allowed to connect to the LLM server"},
    {"request_timeout_ms", OPT_INT, OFF(request_timeout_ms), 1, 3600000, "60000",
     "Time allowed for one HTTP request, connect included, from when a connection is free "
     "(streamed: until the first byte)"},
    {"stream_idle_timeout_ms", OPT_INT, OFF(stream_idle_timeout_ms), 1, 3600000, "30000",
     "A streamed response that sends nothing for this long fails"},
    {"turn_timeout_ms", OPT_INT, OFF(turn_timeout_ms), 1, 86400000, "120000",
     "Time allowed for a whole turn from async_process: queueing, every request, retry and "
     "tool call"},
    {"tool_timeout_ms", OPT_INT, OFF(tool_timeout_ms), 1, 86400000, "30000",
     "A tool call the host has not completed by then gets an error result"},
    {"max_retries", OPT_INT, OFF(max_retries), 0, 10, "2",
     "Retries of a request after 429, 5xx or a connection failure"},
    {"retry_backoff_ms", OPT_INT, OFF(retry_backoff_ms), 0, 60000, "500",
     "Base of the exponential backoff (with jitter) between retries"},
    {"retry_max_delay_ms", OPT_INT, OFF(retry_max_delay_ms), 0, 600000, "20000",
     "Longest wait before a retry, Retry-After included"},
    {"history_store", OPT_STRING, OFF(history_store), 0, 0, "\"memory\"",
     "Where conversations are kept: \"memory\" (lost on restart), \"sqlite:PATH\" (a file) or "
     "\"redis://[:PASSWORD@]HOST:PORT[/DB]\" (a Redis server several hosts share)"},
    {"history_sync", OPT_STRING, OFF(history_sync), 0, 0, "\"normal\"",
     "\"normal\": a committed turn survives a process crash; \"full\": also a power loss "
     "(every commit is flushed to disk)"},
    {"max_history_turns", OPT_INT, OFF(max_history_turns), 0, 100000, "20",
     "The most whole turns of history sent with each request (beyond it the window moves on, "
     "once, to a third of it); 0 = no bound on turns (the token budget still applies)"},
    {"history_keep_turns", OPT_INT, OFF(history_keep_turns), 0, 100000000, "null",
     "Whole turns kept per conversation, oldest dropped; null = the larger of 200 and 4 x "
     "max_history_turns (all when max_history_turns is 0); 0 = all"},
    {"context_window", OPT_INT, OFF(context_window), 0, 100000000, "0",
     "The model's context window in tokens; 0 = what the server says (else learned from an "
     "overflow answer), until then num_ctx for Ollama, 200000 for Anthropic, 128000 for "
     "OpenAI's own API, 4096 otherwise"},
    {"context_reserve", OPT_INT, OFF(context_reserve), 0, 10000000, "null",
     "Tokens of the window kept for the answer; null = max_tokens (1024 when it is null)"},
    {"summarize", OPT_BOOL, OFF(summarize), 0, 0, "true",
     "Turns that leave the window are folded into a running summary sent after the system "
     "prompt"},
    {"summary_model", OPT_NSTRING, OFF(summary_model), 0, 0, "null",
     "Model that writes the summaries; null = the agent's (or persona's) model"},
    {"prompt_cache_key", OPT_BOOL, OFF(prompt_cache_key), 0, 0, "null",
     "openai: send the conversation as prompt_cache_key; null = only to OpenAI's own API"},
    {"prompt_cache_ttl_ms", OPT_INT, OFF(prompt_cache_ttl_ms), 0, 86400000, "300000",
     "How long the server keeps a conversation's prompt cached; a turn after a longer pause "
     "is a free moment to cut the window down to its low mark; 0 = never cut for a pause"},
    {"max_conversations", OPT_INT, OFF(max_conversations), 1, 100000000, "10000",
     "Conversations kept; the least recently used is forgotten beyond it"},
    {"history_idle_timeout_s", OPT_INT, OFF(history_idle_timeout_s), 0, 31536000, "0",
     "Forget a conversation idle this long (also while the host was down); 0 = never"},
    {"history_key_prefix", OPT_STRING, OFF(history_key_prefix), 0, 0, "\"parley:\"",
     "Prefix of every key a shared (Redis) history store writes"},
    {"history_lease_ms", OPT_INT, OFF(history_lease_ms), 100, 600000, "10000",
     "Shared store: life of a turn's lease on its conversation (renewed while the turn runs)"},
    {"auto_create_conversation_id", OPT_BOOL, OFF(auto_create_conversation_id), 0, 0, "false",
     "Mint a UUID conversation_id when the input has none (else such turns are stateless)"},
    {"max_tool_iterations", OPT_INT, OFF(max_tool_iterations), 1, 100, "10",
     "Tool rounds per turn; then one last request with tool_choice \"none\""},
    {"tools", OPT_TOOLS, OFF(tools_json), 0, 0, "[]",
     "Tools offered to the model: [{name, description, parameters}] or OpenAI form"},
    {"tool_choice", OPT_STRING, OFF(tool_choice), 0, 0, "\"auto\"",
     "Whether the model must call a tool: \"auto\" (it decides), \"none\" (never: tools are "
     "not offered), \"required\" (some tool) or a tool's name (that tool), on the first "
     "request of a turn; later rounds are \"auto\" (anthropic: required = any; ollama: only "
     "auto or none)"},
    {"personas", OPT_JSON, OFF(personas_json), 0, 0, "{}",
     "Characters the agent can speak as: {name: {prompt, model?, temperature?, top_p?, "
     "max_tokens?, tools? (names of the agent's tools), max_history_turns?}}; the input's "
     "persona picks one, each with its own history per conversation"},
    {"history_images", OPT_STRING, OFF(history_images), 0, 0, "\"placeholder\"",
     "What history keeps of a turn's images: \"placeholder\" (a line such as [image: "
     "image/jpeg, 183 KB] per image) or \"keep\" (the image itself, sent again every turn)"},
    {"max_image_bytes", OPT_INT, OFF(max_image_bytes), 1, 67108864, "8388608",
     "Largest image (decoded bytes of a data: URL) a turn may carry"},
    {"max_images_per_turn", OPT_INT, OFF(max_images_per_turn), 0, 64, "4",
     "Images one turn may carry; 0 refuses every image"},
    {"max_in_flight", OPT_INT, OFF(max_in_flight), 1, 1000000, "10000",
     "Turns accepted at once; beyond it async_process returns busy"},
    {"max_connections", OPT_INT, OFF(max_connections), 1, 100000, "64",
     "Connections to the LLM server open at once; more requests wait for a free one"},
    {"max_input_bytes", OPT_INT, OFF(max_input_bytes), 1, 16777216, "65536",
     "Largest input text (and largest input field)"},
    {"max_response_bytes", OPT_INT, OFF(max_response_bytes), 1024, 1073741824, "8388608",
     "Largest HTTP response body accepted from the LLM server"},
    {"max_tool_result_bytes", OPT_INT, OFF(max_tool_result_bytes), 16, 16777216, "65536",
     "Largest tool result; a larger one is replaced by an error result"},
    {"debug_log_bodies", OPT_BOOL, OFF(debug_log_bodies), 0, 0, "false",
     "Log request and response bodies at debug level (the API key is never logged)"},
    {"strip_think_tags", OPT_BOOL, OFF(strip_think_tags), 0, 0, "true",
     "Treat <think>...</think> at the start of an answer as reasoning: kept out of the "
     "response and the deltas"},
    {"max_tokens_field", OPT_STRING, OFF(max_tokens_field), 0, 0, "\"max_tokens\"",
     "openai: the request key carrying max_tokens, \"max_tokens\" or \"max_completion_tokens\""},
    {"reasoning_effort", OPT_NSTRING, OFF(reasoning_effort), 0, 0, "null",
     "openai: reasoning_effort sent with each request (e.g. \"low\"); null = not sent"},
    {"extra_body", OPT_JSON, OFF(extra_body), 0, 0, "null",
     "An object merged into every request body (server-specific knobs); a key Parley sends "
     "itself is rejected"},
    {"thinking_budget_tokens", OPT_INT, OFF(thinking_budget_tokens), 1024, 1048576, "null",
     "anthropic: extended thinking with this token budget (less than max_tokens); null = off"},
    {"prompt_cache", OPT_BOOL, OFF(prompt_cache), 0, 0, "true",
     "anthropic: mark the system prompt and tools for prompt caching (cache_control)"},
    {"keep_alive", OPT_JSON, OFF(keep_alive), 0, 0, "null",
     "ollama: how long the model stays loaded (\"5m\", seconds, -1 = forever); null = "
     "Ollama's default"},
    {"num_ctx", OPT_INT, OFF(num_ctx), 1, 10485760, "8192",
     "ollama: context window in tokens (Ollama's own default of 2048 silently drops the start "
     "of long histories)"},
    {"think", OPT_JSON, OFF(think), 0, 0, "null",
     "ollama: think (true/false, or \"low\"/\"medium\"/\"high\"); null = not sent"},
};
#define NSPECS (sizeof SPECS / sizeof SPECS[0])

static const char *type_word(opt_type t)
{
    switch (t) {
    case OPT_STRING: return "a string";
    case OPT_NSTRING: return "a string or null";
    case OPT_BOOL: return "true or false";
    case OPT_INT: return "an integer";
    case OPT_NUMBER: return "a number";
    case OPT_TOOLS: return "an array of tools";
    case OPT_JSON: return "of another type";
    }
    return "?";
}

/* "object" -> "an object or null", "string,number" -> "a string, a number or null". */
static char *json_types_words(const opt_spec *s)
{
    pbuf b = PBUF_INIT;
    const char *p = json_types_of(s->name);
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        pbuf_printf(&b, "%s%s %.*s", b.len ? ", " : "", *p == 'o' ? "an" : "a", (int)n, p);
        p += n + (end ? 1 : 0);
    }
    pbuf_puts(&b, " or null");
    return pbuf_take(&b);
}

static int json_type_allowed(const opt_spec *s, json_t *v)
{
    const char *name = json_is_object(v) ? "object" : json_is_string(v) ? "string"
                     : json_is_number(v) ? "number" : json_is_boolean(v) ? "boolean" : NULL;
    if (!name)
        return 0;
    size_t n = strlen(name);
    const char *types = json_types_of(s->name);
    for (const char *p = types; (p = strstr(p, name)); p += n)
        if ((p == types || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

/* Store one value (already known to be of an acceptable JSON type): PARLEY_OK,
   INVALID_OPTIONS out of range, NO_MEMORY. */
static parley_status set_value(parley_options *o, const opt_spec *s, json_t *v, char **err)
{
    char *field = (char *)o + s->offset;
    switch (s->type) {
    case OPT_STRING:
    case OPT_NSTRING: {
        char **dst = (char **)field;
        free(*dst);
        *dst = json_is_null(v) ? NULL : strdup(json_string_value(v));
        return json_is_null(v) || *dst ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
    }
    case OPT_BOOL: /* null (where allowed): -1, "unset" */
        *(int *)field = json_is_null(v) ? -1 : json_is_true(v);
        return PARLEY_OK;
    case OPT_INT: {
        if (json_is_null(v)) {
            *(int64_t *)field = (int64_t)s->min - 1; /* "unset": one below the range */
            return PARLEY_OK;
        }
        json_int_t n = json_integer_value(v);
        if ((double)n < s->min || (double)n > s->max) {
            *err = pstr_printf("option '%s': must be an integer from %.0f to %.0f (got %lld)", s->name,
                           s->min, s->max, (long long)n);
            return PARLEY_ERR_INVALID_OPTIONS;
        }
        *(int64_t *)field = n;
        return PARLEY_OK;
    }
    case OPT_NUMBER: {
        if (json_is_null(v)) {
            *(double *)field = -1;
            return PARLEY_OK;
        }
        double d = json_number_value(v);
        if (!(d >= s->min && d <= s->max)) {
            *err = pstr_printf("option '%s': must be a number from %g to %g (got %g)", s->name, s->min,
                           s->max, d);
            return PARLEY_ERR_INVALID_OPTIONS;
        }
        *(double *)field = d;
        return PARLEY_OK;
    }
    case OPT_TOOLS:
    case OPT_JSON: {
        char **dst = (char **)field;
        free(*dst);
        if (json_is_null(v)) {
            *dst = NULL;
            return PARLEY_OK;
        }
        *dst = json_dumps_whole(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        return *dst ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
    }
    }
    return PARLEY_OK;
}

/* An option whose default is null may be set to null explicitly ("server default"). */
static int nullable(const opt_spec *s) { return s->dflt && strcmp(s->dflt, "null") == 0; }

static int type_ok(const opt_spec *s, json_t *v)
{
    if (json_is_null(v) && nullable(s))
        return 1;
    switch (s->type) {
    case OPT_STRING:
    case OPT_NSTRING: return json_is_string(v);
    case OPT_BOOL: return json_is_boolean(v);
    case OPT_INT: return json_is_integer(v);
    case OPT_NUMBER: return json_is_number(v);
    case OPT_TOOLS: return json_is_array(v);
    case OPT_JSON: return json_type_allowed(s, v);
    }
    return 0;
}

static int apply_defaults(parley_options *o)
{
    for (size_t i = 0; i < NSPECS; i++) {
        if (!SPECS[i].dflt)
            continue;
        json_t *v = json_loads(SPECS[i].dflt, JSON_DECODE_ANY, NULL);
        char *err = NULL;
        parley_status st = v ? set_value(o, &SPECS[i], v, &err) : PARLEY_ERR_NO_MEMORY;
        json_decref(v);
        free(err);
        if (st != PARLEY_OK)
            return -1;
    }
    return 0;
}

/*
 * base_url must be an http(s) URL libcurl itself can parse, so a request never
 * fails later for a reason create() could have named.  The URL is not echoed:
 * it may carry credentials (user:password@host).
 */
static parley_status check_base_url(const char *u, char **err)
{
    CURLU *h = curl_url();
    if (!h) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    char *scheme = NULL, *host = NULL, *query = NULL, *fragment = NULL;
    CURLUcode rc = curl_url_set(h, CURLUPART_URL, u, 0);
    if (rc == CURLUE_OK)
        rc = curl_url_get(h, CURLUPART_SCHEME, &scheme, 0);
    if (rc == CURLUE_OK)
        rc = curl_url_get(h, CURLUPART_HOST, &host, 0);
    /* absent parts answer CURLUE_NO_QUERY / NO_FRAGMENT; out of memory is told apart */
    CURLUcode q = curl_url_get(h, CURLUPART_QUERY, &query, 0);
    CURLUcode f = curl_url_get(h, CURLUPART_FRAGMENT, &fragment, 0);
    parley_status st = PARLEY_ERR_INVALID_OPTIONS; /* the status, even when no message fits */
    if (rc == CURLUE_OUT_OF_MEMORY || q == CURLUE_OUT_OF_MEMORY || f == CURLUE_OUT_OF_MEMORY)
        st = PARLEY_ERR_NO_MEMORY;
    else if (rc != CURLUE_OK)
        *err = pstr_printf("option 'base_url': not a URL libcurl can parse (%s)",
                           curl_url_strerror(rc));
    else if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)
        *err = pstr_printf("option 'base_url': must be an http:// or https:// URL");
    else if (query || fragment) /* "/chat/completions" would be appended to it */
        *err = pstr_printf("option 'base_url': must not have a ?query or #fragment");
    else
        st = PARLEY_OK;
    curl_free(scheme);
    curl_free(host);
    curl_free(query);
    curl_free(fragment);
    curl_url_cleanup(h);
    return st;
}

static const char *const TOKEN_FIELDS[] = {"max_tokens", "max_completion_tokens", NULL};

/* Keys Parley itself may put in a request body (any provider): extra_body cannot set them,
   so what Parley sends always means what the options say. */
static const char *const PARLEY_BODY_KEYS[] = {
    "model", "messages", "system", "tools", "tool_choice", "stream", "stream_options",
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "reasoning_effort",
    "thinking", "options", "keep_alive", "think", NULL};

static int one_of(const char *s, const char *const *list)
{
    for (int i = 0; s && list[i]; i++)
        if (strcmp(s, list[i]) == 0)
            return i;
    return -1;
}

/* What to do instead of setting a body key Parley sends itself through extra_body. */
static const char *own_option_of(const char *key)
{
    static const char *const map[][2] = {
        {"tool_choice", "set it with the option 'tool_choice'"},
        {"stream", "set it with the option 'stream'"},
        {"stream_options", "Parley asks for usage itself with the option 'stream'"},
        {"temperature", "set it with the option 'temperature'"},
        {"top_p", "set it with the option 'top_p'"},
        {"max_tokens", "set it with the option 'max_tokens'"},
        {"max_completion_tokens", "set the options 'max_tokens' and 'max_tokens_field'"},
        {"reasoning_effort", "set it with the option 'reasoning_effort'"},
        {"thinking", "set it with the option 'thinking_budget_tokens'"},
        {"options", "set temperature, top_p, max_tokens and num_ctx with their own options"},
        {"keep_alive", "set it with the option 'keep_alive'"},
        {"think", "set it with the option 'think'"},
        {"tools", "declare tools with the option 'tools' or the input's tools_json"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(key, map[i][0]) == 0)
            return map[i][1];
    return "Parley builds it from the model, the prompt and the history";
}

/* Whether `name` is a tool of the `tools` option (either form): *found 1 when it is;
   PARLEY_ERR_NO_MEMORY when the option could not be read again. */
static parley_status declared_tool(const char *tools_json, const char *name, int *found)
{
    json_t *tools = json_loads(tools_json ? tools_json : "[]", 0, NULL), *t;
    *found = 0;
    if (!tools) /* dumped from an array a moment ago: only memory can fail it */
        return PARLEY_ERR_NO_MEMORY;
    size_t i;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (!n)
            n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        *found |= n && strcmp(n, name) == 0;
    }
    json_decref(tools);
    return PARLEY_OK;
}

/* tool_choice: a word, or a tool of the `tools` option (what each API can force is its
   codec's check_options). */
static parley_status check_tool_choice(const parley_options *o, char **err)
{
    const char *c = o->tool_choice;
    if (strcmp(c, "auto") == 0 || strcmp(c, "none") == 0 || strcmp(c, "required") == 0)
        return PARLEY_OK;
    int found;
    parley_status st = declared_tool(o->tools_json, c, &found);
    if (st != PARLEY_OK || found)
        return st;
    char *q = utf8_quotable(c, strlen(c), 64); /* not %.64s: that may cut a character */
    *err = pstr_printf("option 'tool_choice': must be \"auto\", \"none\", \"required\" or the "
                       "name of a tool of the option 'tools' (got \"%s\")", q ? q : "?");
    free(q);
    return PARLEY_ERR_INVALID_OPTIONS;
}

static parley_status finish_provider_details(parley_options *o, char **err)
{
    if (o->thinking_budget_tokens < 1024)
        o->thinking_budget_tokens = 0; /* null ("unset", one below the range): thinking off */
    if (one_of(o->max_tokens_field, TOKEN_FIELDS) < 0) {
        *err = pstr_printf("option 'max_tokens_field': must be \"max_tokens\" or "
                           "\"max_completion_tokens\"");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (o->reasoning_effort && !*o->reasoning_effort) {
        *err = pstr_printf("option 'reasoning_effort': must not be empty (null = not sent)");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (o->extra_body) {
        json_t *extra = json_loads(o->extra_body, 0, NULL);
        if (!extra) /* dumped from an object a moment ago: only memory can fail it */
            return PARLEY_ERR_NO_MEMORY;
        const char *key;
        json_t *v;
        json_object_foreach(extra, key, v) {
            if (one_of(key, PARLEY_BODY_KEYS) >= 0) {
                *err = pstr_printf("option 'extra_body': key '%s' is one Parley sends itself; "
                                   "%s", key, own_option_of(key));
                json_decref(extra);
                return PARLEY_ERR_INVALID_OPTIONS;
            }
        }
        json_decref(extra);
    }
    return check_tool_choice(o, err);
}

/*
 * Whether api_key_env's value is likely the key itself, put where the
 * variable's name goes: anything that is not a variable name ([A-Za-z_]
 * then [A-Za-z0-9_]: "sk-proj-...", "sk-ant-..."), or a long random-looking
 * one: 24 characters or more with digits, and either no '_' (a hex key) or
 * both cases ("gsk_..."), unlike names such as OPENAI_API_KEY or
 * home_assistant_openai_key_2.  Such a value is never quoted back: it would
 * put the key in a log.
 */
static int looks_like_key(const char *name)
{
    size_t n = strlen(name);
    int lower = 0, upper = 0, digit = 0, underscore = 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        lower |= c >= 'a' && c <= 'z';
        upper |= c >= 'A' && c <= 'Z';
        digit |= c >= '0' && c <= '9';
        underscore |= c == '_';
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alpha && c != '_' && !(i > 0 && c >= '0' && c <= '9'))
            return 1;
    }
    return n >= 24 && digit && (!underscore || (upper && lower));
}

/* Checks that involve more than one option, or the environment. */
static parley_status finish(parley_options *o, json_t *root, char **err)
{
    if (!o->model || !*o->model) {
        *err = pstr_printf("option 'model': required (a non-empty string)");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    parley_status st = o->base_url ? check_base_url(o->base_url, err) : PARLEY_OK;
    if (st != PARLEY_OK)
        return st; /* null: the provider's default */
    size_t n = o->base_url ? strlen(o->base_url) : 0;
    while (n > 0 && o->base_url[n - 1] == '/')
        o->base_url[--n] = '\0';
    if ((st = finish_provider_details(o, err)) != PARLEY_OK)
        return st;
    if (json_object_get(root, "api_key") && json_object_get(root, "api_key_env") &&
        !json_is_null(json_object_get(root, "api_key")) &&
        !json_is_null(json_object_get(root, "api_key_env"))) {
        *err = pstr_printf("option 'api_key_env': give api_key or api_key_env, not both");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (o->api_key_env) {
        if (looks_like_key(o->api_key_env)) {
            *err = pstr_printf("option 'api_key_env': the value looks like an API key, not the name "
                               "of an environment variable (it is not repeated here); put the key "
                               "in an environment variable and give that variable's name");
            return PARLEY_ERR_INVALID_OPTIONS;
        }
        const char *k = getenv(o->api_key_env);
        if (!k || !*k) {
            *err = pstr_printf("option 'api_key_env': environment variable '%s' is not set",
                           o->api_key_env);
            return PARLEY_ERR_INVALID_OPTIONS;
        }
        free(o->api_key);
        if (!(o->api_key = strdup(k)))
            return PARLEY_ERR_NO_MEMORY;
    }
    const char *location;
    if (!store_backend_for(o->history_store, &location)) {
        /* Only the scheme is quoted: the rest may hold a password. */
        *err = pstr_printf("option 'history_store': unknown store \"%.*s\" (expected \"memory\", "
                           "\"sqlite:PATH\" or \"redis://[:PASSWORD@]HOST:PORT[/DB]\")",
                           (int)strcspn(o->history_store, ":"), o->history_store);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (strcmp(o->history_images, "placeholder") != 0 && strcmp(o->history_images, "keep") != 0) {
        char *q = utf8_quotable(o->history_images, strlen(o->history_images), 32);
        *err = pstr_printf("option 'history_images': must be \"placeholder\" or \"keep\" (got "
                           "\"%s\")", q ? q : "?");
        free(q);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (strcmp(o->history_sync, "normal") != 0 && strcmp(o->history_sync, "full") != 0) {
        *err = pstr_printf("option 'history_sync': must be \"normal\" or \"full\" (got \"%s\")",
                           o->history_sync);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (o->api_key && strpbrk(o->api_key, "\r\n")) {
        *err = pstr_printf("option 'api_key': must not contain line breaks");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    return PARLEY_OK;
}

static const opt_spec *find_spec(const char *name)
{
    for (size_t i = 0; i < NSPECS; i++)
        if (strcmp(SPECS[i].name, name) == 0)
            return &SPECS[i];
    return NULL;
}

/*
 * The parser's reason, in our words, and where.  jansson's own text quotes
 * the source near the error ("near 'sk-abc'"), and for a short token that
 * is the token itself, an API key as likely as anything: never echo it.
 * Only a duplicate key is named, and only when it is an option's name.
 */
static char *parse_error(const json_error_t *e)
{
    const char *why;
    if (json_load_oom(e))
        return pstr_printf("out of memory");
    switch (json_error_code(e)) {
    case json_error_stack_overflow: why = "nested too deeply"; break;
    case json_error_invalid_utf8: why = "not valid UTF-8"; break;
    case json_error_premature_end_of_input: why = "the text ends too early"; break;
    case json_error_end_of_input_expected: why = "unexpected text after the JSON value"; break;
    case json_error_null_character: why = "a \\u0000 escape in a string"; break;
    case json_error_null_byte_in_key: why = "a NUL byte in a key"; break;
    case json_error_numeric_overflow: why = "a number too large"; break;
    case json_error_duplicate_key: {
        /* jansson's text ends "near '\"KEY\"'": the key, with quotes. */
        const char *q = strstr(e->text, "near '\"");
        char name[64] = "";
        if (q) {
            q += 7;
            size_t n = strcspn(q, "\"");
            if (n < sizeof name && q[n] == '"') {
                memcpy(name, q, n);
                name[n] = '\0';
            }
        }
        if (find_spec(name))
            return pstr_printf("option '%s': given more than once", name);
        return pstr_printf("options: a key is given more than once (line %d, column %d)", e->line,
                           e->column);
    }
    default: why = "invalid syntax"; break;
    }
    return pstr_printf("options are not valid JSON: %s (line %d, column %d)", why, e->line,
                       e->column);
}

/* Option names are lower_case words; anything else (an API key pasted as a
 * key, say) is not echoed in an error. */
static int looks_like_option_name(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 64 || k[0] < 'a' || k[0] > 'z')
        return 0;
    return strspn(k, "abcdefghijklmnopqrstuvwxyz0123456789_") == n;
}

#define MIN3(x, y, z) ((x) < (y) ? ((x) < (z) ? (x) : (z)) : ((y) < (z) ? (y) : (z)))

/* Edit distance of two short names (insert, delete, substitute, swap two
 * neighbours; ASCII case ignored).  SIZE_MAX when a name is too long to be a
 * misspelt option. */
static size_t edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 64 };
    size_t na = strlen(a), nb = strlen(b);
    if (na > MAXLEN || nb > MAXLEN)
        return SIZE_MAX;
    static_assert(MAXLEN < 256, "distances fit a byte");
    unsigned char d[MAXLEN + 1][MAXLEN + 1];
    for (size_t i = 0; i <= na; i++)
        d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= nb; j++)
        d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= na; i++) {
        for (size_t j = 1; j <= nb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t del = d[i - 1][j] + 1u, ins = d[i][j - 1] + 1u;
            size_t sub = d[i - 1][j - 1] + (size_t)(ca != cb);
            size_t best = MIN3(del, ins, sub);
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1u < best)
                best = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)best;
        }
    }
    return d[na][nb];
}

/* The option an unknown key most likely meant, or NULL: the nearest name when
 * at most a third of its letters (and at least one) differ, else the option
 * the key abbreviates ("max_history" -> "max_history_turns"). */
static const char *closest_option(const char *key)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < NSPECS; i++) {
        size_t d = edit_distance(key, SPECS[i].name);
        if (d < best_d) {
            best_d = d;
            best = SPECS[i].name;
        }
    }
    size_t limit = best ? strlen(best) / 3 : 0;
    if (best && best_d <= (limit > 0 ? limit : 1))
        return best;
    size_t n = strlen(key);
    for (size_t i = 0; n >= 4 && i < NSPECS; i++)
        if (strncmp(SPECS[i].name, key, n) == 0)
            return SPECS[i].name;
    return NULL;
}

/* One key of the host's options: an option's name, a value of its type, in its range. */
static parley_status set_key(parley_options *o, const char *key, json_t *v, char **err)
{
    const opt_spec *s = find_spec(key);
    if (!s) {
        const char *near = closest_option(key);
        if (!looks_like_option_name(key)) /* not echoed: it could be a secret */
            *err = pstr_printf("options: unknown option, not shown (it is no option's name "
                               "and could be a secret)%s%s%s", near ? " (did you mean '" : "",
                               near ? near : "", near ? "'?)" : "");
        else if (near)
            *err = pstr_printf("option '%s': unknown option (did you mean '%s'?)", key, near);
        else
            *err = pstr_printf("option '%s': unknown option", key);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (!type_ok(s, v)) {
        char *words = s->type == OPT_JSON ? json_types_words(s) : NULL;
        *err = pstr_printf("option '%s': must be %s", key, words ? words : type_word(s->type));
        free(words);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    return set_value(o, s, v, err);
}

parley_status options_parse(const char *json_text, parley_options *o, char **err)
{
    *err = NULL;
    memset(o, 0, sizeof *o);
    if (apply_defaults(o) != 0) {
        options_free(o);
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    parley_status st = PARLEY_ERR_INVALID_OPTIONS;
    json_error_t jerr;
    const char *text = json_text ? json_text : "";
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_load_oom_text(&jerr, text, strlen(text))) {
        *err = pstr_printf("out of memory");
        st = PARLEY_ERR_NO_MEMORY;
        goto fail;
    }
    if (!root) {
        *err = parse_error(&jerr);
        goto fail;
    }
    if (!json_is_object(root)) {
        *err = pstr_printf("options must be a JSON object");
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if ((st = set_key(o, key, v, err)) != PARLEY_OK)
            goto fail;
    }
    if ((st = finish(o, root, err)) != PARLEY_OK)
        goto fail;
    json_decref(root);
    return PARLEY_OK;
fail:
    json_decref(root);
    options_free(o);
    if (!*err) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return st;
}

void options_free(parley_options *o)
{
    for (size_t i = 0; i < NSPECS; i++) {
        opt_type t = SPECS[i].type;
        if (t == OPT_STRING || t == OPT_NSTRING || t == OPT_TOOLS || t == OPT_JSON) {
            char **p = (char **)((char *)o + SPECS[i].offset);
            free(*p);
            *p = NULL;
        }
    }
}

static const char *schema_type(const opt_spec *s)
{
    int null_ok = nullable(s);
    switch (s->type) {
    case OPT_STRING:
    case OPT_NSTRING: return null_ok ? "[\"string\",\"null\"]" : "\"string\"";
    case OPT_BOOL: return null_ok ? "[\"boolean\",\"null\"]" : "\"boolean\"";
    case OPT_INT: return null_ok ? "[\"integer\",\"null\"]" : "\"integer\"";
    case OPT_NUMBER: return null_ok ? "[\"number\",\"null\"]" : "\"number\"";
    case OPT_TOOLS: return "\"array\"";
    case OPT_JSON: return NULL; /* from json_types */
    }
    return "\"null\"";
}

/* The presentation keywords of one option (options_ui.c): title, x-group,
 * writeOnly + format for secrets, format for URLs, items for arrays. */
static void schema_ui(pbuf *b, const opt_spec *s)
{
    const option_ui *ui = option_ui_find(s->name);
    if (!ui)
        return; /* test_options names the option that lacks its row */
    pbuf_puts(b, ",\"title\":");
    pbuf_json_string(b, ui->title, strlen(ui->title));
    pbuf_puts(b, ",\"x-group\":");
    pbuf_json_string(b, ui->group, strlen(ui->group));
    if (ui->flags & OPTION_UI_SECRET)
        pbuf_puts(b, ",\"writeOnly\":true,\"format\":\"password\"");
    if (ui->flags & OPTION_UI_URI)
        pbuf_puts(b, ",\"format\":\"uri\"");
    if (ui->items)
        pbuf_printf(b, ",\"items\":%s", ui->items);
}

char *options_schema(void)
{
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\","
                  "\"title\":\"Parley agent options\",\"type\":\"object\","
                  "\"additionalProperties\":false,\"required\":[\"model\"],\"properties\":{");
    for (size_t i = 0; i < NSPECS; i++) {
        const opt_spec *s = &SPECS[i];
        if (i)
            pbuf_putc(&b, ',');
        pbuf_json_string(&b, s->name, strlen(s->name));
        if (s->type == OPT_JSON) {
            pbuf_puts(&b, ":{\"type\":[");
            for (const char *p = json_types_of(s->name); *p;) {
                size_t n = strcspn(p, ",");
                pbuf_printf(&b, "\"%.*s\",", (int)n, p);
                p += n + (p[n] == ',');
            }
            pbuf_puts(&b, "\"null\"]");
        } else {
            pbuf_printf(&b, ":{\"type\":%s", schema_type(s));
        }
        if (enum_of(s->name))
            pbuf_printf(&b, ",\"enum\":%s", enum_of(s->name));
        schema_ui(&b, s);
        if (s->type == OPT_INT || s->type == OPT_NUMBER)
            pbuf_printf(&b, ",\"minimum\":%.17g,\"maximum\":%.17g", s->min, s->max);
        if (s->dflt)
            pbuf_printf(&b, ",\"default\":%s", s->dflt);
        pbuf_puts(&b, ",\"description\":");
        pbuf_json_string(&b, s->doc, strlen(s->doc));
        pbuf_putc(&b, '}');
    }
    pbuf_printf(&b, "},\"examples\":%s}", OPTION_UI_EXAMPLES);
    return pbuf_take(&b);
}
