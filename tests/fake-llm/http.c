/* The MHD access handler: routing, body collection, delayed replies.
 *
 * MHD calls the handler several times per request: once with the headers,
 * once per piece of body, once with *upload_data_size == 0 when the body is
 * complete, and once more after each resume if we suspended. The reply is
 * decided on the "body complete" call; a delayed reply is kept in the
 * request and queued on the call that follows the resume. */
#include "fakellm.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct request {
    buf_t body;
    bool too_big;     /* body exceeded FAKE_MAX_BODY: discard it, answer 413 */
    bool decided;     /* the reply has been decided (and logged) */
    bool suspended;   /* suspended by us, waiting for the timer */
    struct MHD_Response *pending; /* reply to queue after the resume; NULL = hang */
    unsigned pending_status;
};

/* What the router decided for one request. */
struct outcome {
    unsigned status;
    struct MHD_Response *resp; /* NULL only when hang */
    bool hang;
    uint64_t delay_ms;
    char fault[64]; /* empty = no fault applied */
    struct prompt_stats ps; /* a chat request's prompt, as the prompt model saw it */
};

void http_suspend_until(struct MHD_Connection *conn, uint64_t due_ms)
{
    atomic_fetch_add(&g_suspended, 1);
    MHD_suspend_connection(conn);
    timer_resume_at(conn, due_ms);
}

void http_resumed(void)
{
    atomic_fetch_sub(&g_suspended, 1);
}

static struct MHD_Response *buffer_response(char *data, size_t len, const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    return r;
}

static void set_error(struct outcome *o, struct api_error *e)
{
    size_t len;
    char *json = api_error_json(e, &len);
    o->status = e->status;
    o->resp = buffer_response(json, len, "application/json");
    api_error_free(e);
}

static void set_dialect_error(struct outcome *o, enum dialect d, struct api_error *e)
{
    size_t len;
    char *json = dialect_error_json(d, e, &len);
    o->status = e->status;
    o->resp = buffer_response(json, len, "application/json");
    api_error_free(e);
}

static void set_json(struct outcome *o, unsigned status, char *json, size_t len)
{
    o->status = status;
    o->resp = buffer_response(json, len, "application/json");
}

/* ---------------------------------------------------------- chat */

static long max_answer_tokens(const json_t *native);

static void chat_reply_response(struct MHD_Connection *conn, const struct chat_request *req,
                                const struct fault *f, unsigned long seq, enum dialect dialect, json_t *native,
                                struct outcome *o)
{
    struct chat_reply rep;
    chat_reply_build(req, seq, f->kind == FAULT_ENDLESS_TOOLS, &rep);
    long max_tokens = max_answer_tokens(native);
    if (g_cfg.honor_max_tokens && max_tokens > 0)
        prompt_cut_answer(&rep, (size_t)max_tokens);
    if (dialect == DIALECT_OPENAI && g_cfg.overflow_style == OVERFLOW_LLAMACPP)
        prompt_context_end(&o->ps, &rep);
    prompt_answered(&o->ps, &rep);
    if (f->kind == FAULT_INVALID_UTF8) {
        /* A plain text reply whose content holds 0xC3 0x28 once encoded. */
        chat_reply_free(&rep);
        rep.content = xstrdup("Invalid UTF-8 ahead: " INVALID_UTF8_MARK " (bytes C3 28).");
        rep.finish_reason = "stop";
    }
    bool paced_fault = f->kind == FAULT_SLOW_STREAM || f->kind == FAULT_STREAM_CUT;
    struct paced_opts po = {
        .gap_ms = f->kind == FAULT_SLOW_STREAM ? f->arg : 0,
        .cut = f->kind == FAULT_STREAM_CUT,
        .abort_at_cut = f->kind == FAULT_STREAM_CUT && f->arg == 1,
        .poison_utf8 = f->kind == FAULT_INVALID_UTF8,
        .hold_open = f->kind == FAULT_DONE_HOLD, /* streams only: a JSON body ends normally */
        .keepalive_ms = f->kind == FAULT_DONE_HOLD ? f->arg : 0,
    };
    o->status = MHD_HTTP_OK;

