/*
 * test_alloc_failures.c -- out of memory in Parley's pure code paths, tested
 * the way SQLite tests its own (alloc_fail.h): each scenario is run once to
 * count the allocations it makes (N, printed), then once for each k = 1..N
 * with the k-th allocation failing, and once more with the k-th and every
 * later one failing.  Each run must end without a crash, with the status the
 * scenario gives without failures and the same result (the failure was
 * absorbed) or with PARLEY_ERR_NO_MEMORY (its message NULL or sane), never
 * another error and never a success missing data; and with as many blocks
 * alive after its cleanup as before (no leak).
 *
 * Each failing run is a child process (a crash is a finding, not the end of the
 * test).  jansson's own failures are told apart (see "jansson's parser" below).
 * Built only without sanitizers (tests/CMakeLists.txt): it replaces malloc.
 *
 * To look into a finding: PARLEY_ALLOC_ONLY=<part of a scenario's name>,
 * PARLEY_ALLOC_K=<k> (that run only, in this process: gdb -ex 'break af_failing'),
 * PARLEY_ALLOC_ALL=1 (every failing run, not the first three), PARLEY_ALLOC_TRACE=1
 * (where a leak's blocks were allocated), PARLEY_ALLOC_SEED=<n> (jansson's hash seed).
 */
#include <dlfcn.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc_fail.h"
#include "api/query.h"
#include "check.h"
#include "config/options.h"
#include "config/persona.h"
#include "config/response_format.h"
#include "config/selector.h"
#include "config/toolset.h"
#include "context/window.h"
#include "engine/config.h"
#include "lib/buf.h"
#include "lib/json_keys.h"
#include "lib/utf8.h"
#include "provider/provider.h"
#include "store/message_text.h"
#include "turn/turn_append.h"
#include "turn/turn_input.h"

/* What one run of a scenario gave. */
typedef struct outcome {
    parley_status st;
    char *err;   /* its message (malloc'd) or NULL */
    pbuf digest; /* what it produced, written with allocations paused */
} outcome;

typedef struct scenario {
    const char *name;
    void (*run)(outcome *o);
} scenario;

/* Append to the digest without counting or failing the allocations it makes. */
static void note(outcome *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(outcome *o, const char *fmt, ...)
{
    af_pause();
    va_list ap;
    va_start(ap, fmt);
    char *s = pstr_vprintf(fmt, ap);
    va_end(ap);
    pbuf_puts(&o->digest, s ? s : "(digest out of memory)");
    free(s);
    af_resume();
}

static void note_json(outcome *o, const char *what, const json_t *v)
{
    af_pause();
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    af_resume();
    note(o, "%s=%s;", what, s ? s : "(null)");
    free(s);
}

/* A function that answers 0, or -1 with *err and no status: -1 with no message or
 * one saying so is out of memory, -1 with another message is `refusal`. */
static parley_status rc_status(int rc, const char *err, parley_status refusal)
{
    if (rc == 0)
        return PARLEY_OK;
    return !err || strstr(err, "out of memory") ? PARLEY_ERR_NO_MEMORY : refusal;
}

/* ---- jansson's parser ----
 *
 * jansson's parser (2.14) does not always tell an allocation failure apart:
 * its lexer drops a byte it could not add to a token and goes on (a string
 * comes back one character short, "conversation_i", with no error), and some
 * failures come back as syntax errors ("':' expected near ...").  Its callers
 * cannot tell either from what the host sent.  The parser's two entry points
 * are wrapped here (the test program's definitions take the place of the
 * library's for parley_core; the real ones are behind them): a run in which a
 * parse after an allocation failure gave other JSON than the text holds, or
 * failed with another error than json_error_out_of_memory, may end in any
 * refusal, or in a result built from that other JSON.  A parse that said out
 * of memory is not excused: Parley must report that as out of memory. */
static volatile sig_atomic_t jansson_misreported, in_jansson_parser;
/* Blocks a failed parse kept (load.c's error paths can leak an array they had built after
 * a failed allocation): not Parley's leak. */
static long jansson_leaked;

/* The parse freed a block twice (seen in load.c's error paths): the heap is no longer to
 * be trusted, nor anything the run does after (glibc may hand one block out twice). */
static int jansson_double_freed;

static void parse_leak_check(const json_t *v, long kept, long double_frees)
{
    if (!v)
        jansson_leaked += kept;
    if (af_double_frees() > double_frees)
        jansson_double_freed = 1;
}

static json_t *parse_checked(json_t *v, json_error_t *mine, json_error_t *theirs, long failed,
                             json_t *(*again)(const void *, size_t, size_t), const void *in,
                             size_t len, size_t flags)
{
    if (af_failures() > failed) {
        if (!v && json_error_code(mine) != json_error_out_of_memory)
            jansson_misreported = 1;
        if (v) { /* absorbed: with the text's JSON, or with bytes dropped? */
            af_pause();
            json_t *whole = again(in, len, flags);
            if (!json_equal(whole, v))
                jansson_misreported = 1;
            json_decref(whole);
            af_resume();
        }
    }
    if (theirs)
        *theirs = *mine;
    return v;
}

static json_t *(*real_loads)(const char *, size_t, json_error_t *);
static json_t *(*real_loadb)(const char *, size_t, size_t, json_error_t *);

static json_t *loads_again(const void *in, size_t len, size_t flags)
{
    (void)len;
    return real_loads(in, flags, NULL);
}

static json_t *loadb_again(const void *in, size_t len, size_t flags)
{
    return real_loadb(in, len, flags, NULL);
}

json_t *json_loads(const char *input, size_t flags, json_error_t *error)
{
    if (!real_loads)
        *(void **)&real_loads = dlsym(RTLD_NEXT, "json_loads");
    json_error_t mine;
    long failed = af_failures(), double_frees = af_double_frees();
    in_jansson_parser++;
    af_scope_begin();
    json_t *v = real_loads(input, flags, &mine);
    long kept = af_scope_end();
    in_jansson_parser--;
    parse_leak_check(v, kept, double_frees);
    return parse_checked(v, &mine, error, failed, loads_again, input, 0, flags);
}

json_t *json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    if (!real_loadb)
        *(void **)&real_loadb = dlsym(RTLD_NEXT, "json_loadb");
    json_error_t mine;
    long failed = af_failures(), double_frees = af_double_frees();
    in_jansson_parser++;
    af_scope_begin();
    json_t *v = real_loadb(buffer, buflen, flags, &mine);
    long kept = af_scope_end();
    in_jansson_parser--;
    parse_leak_check(v, kept, double_frees);
    return parse_checked(v, &mine, error, failed, loadb_again, buffer, buflen, flags);
}

