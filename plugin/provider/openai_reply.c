/*
 * openai_reply.c -- OpenAI's whole (non-streamed) Chat Completions reply
 * decoded (openai_decode.h): a one-pass fast path over the usual shape, and
 * jansson, which decides everything else and words every error.  The pieces
 * it reads members with are openai_stream.c's too, so both read a member alike.
 */
#include "provider/openai_decode.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_scan.h"
#include "provider/codec.h"

/* ------------------------------------------------------------------ */
/* Pieces both decoders share                                          */
/* ------------------------------------------------------------------ */

/* Append the text parts of an array content ([{"type":"text","text":..}]);
   parts of other types (images, ...) carry no text for us. */
static int append_text_parts(pbuf *text, const json_t *parts, const char *what, char **err)
{
    size_t i;
    const json_t *part;
    json_array_foreach(parts, i, part) {
        if (!json_is_object(part))
            return codec_fail(err, "%s part %zu is %s, not an object", what, i,
                              llm_json_type_name(part));
        const char *type, *part_text;
        if (codec_optional_string(part, "type", what, &type, err) != 0)
            return -1;
        if (type && strcmp(type, "text") != 0)
            continue;
        if (codec_optional_string(part, "text", what, &part_text, err) != 0)
            return -1;
        if (!part_text)
            return codec_fail(err, "%s part %zu has no text", what, i);
        pbuf_append(text, part_text, strlen(part_text));
    }
    return 0;
}

/* Append a message's (or a delta's) content: a string, null, or text parts. */
int openai_append_content(pbuf *text, const json_t *content, const char *what, char **err)
{
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content))
        pbuf_append(text, json_string_value(content), json_string_length(content));
    else if (json_is_array(content)) {
        if (append_text_parts(text, content, what, err) != 0)
            return -1;
    } else
        return codec_fail(err, "%s is %s, expected a string", what, llm_json_type_name(content));
    return text->oom ? codec_oom(err) : 0;
}

/* Append a call's arguments: a string (or a piece of one) as is, an object
   serialised; absent adds nothing. */
int openai_append_arguments(pbuf *args, const json_t *value, const char *what, char **err)
{
    if (!value || json_is_null(value))
        return 0;
    if (json_is_string(value)) {
        pbuf_append(args, json_string_value(value), json_string_length(value));
    } else if (json_is_object(value)) {
        char *text = llm_arguments_text(value);
        if (!text)
            return codec_oom(err);
        pbuf_puts(args, text);
        free(text);
    } else {
        return codec_fail(err, "%s arguments is %s, expected a string or an object", what,
                          llm_json_type_name(value));
    }
    return args->oom ? codec_oom(err) : 0;
}

/* Keep the choice's finish_reason when it has one (a later chunk's wins). */
int openai_take_finish_reason(const json_t *choice, char **dst, const char *what, char **err)
{
    const char *reason;
    if (codec_optional_string(choice, "finish_reason", what, &reason, err) != 0)
        return -1;
    if (!reason)
        return 0;
    char *copy = strdup(reason);
    if (!copy)
        return codec_oom(err);
    free(*dst);
    *dst = copy;
    return 0;
}

/* ------------------------------------------------------------------ */
/* A whole (non-streamed) response                                     */
/* ------------------------------------------------------------------ */

static int decode_tool_call(const json_t *call, size_t i, llm_tool_call *dst, char **err)
{
    if (!json_is_object(call))
        return codec_fail(err, "response's tool call %zu is %s, not an object", i,
                          llm_json_type_name(call));
    const json_t *function = codec_member(call, "function");
    if (!json_is_object(function))
        return codec_fail(err, "response's tool call %zu has no function object", i);
    const char *id, *name;
    if (codec_optional_string(call, "id", "response's tool call", &id, err) != 0 ||
        codec_optional_string(function, "name", "response's tool call function", &name, err) != 0)
        return -1;
    if (!name)
        return codec_fail(err, "response's tool call %zu has no function name", i);
    pbuf args = PBUF_INIT;
    int rc = openai_append_arguments(&args, codec_member(function, "arguments"),
                                     "response's tool call", err);
    if (rc == 0)
        rc = codec_fill_call(dst, i, id, name, &args, err);
    pbuf_free(&args);
    return rc;
}

