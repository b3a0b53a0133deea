/* test_llm_reply.c -- decoding whole and streamed Chat Completions replies. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "check.h"
#include "provider/codec.h"
#include "provider/openai_decode.h"
#include "reply_diff.h"

/* ---- helpers ---- */

static int contains(const char *s, const char *part) { return s && part && strstr(s, part); }

#define CHECK_CONTAINS(s, part)                                                        \
    do {                                                                               \
        const char *cc_s_ = (s);                                                       \
        CHECK(contains(cc_s_, (part)));                                                \
        if (!contains(cc_s_, (part)))                                                  \
            fprintf(stderr, "  got: %s\n  expected a part: %s\n", cc_s_ ? cc_s_ : "(null)", \
                    (part));                                                           \
    } while (0)

static int str_equal(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static int replies_equal(const llm_reply *a, const llm_reply *b)
{
    if (!str_equal(a->content, b->content) || !str_equal(a->finish_reason, b->finish_reason) ||
        a->ncalls != b->ncalls)
        return 0;
    for (size_t i = 0; i < a->ncalls; i++)
        if (!str_equal(a->calls[i].id, b->calls[i].id) ||
            !str_equal(a->calls[i].name, b->calls[i].name) ||
            !str_equal(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

/* Every body decoded here is also decoded with the fast path and without
   it: both must agree (reply_diff.h). */
static int decode(const char *body, llm_reply *r, char **err)
{
    reply_diff(body, strlen(body), REPLY_DIFF_ANY);
    return llm_reply_decode(body, strlen(body), r, err);
}

/* The body must fail to decode, with `part` in the message and *r left empty. */
static void expect_decode_error(const char *body, const char *part)
{
    llm_reply r;
    char *err = NULL;
    CHECK(decode(body, &r, &err) == -1);
    CHECK_CONTAINS(err, part);
    CHECK(r.content == NULL && r.calls == NULL && r.ncalls == 0 && r.finish_reason == NULL);
    free(err);
}

static void expect_error_text(const char *body, const char *want)
{
    char *text = llm_error_text(body, strlen(body));
    if (want)
        CHECK_STR(text, want);
    else
        CHECK(text == NULL);
    free(text);
}

/* Every on_text piece, concatenated. */
static void collect_text(void *ud, const char *text, size_t len)
{
    pbuf_append(ud, text, len);
}

typedef struct stream_result {
    int rc;        /* 0, or -1 from the first feed or finish that failed */
    llm_reply reply;
    char *err;
    pbuf text;     /* what on_text saw */
} stream_result;

/* Feed `data` in pieces of `piece` bytes (0 = all at once), then finish.
   The same stream without the chunk fast path must agree (reply_diff.h). */
static stream_result run_stream_pieces(const char *data, size_t len, size_t piece)
{
    stream_diff(data, len, piece);
    stream_result res = {0, {0}, NULL, PBUF_INIT};
    llm_stream *s = llm_stream_new(collect_text, &res.text);
    size_t step = piece ? piece : (len ? len : 1);
    for (size_t off = 0; off < len && res.rc == 0; off += step) {
        size_t n = len - off < step ? len - off : step;
        res.rc = llm_stream_feed(s, data + off, n, &res.err);
    }
    if (res.rc == 0)
        res.rc = llm_stream_finish(s, &res.reply, &res.err);
    llm_stream_free(s);
    return res;
}

/* Feed data[0..cut) then data[cut..len), then finish. */
static stream_result run_stream_cut(const char *data, size_t len, size_t cut)
{
    stream_diff(data, len, cut);
    stream_result res = {0, {0}, NULL, PBUF_INIT};
    llm_stream *s = llm_stream_new(collect_text, &res.text);
    res.rc = llm_stream_feed(s, data, cut, &res.err);
    if (res.rc == 0)
        res.rc = llm_stream_feed(s, data + cut, len - cut, &res.err);
    if (res.rc == 0)
        res.rc = llm_stream_finish(s, &res.reply, &res.err);
    llm_stream_free(s);
    return res;
}

static stream_result run_stream(const char *data)
{
    return run_stream_pieces(data, strlen(data), 0);
}

static void result_free(stream_result *res)
{
    llm_reply_free(&res->reply);
    free(res->err);
    pbuf_free(&res->text);
}

/* The stream must fail (at some feed or at finish) with `part` in the message. */
static void expect_stream_error(const char *data, const char *part)
{
    stream_result res = run_stream(data);
    CHECK(res.rc == -1);
    CHECK_CONTAINS(res.err, part);
    CHECK(res.reply.content == NULL && res.reply.ncalls == 0);
    result_free(&res);
}

/* ---- whole replies ---- */

static void test_decode_content(void)
{
    llm_reply r;
    char *err = NULL;
    CHECK(decode("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,"
                 "\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                 "\"content\":\"Hello, w\\u00f6rld \\ud83d\\ude00\"},\"logprobs\":null,"
                 "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5}}",
                 &r, &err) == 0);
    CHECK(err == NULL);
    CHECK_STR(r.content, "Hello, w\xc3\xb6rld \xf0\x9f\x98\x80");
    CHECK(r.ncalls == 0 && r.calls == NULL);
    CHECK_STR(r.finish_reason, "stop");
    llm_reply_free(&r);
    CHECK(r.content == NULL && r.finish_reason == NULL);
    llm_reply_free(&r); /* twice is harmless */
}

static void test_decode_tool_calls(void)
{
    llm_reply r;
    char *err = NULL;
    CHECK(decode("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,"
                 "\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":"
                 "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},"
                 "{\"id\":\"call_def\",\"type\":\"function\",\"function\":{\"name\":\"turn_on\","
                 "\"arguments\":\"{\\\"entity\\\":\\\"light.kitchen\\\"}\"}}]},"
                 "\"finish_reason\":\"tool_calls\"}]}",
                 &r, &err) == 0);
    CHECK(r.content == NULL);
    CHECK(r.ncalls == 2);
    if (r.ncalls == 2) {
        CHECK_STR(r.calls[0].id, "call_abc");
        CHECK_STR(r.calls[0].name, "get_weather");
        CHECK_STR(r.calls[0].arguments, "{\"city\": \"Paris\"}"); /* exactly as sent */
        CHECK_STR(r.calls[1].id, "call_def");
        CHECK_STR(r.calls[1].name, "turn_on");
        CHECK_STR(r.calls[1].arguments, "{\"entity\":\"light.kitchen\"}");
    }
    CHECK_STR(r.finish_reason, "tool_calls");
    llm_reply_free(&r);

    /* Text beside the calls is kept; arguments are not validated here. */
    CHECK(decode("{\"choices\":[{\"message\":{\"content\":\"Let me check.\",\"tool_calls\":"
                 "[{\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}}]}",
                 &r, &err) == 0);
    CHECK_STR(r.content, "Let me check.");
    CHECK(r.ncalls == 1 && r.calls && strcmp(r.calls[0].arguments, "{not json") == 0);
    CHECK(r.finish_reason == NULL);
    llm_reply_free(&r);
}

static void test_decode_ollama_object_arguments(void)
{
    llm_reply r;
    char *err = NULL;
    CHECK(decode("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                 "[{\"id\":\"call_x\",\"function\":{\"name\":\"set_light\",\"arguments\":"
                 "{ \"entity\" : \"light.desk\", \"brightness\": 0.1, \"on\": true,"
                 " \"rgb\": [255, 0, 10], \"extra\": null, \"t\": 2.5e1,"
                 " \"name\": \"caf\\u00e9 \\\"x\\\"\"}}}]},\"finish_reason\":\"tool_calls\"}]}",
                 &r, &err) == 0);
    CHECK(r.content == NULL); /* "" beside tool calls is no content */
    CHECK(r.ncalls == 1);
    if (r.ncalls == 1)
        CHECK_STR(r.calls[0].arguments,
                  "{\"entity\":\"light.desk\",\"brightness\":0.1,\"on\":true,\"rgb\":[255,0,10],"
                  "\"extra\":null,\"t\":25.0,\"name\":\"caf\xc3\xa9 \\\"x\\\"\"}");
    llm_reply_free(&r);

    /* A number that needs 17 digits keeps them (then every number gets 17). */
    CHECK(decode("{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"f\","
                 "\"arguments\":{\"x\":0.30000000000000004,\"n\":-7}}}]}}]}",
                 &r, &err) == 0);
    CHECK(r.ncalls == 1 && r.calls &&
          strcmp(r.calls[0].arguments, "{\"x\":0.30000000000000004,\"n\":-7}") == 0);
    llm_reply_free(&r);

    CHECK(decode("{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"f\","
                 "\"arguments\":{}}}]}}]}",
                 &r, &err) == 0);
    CHECK(r.ncalls == 1 && r.calls && strcmp(r.calls[0].arguments, "{}") == 0);
    llm_reply_free(&r);
}

static void test_decode_defaults(void)
{
    llm_reply r;
    char *err = NULL;
    /* Missing or empty ids are synthesised from the position; missing, null or
       empty arguments become "{}"; an empty name is kept. */
    CHECK(decode("{\"choices\":[{\"message\":{\"tool_calls\":["
                 "{\"function\":{\"name\":\"a\"}},"
                 "{\"id\":\"\",\"function\":{\"name\":\"b\",\"arguments\":\"\"}},"
                 "{\"id\":null,\"function\":{\"name\":\"\",\"arguments\":null}},"
                 "{\"id\":\"real\",\"function\":{\"name\":\"d\",\"arguments\":\"{}\"}}]}}]}",
                 &r, &err) == 0);
    CHECK(r.ncalls == 4);
    if (r.ncalls == 4) {
        CHECK_STR(r.calls[0].id, "call_0");
        CHECK_STR(r.calls[0].arguments, "{}");
        CHECK_STR(r.calls[1].id, "call_1");
        CHECK_STR(r.calls[1].arguments, "{}");
        CHECK_STR(r.calls[2].id, "call_2");
        CHECK_STR(r.calls[2].name, "");
        CHECK_STR(r.calls[3].id, "real");
    }
    CHECK(r.content == NULL && r.finish_reason == NULL);
    llm_reply_free(&r);

    /* Neither content nor calls: content "" (models do that). */
    const char *empty_replies[] = {
        "{\"choices\":[{\"message\":{\"role\":\"assistant\"}}]}",
        "{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":null}}]}",
        "{\"choices\":[{\"message\":{\"content\":\"\",\"tool_calls\":[]}}]}",
        "{\"choices\":[{\"message\":{\"content\":[]}}]}",
    };
    for (size_t i = 0; i < sizeof empty_replies / sizeof *empty_replies; i++) {
        CHECK(decode(empty_replies[i], &r, &err) == 0);
        CHECK_STR(r.content, "");
        CHECK(r.ncalls == 0);
        llm_reply_free(&r);
    }

    /* Only choices[0] counts; a null error member is no error. */
    CHECK(decode("{\"error\":null,\"choices\":[{\"message\":{\"content\":\"one\"}},"
                 "{\"message\":{\"content\":\"two\"}}]}",
                 &r, &err) == 0);
    CHECK_STR(r.content, "one");
    llm_reply_free(&r);
}

static void test_decode_text_parts(void)
{
    llm_reply r;
    char *err = NULL;
    CHECK(decode("{\"choices\":[{\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}},{\"text\":\"lo\"}]},"
                 "\"finish_reason\":\"stop\"}]}",
                 &r, &err) == 0);
    CHECK_STR(r.content, "Hello");
    llm_reply_free(&r);
}

static void test_decode_errors(void)
{
    expect_decode_error("", "response is not JSON");
    expect_decode_error("Hello there", "response is not JSON");
    expect_decode_error("{\"choices\":[]} trailing", "response is not JSON");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":\"\xff\"}}]}", "not JSON");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":\"\xc3\"}}]}", "not JSON");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":\"a\\u0000b\"}}]}", "not JSON");
    expect_decode_error("[1,2]", "not a JSON object");
    expect_decode_error("\"text\"", "not a JSON object");
    expect_decode_error("42", "not a JSON object");
    expect_decode_error("{}", "has no choices");
    expect_decode_error("{\"choices\":null}", "has no choices");
    expect_decode_error("{\"choices\":[]}", "has no choices");
    expect_decode_error("{\"choices\":{\"0\":{}}}", "choices is an object, not an array");
    expect_decode_error("{\"choices\":[1]}", "choices[0] is a number, not an object");
    expect_decode_error("{\"choices\":[{\"finish_reason\":\"stop\"}]}", "has no message");
    expect_decode_error("{\"choices\":[{\"message\":\"hi\"}]}", "message is a string, not an object");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":5}}]}", "content is a number");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":{\"text\":\"x\"}}}]}",
                        "content is an object");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":true}}]}", "content is a boolean");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":[\"x\"]}}]}",
                        "part 0 is a string, not an object");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":[{\"type\":\"text\"}]}}]}",
                        "part 0 has no text");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":{}}}]}",
                        "tool_calls is an object, not an array");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[\"f\"]}}]}",
                        "tool call 0 is a string, not an object");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":\"c\"}]}}]}",
                        "tool call 0 has no function");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"a\"}},"
                        "{\"function\":{\"arguments\":\"{}\"}}]}}]}",
                        "tool call 1 has no function name");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":7}}]}}]}",
                        "name is a number, not a string");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":7,\"function\":"
                        "{\"name\":\"f\"}}]}}]}",
                        "id is a number, not a string");
    expect_decode_error("{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":"
                        "{\"name\":\"f\",\"arguments\":[1]}}]}}]}",
                        "arguments is an array, expected a string or an object");
    expect_decode_error("{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":1}]}",
                        "finish_reason is a number, not a string");
}

