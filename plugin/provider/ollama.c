/*
 * ollama.c -- Ollama's native chat API codec (POST <base>/api/chat).
 * Reference: https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion
 *
 * Differences from Chat Completions that matter here: tool calls carry no
 * ids (the turn names them, llm_reply.ids_minted) and their arguments are
 * objects; tool results go back with `tool_name`; there is no tool_choice
 * (the last round simply offers no tools); the model's reasoning comes in
 * `thinking` and goes back with the tool calls it led to; streaming is
 * NDJSON -- one JSON object per line, the last with "done": true and the
 * token counts; `stream` must be sent as false for a whole reply.  As for
 * Chat Completions, a system note of the history goes as user text and user
 * and assistant alternate (codec.h).
 */
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"
#include "lib/json_oom.h"
#include "provider/codec.h"
#include "provider/image.h"
#include "provider/provider.h"

#define MAX_LINE (8u << 20)

/* ---- request ---- */

/* A user message's images (content parts, docs/history.md) as Ollama's "images": base64
   strings; NULL when it has none.  URL images were refused (ollama_encode). */
static json_t *user_images(const json_t *content)
{
    json_t *images = NULL;
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const char *url = msg_image_url(part), *mime, *data;
        size_t mime_len;
        if (url && image_data_url_split(url, &mime, &mime_len, &data) == 0) {
            if (!images)
                images = json_array();
            codec_append(images, json_string(data));
        }
    }
    return images;
}

/* Ollama takes images only as base64: an http(s) image anywhere is refused by name. */
static int refuse_url_images(const json_t *list, char **err)
{
    size_t i, k;
    const json_t *m, *part;
    json_array_foreach(list, i, m) {
        json_array_foreach(json_object_get(m, "content"), k, part) {
            const char *url = msg_image_url(part), *mime, *data;
            size_t mime_len;
            if (url && image_data_url_split(url, &mime, &mime_len, &data) != 0) {
                *err = pstr_printf("provider ollama cannot be sent an image by URL (only as "
                                   "base64 data); give it as a data: URL");
                return -1;
            }
        }
    }
    return 0;
}

static json_t *render_message(const json_t *all, size_t index, int current_turn)
{
    const json_t *m = json_array_get(all, index);
    const char *role = msg_role(m);
    char *text = codec_text(json_object_get(m, "content"));
    json_t *out = json_pack("{s:s,s:s}", "role", role, "content", text ? text : "");
    free(text);
    json_t *images = user_images(json_object_get(m, "content"));
    if (images)
        codec_set(out, "images", images);
    if (strcmp(role, "tool") == 0) {
        codec_set(out, "tool_name", json_string(msg_tool_name(all, index)));
        return out;
    }
    const json_t *calls = json_object_get(m, "tool_calls");
    if (strcmp(role, "assistant") != 0 || json_array_size(calls) == 0)
        return out;
    json_t *list = json_array();
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        const char *name = msg_str(json_object_get(call, "function"), "name");
        codec_append(list, json_pack("{s:{s:s,s:o}}", "function", "name", name ? name : "",
                                     "arguments", msg_arguments_object(call)));
    }
    codec_set(out, "tool_calls", list);
    const char *reasoning = msg_str(m, "reasoning");
    if (current_turn && reasoning) /* thinking goes back with the calls it led to */
        codec_set(out, "thinking", json_string(reasoning));
    return out;
}

static int ollama_encode(pbuf *out, const parley_options *o, const provider_request *r,
                         char **err)
{
    if (refuse_url_images(r->history, err) != 0 || refuse_url_images(r->messages, err) != 0)
        return -1;
    codec_build_begin();
    json_t *body = json_pack("{s:s}", "model", o->model);
    json_t *msgs = json_array();
    if (r->system && *r->system)
        codec_append(msgs, json_pack("{s:s,s:s}", "role", "system", "content", r->system));
    size_t first_current = 0;
    /* the turn note (provider.h): in the turn's user message, after the history */
    json_t *noted =
        r->turn_note && *r->turn_note ? msgs_with_turn_note(r->messages, r->turn_note) : NULL;
    if (r->turn_note && *r->turn_note && !noted) {
        json_decref(body);
        json_decref(msgs);
        return codec_oom(err);
    }
    json_t *concat = msgs_concat(r->history, noted ? noted : r->messages, &first_current);
    json_decref(noted);
    /* system notes as user text, user and assistant in turn (codec.h) */
    json_t *all = concat ? msgs_alternate(concat, &first_current) : NULL;
    json_decref(concat);
    if (!all) {
        json_decref(body);
        json_decref(msgs);
        return codec_oom(err);
    }
    for (size_t i = 0; i < json_array_size(all); i++)
        codec_append(msgs, render_message(all, i, i >= first_current));
    json_decref(all);
    codec_set(body, "messages", msgs);
    if (strcmp(r->tools_json, "[]") != 0 && !r->tool_choice_none)
        codec_set(body, "tools", json_loads(r->tools_json, 0, NULL));
    if (r->response_format) /* structured output: the schema, or "json" without one */
        codec_set(body, "format",
                  r->response_format->schema ? json_incref(r->response_format->schema)
                                             : json_string("json"));
    codec_set(body, "stream", json_boolean(o->stream));
    json_t *opts = json_object();
    if (o->temperature >= 0)
        codec_set(opts, "temperature", json_real(o->temperature));
    if (o->top_p >= 0)
        codec_set(opts, "top_p", json_real(o->top_p));
    if (o->max_tokens > 0)
        codec_set(opts, "num_predict", json_integer(o->max_tokens));
    if (o->num_ctx > 0)
        codec_set(opts, "num_ctx", json_integer(o->num_ctx));
    if (json_object_size(opts))
        codec_set(body, "options", opts);
    else
        json_decref(opts);
    if (o->keep_alive)
        codec_set(body, "keep_alive", json_loads(o->keep_alive, JSON_DECODE_ANY, NULL));
    if (o->think)
        codec_set(body, "think", json_loads(o->think, JSON_DECODE_ANY, NULL));
    return codec_body_text(out, body, o, err);
}

