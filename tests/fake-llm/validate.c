/* Request validation for POST /v1/chat/completions.
 *
 * The error messages, params and codes mirror what the real OpenAI API
 * answers, so the client's error handling is tested against realistic
 * bodies. Validation also extracts the facts reply generation needs. */
#include "fakellm.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ errors */

void api_error_set(struct api_error *e, unsigned status, const char *type, const char *param,
                   const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    free(e->message);
    free(e->param);
    e->status = status;
    e->type = type;
    e->message = msg ? msg : xstrdup("error");
    e->param = param ? xstrdup(param) : NULL;
    e->code = code;
}

void api_error_free(struct api_error *e)
{
    free(e->message);
    free(e->param);
    e->message = e->param = NULL;
}

static json_t *opt_str(const char *s)
{
    return s ? json_string_lossy(s, strlen(s)) : json_null();
}

char *api_error_json(const struct api_error *e, size_t *len)
{
    json_t *inner = json_object();
    json_object_set_new(inner, "message", opt_str(e->message));
    json_object_set_new(inner, "type", opt_str(e->type));
    json_object_set_new(inner, "param", opt_str(e->param));
    json_object_set_new(inner, "code", opt_str(e->code));
    json_t *o = json_object();
    json_object_set_new(o, "error", inner);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

/* Shorthand for the 400s below; `param` is printf-formatted into a buffer. */
#define BAD(code, param, ...)                                                              \
    do {                                                                                   \
        api_error_set(err, 400, "invalid_request_error", (param), (code), __VA_ARGS__);    \
        goto fail;                                                                         \
    } while (0)

static const char *jtype(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static bool present(const json_t *j)
{
    return j && !json_is_null(j);
}

/* ------------------------------------------------------------ validation */

/* Content is a string or an array of parts; text parts need a string
 * "text". When out != NULL the text is appended (parts joined by '\n'). */
static bool check_content(const json_t *c, const char *where, struct api_error *err, buf_t *out)
{
    char p[128];
    if (json_is_string(c)) {
        if (out)
            buf_append(out, json_string_value(c), json_string_length(c));
        return true;
    }
    if (!json_is_array(c))
        BAD("invalid_type", where,
            "Invalid type for '%s': expected one of a string or array of objects, but got %s "
            "instead.", where, jtype(c));
    size_t j;
    json_t *part;
    bool first = true;
    json_array_foreach(c, j, part) {
        snprintf(p, sizeof p, "%s[%zu]", where, j);
        if (!json_is_object(part))
            BAD("invalid_type", p, "Invalid type for '%s': expected an object, but got %s instead.",
                p, jtype(part));
        json_t *type = json_object_get(part, "type");
        snprintf(p, sizeof p, "%s[%zu].type", where, j);
        if (!json_is_string(type))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (strcmp(json_string_value(type), "image_url") == 0) {
            /* {"type":"image_url","image_url":{"url":"data:image/..;base64,.." or "http(s)://.."}} */
            json_t *iu = json_object_get(part, "image_url");
            const char *url = json_string_value(json_object_get(iu, "url"));
            snprintf(p, sizeof p, "%s[%zu].image_url.url", where, j);
            if (!url)
                BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
            if (strncmp(url, "data:image/", 11) != 0 && strncmp(url, "https://", 8) != 0 &&
                strncmp(url, "http://", 7) != 0)
                BAD("invalid_value", p, "Invalid image URL in '%s': expected a data:image/ URL "
                    "or an http(s) URL.", p);
            continue;
        }
        if (strcmp(json_string_value(type), "text") != 0)
            BAD("invalid_value", p, "Invalid value for '%s': expected 'text' or 'image_url'.", p);
        json_t *text = json_object_get(part, "text");
        snprintf(p, sizeof p, "%s[%zu].text", where, j);
        if (!text)
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (!json_is_string(text))
            BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.",
                p, jtype(text));
        if (out) {
            if (!first)
                buf_append(out, "\n", 1);
            buf_append(out, json_string_value(text), json_string_length(text));
        }
        first = false;
    }
    return true;
fail:
    return false;
}

static bool check_tool_calls(const json_t *tc, size_t i, struct api_error *err)
{
    char p[128];
    snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
    if (!json_is_array(tc))
        BAD("invalid_type", p,
            "Invalid type for '%s': expected an array of objects, but got %s instead.", p,
            jtype(tc));
    if (json_array_size(tc) == 0)
        BAD("empty_array", p,
            "Invalid '%s': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.", p);
    size_t k;
    json_t *call;
    json_array_foreach(tc, k, call) {
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(call))
            BAD("invalid_type", p, "Invalid type for '%s': expected an object, but got %s instead.",
                p, jtype(call));
        json_t *id = json_object_get(call, "id");
        json_t *type = json_object_get(call, "type");
        json_t *fn = json_object_get(call, "function");
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].id", i, k);
        if (!json_is_string(id))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        for (size_t m = 0; m < k; m++) {
            json_t *other = json_object_get(json_array_get(tc, m), "id");
            if (json_equal(other, id))
                BAD("invalid_value", p,
                    "Duplicate tool call id '%s' in 'messages[%zu].tool_calls'.",
                    json_string_value(id), i);
        }
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].type", i, k);
        if (!json_is_string(type))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (strcmp(json_string_value(type), "function") != 0)
            BAD("invalid_value", p, "Invalid value: '%s'. Supported values are: 'function'.",
                json_string_value(type));
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", i, k);
        if (!json_is_object(fn))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.name", i, k);
        if (!json_is_string(name))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
        if (!args)
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (!json_is_string(args))
            BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.",
                p, jtype(args));
        /* The API wants arguments as a string *containing* JSON. */
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                    JSON_DECODE_ANY, NULL);
        if (!parsed)
            BAD("invalid_value", p, "Invalid '%s': expected a string containing valid JSON.", p);
        json_decref(parsed);
    }
    return true;