/* Its writer the same way: json_dumps leaves out an object's key it could not
 * write (dump.c ignores that append's failure) and returns the rest. */
char *json_dumps(const json_t *json, size_t flags)
{
    static char *(*real)(const json_t *, size_t);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "json_dumps");
    long failed = af_failures();
    char *s = real(json, flags);
    if (s && af_failures() > failed) {
        af_pause();
        char *whole = real(json, flags);
        if (!whole || strcmp(whole, s) != 0)
            jansson_misreported = 1;
        free(whole);
        af_resume();
    }
    return s;
}

/* And json_copy: an object's shallow copy leaves out a member it could not set
 * (value.c's json_object_copy ignores json_object_set_nocheck's failure). */
json_t *json_copy(json_t *json)
{
    static json_t *(*real)(json_t *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "json_copy");
    long failed = af_failures();
    json_t *v = real(json);
    if (v && af_failures() > failed && !json_equal(v, json))
        jansson_misreported = 1;
    return v;
}

json_t *json_deep_copy(const json_t *json)
{
    static json_t *(*real)(const json_t *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "json_deep_copy");
    long failed = af_failures();
    json_t *v = real(json);
    if (v && af_failures() > failed && !json_equal(v, json))
        jansson_misreported = 1;
    return v;
}

/* ---- fixtures (made before any failure is armed) ---- */

static const char *const OPTIONS_JSON =
    "{\"base_url\":\"http://127.0.0.1:1/v1\",\"model\":\"m\",\"prompt\":\"You are terse.\","
    "\"temperature\":0.5,\"max_tokens\":100,\"history_store\":\"memory\","
    "\"tools\":[{\"name\":\"turn_on\",\"description\":\"Switch a device on\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
    "\"required\":[\"name\"]}},{\"type\":\"function\",\"function\":{\"name\":\"turn_off\"}}],"
    "\"personas\":{\"chef\":{\"prompt\":\"You cook.\",\"model\":\"m2\",\"tools\":[\"turn_on\"]},"
    "\"butler\":{\"prompt\":\"You serve.\",\"max_history_turns\":3}},"
    "\"extra_body\":{\"seed\":1}}";

static const char *const FORMAT_JSON =
    "{\"name\":\"weather\",\"description\":\"the forecast\",\"strict\":true,\"schema\":"
    "{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"number\"},\"tags\":{\"type\":"
    "\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"t\"],"
    "\"additionalProperties\":false}}";