static void test_decode_error_bodies(void)
{
    expect_decode_error("{\"error\":{\"message\":\"Rate limit reached for gpt-4o\",\"type\":"
                        "\"requests\",\"code\":\"rate_limit_exceeded\"}}",
                        "server returned an error: Rate limit reached for gpt-4o");
    expect_decode_error("{\"error\":\"model \\\"llama9\\\" not found, try pulling it first\"}",
                        "server returned an error: model \"llama9\" not found");
    expect_decode_error("{\"error\":{\"code\":500}}", "server returned an error: (no message)");
    /* An error member wins over choices. */
    expect_decode_error("{\"error\":\"overloaded\",\"choices\":[{\"message\":{\"content\":\"x\"}}]}",
                        "server returned an error: overloaded");
}

/* ---- llm_error_text ---- */

static void test_error_text(void)
{
    expect_error_text("{\"error\":{\"message\":\"Incorrect API key provided: sk-abc.\",\"type\":"
                      "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}",
                      "Incorrect API key provided: sk-abc.");
    expect_error_text("{\"error\":\"model 'qwen' not found\"}", "model 'qwen' not found");
    expect_error_text("{\"object\":\"error\",\"message\":\"The model `x` does not exist.\","
                      "\"type\":\"NotFoundError\",\"code\":404}",
                      "The model `x` does not exist.");
    expect_error_text("[{\"error\":{\"code\":400,\"message\":\"API key not valid.\",\"status\":"
                      "\"INVALID_ARGUMENT\"}}]",
                      "API key not valid.");
    expect_error_text("{\"detail\":\"Not Found\"}", "Not Found");
    expect_error_text("{\"error\":{\"message\":\"line one\\nline two\\u0007\\t end  \"}}",
                      "line one line two end");
    expect_error_text("\"quoted\"", "quoted");
    expect_error_text("{\"foo\":1}", NULL);
    expect_error_text("{\"error\":{\"code\":429}}", NULL);

    expect_error_text("Bad Gateway\n", "Bad Gateway");
    expect_error_text("  upstream\tconnect error\r\nor disconnect/reset  ", "upstream connect error or disconnect/reset");
    expect_error_text("a\x01\x1b[31mb\x7f" "c", "a [31mb c");
    expect_error_text("ab\xff\xc3(cd\xed\xa0\x80", "ab(cd");
    expect_error_text("404", "404");
    expect_error_text("", NULL);
    expect_error_text(" \r\n\t ", NULL);
    CHECK(llm_error_text(NULL, 0) == NULL);

    expect_error_text("<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
                      "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n"
                      "</body>\r\n</html>\r\n",
                      "502 Bad Gateway");
    expect_error_text("\n<!DOCTYPE html><HTML><BODY><H1 class=\"x\">Service\n  Unavailable</H1></BODY></HTML>",
                      "Service Unavailable");
    expect_error_text("<html><body>nothing to see</body></html>", NULL);
    expect_error_text("<html><title broken<h1>Teapot</h1>", "Teapot");
    expect_error_text("<html><title>never closed", NULL);
    expect_error_text("Oops \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf|\xf4\x90\x80\x80|\xf0\x8f\xbf\xbf|\xe0\x9f\xbf|",
                      "Oops \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf||||");
    expect_error_text("\xc2\x85next\xc2\xa0line", "next\xc2\xa0line"); /* NEL is a control */

    /* Long bodies are cut to ~500 bytes on a character boundary. */
    char big[3001];
    memset(big, 'x', 3000);
    big[3000] = '\0';
    char *text = llm_error_text(big, 3000);
    CHECK(text && strlen(text) == 503 && strcmp(text + 500, "...") == 0);
    free(text);
    pbuf accents = PBUF_INIT;
    for (int i = 0; i < 400; i++)
        pbuf_puts(&accents, "\xc3\xa9"); /* é */
    text = llm_error_text(accents.data, accents.len);
    CHECK(text && strlen(text) == 503 && (unsigned char)text[499] == 0xa9);
    free(text);
    pbuf_free(&accents);
}

