/*
 * test_providers.c -- every provider codec against the golden files of
 * tests/corpus/ (see its README for the published shapes they follow), the
 * <think> filter, retry rules and error texts.
 *
 * PARLEY_UPDATE_GOLDEN=1 rewrites the request files from the codecs (then
 * review the diff against the providers' docs before committing it).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/utf8.h"
#include "check.h"
#include "config/options.h"
#include "provider/codec.h"
#include "provider/provider.h"
#include "provider/think.h"
#include "read_file.h"
#include "config/toolset.h"

#define CORPUS PARLEY_SOURCE_DIR "/tests/corpus/"

static const char *const NAMES[] = {"openai", "anthropic", "ollama"};

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *v = json_load_file(path, 0, &jerr);
    if (!v)
        fprintf(stderr, "  %s: %s (line %d)\n", path, jerr.text, jerr.line);
    return v;
}

/* ---- requests ---- */

/* A list of messages as the turn stores them: "m,m," */
static void put_stored_text(pbuf *out, const json_t *list)
{
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m) {
        char *one = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
        pbuf_puts(out, one);
        pbuf_putc(out, ',');
        free(one);
    }
}

static void check_request(const char *name, json_t *conv)
{
    char *opts_text = json_dumps(json_object_get(conv, "options"), JSON_COMPACT);
    json_t *o_obj = json_loads(opts_text, 0, NULL);
    json_object_set_new(o_obj, "provider", json_string(name));
    free(opts_text);
    opts_text = json_dumps(o_obj, JSON_COMPACT);
    json_decref(o_obj);
    parley_options o;
    char *err = NULL;
    CHECK(options_parse(opts_text, &o, &err) == PARLEY_OK);
    free(opts_text);
    toolset *tools = NULL;
    CHECK(toolset_parse(o.tools_json, NULL, &tools, &err) == PARLEY_OK && tools != NULL);
    provider_request r = {.system = o.prompt,
                          .history = json_object_get(conv, "history"),
                          .messages = json_object_get(conv, "messages"),
                          .tools_json = toolset_json(tools)};
    const provider *p = provider_find(name);
    pbuf body = PBUF_INIT;
    CHECK(p && p->encode(&body, &o, &r, &err) == 0);
    json_t *got = json_loads(body.data ? body.data : "", 0, NULL);
    CHECK(got != NULL);

    char path[512];
    snprintf(path, sizeof path, CORPUS "%s/request.json", name);
    if (getenv("PARLEY_UPDATE_GOLDEN"))
        json_dump_file(got, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_t *want = load_json(path);
    CHECK(want && json_equal(got, want));
    if (want && !json_equal(got, want))
        fprintf(stderr, "  %s request differs from %s:\n  %s\n", name, path, body.data);
    if (p && p->reads_history_text) { /* the stored text gives the same body */
        pbuf text = PBUF_INIT, body2 = PBUF_INIT;
        put_stored_text(&text, json_object_get(conv, "history"));
        provider_request rt = r;
        rt.history = NULL;
        rt.history_text = text.data;
        rt.history_text_len = text.len;
        CHECK(p->encode(&body2, &o, &rt, &err) == 0);
        json_t *got2 = json_loads(body2.data ? body2.data : "", 0, NULL);
        CHECK(got2 && want && json_equal(got2, want));
        json_decref(got2);
        /* This turn's messages as stored text too: the very same bytes. */
        pbuf turn_text = PBUF_INIT, body3 = PBUF_INIT;
        put_stored_text(&turn_text, json_object_get(conv, "messages"));
        provider_request rm = rt;
        rm.messages = NULL;
        rm.messages_text = turn_text.data;
        rm.messages_text_len = turn_text.len;
        CHECK(p->encode(&body3, &o, &rm, &err) == 0);
        int same = body3.len == body2.len && memcmp(body3.data, body2.data, body2.len) == 0;
        CHECK(same);
        if (!same)
            fprintf(stderr, "  %s request from messages text differs:\n  %s\n  %s\n", name,
                    body2.data, body3.data);
        pbuf_free(&turn_text);
        pbuf_free(&body3);
        /* Not messages: a clear error, no crash. */
        rt.history_text = "{\"role\":\"user\",\"content\":\"x\"},[1]";
        rt.history_text_len = strlen(rt.history_text);
        CHECK(p->encode(&body2, &o, &rt, &err) != 0 && err && strstr(err, "stored history"));
        free(err);
        err = NULL;
        pbuf_free(&text);
        pbuf_free(&body2);
    }
    json_decref(want);
    json_decref(got);
    pbuf_free(&body);
    toolset_free(tools);
    options_free(&o);
    free(err);
}

/* Stored text whose strings end in backslashes or hold escaped quotes: the
 * scan that copies wire-only messages as they are must find each string's
 * real end, and give the same body as decoding every message with jansson. */
static void check_stored_text_escapes(void)
{
    static const char *const tails[] = {
        "a\\\\", "\\\"", "x\\\\\\\"y", "\\\\\\\\", "}{][,\\\"", "q\\\\\\\\\\\"\\\\", "",
    };
    /* Each tail alone, and after 20 to 40 plain bytes. */
    char contents[7 * 22][64];
    size_t ncontents = 0;
    for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++)
        for (size_t pad = 0; pad <= 40; pad += pad < 20 ? 20 : 1)
            snprintf(contents[ncontents++], sizeof contents[0], "%.*s%s", (int)pad,
                     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", tails[t]);
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"provider\":\"openai\",\"model\":\"m\"}", &o, &err) == PARLEY_OK);
    const provider *p = provider_find("openai");
    for (size_t i = 0; i < ncontents; i++) {
        for (int extra_key = 0; extra_key < 2; extra_key++) {
            /* extra_key: a stored-only key, so the message is re-rendered, not copied */
            char text[256];
            snprintf(text, sizeof text, "{\"role\":\"user\",\"content\":\"%s\"%s},"
                                        "{\"role\":\"assistant\",\"content\":\"ok\"},",
                     contents[i], extra_key ? ",\"message_id\":\"m1\"" : "");
            char list_text[300];
            snprintf(list_text, sizeof list_text, "[%.*s]", (int)strlen(text) - 1, text);
            json_t *list = json_loads(list_text, 0, NULL);
            CHECK(list != NULL);
            json_t *none = json_array();
            provider_request from_json = {.history = list, .messages = none, .tools_json = "[]"};
            provider_request from_text = {.history_text = text, .history_text_len = strlen(text),
                                          .messages = none, .tools_json = "[]"};
            pbuf a = PBUF_INIT, b = PBUF_INIT;
            CHECK(p->encode(&a, &o, &from_json, &err) == 0);
            CHECK(p->encode(&b, &o, &from_text, &err) == 0);
            json_t *ja = json_loads(a.data ? a.data : "", 0, NULL);
            json_t *jb = json_loads(b.data ? b.data : "", 0, NULL);
            int same = ja && jb && json_equal(ja, jb);
            CHECK(same);
            if (!same)
                fprintf(stderr, "  stored text %s gives\n  %s\n  not\n  %s\n", text, b.data, a.data);
            json_decref(ja);
            json_decref(jb);
            json_decref(list);
            json_decref(none);
            pbuf_free(&a);
            pbuf_free(&b);
        }
    }
    /* An unterminated string after an escaped quote is not a message. */
    const char *cut = "{\"role\":\"user\",\"content\":\"a\\\"},";
    provider_request r = {.history_text = cut, .history_text_len = strlen(cut), .tools_json = "[]"};
    pbuf c = PBUF_INIT;
    CHECK(p->encode(&c, &o, &r, &err) != 0 && err && strstr(err, "stored history"));
    free(err);
    pbuf_free(&c);
    options_free(&o);
}

