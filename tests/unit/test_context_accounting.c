/*
 * test_context_accounting.c -- what servers say about the prompt, read the way
 * the context engine needs it: llama.cpp's timings (both decoder paths, whole
 * and streamed), Ollama's prompt_eval_cached_count, llm_usage_settle, the
 * context-overflow answers of llama.cpp, OpenAI, vLLM and Anthropic in their
 * real shapes, and the window parsers for /props, /v1/models and /api/show.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/context_window.h"
#include "provider/llm_reply.h"
#include "provider/overflow.h"
#include "provider/provider.h"
#include "reply_diff.h"

/* llama.cpp's non-streamed chat reply (tools/server/server-task.cpp: usage_json_oaicompat
   and timings.to_json()). */
static const char LLAMACPP_REPLY[] =
    "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"hi\"}}],\"created\":1,\"model\":\"m\",\"object\":\"chat.completion\","
    "\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":1000,\"total_tokens\":1003,"
    "\"prompt_tokens_details\":{\"cached_tokens\":960}},\"id\":\"chatcmpl-1\","
    "\"timings\":{\"cache_n\":960,\"prompt_n\":40,\"prompt_ms\":12.5,\"prompt_per_token_ms\":0.3,"
    "\"prompt_per_second\":3200.0,\"predicted_n\":3,\"predicted_ms\":30.0,"
    "\"predicted_per_token_ms\":10.0,\"predicted_per_second\":100.0}}";

static void test_timings(void)
{
    llm_reply r;
    char *err = NULL;
    CHECK(llm_reply_decode(LLAMACPP_REPLY, strlen(LLAMACPP_REPLY), &r, &err) == 0);
    CHECK(r.usage.prompt == 1000 && r.usage.cache_read == 960);
    CHECK(r.usage.evaluated == 40 && r.usage.timings_cached == 960);
    llm_reply_free(&r);
    /* the fast path reads timings exactly as jansson does */
    reply_diff(LLAMACPP_REPLY, strlen(LLAMACPP_REPLY), REPLY_DIFF_FAST);
    /* an older llama.cpp: no prompt_tokens_details, the timings alone say it */
    const char *old = "{\"choices\":[{\"message\":{\"content\":\"x\"}}],"
                      "\"timings\":{\"prompt_n\":7,\"cache_n\":93}}";
    CHECK(llm_reply_decode(old, strlen(old), &r, &err) == 0);
    llm_usage u = r.usage;
    llm_usage_settle(&u);
    CHECK(u.prompt == 100 && u.cache_read == 93 && u.evaluated == 7);
    llm_reply_free(&r);
    /* timings not an object, or with junk counts: absent / 0, both paths alike */
    const char *odd[] = {
        "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"timings\":null}",
        "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"timings\":{\"prompt_n\":-3,\"cache_n\":\"9\"}}",
        "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"timings\":{\"prompt_n\":2},\"timings\":{}}",
    };
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++)
        reply_diff(odd[i], strlen(odd[i]), REPLY_DIFF_ANY);

    /* streamed: llama.cpp puts timings in its last chunk; both chunk paths read them */
    const char *stream =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
        "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],"
        "\"timings\":{\"cache_n\":50,\"prompt_n\":5}}\n\n"
        "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1,\"prompt_tokens\":55,"
        "\"prompt_tokens_details\":{\"cached_tokens\":50}}}\n\n"
        "data: [DONE]\n\n";
    CHECK(stream_diff(stream, strlen(stream), 0) == 3);
    stream_diff(stream, strlen(stream), 7);
    llm_stream *s = llm_stream_new(NULL, NULL);
    CHECK(llm_stream_feed(s, stream, strlen(stream), &err) == 0);
    CHECK(llm_stream_finish(s, &r, &err) == 0);
    CHECK(r.usage.prompt == 55 && r.usage.cache_read == 50 && r.usage.evaluated == 5);
    llm_reply_free(&r);
    llm_stream_free(s);
}

static void test_settle(void)
{
    llm_usage u = {.prompt = 120, .cache_read = 100};
    llm_usage_settle(&u);
    CHECK(u.evaluated == 20); /* OpenAI, vLLM: prompt - cached */
    llm_usage a = {.prompt = 1500, .cache_read = 1000, .cache_creation = 400};
    llm_usage_settle(&a);
    CHECK(a.evaluated == 500); /* Anthropic: uncached input + what was written to the cache */
    llm_usage none = {0};
    llm_usage_settle(&none);
    CHECK(none.prompt == 0 && none.evaluated == 0);
}

