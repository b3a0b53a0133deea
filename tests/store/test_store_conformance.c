/*
 * test_store_conformance.c -- ONE suite of semantic checks run against every
 * store backend through the store_backend table (store.h), so that every
 * backend keeps the same promises: what load() appends, what the dumps show
 * (byte for byte the same across backends), what is kept and forgotten.
 * Then the durable backends' own promises: a reopened store holds
 * everything; a file that is not a store is refused and left unmodified; a
 * store in use is refused; a failing disk fails the append and nothing else.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/check.h"
#include "fault_vfs.h"
#include "redis_server.h"
#include "store/store.h"

/* ---- the backends under test ---- */

typedef struct backend_case {
    const store_backend *backend;
    int durable; /* keeps its content across close/open at the same location */
    int shared;  /* a server every store opens (redis): each test starts it empty */
} backend_case;

static const backend_case backends[] = {
    {&store_memory_backend, 0, 0},
    {&store_sqlite_backend, 1, 0},
    {&store_redis_backend, 0, 1},
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

/* Does the backend have store.h version 4 (message identity: its three
 * functions, the lifetime in its dumps)?  Until it does, its v4 checks are
 * skipped, and the run says so. */
static int has_v4(const backend_case *bc)
{
    const store_backend *b = bc->backend;
    return b->set_interface_message_id && b->find_message && b->load_turn;
}

static char tmpdir[] = "/tmp/parley-store-test-XXXXXX";
static unsigned file_counter;

static redis_server redis; /* a real redis-server for the shared backend */

/* A fresh location for a backend: a new file for durable ones. */
static char *fresh_location(const backend_case *bc)
{
    if (bc->shared) /* what follows "redis:" */
        return pstr_printf("//:%s@127.0.0.1:%d", redis.password, redis.port);
    if (!bc->durable)
        return strdup("");
    return pstr_printf("%s/store-%u.db", tmpdir, ++file_counter);
}

typedef struct harness {
    const backend_case *bc;
    char *location;
    store_limits limits;
    store *s;
} harness;

static store *open_at(const backend_case *bc, const char *location, store_limits limits,
                      char **err)
{
    store_config cfg = {.location = location, .limits = limits};
    store *s = NULL;
    parley_status st = bc->backend->open(&cfg, &s, err);
    return st == PARLEY_OK ? s : NULL;
}

static harness start(const backend_case *bc, size_t keep_turns, size_t max_conversations,
                     uint64_t idle_timeout_ms)
{
    harness h = {bc, fresh_location(bc), {keep_turns, max_conversations, idle_timeout_ms}, NULL};
    char *err = NULL;
    h.s = open_at(bc, h.location, h.limits, &err);
    if (!h.s)
        fprintf(stderr, "open %s failed: %s\n", bc->backend->scheme, err ? err : "?");
    free(err);
    CHECK(h.s != NULL);
    if (h.s && bc->shared) /* what the previous test left on the server */
        CHECK(bc->backend->forget(h.s, NULL, NULL) == PARLEY_OK);
    return h;
}

static void stop(harness *h)
{
    if (h->s)
        h->bc->backend->close(h->s);
    h->s = NULL;
    free(h->location);
}

/* Close and open the same location again (durable backends). */
static void reopen(harness *h)
{
    h->bc->backend->close(h->s);
    char *err = NULL;
    h->s = open_at(h->bc, h->location, h->limits, &err);
    if (!h->s)
        fprintf(stderr, "reopen failed: %s\n", err ? err : "?");
    free(err);
    CHECK(h->s != NULL);
}

/* ---- appending ---- */

#define USER(text) "{\"role\":\"user\",\"content\":\"" text "\"}"
#define ASSISTANT(text) "{\"role\":\"assistant\",\"content\":\"" text "\"}"
#define TOOL_CALL(id)                                                                          \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"" id "\",\"type\":"   \
    "\"function\",\"function\":{\"name\":\"HassTurnOn\",\"arguments\":\"{\\\"name\\\":"       \
    "\\\"kitchen\\\"}\"}}]}"
#define TOOL_RESULT(id) "{\"role\":\"tool\",\"tool_call_id\":\"" id "\",\"content\":\"ok\"}"

static void turn_id_for(unsigned n, char out[37])
{
    snprintf(out, 37, "%08x-0000-4000-8000-%012x", n, n);
}

static const char *role_of(const char *json)
{
    if (strstr(json, "\"role\":\"user\""))
        return "user";
    if (strstr(json, "\"role\":\"tool\""))
        return "tool";
    return "assistant";
}

/* Append turn `turn_no` to conversation `id` (under persona/interface) at now_ms;
 * `messages` are the turn's message objects separated by '\n'. */
static parley_status append_keyed(harness *h, const char *persona, const char *iface,
                                  const char *id, unsigned turn_no, const char *messages,
                                  uint64_t now_ms, char **err)
{
    char tid[37], mids[16][37];
    turn_id_for(turn_no, tid);
    store_message msgs[16];
    size_t n = 0;
    const char *p = messages;
    while (*p && n < 16) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(mids[n], 37, "%08x-1111-4000-8000-%012zx", turn_no, n);
        msgs[n] = (store_message){mids[n], NULL, now_ms - 10 + n, p, len, NULL, NULL, 0};
        char role_probe[64];
        snprintf(role_probe, sizeof role_probe, "%.*s", (int)(len < 60 ? len : 60), p);
        msgs[n].role = role_of(role_probe);
        n++;
        p = end ? end + 1 : p + len;
    }
    store_turn turn = {tid, now_ms > 500 ? now_ms - 500 : 0, now_ms, msgs, n};
    store_key key = {id, persona, iface};
    return h->bc->backend->append(h->s, &key, &turn, now_ms, err);
}

static int append_at(harness *h, const char *id, unsigned turn_no, const char *messages,
                     uint64_t now_ms)
{
    char *err = NULL;
    parley_status st = append_keyed(h, "", "", id, turn_no, messages, now_ms, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "append failed: %s\n", err ? err : "?");
    free(err);
    return st == PARLEY_OK ? 0 : -1;
}

/* ---- reading ---- */

static char *load(harness *h, const char *id, size_t last_turns, uint64_t now_ms, size_t *count)
{
    store_key key = {id, "", ""};
    pbuf b = PBUF_INIT;
    size_t n = 99;
    char *err = NULL;
    parley_status st = h->bc->backend->load(h->s, &key, last_turns, now_ms, &b, &n, &err);
    CHECK(st == PARLEY_OK);
    free(err);
    if (count)
        *count = n;
    return pbuf_take(&b);
}