/* ---- reply: a whole body is the stream's one and only line ---- */

typedef struct ollama_stream {
    llm_sink sink;
    pbuf line;          /* the current line, until its '\n' */
    pbuf content, thinking;
    json_t *calls;      /* every call given, in order */
    char *done_reason;
    llm_usage usage;
    int done;
    size_t lines;
    codec_stream_state st;
} ollama_stream;

static int add_piece(pbuf *dst, const json_t *msg, const char *key, llm_text_fn fn, void *ud,
                     char **err)
{
    const json_t *v = json_object_get(msg, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return (*err = pstr_printf("message %s is %s, not a string", key,
                                   llm_json_type_name(v))), -1;
    size_t n = json_string_length(v);
    pbuf_append(dst, json_string_value(v), n);
    if (dst->oom)
        return codec_oom(err);
    if (fn && n)
        fn(ud, json_string_value(v), n);
    return 0;
}

/* One NDJSON object (or the whole non-streamed body). */
static int apply_object(ollama_stream *s, const json_t *o, char **err)
{
    if (!json_is_object(o))
        return (*err = pstr_printf("reply line is %s, not an object", llm_json_type_name(o))), -1;
    const json_t *e = json_object_get(o, "error");
    if (e && !json_is_null(e)) {
        const char *t = json_string_value(e);
        char *clean = t ? llm_clean_text(t, strlen(t)) : NULL;
        *err = pstr_printf("server returned an error: %s", clean ? clean : "(no message)");
        free(clean);
        return -1;
    }
    const json_t *msg = json_object_get(o, "message");
    if (msg && !json_is_object(msg))
        return (*err = pstr_printf("reply message is %s, not an object",
                                   llm_json_type_name(msg))), -1;
    if (!msg && !json_is_true(json_object_get(o, "done")))
        return (*err = pstr_printf("reply has no message")), -1;
    if (add_piece(&s->content, msg, "content", s->sink.text, s->sink.ud, err) != 0 ||
        add_piece(&s->thinking, msg, "thinking", s->sink.reasoning, s->sink.ud, err) != 0)
        return -1;
    const json_t *calls = json_object_get(msg, "tool_calls");
    if (calls && !json_is_null(calls)) {
        if (!json_is_array(calls))
            return (*err = pstr_printf("message tool_calls is not an array")), -1;
        size_t i;
        const json_t *c;
        json_array_foreach(calls, i, c) {
            const json_t *fn = json_object_get(c, "function");
            const json_t *args = json_object_get(fn, "arguments");
            if (!json_is_string(json_object_get(fn, "name")))
                return (*err = pstr_printf("tool call %zu has no function name", i)), -1;
            if (args && !json_is_object(args) && !json_is_string(args) && !json_is_null(args))
                return (*err = pstr_printf("tool call %zu arguments is %s", i,
                                           llm_json_type_name(args))), -1;
            if (json_array_size(s->calls) == LLM_MAX_TOOL_CALLS)
                return llm_too_many_calls(err);
            if (json_array_append(s->calls, (json_t *)c) != 0)
                return codec_oom(err); /* a call left out would be a reply without it */
        }
    }
    if (json_is_true(json_object_get(o, "done"))) {
        s->done = 1;
        const char *reason = json_string_value(json_object_get(o, "done_reason"));
        if (reason && !(s->done_reason = strdup(reason)))
            return codec_oom(err);
        /* prompt_eval_count is the whole prompt as Ollama kept it (fewer tokens than sent
           when it truncated to num_ctx); newer releases say how much of it came from the
           cache in prompt_eval_cached_count */
        s->usage.prompt = codec_count(o, "prompt_eval_count");
        s->usage.cache_read = codec_count(o, "prompt_eval_cached_count");
        s->usage.completion = codec_count(o, "eval_count");
    }
    return 0;
}

static int build_reply(ollama_stream *s, llm_reply *out, char **err)
{
    memset(out, 0, sizeof *out);
    size_t n = json_array_size(s->calls);
    if (n && !(out->calls = calloc(n, sizeof *out->calls)))
        return codec_oom(err);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const json_t *c = json_array_get(s->calls, i);
        const json_t *fn = json_object_get(c, "function");
        const json_t *args = json_object_get(fn, "arguments");
        char *text = json_is_object(args) ? llm_arguments_text(args)
                                          : strdup(json_is_string(args) ? json_string_value(args) : "");
        const char *id = msg_str(c, "id"); /* newer servers may name them */
        rc = text ? llm_fill_call(&out->calls[i], i, id, msg_str(fn, "name"), text, err) : codec_oom(err);
        out->ncalls++;
        out->ids_minted |= !id || !*id;
        free(text);
    }
    if (rc == 0)
        rc = llm_set_content(out, &s->content, err);
    if (rc == 0 && s->thinking.len && !(out->reasoning = pbuf_take(&s->thinking)))
        rc = codec_oom(err);
    /* Ollama says "stop" after tool calls too; say what happened. */
    const char *reason = n ? "tool_calls" : s->done_reason;
    if (rc == 0 && reason && !(out->finish_reason = strdup(reason)))
        rc = codec_oom(err);
    out->usage = s->usage;
    if (rc != 0)
        llm_reply_free(out);
    return rc;
}

