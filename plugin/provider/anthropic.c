/*
 * anthropic.c -- the Anthropic Messages API codec (POST <base>/v1/messages).
 * References:
 *   https://docs.anthropic.com/en/api/messages
 *   https://docs.anthropic.com/en/docs/build-with-claude/streaming
 *   https://docs.anthropic.com/en/docs/build-with-claude/tool-use
 *   https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking
 *   https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching
 *
 * Rendering: the system prompt is top-level; an assistant's tool calls are
 * tool_use blocks; all tool results of a round go in ONE user message of
 * tool_result blocks (is_error on failures); consecutive messages of one role
 * are merged, as the API wants roles to alternate; a system message in the
 * history (an appended note) becomes a "[system note] ..." user block.  Thinking blocks are sent
 * back unchanged (signature included) within the turn that produced them.
 */
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"
#include "lib/json_oom.h"
#include "provider/codec.h"
#include "provider/image.h"
#include "provider/provider.h"
#include "provider/sse.h"

#define MAX_SSE_SIZE (8u << 20)
#define MAX_BLOCKS (LLM_MAX_TOOL_CALLS + 256) /* tool calls, and text and thinking beside */

static int anthropic_headers(const parley_options *o, struct curl_slist **list)
{
    char *key = o->api_key ? pstr_printf("x-api-key: %s", o->api_key) : NULL;
    const char *lines[] = {"anthropic-version: 2023-06-01", key};
    int rc = o->api_key && !key ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i])
            continue;
        struct curl_slist *more = curl_slist_append(*list, lines[i]);
        if (more)
            *list = more;
        else
            rc = -1;
    }
    free(key);
    return rc;
}

/* ---- request ---- */

static json_t *text_block(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

/* Append a message of `role` with `blocks` (stolen), merging into the last one of the
   same role: the API wants user and assistant to alternate. */
static void push_message(json_t *out, const char *role, json_t *blocks)
{
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    if (last && strcmp(msg_role(last), role) == 0) {
        codec_extend(json_object_get(last, "content"), blocks);
        json_decref(blocks);
        return;
    }
    codec_append(out, json_pack("{s:s,s:o}", "role", role, "content", blocks));
}

static json_t *assistant_blocks(const json_t *m, int current_turn, call_renames *ren)
{
    json_t *blocks = json_array();
    const json_t *calls = json_object_get(m, "tool_calls");
    json_t *sent = call_renames_assign(ren, calls); /* ids an older Parley stored twice */
    const json_t *thinking = msg_provider_data(m, "anthropic", "thinking");
    /* Thinking goes back unchanged, first, within the tool turn that made it. */
    if (current_turn && json_array_size(calls) > 0 && json_is_array(thinking))
        codec_extend(blocks, (json_t *)thinking);
    char *text = codec_text(json_object_get(m, "content"));
    if (text && *text)
        codec_append(blocks, text_block(text));
    free(text);
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        const char *id = sent ? json_string_value(json_array_get(sent, i)) : msg_str(call, "id");
        const char *name = msg_str(json_object_get(call, "function"), "name");
        codec_append(blocks,
                     json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", id ? id : "", "name",
                               name ? name : "", "input", msg_arguments_object(call)));
    }
    json_decref(sent);
    if (json_array_size(blocks) == 0) /* the API refuses empty text */
        codec_append(blocks, text_block("(no answer)"));
    return blocks;
}

static json_t *tool_result_block(const json_t *m, call_renames *ren)
{
    const char *id = call_renames_result(ren, msg_str(m, "tool_call_id"));
    char *content = codec_text(json_object_get(m, "content"));
    json_t *b = json_pack("{s:s,s:s,s:s}", "type", "tool_result", "tool_use_id", id ? id : "",
                          "content", content ? content : "");
    free(content);
    if (json_is_true(json_object_get(m, "is_error")))
        codec_set(b, "is_error", json_true());
    return b;
}

/* A user message's images (content parts, docs/history.md) as image blocks: base64 for a
   data: URL, a url source for an http(s) one. */
static void append_image_blocks(json_t *blocks, const json_t *content)
{
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const char *url = msg_image_url(part), *mime, *data;
        size_t mime_len;
        if (!url)
            continue;
        json_t *source = image_data_url_split(url, &mime, &mime_len, &data) == 0
                             ? json_pack("{s:s,s:s%,s:s}", "type", "base64", "media_type", mime,
                                         mime_len, "data", data)
                             : json_pack("{s:s,s:s}", "type", "url", "url", url);
        codec_append(blocks, json_pack("{s:s,s:o}", "type", "image", "source", source));
    }
}

