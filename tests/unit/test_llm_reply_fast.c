/*
 * test_llm_reply_fast.c -- the whole-reply fast path against the jansson
 * decoder (the authority): the golden replies, hand-written edge cases, and
 * every truncation and many one-byte mutations of the usual replies must
 * decode identically both ways (reply_diff.h).  Where the fast path must
 * take a body (the usual shapes) or must leave it to jansson (what it does
 * not read exactly alike), that is checked too.  Streams likewise: each one
 * with and without the chunk fast path, callbacks included.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "check.h"
#include "provider/openai_decode.h"
#include "read_file.h"
#include "reply_diff.h"

#define FAST REPLY_DIFF_FAST
#define JANSSON REPLY_DIFF_JANSSON
#define ANY REPLY_DIFF_ANY

static int diff(const char *body, int path) { return reply_diff(body, strlen(body), path); }

/* The envelope the fake LLM (and OpenAI) sends, around `message`. */
static void diff_message(const char *message, int path)
{
    char *body = pstr_printf(
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1732000000,"
        "\"model\":\"fake\",\"system_fingerprint\":\"fp_fake\",\"choices\":[{\"index\":0,"
        "\"message\":%s,\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13}}",
        message);
    diff(body, path);
    free(body);
}

/* A plain reply with `usage` as the usage member's value. */
static void diff_usage(const char *usage, int path)
{
    char *body = pstr_printf("{\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"usage\":%s}", usage);
    diff(body, path);
    free(body);
}

/* ---- the usual replies ---- */

static const char *const USUAL[] = {
    /* the fake LLM's (and the benchmark's) plain answer */
    "{\"id\":\"chatcmpl-17\",\"object\":\"chat.completion\",\"created\":1732000000,\"model\":"
    "\"fake-model\",\"system_fingerprint\":\"fp_fake\",\"choices\":[{\"index\":0,\"message\":"
    "{\"role\":\"assistant\",\"content\":\"The kitchen light is on. It has been on since this "
    "morning, and the living room lamp is off.\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":1234,\"completion_tokens\":25,\"total_tokens\":1259}}",
    /* the fake LLM's tool call round, with reasoning_content */
    "{\"id\":\"chatcmpl-18\",\"object\":\"chat.completion\",\"created\":1732000001,\"model\":"
    "\"fake-model\",\"system_fingerprint\":\"fp_fake\",\"choices\":[{\"index\":0,\"message\":"
    "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Check the hall first.\","
    "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_state\","
    "\"arguments\":\"{\\\"entity\\\":\\\"light.hall\\\"}\"}},{\"id\":\"call_2\",\"type\":"
    "\"function\",\"function\":{\"name\":\"turn_on\",\"arguments\":\"{}\"}}]},\"logprobs\":null,"
    "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":80,\"completion_tokens\":20,"
    "\"total_tokens\":100}}",
    /* OpenAI today: refusal, annotations, usage details, service_tier */
    "{\n  \"id\": \"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG\",\n  \"object\": \"chat.completion\",\n"
    "  \"created\": 1741570283,\n  \"model\": \"gpt-4o-2024-08-06\",\n  \"choices\": [\n    {\n"
    "      \"index\": 0,\n      \"message\": {\n        \"role\": \"assistant\",\n"
    "        \"content\": \"The image shows a wooden boardwalk \\u2014 green grass, blue sky.\",\n"
    "        \"refusal\": null,\n        \"annotations\": []\n      },\n      \"logprobs\": null,\n"
    "      \"finish_reason\": \"stop\"\n    }\n  ],\n  \"usage\": {\n    \"prompt_tokens\": 1117,\n"
    "    \"completion_tokens\": 46,\n    \"total_tokens\": 1163,\n    \"prompt_tokens_details\": {\n"
    "      \"cached_tokens\": 1024,\n      \"audio_tokens\": 0\n    },\n"
    "    \"completion_tokens_details\": {\n      \"reasoning_tokens\": 7,\n"
    "      \"audio_tokens\": 0,\n      \"accepted_prediction_tokens\": 0,\n"
    "      \"rejected_prediction_tokens\": 0\n    }\n  },\n  \"service_tier\": \"default\",\n"
    "  \"system_fingerprint\": \"fp_fc9f1d7035\"\n}\n",
    /* vLLM's reasoning field, several choices, escapes and UTF-8 in content */
    "{\"choices\":[{\"message\":{\"reasoning\":\"\\u00e9t\\u00e9 \\ud83d\\ude00\",\"content\":"
    "\"Caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\\"q\\\" \\\\ \\/ \\b\\f\\n\\r\\t\"},"
    "\"finish_reason\":\"length\"},{\"message\":{\"content\":\"second\"}}],\"usage\":{"
    "\"prompt_tokens\":5,\"completion_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":4},"
    "\"completion_tokens_details\":{\"reasoning_tokens\":3}}}",
};

