/*
 * test_store_query.c -- the store's query and per-message reads (store.h
 * version 3), run against every backend in `backends`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/check.h"
#include "redis_server.h"
#include "store/store.h"
#include "store/store_json.h"

static const store_backend *const backends[] = {&store_memory_backend, &store_sqlite_backend,
                                                &store_redis_backend};

static redis_server redis; /* a real redis-server; each store gets its own key prefix */

static char tmpdir[] = "/tmp/parley-query-test-XXXXXX";
static unsigned files;

/* A fresh store: memory, a new SQLite file in tmpdir, or a new key prefix on Redis. */
static store *open_store(const store_backend *b, size_t keep_turns, uint64_t idle_ms)
{
    char path[128] = "", prefix[32];
    snprintf(prefix, sizeof prefix, "q%u:", files);
    if (b == &store_sqlite_backend)
        snprintf(path, sizeof path, "%s/q%u.db", tmpdir, files);
    if (b == &store_redis_backend)
        snprintf(path, sizeof path, "//127.0.0.1:%d", redis.port);
    files++;
    store_config cfg = {.location = path, .limits = {keep_turns, 1000, idle_ms},
                        .key_prefix = prefix};
    store *s = NULL;
    char *err = NULL;
    if (b->open(&cfg, &s, &err) != PARLEY_OK) {
        fprintf(stderr, "open %s: %s\n", b->scheme, err ? err : "?");
        exit(2);
    }
    return s;
}

static void id_for(unsigned n, char out[37])
{
    snprintf(out, 37, "%08u-0000-4000-8000-%012u", n, n); /* decimal digits: valid hex too */
}

/* One turn of `n` messages (roles and texts given), created at t, t+1, ... */
static void put_turn(store *s, const char *conv, const char *iface, unsigned turn_no,
                     uint64_t t, size_t n, const char *const roles[], const char *const texts[])
{
    char tid[37], mids[8][37];
    store_message msgs[8];
    id_for(turn_no, tid);
    for (size_t i = 0; i < n; i++) {
        id_for(turn_no * 100 + (unsigned)i + 1, mids[i]);
        msgs[i] = (store_message){.message_id = mids[i], .role = roles[i], .created_ms = t + i,
                                  .json = texts[i], .json_len = strlen(texts[i])};
    }
    store_turn turn = {.turn_id = tid, .started_ms = t, .finished_ms = t + n, .messages = msgs,
                       .nmessages = n};
    store_key key = {conv, "", iface};
    char *err = NULL;
    CHECK(store_append(s, &key, &turn, t + n, &err) == PARLEY_OK);
    free(err);
}

typedef struct result {
    char *json;   /* "m1,m2" */
    size_t count;
    uint64_t last;
    int more;
} result;

static result run(store *s, store_query q)
{
    if (!q.limit)
        q.limit = 100;
    if (!q.until_ms)
        q.until_ms = UINT64_MAX;
    result r = {0};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    CHECK(store_query_run(s, &q, 5000, &b, &r.count, &r.last, &r.more, &err) == PARLEY_OK);
    free(err);
    r.json = pbuf_take(&b);
    pbuf_free(&b);
    if (!r.json)
        r.json = strdup("");
    return r;
}

/* The message ids of a result, as their last 3 hex digits: "101 102 201". */
static char *ids_of(const char *json)
{
    pbuf b = PBUF_INIT;
    for (const char *p = json; (p = strstr(p, "\"message_id\":\"")); p += 14) {
        if (b.len)
            pbuf_putc(&b, ' ');
        pbuf_append(&b, p + 14 + 33, 3);
    }
    char *s = pbuf_take(&b);
    pbuf_free(&b);
    return s ? s : strdup("");
}

static void check_ids(store *s, store_query q, const char *want)
{
    result r = run(s, q);
    char *got = ids_of(r.json);
    CHECK_STR(got, want);
    free(got);
    free(r.json);
}

