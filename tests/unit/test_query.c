/* test_query.c -- history_query's JSON: every filter read, every bad input named, cursors. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "api/agent_api.h"
#include "api/query.h"
#include "lib/rfc3339.h"

/* The field named when `json` is refused, or "ok". */
static const char *refused_field(const char *json)
{
    query_request r;
    const char *field = NULL;
    char *err = NULL;
    parley_status st = query_parse(json, &r, &field, &err);
    if (st == PARLEY_OK) {
        query_request_free(&r);
        return "ok";
    }
    CHECK(st == PARLEY_ERR_INVALID_INPUT && err && strstr(err, field) == err);
    CHECK(r.root == NULL);
    free(err);
    return field;
}

static void test_bad_input_names_the_field(void)
{
    CHECK_STR(refused_field("{}"), "ok");
    CHECK_STR(refused_field(NULL), "ok");
    CHECK_STR(refused_field("[1]"), "query");
    CHECK_STR(refused_field("{\"limit\":1,"), "query");
    CHECK_STR(refused_field("{\"colour\":1}"), "query");
    CHECK_STR(refused_field("{\"role\":\"robot\"}"), "role");
    CHECK_STR(refused_field("{\"role\":3}"), "role");
    CHECK_STR(refused_field("{\"limit\":0}"), "limit");
    CHECK_STR(refused_field("{\"limit\":10001}"), "limit");
    CHECK_STR(refused_field("{\"limit\":\"20\"}"), "limit");
    CHECK_STR(refused_field("{\"limit\":10000}"), "ok");
    CHECK_STR(refused_field("{\"since\":\"yesterday\"}"), "since");
    CHECK_STR(refused_field("{\"until\":\"2026-02-30T00:00:00Z\"}"), "until");
    CHECK_STR(refused_field("{\"since\":\"2026-11-22T19:31:00\"}"), "since"); /* no zone */
    CHECK_STR(refused_field("{\"since\":\"2026-11-23T00:00:00Z\",\"until\":\"2026-11-22T00:00:00Z\"}"),
              "since");
    CHECK_STR(refused_field("{\"since\":\"2026-11-22T00:00:00Z\",\"until\":\"2026-11-22T00:00:00Z\"}"),
              "ok");
    CHECK_STR(refused_field("{\"order\":\"random\"}"), "order");
    CHECK_STR(refused_field("{\"conversation_id\":\"\"}"), "conversation_id");
    char big[1200];
    snprintf(big, sizeof big, "{\"search\":\"%01100d\"}", 0);
    CHECK_STR(refused_field(big), "search");
    CHECK_STR(refused_field("{\"cursor\":\"abc\"}"), "cursor");
    CHECK_STR(refused_field("{\"search\":\"a\\u0000b\"}"), "search"); /* no NUL inside */
    /* nor in a word or a time: its start alone is not the value (fuzz_host_json) */
    CHECK_STR(refused_field("{\"role\":\"user\\u0000x\"}"), "role");
    CHECK_STR(refused_field("{\"order\":\"oldest\\u0000\"}"), "order");
    CHECK_STR(refused_field("{\"since\":\"2026-11-22T19:31:00Z\\u0000x\"}"), "since");
    CHECK_STR(refused_field("{\"until\":\"2026-11-22T19:31:00Z\\u0000\"}"), "until");
}