/*
 * A system message inside the history (append_message with role "system": a
 * note such as "the washing machine has finished"): Messages has no system
 * role in `messages`, so it goes where it happened, as a user text block
 * marked as a note.  Not into the top-level `system`: that would lose its
 * place among the turns and change the cached prompt prefix with every note.
 */
static json_t *system_note_blocks(const json_t *m)
{
    char *text = codec_text(json_object_get(m, "content"));
    char *note = text ? pstr_printf("[system note] %s", text) : NULL;
    json_t *blocks = json_array();
    codec_append(blocks, text_block(note)); /* NULL: not a block, a failed append */
    free(note);
    free(text);
    return blocks;
}

/* The last content block of the last message in out, or NULL. */
static json_t *last_block(json_t *out)
{
    json_t *content = json_object_get(json_array_get(out, json_array_size(out) - 1), "content");
    return json_array_get(content, json_array_size(content) - 1);
}

/*
 * Cache breakpoints (https://platform.claude.com/docs/en/build-with-claude/prompt-caching):
 * the cache keeps prefixes -- tools, system, messages, in that order -- up to and
 * including a block marked cache_control; a request reads the longest prefix
 * cached before, found at one of its marks or at a block boundary at most 20
 * blocks before one ("lookback"); a request may carry at most 4 marks; a prefix
 * shorter than the model's minimum (1024-4096 tokens) is not cached, and the
 * mark costs nothing.  Besides the system prompt's and the tools' marks, a
 * request marks, within the `slots` left:
 *   - the last block of the turn's user message, before the turn note: what the
 *     next turn repeats (the note is not stored).  On a turn's first request
 *     without a note that is the request's last block, as in Anthropic's own
 *     multi-turn example (the final user message marked);
 *   - on a later request of the turn (a tool round, the summary made ahead):
 *     its last block, which the next round repeats whole;
 *   - where the request should read from -- the end of the turn's previous
 *     request, or the previous turn's user message -- when that lies more than
 *     CACHE_LOOKBACK blocks before the marks above (a round of many tool calls),
 *     so that the lookback never misses it;
 *   - with a slot left, the turn note on the turn's first request (its tool
 *     rounds repeat it).
 */
#define CACHE_MARKS    4  /* the API's limit per request */
#define CACHE_LOOKBACK 16 /* blocks: a margin under the documented "about 20" */

typedef struct cache_points {
    json_t *user;   /* the turn's user message's last block (before the note) */
    size_t user_at; /* its position (blocks of the messages, from 1) */
    json_t *note;   /* the turn note's block */
    json_t *prev;   /* the last block before this turn's latest assistant message: where
                        the turn's previous request ended */
    size_t prev_at;
    json_t *before; /* the previous turn's user message's last block */
    size_t before_at;
} cache_points;

/* Mark a block (once); 1 when it took a mark. */
static int mark(json_t *block)
{
    if (!block || json_object_get(block, "cache_control"))
        return 0;
    codec_set(block, "cache_control", json_pack("{s:s}", "type", "ephemeral"));
    return 1;
}

static void place_marks(json_t *out, const cache_points *c, size_t nblocks, int slots)
{
    json_t *last = last_block(out);
    if (c->prev) { /* a later request of the turn */
        int used = mark(last);
        if (nblocks - c->prev_at > CACHE_LOOKBACK && used < slots)
            mark(c->prev);
        return;
    }
    json_t *user = c->user ? c->user : last;
    size_t user_at = c->user ? c->user_at : nblocks;
    int used = mark(user);
    if (c->before && user_at - c->before_at > CACHE_LOOKBACK && used < slots)
        used += mark(c->before);
    if (c->note && used < slots)
        mark(c->note);
}

/* The user message's blocks (text first, then images). */
static json_t *user_blocks(const json_t *m)
{
    const json_t *content = json_object_get(m, "content");
    char *text = codec_text(content);
    json_t *blocks = json_array();
    append_image_blocks(blocks, content);
    if (text && (*text || !json_array_size(blocks))) /* no empty text block */
        codec_insert(blocks, 0, text_block(text));
    free(text);
    return blocks;
}