/* A history an older Parley stored with call ids repeated in one message (codec.h,
 * call_renames): the later calls and their results are sent renamed, the same from stored
 * text and from JSON, and the renames end with the block. */
static void check_repeated_call_ids(void)
{
    const char *text =
        "{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"id\\\":\\\"a\\\"}\"}},"
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}},"
        "{\"id\":\"a_2\",\"type\":\"function\",\"function\":{\"name\":\"h\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"1\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"2\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a_2\",\"content\":\"3\"},"
        "{\"role\":\"assistant\",\"content\":\"done\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"4\"},";
    char list_text[2048];
    snprintf(list_text, sizeof list_text, "[%.*s]", (int)strlen(text) - 1, text);
    json_t *list = json_loads(list_text, 0, NULL), *none = json_array();
    CHECK(list != NULL);
    for (size_t k = 0; k < 2; k++) {
        const char *name = k ? "anthropic" : "openai";
        char opts[96];
        snprintf(opts, sizeof opts, "{\"provider\":\"%s\",\"model\":\"m\"}", name);
        parley_options o;
        char *err = NULL;
        CHECK(options_parse(opts, &o, &err) == PARLEY_OK);
        const provider *p = provider_find(name);
        provider_request from_json = {.history = list, .messages = none, .tools_json = "[]"};
        provider_request from_text = {.history_text = text, .history_text_len = strlen(text),
                                      .messages = none, .tools_json = "[]"};
        pbuf a = PBUF_INIT, b = PBUF_INIT;
        CHECK(p->encode(&a, &o, &from_json, &err) == 0);
        CHECK(!p->reads_history_text || p->encode(&b, &o, &from_text, &err) == 0);
        /* calls a, a, a_2 go as a, a_3, a_2; results in order; the later block is its own */
        const char *want = k ? "\"id\":\"a\",\"name\":\"f\"" : "\"id\":\"a\",\"type\":\"function\"";
        CHECK(a.data && strstr(a.data, want));
        CHECK(a.data && strstr(a.data, "a_3"));
        if (k == 0) {
            CHECK(strstr(a.data, "\"tool_call_id\":\"a_3\",\"content\":\"2\""));
            CHECK(strstr(a.data, "\"tool_call_id\":\"a_2\",\"content\":\"3\""));
            CHECK(strstr(a.data, "\"tool_call_id\":\"a\",\"content\":\"4\""));
            json_t *ja = json_loads(a.data, 0, NULL), *jb = json_loads(b.data ? b.data : "", 0, NULL);
            CHECK(ja && jb && json_equal(ja, jb));
            json_decref(ja);
            json_decref(jb);
        } else {
            CHECK(strstr(a.data, "\"tool_use_id\":\"a_3\",\"content\":\"2\""));
            CHECK(strstr(a.data, "\"tool_use_id\":\"a\",\"content\":\"4\""));
        }
        pbuf_free(&a);
        pbuf_free(&b);
        free(err);
        options_free(&o);
    }
    json_decref(list);
    json_decref(none);
}

/* Stored text in every mixture the renderer meets: Parley's plain text
 * messages (copied by the one-memchr fast path, in runs of one append),
 * wire-only messages of other shapes (the general scan), messages with a
 * stored-only key (re-rendered) and separators other than one ','.  Each
 * body must equal the one rendered from the same messages as JSON, and the
 * separators must not change a byte of it. */
static void check_stored_text_runs(void)
{
    static const char *const pool[] = {
        "{\"role\":\"user\",\"content\":\"hello\"}",
        "{\"role\":\"assistant\",\"content\":\"it is \\\"on\\\" \\\\\"}",
        "{\"role\":\"assistant\",\"content\":\"\"}",
        "{\"role\":\"user\",\"content\":\"}{,\\\"role\\\":\"}",
        "{\"role\": \"user\", \"content\": \"spaced\"}",
        "{\"content\":\"key order\",\"role\":\"user\"}",
        ("{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
         "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}"),
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\",\"name\":\"f\"}",
        "{\"role\":\"user\",\"content\":\"x\",\"message_id\":\"m1\"}",
        "{\"role\":\"us\\\"er\",\"content\":\"escaped role\"}",
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"parts\"}]}",
        "{\"role\":\"assistant\",\"content\":\"plain\"} ",
    };
    static const char *const seps[] = {",", ",", ",", ", ", ",\n", ",,", " ,"};
    size_t npool = sizeof pool / sizeof pool[0], nseps = sizeof seps / sizeof seps[0];
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"provider\":\"openai\",\"model\":\"m\"}", &o, &err) == PARLEY_OK);
    const provider *p = provider_find("openai");
    unsigned seed = 17;
    for (int round = 0; round < 3000; round++) {
        size_t n = 1 + (size_t)(round % 9), pick[9];
        pbuf list = PBUF_INIT, plain = PBUF_INIT, mixed = PBUF_INIT;
        pbuf_putc(&list, '[');
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            pick[i] = (seed >> 8) % npool;
            pbuf_puts(&list, i ? "," : "");
            pbuf_puts(&list, pool[pick[i]]);
            pbuf_puts(&plain, pool[pick[i]]);
            pbuf_putc(&plain, ',');
            pbuf_puts(&mixed, pool[pick[i]]);
            pbuf_puts(&mixed, seps[(seed >> 20) % nseps]);
        }
        pbuf_putc(&list, ']');
        json_t *msgs = json_loads(list.data, 0, NULL), *none = json_array();
        CHECK(msgs != NULL);
        provider_request from_json = {.history = msgs, .messages = none, .tools_json = "[]"};
        provider_request from_plain = {.history_text = plain.data, .history_text_len = plain.len,
                                       .messages = none, .tools_json = "[]"};
        provider_request from_mixed = from_plain;
        from_mixed.history_text = mixed.data;
        from_mixed.history_text_len = mixed.len;
        pbuf a = PBUF_INIT, b = PBUF_INIT, c = PBUF_INIT;
        CHECK(p->encode(&a, &o, &from_json, &err) == 0);
        CHECK(p->encode(&b, &o, &from_plain, &err) == 0);
        CHECK(p->encode(&c, &o, &from_mixed, &err) == 0);
        json_t *ja = json_loads(a.data ? a.data : "", 0, NULL);
        json_t *jb = json_loads(b.data ? b.data : "", 0, NULL);
        int same = ja && jb && json_equal(ja, jb) && b.len == c.len &&
                   memcmp(b.data, c.data, b.len) == 0;
        CHECK(same);
        if (!same)
            fprintf(stderr, "  stored text\n  %s\n  %s\n  gives\n  %s\n  %s\n  not\n  %s\n",
                    plain.data, mixed.data, b.data, c.data, a.data);
        json_decref(ja);
        json_decref(jb);
        json_decref(msgs);
        json_decref(none);
        pbuf_free(&a);
        pbuf_free(&b);
        pbuf_free(&c);
        pbuf_free(&list);
        pbuf_free(&plain);
        pbuf_free(&mixed);
        if (!same)
            break;
    }
    options_free(&o);
    free(err);
}

