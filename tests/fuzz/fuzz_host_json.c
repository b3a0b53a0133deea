/*
 * fuzz_host_json.c -- the JSON a host passes through the ABI, besides the options
 * (fuzz_options) and response_format_json (fuzz_response_format): the first
 * byte picks the reader, the rest is its text.
 *
 *   0 selector_parse (history *_by; the byte's high bits are its flags)
 *   1 query_parse (history_query)
 *   2 persona_set_parse (the personas option), or (a high bit) persona_put's object in
 *     the options given to config_new
 *   3 reply_context_parse (input reply_to_json)
 *   4 turn_input_accept: the text as one field of an input (the high bits pick it)
 *   5 turn_append_accept (append_message's message_json)
 *   6 a tool's result as the host gives it back (tools_take_result; a high bit: is_error)
 *   7 a call's arguments as tools_send checks them
 *
 * Each reader must give its result or a refusal with a message (status != OK
 * exactly when there is a message) in valid UTF-8 whatever the input (lib/utf8.h),
 * never a crash, a leak, or UB.  What a reader accepted, written again as JSON from
 * what it read, is accepted again with the same meaning.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/query.h"
#include "config/persona.h"
#include "config/selector.h"
#include "engine/config.h"
#include "engine/reply_context.h"
#include "fuzz_check.h"
#include "lib/utf8.h"
#include "turn/tools.h"
#include "turn/turn_append.h"
#include "turn/turn_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The agent every turn is accepted by: two tools, two personas (one with a subset). */
static const char *const OPTIONS =
    "{\"model\":\"m\",\"tools\":[{\"name\":\"lamp\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"on\":{\"type\":\"boolean\"}}}},{\"name\":\"oven\"}],"
    "\"personas\":{\"chef\":{\"prompt\":\"You cook.\",\"tools\":[\"oven\"]},"
    "\"pirate\":{\"prompt\":\"Arr.\",\"temperature\":1.5}}}";

static agent_config *the_config(void)
{
    static agent_config *cfg;
    if (!cfg) {
        parley_status st;
        char *err = NULL;
        cfg = config_new(OPTIONS, &st, &err);
        FUZZ_CHECK(cfg && !err);
    }
    return cfg;
}

/* A refusal: a message, in valid UTF-8 (it is quoted to the host, and into JSON). */
static void check_refusal(parley_status st, const char *err)
{
    FUZZ_CHECK(st != PARLEY_OK);
    FUZZ_CHECK(err != NULL);
    FUZZ_CHECK(utf8_valid(err, strlen(err)));
}

/* The text of v written again (compact, in order), malloc'd. */
static char *dump(const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    FUZZ_CHECK(s != NULL);
    return s;
}

static void set_string(json_t *o, const char *key, const char *value)
{
    if (value && *value)
        FUZZ_CHECK(json_object_set_new(o, key, json_string(value)) == 0);
}

/* What a reader of JSON with NUL escapes accepted holds no string value it read only the
   start of ("user\\u0000x" is not "user"). */
static void check_no_nul_values(const char *text)
{
    json_t *root = json_loads(text, JSON_ALLOW_NUL, NULL), *v;
    const char *key;
    json_object_foreach(root, key, v)
        FUZZ_CHECK(!json_is_string(v) || strlen(json_string_value(v)) == json_string_length(v));
    json_decref(root);
}

static void fuzz_selector(const char *text, int flags)
{
    selector sel;
    char *err = NULL;
    parley_status st = selector_parse(text, flags, &sel, &err);
    if (st != PARLEY_OK) {
        check_refusal(st, err);
        FUZZ_CHECK(sel.bad_key && !sel.root);
        free(err);
        return;
    }
    FUZZ_CHECK(!err && sel.key.conversation_id && sel.key.persona && sel.key.interface_type);
    FUZZ_CHECK(!sel.every_persona || (flags & SELECTOR_EVERY_PERSONA));
    FUZZ_CHECK(!sel.interface_message_id || (flags & SELECTOR_INTERFACE_MESSAGE_ID));
    if (!(flags & SELECTOR_OTHER_KEYS)) /* the other keys are the caller's to check */
        check_no_nul_values(text);
    /* What it read, as a selector of its own: the same conversation. */
    json_t *o = json_object();
    set_string(o, "conversation_id", sel.key.conversation_id);
    set_string(o, "interface_type", sel.key.interface_type);
    set_string(o, "persona", sel.key.persona);
    set_string(o, "interface_message_id", sel.interface_message_id);
    char *again_text = dump(o);
    json_decref(o);
    selector again;
    FUZZ_CHECK(selector_parse(again_text, flags, &again, &err) == PARLEY_OK);
    FUZZ_CHECK(strcmp(again.key.conversation_id, sel.key.conversation_id) == 0 &&
               strcmp(again.key.interface_type, sel.key.interface_type) == 0 &&
               strcmp(again.key.persona, sel.key.persona) == 0 &&
               again.every_persona == sel.every_persona &&
               fuzz_str_equal(again.interface_message_id, sel.interface_message_id));
    selector_free(&again);
    free(again_text);
    selector_free(&sel);
}