static json_t *render_messages(const provider_request *r, int slots)
{
    json_t *out = json_array();
    const json_t *lists[] = {r->history, r->messages};
    call_renames ren = {NULL, NULL};
    cache_points c = {0};
    size_t nblocks = 0;
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        const json_t *m;
        json_array_foreach(lists[l], i, m) {
            const char *role = msg_role(m);
            if (strcmp(role, "tool") != 0 && strcmp(role, "assistant") != 0)
                call_renames_free(&ren); /* results follow their calls directly */
            json_t *blocks = NULL;
            const char *as = "user";
            if (strcmp(role, "assistant") == 0) {
                if (l == 1) { /* the turn's previous request ended here */
                    c.prev = last_block(out);
                    c.prev_at = nblocks;
                }
                blocks = assistant_blocks(m, l == 1, &ren);
                as = "assistant";
            } else if (strcmp(role, "tool") == 0) {
                blocks = json_array();
                codec_append(blocks, tool_result_block(m, &ren));
            } else if (strcmp(role, "user") == 0) {
                blocks = user_blocks(m);
            } else if (strcmp(role, "system") == 0) {
                blocks = system_note_blocks(m);
            } else {
                continue;
            }
            nblocks += json_array_size(blocks);
            push_message(out, as, blocks);
            if (strcmp(role, "user") != 0)
                continue;
            if (l == 0) {
                c.before = last_block(out);
                c.before_at = nblocks;
            } else if (!c.user) { /* the turn's own user message, then the note */
                c.user = last_block(out);
                c.user_at = nblocks;
                if (r->turn_note && *r->turn_note) {
                    json_t *note = json_array();
                    codec_append(note, text_block(r->turn_note));
                    nblocks++;
                    push_message(out, "user", note);
                    c.note = last_block(out);
                }
            }
        }
    }
    /* The API wants the user first: history that opens with an appended
       announcement gets a marker before it. */
    json_t *first = json_array_get(out, 0);
    if (first && strcmp(msg_role(first), "assistant") == 0) {
        json_t *blocks = json_array();
        codec_append(blocks, text_block(CONVERSATION_START));
        codec_insert(out, 0, json_pack("{s:s,s:o}", "role", "user", "content", blocks));
    }
    if (slots > 0 && json_array_size(out))
        place_marks(out, &c, nblocks, slots);
    call_renames_free(&ren);
    return out;
}

static json_t *render_tools(const char *tools_json, int cache)
{
    json_t *in = json_loads(tools_json, 0, NULL), *out = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(in, i, t) {
        const json_t *fn = json_object_get(t, "function");
        json_t *tool = json_pack("{s:O}", "name", json_object_get(fn, "name"));
        if (json_object_get(fn, "description"))
            codec_set(tool, "description", json_incref(json_object_get(fn, "description")));
        codec_set(tool, "input_schema", json_incref(json_object_get(fn, "parameters")));
        codec_append(out, tool);
    }
    json_decref(in);
    /* A breakpoint on the last tool caches the whole tool list. */
    if (cache && json_array_size(out) > 0)
        codec_set(json_array_get(out, json_array_size(out) - 1), "cache_control",
                  json_pack("{s:s}", "type", "ephemeral"));
    return out;
}

/*
 * The system prompt as text blocks.  With prompt caching, the agent's own
 * prompt (the same every turn) is one block with the cache breakpoint, and a
 * turn's extra prompt another after it, so a changing extra prompt does not
 * spoil the cached prefix.
 */
static json_t *render_system(const provider_request *r, int cache)
{
    json_t *sys = json_array();
    size_t len = strlen(r->system), fixed = r->system_fixed_len;
    int split = cache && fixed > 0 && fixed + 2 < len;
    json_t *first = split ? json_pack("{s:s,s:s%}", "type", "text", "text", r->system, fixed)
                          : text_block(r->system);
    if (cache)
        codec_set(first, "cache_control", json_pack("{s:s}", "type", "ephemeral"));
    codec_append(sys, first);
    if (split) /* past the "\n\n" that joins them */
        codec_append(sys, text_block(r->system + fixed + 2));
    return sys;
}

/*
 * Structured output.  Every Claude model answers through a forced tool whose
 * input_schema is the host's schema (the answer is that tool's input); the
 * turn takes the call by its name as the answer.  Extended thinking allows
 * no forced tool, so with thinking the schema goes in output_config.format
 * (structured outputs) instead.
 */
static json_t *response_tool(const response_format *rf)
{
    json_t *schema = rf->schema ? json_incref(rf->schema) : json_pack("{s:s}", "type", "object");
    return json_pack("{s:s,s:s,s:o}", "name", rf->name, "description",
                     rf->description ? rf->description
                                     : "Give your answer by calling this tool: its input is "
                                       "the answer",
                     "input_schema", schema);
}