static const char *const HISTORY_TEXT =
    "{\"role\":\"user\",\"content\":\"hello\"},{\"role\":\"assistant\",\"content\":\"hi there\"},"
    "{\"role\":\"user\",\"content\":\"switch on the lamp\"},{\"role\":\"assistant\",\"content\":"
    "null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
    "\"turn_on\",\"arguments\":\"{\\\"name\\\":\\\"lamp\\\"}\"}}]},{\"role\":\"tool\","
    "\"tool_call_id\":\"call_1\",\"content\":\"done\"},{\"role\":\"assistant\",\"content\":"
    "\"The lamp is on.\"},";

static const char *const TURN_TEXT = "{\"role\":\"user\",\"content\":\"and the fan?\"},";

static struct fixtures {
    toolset *tools;
    parley_options opts[3]; /* per provider_registry entry */
    const provider *prov[3];
    json_t *history, *messages;
    response_format *format;
    agent_config *cfg;
} fx;

static int fixtures_make(void)
{
    char *err = NULL;
    parley_options base;
    if (options_parse(OPTIONS_JSON, &base, &err) != PARLEY_OK ||
        toolset_parse(base.tools_json, NULL, &fx.tools, &err) != PARLEY_OK)
        goto fail;
    options_free(&base);
    for (size_t i = 0; i < 3; i++) {
        fx.prov[i] = provider_registry[i];
        json_t *o = json_loads(OPTIONS_JSON, 0, NULL);
        json_object_set_new(o, "provider", json_string(fx.prov[i]->name));
        char *text = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        parley_status st = provider_options_parse(text, &fx.opts[i], &err);
        free(text);
        if (st != PARLEY_OK)
            goto fail;
    }
    fx.history = provider_parse_messages(HISTORY_TEXT, strlen(HISTORY_TEXT), &err);
    fx.messages = provider_parse_messages(TURN_TEXT, strlen(TURN_TEXT), &err);
    if (!fx.history || !fx.messages || response_format_parse(FORMAT_JSON, &fx.format, &err))
        goto fail;
    parley_status st;
    if (!(fx.cfg = config_new(OPTIONS_JSON, &st, &err)))
        goto fail;
    return 0;
fail:
    fprintf(stderr, "fixtures: %s\n", err ? err : "?");
    free(err);
    return -1;
}

static void fixtures_free(void)
{
    toolset_free(fx.tools);
    for (size_t i = 0; i < 3; i++)
        options_free(&fx.opts[i]);
    json_decref(fx.history);
    json_decref(fx.messages);
    response_format_free(fx.format);
    config_unref(fx.cfg);
}

/* ---- config/ ---- */

static void options_digest(outcome *o, const parley_options *p)
{
    note(o, "provider=%s;base_url=%s;model=%s;prompt=%s;t=%g;tools=%s;personas=%s;extra=%s;",
         p->provider ? p->provider : "(null)", p->base_url ? p->base_url : "(null)",
         p->model ? p->model : "(null)", p->prompt ? p->prompt : "(null)", p->temperature,
         p->tools_json ? p->tools_json : "(null)", p->personas_json ? p->personas_json : "(null)",
         p->extra_body ? p->extra_body : "(null)");
}

static void run_options(outcome *o, const char *json)
{
    parley_options p;
    o->st = provider_options_parse(json, &p, &o->err);
    if (o->st == PARLEY_OK) {
        options_digest(o, &p);
        options_free(&p);
    }
}

static void sc_options(outcome *o) { run_options(o, OPTIONS_JSON); }
static void sc_options_out_of_range(outcome *o)
{
    run_options(o, "{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":7}");
}
static void sc_options_unknown_key(outcome *o) { run_options(o, "{\"model\":\"m\",\"colour\":1}"); }
static void sc_options_bad_persona(outcome *o)
{
    run_options(o, "{\"model\":\"m\",\"tools\":[{\"name\":\"a\"}],\"personas\":{\"chef\":"
                   "{\"prompt\":\"p\",\"tools\":[\"oven\"]}}}");
}

static void sc_config_new(outcome *o)
{
    agent_config *c = config_new(OPTIONS_JSON, &o->st, &o->err);
    if (c)
        options_digest(o, &c->opts);
    config_unref(c);
}

static void run_format(outcome *o, const char *json)
{
    response_format *rf = NULL;
    o->st = response_format_parse(json, &rf, &o->err);
    if (rf) {
        note(o, "name=%s;description=%s;strict=%d;", rf->name,
             rf->description ? rf->description : "(null)", rf->strict);
        note_json(o, "schema", rf->schema);
    }
    response_format_free(rf);
}

static void sc_format(outcome *o) { run_format(o, FORMAT_JSON); }
static void sc_format_bad_type(outcome *o)
{
    run_format(o, "{\"schema\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"thing\"}}}}");
}