static const char *const UA[] = {"user", "assistant"};
static const char *const UTA[] = {"user", "assistant", "tool", "assistant"};

static store *fixture(const store_backend *b)
{
    store *s = open_store(b, 0, 0);
    put_turn(s, "kitchen", "", 1, 1000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"Turn on the LIGHTS\"}",
                                   "{\"role\":\"assistant\",\"content\":\"Done.\"}"});
    put_turn(s, "kitchen", "telegram", 2, 2000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"Is the \\\"washer\\\"\\ndone?\"}",
                                   "{\"role\":\"assistant\",\"content\":\"Caf\\u00e9 lights are on\"}"});
    put_turn(s, "garage", "web", 3, 3000, 4, UTA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"open the door\"}",
                                   "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"lights\",\"arguments\":\"{\\\"content\\\":\\\"lights\\\"}\"}}]}",
                                   "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"ok\"}",
                                   "{\"role\":\"assistant\",\"content\":\"The door is open.\"}"});
    put_turn(s, "kitchen", "", 4, 4000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"and the oven?\"}",
                                   "{\"role\":\"assistant\",\"content\":\"Off.\"}"});
    return s;
}

static void test_filters(const store_backend *b)
{
    store *s = fixture(b);
    check_ids(s, (store_query){.newest_first = 0}, "101 102 201 202 301 302 303 304 401 402");
    check_ids(s, (store_query){.newest_first = 1}, "402 401 304 303 302 301 202 201 102 101");
    /* conversation_id alone: every interface; with interface_type: one conversation */
    check_ids(s, (store_query){.conversation_id = "kitchen"}, "101 102 201 202 401 402");
    check_ids(s, (store_query){.conversation_id = "kitchen", .interface_type = "",
                               .persona = ""}, "101 102 401 402");
    check_ids(s, (store_query){.conversation_id = "kitchen", .interface_type = "telegram",
                               .persona = ""}, "201 202");
    check_ids(s, (store_query){.interface_type = "web"}, "301 302 303 304");
    check_ids(s, (store_query){.conversation_id = "nowhere"}, "");
    check_ids(s, (store_query){.role = "tool"}, "303");
    check_ids(s, (store_query){.role = "user", .newest_first = 1}, "401 301 201 101");
    /* since/until are inclusive, on each message's own time */
    check_ids(s, (store_query){.since_ms = 2001, .until_ms = 3001}, "202 301 302");
    /* search: ASCII-case-insensitive, in the string content only, JSON escapes decoded */
    check_ids(s, (store_query){.search = "lights"}, "101 202");
    check_ids(s, (store_query){.search = "\"WASHER\"\nDONE"}, "201");
    check_ids(s, (store_query){.search = "caf\xc3\xa9"}, "202");
    check_ids(s, (store_query){.search = "role"}, "");
    check_ids(s, (store_query){.search = "n"}, "101 102 201 202 301 304 401");
    check_ids(s, (store_query){.search = "door", .role = "assistant"}, "304");
    store_close(s);
}

static void test_exact_message_json(const store_backend *b)
{
    store *s = fixture(b);
    result r = run(s, (store_query){.role = "tool"});
    const char *want =
        "{\"message_id\":\"00000303-0000-4000-8000-000000000303\",\"conversation_id\":\"garage\","
        "\"interface_type\":\"web\",\"persona\":\"\","
        "\"turn_id\":\"00000003-0000-4000-8000-000000000003\",\"role\":\"tool\","
        "\"created_at\":\"1970-01-01T00:00:03.002Z\","
        "\"message\":{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"ok\"}}";
    CHECK_STR(r.json, want);
    CHECK(r.count == 1 && r.more == 0);
    /* the same object by id */
    pbuf g = PBUF_INIT;
    char *err = NULL;
    CHECK(store_get_message(s, "00000303-0000-4000-8000-000000000303", 5000, &g, &err) ==
          PARLEY_OK);
    char *got = pbuf_take(&g);
    CHECK_STR(got, want);
    free(got);
    pbuf_free(&g);
    CHECK(store_get_message(s, "00009999-0000-4000-8000-000000009999", 5000, &g, &err) ==
          PARLEY_ERR_NOT_FOUND);
    CHECK(store_get_message(s, "not a uuid", 5000, &g, &err) == PARLEY_ERR_NOT_FOUND);
    CHECK(g.len == 0);
    free(err);
    pbuf_free(&g);
    free(r.json);
    store_close(s);
}

