/*
 * openai_stream.c -- OpenAI's streamed Chat Completions reply decoded
 * (openai_decode.h): Server-Sent Events (sse.c) of chat.completion.chunk
 * objects, merged as they come into the llm_reply the same answer sent whole
 * would give (openai_reply.c reads the members for both).
 */
#include "provider/openai_decode.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_scan.h"
#include "provider/codec.h"
#include "provider/sse.h"

#define MAX_SSE_SIZE (8u << 20) /* one SSE line, or one event's data */

/* ------------------------------------------------------------------ */
/* A streamed response                                                 */
/* ------------------------------------------------------------------ */

typedef struct stream_call {
    size_t index;   /* the tool call index the deltas gave (or implied) */
    char *id;       /* the first non-empty id given */
    char *name;     /* the first name given (a non-empty one replaces an empty one) */
    pbuf arguments; /* every piece, concatenated */
} stream_call;

struct llm_stream {
    sse_parser sse;
    llm_text_fn on_text;
    llm_text_fn on_reasoning;
    void *ud;
    pbuf content;
    pbuf reasoning;
    const char *reasoning_field; /* the field the reasoning came in, once seen */
    llm_usage usage;
    stream_call *calls; /* the calls deltas named, by index ascending: gaps between indexes
                           take no room, so an index is any integer >= 0 and the number of
                           calls is bounded only by the stream's size, as a whole body's is */
    size_t nslots, slots_cap;
    size_t last_slot;  /* the slot the last tool call delta went to ... */
    int has_last_slot; /* ... if there was one */
    char *finish_reason;
    size_t events;         /* data events seen, to word the "ended early" error */
    int done;              /* [DONE] seen: the rest of the body is ignored */
    int jansson_only;      /* llm_stream_disable_fast_path: every chunk goes to jansson */
    size_t fast_chunks;    /* chunks the fast path applied (for the tests) */
    codec_stream_state st; /* finished, or failed and its error, repeated to later calls */
};

/* The slot holding call `index`, made when no delta named it before: 0, or -1 (out of
   memory, or one call too many).  Servers send indexes in order, so a new one is almost
   always appended. */
static int open_slot(llm_stream *s, size_t index, size_t *slot, char **err)
{
    size_t lo = 0, hi = s->nslots;
    if (hi && s->calls[hi - 1].index < index)
        lo = hi;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->calls[mid].index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    *slot = lo;
    if (lo < s->nslots && s->calls[lo].index == index)
        return 0;
    if (s->nslots == LLM_MAX_TOOL_CALLS)
        return llm_too_many_calls(err);
    if (s->nslots == s->slots_cap) {
        size_t cap = s->slots_cap ? s->slots_cap * 2 : 4;
        stream_call *calls = realloc(s->calls, cap * sizeof *calls);
        if (!calls)
            return codec_oom(err);
        s->calls = calls;
        s->slots_cap = cap;
    }
    memmove(&s->calls[lo + 1], &s->calls[lo], (s->nslots - lo) * sizeof *s->calls);
    memset(&s->calls[lo], 0, sizeof *s->calls);
    s->calls[lo].index = index;
    s->nslots++;
    if (s->has_last_slot && s->last_slot >= lo)
        s->last_slot++;
    return 0;
}

/*
 * The index of a delta without one.  Servers that omit it (Ollama before
 * 0.5, Gemini, ...) send each call whole, or continue the last call: a delta
 * continues the last call unless it contradicts it -- a known id names its
 * call, and a new id or a second name opens a new call (after the last one).
 */
static size_t implicit_index(const llm_stream *s, const char *id, const char *name)
{
    int has_id = id && *id, has_name = name && *name;
    if (has_id)
        for (size_t i = 0; i < s->nslots; i++)
            if (s->calls[i].id && strcmp(s->calls[i].id, id) == 0)
                return s->calls[i].index;
    size_t next = s->nslots ? s->calls[s->nslots - 1].index + 1 : 0;
    if (!s->has_last_slot)
        return next;
    const stream_call *last = &s->calls[s->last_slot];
    int new_id = has_id && last->id;
    int new_name = has_name && last->name && *last->name;
    return new_id || new_name ? next : last->index;
}