static void run_selector(outcome *o, const char *json, int flags)
{
    selector sel;
    o->st = selector_parse(json, flags, &sel, &o->err);
    if (o->st == PARLEY_OK) {
        note(o, "c=%s;p=%s;i=%s;every=%d;imid=%s;", sel.key.conversation_id, sel.key.persona,
             sel.key.interface_type, sel.every_persona,
             sel.interface_message_id ? sel.interface_message_id : "(null)");
        selector_free(&sel);
    }
}

static void sc_selector(outcome *o)
{
    run_selector(o,
                 "{\"conversation_id\":\"c1\",\"interface_type\":\"telegram\",\"persona\":\"*\","
                 "\"interface_message_id\":\"m1\"}",
                 SELECTOR_EVERY_PERSONA | SELECTOR_INTERFACE_MESSAGE_ID);
}
static void sc_selector_unknown_key(outcome *o)
{
    run_selector(o, "{\"conversation_id\":\"c\",\"colour\":1}", 0);
}

static void run_query(outcome *o, const char *json)
{
    query_request r;
    const char *field = NULL;
    o->st = query_parse(json, &r, &field, &o->err);
    if (o->st != PARLEY_OK)
        return;
    char *cursor = query_cursor(&r.q, 42);
    if (!cursor)
        o->st = PARLEY_ERR_NO_MEMORY;
    note(o, "c=%s;role=%s;search=%s;limit=%zu;newest=%d;cursor=%s;", r.q.conversation_id, r.q.role,
         r.q.search, r.q.limit, r.q.newest_first, cursor ? cursor : "(null)");
    free(cursor);
    query_request_free(&r);
}

static void sc_query(outcome *o)
{
    run_query(o, "{\"conversation_id\":\"c\",\"role\":\"user\",\"search\":\"lamp\",\"limit\":10,"
                 "\"order\":\"newest\",\"since\":\"2026-11-22T19:31:00Z\"}");
}
static void sc_query_bad_role(outcome *o) { run_query(o, "{\"role\":\"robot\"}"); }

static void run_personas(outcome *o, const char *json)
{
    persona_set s = {0};
    o->st = persona_set_parse(json, fx.tools, &s, &o->err);
    if (o->st != PARLEY_OK)
        return;
    for (size_t i = 0; i < s.n; i++)
        note(o, "%s:%s:%s:%s;", s.items[i].name, s.items[i].prompt,
             s.items[i].model ? s.items[i].model : "(null)",
             s.items[i].tools ? toolset_json(s.items[i].tools) : "(all)");
    if (o->st == PARLEY_OK)
        o->st = persona_check_name(&s, "pirate", 0, "input 'persona'", &o->err);
    persona_set_free(&s);
}

static void sc_personas(outcome *o)
{
    /* ends with persona_check_name's refusal of an unknown name: its message too */
    run_personas(o, "{\"chef\":{\"prompt\":\"You cook.\",\"model\":\"m2\",\"temperature\":0.3,"
                    "\"tools\":[\"turn_on\"]},\"butler\":{\"prompt\":\"You serve.\"}}");
}
static void sc_personas_bad_tool(outcome *o)
{
    run_personas(o, "{\"chef\":{\"prompt\":\"p\",\"tools\":[\"oven\"]}}");
}

/* ---- lib/, store/, context/ ---- */

static void sc_json_keys(outcome *o)
{
    static const char *const known[] = {"prompt", "model", NULL};
    af_pause();
    json_t *obj = json_loads("{\"model\":\"x\",\"colour\":1}", 0, NULL);
    af_resume();
    o->st = json_keys_check(obj, known, "persona", &o->err);
    json_decref(obj);
}

static void sc_message_text(outcome *o)
{
    msgtext_iter it;
    msgtext_msg m;
    pbuf out = PBUF_INIT;
    int rc, n = 0;
    msgtext_begin(&it, HISTORY_TEXT, strlen(HISTORY_TEXT));
    while ((rc = msgtext_next(&it, &m)) == 1) {
        msgtext_append(&out, m.json, m.len);
        n++;
    }
    o->st = rc != 0 ? PARLEY_ERR_INVALID_INPUT : out.oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
    if (o->st == PARLEY_OK)
        note(o, "%d:%s", n, out.data);
    pbuf_free(&out);
}

static const char *const RECORD =
    "{\"start\":6,\"summary\":\"They talked about lamps.\",\"upto\":4,\"next\":\"Lamps and a fan."
    "\",\"next_upto\":8,\"lp\":120,\"lb\":480,\"plen\":300,\"phash\":\"00ff00ff00ff00ff\"}";