static char *dump_conversation_keyed(harness *h, const char *persona, const char *iface,
                                     const char *id, uint64_t now_ms)
{
    store_key key = {id, persona, iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = h->bc->backend->get_conversation(h->s, &key, now_ms, &b, &err);
    free(err);
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static char *dump_conversation(harness *h, const char *id, uint64_t now_ms)
{
    return dump_conversation_keyed(h, "", "", id, now_ms);
}

static char *dump_turn(harness *h, unsigned turn_no, uint64_t now_ms)
{
    char tid[37];
    turn_id_for(turn_no, tid);
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = h->bc->backend->get_turn(h->s, tid, now_ms, &b, &err);
    free(err);
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static int turn_exists(harness *h, unsigned turn_no, uint64_t now_ms)
{
    char *t = dump_turn(h, turn_no, now_ms);
    free(t);
    return t != NULL;
}

static char *dump_list(harness *h, uint64_t now_ms)
{
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = h->bc->backend->list(h->s, now_ms, &b, &err);
    CHECK(st == PARLEY_OK);
    free(err);
    return pbuf_take(&b);
}

static char *listed_ids(harness *h, uint64_t now_ms)
{
    char *text = dump_list(h, now_ms);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    pbuf ids = PBUF_INIT;
    json_t *all = json_object_get(root, "conversations");
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t *id = json_object_get(json_array_get(all, i), "conversation_id");
        if (i)
            pbuf_putc(&ids, ' ');
        pbuf_puts(&ids, json_is_string(id) ? json_string_value(id) : "?");
    }
    json_decref(root);
    return pbuf_take(&ids);
}

static store_stats stats_of(harness *h)
{
    store_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK(h->bc->backend->stats(h->s, &s, NULL) == PARLEY_OK);
    return s;
}

static parley_status forget(harness *h, const char *id)
{
    store_key key = {id, "", ""};
    char *err = NULL;
    parley_status st = h->bc->backend->forget(h->s, id ? &key : NULL, &err);
    free(err);
    return st;
}

static size_t expire(harness *h, uint64_t now_ms)
{
    size_t n = 999;
    char *err = NULL;
    CHECK(h->bc->backend->expire(h->s, now_ms, &n, &err) == PARLEY_OK);
    if (err)
        fprintf(stderr, "expire: %s\n", err);
    free(err);
    return n;
}

/* Everything observable: list, every conversation, stats (at time 0: never idle). */
static char *snapshot(harness *h)
{
    pbuf b = PBUF_INIT;
    char *list = dump_list(h, 0);
    pbuf_puts(&b, list);
    json_t *root = json_loads(list, 0, NULL);
    json_t *all = json_object_get(root, "conversations");
    for (size_t i = 0; i < json_array_size(all); i++) {
        const char *id =
            json_string_value(json_object_get(json_array_get(all, i), "conversation_id"));
        char *conv = id ? dump_conversation(h, id, 0) : NULL;
        pbuf_printf(&b, "\n%s", conv ? conv : "(missing)");
        free(conv);
    }
    store_stats s = stats_of(h);
    pbuf_printf(&b, "\n%zu %zu %zu", s.conversations, s.turns, s.message_bytes);
    json_decref(root);
    free(list);
    return pbuf_take(&b);
}

/* ---- the semantic checks, for every backend ---- */

#define TURN1 USER("turn on the kitchen") "\n" TOOL_CALL("call_1") "\n" TOOL_RESULT("call_1") \
    "\n" ASSISTANT("done")
#define TURN1_JOINED USER("turn on the kitchen") "," TOOL_CALL("call_1") ","                  \
    TOOL_RESULT("call_1") "," ASSISTANT("done")

static void test_unknown(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    store_key key = {"nobody", "", ""};
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "[");
    size_t n = 99;
    CHECK(bc->backend->load(h.s, &key, 0, 1000, &b, &n, NULL) == PARLEY_OK);
    CHECK(n == 0);
    CHECK_STR(b.data, "[");
    CHECK(bc->backend->get_conversation(h.s, &key, 1000, &b, NULL) == PARLEY_ERR_NOT_FOUND);
    CHECK(bc->backend->get_turn(h.s, "00000000-0000-4000-8000-000000000000", 1000, &b, NULL) ==
          PARLEY_ERR_NOT_FOUND);
    CHECK_STR(b.data, "["); /* nothing appended on NOT_FOUND */
    pbuf_free(&b);
    CHECK(forget(&h, "nobody") == PARLEY_ERR_NOT_FOUND);
    char *list = dump_list(&h, 1000);
    CHECK_STR(list, "{\"conversations\":[]}");
    free(list);
    store_stats s = stats_of(&h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0);
    stop(&h);
}

static void test_append_load_last_n(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    CHECK(append_at(&h, "c1", 1, TURN1, 1000) == 0);
    CHECK(append_at(&h, "c1", 2, USER("thanks") "\n" ASSISTANT("welcome"), 2000) == 0);
    CHECK(append_at(&h, "c1", 3, USER("bye"), 3000) == 0);
    size_t n = 0;
    char *all = load(&h, "c1", 0, 3500, &n);
    CHECK_STR(all, TURN1_JOINED "," USER("thanks") "," ASSISTANT("welcome") "," USER("bye") ",");
    CHECK(n == 7);
    free(all);
    char *last2 = load(&h, "c1", 2, 3500, &n);
    CHECK_STR(last2, USER("thanks") "," ASSISTANT("welcome") "," USER("bye") ",");
    CHECK(n == 3);
    free(last2);
    char *last1 = load(&h, "c1", 1, 3500, &n);
    CHECK_STR(last1, USER("bye") ",");
    CHECK(n == 1);
    free(last1);
    char *more = load(&h, "c1", 50, 3500, &n); /* more than there are: all */
    CHECK(n == 7);
    free(more);
    /* The caller's earlier bytes stay. */
    store_key key = {"c1", "", ""};
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "[{\"role\":\"system\",\"content\":\"sys\"},");
    CHECK(bc->backend->load(h.s, &key, 1, 3500, &b, &n, NULL) == PARLEY_OK);
    CHECK_STR(b.data, "[{\"role\":\"system\",\"content\":\"sys\"}," USER("bye") ",");
    pbuf_free(&b);
    store_stats s = stats_of(&h);
    CHECK(s.conversations == 1 && s.turns == 3);
    CHECK(s.message_bytes == strlen(TURN1_JOINED) +
                                 strlen(USER("thanks") "," ASSISTANT("welcome")) +
                                 strlen(USER("bye")));
    stop(&h);
}