static int call_slot(llm_stream *s, const json_t *index, const char *id, const char *name,
                     size_t *slot, char **err)
{
    size_t at;
    if (!index) {
        at = implicit_index(s, id, name);
    } else if (!json_is_integer(index)) {
        return codec_fail(err, "stream chunk's tool call index is %s, not an integer",
                          llm_json_type_name(index));
    } else {
        json_int_t i = json_integer_value(index);
        if (i < 0)
            return codec_fail(err, "stream chunk's tool call index %lld is negative", (long long)i);
        at = (size_t)i;
    }
    return open_slot(s, at, slot, err);
}

/* Set-once strings: a later value only replaces a missing or empty one. */
static int keep_first(char **dst, const char *value, char **err)
{
    if (!value || (*dst && (**dst || !*value)))
        return 0;
    char *copy = strdup(value);
    if (!copy)
        return codec_oom(err);
    free(*dst);
    *dst = copy;
    return 0;
}

/* A delta went to `slot`: it is used, the last one, and its id and name are kept. */
static int note_call(llm_stream *s, size_t slot, const char *id, const char *name, char **err)
{
    stream_call *c = &s->calls[slot];
    s->last_slot = slot;
    s->has_last_slot = 1;
    if (keep_first(&c->id, id && *id ? id : NULL, err) != 0 || keep_first(&c->name, name, err) != 0)
        return -1;
    return 0;
}

static int merge_tool_call(llm_stream *s, const json_t *delta, char **err)
{
    if (!json_is_object(delta))
        return codec_fail(err, "stream chunk's tool call is %s, not an object",
                          llm_json_type_name(delta));
    const json_t *function = codec_member(delta, "function");
    if (function && !json_is_object(function))
        return codec_fail(err, "stream chunk's tool call function is %s, not an object",
                          llm_json_type_name(function));
    const char *id, *name = NULL;
    if (codec_optional_string(delta, "id", "stream chunk's tool call", &id, err) != 0 ||
        (function && codec_optional_string(function, "name", "stream chunk's tool call function",
                                           &name, err) != 0))
        return -1;
    size_t slot = 0;
    if (call_slot(s, codec_member(delta, "index"), id, name, &slot, err) != 0 ||
        note_call(s, slot, id, name, err) != 0)
        return -1;
    if (!function)
        return 0;
    return openai_append_arguments(&s->calls[slot].arguments, codec_member(function, "arguments"),
                                   "stream chunk's tool call", err);
}

static int merge_tool_calls(llm_stream *s, const json_t *calls, char **err)
{
    if (!calls)
        return 0;
    if (!json_is_array(calls))
        return codec_fail(err, "stream chunk's tool_calls is %s, not an array",
                          llm_json_type_name(calls));
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        if (merge_tool_call(s, call, err) != 0)
            return -1;
    }
    return 0;
}

static int apply_reasoning_delta(llm_stream *s, const json_t *delta, char **err)
{
    for (size_t i = 0; i < OPENAI_NREASONING; i++) {
        const char *text;
        if (codec_optional_string(delta, openai_reasoning_fields[i], "stream chunk's delta", &text,
                                  err) != 0)
            return -1;
        if (!text || !*text)
            continue;
        size_t n = strlen(text);
        pbuf_append(&s->reasoning, text, n);
        if (s->reasoning.oom)
            return codec_oom(err);
        if (!s->reasoning_field)
            s->reasoning_field = openai_reasoning_fields[i];
        if (s->on_reasoning)
            s->on_reasoning(s->ud, text, n);
        return 0;
    }
    return 0;
}

static int apply_delta(llm_stream *s, const json_t *delta, char **err)
{
    if (apply_reasoning_delta(s, delta, err) != 0)
        return -1;
    size_t before = s->content.len;
    if (openai_append_content(&s->content, codec_member(delta, "content"),
                              "stream chunk's delta content", err) != 0)
        return -1;
    if (s->content.len > before && s->on_text)
        s->on_text(s->ud, s->content.data + before, s->content.len - before);
    return merge_tool_calls(s, codec_member(delta, "tool_calls"), err);
}