/* ---- streams ---- */

/* Content and two tool calls interleaved by index, comments, ignored fields,
   data without the space, a usage chunk, and garbage after [DONE]. */
static const char STREAM_FULL[] =
    ": OPENROUTER PROCESSING\n"
    "\n"
    "event: message\n"
    "id: 1\n"
    "retry: 3000\n"
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":"
    "{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n"
    "\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Checking \\u00e9\\ud83d\\ude00\"}}]}\n"
    "\n"
    "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\" both.\"}}]}\n"
    "\n"
    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":"
    "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n"
    "\n"
    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":"
    "\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\"\"}}]}}]}\n"
    "\n"
    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
    "{\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n"
    "\n"
    ": keep-alive\n"
    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":"
    "{\"arguments\":\":\\\"UTC\\\"}\"}},{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n"
    "\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n"
    "\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20}}\n"
    "\n"
    "data: [DONE]\n"
    "\n"
    "data: this is ignored {\n";

/* The same reply, sent whole. */
static const char BODY_FULL[] =
    "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
    "\"Checking \\u00e9\\ud83d\\ude00 both.\",\"tool_calls\":[{\"id\":\"call_a\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
    "{\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":"
    "\"{\\\"tz\\\":\\\"UTC\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}";

static void check_full_reply(const llm_reply *r)
{
    CHECK_STR(r->content, "Checking \xc3\xa9\xf0\x9f\x98\x80 both.");
    CHECK(r->ncalls == 2);
    if (r->ncalls == 2) {
        CHECK_STR(r->calls[0].id, "call_a");
        CHECK_STR(r->calls[0].name, "get_weather");
        CHECK_STR(r->calls[0].arguments, "{\"city\":\"Paris\"}");
        CHECK_STR(r->calls[1].id, "call_b");
        CHECK_STR(r->calls[1].name, "get_time");
        CHECK_STR(r->calls[1].arguments, "{\"tz\":\"UTC\"}");
    }
    CHECK_STR(r->finish_reason, "tool_calls");
}