static void test_keep_turns_trims_whole_turns(const backend_case *bc)
{
    harness h = start(bc, 3, 10, 0);
    const char *turns[5] = {
        USER("one"),
        USER("two") "\n" TOOL_CALL("c2") "\n" TOOL_RESULT("c2") "\n" ASSISTANT("two done"),
        USER("three") "\n" ASSISTANT("three done"),
        USER("four") "\n" TOOL_CALL("c4") "\n" TOOL_RESULT("c4") "\n" ASSISTANT("four done"),
        USER("five") "\n" ASSISTANT("five done"),
    };
    for (unsigned i = 0; i < 5; i++)
        CHECK(append_at(&h, "c", i + 1, turns[i], 1000 + i) == 0);
    size_t n = 0;
    char *text = load(&h, "c", 0, 2000, &n);
    CHECK_STR(text, USER("three") "," ASSISTANT("three done") "," USER("four") "," TOOL_CALL("c4")
                        "," TOOL_RESULT("c4") "," ASSISTANT("four done") "," USER("five") ","
                            ASSISTANT("five done") ",");
    CHECK(n == 8);
    free(text);
    CHECK(!turn_exists(&h, 1, 2000) && !turn_exists(&h, 2, 2000));
    CHECK(turn_exists(&h, 3, 2000) && turn_exists(&h, 5, 2000));
    store_stats s = stats_of(&h);
    CHECK(s.turns == 3);
    CHECK(s.message_bytes == strlen(USER("three") "," ASSISTANT("three done")) +
                                 strlen(USER("four") "," TOOL_CALL("c4") "," TOOL_RESULT("c4")
                                            "," ASSISTANT("four done")) +
                                 strlen(USER("five") "," ASSISTANT("five done")));
    stop(&h);
}

static void test_idempotent_append(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    CHECK(append_at(&h, "a", 1, USER("first"), 1000) == 0);
    char *before = snapshot(&h);
    CHECK(append_at(&h, "a", 1, USER("first"), 2000) == 0); /* a retry */
    CHECK(append_at(&h, "b", 1, USER("elsewhere"), 3000) == 0); /* same id, other conversation */
    char *after = snapshot(&h);
    CHECK_STR(after, before); /* no duplicate, no new conversation, not even last_used */
    free(before);
    free(after);
    size_t n = 0;
    free(load(&h, "a", 0, 3000, &n));
    CHECK(n == 1);
    stop(&h);
}

static void test_lru_eviction(const backend_case *bc)
{
    harness h = start(bc, 0, 3, 0);
    append_at(&h, "a", 1, USER("a"), 100);
    append_at(&h, "b", 2, USER("b"), 200);
    append_at(&h, "c", 3, USER("c"), 300);
    append_at(&h, "a", 4, USER("a again"), 400);
    char *order = listed_ids(&h, 400);
    CHECK_STR(order, "a c b");
    free(order);
    /* Reads never count as use. */
    free(load(&h, "b", 0, 450, NULL));
    free(dump_conversation(&h, "b", 450));
    CHECK(append_at(&h, "d", 5, USER("d"), 500) == 0);
    order = listed_ids(&h, 500);
    CHECK_STR(order, "d a c");
    free(order);
    CHECK(!turn_exists(&h, 2, 500));
    CHECK(stats_of(&h).evicted == 1);
    /* Same millisecond: the order of commits decides. */
    append_at(&h, "e", 6, USER("e"), 500);
    append_at(&h, "c", 7, USER("c2"), 500);
    order = listed_ids(&h, 500);
    CHECK_STR(order, "c e d");
    free(order);
    store_stats s = stats_of(&h);
    CHECK(s.conversations == 3 && s.evicted == 3 && s.expired == 0 && s.turns == 3);
    stop(&h);

    h = start(bc, 0, 1, 0); /* room for one: the new one replaces the last, never itself */
    append_at(&h, "x", 1, USER("x"), 1);
    append_at(&h, "y", 2, USER("y"), 2);
    size_t n = 0;
    char *text = load(&h, "y", 0, 3, &n);
    CHECK_STR(text, USER("y") ",");
    free(text);
    CHECK(stats_of(&h).conversations == 1);
    stop(&h);
}

static void test_idle_expiry(const backend_case *bc)
{
    /* At load. */
    harness h = start(bc, 0, 10, 1000);
    append_at(&h, "c", 1, USER("hi"), 10000);
    size_t n = 0;
    free(load(&h, "c", 0, 11000, &n)); /* exactly the timeout: alive */
    CHECK(n == 1);
    char *text = load(&h, "c", 0, 11001, &n);
    CHECK(n == 0);
    CHECK_STR(text, "");
    free(text);
    CHECK(stats_of(&h).expired == 1 && stats_of(&h).conversations == 0);
    free(load(&h, "c", 0, 10500, &n)); /* forgotten, not hidden */
    CHECK(n == 0);
    CHECK(!turn_exists(&h, 1, 10500));
    stop(&h);

    /* At the dumps and the list. */
    h = start(bc, 0, 10, 1000);
    append_at(&h, "old", 1, USER("old"), 1000);
    append_at(&h, "mid", 2, USER("mid"), 1500);
    append_at(&h, "new", 3, USER("new"), 2500);
    CHECK(dump_conversation(&h, "old", 2001) == NULL);
    CHECK(stats_of(&h).expired == 1);
    CHECK(!turn_exists(&h, 2, 2600));
    CHECK(stats_of(&h).expired == 2);
    CHECK(turn_exists(&h, 3, 2600));
    append_at(&h, "mid2", 4, USER("mid2"), 2600);
    char *order = listed_ids(&h, 3550);
    CHECK_STR(order, "mid2");
    free(order);
    store_stats s = stats_of(&h);
    CHECK(s.expired == 3 && s.conversations == 1 && s.evicted == 0);
    stop(&h);

    /* At append: the conversation restarts. */
    h = start(bc, 0, 10, 1000);
    append_at(&h, "c", 1, USER("stale"), 1000);
    append_at(&h, "c", 2, USER("fresh"), 5000);
    text = load(&h, "c", 0, 5000, &n);
    CHECK_STR(text, USER("fresh") ",");
    free(text);
    CHECK(!turn_exists(&h, 1, 5000));
    char *dump = dump_conversation(&h, "c", 5000);
    json_t *root = dump ? json_loads(dump, 0, NULL) : NULL;
    CHECK_STR(json_string_value(json_object_get(root, "created_at")), "1970-01-01T00:00:05.000Z");
    json_decref(root);
    free(dump);
    s = stats_of(&h);
    CHECK(s.expired == 1 && s.turns == 1 && s.message_bytes == strlen(USER("fresh")));
    stop(&h);

    /* By expire(): the LRU walk. */
    h = start(bc, 0, 10, 1000);
    CHECK(expire(&h, 5000) == 0);
    append_at(&h, "a", 1, USER("a"), 0);
    append_at(&h, "b", 2, USER("b"), 500);
    append_at(&h, "c", 3, USER("c"), 900);
    append_at(&h, "a", 4, USER("a2"), 950);
    CHECK(expire(&h, 1400) == 0);
    CHECK(expire(&h, 1501) == 1);
    order = listed_ids(&h, 1501);
    CHECK_STR(order, "a c");
    free(order);
    CHECK(expire(&h, 1951) == 2);
    s = stats_of(&h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0 && s.expired == 3);
    CHECK(!turn_exists(&h, 4, 1951));
    stop(&h);

    /* Timeout 0: never. */
    h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, USER("a"), 0);
    CHECK(expire(&h, (uint64_t)INT64_MAX) == 0);
    CHECK(turn_exists(&h, 1, (uint64_t)INT64_MAX));
    stop(&h);
}