static void test_usual(void)
{
    for (size_t i = 0; i < sizeof USUAL / sizeof *USUAL; i++)
        diff(USUAL[i], FAST);

    /* The fast path's reply itself, not only its agreement with jansson. */
    llm_reply r;
    CHECK(llm_reply_decode_fast(USUAL[1], strlen(USUAL[1]), &r) == 1);
    CHECK(r.content == NULL && r.ncalls == 2 && r.calls);
    if (r.ncalls == 2) {
        CHECK_STR(r.calls[0].id, "call_1");
        CHECK_STR(r.calls[0].arguments, "{\"entity\":\"light.hall\"}");
        CHECK_STR(r.calls[1].name, "turn_on");
    }
    CHECK_STR(r.reasoning, "Check the hall first.");
    CHECK_STR(r.provider_data, "{\"openai\":{\"reasoning_field\":\"reasoning_content\"}}");
    CHECK(r.usage.prompt == 80 && r.usage.completion == 20);
    llm_reply_free(&r);
    CHECK(llm_reply_decode_fast(USUAL[3], strlen(USUAL[3]), &r) == 1);
    CHECK_STR(r.content, "Caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \"q\" \\ / \b\f\n\r\t");
    CHECK_STR(r.reasoning, "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80");
    CHECK(r.provider_data == NULL);
    CHECK(r.usage.cache_read == 4 && r.usage.reasoning == 3);
    llm_reply_free(&r);
}

/* ---- the golden corpus ---- */

static void diff_file(const char *path, int expect)
{
    size_t len = 0;
    char *body = read_file(path, &len);
    CHECK(body != NULL);
    if (!body)
        return;
    reply_diff(body, len, expect);
    free(body);
}

static void test_corpus(void)
{
    diff_file(PARLEY_SOURCE_DIR "/tests/corpus/openai/reply.json", FAST);
    diff_file(PARLEY_SOURCE_DIR "/tests/corpus/ollama/reply.json", ANY);
    diff_file(PARLEY_SOURCE_DIR "/tests/corpus/anthropic/reply.json", ANY);

    /* The fuzzer's seeds: the usual shapes go fast, the rest to jansson. */
    static const char *const fast_seeds[] = {
        "openai_text.json", "openai_tool_calls.json", "llama_cpp_reply.json",
        "vllm_reasoning.json", "length_finish.json", "empty_message.json",
        "missing_ids_and_args.json", "ollama_v1_tool_call.json", "llama_cpp_timings.json"};
    const char *dir = PARLEY_SOURCE_DIR "/tests/fuzz/corpus/fuzz_reply_decode";
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    size_t files = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        int expect = JANSSON;
        for (size_t i = 0; i < sizeof fast_seeds / sizeof *fast_seeds; i++)
            if (strcmp(e->d_name, fast_seeds[i]) == 0)
                expect = FAST;
        char *path = pstr_printf("%s/%s", dir, e->d_name);
        diff_file(path, expect);
        free(path);
        files++;
    }
    if (d)
        closedir(d);
    CHECK(files >= 16);
}

/* ---- hand-written edge cases ---- */