static json_t *output_config(const response_format *rf)
{
    json_t *schema = rf->schema ? json_incref(rf->schema) : json_pack("{s:s}", "type", "object");
    return json_pack("{s:{s:s,s:o}}", "format", "type", "json_schema", "schema", schema);
}

/*
 * tool_choice: "none" on the last round (forced: the answer tool itself);
 * with a forced answer tool beside the host's tools, "any" (some tool: the
 * host's, or the answer); else the tool_choice option's ("required" is
 * "any"); NULL for auto.
 */
static json_t *tool_choice(const provider_request *r, int host_tools, int forced)
{
    if (forced && (r->tool_choice_none || !host_tools))
        return json_pack("{s:s,s:s}", "type", "tool", "name", r->response_format->name);
    if (r->tool_choice_none)
        return json_pack("{s:s}", "type", "none");
    if (forced || (r->tool_choice && strcmp(r->tool_choice, "required") == 0))
        return json_pack("{s:s}", "type", "any");
    if (r->tool_choice)
        return json_pack("{s:s,s:s}", "type", "tool", "name", r->tool_choice);
    return NULL;
}

/* max_tokens is required; with thinking it must exceed the thinking budget. */
static long long max_tokens(const parley_options *o)
{
    if (o->max_tokens > 0)
        return o->max_tokens;
    return o->thinking_budget_tokens > 0 ? o->thinking_budget_tokens + 1024
                                         : provider_anthropic.default_max_tokens;
}

static int anthropic_encode(pbuf *out, const parley_options *o, const provider_request *r,
                            char **err)
{
    codec_build_begin();
    json_t *body = json_pack("{s:s,s:I}", "model", o->model, "max_tokens",
                             (json_int_t)max_tokens(o));
    if (r->system && *r->system)
        codec_set(body, "system", render_system(r, o->prompt_cache));
    int host_tools = strcmp(r->tools_json, "[]") != 0;
    /* the marks left for the messages: the system prompt and the tools have theirs */
    int slots = o->prompt_cache ? CACHE_MARKS - (r->system && *r->system) - host_tools : 0;
    codec_set(body, "messages", render_messages(r, slots));
    int forced = r->response_format && o->thinking_budget_tokens <= 0;
    if (host_tools || forced) {
        json_t *tools = render_tools(r->tools_json, o->prompt_cache);
        if (forced) /* after the cache breakpoint: the tools before it stay cached */
            codec_append(tools, response_tool(r->response_format));
        codec_set(body, "tools", tools);
        json_t *choice = tool_choice(r, host_tools, forced);
        if (choice || forced || r->tool_choice_none || r->tool_choice) /* NULL: auto, or OOM */
            codec_set(body, "tool_choice", choice);
    }
    if (r->response_format && !forced) /* thinking allows no forced tool: output_config */
        codec_set(body, "output_config", output_config(r->response_format));
    if (o->stream)
        codec_set(body, "stream", json_true());
    if (o->temperature >= 0)
        codec_set(body, "temperature", json_real(o->temperature));
    if (o->top_p >= 0)
        codec_set(body, "top_p", json_real(o->top_p));
    if (o->thinking_budget_tokens > 0)
        codec_set(body, "thinking",
                  json_pack("{s:s,s:I}", "type", "enabled", "budget_tokens",
                            (json_int_t)o->thinking_budget_tokens));
    return codec_body_text(out, body, o, err);
}

/* ---- reply ---- */

