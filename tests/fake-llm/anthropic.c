/* The Anthropic Messages dialect: POST /v1/messages.
 *
 * Requests are validated the way the API documents them
 * (https://docs.anthropic.com/en/api/messages): max_tokens required, roles
 * alternate starting with user, every tool_use answered by a tool_result in
 * the very next user message (and no stray results), tool inputs are objects,
 * text blocks are non-empty, tools carry an input_schema object, thinking
 * budgets are at least 1024 and below max_tokens.  A valid request is then
 * translated to Chat Completions so the usual reply rules (markers) apply,
 * and the reply is rendered as a Message, or as the SSE events of
 * https://docs.anthropic.com/en/docs/build-with-claude/streaming. */
#include "fakellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Blocks of a content (a string is one text block). New reference. */
static json_t *blocks_of(json_t *content)
{
    if (json_is_string(content))
        return json_pack("[{s:s,s:O}]", "type", "text", "text", content);
    return json_is_array(content) ? json_incref(content) : NULL;
}

static json_t *translate_tools(json_t *tools, struct api_error *err)
{
    json_t *out = json_array();
    size_t i;
    json_t *t;
    if (!json_is_array(tools) || json_array_size(tools) == 0)
        DIALECT_BAD("tools: Input should be a non-empty list");
    json_array_foreach(tools, i, t) {
        if (!jstr_member(t, "name"))
            DIALECT_BAD("tools.%zu.name: Field required", i);
        if (!json_is_object(json_object_get(t, "input_schema")))
            DIALECT_BAD("tools.%zu.input_schema: Field required", i);
        json_t *fn = json_pack("{s:O,s:O}", "name", json_object_get(t, "name"), "parameters",
                               json_object_get(t, "input_schema"));
        if (json_object_get(t, "description"))
            json_object_set(fn, "description", json_object_get(t, "description"));
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static bool translate_system(json_t *sys, json_t *msgs, struct api_error *err)
{
    if (!sys)
        return true;
    json_t *blocks = blocks_of(sys);
    buf_t b = {0};
    size_t i;
    json_t *blk;
    if (!blocks)
        DIALECT_BAD("system: Input should be a valid string or list of text blocks");
    json_array_foreach(blocks, i, blk) {
        if (!jstr_member(blk, "type") || strcmp(jstr_member(blk, "type"), "text") != 0 || !jstr_member(blk, "text"))
            DIALECT_BAD("system.%zu: Input should be a text block", i);
        buf_puts(&b, jstr_member(blk, "text"));
    }
    json_decref(blocks);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                          b.data ? b.data : ""));
    buf_free(&b);
    return true;
fail:
    json_decref(blocks);
    buf_free(&b);
    return false;
}

/* One message's blocks, checked against the tool_use ids the previous assistant message
 * left open (*open: an array of ids, replaced). */