    if (req->stream && f->kind != FAULT_TRUNCATED && f->kind != FAULT_RESET) {
        struct segments segs = {0};
        if (dialect == DIALECT_ANTHROPIC)
            anthropic_sse_build(req, &rep, seq, &o->ps, native, &segs);
        else if (dialect == DIALECT_OLLAMA)
            ollama_ndjson_build(req, &rep, &o->ps, native, &segs);
        else
            sse_build(req, &rep, seq, &o->ps, po.poison_utf8, &segs);
        o->resp = paced_response(conn, &segs, &po,
                                 dialect == DIALECT_OLLAMA ? "application/x-ndjson"
                                                           : "text/event-stream");
        chat_reply_free(&rep);
        return;
    }

    size_t len;
    char *json = dialect == DIALECT_ANTHROPIC
                     ? anthropic_message_json(req, &rep, seq, &o->ps, native, &len)
                 : dialect == DIALECT_OLLAMA
                     ? ollama_chat_json(req, &rep, &o->ps, native, &len)
                     : chat_completion_json(req, &rep, seq, &o->ps, &len);
    chat_reply_free(&rep);
    if (po.poison_utf8)
        len = utf8_poison(json, len);
    if (f->kind == FAULT_TRUNCATED) {
        set_json(o, MHD_HTTP_OK, json, len / 2);
    } else if (f->kind == FAULT_RESET) {
        o->resp = fault_reset_response(json, len);
    } else if (paced_fault) {
        struct segments segs = {0};
        segments_split(json, len, 8, &segs);
        free(json);
        o->resp = paced_response(conn, &segs, &po, "application/json");
    } else {
        set_json(o, MHD_HTTP_OK, json, len);
    }
}

/* Ollama's silent truncation: the oldest messages go until the prompt fits num_ctx.
 * Takes body (a translation, never the native request) and returns what the model sees. */
static json_t *ollama_fit(json_t *body, size_t window, struct prompt_stats *ps)
{
    size_t dropped;
    json_t *cut = prompt_ollama_truncate(body, window, &dropped);
    struct rendered sent = {0};
    prompt_render_chat(body, &sent);
    ps->sent_tokens = sent.ntok;
    ps->dropped_messages = dropped;
    rendered_free(&sent);
    json_decref(body);
    return cut;
}

/* The answer's size limit the request asks for (Ollama: options.num_predict), or -1. */
static long max_answer_tokens(const json_t *native)
{
    const json_t *v = json_object_get(native, "max_completion_tokens");
    if (!json_is_integer(v))
        v = json_object_get(native, "max_tokens");
    if (!json_is_integer(v))
        v = json_object_get(json_object_get(native, "options"), "num_predict");
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* llama.cpp before October 2025 answered a streamed request that failed before its
 * first token with HTTP 200 and one "error: {...}" line (server_sent_event(sink, "error",
 * error_data): the error object itself, not under "error").  Takes body. */
static void legacy_stream_error(char *body, size_t len, struct outcome *o)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    size_t n;
    char *inner = json_dump_compact(json_object_get(root, "error"), &n);
    buf_t b = {0};
    buf_puts(&b, "error: ");
    buf_append(&b, inner, n);
    buf_puts(&b, "\n\n");
    free(inner);
    json_decref(root);
    free(body);
    o->status = MHD_HTTP_OK;
    o->resp = buffer_response(b.data, b.len, "text/event-stream");
}

/* The prompt model (prompt.c): count the prompt, refuse it when it does not fit the
 * window, else match it against the prompt cache.  false: o holds the overflow answer. */