static const char *neutral_stop_reason(const char *r)
{
    static const char *const map[][2] = {{"end_turn", "stop"},       {"stop_sequence", "stop"},
                                         {"max_tokens", "length"},   {"tool_use", "tool_calls"},
                                         {"refusal", "refusal"},     {"pause_turn", "pause_turn"},
                                         {"model_context_window_exceeded", "length"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(r, map[i][0]) == 0)
            return map[i][1];
    return r;
}

/* "prompt" counts every input token, cached or not; Anthropic counts them apart. */
static void read_usage(const json_t *u, llm_usage *out)
{
    if (!json_is_object(u))
        return;
    if (json_object_get(u, "input_tokens")) {
        out->cache_read = codec_count(u, "cache_read_input_tokens");
        out->cache_creation = codec_count(u, "cache_creation_input_tokens");
        out->prompt = codec_count(u, "input_tokens") + out->cache_read + out->cache_creation;
    }
    if (json_object_get(u, "output_tokens"))
        out->completion = codec_count(u, "output_tokens"); /* cumulative in message_delta */
}

static char *error_message(const json_t *root)
{
    const char *m = msg_str(json_object_get(root, "error"), "message");
    return m ? llm_clean_text(m, strlen(m)) : NULL;
}

static int fail_error_event(const json_t *root, char **err)
{
    char *m = error_message(root);
    const char *type = msg_str(json_object_get(root, "error"), "type");
    *err = pstr_printf("server returned an error: %s%s%s%s", type ? type : "",
                       type && m ? ": " : "", m ? m : "", !type && !m ? "(no message)" : "");
    free(m);
    return -1;
}

/* The reply being built, block by block: the same for a whole body and a stream. */
typedef struct block {
    char *type;       /* "text", "thinking", "redacted_thinking", "tool_use", other */
    char *id, *name;  /* tool_use */
    pbuf text;        /* text, thinking, or the tool_use input JSON */
    pbuf signature;   /* thinking */
    json_t *data;     /* redacted_thinking: the block as given; tool_use: parsed input */
    int stopped;
} block;

typedef struct builder {
    block *blocks;
    size_t n;
    size_t ncalls;    /* tool_use blocks started */
    char *stop_reason;
    llm_usage usage;
} builder;

static void builder_free(builder *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->blocks[i].type);
        free(b->blocks[i].id);
        free(b->blocks[i].name);
        pbuf_free(&b->blocks[i].text);
        pbuf_free(&b->blocks[i].signature);
        json_decref(b->blocks[i].data);
    }
    free(b->blocks);
    free(b->stop_reason);
    memset(b, 0, sizeof *b);
}

/* Open block `index` from its content_block (start event, or a whole body's block). */
static int block_start(builder *b, size_t index, const json_t *cb, char **err)
{
    if (index >= MAX_BLOCKS)
        return (*err = pstr_printf("content block index %zu is out of range", index)), -1;
    if (!json_is_object(cb))
        return (*err = pstr_printf("content block %zu is %s, not an object", index,
                                   llm_json_type_name(cb))), -1;
    const char *type = msg_str(cb, "type");
    if (!type)
        return (*err = pstr_printf("content block %zu has no type", index)), -1;
    if (index >= b->n) {
        block *more = realloc(b->blocks, (index + 1) * sizeof *more);
        if (!more)
            return codec_oom(err);
        memset(more + b->n, 0, (index + 1 - b->n) * sizeof *more);
        b->blocks = more;
        b->n = index + 1;
    }
    block *k = &b->blocks[index];
    if (k->type)
        return (*err = pstr_printf("content block %zu started twice", index)), -1;
    if (strcmp(type, "tool_use") == 0 && b->ncalls++ == LLM_MAX_TOOL_CALLS)
        return llm_too_many_calls(err);
    if (!(k->type = strdup(type)))
        return codec_oom(err);
    if (strcmp(type, "tool_use") == 0) {
        const char *id = msg_str(cb, "id"), *name = msg_str(cb, "name");
        if (!name)
            return (*err = pstr_printf("tool_use block %zu has no name", index)), -1;
        if (!(k->name = strdup(name)) || (id && !(k->id = strdup(id))))
            return codec_oom(err);
    } else if (strcmp(type, "redacted_thinking") == 0 && !(k->data = json_deep_copy(cb))) {
        return codec_oom(err);
    }
    return 0;
}

static block *open_block(builder *b, const json_t *index, char **err)
{
    json_int_t i = json_is_integer(index) ? json_integer_value(index) : -1;
    if (i < 0 || (size_t)i >= b->n || !b->blocks[i].type || b->blocks[i].stopped) {
        *err = pstr_printf("event for content block %lld, which is not open", (long long)i);
        return NULL;
    }
    return &b->blocks[i];
}

/* A tool_use block ended: its joined input_json pieces must be a JSON object. */
static int block_stop(block *k, size_t index, char **err)
{
    k->stopped = 1;
    if (strcmp(k->type, "tool_use") != 0 || k->data)
        return 0;
    if (k->text.oom)
        return codec_oom(err);
    json_error_t jerr;
    k->data = k->text.len ? json_loadb(k->text.data, k->text.len, 0, &jerr) : json_object();
    if (!json_is_object(k->data))
        return (*err = pstr_printf("tool_use block %zu input is not a JSON object", index)), -1;
    return 0;
}

