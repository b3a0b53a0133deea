/*
 * openai.c -- the Chat Completions codec (OpenAI, and what every local server
 * speaks: llama.cpp, vLLM, Ollama's /v1, LM Studio, DeepSeek, ...).
 * Reference: https://platform.openai.com/docs/api-reference/chat/create
 *
 * Neutral messages are a superset of this format (docs/history.md), so
 * rendering keeps each message's Chat Completions keys and drops Parley's
 * own (name, is_error, reasoning, provider_data) -- except that a tool-call
 * turn whose reasoning came in `reasoning_content` sends it back within the
 * turn, as DeepSeek requires -- and that a system message of the history (an
 * appended note) goes as user text, never as a late system message (codec.h,
 * "System notes"), and two user or two assistant messages in a row go as one
 * (codec.h, "Alternation").  Decoding is openai_reply.c (a whole reply)
 * and openai_stream.c (a stream), declared in openai_decode.h.
 *
 * History is rendered from its stored text: a message whose keys are all
 * Chat Completions keys (most of them) is copied as it is; only the others
 * are parsed and re-rendered.  Rendering stays a memcpy per message, as in
 * 0.1, instead of a JSON parse of the whole history per request.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json_oom.h"
#include "provider/codec.h"
#include "provider/openai_decode.h"
#include "provider/provider.h"
#include "store/message_text.h"
#include "store/store_json.h"

static void put_key(pbuf *b, const char *key)
{
    pbuf_putc(b, ',');
    pbuf_json_string(b, key, strlen(key));
    pbuf_putc(b, ':');
}

/* `sent`: the ids to send (call_renames_assign), or NULL for the calls' own. */
static void render_tool_calls(pbuf *b, const json_t *calls, const json_t *sent)
{
    pbuf_puts(b, ",\"tool_calls\":[");
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        const char *id = sent ? json_string_value(json_array_get(sent, i)) : msg_str(call, "id");
        const char *name = msg_str(json_object_get(call, "function"), "name");
        char *args = msg_arguments_text(call);
        pbuf_puts(b, i ? ",{\"id\":" : "{\"id\":");
        pbuf_json_string(b, id ? id : "", id ? strlen(id) : 0);
        pbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        pbuf_json_string(b, name ? name : "", name ? strlen(name) : 0);
        pbuf_puts(b, ",\"arguments\":");
        if (args)
            pbuf_json_string(b, args, strlen(args));
        else
            b->oom = 1;
        pbuf_puts(b, "}}");
        free(args);
    }
    pbuf_putc(b, ']');
}

static void render_message(pbuf *b, const json_t *m, int current_turn, call_renames *ren)
{
    const char *role = msg_role(m);
    pbuf_puts(b, "{\"role\":");
    pbuf_json_string(b, role, strlen(role));
    const json_t *content = json_object_get(m, "content");
    if (strcmp(role, "tool") == 0) {
        const char *id = call_renames_result(ren, msg_str(m, "tool_call_id"));
        put_key(b, "tool_call_id");
        pbuf_json_string(b, id ? id : "", id ? strlen(id) : 0);
        put_key(b, "content");
        if (json_is_string(content) || json_is_array(content))
            pbuf_json(b, content);
        else
            pbuf_json_string(b, "", 0);
        pbuf_putc(b, '}');
        return;
    }
    put_key(b, "content");
    pbuf_json(b, content ? content : json_null());
    const json_t *calls = json_object_get(m, "tool_calls");
    json_t *sent = call_renames_assign(ren, calls); /* any other message ends the renames */
    if (strcmp(role, "assistant") == 0 && json_array_size(calls) > 0) {
        render_tool_calls(b, calls, sent);
        const char *reasoning = msg_str(m, "reasoning");
        const char *field = json_string_value(msg_provider_data(m, "openai", "reasoning_field"));
        if (current_turn && reasoning && field && strcmp(field, "reasoning_content") == 0) {
            put_key(b, "reasoning_content");
            pbuf_json_string(b, reasoning, strlen(reasoning));
        }
    }
    json_decref(sent);
    pbuf_putc(b, '}');
}