fail:
    return false;
}

static bool valid_role(const char *r)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0)
            return true;
    return false;
}

/* Validates one message's own shape (not its position). */
static bool check_message(const json_t *msg, size_t i, struct api_error *err)
{
    char p[128];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(msg))
        BAD("invalid_type", p, "Invalid type for '%s': expected an object, but got %s instead.", p,
            jtype(msg));
    json_t *role = json_object_get(msg, "role");
    snprintf(p, sizeof p, "messages[%zu].role", i);
    if (!role)
        BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
    if (!json_is_string(role))
        BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.", p,
            jtype(role));
    const char *r = json_string_value(role);
    if (!valid_role(r))
        BAD("invalid_value", p,
            "Invalid value: '%s'. Supported values are: 'system', 'assistant', 'user', 'tool', "
            "and 'developer'.", r);

    json_t *content = json_object_get(msg, "content");
    snprintf(p, sizeof p, "messages[%zu].content", i);
    if (strcmp(r, "assistant") == 0) {
        json_t *tc = json_object_get(msg, "tool_calls");
        if (present(tc) && !check_tool_calls(tc, i, err))
            return false;
        if (!present(content)) {
            if (!present(tc))
                BAD(NULL, p, "Invalid value for '%s': expected a string, got null.", p);
        } else if (!check_content(content, p, err, NULL)) {
            return false;
        }
        return true;
    }
    if (!content)
        BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
    if (!check_content(content, p, err, NULL))
        return false;
    if (strcmp(r, "tool") == 0) {
        json_t *id = json_object_get(msg, "tool_call_id");
        snprintf(p, sizeof p, "messages[%zu].tool_call_id", i);
        if (!id)
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (!json_is_string(id))
            BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.",
                p, jtype(id));
    }
    return true;
fail:
    return false;
}

const char *chat_role_of(const json_t *msg)
{
    return json_string_value(json_object_get(msg, "role"));
}

#define NO_CALL ((size_t)-1)