/* The stream gives `want` however it is split, and on_text sees its content. */
static void check_split_invariance(const char *data, const llm_reply *want)
{
    size_t len = strlen(data);
    int bad_cuts = 0, bad_pieces = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        stream_result res = run_stream_cut(data, len, cut);
        if (res.rc != 0 || !replies_equal(&res.reply, want) ||
            !str_equal(res.text.len ? res.text.data : NULL, want->content && *want->content ? want->content : NULL))
            bad_cuts++;
        result_free(&res);
    }
    for (size_t piece = 1; piece <= 7; piece++) {
        stream_result res = run_stream_pieces(data, len, piece);
        if (res.rc != 0 || !replies_equal(&res.reply, want))
            bad_pieces++;
        result_free(&res);
    }
    CHECK(bad_cuts == 0);
    CHECK(bad_pieces == 0);
}

/* LF line ends turned into CRLF or lone CR. */
static char *with_line_ends(const char *data, const char *eol)
{
    pbuf b = PBUF_INIT;
    for (const char *p = data; *p; p++) {
        if (*p == '\n')
            pbuf_puts(&b, eol);
        else
            pbuf_putc(&b, *p);
    }
    return pbuf_take(&b);
}

static void test_stream_full(void)
{
    stream_result whole = run_stream(STREAM_FULL);
    CHECK(whole.rc == 0);
    CHECK(whole.err == NULL);
    check_full_reply(&whole.reply);
    CHECK_STR(whole.text.data, "Checking \xc3\xa9\xf0\x9f\x98\x80 both.");

    stream_result bytes = run_stream_pieces(STREAM_FULL, strlen(STREAM_FULL), 1);
    CHECK(bytes.rc == 0);
    CHECK(replies_equal(&bytes.reply, &whole.reply));
    CHECK_STR(bytes.text.data, whole.text.data);
    result_free(&bytes);

    /* Streamed and whole: the same reply, so the same history. */
    llm_reply body;
    char *err = NULL;
    CHECK(decode(BODY_FULL, &body, &err) == 0);
    CHECK(replies_equal(&body, &whole.reply));
    llm_reply_free(&body);

    check_split_invariance(STREAM_FULL, &whole.reply);
    char *crlf = with_line_ends(STREAM_FULL, "\r\n");
    check_split_invariance(crlf, &whole.reply);
    free(crlf);
    char *cr = with_line_ends(STREAM_FULL, "\r");
    check_split_invariance(cr, &whole.reply);
    free(cr);
    result_free(&whole);
}

static void test_stream_plain_text(void)
{
    const char *stream =
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"The light\"}}]}\r\n\r\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\" is on.\"}}]}\r\n\r\n"
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\r\n\r\n"
        "data: [DONE]\r\n\r\n";
    stream_result res = run_stream(stream);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "The light is on.");
    CHECK_STR(res.reply.finish_reason, "stop");
    CHECK(res.reply.ncalls == 0);
    llm_reply body;
    char *err = NULL;
    CHECK(decode("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"The light is on.\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 &body, &err) == 0);
    CHECK(replies_equal(&body, &res.reply));
    llm_reply_free(&body);
    check_split_invariance(stream, &res.reply);
    result_free(&res);
}

static void test_stream_multiline_data(void)
{
    /* Data lines of one event are joined with "\n": JSON spread over lines. */
    const char *stream =
        "data: {\"choices\":[{\"delta\":\n"
        "data: {\"content\":\"multi\"},\n"
        "data:\n"
        "data: \"finish_reason\":\"stop\"}]}\n"
        "\n"
        "data: [DONE]\n\n";
    stream_result res = run_stream(stream);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "multi");
    CHECK_STR(res.reply.finish_reason, "stop");
    check_split_invariance(stream, &res.reply);
    result_free(&res);
}