static int build_reply(builder *b, llm_reply *out, char **err)
{
    pbuf text = PBUF_INIT, reasoning = PBUF_INIT;
    json_t *thinking = json_array();
    size_t ncalls = 0;
    for (size_t i = 0; i < b->n; i++)
        ncalls += b->blocks[i].type && strcmp(b->blocks[i].type, "tool_use") == 0;
    int rc = 0;
    if (!thinking || (ncalls && !(out->calls = calloc(ncalls, sizeof *out->calls))))
        rc = codec_oom(err);
    for (size_t i = 0; rc == 0 && i < b->n; i++) {
        block *k = &b->blocks[i];
        if (!k->type)
            continue;
        if (k->text.oom || k->signature.oom) { /* not a shorter text, nor no signature */
            rc = codec_oom(err);
        } else if (strcmp(k->type, "text") == 0) {
            pbuf_append(&text, k->text.data ? k->text.data : "", k->text.len);
        } else if (strcmp(k->type, "thinking") == 0) {
            pbuf_append(&reasoning, k->text.data ? k->text.data : "", k->text.len);
            if (json_array_append_new(
                    thinking,
                    json_pack("{s:s,s:s%,s:s%}", "type", "thinking", "thinking",
                              k->text.data ? k->text.data : "", k->text.len, "signature",
                              k->signature.data ? k->signature.data : "", k->signature.len)) != 0)
                rc = codec_oom(err); /* the block goes back to the API whole, or not at all */
        } else if (strcmp(k->type, "redacted_thinking") == 0 && k->data) {
            if (json_array_append(thinking, k->data) != 0)
                rc = codec_oom(err);
        } else if (strcmp(k->type, "tool_use") == 0) {
            if (!k->data && block_stop(k, i, err) != 0) {
                rc = -1;
                break;
            }
            char *args = llm_arguments_text(k->data);
            rc = args ? llm_fill_call(&out->calls[out->ncalls], out->ncalls, k->id, k->name,
                                      args, err)
                      : codec_oom(err);
            out->ncalls++;
            free(args);
        }
    }
    if (rc == 0 && (text.oom || reasoning.oom))
        rc = codec_oom(err);
    if (rc == 0)
        rc = llm_set_content(out, &text, err);
    if (rc == 0 && reasoning.len && !(out->reasoning = pbuf_take(&reasoning)))
        rc = codec_oom(err);
    if (rc == 0 && json_array_size(thinking) > 0) {
        json_t *pd = json_pack("{s:{s:O}}", "anthropic", "thinking", thinking);
        out->provider_data = pd ? json_dumps_whole(pd, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(pd);
        if (!out->provider_data)
            rc = codec_oom(err);
    }
    if (rc == 0 && b->stop_reason &&
        !(out->finish_reason = strdup(neutral_stop_reason(b->stop_reason))))
        rc = codec_oom(err);
    out->context_full = b->stop_reason && strcmp(b->stop_reason, "model_context_window_exceeded") == 0;
    out->usage = b->usage;
    json_decref(thinking);
    pbuf_free(&text);
    pbuf_free(&reasoning);
    if (rc != 0)
        llm_reply_free(out);
    return rc;
}

static int anthropic_decode(const char *body, size_t len, llm_reply *out, char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        *err = pstr_printf("response is not a JSON object: %s", root ? "" : utf8_mend(jerr.text));
        return -1;
    }
    builder b;
    memset(&b, 0, sizeof b);
    int rc = 0;
    const char *type = msg_str(root, "type");
    const json_t *content = json_object_get(root, "content");
    if (type && strcmp(type, "error") == 0)
        rc = fail_error_event(root, err);
    else if (!json_is_array(content))
        rc = ((*err = pstr_printf("response has no content array")), -1);
    size_t i;
    const json_t *cb;
    if (rc == 0)
        json_array_foreach(content, i, cb) {
            if ((rc = block_start(&b, i, cb, err)) != 0)
                break;
            block *k = &b.blocks[i];
            const char *field = strcmp(k->type, "text") == 0       ? "text"
                                : strcmp(k->type, "thinking") == 0 ? "thinking"
                                                                   : NULL;
            const char *s = field ? msg_str(cb, field) : NULL;
            if (s)
                pbuf_puts(&k->text, s);
            if (strcmp(k->type, "thinking") == 0 && msg_str(cb, "signature"))
                pbuf_puts(&k->signature, msg_str(cb, "signature"));
            if (strcmp(k->type, "tool_use") == 0) {
                const json_t *input = json_object_get(cb, "input");
                if (!json_is_object(input) && input) {
                    rc = ((*err = pstr_printf("tool_use block %zu input is not an object", i)), -1);
                    break;
                }
                k->data = input ? json_deep_copy(input) : json_object();
                if (!k->data) { /* not a call without arguments */
                    rc = codec_oom(err);
                    break;
                }
            }
            k->stopped = 1;
        }
    const char *stop = msg_str(root, "stop_reason");
    if (rc == 0 && stop && !(b.stop_reason = strdup(stop)))
        rc = codec_oom(err);
    read_usage(json_object_get(root, "usage"), &b.usage);
    if (rc == 0)
        rc = build_reply(&b, out, err);
    builder_free(&b);
    json_decref(root);
    return rc;
}

