/* test_turn_input.c -- the message identity fields of a turn's input (turn_input.c):
 * metadata_json, interface_message_id, reply_to_json, timestamp; each bad value is
 * invalid_input naming its field, and a good one is kept as the turn's. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config/selector.h"
#include "engine/config.h"
#include "lib/utf8.h"
#include "turn/turn_append.h"
#include "turn/turn_input.h"

/* Linked with -Wl,--wrap=vasprintf (tests/CMakeLists.txt): while fail_vasprintf > 0, a
   vasprintf (pstr_printf's allocation) fails as it does out of memory. */
static int fail_vasprintf;
int __real_vasprintf(char **s, const char *fmt, va_list ap);
int __wrap_vasprintf(char **s, const char *fmt, va_list ap);
int __wrap_vasprintf(char **s, const char *fmt, va_list ap)
{
    if (fail_vasprintf > 0) {
        fail_vasprintf--;
        return -1;
    }
    return __real_vasprintf(s, fmt, ap);
}

static void done_cb(void *ud, const parley_result *r)
{
    (void)ud;
    (void)r;
}

typedef struct fields {
    const char *conversation_id, *metadata, *interface_message_id, *reply_to;
} fields;

/* Accept an input with these fields: the turn (free it), or NULL with *status and *err. */
static turn *accept_input(agent_config *cfg, fields f, parley_status *status, char **err)
{
    parley_input in = {.struct_size = sizeof in,
                       .text = "hello",
                       .conversation_id = f.conversation_id,
                       .metadata_json = f.metadata,
                       .interface_message_id = f.interface_message_id,
                       .reply_to_json = f.reply_to};
    return turn_input_accept(cfg, 1, &in, done_cb, NULL, status, err);
}

/* The input is refused as invalid_input with a message naming `field`. */
static void check_refused(agent_config *cfg, fields f, const char *field)
{
    parley_status st = PARLEY_OK;
    char *err = NULL;
    turn *t = accept_input(cfg, f, &st, &err);
    CHECK(t == NULL);
    CHECK(st == PARLEY_ERR_INVALID_INPUT);
    CHECK(err && strstr(err, field));
    if (!(err && strstr(err, field)))
        fprintf(stderr, "  expected '%s' in: %s\n", field, err ? err : "(null)");
    turn_free(t);
    free(err);
}

static turn *check_accepted(agent_config *cfg, fields f)
{
    parley_status st = PARLEY_ERR_INTERNAL;
    char *err = NULL;
    turn *t = accept_input(cfg, f, &st, &err);
    CHECK(t != NULL);
    CHECK(st == PARLEY_OK);
    if (err)
        fprintf(stderr, "  refused: %s\n", err);
    free(err);
    return t;
}

/* append_message's message (and any selector) that is not UTF-8 is refused naming the key
   whose member holds the bad byte, in a message that is UTF-8 itself. */