/* A Chat Completions message key: role, content, tool_calls, tool_call_id. */
static int wire_key(const char *k, size_t n)
{
    switch (n) { /* by length first: this runs for every key of every stored message */
    case 4: return memcmp(k, "role", 4) == 0;
    case 7: return memcmp(k, "content", 7) == 0;
    case 10: return memcmp(k, "tool_calls", 10) == 0;
    case 12: return memcmp(k, "tool_call_id", 12) == 0;
    default: return 0;
    }
}

/* The ids of one message's tool calls, as stored (escapes and all), to find one given twice
   (call_renames in codec.h).  More calls than fit: assume a repeat; the JSON path decides. */
#define SCAN_IDS 32
typedef struct call_ids {
    const char *at[SCAN_IDS];
    size_t len[SCAN_IDS], n;
    int in_calls, key, want_id; /* in tool_calls; a call's key comes next; its "id" value next */
} call_ids;

/* A string at depth 3 (a member of a call object) of the scan. */
static void scan_call_string(call_ids *ids, const char *s, size_t len, int *repeats)
{
    if (ids->key) {
        ids->want_id = len == 2 && memcmp(s, "id", 2) == 0;
        ids->key = 0;
        return;
    }
    if (!ids->want_id)
        return;
    ids->want_id = 0;
    for (size_t i = 0; i < ids->n; i++)
        if (ids->len[i] == len && memcmp(ids->at[i], s, len) == 0)
            *repeats = 1;
    if (ids->n == SCAN_IDS) {
        *repeats = 1;
        return;
    }
    ids->at[ids->n] = s;
    ids->len[ids->n++] = len;
}

/*
 * p at a message's '{': the byte after its '}', or NULL when the text is not
 * a JSON object.  *as_is: every top-level key is a Chat Completions one.
 * *repeats: two of its tool calls have the same id (a history an older Parley
 * stored): the JSON path renders it.  *kind: its msg_join_kind (codec.h), from its role
 * and whether a tool call follows "tool_calls".
 */
static const char *scan_message(const char *p, const char *end, int *as_is, int *repeats, int *kind)
{
    int depth = 0, expect_key = 0, role_next = 0, role = 0, calls = 0;
    call_ids ids; /* not zeroed whole: at[] and len[] are read only as far as n */
    ids.n = 0;
    ids.in_calls = ids.key = ids.want_id = 0;
    *as_is = 1;
    *repeats = *kind = 0;
    if (p >= end || *p != '{')
        return NULL;
    for (; p < end; p++) {
        switch (*p) {
        case '"': {
            const char *close = msgtext_string_end(p, end);
            if (!close)
                return NULL;
            size_t len = (size_t)(close - p - 1);
            if (depth == 1 && expect_key) {
                if (!wire_key(p + 1, len))
                    *as_is = 0;
                ids.in_calls = len == 10 && memcmp(p + 1, "tool_calls", 10) == 0;
                role_next = len == 4 && memcmp(p + 1, "role", 4) == 0;
            } else if (depth == 1 && role_next) {
                role = len == 6 && memcmp(p + 1, "system", 6) == 0      ? 's'
                       : len == 4 && memcmp(p + 1, "user", 4) == 0      ? 'u'
                       : len == 4 && memcmp(p + 1, "tool", 4) == 0      ? 't'
                       : len == 9 && memcmp(p + 1, "assistant", 9) == 0 ? 'a'
                                                                        : 0;
                role_next = 0;
            } else if (depth == 3 && ids.in_calls) {
                scan_call_string(&ids, p + 1, len, repeats);
            }
            expect_key = 0;
            p = close;
            break;
        }
        case '{':
        case '[':
            expect_key = ++depth == 1;
            ids.key = depth == 3 && *p == '{';
            calls |= ids.key && ids.in_calls;
            break;
        case '}':
        case ']':
            if (--depth == 0) {
                *kind = role == 'a' && calls ? 'c' : role;
                return p + 1;
            }
            ids.key = ids.want_id = 0;
            break;
        case ',':
            expect_key = depth == 1;
            ids.key = depth == 3;
            ids.want_id = 0;
            break;
        default:
            break;
        }
    }
    return NULL;
}