static void test_stream_tool_call_indexes(void)
{
    /* Out of order and sparse: the reply keeps index order, gaps dropped;
       missing ids are synthesised from the position in the reply. */
    const char *stream =
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":5,\"function\":{\"name\":\"late\","
        "\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":2,\"id\":\"call_2\",\"function\":"
        "{\"name\":\"early\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":5,\"id\":\"\",\"function\":"
        "{\"name\":\"ignored\",\"arguments\":\":1}\"}}]}}]}\n\n"
        "data: [DONE]\n\n";
    stream_result res = run_stream(stream);
    CHECK(res.rc == 0);
    CHECK(res.reply.content == NULL);
    CHECK(res.reply.finish_reason == NULL); /* [DONE] without finish_reason is fine */
    CHECK(res.reply.ncalls == 2);
    if (res.reply.ncalls == 2) {
        CHECK_STR(res.reply.calls[0].id, "call_2");
        CHECK_STR(res.reply.calls[0].name, "early");
        CHECK_STR(res.reply.calls[0].arguments, "{}");
        CHECK_STR(res.reply.calls[1].id, "call_1");
        CHECK_STR(res.reply.calls[1].name, "late");
        CHECK_STR(res.reply.calls[1].arguments, "{\"a\":1}");
    }
    result_free(&res);

    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}\n\n",
                        "index -1 is negative");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"0\"}]}}]}\n\n",
                        "index is a string, not an integer");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                        "{\"arguments\":\"{}\"}}]}}]}\n\ndata: [DONE]\n\n",
                        "tool call 0 has no function name");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}\n\n",
                        "tool_calls is an object, not an array");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                        "{\"name\":\"f\",\"arguments\":5}}]}}]}\n\n",
                        "arguments is a number");
}

static void test_stream_without_indexes(void)
{
    /* Ollama before 0.5 and Gemini: whole calls without index, object arguments. */
    const char *stream =
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"function\":{\"name\":\"a\",\"arguments\":{\"x\":1}}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"call_2\",\"function\":"
        "{\"name\":\"b\",\"arguments\":\"{\\\"y\\\":\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"2}\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"call_1\",\"function\":"
        "{\"arguments\":\"\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n"
        "data: [DONE]\n\n";
    stream_result res = run_stream(stream);
    CHECK(res.rc == 0);
    llm_reply body;
    char *err = NULL;
    CHECK(decode("{\"choices\":[{\"message\":{\"content\":\"\",\"tool_calls\":["
                 "{\"id\":\"call_1\",\"function\":{\"name\":\"a\",\"arguments\":{\"x\":1}}},"
                 "{\"id\":\"call_2\",\"function\":{\"name\":\"b\",\"arguments\":\"{\\\"y\\\":2}\"}}]},"
                 "\"finish_reason\":\"tool_calls\"}]}",
                 &body, &err) == 0);
    CHECK(res.reply.ncalls == 2 && res.reply.content == NULL);
    if (res.reply.ncalls == 2) {
        CHECK_STR(res.reply.calls[0].arguments, "{\"x\":1}");
        CHECK_STR(res.reply.calls[1].arguments, "{\"y\":2}");
    }
    CHECK(replies_equal(&body, &res.reply));
    llm_reply_free(&body);
    result_free(&res);
}

static void test_stream_odd_tool_calls(void)
{
    /* A call that begins without an id gets it from the next index-less piece. */
    stream_result res = run_stream(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"search\","
        "\"arguments\":\"{\\\"q\\\":\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"abc\",\"function\":"
        "{\"arguments\":\"1}\"}}]}}]}\n\n"
        "data: {\"usage\":{\"total_tokens\":3}}\n\n"
        "data: {\"choices\":null}\n\n"
        "data: {\"choices\":[{\"delta\":null,\"finish_reason\":\"tool_calls\"}]}\n\n");
    CHECK(res.rc == 0);
    CHECK(res.reply.ncalls == 1);
    if (res.reply.ncalls == 1) {
        CHECK_STR(res.reply.calls[0].id, "abc");
        CHECK_STR(res.reply.calls[0].name, "search");
        CHECK_STR(res.reply.calls[0].arguments, "{\"q\":1}");
    }
    result_free(&res);

    /* Whole calls with neither index nor id: a second name is a second call. */
    res = run_stream(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"a\","
        "\"arguments\":\"{}\"}},{\"function\":{\"name\":\"b\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"c\"}}]}}]}\n\n"
        "data: [DONE]\n\n");
    CHECK(res.rc == 0);
    CHECK(res.reply.ncalls == 3);
    if (res.reply.ncalls == 3) {
        CHECK_STR(res.reply.calls[0].id, "call_0");
        CHECK_STR(res.reply.calls[0].name, "a");
        CHECK_STR(res.reply.calls[0].arguments, "{}");
        CHECK_STR(res.reply.calls[1].id, "call_1");
        CHECK_STR(res.reply.calls[1].name, "b");
        CHECK_STR(res.reply.calls[1].arguments, "{\"x\":1}");
        CHECK_STR(res.reply.calls[2].name, "c");
        CHECK_STR(res.reply.calls[2].arguments, "{}");
    }
    result_free(&res);

    /* More index-less calls than an answer may hold. */
    pbuf many = PBUF_INIT;
    for (int i = 0; i <= LLM_MAX_TOOL_CALLS; i++)
        pbuf_printf(&many, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c%d\","
                    "\"function\":{\"name\":\"f\"}}]}}]}\n\n", i);
    expect_stream_error(many.data, "the answer has more than 1024 tool calls");
    pbuf_free(&many);

    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[7]}}]}\n\n",
                        "tool call is a number, not an object");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,"
                        "\"function\":\"f\"}]}}]}\n\n",
                        "function is a string, not an object");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,"
                        "\"id\":[]}]}}]}\n\n",
                        "id is an array, not a string");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":[{\"type\":1}]}}]}\n\n",
                        "type is a number, not a string");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":[{\"text\":{}}]}}]}\n\n",
                        "text is an object, not a string");
}