static int apply_chunk(llm_stream *s, const json_t *chunk, char **err)
{
    if (!json_is_object(chunk))
        return codec_fail(err, "stream chunk is not a JSON object (it is %s)",
                          llm_json_type_name(chunk));
    if (codec_member(chunk, "error"))
        return codec_fail_server_error(chunk, err);
    if (json_is_object(codec_member(chunk, "usage")))
        openai_read_usage(codec_member(chunk, "usage"),
                          &s->usage); /* the last chunk, or its own one */
    openai_read_timings(codec_member(chunk, "timings"), &s->usage);
    const json_t *choices = codec_member(chunk, "choices");
    if (!choices)
        return 0; /* e.g. a usage-only chunk */
    if (!json_is_array(choices))
        return codec_fail(err, "stream chunk's choices is %s, not an array",
                          llm_json_type_name(choices));
    if (json_array_size(choices) == 0)
        return 0; /* the final usage chunk of stream_options.include_usage */
    const json_t *choice = json_array_get(choices, 0);
    if (!json_is_object(choice))
        return codec_fail(err, "stream chunk's choices[0] is %s, not an object",
                          llm_json_type_name(choice));
    const json_t *delta = codec_member(choice, "delta");
    if (delta && !json_is_object(delta))
        return codec_fail(err, "stream chunk's delta is %s, not an object",
                          llm_json_type_name(delta));
    if (delta && apply_delta(s, delta, err) != 0)
        return -1;
    return openai_take_finish_reason(choice, &s->finish_reason, "stream chunk's choices[0]", err);
}

/*
 * The fast path for one chunk, on the same terms as the whole reply's: the
 * chunk is scanned whole first, with no effect on the stream, and only a
 * chunk read exactly as apply_chunk reads it is then applied -- in
 * apply_chunk's order (usage, reasoning, content, tool calls, finish_reason),
 * with the same callbacks and the same slot rules for tool call deltas.
 * Text parts, arguments sent as an object, an index out of range, an
 * "error" member and anything else go to the jansson path, untouched.
 */

#define FAST_CHUNK_NOT_MINE  1
#define FAST_CHUNK_MAX_CALLS 16 /* tool call deltas in one chunk */

typedef struct fast_call_delta {
    fast_call call; /* has_function: a function object (null is none) */
    int has_index;
    size_t index;
} fast_call_delta;

typedef struct fast_chunk_fields {
    jscan_str content, finish_reason;
    jscan_str reasoning[2]; /* by openai_reasoning_fields */
    int has_content, has_finish_reason, has_reasoning[2], has_usage, has_timings;
    llm_usage usage;
    fast_call_delta calls[FAST_CHUNK_MAX_CALLS];
    size_t ncalls;
} fast_chunk_fields;

static const fast_key FAST_CALL_DELTA_KEYS[] = {FAST_KEY("index"), FAST_KEY("id"),
                                                FAST_KEY("function")};

static int fast_call_delta_member(jscan *s, size_t which, void *ctx)
{
    fast_call_delta *d = ctx;
    jscan_num n;
    if (which == 1)
        return openai_fast_optional_string(s, &d->call.id, &d->call.has_id);
    if (jscan_peek(s) == JSCAN_NULL) /* no index, no function */
        return jscan_skip(s);
    if (which == 2) {
        if (jscan_peek(s) != JSCAN_OBJECT)
            return -1;
        d->call.has_function = 1;
        return openai_fast_function(s, &d->call);
    }
    if (jscan_peek(s) != JSCAN_NUMBER || jscan_number(s, &n) != 0 || !n.is_integer || n.integer < 0)
        return -1; /* call_slot's errors: jansson words them */
    d->has_index = 1;
    d->index = (size_t)n.integer;
    return 0;
}