static bool model_prompt(enum dialect dialect, const json_t *body, const json_t *native,
                         size_t window, struct outcome *o)
{
    struct rendered rp = {0};
    if (dialect == DIALECT_ANTHROPIC)
        prompt_render_anthropic(native, &rp);
    else
        prompt_render_chat(body, &rp);
    o->ps.window = window;
    size_t len;
    char *refusal = prompt_overflow_body(dialect, rp.ntok, window,
                                         dialect == DIALECT_OLLAMA ? -1 : max_answer_tokens(native),
                                         &len);
    if (refusal) {
        o->ps.valid = o->ps.overflow = true;
        o->ps.prompt_tokens = rp.ntok;
        o->ps.slot = o->ps.extends = -1;
        if (g_cfg.overflow_style == OVERFLOW_LLAMACPP_OLD && dialect == DIALECT_OPENAI &&
            json_is_true(json_object_get(native, "stream")))
            legacy_stream_error(refusal, len, o);
        else
            set_json(o, 400, refusal, len);
    } else {
        prompt_account(&rp, &o->ps);
    }
    rendered_free(&rp);
    return refusal == NULL;
}

static void handle_chat(struct MHD_Connection *conn, const struct request *r, json_t *body,
                        unsigned long seq, enum dialect dialect, struct outcome *o)
{
    struct api_error err = {0};
    struct chat_request req;
    json_t *native = body; /* the request as sent; body: its Chat Completions form */
    const char *version = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "anthropic-version");
    if (dialect == DIALECT_ANTHROPIC && (!version || strcmp(version, "2023-06-01") != 0)) {
        api_error_set(&err, 400, "invalid_request_error", NULL, NULL,
                      "anthropic-version: header is required (2023-06-01)");
        set_dialect_error(o, dialect, &err);
        return;
    }
    if (dialect != DIALECT_OPENAI) {
        body = dialect == DIALECT_ANTHROPIC ? anthropic_to_chat(native, &err)
                                            : ollama_to_chat(native, &err);
        if (!body) {
            set_dialect_error(o, dialect, &err);
            return;
        }
    }
    size_t window = prompt_window(dialect, native);
    if (dialect == DIALECT_OLLAMA && window)
        body = ollama_fit(body, window, &o->ps);
    if (!chat_parse(body, &req, &err) ||
        (dialect != DIALECT_ANTHROPIC && !openai_check_extra(&req, &err)) ||
        (dialect == DIALECT_ANTHROPIC && !anthropic_check_thinking(native, req.user_text, &err)) ||
        (dialect == DIALECT_ANTHROPIC && !anthropic_check_breakpoints(native, &err))) {
        set_dialect_error(o, dialect, &err);
        chat_request_free(&req);
        if (body != native)
            json_decref(body);
        return;
    }

    if (!model_prompt(dialect, body, native, window, o))
        goto out;

    /* Per-request markers override the command line. */
    struct fault f = g_cfg.fault;
    const char *v;
    size_t vlen;
    if (marker_find(req.user_text, "fault", &v, &vlen) && (!v || !fault_parse(v, vlen, &f))) {
        api_error_set(&err, 400, "invalid_request_error", "messages", "fake_bad_marker",
                      "parley-fake-llm: unknown fault mode '%.*s' in [[fault:...]] marker.",
                      (int)vlen, v ? v : "");
        set_error(o, &err);
        goto out;
    }
    if (marker_find(req.user_text, "quota", NULL, NULL)) {
        /* [[quota]]: OpenAI's 429 for an account out of credit (retrying cannot help). */
        api_error_set(&err, 429, "insufficient_quota", NULL, "insufficient_quota",
                      "You exceeded your current quota, please check your plan and billing "
                      "details.");
        set_dialect_error(o, dialect, &err);
        goto out;
    }
    if (f.kind == FAULT_HEADER_FLOOD && g_cfg.fault.kind != FAULT_HEADER_FLOOD) {
        api_error_set(&err, 400, "invalid_request_error", "messages", "fake_bad_marker",
                      "parley-fake-llm: header_flood needs --fault header_flood (memory limit).");
        set_error(o, &err);
        goto out;
    }
    if (marker_find(req.user_text, "latency", &v, &vlen)) {
        unsigned long ms;
        if (!v || !parse_ulong(v, vlen, &ms)) {
            api_error_set(&err, 400, "invalid_request_error", "messages", "fake_bad_marker",
                          "parley-fake-llm: bad [[latency:MS]] marker.");
            set_error(o, &err);
            goto out;
        }
        o->delay_ms = ms;
    }
    if (!fault_fires(&f, r->body.data ? r->body.data : "", r->body.len))
        f.kind = FAULT_NONE;
    if (f.kind == FAULT_ENDLESS_TOOLS && (!req.tools || req.choice == CHOICE_NONE))
        f.kind = FAULT_NONE; /* nothing to loop on: answer normally */
    if (f.kind != FAULT_NONE)
        snprintf(o->fault, sizeof o->fault, "%s", f.name);
    req.schema_mismatch = f.kind == FAULT_SCHEMA_MISMATCH;

    size_t len;
    switch (f.kind) {
    case FAULT_STATUS:
        o->status = f.status;
        o->resp = fault_status_response(&f);
        break;
    case FAULT_HANG:
        o->hang = true;
        break;
    case FAULT_NOT_JSON:
        o->status = MHD_HTTP_OK;
        o->resp = buffer_response(xstrdup("<html>oops</html>"), 17, "text/html");
        break;
    case FAULT_BAD_SHAPE: {
        char *json = chat_bad_shape_json(&req, seq, f.arg, &len);
        set_json(o, MHD_HTTP_OK, json, len);
        break;
    }
    case FAULT_ERROR_200: { /* a proxy's or mock's error with a 200, or inside the stream */
        bool event = f.arg && req.stream;
        char *json = fault_error_body(&f, dialect, event, &len);
        o->status = MHD_HTTP_OK;
        o->resp = buffer_response(json, len, !event ? "application/json"
                                             : dialect == DIALECT_OLLAMA ? "application/x-ndjson"
                                                                         : "text/event-stream");
        break;
    }
    case FAULT_OVERSIZED:
        o->status = MHD_HTTP_OK;
        o->resp = fault_oversized_response(req.model, seq, f.arg);
        break;
    default:
        chat_reply_response(conn, &req, &f, seq, dialect, native, o);
        if (f.kind == FAULT_HEADER_FLOOD)
            fault_header_flood(o->resp, f.arg);
        break;
    }