static int queries_equal(const store_query *a, const store_query *b)
{
    return fuzz_str_equal(a->conversation_id, b->conversation_id) &&
           fuzz_str_equal(a->persona, b->persona) &&
           fuzz_str_equal(a->interface_type, b->interface_type) &&
           fuzz_str_equal(a->role, b->role) && fuzz_str_equal(a->search, b->search) &&
           fuzz_str_equal(a->turn_id, b->turn_id) &&
           fuzz_str_equal(a->interface_message_id, b->interface_message_id) &&
           a->since_ms == b->since_ms && a->until_ms == b->until_ms && a->limit == b->limit &&
           a->newest_first == b->newest_first;
}

static void fuzz_query(const char *text, uint64_t position)
{
    query_request r;
    const char *field = NULL;
    char *err = NULL;
    parley_status st = query_parse(text, &r, &field, &err);
    if (st != PARLEY_OK) {
        check_refusal(st, err);
        FUZZ_CHECK(field && !r.root);
        free(err);
        return;
    }
    FUZZ_CHECK(!err && r.q.limit >= 1 && r.q.limit <= STORE_QUERY_MAX_LIMIT);
    FUZZ_CHECK(r.q.since_ms <= r.q.until_ms);
    check_no_nul_values(text);
    /* The same query with the cursor its results would end with: accepted, and
       continuing from that position. */
    char *cursor = query_cursor(&r.q, position);
    FUZZ_CHECK(cursor != NULL);
    FUZZ_CHECK(json_object_set_new(r.root, "cursor", json_string(cursor)) == 0);
    char *again_text = dump(r.root);
    query_request again;
    FUZZ_CHECK(query_parse(again_text, &again, &field, &err) == PARLEY_OK);
    FUZZ_CHECK(queries_equal(&again.q, &r.q) && again.q.after == position);
    query_request_free(&again);
    free(again_text);
    free(cursor);
    query_request_free(&r);
}

/* The names of a toolset's tools, as a JSON array. */
static json_t *tool_names(const toolset *t)
{
    json_t *all = json_loads(toolset_json(t), 0, NULL), *names = json_array(), *tool;
    FUZZ_CHECK(json_is_array(all) && names);
    size_t i;
    json_array_foreach(all, i, tool) {
        json_t *name = json_object_get(json_object_get(tool, "function"), "name");
        FUZZ_CHECK(json_is_string(name));
        json_array_append(names, name);
    }
    json_decref(all);
    return names;
}

/* A persona written back as the option's JSON, from what was read. */
static json_t *persona_json(const persona_spec *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_string(p->prompt));
    if (p->model)
        json_object_set_new(o, "model", json_string(p->model));
    if (p->temperature >= 0)
        json_object_set_new(o, "temperature", json_real(p->temperature));
    if (p->top_p >= 0)
        json_object_set_new(o, "top_p", json_real(p->top_p));
    if (p->max_tokens > 0)
        json_object_set_new(o, "max_tokens", json_integer(p->max_tokens));
    if (p->max_history_turns >= 0)
        json_object_set_new(o, "max_history_turns", json_integer(p->max_history_turns));
    if (p->tools)
        json_object_set_new(o, "tools", tool_names(p->tools));
    return o;
}

static int personas_equal(const persona_spec *a, const persona_spec *b)
{
    return strcmp(a->name, b->name) == 0 && strcmp(a->prompt, b->prompt) == 0 &&
           fuzz_str_equal(a->model, b->model) && a->temperature == b->temperature &&
           a->top_p == b->top_p && a->max_tokens == b->max_tokens &&
           a->max_history_turns == b->max_history_turns && !a->tools == !b->tools &&
           (!a->tools || strcmp(toolset_json(a->tools), toolset_json(b->tools)) == 0);
}

static void fuzz_personas(const char *text)
{
    const toolset *tools = the_config()->tools;
    persona_set set;
    char *err = NULL;
    parley_status st = persona_set_parse(text, tools, &set, &err);
    if (st != PARLEY_OK) {
        check_refusal(st, err);
        FUZZ_CHECK(set.n == 0 && !set.items);
        free(err);
        return;
    }
    FUZZ_CHECK(!err);
    json_t *o = json_object();
    for (size_t i = 0; i < set.n; i++) {
        FUZZ_CHECK(persona_find(&set, set.items[i].name) == &set.items[i]); /* names unique */
        FUZZ_CHECK(persona_check_name(&set, set.items[i].name, 0, "fuzz", &err) == PARLEY_OK);
        json_object_set_new(o, set.items[i].name, persona_json(&set.items[i]));
    }
    char *names = persona_names(&set);
    FUZZ_CHECK(names && utf8_valid(names, strlen(names)));
    free(names);
    char *again_text = dump(o);
    json_decref(o);
    persona_set again;
    FUZZ_CHECK(persona_set_parse(again_text, tools, &again, &err) == PARLEY_OK);
    FUZZ_CHECK(again.n == set.n);
    for (size_t i = 0; i < set.n; i++)
        FUZZ_CHECK(personas_equal(&again.items[i], &set.items[i]));
    persona_set_free(&again);
    free(again_text);
    persona_set_free(&set);
}