static int fast_call_deltas(jscan *s, fast_chunk_fields *f)
{
    if (jscan_array_open(s) != 0)
        return -1;
    int rc;
    while ((rc = jscan_array_next(s)) == 1) {
        if (f->ncalls == FAST_CHUNK_MAX_CALLS || jscan_peek(s) != JSCAN_OBJECT)
            return -1;
        fast_call_delta *d = &f->calls[f->ncalls++];
        if (openai_fast_object(s, FAST_CALL_DELTA_KEYS, 3, fast_call_delta_member, d) != 0)
            return -1;
    }
    return rc;
}

/* merge_tool_call for a scanned delta: 0, or -1 with *err set. */
static int fast_merge_call(llm_stream *s, const fast_call_delta *d, char **err)
{
    char *id = d->call.has_id ? jscan_str_dup(&d->call.id) : NULL;
    char *name = d->call.has_name ? jscan_str_dup(&d->call.name) : NULL;
    size_t slot = 0;
    int rc = (d->call.has_id && !id) || (d->call.has_name && !name) ? codec_oom(err) : 0;
    if (rc == 0) {
        size_t index = d->has_index ? d->index : implicit_index(s, id, name);
        rc =
            open_slot(s, index, &slot, err) != 0 || note_call(s, slot, id, name, err) != 0 ? -1 : 0;
    }
    free(id);
    free(name);
    if (rc != 0 || !d->call.has_function || !d->call.has_arguments)
        return rc;
    pbuf *arguments = &s->calls[slot].arguments;
    jscan_str_append(arguments, &d->call.arguments);
    return arguments->oom ? codec_oom(err) : 0;
}

static const fast_key FAST_DELTA_KEYS[] = {FAST_KEY("content"), FAST_KEY("reasoning_content"),
                                           FAST_KEY("reasoning"), FAST_KEY("tool_calls")};

static int fast_delta_member(jscan *s, size_t which, void *ctx)
{
    fast_chunk_fields *f = ctx;
    switch (which) {
    case 0:
        return openai_fast_optional_string(s, &f->content, &f->has_content);
    case 1:
        return openai_fast_optional_string(s, &f->reasoning[0], &f->has_reasoning[0]);
    case 2:
        return openai_fast_optional_string(s, &f->reasoning[1], &f->has_reasoning[1]);
    default:
        return jscan_peek(s) == JSCAN_NULL ? jscan_skip(s) : fast_call_deltas(s, f);
    }
}

static const fast_key FAST_CHUNK_CHOICE_KEYS[] = {FAST_KEY("delta"), FAST_KEY("finish_reason")};

static int fast_chunk_choice_member(jscan *s, size_t which, void *ctx)
{
    fast_chunk_fields *f = ctx;
    if (which == 1)
        return openai_fast_optional_string(s, &f->finish_reason, &f->has_finish_reason);
    if (jscan_peek(s) == JSCAN_NULL)
        return jscan_skip(s);
    if (jscan_peek(s) != JSCAN_OBJECT)
        return -1;
    return openai_fast_object(s, FAST_DELTA_KEYS, 4, fast_delta_member, f);
}

/* choices: null or [] carry nothing; of more, choices[0] is read. */
static int fast_chunk_choices(jscan *s, fast_chunk_fields *f)
{
    if (jscan_peek(s) == JSCAN_NULL)
        return jscan_skip(s);
    if (jscan_array_open(s) != 0)
        return -1;
    int rc = jscan_array_next(s);
    if (rc != 1)
        return rc;
    if (jscan_peek(s) != JSCAN_OBJECT ||
        openai_fast_object(s, FAST_CHUNK_CHOICE_KEYS, 2, fast_chunk_choice_member, f) != 0)
        return -1;
    while ((rc = jscan_array_next(s)) == 1)
        if (jscan_skip(s) != 0)
            return -1;
    return rc;
}

static const fast_key FAST_CHUNK_ROOT_KEYS[] = {FAST_KEY("choices"), FAST_KEY("usage"),
                                                FAST_KEY("timings"), FAST_KEY("error")};