static void test_stream_endings(void)
{
    const char *text_chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    const char *stop_chunk = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    char buf[512];

    /* Cut mid-event, mid-line. */
    snprintf(buf, sizeof buf, "%sdata: {\"choices\":[{\"del", text_chunk);
    expect_stream_error(buf, "stream ended mid-line");
    /* Cut after a complete event without finish_reason or [DONE]. */
    expect_stream_error(text_chunk, "stream ended before [DONE]");
    /* Nothing at all, or nothing SSE. */
    expect_stream_error("", "without any data event");
    expect_stream_error("{\"choices\":[{\"message\":{\"content\":\"x\"}}]}\n", "without any data event");
    /* The cut event had its lines but not its blank line: decoded at the end. */
    snprintf(buf, sizeof buf, "%sdata: {\"choices\":[{\"delta\":{\"content\":\"!\"}", text_chunk);
    expect_stream_error(buf, "mid-line");
    snprintf(buf, sizeof buf, "%sdata: {\"choices\":[{\"delta\":{\"content\":\"!\"},"
             "\"finish_reason\":\"stop\"}]}\n", text_chunk);
    stream_result res = run_stream(buf);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "Hi!");
    CHECK_STR(res.reply.finish_reason, "stop");
    result_free(&res);

    /* A finish_reason without [DONE] is complete (no partial event pending). */
    snprintf(buf, sizeof buf, "%s%s", text_chunk, stop_chunk);
    res = run_stream(buf);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "Hi");
    result_free(&res);
    /* ... but not with a partial line after it. */
    snprintf(buf, sizeof buf, "%s%sdata: [DO", text_chunk, stop_chunk);
    expect_stream_error(buf, "mid-line");

    /* [DONE] with spaces, then anything: ignored. */
    snprintf(buf, sizeof buf, "%sdata:  [DONE] \n\ndata: {broken\n\n\xff\xfe", text_chunk);
    res = run_stream(buf);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "Hi");
    CHECK(res.reply.finish_reason == NULL);
    result_free(&res);

    /* Empty "data:" events and blank lines are keep-alives. */
    snprintf(buf, sizeof buf, "\n\ndata:\n\ndata: \n\n%s\n\n%s", text_chunk, stop_chunk);
    res = run_stream(buf);
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "Hi");
    result_free(&res);

    /* A tool-call-only stream ending in [DONE] has no content. */
    res = run_stream("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"x\","
                     "\"function\":{\"name\":\"f\"}}]}}]}\n\ndata: [DONE]\n\n");
    CHECK(res.rc == 0);
    CHECK(res.reply.content == NULL && res.reply.ncalls == 1);
    result_free(&res);

    /* A stream of nothing but [DONE]: content "". */
    res = run_stream("data: [DONE]\n\n");
    CHECK(res.rc == 0);
    CHECK_STR(res.reply.content, "");
    result_free(&res);
}

static void test_stream_bad_chunks(void)
{
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":\"\xff\"}}]}\n\n",
                        "stream chunk is not JSON");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":\"\xe2\x82\"}}]}\n\n",
                        "stream chunk is not JSON");
    expect_stream_error("data: hello\n\n", "stream chunk is not JSON");
    expect_stream_error("data: [1]\n\n", "stream chunk is not a JSON object");
    expect_stream_error("data: {\"choices\":{}}\n\n", "choices is an object, not an array");
    expect_stream_error("data: {\"choices\":[\"x\"]}\n\n", "choices[0] is a string, not an object");
    expect_stream_error("data: {\"choices\":[{\"delta\":[]}]}\n\n", "delta is an array, not an object");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":1}}]}\n\n",
                        "delta content is a number");
    expect_stream_error("data: {\"choices\":[{\"delta\":{},\"finish_reason\":false}]}\n\n",
                        "finish_reason is a boolean");
    expect_stream_error("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
                        "data: {\"error\":{\"message\":\"upstream timed out\",\"code\":504}}\n\n",
                        "server returned an error: upstream timed out");
    expect_stream_error("event: error\ndata: {\"error\":\"out of VRAM\"}\n\n",
                        "server returned an error: out of VRAM");

    /* The stream is dead after an error: later calls repeat it. */
    llm_stream *s = llm_stream_new(NULL, NULL);
    char *err = NULL;
    const char *bad = "data: nope\n\n";
    CHECK(llm_stream_feed(s, bad, strlen(bad), &err) == -1);
    CHECK_CONTAINS(err, "not JSON");
    free(err);
    const char *good = "data: [DONE]\n\n";
    CHECK(llm_stream_feed(s, good, strlen(good), &err) == -1);
    CHECK_CONTAINS(err, "not JSON");
    free(err);
    llm_reply r;
    CHECK(llm_stream_finish(s, &r, &err) == -1);
    CHECK_CONTAINS(err, "not JSON");
    CHECK(r.content == NULL);
    free(err);
    llm_stream_free(s);

    /* Finishing twice, or feeding after finish, is an error too. */
    s = llm_stream_new(NULL, NULL);
    CHECK(llm_stream_feed(s, good, strlen(good), &err) == 0);
    CHECK(llm_stream_finish(s, &r, &err) == 0);
    llm_reply_free(&r);
    CHECK(llm_stream_finish(s, &r, &err) == -1);
    CHECK_CONTAINS(err, "already finished");
    free(err);
    CHECK(llm_stream_feed(s, good, strlen(good), &err) == -1);
    CHECK_STR(err, "stream fed after it finished");
    free(err);
    llm_stream_free(s);
    llm_stream_free(NULL);

    /* A stream that fails at its end repeats that error, to finish and to feed alike. */
    s = llm_stream_new(NULL, NULL);
    const char *cut = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    CHECK(llm_stream_feed(s, cut, strlen(cut), &err) == 0);
    CHECK(err == NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(llm_stream_finish(s, &r, &err) == -1);
        CHECK_STR(err, "stream ended before [DONE] and without a finish_reason");
        CHECK(r.content == NULL);
        free(err);
    }
    CHECK(llm_stream_feed(s, good, strlen(good), &err) == -1);
    CHECK_STR(err, "stream ended before [DONE] and without a finish_reason");
    free(err);
    llm_stream_free(s);
}