static void test_ollama(void)
{
    const char *body = "{\"model\":\"m\",\"created_at\":\"x\",\"message\":{\"role\":\"assistant\","
                       "\"content\":\"hi\"},\"done\":true,\"done_reason\":\"stop\","
                       "\"prompt_eval_count\":812,\"prompt_eval_cached_count\":800,\"eval_count\":2}";
    llm_reply r;
    char *err = NULL;
    CHECK(provider_ollama.decode(body, strlen(body), &r, &err) == 0);
    llm_usage u = r.usage;
    llm_usage_settle(&u);
    CHECK(u.prompt == 812 && u.cache_read == 800 && u.evaluated == 12 && u.completion == 2);
    llm_reply_free(&r);
    free(err);
}

static int overflow(long status, const char *body, long long n_prompt, long long n_ctx)
{
    llm_overflow o;
    int found = llm_overflow_parse(status, body, strlen(body), &o);
    if (found && (o.n_prompt != n_prompt || o.n_ctx != n_ctx))
        fprintf(stderr, "  %s: got %lld / %lld\n", body, o.n_prompt, o.n_ctx);
    return found && o.n_prompt == n_prompt && o.n_ctx == n_ctx;
}

static void test_overflow(void)
{
    /* llama.cpp, tools/server/server-context.cpp + server-task.cpp (server_task_result_error) */
    CHECK(overflow(400, "{\"error\":{\"code\":400,\"message\":\"request (4476 tokens) exceeds the "
                        "available context size (4096 tokens), try increasing it\",\"type\":"
                        "\"exceed_context_size_error\",\"n_prompt_tokens\":4476,\"n_ctx\":4096}}",
                   4476, 4096));
    CHECK(overflow(400, "{\"error\":{\"code\":400,\"message\":\"request (5000 tokens) exceeds the "
                        "available context size (4096 tokens), try increasing it\",\"type\":"
                        "\"exceed_context_size_error\"}}", 5000, 4096));
    /* OpenAI */
    CHECK(overflow(400, "{\"error\":{\"message\":\"This model's maximum context length is 128000 "
                        "tokens. However, your messages resulted in 130512 tokens. Please reduce "
                        "the length of the messages.\",\"type\":\"invalid_request_error\",\"param\":"
                        "\"messages\",\"code\":\"context_length_exceeded\"}}", 130512, 128000));
    /* vLLM (vllm/entrypoints/renderer.py), current and older top-level shape */
    CHECK(overflow(400, "{\"error\":{\"message\":\"This model's maximum context length is 8192 "
                        "tokens. However, your request has 9001 input tokens. Please reduce the "
                        "length of the input messages.\",\"type\":\"BadRequestError\",\"param\":null,"
                        "\"code\":400}}", 9001, 8192));
    CHECK(overflow(400, "{\"object\":\"error\",\"message\":\"This model's maximum context length is "
                        "4096 tokens. However, you requested 5000 tokens (4000 in the messages, "
                        "1000 in the completion). Please reduce the length of the messages or "
                        "completion.\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}",
                   5000, 4096));
    CHECK(overflow(400, "{\"error\":{\"message\":\"'max_tokens' or 'max_completion_tokens' is too "
                        "large: 8000. This model's maximum context length is 4096 tokens and your "
                        "request has 2778 input tokens (8000 > 4096 - 2778). None\",\"type\":"
                        "\"BadRequestError\",\"param\":null,\"code\":400}}", 2778, 4096));
    /* Anthropic */
    CHECK(overflow(400, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                        "\"message\":\"prompt is too long: 208310 tokens > 200000 maximum\"}}",
                   208310, 200000));
    CHECK(overflow(400, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                        "\"message\":\"input length and `max_tokens` exceed context limit: 197626 + "
                        "8192 > 200000, decrease input length or `max_tokens` and try again\"}}",
                   197626, 200000));
    /* not overflows */
    llm_overflow o;
    const char *bad = "{\"error\":{\"message\":\"Invalid 'messages'\",\"type\":\"invalid_request_error\"}}";
    CHECK(!llm_overflow_parse(400, bad, strlen(bad), &o) && o.n_ctx == 0);
    const char *srv = "{\"error\":{\"code\":500,\"message\":\"x\",\"type\":\"exceed_context_size_error\"}}";
    CHECK(!llm_overflow_parse(500, srv, strlen(srv), &o));
    CHECK(!llm_overflow_parse(400, "not json", 8, &o));
    CHECK(!llm_overflow_parse(400, "[1]", 3, &o));
    CHECK(!llm_overflow_parse(400, "", 0, &o));
}

