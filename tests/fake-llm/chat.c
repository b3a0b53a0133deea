/* Chat Completions replies: markers, the deterministic reply rules and the
 * non-streaming response bodies. */
#include "fakellm.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ markers */

bool marker_find(const char *text, const char *name, const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(text, "[["); p; p = strstr(p + 1, "[[")) {
        const char *q = p + 2;
        if (strncmp(q, name, nl) != 0)
            continue;
        q += nl;
        if (q[0] == ']' && q[1] == ']') {
            if (value)
                *value = NULL;
            if (vlen)
                *vlen = 0;
            return true;
        }
        if (*q == ':') {
            const char *end = strstr(q + 1, "]]");
            if (!end)
                return false;
            if (value)
                *value = q + 1;
            if (vlen)
                *vlen = (size_t)(end - q - 1);
            return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------ replies */

static void add_call(struct chat_reply *r, unsigned long seq, const char *name, size_t nlen,
                     const char *args, size_t alen)
{
    if ((r->ncalls & (r->ncalls - 1)) == 0) /* grow at powers of two */
        r->calls = xrealloc(r->calls, (r->ncalls ? r->ncalls * 2 : 1) * sizeof *r->calls);
    struct tool_call *c = &r->calls[r->ncalls];
    char id[64];
    snprintf(id, sizeof id, "call_%lu_%zu", seq, r->ncalls);
    c->id = xstrdup(id);
    c->name = xstrndup(name, nlen);
    c->args = alen ? xstrndup(args, alen) : xstrdup("{}");
    r->ncalls++;
}

static const char *tool_name_at(const json_t *tools, size_t k)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"),
                                             "name"));
}

static bool tool_offered(const json_t *tools, const char *name)
{
    for (size_t k = 0; k < json_array_size(tools); k++)
        if (strcmp(tool_name_at(tools, k), name) == 0)
            return true;
    return false;
}

/* Each "[[tool:NAME ARGS]]" becomes a call; ARGS is passed through verbatim. */
static void marker_calls(const char *u, unsigned long seq, struct chat_reply *out)
{
    static const char tag[] = "[[tool:";
    for (const char *p = strstr(u, tag); p; p = strstr(p + 1, tag)) {
        const char *name = p + sizeof tag - 1;
        const char *end = strstr(name, "]]");
        if (!end)
            return;
        const char *q = name;
        while (q < end && !isspace((unsigned char)*q))
            q++;
        size_t nlen = (size_t)(q - name);
        while (q < end && isspace((unsigned char)*q))
            q++;
        if (nlen)
            add_call(out, seq, name, nlen, q, (size_t)(end - q));
    }
}

/* Finds phrase (case-insensitive, whole words) and returns what follows it. */
static const char *after_phrase(const char *s, const char *phrase)
{
    size_t pl = strlen(phrase);
    for (const char *p = strcasestr(s, phrase); p; p = strcasestr(p + 1, phrase)) {
        if (p > s && isalnum((unsigned char)p[-1]))
            continue;
        if (isalnum((unsigned char)p[pl]))
            continue;
        return p + pl;
    }
    return NULL;
}

static bool word_is(const char *w, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(w, lit, n) == 0;
}

/* Extracts the device name in "... the kitchen light ...": words after an
 * optional article, up to "light(s)", punctuation or the end; with
 * until_on, up to the word "on" (which must be present). */
static char *extract_target(const char *s, bool until_on)
{
    buf_t b = {0};
    const char *light = NULL;
    size_t light_len = 0, words = 0;
    bool found_on = false;
    for (;;) {
        while (*s == ' ' || *s == '\t')
            s++;
        const char *w = s;
        while (*s && !isspace((unsigned char)*s) && !strchr(".,!?;:\"", *s))
            s++;
        size_t n = (size_t)(s - w);
        if (n == 0)
            break;
        bool stop_after = *s && !isspace((unsigned char)*s); /* punctuation ends the phrase */
        if (until_on && word_is(w, n, "on")) {
            found_on = true;
            break;
        }
        if (word_is(w, n, "light") || word_is(w, n, "lights")) {
            light = w;
            light_len = n;
            if (!until_on)
                break;
        } else if (words == 0 && b.len == 0 &&
                   (word_is(w, n, "the") || word_is(w, n, "a") || word_is(w, n, "an") ||
                    word_is(w, n, "my"))) {
            /* skip a leading article */
        } else if (words < 6) {
            if (b.len)
                buf_append(&b, " ", 1);
            buf_append(&b, w, n);
            words++;
        }
        if (stop_after)
            break;
    }
    if ((until_on && !found_on) || (b.len == 0 && !light)) {
        buf_free(&b);
        return NULL;
    }
    if (b.len == 0)
        buf_append(&b, light, light_len);
    return buf_take(&b, NULL);
}

