/* overflow.c -- recognising the servers' context-overflow answers (overflow.h). */
#include "provider/overflow.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static long long count_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (long long)json_integer_value(v) : 0;
}

/* The number right after `after` in text (spaces allowed), or 0. */
static long long number_after(const char *text, const char *after)
{
    const char *p = text ? strstr(text, after) : NULL;
    if (!p)
        return 0;
    p += strlen(after);
    while (*p == ' ')
        p++;
    if (*p < '0' || *p > '9')
        return 0;
    char *end;
    long long v = strtoll(p, &end, 10);
    return v > 0 ? v : 0;
}

/* The first of the phrases found in text, the number after it; else 0. */
static long long first_number(const char *text, const char *const *phrases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        long long v = number_after(text, phrases[i]);
        if (v)
            return v;
    }
    return 0;
}

/* llama.cpp (tools/server: send_error with ERROR_TYPE_EXCEED_CONTEXT_SIZE). */
static int llamacpp(const json_t *err, const char *msg, llm_overflow *out)
{
    const char *type = json_string_value(json_object_get(err, "type"));
    if (!type || strcmp(type, "exceed_context_size_error") != 0)
        return 0;
    out->n_prompt = count_of(err, "n_prompt_tokens");
    out->n_ctx = count_of(err, "n_ctx");
    if (!out->n_prompt)
        out->n_prompt = number_after(msg, "request (");
    if (!out->n_ctx)
        out->n_ctx = number_after(msg, "context size (");
    return 1;
}

/* OpenAI's context_length_exceeded and vLLM's 400: the same sentence, two endings. */
static int openai_like(const json_t *err, const char *msg, llm_overflow *out)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    long long window = number_after(msg, "maximum context length is");
    if (!(code && strcmp(code, "context_length_exceeded") == 0) && !window)
        return 0;
    static const char *const prompt_phrases[] = {
        "your messages resulted in",     /* OpenAI */
        "your request has",              /* vLLM: "... has N input tokens" */
        "your prompt contains at least", /* vLLM: "you requested X output tokens and ..." */
        "you requested",                 /* vLLM before 0.6, DeepSeek: "N tokens (...)" */
    };
    out->n_ctx = window;
    out->n_prompt = first_number(msg, prompt_phrases, sizeof prompt_phrases / sizeof *prompt_phrases);
    return 1;
}

/* Anthropic: "prompt is too long: N tokens > M maximum", or with the answer's room counted,
   "input length and `max_tokens` exceed context limit: N + X > M, decrease ...". */
static int anthropic(const char *msg, llm_overflow *out)
{
    if (msg && strstr(msg, "prompt is too long")) {
        out->n_prompt = number_after(msg, "prompt is too long:");
        out->n_ctx = number_after(msg, "tokens >");
        return 1;
    }
    const char *limit = msg ? strstr(msg, "exceed context limit:") : NULL;
    if (!limit)
        return 0;
    out->n_prompt = number_after(limit, "context limit:");
    const char *gt = strchr(limit, '>');
    out->n_ctx = gt ? number_after(gt, ">") : 0;
    return 1;
}

int llm_overflow_from_text(const char *msg, llm_overflow *out)
{
    memset(out, 0, sizeof *out);
    if (msg && strstr(msg, "exceeds the available context size")) { /* llama.cpp */
        out->n_prompt = number_after(msg, "request (");
        out->n_ctx = number_after(msg, "context size (");
        return 1;
    }
    if (anthropic(msg, out) || openai_like(NULL, msg, out))
        return 1;
    memset(out, 0, sizeof *out);
    return 0;
}

int llm_overflow_parse(long status, const char *body, size_t len, llm_overflow *out)
{
    memset(out, 0, sizeof *out);
    if (status < 400 || status >= 500 || !body || !len)
        return 0;
    json_t *root = json_loadb(body, len, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return 0;
    }
    const json_t *err = json_object_get(root, "error");
    if (!json_is_object(err))
        err = root; /* vLLM before 0.8: {"object":"error","message":...} */
    const char *msg = json_string_value(json_object_get(err, "message"));
    int found = llamacpp(err, msg, out) || anthropic(msg, out) || openai_like(err, msg, out);
    if (!found)
        memset(out, 0, sizeof *out);
    json_decref(root);
    return found;
}