static int decode_tool_calls(const json_t *calls, llm_reply *out, char **err)
{
    if (!calls)
        return 0;
    if (!json_is_array(calls))
        return codec_fail(err, "response's tool_calls is %s, not an array",
                          llm_json_type_name(calls));
    size_t n = json_array_size(calls);
    if (n == 0)
        return 0;
    if (n > LLM_MAX_TOOL_CALLS)
        return llm_too_many_calls(err);
    out->calls = calloc(n, sizeof *out->calls);
    if (!out->calls)
        return codec_oom(err);
    out->ncalls = n; /* all zeroed, so llm_reply_free can clean up a partial decode */
    for (size_t i = 0; i < n; i++)
        if (decode_tool_call(json_array_get(calls, i), i, &out->calls[i], err) != 0)
            return -1;
    return 0;
}

const char *const openai_reasoning_fields[OPENAI_NREASONING] = {"reasoning_content", "reasoning"};

/* DeepSeek wants reasoning_content sent back with the tool calls it came with;
   remember that the server used that field. */
int openai_note_reasoning_field(llm_reply *out, const char *field, char **err)
{
    if (strcmp(field, "reasoning_content") != 0)
        return 0;
    out->provider_data = strdup("{\"openai\":{\"reasoning_field\":\"reasoning_content\"}}");
    return out->provider_data ? 0 : codec_oom(err);
}

static int decode_reasoning(const json_t *message, llm_reply *out, char **err)
{
    for (size_t i = 0; i < OPENAI_NREASONING; i++) {
        const char *text;
        if (codec_optional_string(message, openai_reasoning_fields[i], "response's message", &text,
                                  err) != 0)
            return -1;
        if (!text || !*text)
            continue;
        if (!(out->reasoning = strdup(text)))
            return codec_oom(err);
        return openai_note_reasoning_field(out, openai_reasoning_fields[i], err);
    }
    return 0;
}

/* usage of a response or of a stream chunk; anything malformed counts as absent. */
void openai_read_usage(const json_t *usage, llm_usage *u)
{
    if (!json_is_object(usage))
        return;
    u->prompt = codec_count(usage, "prompt_tokens");
    u->completion = codec_count(usage, "completion_tokens");
    u->cache_read = codec_count(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
    u->reasoning =
        codec_count(json_object_get(usage, "completion_tokens_details"), "reasoning_tokens");
}

/* llama.cpp's `timings` (non-streamed reply, or a stream's last chunk): what it
   evaluated and what it reused from the slot's cache.  Not an object: absent. */
void openai_read_timings(const json_t *timings, llm_usage *u)
{
    if (!json_is_object(timings))
        return;
    u->evaluated = codec_count(timings, "prompt_n");
    u->timings_cached = codec_count(timings, "cache_n");
}

static int decode_message(const json_t *message, llm_reply *out, char **err)
{
    pbuf text = PBUF_INIT;
    int rc = decode_reasoning(message, out, err);
    if (rc == 0)
        rc = openai_append_content(&text, codec_member(message, "content"),
                                   "response's message content", err);
    if (rc == 0)
        rc = decode_tool_calls(codec_member(message, "tool_calls"), out, err);
    if (rc == 0)
        rc = llm_set_content(out, &text, err);
    pbuf_free(&text);
    return rc;
}

static int decode_root(const json_t *root, llm_reply *out, char **err)
{
    if (!json_is_object(root))
        return codec_fail(err, "response is not a JSON object (it is %s)",
                          llm_json_type_name(root));
    if (codec_member(root, "error"))
        return codec_fail_server_error(root, err);
    const json_t *choices = codec_member(root, "choices");
    if (!choices)
        return codec_fail(err, "response has no choices");
    if (!json_is_array(choices))
        return codec_fail(err, "response's choices is %s, not an array",
                          llm_json_type_name(choices));
    if (json_array_size(choices) == 0)
        return codec_fail(err, "response has no choices (empty array)");
    const json_t *choice = json_array_get(choices, 0);
    if (!json_is_object(choice))
        return codec_fail(err, "response's choices[0] is %s, not an object",
                          llm_json_type_name(choice));
    const json_t *message = codec_member(choice, "message");
    if (!message)
        return codec_fail(err, "response's choices[0] has no message");
    if (!json_is_object(message))
        return codec_fail(err, "response's choices[0] message is %s, not an object",
                          llm_json_type_name(message));
    if (openai_take_finish_reason(choice, &out->finish_reason, "response's choices[0]", err) != 0)
        return -1;
    openai_read_usage(codec_member(root, "usage"), &out->usage);
    openai_read_timings(codec_member(root, "timings"), &out->usage);
    return decode_message(message, out, err);
}

int llm_reply_decode_jansson(const char *body, size_t len, llm_reply *out, char **err)
{
    memset(out, 0, sizeof *out);
    if (err)
        *err = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_DECODE_ANY, &jerr);
    if (!root)
        return codec_fail_not_json(err, "response", &jerr);
    int rc = decode_root(root, out, err);
    json_decref(root);
    if (rc != 0)
        llm_reply_free(out);
    return rc;
}