/* An unknown key is refused by the shared check, listing what a query reads. */
static void test_unknown_key_text(void)
{
    query_request r;
    const char *field = NULL;
    char *err = NULL;
    CHECK(query_parse("{\"limit\":5,\"colour\":1}", &r, &field, &err) ==
          PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(field, "query");
    CHECK_STR(err, "query: unknown key \"colour\" (expected conversation_id, interface_type, "
                   "persona, role, since, until, search, limit, order, cursor, turn_id, "
                   "interface_message_id)");
    free(err);
}

static void test_times(void)
{
    uint64_t ms = 0;
    CHECK(rfc3339_parse("1970-01-01T00:00:01Z", &ms) == 0 && ms == 1000);
    CHECK(rfc3339_parse("2026-11-22T19:31:00.123Z", &ms) == 0 && ms == 1795375860123ull);
    CHECK(rfc3339_parse("2026-11-22T20:31:00.123+01:00", &ms) == 0 && ms == 1795375860123ull);
    CHECK(rfc3339_parse("2024-02-29T00:00:00Z", &ms) == 0);
    CHECK(rfc3339_parse("2023-02-29T00:00:00Z", &ms) != 0);
    CHECK(rfc3339_parse("1969-12-31T23:59:59Z", &ms) != 0);
    CHECK(rfc3339_parse("2026-11-22T19:31:00.Z", &ms) != 0);
    CHECK(rfc3339_parse("2026-11-22T19:31:00Zjunk", &ms) != 0);
}

/* A cursor continues its own query only. */
static void test_cursor(void)
{
    query_request r;
    const char *field;
    char *err = NULL;
    CHECK(query_parse("{\"role\":\"user\",\"limit\":5}", &r, &field, &err) == PARLEY_OK);
    char *cursor = query_cursor(&r.q, 42);
    query_request_free(&r);

    char json[256];
    snprintf(json, sizeof json, "{\"role\":\"user\",\"limit\":9,\"cursor\":\"%s\"}", cursor);
    CHECK(query_parse(json, &r, &field, &err) == PARLEY_OK); /* limit may change */
    CHECK(r.q.after == 42);
    query_request_free(&r);
    snprintf(json, sizeof json, "{\"role\":\"assistant\",\"cursor\":\"%s\"}", cursor);
    CHECK_STR(refused_field(json), "cursor");
    snprintf(json, sizeof json, "{\"role\":\"user\",\"order\":\"oldest\",\"cursor\":\"%s\"}", cursor);
    CHECK_STR(refused_field(json), "cursor");

    /* Only the canonical text: the same fingerprint, the position written otherwise. */
    const char *fp = cursor + 3; /* "c1." */
    static const char *const forged[] = {"8000000000000000", "ffffffffffffffff", "00000000000000002a",
                                         "+2a", "0x2a", "2A", "02a", "0", "", "2a ", "-2a", " 2a",
                                         "12345678901234567"};
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        snprintf(json, sizeof json, "{\"role\":\"user\",\"cursor\":\"c1.%.16s.%s\"}", fp, forged[i]);
        CHECK_STR(refused_field(json), "cursor");
    }
    snprintf(json, sizeof json, "{\"role\":\"user\",\"cursor\":\"c1.%.16s.7fffffffffffffff\"}", fp);
    CHECK_STR(refused_field(json), "ok");
    char upper[64];
    snprintf(upper, sizeof upper, "C1.%.16s.2a", fp);
    snprintf(json, sizeof json, "{\"role\":\"user\",\"cursor\":\"%s\"}", upper);
    CHECK_STR(refused_field(json), "cursor");
    snprintf(json, sizeof json, "{\"role\":\"user\",\"cursor\":\"%s\\u0000x\"}", cursor);
    CHECK_STR(refused_field(json), "cursor");
    free(cursor);
}

/* The memory store with its queries taken out: the store door refuses such a
 * table once, at create, naming the method; no history function meets it. */
static store_backend bare;

static void test_store_without_queries(void)
{
    bare = store_memory_backend;
    bare.query = NULL;
    char *err = NULL;
    parley_agent *a = agent_create_with_store(
        NULL, "{\"base_url\":\"http://127.0.0.1:9/v1\",\"model\":\"m\"}", &bare, &err);
    CHECK(a == NULL);
    CHECK_STR(err, "option 'history_store': memory store backend: no query method");
    free(err);
    agent_destroy(a);
}

int main(void)
{
    test_store_without_queries();
    test_bad_input_names_the_field();
    test_unknown_key_text();
    test_times();
    test_cursor();
    return check_report();
}