/* Index of the not-yet-answered call with this id in a tool_calls array. */
static size_t unanswered_call(const json_t *calls, const bool *answered, const char *id)
{
    for (size_t m = 0; m < json_array_size(calls); m++) {
        const char *cid = json_string_value(json_object_get(json_array_get(calls, m), "id"));
        if (!answered[m] && strcmp(cid, id) == 0)
            return m;
    }
    return NO_CALL;
}

/* Every assistant tool_calls block must be followed, before any other role,
 * by exactly one tool message per call id; tool messages may appear only there. */
static bool check_tool_sequence(const json_t *msgs, struct api_error *err)
{
    const json_t *block = NULL; /* tool_calls array of the open block */
    bool *answered = NULL;
    size_t remaining = 0;
    size_t i;
    json_t *msg;
    char p[64];

    json_array_foreach(msgs, i, msg) {
        const char *r = chat_role_of(msg);
        bool is_tool = strcmp(r, "tool") == 0;
        if (block && !is_tool)
            break; /* the block ended with unanswered calls */
        if (is_tool) {
            const char *id = json_string_value(json_object_get(msg, "tool_call_id"));
            size_t k = block ? unanswered_call(block, answered, id) : NO_CALL;
            if (k == NO_CALL) {
                snprintf(p, sizeof p, "messages.[%zu].role", i);
                BAD(NULL, p,
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.");
            }
            answered[k] = true;
            if (--remaining == 0) {
                block = NULL;
                free(answered);
                answered = NULL;
            }
            continue;
        }
        json_t *tc = json_object_get(msg, "tool_calls");
        if (strcmp(r, "assistant") == 0 && present(tc)) {
            block = tc;
            remaining = json_array_size(tc);
            answered = calloc(remaining, sizeof *answered);
            if (!answered)
                abort();
        }
    }
    if (block) {
        buf_t ids = {0};
        for (size_t m = 0; m < json_array_size(block); m++) {
            if (answered[m])
                continue;
            if (ids.len)
                buf_puts(&ids, ", ");
            buf_puts(&ids, json_string_value(json_object_get(json_array_get(block, m), "id")));
        }
        api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                      "An assistant message with 'tool_calls' must be followed by tool messages "
                      "responding to each 'tool_call_id'. The following tool_call_ids did not "
                      "have response messages: %s", ids.data);
        buf_free(&ids);
        goto fail;
    }
    return true;
fail:
    free(answered);
    return false;
}

static bool valid_tool_name(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-')
            return false;
    return true;
}

static bool check_tools(const json_t *tools, struct api_error *err)
{
    char p[96];
    if (!json_is_array(tools))
        BAD("invalid_type", "tools",
            "Invalid type for 'tools': expected an array of objects, but got %s instead.",
            jtype(tools));
    if (json_array_size(tools) == 0)
        BAD("empty_array", "tools",
            "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.");
    size_t k;
    json_t *t;
    json_array_foreach(tools, k, t) {
        snprintf(p, sizeof p, "tools[%zu]", k);
        if (!json_is_object(t))
            BAD("invalid_type", p, "Invalid type for '%s': expected an object, but got %s instead.",
                p, jtype(t));
        json_t *type = json_object_get(t, "type");
        snprintf(p, sizeof p, "tools[%zu].type", k);
        if (!json_is_string(type))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (strcmp(json_string_value(type), "function") != 0)
            BAD("invalid_value", p, "Invalid value: '%s'. Supported values are: 'function'.",
                json_string_value(type));
        json_t *fn = json_object_get(t, "function");
        snprintf(p, sizeof p, "tools[%zu].function", k);
        if (!json_is_object(fn))
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        json_t *name = json_object_get(fn, "name");
        snprintf(p, sizeof p, "tools[%zu].function.name", k);
        if (!name)
            BAD("missing_required_parameter", p, "Missing required parameter: '%s'.", p);
        if (!json_is_string(name))
            BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.",
                p, jtype(name));
        if (json_string_length(name) > 64)
            BAD("string_above_max_length", p,
                "Invalid '%s': string too long. Expected a string with maximum length 64, but got "
                "a string with length %zu instead.", p, json_string_length(name));
        if (!valid_tool_name(json_string_value(name)))
            BAD("invalid_value", p,
                "Invalid '%s': string does not match pattern. Expected a string that matches the "
                "pattern '^[a-zA-Z0-9_-]+$'.", p);
        json_t *desc = json_object_get(fn, "description");
        snprintf(p, sizeof p, "tools[%zu].function.description", k);
        if (present(desc) && !json_is_string(desc))
            BAD("invalid_type", p, "Invalid type for '%s': expected a string, but got %s instead.",
                p, jtype(desc));
        json_t *params = json_object_get(fn, "parameters");
        snprintf(p, sizeof p, "tools[%zu].function.parameters", k);
        if (present(params) && !json_is_object(params))
            BAD("invalid_type", p, "Invalid type for '%s': expected an object, but got %s instead.",
                p, jtype(params));
    }
    return true;