/* What is written of the "messages" array, for the alternation (codec.h). */
typedef struct written {
    int first;       /* nothing written yet, not even the system prompt */
    int opened;      /* a message of the conversation written */
    size_t last_at;  /* where the last message starts in out */
    int last_kind;   /* its msg_join_kind; 0 before any */
    json_t *joining; /* the last message read back, then the messages joined to it; NULL none */
} written;

/* The run in w->joining joined once (msgs_join) in place of the last message: joining each
   message as it came re-read and rewrote the growing message, quadratic in a long run of
   appended messages (hundreds from a group chat).  A joined message has no calls, so
   render_message's current_turn does not matter. */
static void flush_join(pbuf *out, written *w, call_renames *ren)
{
    if (!w->joining)
        return;
    json_t *joined = msgs_join(w->joining);
    json_decref(w->joining);
    w->joining = NULL;
    if (!joined) {
        out->oom = 1;
        return;
    }
    out->len = w->last_at;
    render_message(out, joined, 0, ren);
    json_decref(joined);
}

/* Before a message of msg_join_kind `kind`: the ',' unless it is the first, and before an
   assistant message opening the conversation, CONVERSATION_START (msgs_alternate's). */
static void begin_message(pbuf *out, written *w, int kind, call_renames *ren)
{
    flush_join(out, w, ren);
    if (!w->opened && (kind == 'a' || kind == 'c')) {
        if (!w->first)
            pbuf_putc(out, ',');
        w->first = 0;
        pbuf_puts(out, "{\"role\":\"user\",\"content\":\"" CONVERSATION_START "\"}");
    }
    w->opened = 1;
    if (!w->first)
        pbuf_putc(out, ',');
    w->first = 0;
    w->last_at = out->len;
    w->last_kind = kind;
}

/* m after what is written: joined to the last message when both are user messages or both
   assistant messages without calls (read back from out once, joined at the run's end by
   flush_join), else a message of its own. */
static void write_message(pbuf *out, written *w, const json_t *m, int current_turn,
                          call_renames *ren)
{
    int kind = msg_join_kind(m);
    if ((kind == 'u' || kind == 'a') && kind == w->last_kind && !out->oom) {
        if (!w->joining) {
            json_t *prev = json_loadb(out->data + w->last_at, out->len - w->last_at, 0, NULL);
            w->joining = prev ? json_array() : NULL;
            if (w->joining && json_array_append(w->joining, prev) != 0)
                json_decref(w->joining), w->joining = NULL;
            json_decref(prev);
        }
        if (!w->joining || json_array_append(w->joining, (json_t *)m) != 0)
            out->oom = 1;
        return;
    }
    begin_message(out, w, kind, ren);
    render_message(out, m, current_turn, ren);
}

/* One message through the JSON path, system notes rendered as codec.h says: a system
   message joins the run in notes; the run opens the user message after it, else goes
   before the message as a user message of its own (m NULL: the end). */
static void render_noted(pbuf *out, const json_t *m, int current_turn, call_renames *ren,
                         pbuf *notes, written *w)
{
    if (m && strcmp(msg_role(m), "system") == 0) {
        notes_add(notes, m);
        return;
    }
    json_t *merged = NULL;
    if (notes->len) {
        int user = m && strcmp(msg_role(m), "user") == 0;
        merged = user ? msg_user_with_notes(m, notes->data) : msg_notes_alone(notes->data);
        if (!merged || notes->oom) {
            json_decref(merged);
            out->oom = 1;
            return;
        }
        pbuf_reset(notes);
        if (!user) {
            write_message(out, w, merged, current_turn, ren);
            json_decref(merged);
            merged = NULL;
        }
    }
    if (m)
        write_message(out, w, merged ? merged : m, current_turn, ren);
    json_decref(merged);
}

/* A run of messages copied as they are: the first of msg_join_kind first_kind, the last
   at `last` of kind last_kind. */
typedef struct text_run {
    const char *at, *end, *last;
    int first_kind, last_kind;
} text_run;