/* The request rules the golden files stand for, asserted directly too. */
static void check_request_rules(void)
{
    char path[512];
    snprintf(path, sizeof path, CORPUS "anthropic/request.json");
    json_t *a = load_json(path);
    json_t *msgs = json_object_get(a, "messages");
    /* Roles alternate; this turn's results share one user message; thinking goes back only
       in this turn; the 0.1-form result (no name) still maps by its id. */
    const char *roles[] = {"user", "assistant", "user", "assistant", "user", "assistant", "user"};
    CHECK(json_array_size(msgs) == 7);
    for (size_t i = 0; i < json_array_size(msgs) && i < 7; i++)
        CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, i), "role")), roles[i]);
    json_t *past = json_array_get(json_object_get(json_array_get(msgs, 1), "content"), 0);
    CHECK_STR(json_string_value(json_object_get(past, "type")), "tool_use");
    json_t *now = json_object_get(json_array_get(msgs, 5), "content");
    CHECK_STR(json_string_value(json_object_get(json_array_get(now, 0), "type")), "thinking");
    CHECK_STR(json_string_value(json_object_get(json_array_get(now, 0), "signature")), "EqQBsig2");
    json_t *results = json_object_get(json_array_get(msgs, 6), "content");
    CHECK(json_array_size(results) == 2);
    CHECK(json_is_true(json_object_get(json_array_get(results, 1), "is_error")));
    json_t *bad = json_object_get(json_array_get(now, 3), "input");
    CHECK_STR(json_string_value(json_object_get(bad, "invalid_json")), "not json");
    json_decref(a);

    snprintf(path, sizeof path, CORPUS "openai/request.json");
    json_t *o = load_json(path);
    msgs = json_object_get(o, "messages");
    CHECK(json_object_get(json_array_get(msgs, 2), "reasoning_content") == NULL); /* past turn */
    CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 6), "reasoning_content")),
              "Now the hall.");
    char *text = json_dumps(o, JSON_COMPACT);
    CHECK(strstr(text, "provider_data") == NULL && strstr(text, "\"is_error\"") == NULL);
    free(text);
    json_decref(o);

    snprintf(path, sizeof path, CORPUS "ollama/request.json");
    json_t *l = load_json(path);
    msgs = json_object_get(l, "messages");
    CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 8), "tool_name")), "get_state");
    CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 6), "thinking")), "Now the hall.");
    CHECK(json_object_get(json_array_get(msgs, 2), "thinking") == NULL);
    json_decref(l);
}

/* ---- replies ---- */

typedef struct deltas {
    pbuf text, reasoning;
} deltas;

static void on_text(void *ud, const char *s, size_t n) { pbuf_append(&((deltas *)ud)->text, s, n); }
static void on_reasoning(void *ud, const char *s, size_t n)
{
    pbuf_append(&((deltas *)ud)->reasoning, s, n);
}

static int str_is(const char *got, const json_t *want)
{
    return json_is_null(want) ? got == NULL : got && strcmp(got, json_string_value(want)) == 0;
}

static void check_reply(const char *name, const char *how, const llm_reply *r, const json_t *want)
{
    int ok = str_is(r->content, json_object_get(want, "content")) &&
             str_is(r->reasoning, json_object_get(want, "reasoning")) &&
             str_is(r->finish_reason, json_object_get(want, "finish_reason"));
    const json_t *calls = json_object_get(want, "calls");
    ok = ok && r->ncalls == json_array_size(calls);
    for (size_t i = 0; ok && i < r->ncalls; i++) {
        const json_t *c = json_array_get(calls, i);
        ok = str_is(r->calls[i].id, json_array_get(c, 0)) &&
             str_is(r->calls[i].name, json_array_get(c, 1)) &&
             str_is(r->calls[i].arguments, json_array_get(c, 2));
    }
    const json_t *u = json_object_get(want, "usage");
    long long got_u[] = {r->usage.prompt, r->usage.completion, r->usage.cache_read,
                         r->usage.cache_creation, r->usage.reasoning};
    for (size_t i = 0; i < 5; i++)
        ok = ok && got_u[i] == json_integer_value(json_array_get(u, i));
    json_t *pd = r->provider_data ? json_loads(r->provider_data, 0, NULL) : json_null();
    ok = ok && json_equal(pd, json_object_get(want, "provider_data"));
    json_decref(pd);
    ok = ok && (r->ids_minted != 0) == json_is_true(json_object_get(want, "ids_minted"));
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s %s: content=%s reasoning=%s finish=%s calls=%zu usage=%lld/%lld/%lld "
                        "provider_data=%s\n", name, how, r->content ? r->content : "(null)",
                r->reasoning ? r->reasoning : "(null)",
                r->finish_reason ? r->finish_reason : "(null)", r->ncalls, r->usage.prompt,
                r->usage.completion, r->usage.cache_read,
                r->provider_data ? r->provider_data : "(null)");
}