fail:
    return false;
}

/* response_format: text, json_object, or json_schema {name, schema?, strict?}; strict
 * schemas must close every object at the root (OpenAI's first complaint). */
static bool check_response_format(const json_t *rf, struct chat_request *req,
                                  struct api_error *err)
{
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        BAD("invalid_type", "response_format", "Invalid type for 'response_format': expected an "
            "object with a 'type'.");
    if (strcmp(type, "text") == 0)
        return true;
    if (strcmp(type, "json_object") == 0) {
        req->response_json = true;
        return true;
    }
    if (strcmp(type, "json_schema") != 0)
        BAD("invalid_value", "response_format.type", "Invalid value: '%s'. Supported values are: "
            "'json_object', 'json_schema', and 'text'.", type);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        BAD("missing_required_parameter", "response_format.json_schema",
            "Missing required parameter: 'response_format.json_schema'.");
    json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
    if (!json_is_string(name))
        BAD("missing_required_parameter", "response_format.json_schema.name",
            "Missing required parameter: 'response_format.json_schema.name'.");
    if (!valid_tool_name(json_string_value(name)) || json_string_length(name) > 64)
        BAD("invalid_value", "response_format.json_schema.name", "Invalid "
            "'response_format.json_schema.name': string does not match pattern. Expected a "
            "string that matches the pattern '^[a-zA-Z0-9_-]+$'.");
    if (present(schema) && !json_is_object(schema))
        BAD("invalid_type", "response_format.json_schema.schema", "Invalid type for "
            "'response_format.json_schema.schema': expected an object.");
    if (json_is_true(json_object_get(js, "strict"))) {
        if (!json_is_false(json_object_get(schema, "additionalProperties")))
            BAD(NULL, "response_format", "Invalid schema for response_format '%s': In "
                "context=(), 'additionalProperties' is required to be supplied and to be false.",
                json_string_value(name));
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(schema, "properties"), key, v) {
            bool listed = false;
            size_t i;
            json_t *r;
            json_array_foreach(json_object_get(schema, "required"), i, r)
                listed |= json_is_string(r) && strcmp(json_string_value(r), key) == 0;
            if (!listed)
                BAD(NULL, "response_format", "Invalid schema for response_format '%s': In "
                    "context=(), 'required' is required to be supplied and to be an array "
                    "including every key in properties. Missing '%s'.",
                    json_string_value(name), key);
        }
    }
    req->response_json = true;
    req->response_schema = json_is_object(schema) ? schema : NULL;
    return true;
fail:
    return false;
}

static bool check_tool_choice(const json_t *tc, struct chat_request *req, struct api_error *err)
{
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "none") == 0)
            req->choice = CHOICE_NONE;
        else if (strcmp(s, "auto") == 0)
            req->choice = CHOICE_AUTO;
        else if (strcmp(s, "required") == 0)
            req->choice = CHOICE_REQUIRED;
        else
            BAD("invalid_value", "tool_choice",
                "Invalid value: '%s'. Supported values are: 'none', 'auto', and 'required'.", s);
    } else if (json_is_object(tc)) {
        json_t *type = json_object_get(tc, "type");
        json_t *name = json_object_get(json_object_get(tc, "function"), "name");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_string(name))
            BAD("invalid_value", "tool_choice",
                "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                "{\"type\": \"function\", \"function\": {\"name\": \"...\"}}.");
        req->choice = CHOICE_FUNCTION;
        req->forced_tool = json_string_value(name);
    } else {
        BAD("invalid_type", "tool_choice",
            "Invalid type for 'tool_choice': expected a string or an object, but got %s instead.",
            jtype(tc));
    }
    if (!req->tools)
        BAD(NULL, "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.");
    return true;