/* ------------------------------------------------------------------ */
/* A whole response: the fast path                                     */
/* ------------------------------------------------------------------ */

/*
 * One strict pass of json_scan over the usual shape, without building a
 * tree: the members decode_root reads are noted as spans of the body, every
 * other member is skipped (and still validated), and the reply's strings
 * are copied out at the end -- one allocation each.
 *
 * Whenever the body is not one this path reads exactly as decode_root does,
 * it answers "not mine" and llm_reply_decode runs the jansson decoder
 * instead, which stays the authority and the only author of error
 * messages.  So: anything that would fail to decode (an "error" member, a
 * member of the wrong type, no choices, a call without a name, ...), text
 * parts, arguments sent as an object, a repeated or escaped key among those
 * read, more than FAST_MAX_CALLS calls, and whatever json_scan bails on.
 */

#define FAST_MAX_CALLS 16

typedef struct fast_reply {
    jscan_str content, finish_reason;
    jscan_str reasoning[2]; /* by openai_reasoning_fields */
    int has_content, has_finish_reason, has_reasoning[2], has_message;
    fast_call calls[FAST_MAX_CALLS];
    size_t ncalls;
    llm_usage usage;
} fast_reply;

int openai_fast_object(jscan *s, const fast_key *keys, size_t nkeys, fast_member_fn on_member,
                       void *ctx)
{
    if (jscan_object_open(s) != 0)
        return -1;
    unsigned seen = 0;
    jscan_str key;
    int rc;
    while ((rc = jscan_object_next(s, &key)) == 1) {
        if (key.escaped)
            return -1; /* it might spell one of ours */
        size_t which = 0;
        while (which < nkeys && !jscan_str_is(&key, keys[which].name, keys[which].len))
            which++;
        if (which == nkeys) {
            if (jscan_skip(s) != 0)
                return -1;
            continue;
        }
        if (seen & (1u << which))
            return -1; /* jansson keeps the last one: let it */
        seen |= 1u << which;
        if (on_member(s, which, ctx) != 0)
            return -1;
    }
    return rc;
}

int openai_fast_optional_string(jscan *s, jscan_str *out, int *has)
{
    jscan_type t = jscan_peek(s);
    if (t == JSCAN_NULL)
        return jscan_skip(s);
    if (t != JSCAN_STRING)
        return -1;
    *has = 1;
    return jscan_string(s, out);
}

/* codec_count: a positive integer, else 0 (never an error). */
static int fast_usage_count(jscan *s, long long *out)
{
    jscan_num n;
    if (jscan_peek(s) != JSCAN_NUMBER)
        return jscan_skip(s);
    if (jscan_number(s, &n) != 0)
        return -1;
    *out = n.is_integer && n.integer > 0 ? n.integer : 0;
    return 0;
}

static int fast_count_member(jscan *s, size_t which, void *ctx)
{
    (void)which;
    return fast_usage_count(s, ctx);
}

/* {"cached_tokens": n} or {"reasoning_tokens": n}; anything but an object counts 0. */
static int fast_usage_details(jscan *s, const fast_key *key, long long *out)
{
    if (jscan_peek(s) != JSCAN_OBJECT)
        return jscan_skip(s);
    return openai_fast_object(s, key, 1, fast_count_member, out);
}

static const fast_key FAST_USAGE_KEYS[] = {FAST_KEY("prompt_tokens"), FAST_KEY("completion_tokens"),
                                           FAST_KEY("prompt_tokens_details"),
                                           FAST_KEY("completion_tokens_details")};
static const fast_key FAST_CACHED_KEY = FAST_KEY("cached_tokens");
static const fast_key FAST_REASONING_KEY = FAST_KEY("reasoning_tokens");