static void test_append_bad_utf8(agent_config *cfg)
{
    static const struct {
        const char *json, *key;
    } cases[] = {
        {"{\"conversation_id\":\"c\",\"content\":\"x\",\"metadata\":{\"k\":\"\xff\"}}", "metadata"},
        {"{\"conversation_id\":\"c\",\"metadata\":{\"a\":[\"\\\"\",{\"b\":\"\xc3(\"}]},\"content\":\"x\"}",
         "metadata"},
        {"{\"conversation_id\":\"c\",\"content\":\"\xe2\x82\"}", "content"},
        {"{\"conversation_id\":\"c\xff\",\"content\":\"x\"}", "conversation_id"},
        {"{\"persona\":\"\xc0\xaf\",\"conversation_id\":\"c\",\"content\":\"x\"}", "persona"},
        {"{\"conversation_id\":\"c\",\"k\xff\":1,\"content\":\"x\"}", "selector"},
        {"{\"conversation_id\":\"c\",\"colour\":\"\xff\",\"content\":\"x\"}", "selector"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parley_status st = PARLEY_OK;
        char *err = NULL;
        turn *t = turn_append_accept(cfg, 1, cases[i].json, done_cb, NULL, &st, &err);
        CHECK(t == NULL && st == PARLEY_ERR_INVALID_INPUT);
        CHECK(err && utf8_valid(err, strlen(err)));
        char want[64];
        snprintf(want, sizeof want, "message_json: %s: not valid UTF-8", cases[i].key);
        CHECK_STR(err, want);
        free(err);
        turn_free(t);
        selector sel;
        err = NULL;
        CHECK(selector_parse(cases[i].json, SELECTOR_OTHER_KEYS, &sel, &err) ==
              PARLEY_ERR_INVALID_INPUT);
        CHECK_STR(sel.bad_key, cases[i].key);
        free(err);
    }
}

/* The host's timestamp (turn_set_host_time, a validator): PARLEY_OK and the time;
   invalid_input naming the field; no_memory apart, never invalid_input without a message. */
static void test_host_time(agent_config *cfg)
{
    turn t;
    memset(&t, 0, sizeof t);
    char *err = NULL;
    CHECK(turn_set_host_time(&t, NULL, "input 'timestamp'", &err) == PARLEY_OK);
    CHECK(t.in.host_time_ms == 0 && err == NULL);
    CHECK(turn_set_host_time(&t, "2026-11-22T20:31:00+01:00", "input 'timestamp'", &err) ==
          PARLEY_OK);
    CHECK(t.in.host_time_ms == 1795375860000ull && err == NULL);
    const char *bad[] = {"soon", "1970-01-01T00:00:00Z", "2026-11-22", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t.in.host_time_ms = 5;
        CHECK(turn_set_host_time(&t, bad[i], "input 'timestamp'", &err) ==
              PARLEY_ERR_INVALID_INPUT);
        CHECK(t.in.host_time_ms == 0);
        CHECK_STR(err, "input 'timestamp': must be an RFC 3339 time after 1970, e.g. "
                       "\"2026-11-22T19:31:00Z\" or \"2026-11-22T20:31:00.250+01:00\"");
        free(err);
        err = NULL;
    }
    fail_vasprintf = 1;
    CHECK(turn_set_host_time(&t, "soon", "input 'timestamp'", &err) == PARLEY_ERR_NO_MEMORY);
    CHECK(err == NULL);
    fail_vasprintf = 0;

    /* through both doors: the input's and append_message's */
    parley_input in = {.struct_size = sizeof in, .text = "hi", .timestamp = "soon"};
    parley_status st = PARLEY_OK;
    turn *got = turn_input_accept(cfg, 1, &in, done_cb, NULL, &st, &err);
    CHECK(!got && st == PARLEY_ERR_INVALID_INPUT && err && strstr(err, "input 'timestamp'"));
    free(err);
    err = NULL;
    fail_vasprintf = 1;
    got = turn_input_accept(cfg, 1, &in, done_cb, NULL, &st, &err);
    fail_vasprintf = 0;
    CHECK(!got && st == PARLEY_ERR_NO_MEMORY);
    free(err);
    err = NULL;
    const char *message = "{\"conversation_id\":\"c\",\"content\":\"x\",\"timestamp\":\"soon\"}";
    got = turn_append_accept(cfg, 1, message, done_cb, NULL, &st, &err);
    CHECK(!got && st == PARLEY_ERR_INVALID_INPUT && err &&
          strstr(err, "message_json 'timestamp'"));
    free(err);
    err = NULL;
    fail_vasprintf = 1;
    got = turn_append_accept(cfg, 1, message, done_cb, NULL, &st, &err);
    fail_vasprintf = 0;
    CHECK(!got && st == PARLEY_ERR_NO_MEMORY);
    CHECK_STR(err, "out of memory");
    free(err);
}

/* Every reader refuses an unknown key in one shape, listing what it reads (lib/json_keys.h). */
static void test_unknown_keys(agent_config *cfg)
{
    selector sel;
    char *err = NULL;
    CHECK(selector_parse("{\"conversation_id\":\"c\",\"colour\":1}", 0, &sel, &err) ==
          PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "selector: unknown key \"colour\" (expected conversation_id, interface_type, "
                   "persona)");
    CHECK_STR(sel.bad_key, "selector");
    free(err);
    err = NULL;
    CHECK(selector_parse("{\"colour\":1}", SELECTOR_INTERFACE_MESSAGE_ID, &sel, &err) ==
          PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "selector: unknown key \"colour\" (expected conversation_id, interface_type, "
                   "persona, interface_message_id)");
    free(err);

    parley_status st = PARLEY_OK;
    err = NULL;
    const char *message = "{\"conversation_id\":\"c\",\"content\":\"x\",\"colour\":1}";
    turn *t = turn_append_accept(cfg, 1, message, done_cb, NULL, &st, &err);
    CHECK(t == NULL && st == PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "message_json: unknown key \"colour\" (expected conversation_id, content, role, "
                   "interface_type, persona, interface_message_id, metadata, timestamp)");
    free(err);
    turn_free(t);

    /* a role or a time with a NUL inside is refused, not read up to the NUL (the message is
       read with JSON_ALLOW_NUL) */
    static const struct {
        const char *message, *field;
    } nul[] = {
        {"{\"conversation_id\":\"c\",\"content\":\"x\",\"role\":\"user\\u0000x\"}",
         "message_json 'role'"},
        {"{\"conversation_id\":\"c\",\"content\":\"x\",\"timestamp\":"
         "\"2026-11-22T19:31:00Z\\u0000x\"}",
         "message_json 'timestamp'"},
    };
    for (size_t i = 0; i < sizeof nul / sizeof nul[0]; i++) {
        err = NULL;
        t = turn_append_accept(cfg, 1, nul[i].message, done_cb, NULL, &st, &err);
        CHECK(t == NULL && st == PARLEY_ERR_INVALID_INPUT && err && strstr(err, nul[i].field));
        free(err);
        turn_free(t);
    }

    err = NULL;
    t = accept_input(cfg, (fields){"c", NULL, NULL, "{\"colour\":\"x\"}"}, &st, &err);
    CHECK(t == NULL && st == PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "input 'reply_to_json': unknown key \"colour\" (expected turn_id, "
                   "interface_message_id)");
    free(err);
    turn_free(t);
}

/* A field's JSON that jansson cannot read is refused in a message that is UTF-8: jansson's
   own text quotes the input near the error one byte at a time, here half of "é". */
static void test_parse_error_is_utf8(agent_config *cfg)
{
    const char *bad = "{\"a\":\"\\\xc3\xa9\"}"; /* {"a":"\é"}: an invalid escape */
    static const char *const names[] = {"context_json", "metadata_json", "tools_json",
                                        "response_format_json", "images_json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        parley_input in = {.struct_size = sizeof in, .text = "hello", .conversation_id = "c"};
        const char **field[] = {&in.context_json, &in.metadata_json, &in.tools_json,
                                &in.response_format_json, &in.images_json};
        *field[i] = bad;
        parley_status st = PARLEY_OK;
        char *err = NULL;
        turn *t = turn_input_accept(cfg, 1, &in, done_cb, NULL, &st, &err);
        CHECK(!t && st == PARLEY_ERR_INVALID_INPUT && err && strstr(err, names[i]));
        CHECK(err && utf8_valid(err, strlen(err)) && strstr(err, "invalid escape"));
        if (err && !utf8_valid(err, strlen(err)))
            fprintf(stderr, "  %s: not UTF-8: %s\n", names[i], err);
        free(err);
        turn_free(t);
    }
}

int main(void)
{
    char *err = NULL;
    parley_status cfg_st;
    agent_config *cfg = config_new("{\"model\":\"m\",\"max_input_bytes\":200}", &cfg_st, &err);
    CHECK(cfg != NULL && cfg_st == PARLEY_OK);
    if (!cfg) {
        fprintf(stderr, "config: %s\n", err);
        return check_report();
    }
    const char *uuid = "5D0C2A4E-1F2B-4C3D-8E9F-0A1B2C3D4E5F";

    /* good values are kept: metadata compacted, a turn id in lower case */
    turn *t = check_accepted(cfg, (fields){"c", "{ \"from\" : \"anna\", \"n\": [1, 2] }",
                                           "tg-42", NULL});
    if (t) {
        CHECK_STR(t->in.metadata, "{\"from\":\"anna\",\"n\":[1,2]}");
        CHECK_STR(t->in.interface_message_id, "tg-42");
        CHECK(!reply_context_wanted(&t->in.reply));
        CHECK(reply_outcome_name(t->in.reply.outcome) == NULL);
    }
    turn_free(t);
    char reply_by_id[128];
    snprintf(reply_by_id, sizeof reply_by_id, "{\"turn_id\":\"%s\"}", uuid);
    t = check_accepted(cfg, (fields){"c", NULL, NULL, reply_by_id});
    if (t) {
        CHECK_STR(t->in.reply.turn_id, "5d0c2a4e-1f2b-4c3d-8e9f-0a1b2c3d4e5f");
        CHECK(t->in.reply.interface_message_id == NULL);
    }
    turn_free(t);
    t = check_accepted(cfg, (fields){"c", NULL, NULL, "{\"interface_message_id\":\"tg-41\"}"});
    if (t) {
        CHECK_STR(t->in.reply.interface_message_id, "tg-41");
        CHECK(t->in.reply.turn_id == NULL);
    }
    turn_free(t);
    /* a stateless turn may carry metadata and an interface id (nothing is stored) */
    turn_free(check_accepted(cfg, (fields){NULL, "{}", "x", NULL}));

    /* metadata_json: a JSON object, within max_input_bytes */
    const char *bad_metadata[] = {"[]", "\"text\"", "42", "null", "{", "{\"a\":1,\"a\":2}", ""};
    for (size_t i = 0; i < sizeof bad_metadata / sizeof *bad_metadata; i++)
        check_refused(cfg, (fields){"c", bad_metadata[i], NULL, NULL}, "metadata_json");
    char big[300];
    memset(big, 'x', sizeof big);
    memcpy(big, "{\"k\":\"", 6);
    memcpy(big + sizeof big - 3, "\"}", 3);
    check_refused(cfg, (fields){"c", big, NULL, NULL}, "metadata_json");
    check_refused(cfg, (fields){"c", "{\"bad\":\"\xff\"}", NULL, NULL}, "metadata_json");

    /* interface_message_id: 1..256 bytes of UTF-8 */
    char long_id[STORE_MAX_INTERFACE_MESSAGE_ID + 2];
    memset(long_id, 'i', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    check_refused(cfg, (fields){"c", NULL, "", NULL}, "interface_message_id");
    check_refused(cfg, (fields){"c", NULL, long_id, NULL}, "interface_message_id");
    check_refused(cfg, (fields){"c", NULL, "\xc3(", NULL}, "interface_message_id");
    long_id[STORE_MAX_INTERFACE_MESSAGE_ID] = '\0'; /* exactly the most */
    turn_free(check_accepted(cfg, (fields){"c", NULL, long_id, NULL}));

    /* reply_to_json: exactly one of the two keys, each with a value of its form */
    char two_keys[160];
    snprintf(two_keys, sizeof two_keys, "{\"turn_id\":\"%s\",\"interface_message_id\":\"x\"}",
             uuid);
    const char *bad_reply[] = {"{}", "[]", "\"x\"", "{\"turn_id\":\"not-a-uuid\"}",
                               "{\"turn_id\":42}", "{\"interface_message_id\":\"\"}",
                               "{\"interface_message_id\":7}", "{\"message_id\":\"x\"}",
                               two_keys, "{\"turn_id\":\"5d0c2a4e-1f2b-4c3d-8e9f-0a1b2c3d4e5fa\"}",
                               "{"};
    for (size_t i = 0; i < sizeof bad_reply / sizeof *bad_reply; i++)
        check_refused(cfg, (fields){"c", NULL, NULL, bad_reply[i]}, "reply_to_json");
    /* a stateless turn has nothing to reply to */
    check_refused(cfg, (fields){NULL, NULL, NULL, reply_by_id}, "reply_to_json");

    /* an older host's struct ends before these fields: they are absent, not read */
    parley_input old = {.struct_size = offsetof(parley_input, metadata_json),
                        .text = "hello", .metadata_json = "not json"};
    parley_status st = PARLEY_ERR_INTERNAL;
    t = turn_input_accept(cfg, 2, &old, done_cb, NULL, &st, &err);
    CHECK(t && st == PARLEY_OK && !t->in.metadata);
    free(err);
    turn_free(t);

    /* reply_context_parse on its own */
    reply_context rc;
    err = NULL;
    CHECK(reply_context_parse("{\"interface_message_id\":\"m1\"}", &rc, &err) == PARLEY_OK);
    reply_context copy;
    CHECK(reply_context_copy_target(&copy, &rc) == 0);
    CHECK_STR(copy.interface_message_id, "m1");
    reply_context_free(&copy);
    reply_context_free(&rc);
    CHECK_STR(reply_outcome_name(REPLY_INCLUDED), "included");
    CHECK_STR(reply_outcome_name(REPLY_IN_WINDOW), "in_window");
    CHECK_STR(reply_outcome_name(REPLY_NOT_FOUND), "not_found");

    test_append_bad_utf8(cfg);
    test_unknown_keys(cfg);
    test_host_time(cfg);
    test_parse_error_is_utf8(cfg);
    /* a persona given through the ABI that is not UTF-8 is never quoted raw */
    parley_input bad_persona = {.struct_size = sizeof bad_persona, .text = "hello",
                                .conversation_id = "c", .persona = "k\xc3\x28\xff"};
    st = PARLEY_OK;
    err = NULL;
    t = turn_input_accept(cfg, 3, &bad_persona, done_cb, NULL, &st, &err);
    CHECK(!t && st == PARLEY_ERR_INVALID_INPUT);
    CHECK(err && utf8_valid(err, strlen(err)) && strstr(err, "\"k\\xC3(\\xFF\""));
    free(err);
    config_unref(cfg);
    return check_report();
}