/* llama.cpp before October 2025: a streamed request's error as an "error:" SSE field. */
static void test_stream_error_field(void)
{
    const char *stream = "error: {\"code\":400,\"message\":\"request (5000 tokens) exceeds the "
                         "available context size (4096 tokens), try increasing it\",\"type\":"
                         "\"exceed_context_size_error\",\"n_prompt_tokens\":5000,\"n_ctx\":4096}\n\n";
    for (size_t piece = 1; piece <= strlen(stream); piece += 13) {
        llm_stream *s = llm_stream_new(NULL, NULL);
        char *err = NULL;
        int rc = 0;
        for (size_t off = 0; rc == 0 && off < strlen(stream); off += piece) {
            size_t n = strlen(stream) - off < piece ? strlen(stream) - off : piece;
            rc = llm_stream_feed(s, stream + off, n, &err);
        }
        CHECK(rc == -1 && err && strstr(err, "exceeds the available context size"));
        llm_overflow o;
        CHECK(llm_overflow_from_text(err, &o) && o.n_prompt == 5000 && o.n_ctx == 4096);
        free(err);
        llm_stream_free(s);
    }
    /* the other fields still mean nothing, and data lines as before */
    stream_diff("event: x\nid: 1\nerrors: nope\ndata: {\"choices\":[{\"delta\":{\"content\":"
                "\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                strlen("event: x\nid: 1\nerrors: nope\ndata: {\"choices\":[{\"delta\":{\"content\":"
                       "\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), 0);
}

static void test_overflow_text(void)
{
    llm_overflow o;
    CHECK(llm_overflow_from_text("server returned an error: request (9000 tokens) exceeds the "
                                 "available context size (8192 tokens), try increasing it", &o));
    CHECK(o.n_prompt == 9000 && o.n_ctx == 8192);
    CHECK(llm_overflow_from_text("This model's maximum context length is 4096 tokens. However, "
                                 "your request has 5000 input tokens.", &o));
    CHECK(o.n_prompt == 5000 && o.n_ctx == 4096);
    CHECK(llm_overflow_from_text("prompt is too long: 210000 tokens > 200000 maximum", &o));
    CHECK(o.n_prompt == 210000 && o.n_ctx == 200000);
    CHECK(!llm_overflow_from_text("stream ended before [DONE]", &o) && o.n_ctx == 0);
    CHECK(!llm_overflow_from_text(NULL, &o));
}

static void test_window_parsers(void)
{
    const char *props = "{\"default_generation_settings\":{\"id\":0,\"n_ctx\":16384,\"params\":{}},"
                        "\"total_slots\":1,\"model_path\":\"m.gguf\"}";
    CHECK(provider_window_from_props(props, strlen(props)) == 16384);
    CHECK(provider_window_from_props("{}", 2) == 0);
    CHECK(provider_window_from_props("junk", 4) == 0);
    const char *models = "{\"object\":\"list\",\"data\":[{\"id\":\"a\",\"object\":\"model\","
                         "\"max_model_len\":4096},{\"id\":\"b\",\"max_model_len\":32768}]}";
    CHECK(provider_window_from_models(models, strlen(models), "b") == 32768);
    CHECK(provider_window_from_models(models, strlen(models), "zz") == 0);
    const char *one = "{\"data\":[{\"id\":\"a\",\"max_model_len\":2048}]}";
    CHECK(provider_window_from_models(one, strlen(one), "other") == 2048);
    long long num_ctx = -1;
    const char *show = "{\"parameters\":\"stop \\\"<|im_end|>\\\"\\nnum_ctx 8192\\ntemperature 0.7\","
                       "\"model_info\":{\"general.architecture\":\"qwen3\","
                       "\"qwen3.context_length\":40960}}";
    CHECK(provider_window_from_show(show, strlen(show), &num_ctx) == 40960 && num_ctx == 8192);
    const char *bare = "{\"model_info\":{\"general.architecture\":\"llama\"}}";
    CHECK(provider_window_from_show(bare, strlen(bare), &num_ctx) == 0 && num_ctx == 0);
}

int main(void)
{
    test_timings();
    test_settle();
    test_ollama();
    test_overflow();
    test_overflow_text();
    test_stream_error_field();
    test_window_parsers();
    return check_report();
}