/* Pages of 3, both orders: every message once, in order, then no cursor. */
static void test_paging(const store_backend *b)
{
    store *s = fixture(b);
    for (int newest = 0; newest <= 1; newest++) {
        store_query q = {.limit = 3, .newest_first = newest};
        pbuf all = PBUF_INIT;
        int pages = 0;
        for (;;) {
            result r = run(s, q);
            char *ids = ids_of(r.json);
            if (all.len && *ids)
                pbuf_putc(&all, ' ');
            pbuf_puts(&all, ids);
            free(ids);
            free(r.json);
            pages++;
            if (!r.more)
                break;
            CHECK(r.count == 3);
            q.after = r.last;
        }
        char *got = pbuf_take(&all);
        CHECK_STR(got, newest ? "402 401 304 303 302 301 202 201 102 101"
                              : "101 102 201 202 301 302 303 304 401 402");
        CHECK(pages == 4);
        free(got);
        pbuf_free(&all);
    }
    /* exactly `limit` matches left: no further page */
    result r = run(s, (store_query){.role = "user", .limit = 4});
    CHECK(r.count == 4 && r.more == 0);
    free(r.json);
    store_close(s);
}

/* Trimmed turns and idle conversations are not found. */
static void test_forgotten_not_found(const store_backend *b)
{
    store *s = open_store(b, 1, 0);
    put_turn(s, "c", "", 1, 1000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"a\"}",
                                   "{\"role\":\"assistant\",\"content\":\"b\"}"});
    put_turn(s, "c", "", 2, 2000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"c\"}",
                                   "{\"role\":\"assistant\",\"content\":\"d\"}"});
    check_ids(s, (store_query){0}, "201 202");
    pbuf g = PBUF_INIT;
    char *err = NULL;
    CHECK(store_get_message(s, "00000101-0000-4000-8000-000000000101", 5000, &g, &err) ==
          PARLEY_ERR_NOT_FOUND);
    store_close(s);

    s = open_store(b, 0, 1000); /* idle after 1 s */
    put_turn(s, "old", "", 1, 1000, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"a\"}",
                                   "{\"role\":\"assistant\",\"content\":\"b\"}"});
    put_turn(s, "new", "", 2, 4500, 2, UA,
             (const char *const[]){"{\"role\":\"user\",\"content\":\"c\"}",
                                   "{\"role\":\"assistant\",\"content\":\"d\"}"});
    check_ids(s, (store_query){0}, "201 202"); /* at 5000 "old" is idle */
    CHECK(store_get_message(s, "00000101-0000-4000-8000-000000000101", 5000, &g, &err) ==
          PARLEY_ERR_NOT_FOUND);
    free(err);
    pbuf_free(&g);
    store_close(s);
}

/* SQLite: closed and opened again, every id, time, interface and position is the same. */
static void test_reopen_keeps_everything(void)
{
    store *s = fixture(&store_sqlite_backend);
    char path[128];
    snprintf(path, sizeof path, "%s/q%u.db", tmpdir, files - 1);
    result before = run(s, (store_query){.limit = 4, .newest_first = 1});
    store_close(s);
    store_config cfg = {.location = path, .limits = {0, 1000, 0}};
    char *err = NULL;
    CHECK(store_open(&store_sqlite_backend, &cfg, &s, &err) == PARLEY_OK);
    free(err);
    result after = run(s, (store_query){.limit = 4, .newest_first = 1});
    CHECK_STR(after.json, before.json);
    CHECK(after.last == before.last && after.more == 1);
    check_ids(s, (store_query){.after = before.last, .newest_first = 1},
              "302 301 202 201 102 101");
    check_ids(s, (store_query){.interface_type = "telegram"}, "201 202");
    free(before.json);
    free(after.json);
    store_close(s);
}