static void sc_context_describe(outcome *o)
{
    pbuf out = PBUF_INIT;
    ctx_describe(RECORD, strlen(RECORD), &out);
    o->st = out.oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
    if (o->st == PARLEY_OK)
        note(o, "%s", out.data);
    pbuf_free(&out);
}

static void sc_context_record(outcome *o)
{
    ctx_window w;
    memset(&w, 0, sizeof w);
    w.first = 6;
    o->st = ctx_record_parse(RECORD, strlen(RECORD), &w.rec) ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
    if (o->st == PARLEY_OK) {
        note(o, "summary=%s;next=%s;", w.rec.summary ? w.rec.summary : "(null)",
             w.rec.next ? w.rec.next : "(null)");
        if (ctx_record_write(&w) || ctx_record_write_summary(&w, "Lamps, then a fan.") ||
            ctx_record_write_next(&w, "And the door.", 0))
            o->st = PARLEY_ERR_NO_MEMORY;
        else
            note(o, "%s", w.record.data);
    }
    ctx_window_free(&w);
}

/* ---- provider/ ---- */

static void run_encode(outcome *o, size_t i, int as_text)
{
    const provider *p = fx.prov[i];
    provider_request r = {.system = "You are terse.",
                          .system_fixed_len = strlen("You are terse."),
                          .history = fx.history,
                          .messages = fx.messages,
                          .tools_json = toolset_json(fx.tools),
                          .response_format = fx.format,
                          .cache_key = "c1",
                          .turn_note = "It is 8 pm."};
    if (as_text) {
        r.history = r.messages = NULL;
        r.history_text = HISTORY_TEXT;
        r.history_text_len = strlen(HISTORY_TEXT);
        r.messages_text = TURN_TEXT;
        r.messages_text_len = strlen(TURN_TEXT);
    }
    pbuf body = PBUF_INIT;
    int rc = p->encode(&body, &fx.opts[i], &r, &o->err);
    o->st = rc_status(rc, o->err, PARLEY_ERR_INVALID_INPUT);
    if (rc == 0 && body.oom) /* 0 with a body that is not whole */
        o->st = PARLEY_ERR_INTERNAL;
    if (o->st == PARLEY_OK)
        note(o, "%s", body.data);
    pbuf_free(&body);
}

static void sc_encode_openai(outcome *o) { run_encode(o, 0, 0); }
static void sc_encode_openai_text(outcome *o) { run_encode(o, 0, 1); }
static void sc_encode_anthropic(outcome *o) { run_encode(o, 1, 0); }
static void sc_encode_ollama(outcome *o) { run_encode(o, 2, 0); }

static const char REPLY_OPENAI[] =
    "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"<think>lamp first</think>Sure.\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
    "\"function\",\"function\":{\"name\":\"turn_on\",\"arguments\":\"{\\\"name\\\":\\\"x\\\"}\"}}"
    "]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":10,"
    "\"completion_tokens\":5,\"total_tokens\":15}}";
static const char REPLY_ANTHROPIC[] =
    "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
    "\"thinking\",\"thinking\":\"lamp "
    "first\",\"signature\":\"sig\"},{\"type\":\"redacted_thinking\","
    "\"data\":\"xyz\"},{\"type\":\"text\",\"text\":"
    "\"Sure.\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"turn_on\",\"input\":"
    "{\"name\":\"x\"}}],\"stop_reason\":\"tool_use\",\"usage\":{\"input_tokens\":10,"
    "\"output_tokens\":5}}";
static const char REPLY_OLLAMA[] =
    "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"<think>lamp first"
    "</think>Sure.\",\"tool_calls\":[{\"function\":{\"name\":\"turn_on\",\"arguments\":"
    "{\"name\":\"x\"}}}]},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":10,"
    "\"eval_count\":5}";
/* (one literal each, not concatenated inside the array: clang's -Wstring-concatenation) */
static const char *const REPLIES[3] = {REPLY_OPENAI, REPLY_ANTHROPIC, REPLY_OLLAMA};

static void reply_digest(outcome *o, const llm_reply *r)
{
    note(o, "content=%s;reasoning=%s;finish=%s;data=%s;", r->content ? r->content : "(null)",
         r->reasoning ? r->reasoning : "(null)", r->finish_reason ? r->finish_reason : "(null)",
         r->provider_data ? r->provider_data : "(null)");
    for (size_t i = 0; i < r->ncalls; i++)
        note(o, "call=%s:%s:%s;", r->calls[i].id ? r->calls[i].id : "(null)",
             r->calls[i].name ? r->calls[i].name : "(null)",
             r->calls[i].arguments ? r->calls[i].arguments : "(null)");
}