static bool heuristic_call(const char *u, const json_t *tools, unsigned long seq,
                           struct chat_reply *out)
{
    static const struct {
        const char *phrase, *tool;
        bool until_on;
    } rules[] = {
        {"turn on", "turn_on", false},     {"switch on", "turn_on", false},
        {"turn off", "turn_off", false},   {"switch off", "turn_off", false},
        {"is the", "get_state", true},     {"state of", "get_state", false},
        {"status of", "get_state", false},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (!tool_offered(tools, rules[i].tool))
            continue;
        const char *rest = after_phrase(u, rules[i].phrase);
        if (!rest)
            continue;
        char *target = extract_target(rest, rules[i].until_on);
        if (!target)
            continue;
        json_t *args = json_object();
        json_object_set_new(args, "name", json_string_lossy(target, strlen(target)));
        size_t alen;
        char *a = json_dump_compact(args, &alen);
        json_decref(args);
        add_call(out, seq, rules[i].tool, strlen(rules[i].tool), a, alen);
        free(a);
        free(target);
        return true;
    }
    return false;
}

/* A forced call: its arguments are what the tool's parameters schema describes (an
 * Anthropic answer tool's input is the structured answer). */
static void forced_call(const struct chat_request *req, unsigned long seq, const char *name,
                        struct chat_reply *out)
{
    const json_t *params = NULL;
    for (size_t k = 0; k < json_array_size(req->tools); k++)
        if (strcmp(tool_name_at(req->tools, k), name) == 0)
            params = json_object_get(json_object_get(json_array_get(req->tools, k), "function"),
                                     "parameters");
    char *args = json_object_get(params, "properties")
                     ? schema_answer(params, req->user_text, req->schema_mismatch)
                     : xstrdup("{}");
    add_call(out, seq, name, strlen(name), args, strlen(args));
    free(args);
}

static bool plan_tool_calls(const struct chat_request *req, unsigned long seq,
                            struct chat_reply *out)
{
    if (req->last_is_tool) { /* after results only a forced choice calls again: the last
                                tool offered (Parley's answer tool comes last) */
        if (req->choice == CHOICE_REQUIRED)
            forced_call(req, seq, tool_name_at(req->tools, json_array_size(req->tools) - 1), out);
        if (req->choice == CHOICE_FUNCTION)
            forced_call(req, seq, req->forced_tool, out);
        return out->ncalls > 0;
    }
    marker_calls(req->user_text, seq, out);
    if (out->ncalls == 0)
        heuristic_call(req->user_text, req->tools, seq, out);
    if (out->ncalls == 0 && req->choice == CHOICE_REQUIRED)
        forced_call(req, seq, tool_name_at(req->tools, json_array_size(req->tools) - 1), out);
    if (out->ncalls == 0 && req->choice == CHOICE_FUNCTION)
        forced_call(req, seq, req->forced_tool, out);
    return out->ncalls > 0;
}

/* Rule 1: "Done. name: result; name: result (messages: M)". */
static void tool_results_text(const struct chat_request *req, buf_t *b)
{
    json_t *msgs = json_object_get(req->body, "messages");
    size_t n = json_array_size(msgs), start = n;
    while (start > 0 && strcmp(chat_role_of(json_array_get(msgs, start - 1)), "tool") == 0)
        start--;
    /* Validation guarantees messages[start-1] is the assistant tool_calls turn. */
    json_t *calls = json_object_get(json_array_get(msgs, start - 1), "tool_calls");
    buf_puts(b, "Done. ");
    for (size_t i = start; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        const char *id = json_string_value(json_object_get(m, "tool_call_id"));
        const char *name = "?";
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *c = json_array_get(calls, k);
            if (strcmp(json_string_value(json_object_get(c, "id")), id) == 0)
                name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
        }
        char *text = chat_content_text(json_object_get(m, "content"));
        buf_printf(b, "%s%s: %s", i > start ? "; " : "", name, text);
        free(text);
    }
    buf_printf(b, " (messages: %zu)", req->n_messages);
}