fail:
    return false;
}

static bool check_range(const json_t *body, const char *key, double max, struct api_error *err)
{
    json_t *v = json_object_get(body, key);
    if (!present(v))
        return true;
    if (!json_is_number(v))
        BAD("invalid_type", key, "Invalid type for '%s': expected a decimal, but got %s instead.",
            key, jtype(v));
    double d = json_number_value(v);
    if (d < 0)
        BAD("decimal_below_min_value", key,
            "Invalid '%s': decimal below minimum value. Expected a value >= 0, but got %g instead.",
            key, d);
    if (d > max)
        BAD("decimal_above_max_value", key,
            "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %g "
            "instead.", key, max, d);
    return true;
fail:
    return false;
}

static bool check_positive_int(const json_t *body, const char *key, struct api_error *err)
{
    json_t *v = json_object_get(body, key);
    if (!present(v))
        return true;
    if (!json_is_integer(v))
        BAD("invalid_type", key, "Invalid type for '%s': expected an integer, but got %s instead.",
            key, jtype(v));
    if (json_integer_value(v) < 1)
        BAD("integer_below_min_value", key,
            "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %lld "
            "instead.", key, (long long)json_integer_value(v));
    return true;
fail:
    return false;
}

char *chat_content_text(const json_t *c)
{
    buf_t b = {0};
    struct api_error ignored = {0};
    if (json_is_string(c) || json_is_array(c))
        check_content(c, "content", &ignored, &b);
    api_error_free(&ignored);
    return b.data ? buf_take(&b, NULL) : xstrdup("");
}

/* Parley sends what changes from turn to turn (extra_system_prompt, ...) after the user's
 * text, under this heading (plugin/turn/turn.c, turn_note): the model reads it as
 * instructions, not as what the user said, so the fake's echoes and markers see the user's
 * text alone, and [[echo-system]] shows the note after the system prompt. */
#define TURN_NOTE_HEADING "[Instructions for this turn, from the system, not from the user]\n"

char *cut_turn_note(char *text)
{
    char *at = text ? strstr(text, TURN_NOTE_HEADING) : NULL;
    if (!at)
        return NULL;
    char *note = xstrdup(at + strlen(TURN_NOTE_HEADING));
    while (at > text && (at[-1] == '\n' || at[-1] == ' '))
        at--;
    *at = '\0';
    return note;
}

static void split_turn_note(struct chat_request *req)
{
    req->turn_note = cut_turn_note(req->user_text);
}

/*
 * --strict-template: what llama.cpp answers when the model's chat template raises on the order
 * of the messages (a 400 invalid_request_error naming the Jinja exception, as in
 * ggml-org/llama.cpp#20733).  qwen: Qwen 3.x's template takes a system message only first
 * ("System message must be at the beginning."); gemma: Gemma's folds a first system message
 * into the user's and then wants user at every even place and only there ("Conversation roles
 * must alternate user/assistant/user/assistant/..."); as the Gemma-like templates that take
 * tools do, a tool round (the results and the assistant message after them) counts as part of
 * the assistant's place.
 */