static void run_decode(outcome *o, size_t i)
{
    llm_reply r;
    memset(&r, 0, sizeof r);
    int rc = provider_decode(fx.prov[i], 1, REPLIES[i], strlen(REPLIES[i]), &r, &o->err);
    o->st = rc_status(rc, o->err, PARLEY_ERR_BAD_RESPONSE);
    if (rc == 0)
        reply_digest(o, &r);
    llm_reply_free(&r);
}

static void sc_decode_openai(outcome *o) { run_decode(o, 0); }
static void sc_decode_anthropic(outcome *o) { run_decode(o, 1); }
static void sc_decode_ollama(outcome *o) { run_decode(o, 2); }

static void sink_text(void *ud, const char *text, size_t len)
{
    note(ud, "delta=%.*s;", (int)len, text);
}

static void sc_stream_openai(outcome *o)
{
    static const char LAST_CHUNK[] =
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
        "\"function\":{\"name\":\"turn_on\",\"arguments\":\"{}\"}}]},\"finish_reason\":"
        "\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
    static const char *const chunks[] = {
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"<think>hm</thi",
        "nk>Su\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"re.\"}}]}\n\n", LAST_CHUNK};
    llm_sink sink = {sink_text, sink_text, o};
    provider_stream *s = provider_stream_new(fx.prov[0], 1, &sink);
    if (!s) {
        o->st = PARLEY_ERR_NO_MEMORY;
        return;
    }
    int rc = 0;
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks && rc == 0; i++)
        rc = provider_stream_feed(s, chunks[i], strlen(chunks[i]), &o->err);
    llm_reply r;
    memset(&r, 0, sizeof r);
    if (rc == 0)
        rc = provider_stream_finish(s, &r, &o->err);
    o->st = rc_status(rc, o->err, PARLEY_ERR_BAD_RESPONSE);
    if (rc == 0)
        reply_digest(o, &r);
    llm_reply_free(&r);
    provider_stream_free(s);
}

/* ---- turn/ (validation on the host's thread) ---- */

static void done_cb(void *ud, const parley_result *r)
{
    (void)ud;
    (void)r;
}

static void turn_digest(outcome *o, const turn *t)
{
    note(o, "text=%s;metadata=%s;imid=%s;format=%s;tools=%s;time=%llu;",
         t->in.text ? t->in.text : "(null)", t->in.metadata ? t->in.metadata : "(null)",
         t->in.interface_message_id ? t->in.interface_message_id : "(null)",
         t->in.format ? t->in.format->name : "(null)",
         t->in.tools ? toolset_json(t->in.tools) : "(null)",
         (unsigned long long)t->in.host_time_ms);
}

static void sc_turn_input(outcome *o)
{
    parley_input in = {.struct_size = sizeof in,
                       .text = "switch on the fan",
                       .conversation_id = "c1",
                       .context_json = "{\"user_id\":\"u1\"}",
                       .tools_json = "[{\"name\":\"fan\",\"description\":\"the fan\"}]",
                       .metadata_json = "{ \"from\" : \"anna\" }",
                       .interface_type = "telegram",
                       .interface_message_id = "tg-42",
                       .reply_to_json = "{\"interface_message_id\":\"tg-41\"}",
                       .persona = "chef",
                       .response_format_json = FORMAT_JSON,
                       .timestamp = "2026-11-22T20:31:00+01:00"};
    turn *t = turn_input_accept(fx.cfg, 1, &in, done_cb, NULL, &o->st, &o->err);
    if (t)
        turn_digest(o, t);
    turn_free(t);
}

static void sc_turn_input_bad_metadata(outcome *o)
{
    parley_input in = {
        .struct_size = sizeof in, .text = "hi", .conversation_id = "c1", .metadata_json = "[1]"};
    turn *t = turn_input_accept(fx.cfg, 1, &in, done_cb, NULL, &o->st, &o->err);
    turn_free(t);
}

static void sc_turn_append(outcome *o)
{
    const char *message = "{\"conversation_id\":\"c1\",\"persona\":\"butler\",\"role\":"
                          "\"assistant\",\"content\":\"The fan is on.\",\"timestamp\":"
                          "\"2026-11-22T19:31:00Z\",\"metadata\":{\"k\":1}}";
    turn *t = turn_append_accept(fx.cfg, 1, message, done_cb, NULL, &o->st, &o->err);
    if (t)
        note(o, "ok;");
    turn_free(t);
}