static void flush_run(pbuf *out, written *w, text_run *run, call_renames *ren)
{
    begin_message(out, w, run->first_kind, ren);
    size_t at = out->len;
    pbuf_append(out, run->at, (size_t)(run->end - run->at));
    w->last_at = at + (size_t)(run->last - run->at);
    w->last_kind = run->last_kind;
    run->at = NULL;
}

/* Stored messages (message_text.h) into out: as they are when they hold only wire keys,
   else through render_message.  current_turn: as render_message's.  A run of
   messages copied as they are, with the stored ',' between them (the wire's
   separator too), is one append. */
static int render_messages_text(pbuf *out, const char *p, size_t len, written *w, int current_turn,
                                call_renames *ren, pbuf *notes, char **err)
{
    msgtext_iter it;
    msgtext_msg m;
    text_run run = {NULL, NULL, NULL, 0, 0}; /* as-is messages not copied yet */
    int rc;
    msgtext_begin(&it, p, len);
    while ((rc = msgtext_next(&it, &m)) > 0) {
        const char *next = m.json + m.len;
        /* a plain message holds only wire keys, and is no system note */
        int as_is = m.plain, repeats = 0, kind = !m.plain ? 0 : m.json[9] == 'u' ? 'u' : 'a';
        if (!as_is && scan_message(m.json, next, &as_is, &repeats, &kind) != next)
            break;
        /* Renamed calls (codec.h): the message, and those after it until the renames end.
           A system note, the message after a run of them, and one to join: render_noted. */
        int before = run.at ? run.last_kind : w->last_kind;
        if (repeats || ren->queues || kind == 's' || notes->len ||
            ((kind == 'u' || kind == 'a') && kind == before))
            as_is = 0;
        if (as_is && run.at && m.json == run.end + 1 && *run.end == ',') {
            run.end = next; /* extends the run */
            run.last = m.json;
            run.last_kind = kind;
            continue;
        }
        if (run.at)
            flush_run(out, w, &run, ren);
        if (as_is) {
            run = (text_run){m.json, next, m.json, kind, kind};
            continue;
        }
        json_error_t jerr;
        json_t *o = json_loadb(m.json, m.len, 0, &jerr);
        if (!json_is_object(o)) {
            json_decref(o);
            /* A message that is one JSON object and does not parse: jansson ran out of memory
               (it words some such failures as syntax errors). */
            if (!o && (json_load_oom(&jerr) || store_json_object_list(m.json, m.len) == 1))
                return codec_oom(err);
            *err = pstr_printf("stored history holds a message that is not JSON");
            return -1;
        }
        render_noted(out, o, current_turn, ren, notes, w);
        json_decref(o);
    }
    if (rc != 0) {
        *err = pstr_printf("stored history is not a list of JSON objects");
        return -1;
    }
    if (run.at)
        flush_run(out, w, &run, ren);
    return 0;
}

/* prompt_cache_key routes a conversation's requests to the same cache on
 * OpenAI's servers; another server may refuse a key it does not know, so it
 * is sent only to OpenAI's (base_url unset or at api.openai.com) unless the
 * option says otherwise. */
static int wants_cache_key(const parley_options *o)
{
    if (o->prompt_cache_key >= 0)
        return o->prompt_cache_key;
    return !o->base_url || strstr(o->base_url, "://api.openai.com") != NULL;
}

/* "none" on the last round; else the tool_choice option's: "required" or a function. */
static void put_tool_choice(pbuf *out, const provider_request *r)
{
    if (r->tool_choice_none) {
        pbuf_puts(out, ",\"tool_choice\":\"none\"");
    } else if (r->tool_choice && strcmp(r->tool_choice, "required") == 0) {
        pbuf_puts(out, ",\"tool_choice\":\"required\"");
    } else if (r->tool_choice) {
        pbuf_puts(out, ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":");
        pbuf_json_string(out, r->tool_choice, strlen(r->tool_choice));
        pbuf_puts(out, "}}");
    }
}