static void *ollama_stream_new(const llm_sink *sink)
{
    ollama_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (!(s->calls = json_array())) {
        free(s);
        return NULL;
    }
    s->sink = *sink;
    return s;
}

static void ollama_stream_free(void *v)
{
    ollama_stream *s = v;
    if (!s)
        return;
    pbuf_free(&s->line);
    pbuf_free(&s->content);
    pbuf_free(&s->thinking);
    json_decref(s->calls);
    free(s->done_reason);
    free(s->st.error);
    free(s);
}

static int apply_line(ollama_stream *s, const char *p, size_t n, char **err)
{
    while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (n == 0)
        return 0;
    if (s->done)
        return (*err = pstr_printf("data after the line with \"done\": true")), -1;
    s->lines++;
    json_error_t jerr;
    json_t *o = json_loadb(p, n, 0, &jerr);
    if (!o)
        return (*err = pstr_printf("stream line %zu is not JSON: %s", s->lines, utf8_mend(jerr.text))), -1;
    int rc = apply_object(s, o, err);
    json_decref(o);
    return rc;
}

static int ollama_stream_feed(void *v, const char *data, size_t len, char **err)
{
    ollama_stream *s = v;
    if (codec_stream_dead(&s->st, 0, err) != 0)
        return -1;
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl ? (size_t)(nl - data) : len;
        if (s->line.len + take > MAX_LINE)
            return codec_stream_die(&s->st, pstr_printf("stream line longer than %u bytes", MAX_LINE), err);
        pbuf_append(&s->line, data, take);
        if (s->line.oom)
            return codec_stream_die(&s->st, NULL, err);
        if (!nl)
            break;
        char *msg = NULL;
        int rc = apply_line(s, s->line.data ? s->line.data : "", s->line.len, &msg);
        pbuf_reset(&s->line);
        if (rc != 0)
            return codec_stream_die(&s->st, msg, err);
        data += take + 1;
        len -= take + 1;
    }
    return 0;
}

static int ollama_stream_finish(void *v, llm_reply *out, char **err)
{
    ollama_stream *s = v;
    memset(out, 0, sizeof *out);
    if (codec_stream_dead(&s->st, 1, err) != 0)
        return -1;
    char *msg = NULL;
    if (s->line.len && apply_line(s, s->line.data, s->line.len, &msg) != 0) /* no final '\n' */
        return codec_stream_die(&s->st, msg, err);
    if (!s->done)
        return codec_stream_die(&s->st, pstr_printf(s->lines ? "stream ended before the line with \"done\": true"
                                           : "stream ended without any line"), err);
    if (build_reply(s, out, &msg) != 0)
        return codec_stream_die(&s->st, msg, err);
    return 0;
}

static int ollama_stream_done(const void *v) { return ((const ollama_stream *)v)->done; }