/* The text of the request's first user message (malloc'd), or NULL. */
static char *first_user_text(const struct chat_request *req)
{
    json_t *msgs = json_object_get(req->body, "messages");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && strcmp(role, "user") == 0) {
            char *text = chat_content_text(json_object_get(m, "content"));
            free(cut_turn_note(text)); /* the user's words only */
            return text;
        }
    }
    return NULL;
}

/* Rule 3: echo markers or "You said: ...". */
static void plain_text(const struct chat_request *req, buf_t *b)
{
    const char *u = req->user_text;
    if (marker_find(u, "echo-request", NULL, NULL)) {
        size_t len;
        char *s = json_dump_compact(req->body, &len);
        buf_append(b, s, len);
        free(s);
    } else if ((req->system_text || req->turn_note) && marker_find(u, "echo-system", NULL, NULL)) {
        buf_puts(b, req->system_text ? req->system_text : "");
        if (req->turn_note) /* the turn's instructions after the system prompt's */
            buf_printf(b, "%s%s", req->system_text ? "\n\n" : "", req->turn_note);
    } else if (marker_find(u, "recall", NULL, NULL)) {
        /* Shows memory in the demo: only history can tell what came first. */
        char *first = first_user_text(req);
        buf_printf(b, "Your first message was: \"%s\". I have seen %zu messages (%zu from you).",
                   first ? first : u, req->n_messages, req->n_user);
        free(first);
    } else {
        buf_printf(b, "You said: \"%s\". I have seen %zu messages (%zu from you).", u,
                   req->n_messages, req->n_user);
        if (marker_find(u, "ask", NULL, NULL))
            buf_puts(b, " Anything else?");
    }
}

/* "[[call-ids:A,B,...]]": the calls get these ids in order (an empty one is
   sent as ""), so a test can make a model that repeats or omits ids. */
static void apply_call_ids(const char *u, struct chat_reply *r)
{
    const char *v;
    size_t n;
    if (!marker_find(u, "call-ids", &v, &n) || !v)
        return;
    r->ids_given = true;
    for (size_t i = 0; i < r->ncalls; i++) {
        const char *comma = memchr(v, ',', n);
        size_t len = comma ? (size_t)(comma - v) : n;
        free(r->calls[i].id);
        r->calls[i].id = xstrndup(v, len);
        if (!comma)
            return;
        n -= len + 1;
        v = comma + 1;
    }
}

void chat_reply_build(const struct chat_request *req, unsigned long seq, bool endless_tools,
                      struct chat_reply *out)
{
    memset(out, 0, sizeof *out);
    bool tools_ok = req->tools && req->choice != CHOICE_NONE;
    if (endless_tools && tools_ok) {
        const char *n = tool_name_at(req->tools, 0);
        add_call(out, seq, n, strlen(n), "{}", 2);
        apply_call_ids(req->user_text, out);
        out->finish_reason = "tool_calls";
        return;
    }
    if (tools_ok && plan_tool_calls(req, seq, out)) {
        apply_call_ids(req->user_text, out);
        out->finish_reason = "tool_calls";
        reasoning_apply(req, out);
        return;
    }
    buf_t b = {0};
    if (req->response_json) { /* structured output: the schema's JSON, nothing else */
        char *json = schema_answer(req->response_schema, req->user_text, req->schema_mismatch);
        buf_puts(&b, json);
        free(json);
    } else {
        if (req->choice == CHOICE_NONE && req->has_tool_msgs)
            buf_puts(&b, "Final: ");
        if (req->last_is_tool)
            tool_results_text(req, &b);
        else
            plain_text(req, &b);
    }
    out->content = buf_take(&b, NULL);
    out->finish_reason = "stop";
    reasoning_apply(req, out);
}

void chat_reply_free(struct chat_reply *r)
{
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].args);
    }
    free(r->calls);
    free(r->content);
    free(r->reasoning);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ bodies */

/* The answer's tokens (bytes/4 + 1: a reply's size, not the prompt model's business). */
static json_int_t completion_tokens(const struct chat_reply *r)
{
    size_t out_bytes = r->content ? strlen(r->content) : 0;
    for (size_t i = 0; i < r->ncalls; i++)
        out_bytes += strlen(r->calls[i].name) + strlen(r->calls[i].args);
    if (r->completion_tokens > 0) /* [[ctx-full]]: reported instead of the computed count */
        return r->completion_tokens;
    return (json_int_t)(out_bytes / 4 + 1);
}

