/* Ollama's native dialect: POST /api/chat
 * (https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion).
 *
 * Checked strictly: messages have role and string content; assistant
 * tool_calls are {"function": {"name", "arguments": OBJECT}} without ids; a
 * tool message carries tool_name, naming a call of the assistant message
 * before it; there is no tool_choice; options/keep_alive/think have their
 * documented types; `stream` defaults to TRUE as in Ollama.  With
 * [[think:TEXT]] the model's thinking comes in `thinking` when the request
 * asked for it (think), else as <think>TEXT</think> in the content; it must
 * come back with this turn's tool calls.  Streams are NDJSON. */
#include "fakellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Give this message's calls ids and remember them (by name) for the tool messages after. */
static json_t *translate_calls(json_t *calls, size_t i, json_t *pending, struct api_error *err)
{
    json_t *out = json_array();
    size_t k;
    json_t *c;
    if (!json_is_array(calls))
        DIALECT_BAD("messages[%zu].tool_calls: expected an array", i);
    json_array_foreach(calls, k, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = jstr_member(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        if (!name)
            DIALECT_BAD("messages[%zu].tool_calls[%zu].function.name: required", i, k);
        if (!json_is_object(args))
            DIALECT_BAD("json: cannot unmarshal %s into Go struct field "
                "ToolCallFunction.messages.tool_calls.function.arguments of type "
                "api.ToolCallFunctionArguments", json_is_string(args) ? "string" : "value");
        char id[64];
        snprintf(id, sizeof id, "ollama_%zu_%zu", i, k);
        char *text = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
        json_array_append_new(out, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type",
                                             "function", "function", "name", name, "arguments",
                                             text));
        free(text);
        json_array_append_new(pending, json_pack("{s:s,s:s}", "id", id, "name", name));
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

json_t *ollama_to_chat(json_t *body, struct api_error *err)
{
    json_t *out = json_object(), *msgs = json_array(), *pending = json_array();
    json_t *list = json_object_get(body, "messages"), *opts = json_object_get(body, "options");
    size_t i;
    json_t *m;
    if (!json_is_object(body))
        DIALECT_BAD("invalid request body");
    if (!jstr_member(body, "model"))
        DIALECT_BAD("model is required");
    if (!json_is_array(list) || json_array_size(list) == 0)
        DIALECT_BAD("messages is required");
    if (json_object_get(body, "tool_choice"))
        DIALECT_BAD("unknown field \"tool_choice\"");
    if (opts && !json_is_object(opts))
        DIALECT_BAD("options must be an object");
    json_t *ka = json_object_get(body, "keep_alive");
    if (ka && !json_is_string(ka) && !json_is_number(ka))
        DIALECT_BAD("keep_alive: expected a duration string or a number");
    json_t *think = json_object_get(body, "think");
    if (think && !json_is_boolean(think) && !json_is_string(think))
        DIALECT_BAD("think: expected a boolean or \"low\"/\"medium\"/\"high\"");
    json_t *nctx = json_object_get(opts, "num_ctx");
    if (nctx && !json_is_integer(nctx))
        DIALECT_BAD("options.num_ctx: expected an integer");
    json_array_foreach(list, i, m) {
        const char *role = jstr_member(m, "role");
        if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "tool")))
            DIALECT_BAD("messages[%zu].role: invalid role", i);
        json_t *content = json_object_get(m, "content");
        if (content && !json_is_string(content))
            DIALECT_BAD("json: cannot unmarshal %s into Go struct field Message.messages.content of "
                "type string", json_is_array(content) ? "array" : "value");
        const char *text = json_string_value(content) ? json_string_value(content) : "";
        if (strcmp(role, "tool") == 0) {
            const char *name = jstr_member(m, "tool_name");
            size_t k;
            json_t *p;
            const char *id = NULL;
            if (!name)
                DIALECT_BAD("messages[%zu]: a tool message needs tool_name", i);
            json_array_foreach(pending, k, p) {
                if (strcmp(jstr_member(p, "name"), name) == 0) {
                    id = jstr_member(p, "id");
                    break;
                }
            }
            if (!id)
                DIALECT_BAD("messages[%zu]: tool_name '%s' answers no call of the assistant message "
                    "before it", i, name);
            json_array_append_new(msgs, json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                  "tool_call_id", id, "content", text));
            json_array_remove(pending, k);
            continue;
        }
        json_array_clear(pending);
        json_t *images = json_object_get(m, "images");
        size_t q;
        json_t *img;
        if (images && (!json_is_array(images) || strcmp(role, "user") != 0))
            DIALECT_BAD("messages[%zu].images: an array of base64 strings, in a user message", i);
        json_array_foreach(images, q, img) {
            if (!json_is_string(img) || strncmp(json_string_value(img), "data:", 5) == 0 ||
                strstr(json_string_value(img), "://"))
                DIALECT_BAD("messages[%zu].images[%zu]: illegal base64 data", i, q);
        }
        json_t *msg = json_pack("{s:s,s:s}", "role", role, "content", text);
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && strcmp(role, "assistant") == 0) {
            json_t *tc = translate_calls(calls, i, pending, err);
            if (!tc) {
                json_decref(msg);
                goto fail;
            }
            json_object_set_new(msg, "tool_calls", tc);
            if (!*text)
                json_object_set_new(msg, "content", json_null());
            if (jstr_member(m, "thinking"))
                json_object_set(msg, "reasoning_content", json_object_get(m, "thinking"));
        }
        json_array_append_new(msgs, msg);
    }
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream))
        DIALECT_BAD("stream: expected a boolean");
    json_object_set(out, "model", json_object_get(body, "model"));
    json_object_set_new(out, "messages", msgs);
    msgs = NULL;
    json_object_set_new(out, "stream", json_boolean(!stream || json_is_true(stream)));
    if (json_object_get(body, "tools"))
        json_object_set(out, "tools", json_object_get(body, "tools"));
    json_t *format = json_object_get(body, "format");
    if (json_is_string(format) && !*json_string_value(format))
        format = NULL; /* "": no format, as Ollama reads it */
    if (format && !(json_is_string(format) && strcmp(json_string_value(format), "json") == 0) &&
        !json_is_object(format))
        DIALECT_BAD("invalid format: expected \"json\" or a JSON schema");
    if (format)
        json_object_set_new(out, "response_format",
                            json_is_object(format)
                                ? json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema",
                                            "json_schema", "name", "format", "schema", format)
                                : json_pack("{s:s}", "type", "json_object"));
    json_t *predict = json_object_get(opts, "num_predict");
    if (json_is_integer(predict))
        json_object_set(out, "max_tokens", predict);
    json_decref(pending);
    return out;