/* ---- stream ---- */

typedef struct anthropic_stream {
    sse_parser sse;
    llm_sink sink;
    builder b;
    int started, stopped;   /* message_start / message_stop seen */
    codec_stream_state st;
} anthropic_stream;

static int on_delta(anthropic_stream *s, const json_t *ev, char **err)
{
    block *k = open_block(&s->b, json_object_get(ev, "index"), err);
    if (!k)
        return -1;
    const json_t *d = json_object_get(ev, "delta");
    const char *type = msg_str(d, "type");
    if (!type)
        return (*err = pstr_printf("content_block_delta without a delta type")), -1;
    /* Each delta type belongs to one block type: a mismatch would put text where it
       does not belong (reasoning into the answer, or the reverse). */
    static const struct { const char *delta, *field, *block; } kinds[] = {
        {"text_delta", "text", "text"},
        {"thinking_delta", "thinking", "thinking"},
        {"signature_delta", "signature", "thinking"},
        {"input_json_delta", "partial_json", "tool_use"},
    };
    size_t kind = 0;
    while (kind < sizeof kinds / sizeof kinds[0] && strcmp(type, kinds[kind].delta) != 0)
        kind++;
    if (kind == sizeof kinds / sizeof kinds[0])
        return 0; /* a delta type newer than this decoder */
    if (strcmp(k->type, kinds[kind].block) != 0)
        return (*err = pstr_printf("%s for a %s block", type, k->type)), -1;
    const char *piece = msg_str(d, kinds[kind].field);
    pbuf *dst = kind == 2 ? &k->signature : &k->text;
    llm_text_fn fn = kind == 0 ? s->sink.text : kind == 1 ? s->sink.reasoning : NULL;
    if (!piece)
        return (*err = pstr_printf("%s without its text", type)), -1;
    size_t n = strlen(piece);
    pbuf_append(dst, piece, n);
    if (dst->oom)
        return codec_oom(err);
    if (fn && n)
        fn(s->sink.ud, piece, n);
    return 0;
}

static int on_event(void *ud, const char *data, size_t len, char **err)
{
    anthropic_stream *s = ud;
    json_error_t jerr;
    json_t *ev = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(ev)) {
        json_decref(ev);
        *err = pstr_printf("stream event is not a JSON object%s%s", ev ? "" : ": ",
                           ev ? "" : utf8_mend(jerr.text));
        return -1;
    }
    const char *type = msg_str(ev, "type");
    int rc = 0;
    if (!type) {
        rc = ((*err = pstr_printf("stream event without a type")), -1);
    } else if (strcmp(type, "error") == 0) {
        rc = fail_error_event(ev, err);
    } else if (strcmp(type, "message_start") == 0) {
        s->started = 1;
        read_usage(json_object_get(json_object_get(ev, "message"), "usage"), &s->b.usage);
    } else if (!s->started && strcmp(type, "ping") != 0) {
        rc = ((*err = pstr_printf("stream event %s before message_start", type)), -1);
    } else if (strcmp(type, "content_block_start") == 0) {
        const json_t *idx = json_object_get(ev, "index");
        rc = block_start(&s->b, json_is_integer(idx) ? (size_t)json_integer_value(idx) : MAX_BLOCKS,
                         json_object_get(ev, "content_block"), err);
    } else if (strcmp(type, "content_block_delta") == 0) {
        rc = on_delta(s, ev, err);
    } else if (strcmp(type, "content_block_stop") == 0) {
        const json_t *idx = json_object_get(ev, "index");
        block *k = open_block(&s->b, idx, err);
        rc = k ? block_stop(k, (size_t)json_integer_value(idx), err) : -1;
    } else if (strcmp(type, "message_delta") == 0) {
        const char *stop = msg_str(json_object_get(ev, "delta"), "stop_reason");
        if (stop) {
            free(s->b.stop_reason);
            if (!(s->b.stop_reason = strdup(stop)))
                rc = codec_oom(err);
        }
        read_usage(json_object_get(ev, "usage"), &s->b.usage);
    } else if (strcmp(type, "message_stop") == 0) {
        s->stopped = 1;
        rc = 1; /* the rest of the body is ignored */
    } /* ping, and event types newer than this decoder, carry nothing for us */
    json_decref(ev);
    return rc;
}