static void test_forget(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, USER("a"), 1);
    append_at(&h, "b", 2, USER("b"), 2);
    append_at(&h, "b", 3, USER("b2"), 3);
    CHECK(forget(&h, "b") == PARLEY_OK);
    CHECK(forget(&h, "b") == PARLEY_ERR_NOT_FOUND);
    size_t n = 0;
    free(load(&h, "b", 0, 4, &n));
    CHECK(n == 0);
    CHECK(!turn_exists(&h, 2, 4) && !turn_exists(&h, 3, 4));
    store_stats s = stats_of(&h);
    CHECK(s.conversations == 1 && s.turns == 1 && s.message_bytes == strlen(USER("a")));
    CHECK(s.evicted == 0 && s.expired == 0);
    for (unsigned i = 0; i < 50; i++) {
        char id[16];
        snprintf(id, sizeof id, "bulk-%u", i);
        append_at(&h, id, 100 + i, USER("x"), 10 + i);
    }
    CHECK(forget(&h, NULL) == PARLEY_OK);
    s = stats_of(&h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0);
    char *list = dump_list(&h, 200);
    CHECK_STR(list, "{\"conversations\":[]}");
    free(list);
    CHECK(append_at(&h, "a", 1, USER("again"), 300) == 0); /* a forgotten turn id is free */
    char *text = load(&h, "a", 0, 300, &n);
    CHECK_STR(text, USER("again") ",");
    free(text);
    stop(&h);
}

/* Exact bytes of the three dumps (the same for every backend).  Version 4
 * adds each conversation's lifetime right after its head. */
static void test_dumps_exact(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    const uint64_t t0 = 1795375860123ULL; /* 2026-11-22T19:31:00.123Z */
    const char *id = "odd \"id\"\\\n\x01";
    CHECK(append_at(&h, id, 1, TURN1, t0 + 2000) == 0);
    CHECK(append_at(&h, "other", 2, USER("x"), t0 + 3000) == 0);
    int v4 = has_v4(bc);
    const char *odd_life = v4 ? ",\"last_message_at\":\"2026-11-22T19:31:02.116Z\","
                                "\"message_count\":4,\"turn_count\":1,"
                                "\"participants\":[\"user\",\"assistant\",\"tool\"]"
                              : "";
    const char *other_life = v4 ? ",\"last_message_at\":\"2026-11-22T19:31:03.113Z\","
                                  "\"message_count\":1,\"turn_count\":1,"
                                  "\"participants\":[\"user\"]"
                                : "";
    char *conv = dump_conversation(&h, id, t0 + 4000);
    char *want = pstr_printf("{\"conversation_id\":\"odd \\\"id\\\"\\\\\\n\\u0001\","
                             "\"created_at\":\"2026-11-22T19:31:02.123Z\","
                             "\"last_used_at\":\"2026-11-22T19:31:02.123Z\"%s,"
                             "\"turns\":[{\"turn_id\":\"00000001-0000-4000-8000-000000000001\","
                             "\"started_at\":\"2026-11-22T19:31:01.623Z\","
                             "\"finished_at\":\"2026-11-22T19:31:02.123Z\","
                             "\"messages\":[%s]}]}",
                             odd_life, TURN1_JOINED);
    CHECK_STR(conv, want);
    free(conv);
    free(want);
    char *turn = dump_turn(&h, 2, t0 + 4000);
    CHECK_STR(turn, "{\"conversation_id\":\"other\",\"turn\":{"
                    "\"turn_id\":\"00000002-0000-4000-8000-000000000002\","
                    "\"started_at\":\"2026-11-22T19:31:02.623Z\","
                    "\"finished_at\":\"2026-11-22T19:31:03.123Z\","
                    "\"messages\":[" USER("x") "]}}");
    free(turn);
    char *list = dump_list(&h, t0 + 4000);
    want = pstr_printf("{\"conversations\":[{\"conversation_id\":\"other\","
                       "\"created_at\":\"2026-11-22T19:31:03.123Z\","
                       "\"last_used_at\":\"2026-11-22T19:31:03.123Z\"%s,\"turns\":1},"
                       "{\"conversation_id\":\"odd \\\"id\\\"\\\\\\n\\u0001\","
                       "\"created_at\":\"2026-11-22T19:31:02.123Z\","
                       "\"last_used_at\":\"2026-11-22T19:31:02.123Z\"%s,\"turns\":1}]}",
                       other_life, odd_life);
    CHECK_STR(list, want);
    free(list);
    free(want);
    stop(&h);
}

/* The same id under another persona or interface is another conversation. */
static void test_keys(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    char *err = NULL;
    CHECK(append_keyed(&h, "", "", "same", 1, USER("plain"), 100, &err) == PARLEY_OK);
    CHECK(append_keyed(&h, "pirate", "", "same", 2, USER("arr"), 200, &err) == PARLEY_OK);
    CHECK(append_keyed(&h, "", "voice", "same", 3, USER("spoken"), 300, &err) == PARLEY_OK);
    CHECK(append_keyed(&h, "pirate", "voice", "same", 4, USER("both"), 400, &err) == PARLEY_OK);
    free(err);
    CHECK(stats_of(&h).conversations == 4);
    size_t n = 0;
    char *text = load(&h, "same", 0, 500, &n);
    CHECK_STR(text, USER("plain") ",");
    free(text);
    store_key key = {"same", "pirate", ""};
    pbuf b = PBUF_INIT;
    CHECK(h.bc->backend->load(h.s, &key, 0, 500, &b, &n, NULL) == PARLEY_OK);
    CHECK_STR(b.data, USER("arr") ",");
    pbuf_free(&b);
    char *conv = dump_conversation_keyed(&h, "", "voice", "same", 500);
    CHECK(conv && strstr(conv, "spoken") && !strstr(conv, "arr"));
    free(conv);
    store_key gone = {"same", "pirate", "voice"};
    CHECK(h.bc->backend->forget(h.s, &gone, NULL) == PARLEY_OK);
    CHECK(stats_of(&h).conversations == 3);
    CHECK(!turn_exists(&h, 4, 500) && turn_exists(&h, 2, 500));
    stop(&h);
}