fail:
    json_decref(out);
    json_decref(msgs);
    json_decref(pending);
    return NULL;
}

/* ---- replies ---- */

static bool wants_thinking(json_t *native)
{
    json_t *t = json_object_get(native, "think");
    return json_is_true(t) || json_is_string(t);
}

static json_t *base(const struct chat_request *req)
{
    return json_pack("{s:s,s:s}", "model", req->model, "created_at", "2026-11-24T00:00:00Z");
}

static json_t *message(const char *content, const char *thinking, json_t *calls)
{
    json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", content);
    if (thinking)
        json_object_set_new(m, "thinking", json_string(thinking));
    if (calls)
        json_object_set_new(m, "tool_calls", calls);
    return m;
}

static json_t *calls_json(const struct chat_reply *r)
{
    json_t *calls = json_array();
    for (size_t i = 0; i < r->ncalls; i++) {
        json_t *args = json_loads(r->calls[i].args, 0, NULL);
        if (!json_is_object(args)) { /* Ollama itself never sends invalid arguments */
            json_decref(args);
            args = json_object();
        }
        json_t *c = json_pack("{s:{s:s,s:o}}", "function", "name", r->calls[i].name, "arguments",
                              args);
        if (r->ids_given) /* newer servers name their calls */
            json_object_set_new(c, "id", json_string(r->calls[i].id));
        json_array_append_new(calls, c);
    }
    return calls;
}

/* prompt_eval_count: the prompt as the model got it (after truncation to num_ctx), and, as
 * newer releases do, prompt_eval_cached_count: how much of it came from the cache. */
static void final_fields(json_t *o, const struct chat_reply *r, const struct prompt_stats *ps)
{
    json_t *u = chat_usage(ps, r);
    json_object_set_new(o, "done_reason", json_string(strcmp(r->finish_reason, "length") == 0
                                                          ? "length" : "stop"));
    json_object_set_new(o, "done", json_true());
    json_object_set_new(o, "total_duration", json_integer(1000));
    json_object_set_new(o, "prompt_eval_count", json_incref(json_object_get(u, "prompt_tokens")));
    json_object_set_new(o, "prompt_eval_cached_count",
                        json_integer((json_int_t)ps->cached_tokens));
    json_object_set_new(o, "eval_count", json_incref(json_object_get(u, "completion_tokens")));
    json_decref(u);
}

/* Thinking the request did not ask for stays in the content, as tags. */
static char *visible_content(const struct chat_reply *r, json_t *native)
{
    buf_t b = {0};
    if (r->reasoning && !wants_thinking(native))
        buf_printf(&b, "<think>%s</think>\n\n", r->reasoning);
    buf_puts(&b, r->content ? r->content : "");
    return buf_take(&b, NULL);
}

char *ollama_chat_json(const struct chat_request *req, const struct chat_reply *r,
                       const struct prompt_stats *ps, json_t *native, size_t *len)
{
    char *content = visible_content(r, native);
    json_t *o = base(req);
    json_object_set_new(o, "message", message(content, wants_thinking(native) ? r->reasoning : NULL,
                                              r->ncalls ? calls_json(r) : NULL));
    final_fields(o, r, ps);
    free(content);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

static void line(struct segments *out, json_t *o)
{
    size_t len;
    char *s = json_dump_compact(o, &len);
    buf_t b = {0};
    buf_append(&b, s, len);
    buf_append(&b, "\n", 1);
    segments_add(out, b.data, b.len);
    buf_free(&b);
    free(s);
    json_decref(o);
}

static void pieces(struct segments *out, const struct chat_request *req, const char *s,
                   bool thinking)
{
    size_t len = strlen(s);
    for (size_t pos = 0; pos < len;) {
        size_t end = utf8_boundary(s, len, pos + 8);
        char *piece = xstrndup(s + pos, end - pos);
        json_t *o = base(req);
        json_object_set_new(o, "message", thinking ? message("", piece, NULL)
                                                   : message(piece, NULL, NULL));
        json_object_set_new(o, "done", json_false());
        line(out, o);
        free(piece);
        pos = end;
    }
}

void ollama_ndjson_build(const struct chat_request *req, const struct chat_reply *r,
                         const struct prompt_stats *ps, json_t *native, struct segments *out)
{
    if (r->reasoning && wants_thinking(native))
        pieces(out, req, r->reasoning, true);
    char *content = visible_content(r, native);
    pieces(out, req, content, false);
    free(content);
    if (r->ncalls) { /* Ollama sends each call whole, in one line */
        json_t *o = base(req);
        json_object_set_new(o, "message", message("", NULL, calls_json(r)));
        json_object_set_new(o, "done", json_false());
        line(out, o);
    }
    json_t *o = base(req);
    json_object_set_new(o, "message", message("", NULL, NULL));
    final_fields(o, r, ps);
    line(out, o);
}