/* Structured output: json_schema with the host's schema, or JSON mode without one. */
static void put_response_format(pbuf *out, const response_format *rf)
{
    if (!rf->schema) {
        pbuf_puts(out, ",\"response_format\":{\"type\":\"json_object\"}");
        return;
    }
    pbuf_puts(out, ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":");
    pbuf_json_string(out, rf->name, strlen(rf->name));
    if (rf->description) {
        pbuf_puts(out, ",\"description\":");
        pbuf_json_string(out, rf->description, strlen(rf->description));
    }
    pbuf_puts(out, ",\"schema\":");
    pbuf_json(out, rf->schema);
    pbuf_puts(out, rf->strict ? ",\"strict\":true}}" : ",\"strict\":false}}");
}

static int openai_encode(pbuf *out, const parley_options *o, const provider_request *r, char **err)
{
    pbuf_reset(out);
    /* One allocation instead of a doubling per size step: room for the parts
     * known up front (the stored text goes in verbatim; the system prompt
     * with a little escaping) and a small margin for the options.  Tight,
     * because the body stays allocated while its request is in flight: at
     * 10,000 in flight every KiB of slack is 10 MiB. */
    size_t system_len = r->system ? strlen(r->system) : 0;
    pbuf_reserve(out, strlen(o->model) + system_len + system_len / 16 + r->history_text_len +
                          r->messages_text_len + strlen(r->tools_json) + 512);
    pbuf_puts(out, "{\"model\":");
    pbuf_json_string(out, o->model, strlen(o->model));
    pbuf_puts(out, ",\"messages\":[");
    written w = {1, 0, 0, 0, NULL};
    if (r->system && *r->system) {
        pbuf_puts(out, "{\"role\":\"system\",\"content\":");
        pbuf_json_string(out, r->system, strlen(r->system));
        pbuf_putc(out, '}');
        w.first = 0;
    }
    /* the turn note (provider.h): in the turn's user message, through the JSON path */
    json_t *noted = NULL;
    if (r->turn_note && *r->turn_note) {
        json_t *turn = r->messages
                           ? json_incref((json_t *)r->messages)
                           : provider_parse_messages(r->messages_text, r->messages_text_len, err);
        if (!turn)
            return -1; /* *err says why */
        noted = msgs_with_turn_note(turn, r->turn_note);
        json_decref(turn);
        if (!noted)
            return codec_oom(err);
    }
    call_renames ren = {NULL, NULL};
    pbuf notes = PBUF_INIT; /* system notes not sent yet (codec.h) */
    int rc = r->history_text ? render_messages_text(out, r->history_text, r->history_text_len, &w,
                                                    0, &ren, &notes, err)
                             : 0;
    const json_t *lists[] = {r->history_text ? NULL : r->history, noted ? noted : r->messages};
    for (size_t l = 0; l < 2 && rc == 0; l++) {
        size_t i;
        const json_t *m;
        json_array_foreach(lists[l], i, m)
            render_noted(out, m, l == 1, &ren, &notes, &w);
    }
    if (rc == 0 && r->messages_text && !noted)
        rc = render_messages_text(out, r->messages_text, r->messages_text_len, &w, 1, &ren, &notes,
                                  err);
    if (rc == 0 && notes.len) /* notes last of all: a user message of their own */
        render_noted(out, NULL, 1, &ren, &notes, &w);
    flush_join(out, &w, &ren);
    pbuf_free(&notes);
    call_renames_free(&ren);
    json_decref(noted);
    if (rc != 0)
        return -1;
    pbuf_putc(out, ']');
    if (strcmp(r->tools_json, "[]") != 0) {
        pbuf_puts(out, ",\"tools\":");
        pbuf_puts(out, r->tools_json);
        put_tool_choice(out, r);
    }
    if (r->response_format)
        put_response_format(out, r->response_format);
    if (o->stream) /* usage arrives in a last chunk only when asked for */
        pbuf_puts(out, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    if (o->temperature >= 0)
        pbuf_printf(out, ",\"temperature\":%.15g", o->temperature);
    if (o->top_p >= 0)
        pbuf_printf(out, ",\"top_p\":%.15g", o->top_p);
    if (o->max_tokens > 0) {
        put_key(out, o->max_tokens_field);
        pbuf_printf(out, "%lld", (long long)o->max_tokens);
    }
    if (o->reasoning_effort) {
        put_key(out, "reasoning_effort");
        pbuf_json_string(out, o->reasoning_effort, strlen(o->reasoning_effort));
    }
    if (r->cache_key && wants_cache_key(o)) {
        put_key(out, "prompt_cache_key");
        pbuf_json_string(out, r->cache_key, strlen(r->cache_key));
    }
    render_extra_body(out, o);
    pbuf_putc(out, '}');
    if (out->oom) {
        *err = pstr_printf("out of memory");
        return -1;
    }
    return 0;
}

static void *openai_stream_new(const llm_sink *sink) { return llm_stream_new_sink(sink); }
static int openai_stream_feed(void *s, const char *d, size_t n, char **err)
{
    return llm_stream_feed(s, d, n, err);
}
static int openai_stream_finish(void *s, llm_reply *out, char **err)
{
    return llm_stream_finish(s, out, err);
}
static void openai_stream_free(void *s) { llm_stream_free(s); }
static int openai_stream_done(const void *s) { return llm_stream_done(s); }

/* ---- the context window ---- */

long long provider_window_from_props(const char *body, size_t len)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    long long n = codec_count(json_object_get(root, "default_generation_settings"), "n_ctx");
    if (!n)
        n = codec_count(root, "n_ctx");
    json_decref(root);
    return n;
}