static void test_bad_append_changes_nothing(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, USER("a"), 1);
    char *before = snapshot(&h);
    store_key key = {"a", "", ""};
    store_turn empty = {"00000009-0000-4000-8000-000000000009", 1, 2, NULL, 0};
    char *err = NULL;
    CHECK(bc->backend->append(h.s, &key, &empty, 2, &err) != PARLEY_OK);
    CHECK(err != NULL);
    free(err);
    err = NULL;
    store_message no_json = {"m", "user", 1, NULL, 3, NULL, NULL, 0};
    store_turn bad = {"00000009-0000-4000-8000-000000000009", 1, 2, &no_json, 1};
    CHECK(bc->backend->append(h.s, &key, &bad, 2, &err) != PARLEY_OK);
    free(err);
    char *after = snapshot(&h);
    CHECK_STR(after, before);
    free(before);
    free(after);
    stop(&h);
}

/* ---- concurrency: appends, loads and dumps from several threads ---- */

enum { THREADS = 4, ITERATIONS = 150, KEEP = 20 };

typedef struct worker {
    harness *h;
    unsigned index;
    int errors;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    char own[16], messages[128];
    snprintf(own, sizeof own, "own-%u", w->index);
    for (unsigned i = 0; i < ITERATIONS; i++) {
        unsigned turn_no = w->index * 1000000u + i;
        snprintf(messages, sizeof messages, USER("t%u") "\n" ASSISTANT("t%u"), turn_no, turn_no);
        const char *target = i % 2 ? "shared" : own;
        w->errors += append_at(w->h, target, turn_no, messages, 1000 + i) != 0;
        size_t n = 0;
        store_key key = {i % 3 ? own : "shared", "", ""};
        pbuf b = PBUF_INIT;
        w->errors += w->h->bc->backend->load(w->h->s, &key, 5, 1000 + i, &b, &n, NULL) != PARLEY_OK;
        w->errors += n % 2 != 0 || n > 10;
        pbuf_free(&b);
        if (i % 10 == 0) { /* no CHECK here: check.h's counters are not thread-safe */
            pbuf list = PBUF_INIT;
            w->errors += w->h->bc->backend->list(w->h->s, 1000 + i, &list, NULL) != PARLEY_OK;
            pbuf_free(&list);
        }
    }
    return NULL;
}

static void test_concurrent_use(const backend_case *bc)
{
    harness h = start(bc, KEEP, 100, 0);
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        workers[i] = (worker){&h, i, 0};
        CHECK(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    int errors = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        errors += workers[i].errors;
    }
    CHECK(errors == 0);
    store_stats s = stats_of(&h);
    CHECK(s.conversations == THREADS + 1);
    CHECK(s.turns == (THREADS + 1) * KEEP);
    stop(&h);
}

/* ---- every backend prints the same bytes for the same appends ---- */

static char *scripted_transcript(const backend_case *bc)
{
    harness h = start(bc, 2, 3, 1000);
    pbuf b = PBUF_INIT;
    append_at(&h, "a", 1, TURN1, 1000);
    append_at(&h, "b", 2, USER("b1"), 1100);
    append_at(&h, "a", 3, USER("a2") "\n" ASSISTANT("a2"), 1200);
    append_at(&h, "a", 4, USER("a3"), 1300);
    append_at(&h, "c", 5, USER("c1"), 1400);
    append_at(&h, "d", 6, USER("d1"), 1500); /* evicts b */
    append_at(&h, "c", 7, USER("c2"), 3000); /* c restarts; a and d are idle */
    char *snap = snapshot(&h);
    pbuf_puts(&b, snap);
    free(snap);
    char *text = load(&h, "a", 1, 1400, NULL);
    pbuf_printf(&b, "\n%s", text);
    free(text);
    char *turn = dump_turn(&h, 4, 1400);
    pbuf_printf(&b, "\n%s", turn ? turn : "(none)");
    free(turn);
    char *list = dump_list(&h, 3000);
    pbuf_printf(&b, "\n%s", list);
    free(list);
    store_stats s = stats_of(&h);
    pbuf_printf(&b, "\n%zu %zu %zu %zu %zu", s.conversations, s.turns, s.message_bytes, s.evicted,
                s.expired);
    stop(&h);
    return pbuf_take(&b);
}

/* Compared within each group of the same version (the lifetime is in v4 dumps only). */
static void test_same_bytes_everywhere(void)
{
    char *first[2] = {NULL, NULL};
    const char *first_scheme[2] = {NULL, NULL};
    for (size_t i = 0; i < NBACKENDS; i++) {
        int v4 = has_v4(&backends[i]);
        char *text = scripted_transcript(&backends[i]);
        CHECK(text && strstr(text, "\"turns\":2}") != NULL);
        if (!first[v4]) {
            first[v4] = text;
            first_scheme[v4] = backends[i].backend->scheme;
            continue;
        }
        CHECK_STR(text, first[v4]);
        free(text);
    }
    if (first[0] && first[1])
        printf("SKIPPED: same bytes of %s (v4) against the backends without v4 (from %s)\n",
               first_scheme[1], first_scheme[0]);
    free(first[0]);
    free(first[1]);
}

/* ---- durable backends ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    pbuf b = PBUF_INIT;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        pbuf_append(&b, chunk, n);
    fclose(f);
    *len = b.len;
    return pbuf_take(&b);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(data, 1, len, f) == len);
        fclose(f);
    }
}

static void test_reopen_keeps_everything(const backend_case *bc)
{
    harness h = start(bc, 3, 10, 60000);
    append_at(&h, "kitchen", 1, TURN1, 1000);
    append_at(&h, "bedroom", 2, USER("b") "\n" ASSISTANT("b"), 1000); /* same ms: order kept */
    append_at(&h, "kitchen", 3, USER("k2"), 2000);
    char *err = NULL;
    CHECK(append_keyed(&h, "pirate", "voice", "kitchen", 4, USER("arr"), 2500, &err) == PARLEY_OK);
    free(err);
    append_at(&h, "idle", 5, USER("soon gone"), 3000);
    append_at(&h, "idle2", 6, USER("gone too"), 3000);
    for (unsigned i = 0; i < 5; i++)
        append_at(&h, "long", 10 + i, USER("l"), 3100 + i);
    char *before = snapshot(&h);
    char *turn_before = dump_turn(&h, 1, 3500);
    reopen(&h);
    char *after = snapshot(&h);
    CHECK_STR(after, before);
    char *turn_after = dump_turn(&h, 1, 3500);
    CHECK_STR(turn_after, turn_before);
    /* The limits still hold for what comes next: trimming and the LRU order. */
    append_at(&h, "long", 20, USER("l6"), 4000);
    size_t n = 0;
    char *text = load(&h, "long", 0, 4000, &n);
    CHECK(n == 3 && strstr(text, "l6"));
    free(text);
    char *order = listed_ids(&h, 4000);
    CHECK_STR(order, "long idle2 idle kitchen kitchen bedroom");
    free(order);
    /* Idle while the host was down: gone at the first use after the restart. */
    reopen(&h);
    free(load(&h, "idle", 0, 63001, &n)); /* last used at 3000: idle for 60001 ms */
    CHECK(n == 0);
    CHECK(stats_of(&h).expired == 1);
    CHECK(expire(&h, 63001) == 4); /* bedroom, kitchen, the pirate's kitchen, idle2 */
    order = listed_ids(&h, 63001);
    CHECK_STR(order, "long");
    free(order);
    free(before);
    free(after);
    free(turn_before);
    free(turn_after);
    stop(&h);
}