static bool translate_message(json_t *m, size_t i, json_t **open, json_t *msgs,
                              struct api_error *err)
{
    const char *role = jstr_member(m, "role");
    json_t *blocks = blocks_of(json_object_get(m, "content"));
    buf_t text = {0};
    json_t *calls = json_array(), *results = json_array(), *next_open = json_array();
    size_t k;
    json_t *b;
    if (!blocks)
        DIALECT_BAD("messages.%zu.content: Input should be a valid string or list", i);
    if (json_array_size(blocks) == 0)
        DIALECT_BAD("messages.%zu: all messages must have non-empty content except for the optional "
            "final assistant message", i);
    json_array_foreach(blocks, k, b) {
        const char *type = jstr_member(b, "type");
        if (!type)
            DIALECT_BAD("messages.%zu.content.%zu.type: Field required", i, k);
        if (strcmp(type, "text") == 0) {
            const char *t = jstr_member(b, "text");
            if (!t || !*t)
                DIALECT_BAD("messages: text content blocks must be non-empty");
            buf_puts(&text, t);
        } else if (strcmp(type, "image") == 0 && strcmp(role, "user") == 0) {
            /* {"type":"image","source":{"type":"base64","media_type","data"} or {"type":"url","url"}} */
            json_t *src = json_object_get(b, "source");
            const char *st = jstr_member(src, "type");
            if (!st || (strcmp(st, "base64") == 0 ? !jstr_member(src, "media_type") ||
                                                    !jstr_member(src, "data")
                        : strcmp(st, "url") == 0 ? !jstr_member(src, "url") : 1))
                DIALECT_BAD("messages.%zu.content.%zu.source: a base64 source with media_type and "
                    "data, or a url source, expected", i, k);
        } else if (strcmp(type, "tool_use") == 0 && strcmp(role, "assistant") == 0) {
            if (!jstr_member(b, "id") || !jstr_member(b, "name"))
                DIALECT_BAD("messages.%zu.content.%zu: tool_use needs id and name", i, k);
            if (!json_is_object(json_object_get(b, "input")))
                DIALECT_BAD("messages.%zu.content.%zu.input: Input should be a valid dictionary", i, k);
            size_t j;
            json_t *seen;
            json_array_foreach(next_open, j, seen) {
                if (strcmp(json_string_value(seen), jstr_member(b, "id")) == 0)
                    DIALECT_BAD("messages.%zu.content.%zu: `tool_use` ids must be unique", i, k);
            }
            json_array_append_new(next_open, json_string(jstr_member(b, "id")));
            char *args = json_dumps(json_object_get(b, "input"), JSON_COMPACT | JSON_SORT_KEYS);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", jstr_member(b, "id"),
                                                   "type", "function", "function", "name",
                                                   jstr_member(b, "name"), "arguments", args));
            free(args);
        } else if ((strcmp(type, "thinking") == 0 || strcmp(type, "redacted_thinking") == 0) &&
                   strcmp(role, "assistant") == 0) {
            if (strcmp(type, "thinking") == 0 && (!jstr_member(b, "thinking") || !jstr_member(b, "signature")))
                DIALECT_BAD("messages.%zu.content.%zu: thinking needs thinking and signature", i, k);
        } else if (strcmp(type, "tool_result") == 0 && strcmp(role, "user") == 0) {
            const char *id = jstr_member(b, "tool_use_id");
            size_t j;
            json_t *o;
            bool found = false;
            json_array_foreach(*open, j, o) {
                if (id && strcmp(json_string_value(o), id) == 0) {
                    json_array_remove(*open, j);
                    found = true;
                    break;
                }
            }
            if (!found)
                DIALECT_BAD("messages.%zu.content.%zu: unexpected `tool_use_id` found in `tool_result` "
                    "blocks: %s. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message.", i, k, id ? id : "(none)");
            json_t *c = json_object_get(b, "content");
            json_t *rb = json_is_array(c) ? c : NULL;
            buf_t rt = {0};
            if (json_is_string(c))
                buf_puts(&rt, json_string_value(c));
            size_t q;
            json_t *part;
            json_array_foreach(rb, q, part) if (jstr_member(part, "text")) buf_puts(&rt, jstr_member(part, "text"));
            json_array_append_new(results, json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                     "tool_call_id", id, "content",
                                                     rt.data ? rt.data : ""));
            buf_free(&rt);
            if (json_object_get(b, "is_error") && !json_is_boolean(json_object_get(b, "is_error")))
                DIALECT_BAD("messages.%zu.content.%zu.is_error: Input should be a valid boolean", i, k);
        } else {
            DIALECT_BAD("messages.%zu.content.%zu: block type '%s' is not allowed in a %s message", i, k,
                type, role);
        }
    }
    if (json_array_size(*open) > 0)
        DIALECT_BAD("messages.%zu: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: %s. Each `tool_use` block must have a corresponding `tool_result` block in "
            "the next message.", i ? i - 1 : 0, json_string_value(json_array_get(*open, 0)));
    json_array_extend(msgs, results);
    if (strcmp(role, "assistant") == 0) {
        json_t *a = json_pack("{s:s,s:s?}", "role", "assistant", "content", text.data);
        if (json_array_size(calls)) {
            json_object_set(a, "tool_calls", calls);
            if (!text.data)
                json_object_set_new(a, "content", json_null());
        }
        json_array_append_new(msgs, a);
    } else if (text.data) {
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text.data));
    }
    json_decref(*open);
    *open = next_open;
    next_open = NULL;
    json_decref(blocks);
    json_decref(calls);
    json_decref(results);
    buf_free(&text);
    return true;
fail:
    json_decref(blocks);
    json_decref(calls);
    json_decref(results);
    json_decref(next_open);
    buf_free(&text);
    return false;
}