/* Feed the stream `step` bytes at a time (0: whole). */
static void check_stream(const provider *p, const char *data, size_t len, size_t step,
                         const json_t *want)
{
    deltas d = {PBUF_INIT, PBUF_INIT};
    llm_sink sink = {on_text, on_reasoning, &d};
    provider_stream *s = provider_stream_new(p, 1, &sink);
    char *err = NULL;
    int rc = 0;
    for (size_t off = 0; rc == 0 && off < len; off += step ? step : len) {
        size_t n = step && len - off > step ? step : len - off;
        rc = provider_stream_feed(s, data + off, n, &err);
    }
    llm_reply r;
    memset(&r, 0, sizeof r);
    if (rc == 0)
        rc = provider_stream_finish(s, &r, &err);
    CHECK(rc == 0);
    if (rc != 0)
        fprintf(stderr, "  %s stream (step %zu): %s\n", p->name, step, err ? err : "?");
    else
        check_reply(p->name, "stream", &r, want);
    /* What the deltas said is the reply: text and reasoning apart. */
    CHECK_STR(d.text.data ? d.text.data : "", r.content ? r.content : "");
    CHECK_STR(d.reasoning.data ? d.reasoning.data : "", r.reasoning ? r.reasoning : "");
    llm_reply_free(&r);
    provider_stream_free(s);
    pbuf_free(&d.text);
    pbuf_free(&d.reasoning);
    free(err);
}

static void check_replies(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, CORPUS "%s/expected.json", name);
    json_t *want = load_json(path);
    const provider *p = provider_find(name);
    size_t len = 0;
    snprintf(path, sizeof path, CORPUS "%s/reply.json", name);
    char *body = read_file(path, &len);
    CHECK(body != NULL);
    llm_reply r;
    char *err = NULL;
    CHECK(provider_decode(p, 1, body ? body : "", len, &r, &err) == 0);
    if (err)
        fprintf(stderr, "  %s reply: %s\n", name, err);
    else
        check_reply(name, "reply", &r, want);
    llm_reply_free(&r);
    free(err);
    free(body);

    snprintf(path, sizeof path, CORPUS "%s/stream.txt", name);
    char *stream = read_file(path, &len);
    CHECK(stream != NULL);
    const size_t steps[] = {0, 1, 7, 64};
    for (size_t i = 0; stream && i < sizeof steps / sizeof steps[0]; i++)
        check_stream(p, stream, len, steps[i], want);
    /* Cut anywhere before the end: an error naming what was missing, never a reply. */
    for (size_t cut = 0; stream && cut + 2 < len; cut += len / 13 + 1) {
        llm_sink sink = {NULL, NULL, NULL};
        provider_stream *s = provider_stream_new(p, 1, &sink);
        llm_reply cr;
        char *cerr = NULL;
        int rc = provider_stream_feed(s, stream, cut, &cerr);
        if (rc == 0)
            rc = provider_stream_finish(s, &cr, &cerr);
        CHECK(rc != 0 && cerr != NULL);
        if (rc == 0)
            llm_reply_free(&cr);
        free(cerr);
        provider_stream_free(s);
    }
    free(stream);
    json_decref(want);
}

/* ---- errors, retries, think tags ---- */

static void check_errors(void)
{
    static const struct { const char *provider, *body, *want; } cases[] = {
        {"openai", "{\"error\":{\"message\":\"bad key\",\"type\":\"invalid_request_error\"}}", "bad key"},
        {"anthropic", "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}",
         "Overloaded"},
        {"ollama", "{\"error\":\"model 'x' not found\"}", "model 'x' not found"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const provider *p = provider_find(cases[i].provider);
        char *t = p->error_text(cases[i].body, strlen(cases[i].body));
        CHECK_STR(t, cases[i].want);
        free(t);
    }
    const provider *p = provider_find("openai");
    const char *quota = "{\"error\":{\"message\":\"You exceeded your current quota\","
                        "\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}";
    CHECK(p->retryable(429, quota, strlen(quota)) == 0);
    CHECK(p->retryable(429, "{}", 2) == 1);
    CHECK(provider_find("anthropic")->retryable(529, "", 0) == 1);
    CHECK(p->retryable(400, "", 0) == 0);

    /* An error event mid-stream is the server's error, with its words. */
    const char *ev = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                     "\"message\":\"Overloaded\"}}\n\n";
    llm_sink sink = {NULL, NULL, NULL};
    provider_stream *s = provider_stream_new(provider_find("anthropic"), 1, &sink);
    char *err = NULL;
    CHECK(provider_stream_feed(s, ev, strlen(ev), &err) != 0);
    CHECK(err && strstr(err, "overloaded_error: Overloaded"));
    free(err);
    provider_stream_free(s);
    /* Anthropic's input_json_delta pieces must make a JSON object at block stop. */
    const char *broken =
        "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n"
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\","
        "\"id\":\"t\",\"name\":\"n\",\"input\":{}}}\n\n"
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\","
        "\"partial_json\":\"{\\\"a\\\":\"}}\n\n"
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
    s = provider_stream_new(provider_find("anthropic"), 1, &sink);
    err = NULL;
    CHECK(provider_stream_feed(s, broken, strlen(broken), &err) != 0);
    CHECK(err && strstr(err, "tool_use block 0 input is not a JSON object"));
    free(err);
    provider_stream_free(s);
    /* A body jansson cannot read: the error quotes jansson's text, which ends inside the
       character after the bad escape; the message stays UTF-8 (utf8_mend). */
    const char *bad = "{\"a\":\"\\\xc3\xa9\"}";
    const char *names[] = {"openai", "anthropic", "ollama"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const provider *pv = provider_find(names[i]);
        llm_reply r;
        err = NULL;
        CHECK(provider_decode(pv, 1, bad, strlen(bad), &r, &err) != 0);
        CHECK(err && utf8_valid(err, strlen(err)));
        free(err);
        pbuf event = PBUF_INIT;
        pbuf_printf(&event, "%s%s\n\n", strcmp(names[i], "ollama") ? "data: " : "", bad);
        s = provider_stream_new(pv, 1, &sink);
        err = NULL;
        int rc = provider_stream_feed(s, event.data, event.len, &err);
        if (rc == 0)
            rc = provider_stream_finish(s, &r, &err);
        CHECK(rc != 0 && err && utf8_valid(err, strlen(err)));
        if (err && !utf8_valid(err, strlen(err)))
            fprintf(stderr, "  %s: not UTF-8: %s\n", names[i], err);
        free(err);
        provider_stream_free(s);
        pbuf_free(&event);
    }
}

typedef struct split { pbuf text, reasoning; } split;

static void on_split(void *ud, int is_reasoning, const char *s, size_t n)
{
    split *o = ud;
    pbuf_append(is_reasoning ? &o->reasoning : &o->text, s, n);
}

static void check_think(const char *in, const char *text, const char *reasoning)
{
    size_t len = strlen(in);
    for (size_t step = 1; step <= len + 1; step++) { /* every split of the input */
        split o = {PBUF_INIT, PBUF_INIT};
        think_filter f;
        think_init(&f, on_split, &o);
        for (size_t off = 0; off < len; off += step)
            think_feed(&f, in + off, len - off < step ? len - off : step);
        think_finish(&f);
        int ok = strcmp(o.text.data ? o.text.data : "", text) == 0 &&
                 strcmp(o.reasoning.data ? o.reasoning.data : "", reasoning) == 0;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  think(%s) step %zu: text=[%s] reasoning=[%s]\n", in, step,
                    o.text.data ? o.text.data : "", o.reasoning.data ? o.reasoning.data : "");
        think_free(&f);
        pbuf_free(&o.text);
        pbuf_free(&o.reasoning);
    }
}