static void test_stream_size_limit(void)
{
    const size_t limit = 8u << 20;
    char *big = malloc(limit + 64);
    /* A line over 8 MiB, fed in pieces: the error comes before the line ends. */
    memcpy(big, "data: \"", 7);
    memset(big + 7, 'a', limit);
    llm_stream *s = llm_stream_new(NULL, NULL);
    char *err = NULL;
    int rc = 0;
    for (size_t off = 0; off < limit + 7 && rc == 0; off += 65536)
        rc = llm_stream_feed(s, big + off, off + 65536 <= limit + 7 ? 65536 : limit + 7 - off, &err);
    CHECK(rc == -1);
    CHECK_CONTAINS(err, "larger than the limit");
    free(err);
    llm_stream_free(s);

    /* The same line arriving whole, with its line end. */
    big[limit + 7] = '\n';
    s = llm_stream_new(NULL, NULL);
    CHECK(llm_stream_feed(s, big, limit + 8, &err) == -1);
    CHECK_CONTAINS(err, "larger than the limit");
    free(err);
    llm_stream_free(s);

    /* An event over 8 MiB made of lines under it. */
    size_t half = limit / 2;
    pbuf ev = PBUF_INIT;
    for (int i = 0; i < 3; i++) {
        pbuf_puts(&ev, "data: ");
        pbuf_append(&ev, big + 7, half);
        pbuf_putc(&ev, '\n');
    }
    s = llm_stream_new(NULL, NULL);
    CHECK(llm_stream_feed(s, ev.data, ev.len, &err) == -1);
    CHECK_CONTAINS(err, "larger than the limit");
    free(err);
    llm_stream_free(s);
    pbuf_free(&ev);

    /* Just under the limit is fine: a 4 MiB content piece. */
    pbuf ok = PBUF_INIT;
    pbuf_puts(&ok, "data: {\"choices\":[{\"delta\":{\"content\":\"");
    pbuf_append(&ok, big + 7, half);
    pbuf_puts(&ok, "\"},\"finish_reason\":\"length\"}]}\n\n");
    stream_result res = run_stream_pieces(ok.data, ok.len, 4096);
    CHECK(res.rc == 0);
    CHECK(res.reply.content && strlen(res.reply.content) == half);
    result_free(&res);
    pbuf_free(&ok);
    free(big);
}

/* ---- one limit on tool calls, streamed or not ---- */

static void whole_with_calls(pbuf *b, int n)
{
    pbuf_reset(b);
    pbuf_puts(b, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[");
    for (int i = 0; i < n; i++)
        pbuf_printf(b, "%s{\"id\":\"c%d\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                       "\"arguments\":\"{}\"}}", i ? "," : "", i);
    pbuf_puts(b, "]},\"finish_reason\":\"tool_calls\"}]}");
}

static void stream_with_calls(pbuf *b, int n, int stride)
{
    pbuf_reset(b);
    for (int i = 0; i < n; i++)
        pbuf_printf(b, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":%d,\"id\":\"c%d\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n", i * stride, i);
    pbuf_puts(b, "data: [DONE]\n\n");
}

static void test_tool_call_limit(void)
{
    pbuf b = PBUF_INIT;
    llm_reply r;
    char *err = NULL;
    /* 129 calls (a stream's old limit was 128) and the most an answer may hold: both ways */
    static const int fine[] = {129, LLM_MAX_TOOL_CALLS};
    for (size_t k = 0; k < 2; k++) {
        whole_with_calls(&b, fine[k]);
        CHECK(llm_reply_decode(b.data, b.len, &r, &err) == 0 && r.ncalls == (size_t)fine[k]);
        llm_reply_free(&r);
        stream_with_calls(&b, fine[k], 1);
        stream_result res = run_stream(b.data);
        CHECK(res.rc == 0 && res.reply.ncalls == (size_t)fine[k]);
        result_free(&res);
    }
    /* one more: the same error both ways */
    whole_with_calls(&b, LLM_MAX_TOOL_CALLS + 1);
    CHECK(llm_reply_decode(b.data, b.len, &r, &err) == -1);
    CHECK_STR(err, "the answer has more than 1024 tool calls");
    free(err);
    stream_with_calls(&b, LLM_MAX_TOOL_CALLS + 1, 1);
    expect_stream_error(b.data, "the answer has more than 1024 tool calls");
    /* sparse indexes take no room: index 128, 5000 and 2^53 + 1 are three calls, in order */
    stream_result res = run_stream(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":5000,\"id\":\"b\",\"function\":"
        "{\"name\":\"f\"}},{\"index\":9007199254740993,\"id\":\"c\",\"function\":{\"name\":\"f\"}},"
        "{\"index\":128,\"id\":\"a\",\"function\":{\"name\":\"f\"}}]}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":5000,\"function\":"
        "{\"arguments\":\"{}\"}}]}}]}\n\ndata: [DONE]\n\n");
    CHECK(res.rc == 0 && res.reply.ncalls == 3);
    if (res.reply.ncalls == 3) {
        CHECK_STR(res.reply.calls[0].id, "a");
        CHECK_STR(res.reply.calls[1].id, "b");
        CHECK_STR(res.reply.calls[2].id, "c");
    }
    result_free(&res);
    pbuf_free(&b);
}

/* ---- call ids unique within a turn ---- */

#define CALL(id) "{\"id\":" id ",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}"

static void decode_calls(const char *id0, const char *id1, llm_reply *r)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
             CALL("%s") "," CALL("%s") "]},\"finish_reason\":\"tool_calls\"}]}", id0, id1);
    char *err = NULL;
    CHECK(decode(body, r, &err) == 0 && r->ncalls == 2);
    free(err);
}