static const scenario SCENARIOS[] = {
    {"options_parse", sc_options},
    {"options_parse out of range", sc_options_out_of_range},
    {"options_parse unknown key", sc_options_unknown_key},
    {"options_parse persona's unknown tool", sc_options_bad_persona},
    {"config_new", sc_config_new},
    {"response_format_parse", sc_format},
    {"response_format_parse unknown type", sc_format_bad_type},
    {"selector_parse", sc_selector},
    {"selector_parse unknown key", sc_selector_unknown_key},
    {"query_parse + query_cursor", sc_query},
    {"query_parse bad role", sc_query_bad_role},
    {"persona_set_parse + persona_check_name", sc_personas},
    {"persona_set_parse unknown tool", sc_personas_bad_tool},
    {"json_keys_check", sc_json_keys},
    {"msgtext_next + msgtext_append", sc_message_text},
    {"ctx_describe", sc_context_describe},
    {"ctx_record_parse + ctx_record_write*", sc_context_record},
    {"openai encode", sc_encode_openai},
    {"openai encode from stored text", sc_encode_openai_text},
    {"anthropic encode", sc_encode_anthropic},
    {"ollama encode", sc_encode_ollama},
    {"openai decode", sc_decode_openai},
    {"anthropic decode", sc_decode_anthropic},
    {"ollama decode", sc_decode_ollama},
    {"openai stream", sc_stream_openai},
    {"turn_input_accept", sc_turn_input},
    {"turn_input_accept bad metadata", sc_turn_input_bad_metadata},
    {"turn_append_accept", sc_turn_append},
};

/* ---- the runner ---- */

/* A run that jansson's parser ended (an abort) or left with a corrupt heap (a double
 * free): run_failing's and a child's exit status. */
#define RUN_JANSSON_ABORTED 77

static void outcome_free(outcome *o)
{
    free(o->err);
    pbuf_free(&o->digest);
    memset(o, 0, sizeof *o);
}

static int same_text(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* A message given with an out-of-memory status: words, not garbage. */
static int sane_message(const char *m)
{
    size_t n = m ? strlen(m) : 0;
    return !m || (n > 0 && n < 4096 && utf8_valid(m, n));
}

/* Where the failed allocation was asked for: "file+0xoffset" for addr2line. */
static void print_caller(void *addr)
{
    Dl_info info;
    if (addr && dladdr(addr, &info) && info.dli_fname)
        fprintf(stderr, "    first failed allocation from %s+0x%lx (%s)\n", info.dli_fname,
                (unsigned long)((char *)addr - (char *)info.dli_fbase),
                info.dli_sname ? info.dli_sname : "?");
}

/* jansson's parser can also crash under out of memory: its lexer drops a byte it
 * could not save, and the string it then decodes trips its assert(0) in
 * lex_scan_string (load.c), or is decoded past its end (a closing quote dropped),
 * which corrupts the heap: glibc's malloc aborts then, in the parser or later.  A run
 * that dies of a signal inside jansson's parser, or after a parse jansson got wrong, is
 * counted as jansson's, not Parley's; any other crash is a finding. */
static void on_fatal_signal(int sig)
{
    if (in_jansson_parser || jansson_misreported)
        _exit(RUN_JANSSON_ABORTED);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* One run failing allocation k (and every later one when persistent): 0 when it
 * behaved, else a report on stderr. */
static int run_failing(const scenario *sc, const outcome *base, long k, int persistent)
{
    outcome o;
    memset(&o, 0, sizeof o);
    long live = af_live();
    jansson_misreported = jansson_double_freed = 0;
    jansson_leaked = 0;
    if (getenv("PARLEY_ALLOC_TRACE"))
        af_trace_start();
    af_arm(k, persistent);
    sc->run(&o);
    af_disarm();
    long failed = af_failures();
    void *caller = af_first_failure_caller();
    if (jansson_double_freed) { /* nothing after it can be judged */
        af_pause();
        outcome_free(&o);
        af_resume();
        return RUN_JANSSON_ABORTED;
    }
    const char *why = NULL;
    if (o.st == PARLEY_ERR_NO_MEMORY) {
        if (!failed)
            why = "out of memory without any failed allocation";
        else if (!sane_message(o.err))
            why = "out of memory with a message that is not text";
    } else if (o.st != base->st) {
        if (!(jansson_misreported && o.st != PARLEY_OK)) /* a refusal: what jansson read */
            why = "another status than out of memory";
    } else if (!same_text(o.err, base->err) || !same_text(o.digest.data, base->digest.data)) {
        if (!jansson_misreported)
            why = "the same status with another result";
    }
    parley_status st = o.st;
    char said[160];
    snprintf(said, sizeof said, "%s", o.err ? o.err : "");
    af_pause();
    if (why)
        fprintf(stderr, "  %s: allocation %ld failing%s: %s: %s: %s\n", sc->name, k,
                persistent ? " and every one after" : "", why, status_name(st),
                o.err           ? o.err
                : o.digest.data ? o.digest.data
                                : "");
    outcome_free(&o);
    af_resume();
    /* A parse jansson got wrong may also have written where it should not have: its lexer
     * goes on after its token buffer could not grow (a later decref seen to keep the
     * reply's tool-call array alive).  Leaks are judged only when jansson read right. */
    if (!why && !jansson_misreported && af_live() - jansson_leaked != live) {
        why = "a leak";
        fprintf(stderr, "  %s: allocation %ld failing%s: %s of %ld blocks (%s%s%s)\n", sc->name, k,
                persistent ? " and every one after" : "", why, af_live() - jansson_leaked - live,
                status_name(st), *said ? ": " : "", said);
        af_trace_report();
    }
    if (!why)
        return 0;
    print_caller(caller);
    return 1;
}

/* run_failing in a child process, so that a crash is a finding, not the end of the test:
 * 0 when it behaved, 1 when not (reported), RUN_JANSSON_ABORTED. */
static int run_forked(const scenario *sc, const outcome *base, long k, int persistent)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGABRT, on_fatal_signal);
        signal(SIGSEGV, on_fatal_signal);
        signal(SIGBUS, on_fatal_signal);
        int bad = run_failing(sc, base, k, persistent);
        fflush(stderr);
        _exit(bad);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        fprintf(stderr, "  %s: cannot run allocation %ld in a child\n", sc->name, k);
        return 1;
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status) == 0                     ? 0
               : WEXITSTATUS(status) == RUN_JANSSON_ABORTED ? RUN_JANSSON_ABORTED
                                                            : 1;
    fprintf(stderr, "  %s: allocation %ld failing%s: a crash (signal %d)\n", sc->name, k,
            persistent ? " and every one after" : "", WTERMSIG(status));
    return 1;
}