static void check_think_tags(void)
{
    /* Whole replies go through the same rules: an empty block still goes. */
    const char *body = "{\"model\":\"m\",\"message\":{\"role\":\"assistant\","
                       "\"content\":\"<think></think>Hi\"},\"done\":true}";
    llm_reply r;
    char *err = NULL;
    CHECK(provider_decode(provider_find("ollama"), 1, body, strlen(body), &r, &err) == 0);
    CHECK_STR(r.content, "Hi");
    CHECK(r.reasoning == NULL);
    llm_reply_free(&r);
    free(err);
    check_think("<think>plan</think>\n\nHi", "Hi", "plan");
    check_think("\n <think>a</thin</think>Hi </think>", "Hi </think>", "a</thin");
    check_think("Hi <think>x</think>", "Hi <think>x</think>", "");
    check_think("<thinking>no</thinking>", "<thinking>no</thinking>", "");
    check_think("<thi", "<thi", "");
    check_think("<think>never closed", "", "never closed");
    check_think("  ", "  ", "");
    check_think("<think></think>", "", "");
}

/* The turn note (provider.h): after the stable prefix, in the turn's user message after its
 * text, in each provider's form; the history and the rest of the turn untouched. */
static json_t *encode_noted(const char *name, const char *content_json, int as_text)
{
    char opts[128], *err = NULL;
    snprintf(opts, sizeof opts, "{\"provider\":\"%s\",\"model\":\"m\"}", name);
    parley_options o;
    CHECK(options_parse(opts, &o, &err) == 0);
    char *turn = pstr_printf("[{\"role\":\"user\",\"content\":%s},"
                             "{\"role\":\"assistant\",\"content\":\"ok\"}]", content_json);
    json_t *history = json_loads("[{\"role\":\"user\",\"content\":\"old\"},"
                                 "{\"role\":\"assistant\",\"content\":\"hi\"}]", 0, NULL);
    json_t *messages = json_loads(turn, 0, NULL);
    pbuf text = PBUF_INIT, body = PBUF_INIT;
    put_stored_text(&text, messages);
    const provider *p = provider_find(name);
    provider_request r = {.system = "sys", .history = history, .messages = messages,
                          .tools_json = "[]", .turn_note = "[Note]\nIt is noon."};
    if (as_text && p->reads_history_text) {
        r.messages = NULL;
        r.messages_text = text.data;
        r.messages_text_len = text.len;
    }
    CHECK(p->encode(&body, &o, &r, &err) == 0);
    json_t *got = json_loads(body.data ? body.data : "", 0, NULL);
    CHECK(got != NULL);
    json_decref(history);
    json_decref(messages);
    free(turn);
    pbuf_free(&text);
    pbuf_free(&body);
    options_free(&o);
    free(err);
    return got;
}

static void check_turn_note(void)
{
    static const char image[] = "data:image/png;base64,iVBORw0KGgo=";
    char *parts = pstr_printf("[{\"type\":\"text\",\"text\":\"look\"},{\"type\":\"image_url\","
                              "\"image_url\":{\"url\":\"%s\"}}]", image);
    for (int as_text = 0; as_text < 2; as_text++) {
        json_t *b = encode_noted("openai", "\"turn\"", as_text);
        json_t *msgs = json_object_get(b, "messages");
        CHECK(json_array_size(msgs) == 5); /* system, old, hi, the turn's user, ok */
        CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), "sys");
        CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "old");
        CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 3), "content")),
                  "turn\n\n[Note]\nIt is noon.");
        CHECK_STR(json_string_value(json_object_get(json_array_get(msgs, 4), "content")), "ok");
        json_decref(b);
        b = encode_noted("openai", parts, as_text); /* images: a text part after them */
        json_t *c = json_object_get(json_array_get(json_object_get(b, "messages"), 3), "content");
        CHECK(json_array_size(c) == 3);
        CHECK_STR(json_string_value(json_object_get(json_array_get(c, 2), "text")),
                  "\n\n[Note]\nIt is noon.");
        json_decref(b);
    }
    json_t *b = encode_noted("ollama", parts, 0);
    json_t *u = json_array_get(json_object_get(b, "messages"), 3);
    CHECK_STR(json_string_value(json_object_get(u, "content")), "look\n\n[Note]\nIt is noon.");
    CHECK(json_array_size(json_object_get(u, "images")) == 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(b, "messages"), 1),
                                                "content")), "old");
    json_decref(b);
    b = encode_noted("anthropic", parts, 0); /* a block of its own after the user's */
    json_t *blocks = json_object_get(json_array_get(json_object_get(b, "messages"), 2), "content");
    CHECK(json_array_size(blocks) == 3);
    CHECK_STR(json_string_value(json_object_get(json_array_get(blocks, 0), "text")), "look");
    CHECK_STR(json_string_value(json_object_get(json_array_get(blocks, 1), "type")), "image");
    CHECK_STR(json_string_value(json_object_get(json_array_get(blocks, 2), "text")),
              "[Note]\nIt is noon.");
    CHECK(json_is_string(json_object_get(b, "system")) ||
          json_array_size(json_object_get(b, "system")) == 1); /* not in the system prompt */
    json_decref(b);
    free(parts);
}

/* System notes (codec.h): a stored system message goes as user text where it happened, so
 * no system message follows the first and user and assistant alternate (strict chat
 * templates refuse anything else); from stored text the same bytes; and a note renders the
 * same on every later request. */