out:
    chat_request_free(&req);
    if (body != native)
        json_decref(body);
}

/* ---------------------------------------------------------- routing */

/* One model, fake-model; with --n-ctx, vLLM's max_model_len. */
static void models_response(struct outcome *o)
{
    json_t *m = json_pack("{s:s,s:s,s:i,s:s}", "id", FAKE_MODEL_ID, "object", "model", "created",
                          1700000000, "owned_by", "parley-fake-llm");
    if (g_cfg.n_ctx)
        json_object_set_new(m, "max_model_len", json_integer((json_int_t)g_cfg.n_ctx));
    json_t *list = json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    size_t len;
    char *s = json_dump_compact(list, &len);
    json_decref(list);
    set_json(o, MHD_HTTP_OK, s, len);
}

/* llama.cpp's GET /props: the slots' window in default_generation_settings.n_ctx. */
static void props_response(struct outcome *o)
{
    json_t *p = json_pack("{s:{s:i,s:I,s:{s:i}},s:I,s:s,s:s}", "default_generation_settings",
                          "id", 0, "n_ctx", (json_int_t)g_cfg.n_ctx, "params", "n_predict", -1,
                          "total_slots", (json_int_t)g_cfg.slots, "model_path",
                          FAKE_MODEL_ID ".gguf", "chat_template", "parley-fake-llm");
    size_t len;
    char *s = json_dump_compact(p, &len);
    json_decref(p);
    set_json(o, MHD_HTTP_OK, s, len);
}