static int ollama_decode(const char *body, size_t len, llm_reply *out, char **err)
{
    llm_sink none = {0};
    ollama_stream *s = ollama_stream_new(&none);
    memset(out, 0, sizeof *out);
    *err = NULL;
    if (!s)
        return codec_oom(err);
    json_error_t jerr;
    json_t *o = json_loadb(body ? body : "", body ? len : 0, 0, &jerr);
    int rc = -1;
    if (o)
        rc = apply_object(s, o, err);
    else
        *err = pstr_printf("response is not JSON: %s", utf8_mend(jerr.text));
    if (rc == 0 && !s->done)
        rc = ((*err = pstr_printf("response is not done (\"done\": true missing)")), -1);
    if (rc == 0)
        rc = build_reply(s, out, err);
    json_decref(o);
    ollama_stream_free(s);
    return rc;
}

/* Ollama's API has no tool_choice: it can leave tools out ("none"), never force a call. */
static parley_status ollama_check_options(const parley_options *o, char **err)
{
    if (strcmp(o->tool_choice, "auto") != 0 && strcmp(o->tool_choice, "none") != 0) {
        *err = pstr_printf("option 'tool_choice': provider ollama cannot force a tool call (its "
                           "API has no tool_choice); use \"auto\" or \"none\"");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    return PARLEY_OK;
}

/* ---- the context window ---- */

/* The number on the "num_ctx N" line of Ollama's parameters text, or 0. */
static long long num_ctx_param(const char *params)
{
    for (const char *p = params; p && (p = strstr(p, "num_ctx")); p += 7) {
        if (p != params && p[-1] != '\n')
            continue;
        const char *q = p + 7;
        while (*q == ' ' || *q == '\t')
            q++;
        long long v = strtoll(q, NULL, 10);
        if (v > 0)
            return v;
    }
    return 0;
}

long long provider_window_from_show(const char *body, size_t len, long long *num_ctx)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    json_t *info = json_object_get(root, "model_info");
    const char *arch = json_string_value(json_object_get(info, "general.architecture"));
    long long n = 0;
    *num_ctx = num_ctx_param(json_string_value(json_object_get(root, "parameters")));
    if (arch) {
        char *key = pstr_printf("%s.context_length", arch);
        if (key)
            n = codec_count(info, key);
        free(key);
    }
    json_decref(root);
    return n;
}

/* POST <base_url>/api/show {"model"}: the model's length and its num_ctx parameter; with
   the num_ctx option Parley sends, the window is that, within the model's length. */
static int ollama_ask_window(const parley_options *o, provider_ask_fn ask, void *ctx,
                             provider_window *out, char **err)
{
    pbuf b = PBUF_INIT;
    char *url = pstr_printf("%s/api/show", o->base_url);
    json_t *req = json_pack("{s:s}", "model", o->model ? o->model : "");
    char *body = req ? json_dumps_whole(req, JSON_COMPACT) : NULL;
    json_decref(req);
    int rc = body ? ask(ctx, url, body, &b, err) : codec_oom(err);
    free(url);
    free(body);
    long long num_ctx = 0;
    long long model_len = rc == 0 ? provider_window_from_show(b.data, b.len, &num_ctx) : 0;
    pbuf_free(&b);
    if (o->num_ctx > 0) {
        out->n_ctx = model_len && model_len < o->num_ctx ? model_len : o->num_ctx;
        out->source = "num_ctx";
        free(*err);
        *err = NULL;
        return 0;
    }
    if (rc != 0)
        return -1;
    out->n_ctx = num_ctx ? num_ctx : model_len;
    out->source = out->n_ctx ? "show" : NULL;
    return 0;
}

/* The num_ctx Parley asks for, else as any server that did not say. */
static long long ollama_default_window(const parley_options *o)
{
    return o->num_ctx > 0 ? o->num_ctx : codec_default_window(o);
}

const provider provider_ollama = {
    .name = "ollama",
    .default_base_url = "http://127.0.0.1:11434",
    .path = "/api/chat",
    .models_path = "/api/tags",
    .not_found_hint = "Ollama's native API is <base_url>/api/chat, base_url http://<host>:11434 without /v1",
    .stream_accept = "Accept: application/x-ndjson",
    .default_max_tokens = 0,
    .headers = codec_bearer_header, /* behind an authenticating proxy, or ollama.com */
    .encode = ollama_encode,
    .decode = ollama_decode,
    .stream_new = ollama_stream_new,
    .stream_feed = ollama_stream_feed,
    .stream_finish = ollama_stream_finish,
    .stream_free = ollama_stream_free,
    .stream_done = ollama_stream_done,
    .error_text = llm_error_text, /* {"error":"..."} */
    .retryable = provider_retryable_default,
    .check_options = ollama_check_options,
    .summary = "native /api/chat",
    .default_window = ollama_default_window,
    .ask_window = ollama_ask_window,
    .truncates_silently = 1, /* a prompt longer than num_ctx loses its start */
};