static char *encode_history(const char *name, const char *history_json, const char *turn_json,
                            int as_text)
{
    char opts[128], *err = NULL;
    snprintf(opts, sizeof opts, "{\"provider\":\"%s\",\"model\":\"m\"}", name);
    parley_options o;
    CHECK(options_parse(opts, &o, &err) == 0);
    json_t *history = json_loads(history_json, 0, NULL), *messages = json_loads(turn_json, 0, NULL);
    CHECK(history && messages);
    pbuf htext = PBUF_INIT, mtext = PBUF_INIT, body = PBUF_INIT;
    put_stored_text(&htext, history);
    put_stored_text(&mtext, messages);
    const provider *p = provider_find(name);
    provider_request r = {.system = "sys", .history = history, .messages = messages,
                          .tools_json = "[]"};
    if (as_text) {
        r.history = r.messages = NULL;
        r.history_text = htext.data ? htext.data : "";
        r.history_text_len = htext.len;
        r.messages_text = mtext.data ? mtext.data : "";
        r.messages_text_len = mtext.len;
    }
    CHECK(p->encode(&body, &o, &r, &err) == 0);
    json_decref(history);
    json_decref(messages);
    pbuf_free(&htext);
    pbuf_free(&mtext);
    options_free(&o);
    free(err);
    return pbuf_take(&body);
}

/* messages[] of a body: no system message but the first, then user and assistant in turn. */
static void check_alternates(const char *name, const json_t *msgs)
{
    size_t i;
    const json_t *m;
    int before = check_failed;
    const char *want = "user";
    json_array_foreach(msgs, i, m) {
        const char *role = msg_role(m);
        if (i == 0 && strcmp(role, "system") == 0 && strcmp(name, "anthropic") != 0)
            continue;
        CHECK_STR(role, want);
        want = strcmp(role, "user") == 0 ? "assistant" : "user";
    }
    if (check_failed != before)
        fprintf(stderr, "  %s: roles do not alternate\n", name);
}

#define OLD_TURN "{\"role\":\"user\",\"content\":\"old\"},{\"role\":\"assistant\",\"content\":\"hi\"}"
#define NOTE(t) "{\"role\":\"system\",\"content\":\"" t "\"}"

static void check_system_notes(void)
{
    static const char *const names[] = {"openai", "ollama", "anthropic"};
    /* two notes before the turn's user message; one before an appended assistant message */
    static const char h1[] = "[" OLD_TURN "," NOTE("A") "," NOTE("B") "]";
    static const char h2[] = "[" OLD_TURN "," NOTE("A") ",{\"role\":\"assistant\",\"content\":"
                             "\"announce\"}]";
    static const char turn[] = "[{\"role\":\"user\",\"content\":\"turn\"},"
                               "{\"role\":\"assistant\",\"content\":\"ok\"}]";
    const char *const hs[] = {h1, h2};
    for (size_t h = 0; h < 2; h++) { /* stored text and JSON: the very same bytes */
        char *json = encode_history("openai", hs[h], turn, 0);
        char *text = encode_history("openai", hs[h], turn, 1);
        CHECK(json && text && strcmp(json, text) == 0);
        free(json);
        free(text);
    }
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        for (int as_text = 0; as_text < 1 + !!provider_find(names[k])->reads_history_text;
             as_text++) {
            char *b1 = encode_history(names[k], h1, turn, as_text);
            json_t *j = json_loads(b1 ? b1 : "", 0, NULL);
            json_t *msgs = json_object_get(j, "messages");
            check_alternates(names[k], msgs);
            int anth = strcmp(names[k], "anthropic") == 0;
            const json_t *u = json_array_get(msgs, anth ? 2 : 3);
            CHECK(json_array_size(msgs) == (anth ? 4u : 5u));
            if (anth) { /* blocks of one user message */
                const json_t *c = json_object_get(u, "content");
                CHECK_STR(json_string_value(json_object_get(json_array_get(c, 0), "text")),
                          "[system note] A");
                CHECK_STR(json_string_value(json_object_get(json_array_get(c, 2), "text")),
                          "turn");
            } else {
                CHECK_STR(json_string_value(json_object_get(u, "content")),
                          "[system note] A\n\n[system note] B\n\nturn");
            }
            /* The next request: the note, stored, renders the same bytes (openai) or JSON. */
            char *h3 = pstr_printf("[" OLD_TURN "," NOTE("A") "," NOTE("B") ",%s]", turn + 1);
            h3[strlen(h3) - 1] = '\0'; /* turn's own ']' closes the list */
            char *b3 = encode_history(names[k], h3, "[{\"role\":\"user\",\"content\":\"next\"}]",
                                      as_text);
            json_t *j3 = json_loads(b3 ? b3 : "", 0, NULL);
            check_alternates(names[k], json_object_get(j3, "messages"));
            /* (Anthropic's cache mark moves on from the last message) */
            for (size_t i = 0; i + anth < json_array_size(msgs); i++) {
                int same = json_equal(json_array_get(msgs, i),
                                      json_array_get(json_object_get(j3, "messages"), i));
                CHECK(same);
                if (!same)
                    fprintf(stderr, "  %s: message %zu differs:\n  %s\n  %s\n", names[k], i, b1, b3);
            }
            if (!anth && b1 && b3 && strcmp(names[k], "openai") == 0)
                CHECK(strncmp(b1, b3, strlen(b1) - 2) == 0); /* all but "]}" */
            free(b1);
            free(b3);
            free(h3);
            json_decref(j);
            json_decref(j3);
            b1 = encode_history(names[k], h2, "[{\"role\":\"user\",\"content\":\"turn\"}]",
                                as_text);
            j = json_loads(b1 ? b1 : "", 0, NULL);
            msgs = json_object_get(j, "messages");
            check_alternates(names[k], msgs);
            u = json_array_get(msgs, anth ? 2 : 3); /* a user message of its own */
            const json_t *c = json_object_get(u, "content");
            CHECK_STR(json_is_string(c) ? json_string_value(c)
                                        : json_string_value(json_object_get(json_array_get(c, 0),
                                                                            "text")),
                      "[system note] A");
            free(b1);
            json_decref(j);
        }
    }
}

/* messages[] of a Chat Completions or Ollama body: the system message first only, then user
 * and assistant in turn, the user first, where an assistant message with tool calls is
 * followed by their results and then the assistant (the shape Gemma-like templates take). */