/* Open must refuse `path` with a message naming it and containing `reason`,
 * and leave its bytes as they were. */
static void check_refused(const backend_case *bc, const char *path, const char *reason)
{
    size_t len_before = 0, len_after = 0;
    char *bytes_before = read_file(path, &len_before);
    char *lock = pstr_printf("%s-lock", path);
    struct stat st;
    int had_lock = stat(lock, &st) == 0;
    store_limits limits = {0, 10, 0};
    char *err = NULL;
    store *s = open_at(bc, path, limits, &err);
    CHECK(s == NULL);
    if (s)
        bc->backend->close(s);
    CHECK(err && strstr(err, path) && strstr(err, reason));
    if (!err || !strstr(err, reason))
        fprintf(stderr, "  refusal of %s said: %s (wanted \"%s\")\n", path, err ? err : "(null)",
                reason);
    free(err);
    char *bytes_after = read_file(path, &len_after);
    CHECK(bytes_before && bytes_after && len_before == len_after &&
          memcmp(bytes_before, bytes_after, len_before) == 0);
    free(bytes_before);
    free(bytes_after);
    CHECK(had_lock || stat(lock, &st) != 0); /* nothing left next to a file that is not ours */
    free(lock);
}

/* A valid store file with some content, closed. */
static char *make_store_file(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, TURN1, 1000);
    append_at(&h, "b", 2, USER("b"), 2000);
    bc->backend->close(h.s);
    h.s = NULL;
    return h.location;
}