/* Ollama's POST /api/show: model_info "<arch>.context_length" (the model's own window,
 * --n-ctx) and, as a Modelfile PARAMETER, num_ctx. */
static void show_response(const json_t *body, struct outcome *o)
{
    const char *model = json_string_value(json_object_get(body, "model"));
    if (!model || strcmp(model, FAKE_MODEL_ID) != 0) {
        char *msg = NULL;
        if (asprintf(&msg, "{\"error\":\"model '%s' not found\"}", model ? model : "") < 0)
            abort();
        set_json(o, 404, msg, strlen(msg));
        return;
    }
    json_t *info = json_pack("{s:s}", "general.architecture", "fake");
    buf_t params = {0};
    if (g_cfg.n_ctx) {
        json_object_set_new(info, "fake.context_length", json_integer((json_int_t)g_cfg.n_ctx));
        buf_printf(&params, "num_ctx                        %zu", g_cfg.n_ctx);
    }
    json_t *show = json_pack("{s:s,s:s,s:s,s:{s:s,s:s},s:o,s:[s,s]}", "license", "",
                             "modelfile", "FROM fake-model", "parameters",
                             params.data ? params.data : "", "details", "format", "gguf",
                             "family", "fake", "model_info", info, "capabilities", "completion",
                             "tools");
    buf_free(&params);
    size_t len;
    char *s = json_dump_compact(show, &len);
    json_decref(show);
    set_json(o, MHD_HTTP_OK, s, len);
}

static bool is_get(const char *method)
{
    return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
}

static void route(struct MHD_Connection *conn, const struct request *r, const char *url,
                  const char *method, json_t *body, unsigned long seq, struct outcome *o)
{
    struct api_error err = {0};
    if (r->too_big) {
        api_error_set(&err, 413, "invalid_request_error", NULL, "request_too_large",
                      "Request body too large: the limit is %zu bytes.", FAKE_MAX_BODY);
        set_error(o, &err);
        o->delay_ms = 0; /* may be answered before the body is read: never suspend */
    } else if (strcmp(method, "POST") == 0 &&
               (strcmp(url, "/v1/chat/completions") == 0 ||
                strcmp(url, "/chat/completions") == 0)) {
        handle_chat(conn, r, body, seq, DIALECT_OPENAI, o);
    } else if (strcmp(method, "POST") == 0 && strcmp(url, "/v1/messages") == 0) {
        handle_chat(conn, r, body, seq, DIALECT_ANTHROPIC, o);
    } else if (strcmp(method, "POST") == 0 && strcmp(url, "/api/chat") == 0) {
        handle_chat(conn, r, body, seq, DIALECT_OLLAMA, o);
    } else if (is_get(method) && (strcmp(url, "/v1/models") == 0 || strcmp(url, "/models") == 0)) {
        models_response(o);
    } else if (is_get(method) && strcmp(url, "/props") == 0) {
        props_response(o);
    } else if (strcmp(method, "POST") == 0 && strcmp(url, "/api/show") == 0) {
        show_response(body, o);
    } else if (is_get(method) && strcmp(url, "/api/tags") == 0) { /* Ollama's model list */
        static const char tags[] = "{\"models\":[{\"name\":\"" FAKE_MODEL_ID "\",\"model\":\""
                                   FAKE_MODEL_ID "\",\"size\":1}]}";
        set_json(o, MHD_HTTP_OK, xstrdup(tags), sizeof tags - 1);
    } else if (is_get(method) && strcmp(url, "/health") == 0) {
        o->status = MHD_HTTP_OK;
        o->resp = buffer_response(xstrdup("ok"), 2, "text/plain");
        o->delay_ms = 0; /* readiness probes should never wait */
    } else {
        api_error_set(&err, 404, "invalid_request_error", NULL, "unknown_url",
                      "Invalid URL (%s %s)", method, url);
        set_error(o, &err);
    }
}