static int fast_usage_member(jscan *s, size_t which, void *ctx)
{
    llm_usage *u = ctx;
    switch (which) {
    case 0:
        return fast_usage_count(s, &u->prompt);
    case 1:
        return fast_usage_count(s, &u->completion);
    case 2:
        return fast_usage_details(s, &FAST_CACHED_KEY, &u->cache_read);
    default:
        return fast_usage_details(s, &FAST_REASONING_KEY, &u->reasoning);
    }
}

int openai_fast_usage(jscan *s, llm_usage *u)
{
    return openai_fast_object(s, FAST_USAGE_KEYS, 4, fast_usage_member, u);
}

static const fast_key FAST_TIMINGS_KEYS[] = {FAST_KEY("prompt_n"), FAST_KEY("cache_n")};

static int fast_timings_member(jscan *s, size_t which, void *ctx)
{
    llm_usage *u = ctx;
    return fast_usage_count(s, which == 0 ? &u->evaluated : &u->timings_cached);
}

int openai_fast_timings(jscan *s, llm_usage *u, int *has)
{
    if (jscan_peek(s) != JSCAN_OBJECT)
        return jscan_skip(s);
    *has = 1;
    return openai_fast_object(s, FAST_TIMINGS_KEYS, 2, fast_timings_member, u);
}

static const fast_key FAST_FUNCTION_KEYS[] = {FAST_KEY("name"), FAST_KEY("arguments")};

static int fast_function_member(jscan *s, size_t which, void *ctx)
{
    fast_call *c = ctx;
    if (which == 0)
        return openai_fast_optional_string(s, &c->name, &c->has_name);
    return openai_fast_optional_string(s, &c->arguments, &c->has_arguments);
}

int openai_fast_function(jscan *s, fast_call *c)
{
    return openai_fast_object(s, FAST_FUNCTION_KEYS, 2, fast_function_member, c);
}

static const fast_key FAST_CALL_KEYS[] = {FAST_KEY("id"), FAST_KEY("function")};

static int fast_call_member(jscan *s, size_t which, void *ctx)
{
    fast_call *c = ctx;
    if (which == 0)
        return openai_fast_optional_string(s, &c->id, &c->has_id);
    if (jscan_peek(s) != JSCAN_OBJECT)
        return -1;
    c->has_function = 1;
    return openai_fast_function(s, c);
}

static int fast_tool_calls(jscan *s, fast_reply *f)
{
    if (jscan_array_open(s) != 0)
        return -1;
    int rc;
    while ((rc = jscan_array_next(s)) == 1) {
        if (f->ncalls == FAST_MAX_CALLS || jscan_peek(s) != JSCAN_OBJECT)
            return -1;
        fast_call *c = &f->calls[f->ncalls++];
        if (openai_fast_object(s, FAST_CALL_KEYS, 2, fast_call_member, c) != 0 ||
            !c->has_function || !c->has_name)
            return -1;
    }
    return rc;
}

static const fast_key FAST_MESSAGE_KEYS[] = {FAST_KEY("content"), FAST_KEY("reasoning_content"),
                                             FAST_KEY("reasoning"), FAST_KEY("tool_calls")};

static int fast_message_member(jscan *s, size_t which, void *ctx)
{
    fast_reply *f = ctx;
    switch (which) {
    case 0:
        return openai_fast_optional_string(s, &f->content, &f->has_content);
    case 1:
        return openai_fast_optional_string(s, &f->reasoning[0], &f->has_reasoning[0]);
    case 2:
        return openai_fast_optional_string(s, &f->reasoning[1], &f->has_reasoning[1]);
    default:
        if (jscan_peek(s) == JSCAN_NULL)
            return jscan_skip(s);
        return fast_tool_calls(s, f);
    }
}

static const fast_key FAST_CHOICE_KEYS[] = {FAST_KEY("message"), FAST_KEY("finish_reason")};

static int fast_choice_member(jscan *s, size_t which, void *ctx)
{
    fast_reply *f = ctx;
    if (which == 1)
        return openai_fast_optional_string(s, &f->finish_reason, &f->has_finish_reason);
    if (jscan_peek(s) != JSCAN_OBJECT)
        return -1;
    f->has_message = 1;
    return openai_fast_object(s, FAST_MESSAGE_KEYS, 4, fast_message_member, f);
}