static void test_refuses_foreign_files(const backend_case *bc)
{
    char *text = pstr_printf("%s/notes.txt", tmpdir);
    const char *notes = "this is not a database, but it is somebody's file\n";
    write_file(text, notes, strlen(notes));
    check_refused(bc, text, "not a SQLite database");
    free(text);

    char *tiny = pstr_printf("%s/tiny.db", tmpdir);
    write_file(tiny, "SQLite format 3", 16);
    check_refused(bc, tiny, "not a SQLite database");
    free(tiny);

    /* Another application's SQLite database. */
    char *foreign = pstr_printf("%s/foreign.db", tmpdir);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(foreign, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "CREATE TABLE recipes(name TEXT); INSERT INTO recipes VALUES('soup');",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused(bc, foreign, "not a Parley history store");
    /* ... even an empty one someone else made (application_id 0, WAL mode). */
    free(foreign);
    foreign = pstr_printf("%s/foreign-wal.db", tmpdir);
    CHECK(sqlite3_open(foreign, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA application_id=7;", NULL, NULL,
                       NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused(bc, foreign, "application_id 0x00000007");
    free(foreign);

    /* A newer schema. */
    char *newer = make_store_file(bc);
    CHECK(sqlite3_open(newer, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA user_version = 3;", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused(bc, newer, "newer Parley (schema version 3; this one reads up to 2)");
    free(newer);

    /* Corrupt: a damaged header; a damaged schema page. */
    char *corrupt = make_store_file(bc);
    size_t len = 0;
    char *bytes = read_file(corrupt, &len);
    CHECK(bytes && len >= 4096);
    if (bytes && len >= 4096) {
        memcpy(bytes + 16, "\x03\x01\x07\x07\x00\x11\x22\x33", 8);
        write_file(corrupt, bytes, len);
        check_refused(bc, corrupt, "corrupt");
        memcpy(bytes + 16, "\x10\x00\x01\x01\x00\x40\x20\x20", 8); /* header back */
        memset(bytes + 100, 0x5a, 4096 - 100);                     /* schema b-tree page */
        write_file(corrupt, bytes, len);
        check_refused(bc, corrupt, "corrupt");
    }
    free(bytes);
    free(corrupt);

    /* A directory that does not exist: said, and not created. */
    char *nodir = pstr_printf("%s/no/such/dir/h.db", tmpdir);
    store_limits limits = {0, 10, 0};
    char *err = NULL;
    CHECK(open_at(bc, nodir, limits, &err) == NULL);
    CHECK(err && strstr(err, "No such file") && strstr(err, "create it first"));
    free(err);
    char *parent = pstr_printf("%s/no", tmpdir);
    struct stat st;
    CHECK(stat(parent, &st) != 0);
    free(parent);
    free(nodir);
}

/* Damage past the schema (here: the last pages, where the latest messages
 * are) is found by the read that meets it: 'storage' with SQLite's reason,
 * never a crash, and reading leaves the file as it is. */
static void test_damage_found_when_read(const backend_case *bc)
{
    harness h = start(bc, 0, 1000, 0);
    char big[1500];
    memset(big, 'y', sizeof big);
    memcpy(big, "{\"x\":\"", 6);
    memcpy(big + sizeof big - 3, "\"}", 3);
    for (unsigned i = 0; i < 200; i++) {
        char id[16];
        snprintf(id, sizeof id, "c%u", i);
        append_at(&h, id, 1 + i, big, 1000 + i);
    }
    bc->backend->close(h.s);
    h.s = NULL;
    size_t len = 0;
    char *bytes = read_file(h.location, &len);
    CHECK(bytes && len > 8 * 4096);
    if (bytes && len > 8 * 4096) {
        memset(bytes + len - 3 * 4096, 0xa5, 3 * 4096); /* the last three pages */
        write_file(h.location, bytes, len);
    }
    char *err = NULL;
    h.s = open_at(bc, h.location, h.limits, &err);
    int storage_errors = 0;
    if (!h.s) { /* refusing it at open is fine too, if it says why */
        CHECK(err && strstr(err, "corrupt"));
        storage_errors++;
    }
    free(err);
    for (unsigned i = 0; h.s && i < 200; i++) {
        char id[16];
        snprintf(id, sizeof id, "c%u", i);
        store_key key = {id, "", ""};
        pbuf b = PBUF_INIT;
        size_t n = 0;
        char *e = NULL;
        parley_status st = bc->backend->load(h.s, &key, 0, 2000, &b, &n, &e);
        CHECK(st == PARLEY_OK || st == PARLEY_ERR_STORAGE);
        if (st == PARLEY_ERR_STORAGE) {
            CHECK(e && strstr(e, h.location) && strstr(e, "malformed"));
            storage_errors++;
        }
        free(e);
        pbuf_free(&b);
    }
    if (h.s) {
        pbuf b = PBUF_INIT;
        char *e = NULL;
        parley_status st = bc->backend->list(h.s, 2000, &b, &e);
        CHECK(st == PARLEY_OK || st == PARLEY_ERR_STORAGE);
        free(e);
        pbuf_free(&b);
        bc->backend->close(h.s);
        h.s = NULL;
    }
    CHECK(storage_errors > 0);
    size_t len_after = 0;
    char *after = read_file(h.location, &len_after);
    CHECK(bytes && after && len_after == len && memcmp(bytes, after, len) == 0);
    free(after);
    free(bytes);
    stop(&h);
}

/* A fresh file is created 0600; its lock file too. */
static void test_file_mode(const backend_case *bc)
{
    char *path = make_store_file(bc);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    char *lock = pstr_printf("%s-lock", path);
    CHECK(stat(lock, &st) == 0 && (st.st_mode & 0777) == 0600);
    free(lock);
    free(path);
}

static void test_in_use(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, USER("a"), 1000);
    char *err = NULL;
    store *second = open_at(bc, h.location, h.limits, &err); /* same process */
    CHECK(second == NULL);
    CHECK(err && strstr(err, h.location) && strstr(err, "in use by another agent"));
    free(err);
    if (second)
        bc->backend->close(second);
    /* Another process. */
    pid_t pid = fork();
    if (pid == 0) {
        char *e = NULL;
        store *other = open_at(bc, h.location, h.limits, &e);
        _exit(other == NULL && e && strstr(e, "in use by another agent") ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The first agent is unharmed, and once it closes the file is free. */
    CHECK(append_at(&h, "a", 2, USER("a2"), 2000) == 0);
    reopen(&h);
    size_t n = 0;
    free(load(&h, "a", 0, 2000, &n));
    CHECK(n == 2);
    stop(&h);
}

/* Disk full, I/O errors: the append fails with 'storage' and a message, nothing
 * of the turn is stored, reads keep working, and appends work again after. */
static void test_failing_writes(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, TURN1, 1000);
    append_at(&h, "b", 2, USER("b"), 1500);
    const int faults[] = {SQLITE_FULL, SQLITE_IOERR_WRITE};
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        char *before = snapshot(&h);
        FAULT_VFS_SET(fail_writes, faults[f]);
        char *err = NULL;
        parley_status st = append_keyed(&h, "", "", "a", 100 + (unsigned)f, USER("lost"),
                                        2000 + f, &err);
        CHECK(st == PARLEY_ERR_STORAGE);
        CHECK(err && strstr(err, h.location) && strstr(err, "cannot store the turn"));
        free(err);
        err = NULL;
        CHECK(append_keyed(&h, "", "", "new", 200 + (unsigned)f, USER("lost"), 2000 + f, &err) ==
              PARLEY_ERR_STORAGE);
        free(err);
        char *during = snapshot(&h); /* reads still served */
        CHECK_STR(during, before);
        FAULT_VFS_SET(fail_writes, 0);
        char *after = snapshot(&h);
        CHECK_STR(after, before);
        CHECK(append_at(&h, "a", 300 + (unsigned)f, USER("kept"), 3000 + f) == 0);
        free(before);
        free(during);
        free(after);
    }
    /* A failing fsync (synchronous=FULL makes every commit sync). */
    reopen(&h);
    size_t n = 0;
    free(load(&h, "a", 0, 4000, &n));
    CHECK(n == 6);
    stop(&h);

    store_limits limits = {0, 10, 0};
    char *path = fresh_location(bc);
    store_config cfg = {.location = path, .limits = limits, .sync_full = 1};
    store *s = NULL;
    CHECK(bc->backend->open(&cfg, &s, NULL) == PARLEY_OK);
    harness full = {bc, path, limits, s};
    append_at(&full, "a", 1, USER("a"), 1000);
    char *before = snapshot(&full);
    FAULT_VFS_SET(fail_syncs, SQLITE_IOERR_FSYNC);
    char *err = NULL;
    CHECK(append_keyed(&full, "", "", "a", 2, USER("lost"), 2000, &err) == PARLEY_ERR_STORAGE);
    free(err);
    FAULT_VFS_SET(fail_syncs, 0);
    char *after = snapshot(&full);
    CHECK_STR(after, before);
    CHECK(append_at(&full, "a", 3, USER("kept"), 3000) == 0);
    reopen(&full);
    char *text = load(&full, "a", 0, 3000, &n);
    CHECK_STR(text, USER("a") "," USER("kept") ",");
    free(text);
    free(before);
    free(after);
    stop(&full);
}

/* A read-only file: reads work, appends fail with 'storage' naming the file,
 * and nothing changes.  Root ignores file permissions, so as root the check
 * runs in a child process that has become the unprivileged user 65534. */
static int read_only_checks(const backend_case *bc, const char *dir)
{
    int failed_before = check_failed;
    char *path = pstr_printf("%s/read-only.db", dir);
    store_limits limits = {0, 10, 0};
    char *err = NULL;
    harness h = {bc, path, limits, open_at(bc, path, limits, &err)};
    free(err);
    CHECK(h.s != NULL);
    append_at(&h, "a", 1, TURN1, 1000);
    bc->backend->close(h.s);
    CHECK(chmod(path, 0400) == 0);
    size_t len_before = 0, len_after = 0;
    char *bytes_before = read_file(path, &len_before);
    h.s = open_at(bc, path, limits, &err);
    if (!h.s)
        fprintf(stderr, "read-only open: %s\n", err ? err : "?");
    free(err);
    CHECK(h.s != NULL);
    if (h.s) {
        size_t n = 0;
        free(load(&h, "a", 0, 2000, &n));
        CHECK(n == 4);
        err = NULL;
        CHECK(append_keyed(&h, "", "", "a", 9, USER("x"), 3000, &err) == PARLEY_ERR_STORAGE);
        CHECK(err && strstr(err, path) && strstr(err, "readonly"));
        free(err);
        free(load(&h, "a", 0, 3000, &n));
        CHECK(n == 4);
        bc->backend->close(h.s);
    }
    char *bytes_after = read_file(path, &len_after);
    CHECK(bytes_before && bytes_after && len_before == len_after &&
          memcmp(bytes_before, bytes_after, len_before) == 0);
    free(bytes_before);
    free(bytes_after);
    free(path);
    return check_failed - failed_before;
}

static void test_read_only_file(const backend_case *bc)
{
    if (geteuid() != 0) {
        read_only_checks(bc, tmpdir);
        return;
    }
    char dir[] = "/tmp/parley-store-ro-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const uid_t nobody = 65534;
    CHECK(chown(dir, nobody, nobody) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(nobody) != 0 || setuid(nobody) != 0)
            _exit(100);
        _exit(read_only_checks(bc, dir) ? 1 : 0);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *cmd = pstr_printf("rm -rf '%s'", dir);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(cmd);
}

/* Checkpoints happen while the store is open (on the checkpointer thread):
 * the database file grows as the WAL is copied into it, and the WAL is
 * reused instead of growing without end. */
static void test_checkpoints_while_open(const backend_case *bc)
{
    harness h = start(bc, 0, 100000, 0);
    struct stat st;
    CHECK(stat(h.location, &st) == 0);
    off_t initial = st.st_size;
    char *wal = pstr_printf("%s-wal", h.location);
    off_t largest_wal = 0;
    char big[2048];
    memset(big, 'x', sizeof big);
    big[0] = '{', big[1] = '"', big[2] = 'x', big[3] = '"', big[4] = ':', big[5] = '"';
    memcpy(big + sizeof big - 3, "\"}", 3);
    for (unsigned i = 0; i < 3000; i++) {
        char id[32];
        snprintf(id, sizeof id, "c%u", i % 500);
        CHECK(append_at(&h, id, 1 + i, big, 1000 + i) == 0);
        if (stat(wal, &st) == 0 && st.st_size > largest_wal)
            largest_wal = st.st_size;
    }
    for (int i = 0; i < 200 && (stat(h.location, &st) != 0 || st.st_size <= initial); i++)
        usleep(10000 * 1); /* the checkpointer runs on its own thread */
    CHECK(stat(h.location, &st) == 0 && st.st_size > initial);
    /* 3000 turns of 2 KiB, ~8 pages each: ~100 MiB of WAL frames if nothing bounded it */
    CHECK(largest_wal > 0 && largest_wal < 80 * 1024 * 1024);
    char *before = snapshot(&h);
    reopen(&h);
    char *after = snapshot(&h);
    CHECK_STR(after, before);
    CHECK(stats_of(&h).turns == 3000);
    free(before);
    free(after);
    free(wal);
    stop(&h);
}

/* A read never waits for a write: while an append sits in a slow fsync
 * (history_sync full, the fault VFS sleeping in xSync), loads and dumps of
 * other conversations complete. */
typedef struct slow_append {
    harness *h;
    int finished;
    parley_status status;
} slow_append;

static void *append_slowly(void *arg)
{
    slow_append *a = arg;
    char *err = NULL;
    a->status = append_keyed(a->h, "", "", "slow", 2, USER("slow"), 2000, &err);
    free(err);
    __atomic_store_n(&a->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void test_reads_do_not_wait_for_writes(const backend_case *bc)
{
    const char *slowdown = getenv("PARLEY_TEST_SLOWDOWN");
    unsigned delay_ms = (unsigned)(1500 * (slowdown ? atof(slowdown) : 1.0));
    store_limits limits = {0, 10, 0};
    char *path = fresh_location(bc);
    store_config cfg = {.location = path, .limits = limits, .sync_full = 1};
    store *s = NULL;
    CHECK(bc->backend->open(&cfg, &s, NULL) == PARLEY_OK);
    harness h = {bc, path, limits, s};
    append_at(&h, "other", 1, USER("other"), 1000);
    unsigned long syncs = FAULT_VFS_GET(syncs);
    FAULT_VFS_SET(sync_delay_ms, delay_ms);
    slow_append a = {&h, 0, PARLEY_ERR_INTERNAL};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, append_slowly, &a) == 0);
    while (FAULT_VFS_GET(syncs) == syncs)
        usleep(1000); /* until the append is inside its fsync */
    size_t n = 0;
    char *text = load(&h, "other", 0, 2000, &n);
    char *list = dump_list(&h, 2000);
    int overtaken = !__atomic_load_n(&a.finished, __ATOMIC_SEQ_CST);
    CHECK(overtaken); /* the reads returned while the append was still syncing */
    CHECK_STR(text, USER("other") ",");
    CHECK(list && strstr(list, "other") && !strstr(list, "slow")); /* not committed yet */
    free(text);
    free(list);
    pthread_join(thread, NULL);
    FAULT_VFS_SET(sync_delay_ms, 0);
    CHECK(a.status == PARLEY_OK);
    free(load(&h, "slow", 0, 2000, &n));
    CHECK(n == 1);
    stop(&h);
}

static void test_location_missing(const backend_case *bc)
{
    store_limits limits = {0, 10, 0};
    char *err = NULL;
    CHECK(open_at(bc, "", limits, &err) == NULL);
    CHECK(err && strstr(err, "sqlite:PATH"));
    free(err);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (fault_vfs_install() != SQLITE_OK) {
        fprintf(stderr, "cannot install the fault VFS\n");
        return 1;
    }
    if (redis_server_start(&redis, "conformance-pw") != 0)
        return 1;
    for (size_t i = 0; i < NBACKENDS; i++) {
        const backend_case *bc = &backends[i];
        printf("backend %s\n", bc->backend->scheme);
        test_unknown(bc);
        test_append_load_last_n(bc);
        test_keep_turns_trims_whole_turns(bc);
        test_idempotent_append(bc);
        test_lru_eviction(bc);
        test_idle_expiry(bc);
        test_forget(bc);
        test_dumps_exact(bc);
        test_keys(bc);
        test_bad_append_changes_nothing(bc);
        test_concurrent_use(bc);
        if (bc->durable) {
            test_reopen_keeps_everything(bc);
            test_refuses_foreign_files(bc);
            test_file_mode(bc);
            test_damage_found_when_read(bc);
            test_in_use(bc);
            test_failing_writes(bc);
            test_read_only_file(bc);
            test_checkpoints_while_open(bc);
            test_reads_do_not_wait_for_writes(bc);
            test_location_missing(bc);
        }
    }
    test_same_bytes_everywhere();
    redis_server_stop(&redis);
    char *cmd = pstr_printf("rm -rf '%s'", tmpdir);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    return check_report();
}