static int fast_chunk_root_member(jscan *s, size_t which, void *ctx)
{
    fast_chunk_fields *f = ctx;
    switch (which) {
    case 0:
        return fast_chunk_choices(s, f);
    case 1:
        if (jscan_peek(s) != JSCAN_OBJECT)
            return jscan_skip(s);
        f->has_usage = 1;
        return openai_fast_usage(s, &f->usage);
    case 2:
        return openai_fast_timings(s, &f->usage, &f->has_timings);
    default:
        return -1;
    }
}

/* Apply a scanned chunk: 0, or -1 with *err set (out of memory). */
static int fast_chunk_apply(llm_stream *s, const fast_chunk_fields *f, char **err)
{
    if (f->has_usage) { /* openai_read_usage sets these four, 0 for what is absent */
        s->usage.prompt = f->usage.prompt;
        s->usage.completion = f->usage.completion;
        s->usage.cache_read = f->usage.cache_read;
        s->usage.reasoning = f->usage.reasoning;
    }
    if (f->has_timings) {
        s->usage.evaluated = f->usage.evaluated;
        s->usage.timings_cached = f->usage.timings_cached;
    }
    for (size_t i = 0; i < OPENAI_NREASONING; i++) {
        if (!f->has_reasoning[i] || f->reasoning[i].len == 0)
            continue;
        size_t before = s->reasoning.len;
        jscan_str_append(&s->reasoning, &f->reasoning[i]);
        if (s->reasoning.oom)
            return codec_oom(err);
        if (!s->reasoning_field)
            s->reasoning_field = openai_reasoning_fields[i];
        if (s->on_reasoning)
            s->on_reasoning(s->ud, s->reasoning.data + before, f->reasoning[i].len);
        break;
    }
    if (f->has_content && f->content.len > 0) {
        size_t before = s->content.len;
        jscan_str_append(&s->content, &f->content);
        if (s->content.oom)
            return codec_oom(err);
        if (s->on_text)
            s->on_text(s->ud, s->content.data + before, f->content.len);
    }
    for (size_t i = 0; i < f->ncalls; i++)
        if (fast_merge_call(s, &f->calls[i], err) != 0)
            return -1;
    if (f->has_finish_reason) {
        char *copy = jscan_str_dup(&f->finish_reason);
        if (!copy)
            return codec_oom(err);
        free(s->finish_reason);
        s->finish_reason = copy;
    }
    return 0;
}