static void test_strings(void)
{
    /* escapes, \u escapes (pairs in either case), raw multi-byte UTF-8 */
    diff_message("{\"content\":\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"}", FAST);
    diff_message("{\"content\":\"\\u0041\\u00e9\\u20AC\\uffff\\ud83d\\ude00\\uD83D\\uDE00\"}", FAST);
    diff_message("{\"content\":\"\\u0001 \\u001f \\u007f\"}", FAST);
    diff_message("{\"content\":\"\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xef\xbf\xbf \xf0\x90\x80\x80 "
                 "\xf4\x8f\xbf\xbf\"}",
                 FAST);
    diff_message("{\"content\":\"\\\\u0000 is text\"}", FAST);
    /* what jansson refuses: \u0000, lone or broken surrogates, bad escapes */
    diff_message("{\"content\":\"a\\u0000b\"}", JANSSON);
    diff_message("{\"content\":\"\\ud800\"}", JANSSON);
    diff_message("{\"content\":\"\\udc00\\ud800\"}", JANSSON);
    diff_message("{\"content\":\"\\ud800\\u0041\"}", JANSSON);
    diff_message("{\"content\":\"\\ud800x\"}", JANSSON);
    diff_message("{\"content\":\"\\ud800\\ud800\"}", JANSSON);
    diff_message("{\"content\":\"\\u12\"}", JANSSON);
    diff_message("{\"content\":\"\\u12g4\"}", JANSSON);
    diff_message("{\"content\":\"\\x41\"}", JANSSON);
    diff_message("{\"content\":\"\\U0041\"}", JANSSON);
    diff_message("{\"content\":\"\\'\"}", JANSSON);
    /* raw control bytes and invalid UTF-8, read or skipped */
    diff_message("{\"content\":\"a\nb\"}", JANSSON);
    diff_message("{\"content\":\"a\tb\"}", JANSSON);
    diff_message("{\"content\":\"a\x7f" "b\"}", FAST); /* DEL is no JSON control character */
    static const char *const bad_utf8[] = {
        "\xff", "\xc3", "\xc3(", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80",
        "\xed\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xf0\x80\x80\x80", "\x80",
        "\xe2\x82", "\xf0\x9f\x98"};
    static const char *const places[] = { /* read, skipped, inside and after the root */
        "{\"choices\":[{\"message\":{\"content\":\"x%sy\"}}]}",
        "{\"choices\":[{\"message\":{\"content\":\"ok\",\"role\":\"x%sy\"}}]}",
        "{\"model\":\"%s\",\"choices\":[{\"message\":{}}]}", "{\"choices\":[{\"message\":{}}]} %s"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof *bad_utf8; i++)
        for (size_t j = 0; j < sizeof places / sizeof *places; j++) {
            char *body = pstr_printf(places[j], bad_utf8[i]);
            diff(body, JANSSON);
            free(body);
        }
    /* an escaped key: one of ours in disguise goes to jansson; in skipped objects it is fine */
    diff_message("{\"cont\\u0065nt\":\"x\"}", JANSSON);
    diff_message("{\"content\":\"x\",\"extra\":{\"k\\u0065y\\n\":1}}", FAST);
}

static void test_members(void)
{
    /* nulls, missing members, empty values */
    diff_message("{\"role\":\"assistant\"}", FAST);
    diff_message("{}", FAST);
    diff_message("{\"content\":null,\"tool_calls\":null,\"reasoning\":null,"
                 "\"reasoning_content\":null}",
                 FAST);
    diff_message("{\"content\":\"\"}", FAST);
    diff_message("{\"content\":\"\",\"tool_calls\":[]}", FAST);
    diff_message("{\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}", FAST);
    diff_message("{\"content\":\"x\",\"tool_calls\":[{\"id\":null,\"function\":{\"name\":\"\","
                 "\"arguments\":null}},{\"id\":\"\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}},"
                 "{\"id\":\"c3\",\"type\":\"function\",\"index\":2,\"function\":{\"arguments\":"
                 "\"{\\\"a\\\":[1,2]}\",\"name\":\"h\",\"extra\":true}}]}",
                 FAST);
    diff("{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":null}]}", FAST);
    diff("{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":\"\"}]}", FAST);
    diff("{\"choices\":[{\"finish_reason\":\"stop\",\"message\":{\"content\":\"x\"}}],\"usage\":null}",
         FAST);
    /* reasoning: the first non-empty field wins; reasoning_content is remembered */
    diff_message("{\"reasoning_content\":\"\",\"reasoning\":\"r\",\"content\":\"c\"}", FAST);
    diff_message("{\"reasoning_content\":\"rc\",\"reasoning\":\"r\",\"content\":\"c\"}", FAST);
    diff_message("{\"reasoning\":\"r\",\"reasoning_content\":\"rc\"}", FAST);
    diff_message("{\"reasoning_content\":\"\",\"reasoning\":\"\"}", FAST);
    diff_message("{\"reasoning_content\":\"rc\",\"reasoning\":5}", JANSSON); /* jansson: fine */
    diff_message("{\"reasoning_content\":5,\"reasoning\":\"r\"}", JANSSON);  /* jansson: error */
    /* shapes the fast path leaves to jansson */
    diff_message("{\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},{\"text\":\"lo\"}]}", JANSSON);
    diff_message("{\"content\":[]}", JANSSON);
    diff_message("{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":0.1}}}]}",
                 JANSSON);
    diff_message("{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]}", JANSSON);
    diff("{\"error\":null,\"choices\":[{\"message\":{\"content\":\"x\"}}]}", JANSSON);
    diff("{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"error\":{\"message\":\"no\"}}", JANSSON);
    /* decode errors: all jansson's */
    static const char *const refused[] = {
        "{}", "{\"choices\":null}", "{\"choices\":[]}", "{\"choices\":{}}", "{\"choices\":[1]}",
        "{\"choices\":[null]}", "{\"choices\":[{}]}", "{\"choices\":[{\"message\":null}]}",
        "{\"choices\":[{\"message\":\"hi\"}]}", "{\"choices\":[{\"message\":[]}]}",
        "{\"choices\":[{\"message\":{\"content\":5}}]}",
        "{\"choices\":[{\"message\":{\"content\":true}}]}",
        "{\"choices\":[{\"message\":{\"content\":{}}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":{}}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[1]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":\"c\"}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":null}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{}}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":null}}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":7}}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":7,\"function\":{\"name\":\"f\"}}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":1}}]}}]}",
        "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":[]}}]}}]}",
        "{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":1}]}",
        "{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":{}}]}",
        "[{\"choices\":[{\"message\":{\"content\":\"x\"}}]}]", "\"text\"", "42", "null", "true",
        "", " ", "Hello there", "<html><title>502</title></html>"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        diff(refused[i], JANSSON);
    reply_diff(NULL, 0, JANSSON);
}