static bool check_template(const json_t *msgs, struct api_error *err)
{
    static const char head[] = "Unable to generate parser for this template. Automatic parser "
                               "generation failed: Jinja Exception: ";
    size_t i, place = 0;
    const char *prev = "";
    const json_t *msg;
    json_array_foreach(msgs, i, msg) {
        const char *r = chat_role_of(msg), *before = prev;
        int system = strcmp(r, "system") == 0 || strcmp(r, "developer") == 0;
        prev = r;
        if (i == 0 && system)
            continue;
        if (g_cfg.strict_template == STRICT_QWEN && system)
            BAD(NULL, NULL, "%sSystem message must be at the beginning.", head);
        if (strcmp(r, "tool") == 0 || (strcmp(r, "assistant") == 0 && strcmp(before, "tool") == 0))
            continue; /* within a tool round */
        if (g_cfg.strict_template == STRICT_GEMMA && (strcmp(r, "user") == 0) != (place++ % 2 == 0))
            BAD(NULL, NULL, "%sConversation roles must alternate user/assistant/user/assistant/...",
                head);
    }
    return true;
fail:
    return false;
}

bool chat_parse(json_t *body, struct chat_request *req, struct api_error *err)
{
    memset(req, 0, sizeof *req);
    if (!body)
        BAD(NULL, NULL,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but "
            "what was sent was not valid JSON.)");
    if (!json_is_object(body))
        BAD("invalid_type", NULL,
            "Invalid type for request body: expected an object, but got %s instead.", jtype(body));
    req->body = body;

    json_t *model = json_object_get(body, "model");
    if (!model)
        BAD(NULL, NULL, "you must provide a model parameter");
    if (!json_is_string(model))
        BAD("invalid_type", "model", "Invalid type for 'model': expected a string, but got %s "
            "instead.", jtype(model));
    req->model = json_string_value(model);

    json_t *msgs = json_object_get(body, "messages");
    if (!msgs)
        BAD("missing_required_parameter", "messages", "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs))
        BAD("invalid_type", "messages",
            "Invalid type for 'messages': expected an array of objects, but got %s instead.",
            jtype(msgs));
    if (json_array_size(msgs) == 0)
        BAD("empty_array", "messages",
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.");

    size_t i;
    json_t *msg;
    const json_t *last_user = NULL, *system = NULL;
    json_array_foreach(msgs, i, msg) {
        if (!check_message(msg, i, err))
            goto fail;
        const char *r = chat_role_of(msg);
        if (strcmp(r, "user") == 0) {
            req->n_user++;
            last_user = msg;
        } else if (strcmp(r, "tool") == 0) {
            req->has_tool_msgs = true;
        } else if (!system && (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)) {
            system = msg;
        }
    }
    if (!check_tool_sequence(msgs, err))
        goto fail;
    if (g_cfg.strict_template != STRICT_NONE && !check_template(msgs, err))
        goto fail;
    req->n_messages = json_array_size(msgs);
    json_t *last = json_array_get(msgs, req->n_messages - 1);
    req->last_is_tool = strcmp(chat_role_of(last), "tool") == 0;

    json_t *tools = json_object_get(body, "tools");
    if (present(tools)) {
        if (!check_tools(tools, err))
            goto fail;
        req->tools = tools;
    }
    req->choice = CHOICE_AUTO;
    json_t *tc = json_object_get(body, "tool_choice");
    if (present(tc) && !check_tool_choice(tc, req, err))
        goto fail;
    json_t *rf = json_object_get(body, "response_format");
    if (present(rf) && !check_response_format(rf, req, err))
        goto fail;

    json_t *stream = json_object_get(body, "stream");
    if (present(stream) && !json_is_boolean(stream))
        BAD("invalid_type", "stream", "Invalid type for 'stream': expected a boolean, but got %s "
            "instead.", jtype(stream));
    req->stream = json_is_true(stream);
    req->include_usage =
        json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    if (!check_range(body, "temperature", 2, err) || !check_range(body, "top_p", 1, err) ||
        !check_positive_int(body, "max_tokens", err) ||
        !check_positive_int(body, "max_completion_tokens", err))
        goto fail;

    req->user_text =
        last_user ? chat_content_text(json_object_get(last_user, "content")) : xstrdup("");
    split_turn_note(req);
    if (system)
        req->system_text = chat_content_text(json_object_get(system, "content"));
    return true;
fail:
    return false;
}

void chat_request_free(struct chat_request *req)
{
    free(req->user_text);
    free(req->system_text);
    free(req->turn_note);
    req->user_text = req->system_text = req->turn_note = NULL;
}