/* persona_put's way: the text as one persona's object in the options, made a snapshot. */
static void fuzz_persona_put(const char *text)
{
    json_t *def = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(def)) { /* persona_put refuses it before */
        json_decref(def);
        return;
    }
    json_t *options = json_loads(OPTIONS, 0, NULL);
    FUZZ_CHECK(json_object_set_new(json_object_get(options, "personas"), "guest", def) == 0);
    char *options_text = dump(options);
    json_decref(options);
    parley_status st = PARLEY_ERR_INTERNAL;
    char *err = NULL;
    agent_config *cfg = config_new(options_text, &st, &err);
    if (cfg) {
        FUZZ_CHECK(st == PARLEY_OK && !err && persona_find(&cfg->personas, "guest"));
        config_unref(cfg);
    } else {
        check_refusal(st, err);
        FUZZ_CHECK(st == PARLEY_ERR_INVALID_OPTIONS);
        free(err);
    }
    free(options_text);
}

static void fuzz_reply_to(const char *text)
{
    reply_context rc;
    char *err = NULL;
    parley_status st = reply_context_parse(text, &rc, &err);
    if (st != PARLEY_OK) {
        check_refusal(st, err);
        FUZZ_CHECK(!reply_context_wanted(&rc));
        free(err);
        reply_context_free(&rc);
        return;
    }
    FUZZ_CHECK(!err && !rc.turn_id != !rc.interface_message_id);
    json_t *o = json_object();
    set_string(o, rc.turn_id ? "turn_id" : "interface_message_id",
               rc.turn_id ? rc.turn_id : rc.interface_message_id);
    char *again_text = dump(o);
    json_decref(o);
    reply_context again;
    FUZZ_CHECK(reply_context_parse(again_text, &again, &err) == PARLEY_OK);
    FUZZ_CHECK(fuzz_str_equal(again.turn_id, rc.turn_id) &&
               fuzz_str_equal(again.interface_message_id, rc.interface_message_id));
    reply_context_free(&again);
    free(again_text);
    reply_context_free(&rc);
}

static void done_cb(void *ud, const parley_result *r)
{
    (void)ud;
    (void)r;
}

/* A turn's outcome: a turn, or a refusal; never both. */
static void check_accepted(turn *t, parley_status st, char *err)
{
    if (!t) {
        check_refusal(st, err);
    } else {
        FUZZ_CHECK(st == PARLEY_OK && !err && t->opts);
    }
    free(err);
}

/* metadata as the store keeps it: a compact object, the same written again. */
static void check_metadata(const char *metadata)
{
    if (!metadata)
        return;
    json_t *v = json_loads(metadata, JSON_ALLOW_NUL, NULL);
    FUZZ_CHECK(json_is_object(v));
    char *again = dump(v);
    FUZZ_CHECK(strcmp(again, metadata) == 0);
    free(again);
    json_decref(v);
}

static void fuzz_input_field(const char *text, unsigned which)
{
    parley_input in = {.struct_size = sizeof in, .text = "hi", .conversation_id = "c"};
    const char **fields[] = {
        &in.context_json,         &in.metadata_json,  &in.reply_to_json, &in.tools_json,
        &in.response_format_json, &in.images_json,    &in.timestamp,     &in.persona,
        &in.conversation_id,      &in.interface_type, &in.text};
    size_t nfields = sizeof fields / sizeof fields[0];
    if (which % (nfields + 1) < nfields) {
        *fields[which % (nfields + 1)] = text;
    } else { /* a persona's subset of tools under the input's own */
        in.persona = "chef";
        in.tools_json = text;
    }
    parley_status st = PARLEY_ERR_INTERNAL;
    char *err = NULL;
    turn *t = turn_input_accept(the_config(), 1, &in, done_cb, NULL, &st, &err);
    check_accepted(t, st, err);
    if (t) {
        FUZZ_CHECK(t->in.tools);
        check_metadata(t->in.metadata);
        if (in.context_json)
            FUZZ_CHECK(strcmp(t->in.context_json, text) == 0);
        FUZZ_CHECK(!in.response_format_json || t->in.format);
    }
    turn_free(t);
}