static void test_calls_bound(void)
{
    for (size_t n = 15; n <= 17; n++) {
        pbuf b = PBUF_INIT;
        pbuf_puts(&b, "{\"choices\":[{\"message\":{\"tool_calls\":[");
        for (size_t i = 0; i < n; i++)
            pbuf_printf(&b, "%s{\"id\":\"c%zu\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}",
                        i ? "," : "", i);
        pbuf_puts(&b, "]}}]}");
        reply_diff(b.data, b.len, n <= 16 ? FAST : JANSSON);
        pbuf_free(&b);
    }
}

static void test_numbers(void)
{
    /* usage counts: positive integers count, anything else is 0 */
    static const char *const counts[] = {
        "0", "-0", "1", "-5", "12", "1e3", "1E3", "12.0", "1.5e2", "-1.5e-2", "0.5", "1e-400",
        "999999999999999999", "-999999999999999999", "\"12\"", "true", "false", "null",
        "[1]", "{\"n\":1}"};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        char *usage = pstr_printf(
            "{\"prompt_tokens\":%s,\"completion_tokens\":%s,\"prompt_tokens_details\":"
            "{\"cached_tokens\":%s},\"completion_tokens_details\":{\"reasoning_tokens\":%s}}",
            counts[i], counts[i], counts[i], counts[i]);
        diff_usage(usage, FAST);
        free(usage);
    }
    /* numbers jansson may refuse (or read): the fast path leaves them to it */
    static const char *const left[] = {
        "9223372036854775807", "9223372036854775808", "-9223372036854775808",
        "-9223372036854775809", "1000000000000000000", "123456789012345678901234567890",
        "1e309", "-1e309", "1e400", "1e99999999999", "1" /* then 300 zeros */};
    for (size_t i = 0; i + 1 < sizeof left / sizeof *left; i++) {
        char *usage = pstr_printf("{\"prompt_tokens\":%s}", left[i]);
        diff_usage(usage, JANSSON);
        free(usage);
        char *body = pstr_printf("{\"created\":%s,\"choices\":[{\"message\":{}}]}", left[i]);
        diff(body, JANSSON);
        free(body);
    }
    pbuf big = PBUF_INIT;
    pbuf_puts(&big, "{\"x\":1");
    for (int i = 0; i < 300; i++)
        pbuf_putc(&big, '0');
    pbuf_puts(&big, ".5,\"choices\":[{\"message\":{}}]}");
    diff(big.data, JANSSON); /* 1e300 is a fine double, but past the fast path's bound */
    pbuf_free(&big);
    diff("{\"x\":1e300,\"choices\":[{\"message\":{}}]}", ANY);
    diff("{\"x\":-1.7976931348623157e308,\"choices\":[{\"message\":{}}]}", ANY);
    /* malformed numbers */
    static const char *const malformed[] = {"-", "01", "-01", "1.", ".5", "+1", "1e", "1e+",
                                            "1.e3", "0x10", "1.5.3", "--1", "1e3.5", "Infinity",
                                            "NaN", "- 1"};
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
        char *usage = pstr_printf("{\"prompt_tokens\":%s}", malformed[i]);
        diff_usage(usage, JANSSON);
        free(usage);
    }
    /* usage and its details as other types, or absent */
    static const char *const usages[] = {"null", "[]", "\"x\"", "5", "{}",
                                         "{\"prompt_tokens_details\":null}",
                                         "{\"prompt_tokens_details\":5,\"completion_tokens_details\":[]}",
                                         "{\"prompt_tokens_details\":{},\"total_tokens\":9}"};
    for (size_t i = 0; i < sizeof usages / sizeof *usages; i++)
        diff_usage(usages[i], FAST);
}