static void run_scenario(const scenario *sc)
{
    outcome base;
    memset(&base, 0, sizeof base);
    sc->run(&base); /* once before counting: what glibc sets up on first use (tzset's zone) */
    outcome_free(&base);
    long live = af_live();
    af_arm(0, 0);
    sc->run(&base);
    long n = af_allocs();
    af_pause(); /* the base outcome is not part of any run's count */
    long base_live = af_live() - live;
    int bad = 0, jansson_aborts = 0;
    /* a few reports say enough; PARLEY_ALLOC_ALL=1 reports every failing run */
    int max_bad = getenv("PARLEY_ALLOC_ALL") ? 1 << 30 : 3;
    const char *one = getenv("PARLEY_ALLOC_K"); /* this k only, in this process (a debugger) */
    if (one) {
        af_resume();
        bad = run_failing(sc, &base, atol(one), 0);
        af_pause();
    }
    for (long k = 1; !one && k <= n && bad < max_bad; k++)
        for (int persistent = 0; persistent <= 1 && bad < max_bad; persistent++) {
            af_resume();
            int rc = run_forked(sc, &base, k, persistent);
            af_pause();
            if (rc == RUN_JANSSON_ABORTED)
                jansson_aborts++;
            else
                bad += rc;
        }
    printf("%-40s N=%-5ld %s%s%s", sc->name, n, status_name(base.st), base.err ? ": " : "",
           base.err ? base.err : "");
    if (jansson_aborts)
        printf(" (jansson's parser aborted or freed twice in %d runs)", jansson_aborts);
    printf("\n");
    CHECK(bad == 0);
    outcome_free(&base);
    af_resume();
    /* the base run itself keeps nothing beyond its outcome */
    CHECK(af_live() - live <= 0);
    if (af_live() - live > 0)
        fprintf(stderr, "  %s: the run without failures leaked %ld blocks (%ld with its outcome)\n",
                sc->name, af_live() - live, base_live);
}

int main(void)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* jansson's hash seed orders an object's members, and with them the allocations: fixed,
       every run fails the same ones (PARLEY_ALLOC_SEED tries another) */
    const char *seed = getenv("PARLEY_ALLOC_SEED");
    json_object_seed(seed ? (size_t)strtoul(seed, NULL, 0) : 1);
    if (fixtures_make() != 0) {
        CHECK(0);
        return check_report();
    }
    printf("%-40s %-7s %s\n", "scenario", "N", "status without failures"); /* (stdout's
                                                     buffer: allocated now, kept to the end) */
    const char *only = getenv("PARLEY_ALLOC_ONLY"); /* a scenario's name, or part of it */
    for (size_t i = 0; i < sizeof SCENARIOS / sizeof *SCENARIOS; i++)
        if (!only || strstr(SCENARIOS[i].name, only))
            run_scenario(&SCENARIOS[i]);
    fixtures_free();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%zu scenarios in %.2f s\n", sizeof SCENARIOS / sizeof *SCENARIOS,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return check_report();
}