static void test_content_matches(void)
{
    CHECK(store_json_content_matches("{\"content\":\"Hello\"}", 19, "hELLo"));
    CHECK(!store_json_content_matches("{\"content\":\"Hello\"}", 19, "Hello!"));
    CHECK(!store_json_content_matches("{\"content\":null}", 16, "null"));
    /* a match never starts inside an escape: "\n" holds no "n" */
    CHECK(!store_json_content_matches("{\"content\":\"a\\nb\"}", 18, "n"));
    CHECK(store_json_content_matches("{\"content\":\"a\\nb\"}", 18, "a\nb"));
    CHECK(store_json_content_matches("{\"content\":\"\\ud83d\\ude00!\"}", 27, "\xf0\x9f\x98\x80!"));
    CHECK(store_json_content_matches("{\"content\":\"x\"}", 15, ""));
    /* without escapes (the memchr path): ends, both cases, a match that would not fit */
    const char *plain = "{\"content\":\"abcXyZ\"}";
    CHECK(store_json_content_matches(plain, strlen(plain), "xyz"));
    CHECK(store_json_content_matches(plain, strlen(plain), "Z"));
    CHECK(store_json_content_matches(plain, strlen(plain), "ABCxyz"));
    CHECK(!store_json_content_matches(plain, strlen(plain), "yzz"));
    CHECK(!store_json_content_matches(plain, strlen(plain), "abcxyz!"));
    CHECK(!store_json_content_matches(plain, strlen(plain), "\""));
}

/* What a read accepts as stored messages: objects joined by ',' (store_json.h). */
static void test_object_list(void)
{
    static const struct {
        const char *text;
        long n;
    } cases[] = {
        {"{\"role\":\"user\",\"content\":\"x\"}", 1},
        {"{\"a\":1},{\"b\":[1,{\"c\":\"},{\"}]}", 2},
        {"{\"a\":1},{\"b\":2},", 2},                      /* load()'s trailing ',' */
        {"{\"a\":\"\\u0000\"}", 1},                       /* left to jansson, still fine */
        {"{\"a\":123456789012345678901234}", 1},          /* the same */
        {"{\"role\":\"user\",\"content\":\"x\"}],\"injected\":[{", -1},
        {"{\"a\":1}]", -1},
        {"{\"a\":1} x", -1},
        {"[{\"a\":1}]", -1},
        {"\"text\"", -1},
        {"{\"a\":1},,{\"b\":2}", -1},
        {",", -1},
        {"", -1},
        {"{\"a\":\"\xc3\"}", -1},                         /* invalid UTF-8 */
        {"{\"a\":1},5", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long n = store_json_object_list(cases[i].text, strlen(cases[i].text));
        CHECK(n == cases[i].n);
        if (n != cases[i].n)
            fprintf(stderr, "  %s: %ld, expected %ld\n", cases[i].text, n, cases[i].n);
    }
    char *err = NULL;
    CHECK(store_json_damaged("sqlite store f.db", "k\xff\x01" "che", 6, &err) == PARLEY_ERR_STORAGE);
    CHECK_STR(err, "sqlite store f.db: conversation 'k\\xFF\\x01che' holds a damaged message (not "
                   "a JSON object); clear the conversation");
    free(err);
}

int main(void)
{
    test_object_list();
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    if (redis_server_start(&redis, NULL) != 0)
        return 2;
    test_content_matches();
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        fprintf(stderr, "backend %s\n", backends[i]->scheme);
        test_filters(backends[i]);
        test_exact_message_json(backends[i]);
        test_paging(backends[i]);
        test_forgotten_not_found(backends[i]);
    }
    test_reopen_keeps_everything();
    redis_server_stop(&redis);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_report();
}