static void test_duplicates(void)
{
    /* among the members read: jansson keeps the last, the fast path leaves it */
    diff_message("{\"content\":\"one\",\"content\":\"two\"}", JANSSON);
    diff_message("{\"content\":null,\"content\":\"two\"}", JANSSON);
    diff_message("{\"reasoning\":\"a\",\"reasoning\":\"b\"}", JANSSON);
    diff_message("{\"tool_calls\":[],\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}", JANSSON);
    diff_message("{\"tool_calls\":[{\"id\":\"a\",\"id\":\"b\",\"function\":{\"name\":\"f\"}}]}",
                 JANSSON);
    diff_message("{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"name\":\"g\"}}]}", JANSSON);
    diff_message("{\"tool_calls\":[{\"function\":{\"name\":\"f\"},\"function\":{\"name\":\"g\"}}]}",
                 JANSSON);
    diff("{\"choices\":[{\"message\":{\"content\":\"a\"}}],\"choices\":[{\"message\":"
         "{\"content\":\"b\"}}]}",
         JANSSON);
    diff("{\"choices\":[{\"message\":{\"content\":\"a\"},\"message\":{\"content\":\"b\"}}]}", JANSSON);
    diff("{\"choices\":[{\"message\":{\"content\":\"a\"},\"finish_reason\":\"stop\","
         "\"finish_reason\":\"length\"}]}",
         JANSSON);
    diff_usage("{\"prompt_tokens\":1,\"prompt_tokens\":2}", JANSSON);
    diff_usage("{\"prompt_tokens_details\":{\"cached_tokens\":1,\"cached_tokens\":2}}", JANSSON);
    diff("{\"usage\":{\"prompt_tokens\":1},\"choices\":[{\"message\":{}}],\"usage\":5}", JANSSON);
    /* among members skipped: no matter */
    diff("{\"model\":\"a\",\"model\":\"b\",\"choices\":[{\"message\":{\"role\":\"x\",\"role\":\"y\"},"
         "\"index\":0,\"index\":1}]}",
         FAST);
}