/* choices[0] is read, the others only validated. */
static int fast_choices(jscan *s, fast_reply *f)
{
    if (jscan_array_open(s) != 0 || jscan_array_next(s) != 1 || jscan_peek(s) != JSCAN_OBJECT ||
        openai_fast_object(s, FAST_CHOICE_KEYS, 2, fast_choice_member, f) != 0 || !f->has_message)
        return -1;
    int rc;
    while ((rc = jscan_array_next(s)) == 1)
        if (jscan_skip(s) != 0)
            return -1;
    return rc;
}

static const fast_key FAST_ROOT_KEYS[] = {FAST_KEY("choices"), FAST_KEY("usage"),
                                          FAST_KEY("timings"), FAST_KEY("error")};

static int fast_root_member(jscan *s, size_t which, void *ctx)
{
    fast_reply *f = ctx;
    switch (which) {
    case 0:
        return fast_choices(s, f);
    case 1:
        if (jscan_peek(s) != JSCAN_OBJECT)
            return jscan_skip(s); /* openai_read_usage ignores a usage that is no object */
        return openai_fast_usage(s, &f->usage);
    case 2: {
        int has = 0;
        return openai_fast_timings(s, &f->usage, &has);
    }
    default:
        return -1; /* an error member, even null: decode_root's call */
    }
}

/* The body's shape, read into *f: 0, or -1 (not mine). */
static int fast_scan(const char *body, size_t len, fast_reply *f)
{
    jscan s;
    jscan_init(&s, body, len);
    if (jscan_peek(&s) != JSCAN_OBJECT ||
        openai_fast_object(&s, FAST_ROOT_KEYS, 4, fast_root_member, f) != 0 || jscan_end(&s) != 0)
        return -1;
    return f->has_message ? 0 : -1; /* no choices: decode_root's error */
}

static int fast_dup(char **dst, const jscan_str *str)
{
    *dst = jscan_str_dup(str);
    return *dst ? 0 : -1;
}

/* The llm_reply decode_message and codec_fill_call make of the same members. */
static int fast_build(const fast_reply *f, llm_reply *out)
{
    for (size_t i = 0; i < OPENAI_NREASONING; i++) {
        if (!f->has_reasoning[i] || f->reasoning[i].len == 0)
            continue;
        if (fast_dup(&out->reasoning, &f->reasoning[i]) != 0 ||
            openai_note_reasoning_field(out, openai_reasoning_fields[i], NULL) != 0)
            return -1;
        break;
    }
    if (f->ncalls) {
        if (!(out->calls = calloc(f->ncalls, sizeof *out->calls)))
            return -1;
        out->ncalls = f->ncalls;
    }
    for (size_t i = 0; i < f->ncalls; i++) {
        const fast_call *c = &f->calls[i];
        llm_tool_call *dst = &out->calls[i];
        if (c->has_id && c->id.len > 0 ? fast_dup(&dst->id, &c->id) != 0
                                       : asprintf(&dst->id, "call_%zu", i) < 0)
            return -1;
        if (fast_dup(&dst->name, &c->name) != 0)
            return -1;
        dst->arguments =
            c->has_arguments && c->arguments.len > 0 ? jscan_str_dup(&c->arguments) : strdup("{}");
        if (!dst->arguments)
            return -1;
    }
    if (f->has_content && f->content.len > 0) {
        if (fast_dup(&out->content, &f->content) != 0)
            return -1;
    } else if (f->ncalls == 0 && !(out->content = strdup(""))) {
        return -1;
    }
    if (f->has_finish_reason && fast_dup(&out->finish_reason, &f->finish_reason) != 0)
        return -1;
    out->usage = f->usage;
    return 0;
}

int llm_reply_decode_fast(const char *body, size_t len, llm_reply *out)
{
    memset(out, 0, sizeof *out);
    if (!body)
        return 0;
    fast_reply f;
    memset(&f, 0, sizeof f);
    if (fast_scan(body, len, &f) != 0)
        return 0;
    if (fast_build(&f, out) != 0) { /* out of memory: the jansson path reports it */
        llm_reply_free(out);
        return 0;
    }
    return 1;
}

int llm_reply_decode(const char *body, size_t len, llm_reply *out, char **err)
{
    if (llm_reply_decode_fast(body, len, out)) {
        if (err)
            *err = NULL;
        return 0;
    }
    return llm_reply_decode_jansson(body, len, out, err);
}