json_t *anthropic_to_chat(json_t *body, struct api_error *err)
{
    json_t *out = json_object(), *msgs = json_array(), *open = json_array();
    json_t *max = json_object_get(body, "max_tokens"), *list = json_object_get(body, "messages");
    json_t *thinking = json_object_get(body, "thinking");
    size_t i;
    json_t *m;
    if (!json_is_object(body))
        DIALECT_BAD("Request body must be a JSON object");
    if (!jstr_member(body, "model"))
        DIALECT_BAD("model: Field required");
    if (!json_is_integer(max) || json_integer_value(max) < 1)
        DIALECT_BAD("max_tokens: Field required (an integer >= 1)");
    if (!json_is_array(list) || json_array_size(list) == 0)
        DIALECT_BAD("messages: Field required (a non-empty list)");
    if (!translate_system(json_object_get(body, "system"), msgs, err))
        goto fail;
    json_array_foreach(list, i, m) {
        const char *role = jstr_member(m, "role");
        const char *want = i % 2 ? "assistant" : "user";
        if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0))
            DIALECT_BAD("messages.%zu.role: Input should be 'user' or 'assistant'", i);
        if (strcmp(role, want) != 0)
            DIALECT_BAD("messages: roles must alternate between \"user\" and \"assistant\", starting "
                "with \"user\" (message %zu is \"%s\")", i, role);
        if (!translate_message(m, i, &open, msgs, err))
            goto fail;
    }
    if (json_array_size(open) > 0)
        DIALECT_BAD("messages: the final assistant message has `tool_use` blocks without results");
    if (json_object_get(body, "stream") && !json_is_boolean(json_object_get(body, "stream")))
        DIALECT_BAD("stream: Input should be a valid boolean");
    if (thinking) {
        json_t *budget = json_object_get(thinking, "budget_tokens");
        if (!jstr_member(thinking, "type") || strcmp(jstr_member(thinking, "type"), "enabled") != 0 ||
            !json_is_integer(budget) || json_integer_value(budget) < 1024)
            DIALECT_BAD("thinking: {\"type\": \"enabled\", \"budget_tokens\": >= 1024} expected");
        if (json_integer_value(budget) >= json_integer_value(max))
            DIALECT_BAD("`max_tokens` must be greater than `thinking.budget_tokens`");
    }
    json_object_set(out, "model", json_object_get(body, "model"));
    json_object_set_new(out, "messages", msgs);
    msgs = NULL;
    json_object_set(out, "max_tokens", max);
    json_object_set_new(out, "stream", json_boolean(json_is_true(json_object_get(body, "stream"))));
    json_t *tools = json_object_get(body, "tools");
    if (tools) {
        json_t *t = translate_tools(tools, err);
        if (!t)
            goto fail;
        json_object_set_new(out, "tools", t);
    }
    json_t *tc = json_object_get(body, "tool_choice");
    if (tc) {
        const char *type = jstr_member(tc, "type");
        if (!type)
            DIALECT_BAD("tool_choice.type: Field required");
        if (thinking && (strcmp(type, "any") == 0 || strcmp(type, "tool") == 0))
            DIALECT_BAD("Thinking may not be enabled when tool_choice forces tool use.");
        if (strcmp(type, "none") == 0)
            json_object_set_new(out, "tool_choice", json_string("none"));
        else if (strcmp(type, "any") == 0)
            json_object_set_new(out, "tool_choice", json_string("required"));
        else if (strcmp(type, "tool") == 0)
            json_object_set_new(out, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function",
                                                              "function", "name",
                                                              json_object_get(tc, "name")));
        else if (strcmp(type, "auto") != 0)
            DIALECT_BAD("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
    }
    json_t *oc = json_object_get(body, "output_config");
    if (oc) { /* structured outputs: {"format": {"type": "json_schema", "schema": {...}}} */
        json_t *format = json_object_get(oc, "format");
        if (!jstr_member(format, "type") || strcmp(jstr_member(format, "type"), "json_schema") ||
            !json_is_object(json_object_get(format, "schema")))
            DIALECT_BAD("output_config.format: {\"type\": \"json_schema\", \"schema\": {...}} "
                        "expected");
        json_object_set_new(out, "response_format",
                            json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema",
                                      "name", "output", "schema",
                                      json_object_get(format, "schema")));
    }
    json_decref(open);
    return out;
fail:
    json_decref(out);
    json_decref(msgs);
    json_decref(open);
    return NULL;
}

/* "You can define up to 4 cache breakpoints" per request (platform.claude.com/docs/en/
 * build-with-claude/prompt-caching), a top-level cache_control (automatic caching) taking one
 * of them; the API refuses a fifth with this 400. */