static void test_syntax(void)
{
    /* whitespace everywhere (JSON's four bytes), and nowhere */
    diff(" \t\r\n{ \t\r\n\"choices\" \t\r\n: \t\r\n[ \t\r\n{ \"message\" : { \"content\" : \"x\" , "
         "\"tool_calls\" : [ { \"function\" : { \"name\" : \"f\" } } ] } , \"finish_reason\" : "
         "null } , { } ] , \"usage\" : { \"prompt_tokens\" : 3 } } \t\r\n",
         FAST);
    diff("{\"choices\":[{\"message\":{\"content\":\"x\"}}]}", FAST);
    /* whitespace JSON does not have */
    diff("\xef\xbb\xbf{\"choices\":[{\"message\":{}}]}", JANSSON);
    diff("{\f\"choices\":[{\"message\":{}}]}", JANSSON);
    diff("{\v\"choices\":[{\"message\":{}}]}", JANSSON);
    diff("{\"choices\":[{\"message\":{}}]}\xc2\xa0", JANSSON);
    /* trailing bytes */
    diff("{\"choices\":[{\"message\":{}}]} x", JANSSON);
    diff("{\"choices\":[{\"message\":{}}]}{}", JANSSON);
    diff("{\"choices\":[{\"message\":{}}]}}", JANSSON);
    diff("{\"choices\":[{\"message\":{}}]},", JANSSON);
    static const char with_nul[] = "{\"choices\":[{\"message\":{}}]}\0";
    reply_diff(with_nul, sizeof with_nul - 1, JANSSON);
    reply_diff(with_nul, sizeof with_nul - 2, FAST);
    /* commas, colons, literals */
    static const char *const broken[] = {
        "{\"choices\":[{\"message\":{}},],\"x\":1}", "{\"choices\":[{\"message\":{},}]}",
        "{,\"choices\":[{\"message\":{}}]}", "{\"choices\":[,{\"message\":{}}]}",
        "{\"choices\" [{\"message\":{}}]}", "{\"choices\"::[{\"message\":{}}]}",
        "{\"choices\":[{\"message\":{}}] \"x\":1}", "{\"choices\":[{\"message\":{}} {}]}",
        "{\"x\":nul,\"choices\":[{\"message\":{}}]}", "{\"x\":nullx,\"choices\":[{\"message\":{}}]}",
        "{\"x\":True,\"choices\":[{\"message\":{}}]}", "{\"x\":truee,\"choices\":[{\"message\":{}}]}",
        "{\"x\":true1,\"choices\":[{\"message\":{}}]}", "{\"x\":fals,\"choices\":[{\"message\":{}}]}",
        "{\"x\":'a',\"choices\":[{\"message\":{}}]}", "{x:1,\"choices\":[{\"message\":{}}]}",
        "{\"choices\":[{\"message\":{}}]", "{\"choices\":[{\"message\":{}}}}",
        "{\"choices\":[{\"message\":{\"content\":\"x}}]}"};
    for (size_t i = 0; i < sizeof broken / sizeof *broken; i++)
        diff(broken[i], JANSSON);
    diff("{\"x\":[true,false,null,{},[],\"\",0,-0.0e-0],\"choices\":[{\"message\":{}}]}", FAST);
}

static void test_depth(void)
{
    /* nesting around the fast path's bound (JSCAN_MAX_DEPTH, 64) in a skipped member */
    for (size_t levels = 60; levels <= 70; levels++) {
        pbuf b = PBUF_INIT;
        pbuf_puts(&b, "{\"x\":");
        for (size_t i = 0; i < levels; i++)
            pbuf_puts(&b, i % 2 ? "[" : "{\"k\":");
        pbuf_putc(&b, '1');
        for (size_t i = levels; i-- > 0;)
            pbuf_putc(&b, i % 2 ? ']' : '}');
        pbuf_puts(&b, ",\"choices\":[{\"message\":{\"content\":\"deep\"}}]}");
        /* the root is open too: 63 more levels are the most the fast path takes */
        reply_diff(b.data, b.len, levels <= 63 ? FAST : JANSSON);
        pbuf_free(&b);
    }
    /* past jansson's own bound (2048): both refuse */
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "{\"x\":");
    for (int i = 0; i < 3000; i++)
        pbuf_putc(&b, '[');
    for (int i = 0; i < 3000; i++)
        pbuf_putc(&b, ']');
    pbuf_puts(&b, ",\"choices\":[{\"message\":{}}]}");
    reply_diff(b.data, b.len, JANSSON);
    pbuf_free(&b);
}

/* ---- every truncation, deletion and some substitutions of the usual replies ---- */

static void test_mutations(void)
{
    static const char replacements[] = {'"', '\\', '}', ']', ',', ':', ' ', '0', 'u', '\x80', '\0'};
    size_t fast_taken = 0, total = 0;
    for (size_t k = 0; k < sizeof USUAL / sizeof *USUAL; k++) {
        const char *body = USUAL[k];
        size_t len = strlen(body);
        char *m = malloc(len + 1);
        size_t whole = (size_t)(strrchr(body, '}') - body) + 1; /* then only whitespace */
        for (size_t cut = 0; cut < len; cut++, total++) /* a truncated reply is no reply */
            fast_taken += (size_t)reply_diff(body, cut, cut < whole ? JANSSON : FAST);
        for (size_t at = 0; at < len; at++) {
            memcpy(m, body, at); /* without byte `at` */
            memcpy(m + at, body + at + 1, len - at - 1);
            fast_taken += (size_t)reply_diff(m, len - 1, ANY);
            total++;
            memcpy(m, body, len);
            for (size_t r = 0; r < sizeof replacements; r++) {
                if (body[at] == replacements[r])
                    continue;
                m[at] = replacements[r];
                fast_taken += (size_t)reply_diff(m, len, ANY);
                total++;
            }
        }
        free(m);
    }
    printf("mutations: %zu bodies, %zu taken by the fast path\n", total, fast_taken);
    CHECK(fast_taken > 0);
}