static void check_alternates_rounds(const char *name, const json_t *msgs, const char *history)
{
    enum { USER, ASSISTANT, TOOL, TOOL_OR_ASSISTANT } want = USER;
    size_t i;
    const json_t *m;
    int before = check_failed;
    json_array_foreach(msgs, i, m) {
        const char *role = msg_role(m);
        if (i == 0 && strcmp(role, "system") == 0)
            continue;
        if (strcmp(role, "user") == 0) {
            CHECK(want == USER);
            want = ASSISTANT;
        } else if (strcmp(role, "assistant") == 0) {
            CHECK(want == ASSISTANT || want == TOOL_OR_ASSISTANT);
            want = json_array_size(json_object_get(m, "tool_calls")) ? TOOL : USER;
        } else {
            CHECK_STR(role, "tool");
            CHECK(want == TOOL || want == TOOL_OR_ASSISTANT);
            want = TOOL_OR_ASSISTANT;
        }
    }
    if (check_failed != before)
        fprintf(stderr, "  %s: roles do not alternate for history %s\n", name, history);
}

/* One stored element of a random history: an appended user message (text or parts), an
 * appended assistant message, a system note, or a turn (its user message, 0-2 tool rounds
 * and the reply).  Call ids unique by n. */
static void put_random_element(pbuf *b, unsigned pick, unsigned n)
{
    if (b->len > 1)
        pbuf_putc(b, ',');
    switch (pick % 5) {
    case 0: pbuf_printf(b, "{\"role\":\"user\",\"content\":\"u%u\"}", n); break;
    case 1:
        pbuf_printf(b, "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"p%u\"}]}", n);
        break;
    case 2: pbuf_printf(b, "{\"role\":\"assistant\",\"content\":\"a%u\"}", n); break;
    case 3: pbuf_printf(b, "{\"role\":\"system\",\"content\":\"n%u\"}", n); break;
    default:
        pbuf_printf(b, "{\"role\":\"user\",\"content\":\"t%u\"}", n);
        for (unsigned r = 0; r < (pick / 5) % 3; r++)
            pbuf_printf(b,
                        ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
                        "\"c%u_%u\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c%u_%u\","
                        "\"content\":\"r\"}",
                        n, r, n, r);
        pbuf_printf(b, ",{\"role\":\"assistant\",\"content\":\"ok%u\"}", n);
    }
}

/* Random stored histories (every order of appended user and assistant messages, notes and
 * turns with tool rounds), then a turn's user message, or that and a tool round (a request
 * within the turn): every provider's body alternates (check_alternates_rounds; Anthropic's
 * plain alternation, tool results being user blocks), and Chat Completions renders the same
 * bytes from stored text as from JSON. */
static void check_alternation_random(void)
{
    static const char *const names[] = {"openai", "ollama", "anthropic"};
    static const char *const turns[] = {
        "[{\"role\":\"user\",\"content\":\"now\"}]",
        "[{\"role\":\"user\",\"content\":\"now\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"cur\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"cur\",\"content\":\"r\"}]"};
    unsigned seed = 12345;
    for (unsigned h = 0; h < 400; h++) {
        pbuf b = PBUF_INIT;
        pbuf_putc(&b, '[');
        seed = seed * 1103515245u + 12345u;
        unsigned len = (seed >> 16) % 7;
        for (unsigned e = 0; e < len; e++) {
            seed = seed * 1103515245u + 12345u;
            put_random_element(&b, seed >> 16, e);
        }
        pbuf_putc(&b, ']');
        const char *turn = turns[h % 2];
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            int anth = strcmp(names[k], "anthropic") == 0;
            for (int as_text = 0; as_text < 1 + !!provider_find(names[k])->reads_history_text;
                 as_text++) {
                char *body = encode_history(names[k], b.data, turn, as_text);
                json_t *j = json_loads(body ? body : "", 0, NULL);
                if (anth)
                    check_alternates(names[k], json_object_get(j, "messages"));
                else
                    check_alternates_rounds(names[k], json_object_get(j, "messages"), b.data);
                if (!anth) { /* the turn stored, the next request repeats every message */
                    pbuf h2 = PBUF_INIT;
                    pbuf_printf(&h2, "%.*s%s%s,{\"role\":\"assistant\",\"content\":\"done\"}]",
                                (int)b.len - 1, b.data, b.len > 2 ? "," : "", turn + 1);
                    h2.data[b.len - 1 + (b.len > 2) + strlen(turn) - 2] = ' '; /* turn's ']' */
                    char *next = encode_history(names[k], h2.data,
                                                "[{\"role\":\"user\",\"content\":\"next\"}]",
                                                as_text);
                    json_t *j2 = json_loads(next ? next : "", 0, NULL);
                    const json_t *m1 = json_object_get(j, "messages"),
                                 *m2 = json_object_get(j2, "messages");
                    CHECK(json_array_size(m2) > json_array_size(m1));
                    for (size_t i = 0; i < json_array_size(m1); i++)
                        CHECK(json_equal(json_array_get(m1, i), json_array_get(m2, i)));
                    json_decref(j2);
                    free(next);
                    pbuf_free(&h2);
                }
                json_decref(j);
                if (as_text) {
                    char *json = encode_history(names[k], b.data, turn, 0);
                    CHECK(body && json && strcmp(body, json) == 0);
                    free(json);
                }
                free(body);
            }
        }
        pbuf_free(&b);
    }
}

/* One element of a long run: text, empty, null, no content, parts, empty parts. */
static json_t *run_message(const char *role, unsigned pick, unsigned n)
{
    char text[32];
    snprintf(text, sizeof text, "%c%u \"q\"", role[0], n);
    switch (pick % 8) {
    case 0:
        return json_pack("{s:s,s:s}", "role", role, "content", "");
    case 1:
        return json_pack("{s:s,s:n}", "role", role, "content");
    case 2:
        return json_pack("{s:s}", "role", role);
    case 3:
        return json_pack("{s:s,s:[{s:s,s:s}]}", "role", role, "content", "type", "text", "text",
                         text);
    case 4:
        return json_pack("{s:s,s:[]}", "role", role, "content");
    default:
        return json_pack("{s:s,s:s}", "role", role, "content", text);
    }
}

/* msgs_join of a long run (thousands of appended user or assistant messages), and the body
 * such a stored run renders to, are what msg_join one message after another gives (the
 * definition; the codecs join a run at once, linear in its size): the same content, and for
 * Chat Completions and Ollama the same message in the body. */