static void *anthropic_stream_new(const llm_sink *sink)
{
    anthropic_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    sse_init(&s->sse, MAX_SSE_SIZE, on_event, s);
    s->sink = *sink;
    return s;
}

static int anthropic_stream_feed(void *v, const char *data, size_t len, char **err)
{
    anthropic_stream *s = v;
    if (codec_stream_dead(&s->st, 0, err) != 0)
        return -1;
    if (s->stopped || len == 0)
        return 0;
    char *msg = NULL;
    if (sse_feed(&s->sse, data, len, &msg) < 0)
        return codec_stream_die(&s->st, msg, err);
    return 0;
}

static int anthropic_stream_finish(void *v, llm_reply *out, char **err)
{
    anthropic_stream *s = v;
    memset(out, 0, sizeof *out);
    if (codec_stream_dead(&s->st, 1, err) != 0)
        return -1;
    char *msg = NULL;
    if (!s->stopped && !sse_has_partial_line(&s->sse) && sse_flush(&s->sse, &msg) < 0)
        return codec_stream_die(&s->st, msg, err);
    if (!s->stopped)
        return codec_stream_die(&s->st, pstr_printf("stream ended before message_stop"), err);
    if (build_reply(&s->b, out, &msg) != 0)
        return codec_stream_die(&s->st, msg, err);
    return 0;
}

static int anthropic_stream_done(const void *v) { return ((const anthropic_stream *)v)->stopped; }

static void anthropic_stream_free(void *v)
{
    anthropic_stream *s = v;
    if (!s)
        return;
    sse_free(&s->sse);
    builder_free(&s->b);
    free(s->st.error);
    free(s);
}

/* Extended thinking needs its budget below max_tokens and refuses a set temperature or
   top_p (the Messages API answers 400).  The other APIs have no thinking budget: they ignore
   thinking_budget_tokens, so these rules are Anthropic's alone. */
static parley_status anthropic_check_options(const parley_options *o, char **err)
{
    if (o->thinking_budget_tokens > 0 && o->max_tokens > 0 &&
        o->thinking_budget_tokens >= o->max_tokens) {
        *err = pstr_printf("option 'thinking_budget_tokens': must be less than max_tokens (%lld)",
                           (long long)o->max_tokens);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (o->thinking_budget_tokens > 0 && (o->temperature >= 0 || o->top_p >= 0)) {
        *err = pstr_printf("option '%s': Anthropic's extended thinking (thinking_budget_tokens) "
                           "does not allow it; leave it null", o->temperature >= 0 ? "temperature"
                                                                                 : "top_p");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    const char *c = o->tool_choice;
    if (o->thinking_budget_tokens > 0 && strcmp(c, "auto") != 0 && strcmp(c, "none") != 0) {
        *err = pstr_printf("option 'tool_choice': Anthropic's extended thinking "
                           "(thinking_budget_tokens) allows only \"auto\" or \"none\"");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    return PARLEY_OK;
}

/* Claude's models have a 200k-token window; the Messages API does not say it (no
   ask_window). */
static long long anthropic_default_window(const parley_options *o)
{
    (void)o;
    return 200000;
}

const provider provider_anthropic = {
    .name = "anthropic",
    .images_by_url = 1,
    .default_base_url = "https://api.anthropic.com",
    .path = "/v1/messages",
    .models_path = "/v1/models",
    .not_found_hint = "the Messages API is <base_url>/v1/messages, base_url https://api.anthropic.com without /v1",
    .stream_accept = "Accept: text/event-stream",
    .default_max_tokens = 1024,
    .headers = anthropic_headers,
    .encode = anthropic_encode,
    .decode = anthropic_decode,
    .stream_new = anthropic_stream_new,
    .stream_feed = anthropic_stream_feed,
    .stream_finish = anthropic_stream_finish,
    .stream_free = anthropic_stream_free,
    .stream_done = anthropic_stream_done,
    .error_text = llm_error_text, /* {"type":"error","error":{"type","message"}} */
    .retryable = provider_retryable_default, /* 529 overloaded_error is a 5xx */
    .check_options = anthropic_check_options,
    .summary = "Messages API",
    .default_window = anthropic_default_window,
};