/* ---- streams: each chunk with and without the fast path ---- */

#define CHUNK_HEAD "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1," \
                   "\"model\":\"m\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,"

static const char USUAL_STREAM[] =
    CHUNK_HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Hmm \"},"
               "\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    CHUNK_HEAD "\"delta\":{\"reasoning_content\":\"\\u00e9t\\u00e9.\"},\"finish_reason\":null}]}\n\n"
    CHUNK_HEAD "\"delta\":{\"content\":\"The light\"},\"finish_reason\":null}]}\n\n"
    CHUNK_HEAD "\"delta\":{\"content\":\" is \\\"on\\\" \\ud83d\\ude00\\n\"},\"finish_reason\":null}]}\n\n"
    CHUNK_HEAD "\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
               "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\":\"}}]},\"finish_reason\":null}]}\n\n"
    CHUNK_HEAD "\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n"
    CHUNK_HEAD "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
    "data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,"
    "\"prompt_tokens_details\":{\"cached_tokens\":8},\"completion_tokens_details\":"
    "{\"reasoning_tokens\":2}}}\n\n"
    "data: [DONE]\n\n";

static void diff_stream(const char *body, size_t min_fast)
{
    size_t len = strlen(body);
    size_t taken = stream_diff(body, len, 0);
    CHECK(taken >= min_fast);
    if (taken < min_fast)
        fprintf(stderr, "  the fast path took %zu chunks, expected %zu or more\n", taken, min_fast);
    stream_diff(body, len, 1);
    stream_diff(body, len, 7);
}

/* One chunk as its own stream (then [DONE]). */
static void diff_chunk(const char *chunk_json, size_t min_fast)
{
    char *body = pstr_printf("data: %s\n\ndata: [DONE]\n\n", chunk_json);
    diff_stream(body, min_fast);
    free(body);
}