static void check_long_runs(void)
{
    static const char *const roles[] = {"user", "assistant"};
    unsigned seed = 99;
    for (unsigned round = 0; round < 40; round++) {
        const char *role = roles[round % 2];
        unsigned len = round < 38 ? 2 + round % 13 : 3000, text_only = round % 3 == 0;
        json_t *run = json_array(), *folded = NULL;
        /* a text message first and last: no message of its own at either end of the body */
        for (unsigned i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned pick = i == 0 || i + 1 == len || text_only ? 7 : seed >> 16;
            json_t *m = run_message(role, pick, i);
            json_array_append_new(run, m);
            json_t *next = folded ? msg_join(folded, m) : json_incref(m);
            json_decref(folded);
            folded = next;
        }
        json_t *joined = msgs_join(run);
        CHECK(joined && json_equal(joined, folded));
        pbuf stored = PBUF_INIT, one = PBUF_INIT;
        const char *opening = round % 2 ? "{\"role\":\"user\",\"content\":\"hi\"}," : "";
        char *items = json_dumps(run, JSON_COMPACT | JSON_PRESERVE_ORDER);
        char *alone = json_dumps(folded, JSON_COMPACT | JSON_PRESERVE_ORDER);
        pbuf_printf(&stored, "[%s%s", opening, items + 1); /* past its '[' */
        pbuf_printf(&one, "[%s%s]", opening, alone);
        for (size_t k = 0; k < 2; k++) {
            const char *name = k ? "ollama" : "openai",
                       *turn = "[{\"role\":\"user\",\"content\":\"now\"}]";
            char *want = encode_history(name, one.data, turn, 0);
            for (int as_text = 0; as_text < 1 + !!provider_find(name)->reads_history_text;
                 as_text++) {
                char *body = encode_history(name, stored.data, turn, as_text);
                int same = body && want && strcmp(body, want) == 0;
                CHECK(same);
                if (!same)
                    fprintf(stderr,
                            "  %s (text %d): run of %u %s messages\n  %.300s\n  not\n  %.300s\n",
                            name, as_text, len, role, body, want);
                free(body);
            }
            free(want);
        }
        free(items);
        free(alone);
        pbuf_free(&one);
        pbuf_free(&stored);
        json_decref(joined);
        json_decref(folded);
        json_decref(run);
    }
}

/* Every registered codec sets every member provider.h does not allow to be NULL (all but
 * check_options and ask_window), so a provider added to the registry without one fails
 * here rather than at its first request; and each is one of NAMES, whose corpus the checks
 * above run (tests/corpus/<name>/). */
static void check_codec_tables(void)
{
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\"}", &o, &err) == 0);
    size_t n = 0;
    for (; provider_registry[n]; n++) {
        const provider *p = provider_registry[n];
        int before = check_failed;
#define REQUIRED(m) CHECK(p->m != NULL)
        REQUIRED(name);
        REQUIRED(default_base_url);
        REQUIRED(path);
        REQUIRED(models_path);
        REQUIRED(not_found_hint);
        REQUIRED(stream_accept);
        REQUIRED(summary);
        REQUIRED(headers);
        REQUIRED(encode);
        REQUIRED(decode);
        REQUIRED(stream_new);
        REQUIRED(stream_feed);
        REQUIRED(stream_finish);
        REQUIRED(stream_free);
        REQUIRED(stream_done);
        REQUIRED(error_text);
        REQUIRED(retryable);
        REQUIRED(default_window);
#undef REQUIRED
        if (p->name) {
            CHECK(provider_find(p->name) == p); /* its name is its own */
            size_t k = 0;
            while (k < sizeof NAMES / sizeof NAMES[0] && strcmp(NAMES[k], p->name) != 0)
                k++;
            CHECK(k < sizeof NAMES / sizeof NAMES[0]);
        }
        if (p->default_base_url)
            CHECK(strncmp(p->default_base_url, "http://", 7) == 0 ||
                  strncmp(p->default_base_url, "https://", 8) == 0);
        if (p->default_window)
            CHECK(p->default_window(&o) > 0);
        if (check_failed != before)
            fprintf(stderr, "  provider #%zu (%s) of provider_registry[]\n", n,
                    p->name ? p->name : "unnamed");
    }
    CHECK(n == sizeof NAMES / sizeof NAMES[0]);
    options_free(&o);
}

/* jansson's allocations fail from the nth on (json_set_alloc_funcs). */
static long jansson_left;
static void *jansson_malloc(size_t n) { return jansson_left-- > 0 ? malloc(n) : NULL; }

/* A stored message that is rendered from its parse (a system note) and could not be parsed for
 * want of memory is out of memory -- even where jansson words it a syntax error -- never
 * "stored history holds a message that is not JSON", which ended the turn `internal`. */
static void test_stored_history_out_of_memory(void)
{
    parley_options o;
    char *err = NULL;
    CHECK(options_parse("{\"model\":\"m\"}", &o, &err) == PARLEY_OK);
    const char *text = "{\"role\":\"user\",\"content\":\"is the washer done?\"},"
                       "{\"role\":\"system\",\"content\":\"the user is away until 18:00\"},"
                       "{\"role\":\"assistant\",\"content\":\"not yet\"}";
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"and now?\"}]", 0, NULL);
    provider_request r = {.system = "s", .history_text = text, .history_text_len = strlen(text),
                          .messages = msgs, .tools_json = "[]"};
    const provider *p = provider_find("openai");
    long n;
    for (n = 0; p && n < 10000; n++) {
        pbuf body = PBUF_INIT;
        jansson_left = n;
        json_set_alloc_funcs(jansson_malloc, free);
        int rc = p->encode(&body, &o, &r, &err);
        json_set_alloc_funcs(malloc, free);
        pbuf_free(&body);
        if (rc == 0)
            break;
        CHECK(llm_error_is_oom(err));
        if (!llm_error_is_oom(err))
            fprintf(stderr, "  jansson failing from allocation %ld: %s\n", n, err);
        free(err);
        err = NULL;
    }
    CHECK(n > 0);
    json_decref(msgs);
    options_free(&o);
}

int main(void)
{
    test_stored_history_out_of_memory();
    json_t *conv = load_json(CORPUS "conversation.json");
    CHECK(conv != NULL);
    for (size_t i = 0; conv && i < sizeof NAMES / sizeof NAMES[0]; i++) {
        check_request(NAMES[i], conv);
        check_replies(NAMES[i]);
    }
    json_decref(conv);
    check_request_rules();
    check_stored_text_escapes();
    check_stored_text_runs();
    check_repeated_call_ids();
    check_errors();
    check_think_tags();
    check_turn_note();
    check_system_notes();
    check_alternation_random();
    check_long_runs();
    check_codec_tables();
    return check_report();
}
