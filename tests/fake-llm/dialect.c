/* What the three dialects share: the reasoning markers, the rule that reasoning
 * comes back with the tool calls it led to, and error bodies in each shape. */
#include "fakellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void reasoning_apply(const struct chat_request *req, struct chat_reply *r)
{
    if (marker_find(req->user_text, "length", NULL, NULL) && !r->ncalls) {
        r->finish_reason = "length"; /* [[length]]: cut short by max_tokens (all of them) */
        json_t *max = json_object_get(req->body, "max_tokens");
        if (!max)
            max = json_object_get(req->body, "max_completion_tokens");
        r->completion_tokens = json_is_integer(max) ? (long)json_integer_value(max) : 0;
    }
    if (marker_find(req->user_text, "ctx-full", NULL, NULL) && !r->ncalls) {
        r->finish_reason = "length"; /* [[ctx-full]]: the context window ran out first */
        r->context_full = true;
    }
    if (marker_find(req->user_text, "empty", NULL, NULL) && !r->ncalls) {
        free(r->content); /* [[empty]]: nothing after the reasoning */
        r->content = xstrdup("");
    }
    const char *v;
    size_t n;
    if (marker_find(req->user_text, "think", &v, &n) && v) {
        r->reasoning = xstrndup(v, n);
    } else if (marker_find(req->user_text, "think-tag", &v, &n) && v && r->content) {
        buf_t b = {0};
        buf_printf(&b, "<think>%.*s</think>\n\n%s", (int)n, v, r->content);
        free(r->content);
        r->content = buf_take(&b, NULL);
    }
}

const char *jstr_member(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

char *thinking_signature(const char *text)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    char buf[32];
    snprintf(buf, sizeof buf, "sig-%016llx", (unsigned long long)h);
    return xstrdup(buf);
}

/* Keys a Chat Completions message may carry (OpenAI rejects others: "Additional
 * properties are not allowed"); reasoning_content is DeepSeek's. */
static bool key_allowed(const char *role, const char *key)
{
    static const char *const common[] = {"role", "content", "name", NULL};
    static const char *const assistant[] = {"tool_calls", "refusal", "reasoning_content",
                                            "function_call", "audio", NULL};
    for (int i = 0; common[i]; i++)
        if (strcmp(key, common[i]) == 0)
            return strcmp(role, "tool") != 0 || strcmp(key, "name") != 0;
    if (strcmp(role, "assistant") == 0)
        for (int i = 0; assistant[i]; i++)
            if (strcmp(key, assistant[i]) == 0)
                return true;
    return strcmp(role, "tool") == 0 && strcmp(key, "tool_call_id") == 0;
}

bool openai_check_extra(const struct chat_request *req, struct api_error *err)
{
    json_t *msgs = json_object_get(req->body, "messages");
    size_t i, last_user = 0;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = chat_role_of(m);
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            if (!key_allowed(role, key)) {
                api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                              "Additional properties are not allowed ('%s' was unexpected) - "
                              "'messages.%zu'", key, i);
                return false;
            }
        }
        if (strcmp(role, "user") == 0)
            last_user = i;
    }
    const json_t *rf = json_object_get(req->body, "response_format");
    if (jstr_member(rf, "type") && strcmp(jstr_member(rf, "type"), "json_object") == 0) {
        char *all = json_dumps(msgs, JSON_COMPACT);
        bool said = all && strcasestr(all, "json");
        free(all);
        if (!said) {
            api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                          "'messages' must contain the word 'json' in some form, to use "
                          "'response_format' of type 'json_object'.");
            return false;
        }
    }
    if (!marker_find(req->user_text, "think", NULL, NULL))
        return true;
    /* DeepSeek: this turn's tool-call messages must bring their reasoning_content back. */
    for (i = last_user + 1; i < json_array_size(msgs); i++) {
        m = json_array_get(msgs, i);
        if (strcmp(chat_role_of(m), "assistant") == 0 && json_object_get(m, "tool_calls") &&
            !json_is_string(json_object_get(m, "reasoning_content"))) {
            api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                          "Missing `reasoning_content` field in the assistant message at "
                          "message index %zu.", i);
            return false;
        }
    }
    return true;
}

char *dialect_error_json(enum dialect d, const struct api_error *e, size_t *len)
{
    json_t *o;
    if (d == DIALECT_ANTHROPIC)
        o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                      e->status == 404 ? "not_found_error" : "invalid_request_error", "message",
                      e->message ? e->message : "");
    else if (d == DIALECT_OLLAMA)
        o = json_pack("{s:s}", "error", e->message ? e->message : "");
    else
        return api_error_json(e, len);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}