/* One event's data: 0 or -1 as apply_chunk, or FAST_CHUNK_NOT_MINE. */
static int fast_chunk(llm_stream *s, const char *data, size_t len, char **err)
{
    fast_chunk_fields f;
    memset(&f, 0, sizeof f);
    jscan scan;
    jscan_init(&scan, data, len);
    if (jscan_peek(&scan) != JSCAN_OBJECT ||
        openai_fast_object(&scan, FAST_CHUNK_ROOT_KEYS, 4, fast_chunk_root_member, &f) != 0 ||
        jscan_end(&scan) != 0)
        return FAST_CHUNK_NOT_MINE;
    return fast_chunk_apply(s, &f, err);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Is the event's data, whitespace trimmed, exactly `word`? */
static int data_is(const char *data, size_t len, const char *word)
{
    while (len > 0 && is_space(data[0]))
        data++, len--;
    while (len > 0 && is_space(data[len - 1]))
        len--;
    return len == strlen(word) && memcmp(data, word, len) == 0;
}

/* sse_event_fn: one event's data.  Returns 1 (stop) at [DONE]. */
static int on_event(void *ud, const char *data, size_t len, char **err)
{
    llm_stream *s = ud;
    s->events++;
    if (data_is(data, len, "[DONE]")) {
        s->done = 1;
        return 1;
    }
    if (data_is(data, len, ""))
        return 0; /* an empty "data:" keep-alive */
    if (!s->jansson_only) {
        int rc = fast_chunk(s, data, len, err);
        if (rc != FAST_CHUNK_NOT_MINE) {
            s->fast_chunks++;
            return rc;
        }
    }
    json_error_t jerr;
    json_t *chunk = json_loadb(data, len, JSON_DECODE_ANY, &jerr);
    if (!chunk)
        return codec_fail_not_json(err, "stream chunk", &jerr);
    int rc = apply_chunk(s, chunk, err);
    json_decref(chunk);
    return rc;
}

llm_stream *llm_stream_new_sink(const llm_sink *sink)
{
    llm_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    sse_init(&s->sse, MAX_SSE_SIZE, on_event, s);
    s->on_text = sink->text;
    s->on_reasoning = sink->reasoning;
    s->ud = sink->ud;
    return s;
}

int llm_stream_feed(llm_stream *s, const char *data, size_t len, char **err)
{
    if (codec_stream_dead(&s->st, 0, err) != 0)
        return -1;
    if (s->done || len == 0)
        return 0;
    char *msg = NULL;
    if (sse_feed(&s->sse, data, len, &msg) < 0)
        return codec_stream_die(&s->st, msg, err);
    return 0;
}

int llm_stream_done(const llm_stream *s) { return s->done; }

/* The body ended: was the stream complete? */
static int check_complete(llm_stream *s, char **err)
{
    if (s->done)
        return 0;
    if (sse_has_partial_line(&s->sse))
        return codec_fail(err, "stream ended mid-line, before [DONE]");
    if (sse_flush(&s->sse, err) < 0) /* the last event's blank line may be missing */
        return -1;
    if (s->done || s->finish_reason)
        return 0;
    if (s->events == 0)
        return codec_fail(err, "stream ended before [DONE], without any data event");
    return codec_fail(err, "stream ended before [DONE] and without a finish_reason");
}

static int build_calls(llm_stream *s, llm_reply *out, char **err)
{
    size_t n = s->nslots;
    if (n == 0)
        return 0;
    out->calls = calloc(n, sizeof *out->calls);
    if (!out->calls)
        return codec_oom(err);
    out->ncalls = n;
    for (size_t i = 0; i < n; i++) {
        const stream_call *c = &s->calls[i];
        if (!c->name)
            return codec_fail(err, "stream tool call %zu has no function name", c->index);
        if (c->arguments.oom)
            return codec_oom(err);
        if (codec_fill_call(&out->calls[i], i, c->id, c->name, &c->arguments, err) != 0)
            return -1;
    }
    return 0;
}

static int build_reply(llm_stream *s, llm_reply *out, char **err)
{
    if (build_calls(s, out, err) != 0 || llm_set_content(out, &s->content, err) != 0) {
        llm_reply_free(out);
        return -1;
    }
    out->finish_reason = s->finish_reason;
    s->finish_reason = NULL;
    out->usage = s->usage;
    if (s->reasoning.len) {
        int rc = (out->reasoning = pbuf_take(&s->reasoning)) ? 0 : codec_oom(err);
        if (rc == 0 && s->reasoning_field)
            rc = openai_note_reasoning_field(out, s->reasoning_field, err);
        if (rc != 0) {
            llm_reply_free(out);
            return -1;
        }
    }
    return 0;
}

int llm_stream_finish(llm_stream *s, llm_reply *out, char **err)
{
    memset(out, 0, sizeof *out);
    if (codec_stream_dead(&s->st, 1, err) != 0)
        return -1;
    char *msg = NULL;
    if (check_complete(s, &msg) != 0 || build_reply(s, out, &msg) != 0)
        return codec_stream_die(&s->st, msg, err);
    return 0;
}

void llm_stream_disable_fast_path(llm_stream *s) { s->jansson_only = 1; }

size_t llm_stream_fast_chunks(const llm_stream *s) { return s->fast_chunks; }

void llm_stream_free(llm_stream *s)
{
    if (!s)
        return;
    sse_free(&s->sse);
    pbuf_free(&s->content);
    pbuf_free(&s->reasoning);
    for (size_t i = 0; i < s->nslots; i++) {
        free(s->calls[i].id);
        free(s->calls[i].name);
        pbuf_free(&s->calls[i].arguments);
    }
    free(s->calls);
    free(s->finish_reason);
    free(s->st.error);
    free(s);
}