static void fuzz_append(const char *text)
{
    parley_status st = PARLEY_ERR_INTERNAL;
    char *err = NULL;
    turn *t = turn_append_accept(the_config(), 1, text, done_cb, NULL, &st, &err);
    check_accepted(t, st, err);
    if (t) {
        FUZZ_CHECK(t->append && t->conv.conversation_id && t->rec.nmessages == 1);
        json_t *m = json_loadb(t->rec.messages.data, t->rec.messages.len, 0, NULL);
        FUZZ_CHECK(json_is_object(m) && json_string_length(json_object_get(m, "content")) > 0);
        json_decref(m);
        check_metadata(t->in.metadata);
        check_no_nul_values(text);
    }
    turn_free(t);
}

/* A turn in its tool round, one call of `name` with `arguments`: what tools.c needs of it. */
typedef struct tool_round {
    turn t;
    turn_env env;
    agent_counters metrics;
    parley_host host;
} tool_round;

static void round_init(tool_round *r, const char *name, const char *arguments)
{
    memset(r, 0, sizeof *r);
    r->env.metrics = &r->metrics;
    r->env.host = &r->host; /* no tool_call: a valid call is refused as no_executor */
    r->t.env = &r->env;
    r->t.cfg = the_config();
    r->t.opts = &r->t.cfg->opts;
    r->t.in.tools = r->t.cfg->tools;
    r->t.tool.calls = calloc(1, sizeof *r->t.tool.calls);
    FUZZ_CHECK(r->t.tool.calls);
    r->t.tool.ncalls = r->t.tool.pending = 1;
    r->t.tool.calls[0].id = strdup("call_1");
    r->t.tool.calls[0].name = strdup(name);
    r->t.tool.calls[0].arguments = strdup(arguments);
}

/* A tool message's content that reports an error: {"error": kind, "error_text": text, ...}. */
static void check_error_content(const char *content, const char *kind)
{
    json_t *v = json_loads(content, 0, NULL);
    FUZZ_CHECK(json_is_object(v));
    const char *got = json_string_value(json_object_get(v, "error"));
    FUZZ_CHECK(got && (!kind || strcmp(got, kind) == 0));
    FUZZ_CHECK(json_is_string(json_object_get(v, "error_text")));
    json_decref(v);
}

static void fuzz_tool_result(const char *text, int is_error)
{
    tool_round r;
    round_init(&r, "lamp", "{}");
    parley_tool_call h = {.index = 0, .result = (char *)text, .is_error = is_error};
    FUZZ_CHECK(tools_take_result(&r.t, &h) == 0);
    turn_call *c = &r.t.tool.calls[0];
    FUZZ_CHECK(c->content && r.t.tool.pending == 0);
    FUZZ_CHECK(utf8_valid(c->content, strlen(c->content)));
    if (c->is_error) {
        check_error_content(c->content, NULL);
    } else {
        /* JSON stays JSON (compact: the same written again), anything else stays text */
        FUZZ_CHECK(!is_error);
        json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
        if (v) {
            char *again = dump(v);
            FUZZ_CHECK(strcmp(again, c->content) == 0);
            free(again);
        } else {
            FUZZ_CHECK(strcmp(c->content, text) == 0);
        }
        json_decref(v);
    }
    tools_free(&r.t);
}

static void fuzz_arguments(const char *text, int known_tool)
{
    tool_round r;
    round_init(&r, known_tool ? "lamp" : "kettle", text);
    FUZZ_CHECK(tools_send(&r.t) == 0);
    turn_call *c = &r.t.tool.calls[0];
    FUZZ_CHECK(c->is_error && c->content && r.t.tool.pending == 0);
    json_t *args = json_loads(text, 0, NULL);
    check_error_content(c->content, !known_tool             ? "unknown_tool"
                                    : !json_is_object(args) ? "invalid_arguments"
                                                            : "no_executor");
    json_decref(args);
    tools_free(&r.t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned pick = data[0];
    char *text = malloc(size);
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    switch (pick % 8) {
    case 0:
        fuzz_selector(text, (int)(pick >> 3) & 7);
        break;
    case 1:
        fuzz_query(text, 1 + (uint64_t)size * 0x9e3779b97f4a7c15ull % INT64_MAX);
        break;
    case 2:
        if ((pick >> 3) & 1)
            fuzz_persona_put(text);
        else
            fuzz_personas(text);
        break;
    case 3:
        fuzz_reply_to(text);
        break;
    case 4:
        fuzz_input_field(text, pick >> 3);
        break;
    case 5:
        fuzz_append(text);
        break;
    case 6:
        fuzz_tool_result(text, (pick >> 3) & 1);
        break;
    default:
        fuzz_arguments(text, !((pick >> 3) & 1));
        break;
    }
    free(text);
    return 0;
}