json_t *chat_usage(const struct prompt_stats *ps, const struct chat_reply *r)
{
    json_int_t p = (json_int_t)ps->prompt_tokens, c = completion_tokens(r);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(p));
    json_object_set_new(u, "completion_tokens", json_integer(c));
    json_object_set_new(u, "total_tokens", json_integer(p + c));
    json_object_set_new(u, "prompt_tokens_details",
                        json_pack("{s:I}", "cached_tokens", (json_int_t)ps->cached_tokens));
    return u;
}

/* llama.cpp's result_timings::to_json (server-task.cpp): prompt_n is what it evaluated,
 * cache_n what it reused from the slot.  The times are made up: 1 ms per prompt token,
 * 10 ms per generated one. */
json_t *chat_timings(const struct prompt_stats *ps, const struct chat_reply *r)
{
    if (g_cfg.cache != CACHE_LLAMACPP)
        return NULL;
    json_int_t pn = (json_int_t)ps->evaluated, gn = completion_tokens(r);
    return json_pack("{s:I,s:I,s:f,s:f,s:f,s:I,s:f,s:f,s:f}", "cache_n",
                     (json_int_t)ps->cached_tokens, "prompt_n", pn, "prompt_ms", (double)pn,
                     "prompt_per_token_ms", 1.0, "prompt_per_second", 1000.0, "predicted_n", gn,
                     "predicted_ms", 10.0 * (double)gn, "predicted_per_token_ms", 10.0,
                     "predicted_per_second", 100.0);
}

json_t *chat_object_base(const struct chat_request *req, unsigned long seq, const char *object)
{
    char id[48];
    snprintf(id, sizeof id, "chatcmpl-%lu", seq);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(o, "model", json_string_lossy(req->model, strlen(req->model)));
    json_object_set_new(o, "system_fingerprint", json_string("fp_fake"));
    return o;
}

char *chat_completion_json(const struct chat_request *req, const struct chat_reply *r,
                           unsigned long seq, const struct prompt_stats *ps, size_t *len)
{
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content",
                        r->content ? json_string_lossy(r->content, strlen(r->content))
                                   : json_null());
    if (r->reasoning) /* llama.cpp's and DeepSeek's field */
        json_object_set_new(msg, "reasoning_content",
                            json_string_lossy(r->reasoning, strlen(r->reasoning)));
    if (r->ncalls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < r->ncalls; i++) {
            json_t *fn = json_object();
            json_object_set_new(fn, "name", json_string_lossy(r->calls[i].name,
                                                              strlen(r->calls[i].name)));
            json_object_set_new(fn, "arguments", json_string_lossy(r->calls[i].args,
                                                                   strlen(r->calls[i].args)));
            json_t *c = json_object();
            json_object_set_new(c, "id", json_string(r->calls[i].id));
            json_object_set_new(c, "type", json_string("function"));
            json_object_set_new(c, "function", fn);
            json_array_append_new(calls, c);
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "message", msg);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", json_string(r->finish_reason));

    json_t *o = chat_object_base(req, seq, "chat.completion");
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", chat_usage(ps, r));
    json_t *timings = chat_timings(ps, r);
    if (timings)
        json_object_set_new(o, "timings", timings);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

char *chat_bad_shape_json(const struct chat_request *req, unsigned long seq, unsigned long variant,
                          size_t *len)
{
    if (variant == SHAPE_NO_CHOICES) {
        static const char body[] = "{\"id\":\"x\",\"object\":\"chat.completion\"}";
        *len = sizeof body - 1;
        return xstrdup(body);
    }
    json_t *o = chat_object_base(req, seq, "chat.completion");
    json_t *choices = json_array();
    if (variant == SHAPE_NULL_MESSAGE) {
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(0));
        json_object_set_new(c, "message", json_null());
        json_object_set_new(c, "finish_reason", json_string("stop"));
        json_array_append_new(choices, c);
    }
    json_object_set_new(o, "choices", choices);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

size_t utf8_poison(char *s, size_t len)
{
    static const char mark[] = INVALID_UTF8_MARK;
    size_t ml = sizeof mark - 1, w = 0;
    for (size_t r = 0; r < len;) {
        if (r + ml <= len && memcmp(s + r, mark, ml) == 0) {
            s[w++] = (char)0xC3;
            s[w++] = 0x28;
            r += ml;
        } else {
            s[w++] = s[r++];
        }
    }
    if (w < len)
        s[w] = '\0';
    return w;
}