static void test_streams(void)
{
    diff_stream(USUAL_STREAM, 8);

    size_t len = 0;
    char *golden = read_file(PARLEY_SOURCE_DIR "/tests/corpus/openai/stream.txt", &len);
    CHECK(golden != NULL);
    if (golden) {
        CHECK(stream_diff(golden, len, 0) == 9); /* every chunk */
        stream_diff(golden, len, 1);
        free(golden);
    }
    /* the fuzzer's seeds (their first bytes are piece sizes: fuzz_sse_stream.c) */
    const char *dir = PARLEY_SOURCE_DIR "/tests/fuzz/corpus/fuzz_sse_stream";
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char *path = pstr_printf("%s/%s", dir, e->d_name);
        char *data = read_file(path, &len);
        size_t skip = data && len ? (size_t)(data[0] & 7) + 2 : 0;
        if (data && len >= skip) {
            stream_diff(data + skip, len - skip, 0);
            stream_diff(data + skip, len - skip, 3);
        }
        free(data);
        free(path);
    }
    if (d)
        closedir(d);

    /* chunks the fast path takes */
    diff_chunk("{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}", 1);
    diff_chunk("{\"choices\":[{\"delta\":{\"content\":null,\"tool_calls\":null},"
               "\"finish_reason\":\"stop\"}]}",
               1);
    diff_chunk("{\"choices\":[{\"delta\":null,\"finish_reason\":\"length\"}]}", 1);
    diff_chunk("{\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"content\":\"c\"},"
               "\"finish_reason\":\"stop\"},{\"delta\":{\"content\":\"second\"}}]}",
               1);
    diff_chunk("{\"choices\":[{\"delta\":{\"reasoning_content\":\"\",\"reasoning\":\"r\"}}]}", 1);
    diff_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1e3}}", 1);
    diff_chunk("{\"usage\":{\"prompt_tokens\":3},\"choices\":null}", 1);
    diff_chunk("{\"usage\":5,\"choices\":[{\"finish_reason\":\"stop\"}]}", 1);
    diff_chunk("{\"id\":\"x\"}", 1);
    diff_chunk(" {\"choices\":[{\"delta\":{\"content\":\"\\u0041\\/\"},\"finish_reason\":\"\"}]} ", 1);
    /* and those it leaves to jansson, which decides */
    diff_chunk("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":"
               "{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}",
               1);
    diff_chunk("{\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}", 1);
    diff_chunk("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":null,\"id\":null,"
               "\"function\":null},{\"type\":\"function\",\"function\":{\"name\":null,"
               "\"arguments\":null}},{\"index\":127,\"function\":{\"arguments\":\"\"}}]}}]}",
               1);
    diff_chunk("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":128}]}}]}", 1);
    diff_chunk("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":9007199254740993}]}}]}", 1);
    static const char *const left[] = {
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1.0}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"0\"}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"index\":1}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":5}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":[]}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":1}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":{\"a\":1}}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[5]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}",
        "{\"choices\":[{\"delta\":{\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}}]}",
        "{\"error\":{\"message\":\"overloaded\"}}", "{\"error\":null,\"choices\":[]}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"b\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":5}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":1}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":1e999}}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\\u0000\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"\\ud800\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"\xc3\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"x\"}}]} x", "{\"choices\":{}}",
        "{\"choices\":[1]}", "{\"choices\":[{\"delta\":5}]}", "[]", "\"x\"", "nul"};
    for (size_t i = 0; i < sizeof left / sizeof *left; i++)
        diff_chunk(left[i], 0);

    /* tool call deltas without indexes: continued, named by id, new ones; then past
       LLM_MAX_TOOL_CALLS calls */
    pbuf b = PBUF_INIT;
    static const char *const deltas[] = {
        "{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}}",
        "{\"function\":{\"arguments\":\":1}\"}}", "{\"id\":\"b\",\"function\":{\"name\":\"g\"}}",
        "{\"id\":\"a\",\"function\":{\"arguments\":\" \"}}", "{\"function\":{\"name\":\"h\"}}",
        "{\"function\":{\"name\":\"\",\"arguments\":\"{}\"}}", "{\"id\":\"\"}"};
    for (size_t i = 0; i < sizeof deltas / sizeof *deltas; i++)
        pbuf_printf(&b, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[%s]}}]}\n\n", deltas[i]);
    pbuf_puts(&b, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
                  "data: [DONE]\n\n");
    CHECK(stream_diff(b.data, b.len, 0) == sizeof deltas / sizeof *deltas + 1);
    stream_diff(b.data, b.len, 5);
    pbuf_reset(&b);
    for (int i = 0; i < LLM_MAX_TOOL_CALLS + 2; i++)
        pbuf_printf(&b, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c%d\","
                        "\"function\":{\"name\":\"f\"}}]}}]}\n\n",
                    i);
    pbuf_puts(&b, "data: [DONE]\n\n");
    CHECK(stream_diff(b.data, b.len, 0) == LLM_MAX_TOOL_CALLS + 1); /* the one too many fails,
                                                                        as with jansson */
    pbuf_free(&b);

    /* every deletion and some substitutions in the usual stream */
    static const char replacements[] = {'"', '\\', '}', ',', ' ', '\n', '\x80', '0'};
    len = strlen(USUAL_STREAM);
    char *m = malloc(len + 1);
    size_t taken = 0;
    for (size_t at = 0; at < len; at++) {
        memcpy(m, USUAL_STREAM, at);
        memcpy(m + at, USUAL_STREAM + at + 1, len - at - 1);
        taken += stream_diff(m, len - 1, 0);
        memcpy(m, USUAL_STREAM, len);
        for (size_t r = 0; r < sizeof replacements; r++) {
            if (USUAL_STREAM[at] == replacements[r])
                continue;
            m[at] = replacements[r];
            taken += stream_diff(m, len, 0);
        }
        m[at] = USUAL_STREAM[at];
    }
    free(m);
    CHECK(taken > 0);
}

int main(void)
{
    test_usual();
    test_corpus();
    test_strings();
    test_members();
    test_calls_bound();
    test_numbers();
    test_duplicates();
    test_syntax();
    test_depth();
    test_mutations();
    test_streams();
    return check_report();
}