#define ANTHROPIC_MAX_BREAKPOINTS 4

static size_t marks_in(const json_t *list, const char *inner)
{
    size_t n = 0, i, k;
    json_t *v, *blk;
    json_array_foreach(list, i, v) {
        n += json_is_object(json_object_get(v, "cache_control"));
        if (inner)
            json_array_foreach(json_object_get(v, inner), k, blk)
                n += json_is_object(json_object_get(blk, "cache_control"));
    }
    return n;
}

bool anthropic_check_breakpoints(const json_t *body, struct api_error *err)
{
    size_t n = json_is_object(json_object_get(body, "cache_control")) +
               marks_in(json_object_get(body, "tools"), NULL) +
               marks_in(json_object_get(body, "system"), NULL) +
               marks_in(json_object_get(body, "messages"), "content");
    if (n <= ANTHROPIC_MAX_BREAKPOINTS)
        return true;
    api_error_set(err, 400, "invalid_request_error", NULL, NULL,
                  "A maximum of %d blocks with cache_control may be provided. Found %zu.",
                  ANTHROPIC_MAX_BREAKPOINTS, n);
    return false;
}

/* With thinking on, a tool turn's assistant message must start with its thinking block,
 * unchanged (the signature is checked), when the model thought ([[think:...]]). */
bool anthropic_check_thinking(json_t *body, const char *user_text, struct api_error *err)
{
    if (!json_object_get(body, "thinking") || !marker_find(user_text, "think", NULL, NULL))
        return true;
    json_t *list = json_object_get(body, "messages");
    size_t n = json_array_size(list);
    if (n < 3)
        return true;
    json_t *a = json_array_get(list, n - 2);
    json_t *first = json_array_get(json_object_get(a, "content"), 0);
    const char *type = jstr_member(first, "type");
    if (!type || strcmp(type, "thinking") != 0) {
        api_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "messages.%zu.content.0.type: Expected `thinking` or `redacted_thinking`, "
                      "but found `%s`. When `thinking` is enabled, a final `assistant` message "
                      "must start with a thinking block.", n - 2, type ? type : "(none)");
        return false;
    }
    char *sig = thinking_signature(jstr_member(first, "thinking") ? jstr_member(first, "thinking") : "");
    bool ok = jstr_member(first, "signature") && strcmp(sig, jstr_member(first, "signature")) == 0;
    free(sig);
    if (!ok)
        api_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "messages.%zu.content.0: Invalid `signature` in `thinking` block", n - 2);
    return ok;
}

/* ---- replies ---- */

/* input_tokens counts only what was neither read from nor written to the cache. */
static json_t *usage(const struct chat_reply *r, const struct prompt_stats *ps)
{
    json_t *u = chat_usage(ps, r);
    json_int_t c = json_integer_value(json_object_get(u, "completion_tokens"));
    json_decref(u);
    json_int_t read = (json_int_t)ps->cached_tokens, written = (json_int_t)ps->cache_creation;
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens",
                     (json_int_t)ps->prompt_tokens - read - written, "output_tokens", c,
                     "cache_creation_input_tokens", written, "cache_read_input_tokens", read);
}

static bool thinks(const struct chat_reply *r, json_t *native)
{
    return r->reasoning && json_object_get(native, "thinking");
}

static json_t *content_blocks(const struct chat_reply *r, json_t *native, bool empty)
{
    json_t *blocks = json_array();
    if (thinks(r, native)) {
        char *sig = thinking_signature(r->reasoning);
        json_array_append_new(blocks, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                                                empty ? "" : r->reasoning, "signature",
                                                empty ? "" : sig));
        free(sig);
    }
    if (r->content && *r->content)
        json_array_append_new(blocks, json_pack("{s:s,s:s}", "type", "text", "text",
                                                empty ? "" : r->content));
    for (size_t i = 0; i < r->ncalls; i++) {
        json_t *input = json_loads(r->calls[i].args, 0, NULL);
        if (!json_is_object(input)) { /* a model cannot send invalid JSON here */
            json_decref(input);
            input = json_pack("{s:s}", "raw", r->calls[i].args);
        }
        json_array_append_new(blocks, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id",
                                                r->calls[i].id, "name", r->calls[i].name, "input",
                                                empty ? json_object() : input));
        if (empty)
            json_decref(input);
    }
    return blocks;
}

static const char *stop_reason(const struct chat_reply *r)
{
    if (r->context_full)
        return "model_context_window_exceeded";
    return r->ncalls ? "tool_use" : strcmp(r->finish_reason, "length") == 0 ? "max_tokens"
                                                                            : "end_turn";
}