static const char *header(struct MHD_Connection *conn, const char *name)
{
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

/* The client's TCP port: requests with the same one came on the same connection. */
static int client_port(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return -1;
    if (ci->client_addr->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_port);
    if (ci->client_addr->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)ci->client_addr)->sin6_port);
    return -1;
}

/* Decides, logs and sends (or schedules) the reply for a complete request. */
static enum MHD_Result dispatch(struct MHD_Connection *conn, struct request *r, const char *url,
                                const char *method)
{
    unsigned long seq = atomic_fetch_add(&g_seq, 1) + 1;
    json_t *body = NULL;
    if (r->body.len)
        body = json_loadb(r->body.data, r->body.len, JSON_DECODE_ANY, NULL);

    struct outcome o = {.delay_ms = g_cfg.latency_ms};
    route(conn, r, url, method, body, seq, &o);

    /* Anthropic's key travels in x-api-key: logged as "x-api-key KEY". */
    const char *auth = header(conn, MHD_HTTP_HEADER_AUTHORIZATION);
    char *xkey = NULL;
    if (!auth && header(conn, "x-api-key") &&
        asprintf(&xkey, "x-api-key %s", header(conn, "x-api-key")) > 0)
        auth = xkey;
    reqlog_write(seq, method, url, auth,
                 header(conn, MHD_HTTP_HEADER_CONTENT_TYPE), body, r->body.data, r->body.len,
                 o.hang ? -1 : (int)o.status, o.fault[0] ? o.fault : NULL, client_port(conn),
                 &o.ps);
    if (!g_cfg.quiet)
        fprintf(stderr, "fake-llm: #%lu %s %s -> %s%u%s%s\n", seq, method, url,
                o.hang ? "hang" : "", o.hang ? 0 : o.status, o.fault[0] ? " fault=" : "",
                o.fault);
    json_decref(body);
    free(xkey);
    buf_free(&r->body);
    r->decided = true;

    if (atomic_load(&g_shutting_down)) {
        if (o.resp)
            MHD_destroy_response(o.resp);
        return MHD_NO;
    }
    if (o.hang || o.delay_ms) {
        r->pending = o.resp;
        r->pending_status = o.status;
        r->suspended = true;
        http_suspend_until(conn, o.hang ? TIMER_NEVER : now_ms() + o.delay_ms);
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(conn, o.status, o.resp);
    MHD_destroy_response(o.resp);
    return ret;
}

enum MHD_Result http_handler(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload_data,
                             size_t *upload_data_size, void **con_cls)
{
    (void)cls;
    (void)version;
    struct request *r = *con_cls;

    if (!r) { /* headers only so far */
        r = xmalloc(sizeof *r);
        memset(r, 0, sizeof *r);
        *con_cls = r;
        const char *cl = header(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > FAKE_MAX_BODY) {
            /* Refuse before reading the body; MHD closes the connection after. */
            r->too_big = true;
            return dispatch(conn, r, url, method);
        }
        return MHD_YES;
    }

    if (*upload_data_size) {
        if (!r->too_big && r->body.len + *upload_data_size > FAKE_MAX_BODY) {
            r->too_big = true; /* chunked upload grew too big: drop it */
            buf_free(&r->body);
        }
        if (!r->too_big && !r->decided)
            buf_append(&r->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }

    if (r->suspended) { /* the timer resumed us */
        r->suspended = false;
        http_resumed();
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        if (!resp) /* hang: only shutdown resumes it */
            return MHD_NO;
        enum MHD_Result ret = MHD_NO;
        if (!atomic_load(&g_shutting_down))
            ret = MHD_queue_response(conn, r->pending_status, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (r->decided)
        return MHD_YES; /* response already queued (early 413) */
    return dispatch(conn, r, url, method);
}

void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    struct request *r = *con_cls;
    if (!r)
        return;
    if (r->suspended)
        http_resumed();
    if (r->pending)
        MHD_destroy_response(r->pending);
    buf_free(&r->body);
    free(r);
    *con_cls = NULL;
}