static void test_claim_ids(void)
{
    /* "call_1" twice, and "call_1" beside none (decoded as "call_1": its position) */
    static const char *pairs[][2] = {{"\"call_1\"", "\"call_1\""}, {"\"call_1\"", "\"\""},
                                     {"\"call_1\"", "null"}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        llm_reply r;
        decode_calls(pairs[k][0], pairs[k][1], &r);
        CHECK_STR(r.calls[1].id, "call_1"); /* what the decoders make of it */
        dict *taken = NULL;
        CHECK(llm_reply_claim_ids(&r, &taken, 3) == 0);
        CHECK_STR(r.calls[0].id, "call_1");
        CHECK_STR(r.calls[1].id, "call_3_1");
        llm_reply_free(&r);

        /* The next round of the turn says "call_1" and "call_3_1" again; a minted id the
           model already used gets a further suffix. */
        decode_calls("\"call_3_1\"", "\"call_1\"", &r);
        CHECK(llm_reply_claim_ids(&r, &taken, 5) == 0);
        CHECK_STR(r.calls[0].id, "call_5_0");
        CHECK_STR(r.calls[1].id, "call_5_1");
        llm_reply_free(&r);
        decode_calls("\"call_5_1\"", "\"call_5_1\"", &r);
        CHECK(llm_reply_claim_ids(&r, &taken, 5) == 0);
        CHECK_STR(r.calls[0].id, "call_5_0_1");
        CHECK_STR(r.calls[1].id, "call_5_1_1");
        llm_reply_free(&r);
        llm_call_ids_free(taken);
    }

    /* Streamed: the same ids as the whole reply. */
    stream_result res = run_stream(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{}\"}},{\"index\":1,\"id\":\"\",\"function\":{\"name\":\"g\","
        "\"arguments\":\"{}\"}}]}}]}\n\ndata: [DONE]\n\n");
    CHECK(res.rc == 0 && res.reply.ncalls == 2);
    dict *taken = NULL;
    CHECK(llm_reply_claim_ids(&res.reply, &taken, 1) == 0);
    if (res.reply.ncalls == 2) {
        CHECK_STR(res.reply.calls[0].id, "call_1");
        CHECK_STR(res.reply.calls[1].id, "call_1_1");
    }
    result_free(&res);
    llm_call_ids_free(taken);

    /* ids_minted (Ollama without ids): every call is named by its place. */
    llm_reply r;
    decode_calls("\"x\"", "\"y\"", &r);
    r.ids_minted = 1;
    taken = NULL;
    CHECK(llm_reply_claim_ids(&r, &taken, 2) == 0);
    CHECK_STR(r.calls[0].id, "call_2_0");
    CHECK_STR(r.calls[1].id, "call_2_1");
    llm_reply_free(&r);
    llm_call_ids_free(taken);
}

/* The turn tells the codecs' out of memory from a bad answer by these words (or no words). */
static void test_out_of_memory_is_told_apart(void)
{
    CHECK(llm_error_is_oom(NULL));
    CHECK(llm_error_is_oom(LLM_OUT_OF_MEMORY));
    CHECK(!llm_error_is_oom("out of memory here")); /* a server's words, quoted: not ours */
    CHECK(!llm_error_is_oom(LLM_SERVER_ERROR "out of memory"));
    llm_reply r;
    char *err = NULL;
    CHECK(llm_reply_decode("{\"choices\":7}", 13, &r, &err) != 0);
    CHECK(err && !llm_error_is_oom(err)); /* a bad answer is not out of memory */
    free(err);
}

/* jansson's first allocation of a load (its lexer's buffer) failing sets no error at all:
 * still out of memory, not "not JSON" (lib/json_oom.h). */
static void *no_malloc(size_t n)
{
    (void)n;
    return NULL;
}

static void test_parser_without_memory_is_out_of_memory(void)
{
    static const char body[] = "{\"choices\":[]}";
    json_error_t jerr;
    memset(&jerr, 0x04, sizeof jerr); /* the stack's garbage, as jansson may leave it */
    json_set_alloc_funcs(no_malloc, free);
    json_t *root = json_loadb(body, sizeof body - 1, 0, &jerr);
    json_set_alloc_funcs(malloc, free);
    CHECK(root == NULL);
    char *err = NULL;
    CHECK(codec_fail_not_json(&err, "response", &jerr) != 0 && llm_error_is_oom(err));
    free(err);
    json_decref(root);
    memset(&jerr, 0, sizeof jerr); /* a real syntax error stays one */
    root = json_loadb("{", 1, 0, &jerr);
    err = NULL;
    CHECK(!root && codec_fail_not_json(&err, "response", &jerr) != 0 && !llm_error_is_oom(err));
    free(err);
}

int main(void)
{
    test_out_of_memory_is_told_apart();
    test_parser_without_memory_is_out_of_memory();
    test_decode_content();
    test_decode_tool_calls();
    test_decode_ollama_object_arguments();
    test_decode_defaults();
    test_decode_text_parts();
    test_decode_errors();
    test_decode_error_bodies();
    test_error_text();
    test_stream_full();
    test_stream_plain_text();
    test_stream_multiline_data();
    test_stream_tool_call_indexes();
    test_stream_without_indexes();
    test_stream_odd_tool_calls();
    test_stream_endings();
    test_stream_bad_chunks();
    test_stream_size_limit();
    test_claim_ids();
    test_tool_call_limit();
    return check_report();
}