static json_t *message_base(const struct chat_request *req, unsigned long seq)
{
    char id[48];
    snprintf(id, sizeof id, "msg_%lu", seq);
    return json_pack("{s:s,s:s,s:s,s:s}", "id", id, "type", "message", "role", "assistant",
                     "model", req->model);
}

char *anthropic_message_json(const struct chat_request *req, const struct chat_reply *r,
                             unsigned long seq, const struct prompt_stats *ps, json_t *native, size_t *len)
{
    json_t *o = message_base(req, seq);
    json_object_set_new(o, "content", content_blocks(r, native, false));
    json_object_set_new(o, "stop_reason", json_string(stop_reason(r)));
    json_object_set_new(o, "stop_sequence", json_null());
    json_object_set_new(o, "usage", usage(r, ps));
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

static void event(struct segments *out, const char *type, json_t *data)
{
    buf_t ev = {0};
    size_t len;
    char *s = json_dump_compact(data, &len);
    buf_printf(&ev, "event: %s\ndata: %s\n\n", type, s);
    segments_add(out, ev.data, ev.len);
    buf_free(&ev);
    free(s);
    json_decref(data);
}

static void deltas(struct segments *out, size_t index, const char *dtype, const char *field,
                   const char *s)
{
    size_t len = strlen(s);
    for (size_t pos = 0; pos < len;) {
        size_t end = utf8_boundary(s, len, pos + 8);
        json_t *d = json_pack("{s:s,s:s%}", "type", dtype, field, s + pos, end - pos);
        event(out, "content_block_delta", json_pack("{s:s,s:I,s:o}", "type",
                                                    "content_block_delta", "index",
                                                    (json_int_t)index, "delta", d));
        pos = end;
    }
}

void anthropic_sse_build(const struct chat_request *req, const struct chat_reply *r,
                         unsigned long seq, const struct prompt_stats *ps, json_t *native,
                         struct segments *out)
{
    json_t *u = usage(r, ps);
    json_t *start = message_base(req, seq);
    json_object_set_new(start, "content", json_array());
    json_object_set_new(start, "stop_reason", json_null());
    json_object_set_new(start, "stop_sequence", json_null());
    json_object_set_new(start, "usage", json_pack("{s:O,s:i,s:O,s:O}", "input_tokens",
                                                  json_object_get(u, "input_tokens"),
                                                  "output_tokens", 1,
                                                  "cache_creation_input_tokens",
                                                  json_object_get(u, "cache_creation_input_tokens"),
                                                  "cache_read_input_tokens",
                                                  json_object_get(u, "cache_read_input_tokens")));
    event(out, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", start));
    event(out, "ping", json_pack("{s:s}", "type", "ping"));
    json_t *blocks = content_blocks(r, native, true);
    size_t i, call = 0;
    json_t *b;
    json_array_foreach(blocks, i, b) {
        event(out, "content_block_start", json_pack("{s:s,s:I,s:O}", "type",
                                                    "content_block_start", "index",
                                                    (json_int_t)i, "content_block", b));
        const char *type = jstr_member(b, "type");
        if (strcmp(type, "thinking") == 0) {
            deltas(out, i, "thinking_delta", "thinking", r->reasoning);
            char *sig = thinking_signature(r->reasoning);
            deltas(out, i, "signature_delta", "signature", sig);
            free(sig);
        } else if (strcmp(type, "text") == 0) {
            deltas(out, i, "text_delta", "text", r->content);
        } else {
            json_t *input = json_loads(r->calls[call].args, 0, NULL);
            char *text = json_is_object(input) ? json_dumps(input, JSON_COMPACT)
                                               : xstrdup("{\"raw\":\"\"}");
            json_decref(input);
            deltas(out, i, "input_json_delta", "partial_json", text);
            free(text);
            call++;
        }
        event(out, "content_block_stop", json_pack("{s:s,s:I}", "type", "content_block_stop",
                                                   "index", (json_int_t)i));
    }
    json_decref(blocks);
    event(out, "message_delta", json_pack("{s:s,s:{s:s,s:n},s:{s:O}}", "type", "message_delta",
                                          "delta", "stop_reason", stop_reason(r), "stop_sequence",
                                          "usage", "output_tokens",
                                          json_object_get(u, "output_tokens")));
    event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    json_decref(u);
}