long long provider_window_from_models(const char *body, size_t len, const char *model)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    json_t *data = json_object_get(root, "data");
    long long n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m) {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (model && id && strcmp(id, model) == 0)
            n = codec_count(m, "max_model_len");
    }
    if (!n && json_array_size(data) == 1)
        n = codec_count(json_array_get(data, 0), "max_model_len");
    json_decref(root);
    return n;
}

/* base_url without a trailing "/v1": where llama.cpp serves /props. */
static char *props_url(const char *base_url)
{
    size_t n = strlen(base_url);
    if (n >= 3 && strcmp(base_url + n - 3, "/v1") == 0)
        n -= 3;
    return pstr_printf("%.*s/props", (int)n, base_url);
}

/* llama.cpp's GET <root>/props, then vLLM's GET <base_url>/models. */
static int openai_ask_window(const parley_options *o, provider_ask_fn ask, void *ctx,
                             provider_window *out, char **err)
{
    pbuf b = PBUF_INIT;
    char *url = props_url(o->base_url);
    int rc = ask(ctx, url, NULL, &b, err);
    free(url);
    if (rc == 0 && (out->n_ctx = provider_window_from_props(b.data, b.len)))
        out->source = "props";
    pbuf_free(&b);
    if (out->n_ctx)
        return 0;
    char *err2 = NULL;
    pbuf m = PBUF_INIT;
    url = pstr_printf("%s/models", o->base_url);
    int rc2 = ask(ctx, url, NULL, &m, &err2);
    free(url);
    if (rc2 == 0 && (out->n_ctx = provider_window_from_models(m.data, m.len, o->model)))
        out->source = "models";
    pbuf_free(&m);
    if (rc != 0 && rc2 != 0) { /* neither answered: say the first one's reason */
        free(err2);
        return -1;
    }
    free(rc != 0 ? *err : err2);
    *err = NULL;
    return 0;
}

const provider provider_openai = {
    .name = "openai",
    .images_by_url = 1,
    .default_base_url = "http://127.0.0.1:11434/v1",
    .path = "/chat/completions",
    .models_path = "/models",
    .not_found_hint = "OpenAI-compatible servers serve <root>/v1/chat/completions: base_url "
                      "usually ends in /v1",
    .stream_accept = "Accept: text/event-stream",
    .default_max_tokens = 0,
    .reads_history_text = 1,
    .headers = codec_bearer_header,
    .encode = openai_encode,
    .decode = llm_reply_decode,
    .stream_new = openai_stream_new,
    .stream_feed = openai_stream_feed,
    .stream_finish = openai_stream_finish,
    .stream_free = openai_stream_free,
    .stream_done = openai_stream_done,
    .error_text = llm_error_text,
    .retryable = provider_retryable_default,
    .summary = "Chat Completions, any compatible server",
    .default_window = codec_default_window,
    .ask_window = openai_ask_window,
};
