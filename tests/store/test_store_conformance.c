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
#include "../unit/read_file.h"
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
    const char *context;  /* version 5: the record the next appends carry (NULL: none) */
    uint32_t tokens;      /* version 6: the size the next appends carry (0: unknown) */
} harness;

static store *open_at(const backend_case *bc, const char *location, store_limits limits,
                      char **err)
{
    store_config cfg = {.location = location, .limits = limits};
    store *s = NULL;
    parley_status st = store_open(bc->backend, &cfg, &s, err);
    return st == PARLEY_OK ? s : NULL;
}

static harness start(const backend_case *bc, size_t keep_turns, size_t max_conversations,
                     uint64_t idle_timeout_ms)
{
    harness h = {bc, fresh_location(bc), {keep_turns, max_conversations, idle_timeout_ms}, NULL,
                 NULL, 0};
    char *err = NULL;
    h.s = open_at(bc, h.location, h.limits, &err);
    if (!h.s)
        fprintf(stderr, "open %s failed: %s\n", bc->backend->scheme, err ? err : "?");
    free(err);
    CHECK(h.s != NULL);
    if (h.s && bc->shared) /* what the previous test left on the server */
        CHECK(store_forget(h.s, NULL, NULL) == PARLEY_OK);
    return h;
}

static void stop(harness *h)
{
    if (h->s)
        store_close(h->s);
    h->s = NULL;
    free(h->location);
}

/* Close and open the same location again (durable backends). */
static void reopen(harness *h)
{
    store_close(h->s);
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
    if (strstr(json, "\"role\":\"system\""))
        return "system";
    return "assistant";
}

/* Append turn `turn_no` to conversation `id` (under persona/interface) at now_ms;
 * `messages` are the turn's message objects separated by '\n'.  Version 4:
 * message i gets interface_ids[i] and metadata[i] (arrays and entries may be NULL). */
static parley_status append_full(harness *h, const char *persona, const char *iface,
                                 const char *id, unsigned turn_no, const char *messages,
                                 const char *const *interface_ids, const char *const *metadata,
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
        if (interface_ids)
            msgs[n].interface_message_id = interface_ids[n];
        if (metadata && metadata[n]) {
            msgs[n].metadata = metadata[n];
            msgs[n].metadata_len = strlen(metadata[n]);
        }
        n++;
        p = end ? end + 1 : p + len;
    }
    store_turn turn = {tid, now_ms > 500 ? now_ms - 500 : 0, now_ms, msgs, n, h->context,
                       h->context ? strlen(h->context) : 0, h->tokens};
    store_key key = {id, persona, iface};
    return store_append(h->s, &key, &turn, now_ms, err);
}

static parley_status append_keyed(harness *h, const char *persona, const char *iface,
                                  const char *id, unsigned turn_no, const char *messages,
                                  uint64_t now_ms, char **err)
{
    return append_full(h, persona, iface, id, turn_no, messages, NULL, NULL, now_ms, err);
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
    parley_status st = store_load(h->s, &key, last_turns, now_ms, &b, &n, &err);
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
    parley_status st = store_get_conversation(h->s, &key, now_ms, &b, &err);
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
    parley_status st = store_get_turn(h->s, tid, now_ms, &b, &err);
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
    parley_status st = store_list(h->s, now_ms, &b, &err);
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
    CHECK(store_stats_get(h->s, &s, NULL) == PARLEY_OK);
    return s;
}

static parley_status forget(harness *h, const char *id)
{
    store_key key = {id, "", ""};
    char *err = NULL;
    parley_status st = store_forget(h->s, id ? &key : NULL, &err);
    free(err);
    return st;
}

static size_t expire(harness *h, uint64_t now_ms)
{
    size_t n = 999;
    char *err = NULL;
    CHECK(store_expire(h->s, now_ms, &n, &err) == PARLEY_OK);
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
    CHECK(store_load(h.s, &key, 0, 1000, &b, &n, NULL) == PARLEY_OK);
    CHECK(n == 0);
    CHECK_STR(b.data, "[");
    CHECK(store_get_conversation(h.s, &key, 1000, &b, NULL) == PARLEY_ERR_NOT_FOUND);
    CHECK(store_get_turn(h.s, "00000000-0000-4000-8000-000000000000", 1000, &b, NULL) ==
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
    CHECK(store_load(h.s, &key, 1, 3500, &b, &n, NULL) == PARLEY_OK);
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
    CHECK(store_load(h.s, &key, 0, 500, &b, &n, NULL) == PARLEY_OK);
    CHECK_STR(b.data, USER("arr") ",");
    pbuf_free(&b);
    char *conv = dump_conversation_keyed(&h, "", "voice", "same", 500);
    CHECK(conv && strstr(conv, "spoken") && !strstr(conv, "arr"));
    free(conv);
    store_key gone = {"same", "pirate", "voice"};
    CHECK(store_forget(h.s, &gone, NULL) == PARLEY_OK);
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
    store_turn empty = {"00000009-0000-4000-8000-000000000009", 1, 2, NULL, 0, NULL, 0, 0};
    char *err = NULL;
    CHECK(store_append(h.s, &key, &empty, 2, &err) != PARLEY_OK);
    CHECK(err != NULL);
    free(err);
    err = NULL;
    store_message no_json = {"m", "user", 1, NULL, 3, NULL, NULL, 0};
    store_turn bad = {"00000009-0000-4000-8000-000000000009", 1, 2, &no_json, 1, NULL, 0, 0};
    CHECK(store_append(h.s, &key, &bad, 2, &err) != PARLEY_OK);
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

/* Set, find and load turn `turn_no` of `id` by its interface id; errors but not NOT_FOUND
 * (another thread's appends may have trimmed it) count. */
static int identity_calls(harness *h, const char *id, unsigned turn_no, uint64_t now_ms)
{
    const store_backend *b = h->bc->backend;
    char tid[37], iface[32], mid[37], found_tid[37];
    turn_id_for(turn_no, tid);
    snprintf(iface, sizeof iface, "out-%u", turn_no);
    store_key key = {id, "", ""};
    pbuf out = PBUF_INIT;
    size_t n = 0;
    int in_window = 0, errors = 0;
    parley_status st[3];
    st[0] = b->set_interface_message_id(h->s, tid, iface, now_ms, mid, NULL);
    st[1] = b->find_message(h->s, &key, iface, now_ms, &out, NULL);
    st[2] = b->load_turn(h->s, &key, NULL, iface, 5, now_ms, &out, &n, found_tid, &in_window,
                         NULL);
    for (size_t i = 0; i < 3; i++)
        errors += st[i] != PARLEY_OK && st[i] != PARLEY_ERR_NOT_FOUND;
    pbuf_free(&out);
    return errors;
}

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
        w->errors += store_load(w->h->s, &key, 5, 1000 + i, &b, &n, NULL) != PARLEY_OK;
        w->errors += n % 2 != 0 || n > 10;
        pbuf_free(&b);
        if (i % 10 == 0) { /* no CHECK here: check.h's counters are not thread-safe */
            pbuf list = PBUF_INIT;
            w->errors += store_list(w->h->s, 1000 + i, &list, NULL) != PARLEY_OK;
            pbuf_free(&list);
        }
        if (has_v4(w->h->bc)) /* identity calls race with appends and trimming */
            w->errors += identity_calls(w->h, target, turn_no, 1000 + i);
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

/* ---- version 4: message identity (interface ids, metadata, lifetime) ---- */

#define SYSTEM(text) "{\"role\":\"system\",\"content\":\"" text "\"}"
/* Metadata is kept verbatim: escapes stay as the host wrote them. */
#define META_ALICE "{\"from\":\"alice\",\"chat\":7,\"note\":\"caf\\u00e9 \\\"x\\\"\"}"
/* A question and its answer; as load() gives them back. */
#define QA(n) USER("q" #n) "\n" ASSISTANT("a" #n)
#define QA_LOADED(n) USER("q" #n) "," ASSISTANT("a" #n) ","

static void message_id_for(unsigned turn_no, size_t i, char out[37])
{
    snprintf(out, 37, "%08x-1111-4000-8000-%012zx", turn_no, i);
}

/* find_message's answer, or NULL for NOT_FOUND (then nothing was appended). */
static char *find_keyed(harness *h, const char *persona, const char *iface, const char *id,
                        const char *interface_message_id, uint64_t now_ms)
{
    store_key key = {id, persona, iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st =
        store_find_message(h->s, &key, interface_message_id, now_ms, &b, &err);
    CHECK(st == PARLEY_OK || st == PARLEY_ERR_NOT_FOUND);
    free(err);
    if (st != PARLEY_OK) {
        CHECK(b.len == 0);
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static char *find_message(harness *h, const char *id, const char *interface_message_id,
                          uint64_t now_ms)
{
    return find_keyed(h, "", "", id, interface_message_id, now_ms);
}

/* Member `name` of the JSON object `json`: a string's value, else its compact
 * JSON; NULL when absent (or json is NULL). */
static char *member_of(const char *json, const char *name)
{
    json_t *root = json ? json_loads(json, 0, NULL) : NULL;
    json_t *v = json_object_get(root, name);
    char *out = !v                ? NULL
                : json_is_string(v) ? strdup(json_string_value(v))
                                    : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(root);
    return out;
}

/* The message_id of find_message's answer ("(none)" for NOT_FOUND). */
static char *found_id(harness *h, const char *id, const char *interface_message_id,
                      uint64_t now_ms)
{
    char *m = find_message(h, id, interface_message_id, now_ms);
    char *mid = m ? member_of(m, "message_id") : strdup("(none)");
    free(m);
    return mid;
}

static void check_found_id(harness *h, const char *id, const char *interface_message_id,
                           unsigned turn_no, size_t index, uint64_t now_ms)
{
    char want[37];
    message_id_for(turn_no, index, want);
    char *mid = found_id(h, id, interface_message_id, now_ms);
    CHECK_STR(mid, want);
    free(mid);
}

static parley_status set_interface_id(harness *h, unsigned turn_no, const char *interface_id,
                                      uint64_t now_ms, char message_id[37])
{
    char tid[37];
    turn_id_for(turn_no, tid);
    char *err = NULL;
    strcpy(message_id, "untouched");
    parley_status st = store_set_interface_message_id(h->s, tid, interface_id, now_ms,
                                                                message_id, &err);
    if (st != PARLEY_OK && st != PARLEY_ERR_NOT_FOUND)
        CHECK(err != NULL); /* a failure says why */
    free(err);
    return st;
}

/* get_message's answer (NULL for NOT_FOUND, or a backend without version 3). */
static char *message_by_id(harness *h, unsigned turn_no, size_t index, uint64_t now_ms)
{
    char mid[37];
    message_id_for(turn_no, index, mid);
    pbuf b = PBUF_INIT;
    parley_status st = store_get_message(h->s, mid, now_ms, &b, NULL);
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

/* A query's messages ("m1,m2"), or NULL for a backend without version 3. */
static char *query_messages(harness *h, const char *id, const char *iface, int newest_first)
{
    store_query q = {.conversation_id = id, .persona = id ? "" : NULL, .interface_type = iface,
                     .until_ms = UINT64_MAX, .limit = 100, .newest_first = newest_first};
    pbuf b = PBUF_INIT;
    size_t count = 0;
    uint64_t last = 0;
    int more = 0;
    CHECK(store_query_run(h->s, &q, 0, &b, &count, &last, &more, NULL) == PARLEY_OK);
    return pbuf_take(&b);
}

typedef struct turn_lookup {
    parley_status st;
    char *text;          /* "[" then what load_turn appended */
    size_t nmessages;
    char turn_id[37];
    int in_window;
} turn_lookup;

/* load_turn on conversation `id` (under persona/interface) by turn number
 * (0: none) and/or interface id. */
static turn_lookup lookup_turn_keyed(harness *h, const char *persona, const char *iface,
                                     const char *id, unsigned turn_no,
                                     const char *interface_message_id, size_t window_turns,
                                     uint64_t now_ms)
{
    store_key key = {id, persona, iface};
    char tid[37];
    turn_id_for(turn_no, tid);
    turn_lookup r = {.nmessages = 99, .in_window = 99};
    strcpy(r.turn_id, "untouched");
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "["); /* the caller's earlier bytes stay */
    char *err = NULL;
    r.st = store_load_turn(h->s, &key, turn_no ? tid : NULL, interface_message_id,
                                     window_turns, now_ms, &b, &r.nmessages, r.turn_id,
                                     &r.in_window, &err);
    free(err);
    r.text = pbuf_take(&b);
    return r;
}

static turn_lookup lookup_turn(harness *h, const char *id, unsigned turn_no,
                               const char *interface_message_id, size_t window_turns,
                               uint64_t now_ms)
{
    return lookup_turn_keyed(h, "", "", id, turn_no, interface_message_id, window_turns, now_ms);
}

static void check_not_found(turn_lookup r)
{
    CHECK(r.st == PARLEY_ERR_NOT_FOUND);
    CHECK_STR(r.text, "["); /* nothing appended */
    free(r.text);
}

/* load_turn found turn `turn_no`: in the window (nothing appended), or not
 * (then `messages` in load()'s form, `n` of them). */
static void check_lookup(turn_lookup r, unsigned turn_no, int in_window, const char *messages,
                         size_t n)
{
    char tid[37];
    turn_id_for(turn_no, tid);
    CHECK(r.st == PARLEY_OK);
    CHECK_STR(r.turn_id, tid);
    CHECK(r.in_window == in_window);
    char *want = pstr_printf("[%s", in_window ? "" : messages);
    CHECK_STR(r.text, want);
    CHECK(r.nmessages == (in_window ? 0 : n));
    free(want);
    free(r.text);
}

/* A conversation's lifetime as one line, from its dump and from its list entry
 * (which must agree): "messages turns [participants] last_message_at kept=N/N". */
static char *lifetime_line(harness *h, const char *id, uint64_t now_ms)
{
    char *dump = dump_conversation(h, id, now_ms), *list = dump_list(h, now_ms);
    json_t *conv = dump ? json_loads(dump, 0, NULL) : NULL;
    json_t *root = list ? json_loads(list, 0, NULL) : NULL, *listed = NULL;
    json_t *all = json_object_get(root, "conversations");
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t *c = json_array_get(all, i);
        const char *cid = json_string_value(json_object_get(c, "conversation_id"));
        if (cid && strcmp(cid, id) == 0 && !json_object_get(c, "persona") &&
            !json_object_get(c, "interface_type"))
            listed = c;
    }
    pbuf b = PBUF_INIT;
    if (!conv || !listed) {
        pbuf_puts(&b, "(missing)");
    } else {
        static const char *const keys[] = {"last_message_at", "message_count", "turn_count",
                                           "participants"};
        for (size_t i = 0; i < 4; i++) /* the list entry says the same */
            CHECK(json_equal(json_object_get(conv, keys[i]), json_object_get(listed, keys[i])));
        char *participants = json_dumps(json_object_get(conv, "participants"), JSON_COMPACT);
        pbuf_printf(&b, "%lld %lld %s %s kept=%zu/%lld",
                    (long long)json_integer_value(json_object_get(conv, "message_count")),
                    (long long)json_integer_value(json_object_get(conv, "turn_count")),
                    participants ? participants : "?",
                    json_string_value(json_object_get(conv, "last_message_at")),
                    json_array_size(json_object_get(conv, "turns")),
                    (long long)json_integer_value(json_object_get(listed, "turns")));
        free(participants);
    }
    json_decref(conv);
    json_decref(root);
    free(dump);
    free(list);
    return pbuf_take(&b);
}

static void check_lifetime(harness *h, const char *id, uint64_t now_ms, const char *want)
{
    char *line = lifetime_line(h, id, now_ms);
    CHECK_STR(line, want);
    free(line);
}

/* What the host gave a message comes back with it: find_message, get_message, query. */
static void test_v4_identity_round_trip(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    const char *ids1[] = {"tg-1", NULL}, *meta1[] = {META_ALICE, NULL};
    char *err = NULL;
    CHECK(append_full(&h, "", "telegram", "c", 1, USER("hi") "\n" ASSISTANT("hello"), ids1,
                      meta1, 1000, &err) == PARLEY_OK);
    /* An id that needs escaping; metadata without an id; an id without metadata. */
    const char *ids2[] = {NULL, "out \"2\"\\"}, *meta2[] = {"{}", NULL};
    CHECK(append_full(&h, "", "telegram", "c", 2, USER("again") "\n" ASSISTANT("sure"), ids2,
                      meta2, 2000, &err) == PARLEY_OK);
    free(err);
    const char *user1 =
        "{\"message_id\":\"00000001-1111-4000-8000-000000000000\",\"conversation_id\":\"c\","
        "\"interface_type\":\"telegram\",\"persona\":\"\","
        "\"turn_id\":\"00000001-0000-4000-8000-000000000001\",\"role\":\"user\","
        "\"created_at\":\"1970-01-01T00:00:00.990Z\",\"interface_message_id\":\"tg-1\","
        "\"metadata\":" META_ALICE ",\"message\":" USER("hi") "}";
    const char *assistant1 =
        "{\"message_id\":\"00000001-1111-4000-8000-000000000001\",\"conversation_id\":\"c\","
        "\"interface_type\":\"telegram\",\"persona\":\"\","
        "\"turn_id\":\"00000001-0000-4000-8000-000000000001\",\"role\":\"assistant\","
        "\"created_at\":\"1970-01-01T00:00:00.991Z\",\"message\":" ASSISTANT("hello") "}";
    const char *user2 =
        "{\"message_id\":\"00000002-1111-4000-8000-000000000000\",\"conversation_id\":\"c\","
        "\"interface_type\":\"telegram\",\"persona\":\"\","
        "\"turn_id\":\"00000002-0000-4000-8000-000000000002\",\"role\":\"user\","
        "\"created_at\":\"1970-01-01T00:00:01.990Z\",\"metadata\":{},"
        "\"message\":" USER("again") "}";
    const char *assistant2 =
        "{\"message_id\":\"00000002-1111-4000-8000-000000000001\",\"conversation_id\":\"c\","
        "\"interface_type\":\"telegram\",\"persona\":\"\","
        "\"turn_id\":\"00000002-0000-4000-8000-000000000002\",\"role\":\"assistant\","
        "\"created_at\":\"1970-01-01T00:00:01.991Z\","
        "\"interface_message_id\":\"out \\\"2\\\"\\\\\",\"message\":" ASSISTANT("sure") "}";
    char *found = find_keyed(&h, "", "telegram", "c", "tg-1", 3000);
    CHECK_STR(found, user1);
    free(found);
    found = find_keyed(&h, "", "telegram", "c", "out \"2\"\\", 3000);
    CHECK_STR(found, assistant2);
    free(found);
    const char *want[4] = {user1, assistant1, user2, assistant2};
    for (unsigned i = 0; i < 4; i++) {
        char *m = message_by_id(&h, 1 + i / 2, i % 2, 3000);
        CHECK_STR(m, want[i]);
        free(m);
    }
    char *oldest_first = query_messages(&h, "c", "telegram", 0);
    char *all = pstr_printf("%s,%s,%s,%s", user1, assistant1, user2, assistant2);
    CHECK_STR(oldest_first, all);
    char *newest_first = query_messages(&h, NULL, NULL, 1);
    char *reversed = pstr_printf("%s,%s,%s,%s", assistant2, user2, assistant1, user1);
    CHECK_STR(newest_first, reversed);
    free(oldest_first);
    free(all);
    free(newest_first);
    free(reversed);
    stop(&h);
}

/* An interface id too long is refused with a message; nothing is stored. */
static void test_v4_bad_identity_changes_nothing(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    append_at(&h, "a", 1, USER("a"), 1);
    char *before = snapshot(&h);
    char long_id[STORE_MAX_INTERFACE_MESSAGE_ID + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    const char *ids[] = {long_id};
    char *err = NULL;
    CHECK(append_full(&h, "", "", "a", 2, USER("b"), ids, NULL, 2, &err) != PARLEY_OK);
    CHECK(err != NULL);
    free(err);
    char *after = snapshot(&h);
    CHECK_STR(after, before);
    free(before);
    free(after);
    /* The longest allowed is kept. */
    long_id[STORE_MAX_INTERFACE_MESSAGE_ID] = '\0';
    CHECK(append_full(&h, "", "", "a", 3, USER("c"), ids, NULL, 3, NULL) == PARLEY_OK);
    check_found_id(&h, "a", long_id, 3, 0, 3);
    stop(&h);
}

/* The lifetime counts whole life: past keep_turns, reset only when forgotten. */
static void test_v4_lifetime(const backend_case *bc)
{
    harness h = start(bc, 2, 3, 0);
    append_at(&h, "c", 1, TURN1, 1000);
    check_lifetime(&h, "c", 1000,
                   "4 1 [\"user\",\"assistant\",\"tool\"] 1970-01-01T00:00:00.993Z kept=1/1");
    append_at(&h, "c", 2, USER("two") "\n" ASSISTANT("two"), 2000);
    append_at(&h, "c", 3, USER("three"), 3000); /* drops turn 1 */
    append_at(&h, "c", 3, USER("three"), 3500); /* a retry counts nothing */
    check_lifetime(&h, "c", 3500,
                   "7 3 [\"user\",\"assistant\",\"tool\"] 1970-01-01T00:00:02.990Z kept=2/2");
    /* Participants in a fixed order, whatever order the roles came in. */
    append_at(&h, "p", 4, SYSTEM("the washing machine has finished"), 4000);
    check_lifetime(&h, "p", 4000, "1 1 [\"system\"] 1970-01-01T00:00:03.990Z kept=1/1");
    append_at(&h, "p", 5, ASSISTANT("noted") "\n" USER("thanks"), 5000);
    check_lifetime(&h, "p", 5000,
                   "3 2 [\"user\",\"assistant\",\"system\"] 1970-01-01T00:00:04.991Z kept=2/2");
    /* Forgotten: it starts from zero. */
    CHECK(forget(&h, "c") == PARLEY_OK);
    append_at(&h, "c", 6, USER("again"), 6000);
    check_lifetime(&h, "c", 6000, "1 1 [\"user\"] 1970-01-01T00:00:05.990Z kept=1/1");
    /* Evicted (max 3: c, p, x; y evicts p): it starts from zero too. */
    append_at(&h, "x", 7, USER("x"), 7000);
    append_at(&h, "y", 8, USER("y"), 8000);
    CHECK(dump_conversation(&h, "p", 8000) == NULL);
    append_at(&h, "p", 9, ASSISTANT("back"), 9000);
    check_lifetime(&h, "p", 9000, "1 1 [\"assistant\"] 1970-01-01T00:00:08.990Z kept=1/1");
    stop(&h);

    /* Idle past the timeout: the next append restarts it, lifetime included. */
    h = start(bc, 0, 10, 1000);
    append_at(&h, "c", 1, TURN1, 1000);
    append_at(&h, "c", 2, USER("within"), 1900);
    check_lifetime(&h, "c", 1900,
                   "5 2 [\"user\",\"assistant\",\"tool\"] 1970-01-01T00:00:01.890Z kept=2/2");
    append_at(&h, "c", 3, USER("fresh"), 5000);
    check_lifetime(&h, "c", 5000, "1 1 [\"user\"] 1970-01-01T00:00:04.990Z kept=1/1");
    stop(&h);
}

/* The final answer gets the interface's id: its last assistant message, else its last. */
static void test_v4_set_interface_message_id(const backend_case *bc)
{
    harness h = start(bc, 2, 10, 10000);
    const char *ids1[] = {"in-1", NULL, NULL, NULL}, *meta1[] = {"{\"k\":1}", NULL, NULL, NULL};
    CHECK(append_full(&h, "", "", "c", 1, TURN1, ids1, meta1, 1000, NULL) == PARLEY_OK);
    char mid[37], want[37];
    char *list_before = dump_list(&h, 1000), *conv_before = dump_conversation(&h, "c", 1000);
    CHECK(set_interface_id(&h, 1, "out-1", 1000, mid) == PARLEY_OK);
    message_id_for(1, 3, want); /* "done", after the tool call and its result */
    CHECK_STR(mid, want);
    char *m = find_message(&h, "c", "out-1", 1000);
    char *text = member_of(m, "message");
    CHECK_STR(text, ASSISTANT("done"));
    free(text);
    free(m);
    m = find_message(&h, "c", "in-1", 1000); /* the user's identity stays */
    text = member_of(m, "metadata");
    CHECK_STR(text, "{\"k\":1}");
    free(text);
    free(m);
    /* Not a use of the conversation, and the turns read the same. */
    char *list_after = dump_list(&h, 1000), *conv_after = dump_conversation(&h, "c", 1000);
    CHECK_STR(list_after, list_before);
    CHECK_STR(conv_after, conv_before);
    free(list_before);
    free(list_after);
    free(conv_before);
    free(conv_after);
    /* Replaced, not added. */
    CHECK(set_interface_id(&h, 1, "out-1b", 1000, mid) == PARLEY_OK);
    CHECK_STR(mid, want);
    CHECK(find_message(&h, "c", "out-1", 1000) == NULL);
    check_found_id(&h, "c", "out-1b", 1, 3, 1000);
    /* The last assistant message need not be the last message. */
    append_at(&h, "c", 2, USER("u") "\n" ASSISTANT("checking") "\n" TOOL_RESULT("c2"), 2000);
    CHECK(set_interface_id(&h, 2, "out-2", 2000, mid) == PARLEY_OK);
    message_id_for(2, 1, want);
    CHECK_STR(mid, want);
    /* No assistant message: the last message, whose own id is replaced. */
    const char *ids3[] = {"in-3"};
    CHECK(append_full(&h, "", "", "c", 3, USER("a"), ids3, NULL, 3000, NULL) == PARLEY_OK);
    CHECK(set_interface_id(&h, 3, "out-3", 3000, mid) == PARLEY_OK);
    message_id_for(3, 0, want);
    CHECK_STR(mid, want);
    CHECK(find_message(&h, "c", "in-3", 3000) == NULL);
    check_found_id(&h, "c", "out-3", 3, 0, 3000);
    /* Turn 1 was dropped by keep_turns: not found, and its ids with it. */
    CHECK(set_interface_id(&h, 1, "late", 3000, mid) == PARLEY_ERR_NOT_FOUND);
    CHECK(find_message(&h, "c", "out-1b", 3000) == NULL);
    CHECK(set_interface_id(&h, 99, "x", 3000, mid) == PARLEY_ERR_NOT_FOUND);
    /* Bad ids are refused (with a message) and change nothing. */
    char *before = snapshot(&h);
    char long_id[STORE_MAX_INTERFACE_MESSAGE_ID + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    parley_status st = set_interface_id(&h, 3, "", 3000, mid);
    CHECK(st != PARLEY_OK && st != PARLEY_ERR_NOT_FOUND);
    st = set_interface_id(&h, 3, long_id, 3000, mid);
    CHECK(st != PARLEY_OK && st != PARLEY_ERR_NOT_FOUND);
    char *after = snapshot(&h);
    CHECK_STR(after, before);
    free(before);
    free(after);
    check_found_id(&h, "c", "out-3", 3, 0, 3000);
    /* Expired at now_ms: gone. */
    CHECK(set_interface_id(&h, 3, "too late", 3000 + 10001, mid) == PARLEY_ERR_NOT_FOUND);
    stop(&h);
}

/* find_message: the most recent match, only within its key. */
static void test_v4_find_message(const backend_case *bc)
{
    harness h = start(bc, 3, 10, 0);
    const char *ids1[] = {"m-1"}, *ids2[] = {"m-2", "m-x"}, *ids3[] = {"m-1", "m-1"};
    CHECK(append_full(&h, "", "", "c", 1, USER("one"), ids1, NULL, 1000, NULL) == PARLEY_OK);
    CHECK(append_full(&h, "", "", "c", 2, USER("two") "\n" ASSISTANT("two"), ids2, NULL, 2000,
                      NULL) == PARLEY_OK);
    CHECK(append_full(&h, "", "", "c", 3, USER("three") "\n" ASSISTANT("dup"), ids3, NULL, 3000,
                      NULL) == PARLEY_OK);
    check_found_id(&h, "c", "m-1", 3, 1, 3000); /* the most recently stored of three */
    check_found_id(&h, "c", "m-2", 2, 0, 3000);
    check_found_id(&h, "c", "m-x", 2, 1, 3000);
    /* The same interface id elsewhere is another message. */
    const char *ids4[] = {"m-2"};
    CHECK(append_full(&h, "", "", "d", 4, USER("d"), ids4, NULL, 4000, NULL) == PARLEY_OK);
    check_found_id(&h, "c", "m-2", 2, 0, 4000);
    check_found_id(&h, "d", "m-2", 4, 0, 4000);
    const char *ids5[] = {"m-9"};
    CHECK(append_full(&h, "pirate", "", "c", 5, USER("arr"), ids5, NULL, 5000, NULL) ==
          PARLEY_OK);
    CHECK(find_message(&h, "c", "m-9", 5000) == NULL);
    char *m = find_keyed(&h, "pirate", "", "c", "m-9", 5000);
    CHECK(m && strstr(m, "\"persona\":\"pirate\""));
    free(m);
    CHECK(find_keyed(&h, "", "telegram", "c", "m-1", 5000) == NULL);
    CHECK(find_keyed(&h, "pirate", "", "c", "m-1", 5000) == NULL);
    CHECK(find_message(&h, "c", "m-3", 5000) == NULL);
    CHECK(find_message(&h, "nobody", "m-1", 5000) == NULL);
    CHECK(find_message(&h, "c", "M-1", 5000) == NULL); /* exact, case included */
    /* Dropped turns take their ids: keep 3 of c's turns 1, 2, 3, 6, 7. */
    append_at(&h, "c", 6, USER("six"), 6000);
    append_at(&h, "c", 7, USER("seven"), 7000);
    CHECK(find_message(&h, "c", "m-2", 7000) == NULL);
    check_found_id(&h, "c", "m-1", 3, 1, 7000);
    append_at(&h, "c", 8, USER("eight"), 8000);
    CHECK(find_message(&h, "c", "m-1", 8000) == NULL);
    stop(&h);
}

/* The same conversation id under an interface is another conversation for
 * every v4 call; an idle conversation is gone for them; clearing everything
 * restarts the lifetime. */
static void test_v4_keys_and_expiry(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 1000);
    const char *ids[] = {"tg-1", NULL};
    CHECK(append_full(&h, "", "telegram", "c", 1, QA(1), ids, NULL, 1000, NULL) == PARLEY_OK);
    CHECK(append_full(&h, "", "", "c", 2, QA(2), ids, NULL, 1000, NULL) == PARLEY_OK);
    append_at(&h, "c", 3, QA(3), 1000);
    check_lookup(lookup_turn_keyed(&h, "", "telegram", "c", 0, "tg-1", 1, 1000), 1, 1, NULL, 0);
    check_lookup(lookup_turn(&h, "c", 0, "tg-1", 1, 1000), 2, 0, QA_LOADED(2), 2);
    check_not_found(lookup_turn_keyed(&h, "", "telegram", "c", 2, NULL, 0, 1000));
    check_not_found(lookup_turn_keyed(&h, "pirate", "", "c", 0, "tg-1", 0, 1000));
    char mid[37], want[37];
    CHECK(set_interface_id(&h, 1, "out-1", 1000, mid) == PARLEY_OK);
    message_id_for(1, 1, want);
    CHECK_STR(mid, want);
    char *m = find_keyed(&h, "", "telegram", "c", "out-1", 1000);
    char *mid_found = member_of(m, "message_id"), *iface = member_of(m, "interface_type");
    CHECK_STR(mid_found, want);
    CHECK_STR(iface, "telegram");
    free(m);
    free(mid_found);
    free(iface);
    CHECK(find_message(&h, "c", "out-1", 1000) == NULL);
    /* Idle past the timeout: not found by any of them. */
    CHECK(find_keyed(&h, "", "telegram", "c", "tg-1", 2001) == NULL);
    check_not_found(lookup_turn(&h, "c", 2, NULL, 0, 2001));
    CHECK(set_interface_id(&h, 3, "late", 2001, mid) == PARLEY_ERR_NOT_FOUND);
    stop(&h);

    /* Clearing everything restarts the lifetime too. */
    h = start(bc, 0, 10, 0);
    append_at(&h, "c", 1, TURN1, 1000);
    CHECK(forget(&h, NULL) == PARLEY_OK);
    append_at(&h, "c", 2, ASSISTANT("announcement"), 2000);
    check_lifetime(&h, "c", 2000, "1 1 [\"assistant\"] 1970-01-01T00:00:01.990Z kept=1/1");
    stop(&h);
}

/* load_turn: by turn id or interface id, only in its conversation; in the window or loaded. */
static void test_v4_load_turn(const backend_case *bc)
{
    harness h = start(bc, 0, 10, 0);
    /* One entry per message of the turn. */
    const char *ids1[] = {"tg-1", NULL, NULL, NULL}, *ids2[] = {"tg-2", NULL};
    const char *ids5[] = {NULL, "tg-5"};
    const char *ids6[] = {"tg-6"};
    CHECK(append_full(&h, "", "", "c", 1, TURN1, ids1, NULL, 1000, NULL) == PARLEY_OK);
    CHECK(append_full(&h, "", "", "c", 2, QA(2), ids2, NULL, 2000, NULL) == PARLEY_OK);
    append_at(&h, "c", 3, QA(3), 3000);
    append_at(&h, "c", 4, QA(4), 4000);
    CHECK(append_full(&h, "", "", "c", 5, QA(5), ids5, NULL, 5000, NULL) == PARLEY_OK);
    CHECK(append_full(&h, "", "", "d", 6, USER("elsewhere"), ids6, NULL, 6000, NULL) ==
          PARLEY_OK);
    char *before = snapshot(&h);
    /* Window 0 is everything: always in it. */
    check_lookup(lookup_turn(&h, "c", 1, NULL, 0, 6000), 1, 1, NULL, 0);
    /* Window N: the turns load(c, N) returns. */
    check_lookup(lookup_turn(&h, "c", 1, NULL, 5, 6000), 1, 1, NULL, 0);
    check_lookup(lookup_turn(&h, "c", 1, NULL, 50, 6000), 1, 1, NULL, 0);
    check_lookup(lookup_turn(&h, "c", 1, NULL, 4, 6000), 1, 0, TURN1_JOINED ",", 4);
    check_lookup(lookup_turn(&h, "c", 4, NULL, 2, 6000), 4, 1, NULL, 0);
    check_lookup(lookup_turn(&h, "c", 3, NULL, 2, 6000), 3, 0, QA_LOADED(3), 2);
    check_lookup(lookup_turn(&h, "c", 5, NULL, 1, 6000), 5, 1, NULL, 0);
    /* Out of the window, the turn reads exactly as load() gives it. */
    size_t n = 0;
    char *loaded = load(&h, "c", 0, 6000, &n);
    CHECK(loaded && strncmp(loaded, TURN1_JOINED ",", strlen(TURN1_JOINED ",")) == 0);
    free(loaded);
    /* By interface id: the turn holding that message. */
    check_lookup(lookup_turn(&h, "c", 0, "tg-2", 1, 6000), 2, 0, QA_LOADED(2), 2);
    check_lookup(lookup_turn(&h, "c", 0, "tg-1", 1, 6000), 1, 0, TURN1_JOINED ",", 4);
    check_lookup(lookup_turn(&h, "c", 0, "tg-5", 1, 6000), 5, 1, NULL, 0);
    /* A turn id, when given, decides. */
    check_lookup(lookup_turn(&h, "c", 3, "tg-2", 0, 6000), 3, 1, NULL, 0);
    /* Another conversation's turn, unknown ones: not found. */
    check_not_found(lookup_turn(&h, "c", 6, NULL, 0, 6000));
    check_not_found(lookup_turn(&h, "c", 0, "tg-6", 0, 6000));
    check_not_found(lookup_turn(&h, "c", 99, NULL, 0, 6000));
    check_not_found(lookup_turn(&h, "c", 0, "tg-99", 0, 6000));
    check_not_found(lookup_turn(&h, "c", 0, NULL, 0, 6000));
    check_not_found(lookup_turn(&h, "nobody", 1, NULL, 0, 6000));
    check_not_found(lookup_turn(&h, "d", 1, "tg-1", 0, 6000));
    char *after = snapshot(&h);
    CHECK_STR(after, before); /* reading changes nothing */
    free(before);
    free(after);
    /* An id set after the turn finds it too. */
    char mid[37];
    CHECK(set_interface_id(&h, 3, "out-3", 6000, mid) == PARLEY_OK);
    check_lookup(lookup_turn(&h, "c", 0, "out-3", 1, 6000), 3, 0, QA_LOADED(3), 2);
    stop(&h);

    /* A dropped turn is not found, by either name. */
    h = start(bc, 2, 10, 0);
    CHECK(append_full(&h, "", "", "c", 1, TURN1, ids1, NULL, 1000, NULL) == PARLEY_OK);
    append_at(&h, "c", 2, QA(2), 2000);
    append_at(&h, "c", 3, QA(3), 3000);
    check_not_found(lookup_turn(&h, "c", 1, NULL, 0, 3000));
    check_not_found(lookup_turn(&h, "c", 0, "tg-1", 0, 3000));
    check_lookup(lookup_turn(&h, "c", 2, NULL, 1, 3000), 2, 0, QA_LOADED(2), 2);
    stop(&h);
}

/* Everything v4 shows, for the same appends (compared across backends). */
static char *identity_transcript(const backend_case *bc)
{
    harness h = start(bc, 2, 3, 0);
    const char *ids[] = {"tg-1", NULL, NULL, NULL}, *meta[] = {META_ALICE, NULL, NULL, NULL};
    append_full(&h, "", "", "a", 1, TURN1, ids, meta, 1000, NULL);
    const char *ids2[] = {"tg-2", "out \"2\""}, *meta2[] = {"{\"n\":[1,2]}", NULL};
    append_full(&h, "", "telegram", "a", 2, QA(2), ids2, meta2, 2000, NULL);
    append_at(&h, "a", 3, SYSTEM("note"), 3000);
    append_at(&h, "a", 4, QA(4), 4000);
    char mid[37];
    set_interface_id(&h, 4, "out-4", 4000, mid);
    pbuf b = PBUF_INIT;
    char *snap = snapshot(&h);
    pbuf_puts(&b, snap);
    free(snap);
    const char *finds[][3] = {{"", "out-4"}, {"telegram", "out \"2\""}, {"telegram", "tg-2"},
                              {"", "tg-1"}};
    for (size_t i = 0; i < 4; i++) {
        char *m = find_keyed(&h, "", finds[i][0], "a", finds[i][1], 4000);
        pbuf_printf(&b, "\n%s", m ? m : "(none)");
        free(m);
    }
    turn_lookup r = lookup_turn(&h, "a", 3, NULL, 1, 4000);
    pbuf_printf(&b, "\n%d %d %zu %s %s", (int)r.st, r.in_window, r.nmessages, r.turn_id, r.text);
    free(r.text);
    char *q = query_messages(&h, NULL, NULL, 1);
    pbuf_printf(&b, "\n%s", q);
    free(q);
    stop(&h);
    return pbuf_take(&b);
}

static void test_v4_same_bytes_everywhere(void)
{
    char *first = NULL;
    for (size_t i = 0; i < NBACKENDS; i++) {
        if (!has_v4(&backends[i]))
            continue;
        char *text = identity_transcript(&backends[i]);
        if (!first) {
            CHECK(text && strstr(text, "\"interface_message_id\":\"out-4\""));
            first = text;
            continue;
        }
        CHECK_STR(text, first);
        free(text);
    }
    free(first);
}

/* A durable store keeps ids, metadata, interface ids and the lifetime across a reopen. */
static void test_v4_reopen(const backend_case *bc)
{
    harness h = start(bc, 1, 10, 0);
    const char *ids[] = {"tg-1", NULL, NULL, NULL}, *meta[] = {META_ALICE, NULL, NULL, NULL};
    CHECK(append_full(&h, "", "", "a", 1, TURN1, ids, meta, 1000, NULL) == PARLEY_OK);
    append_at(&h, "a", 2, QA(2), 2000); /* drops turn 1, keeps its counts */
    const char *ids3[] = {"tg-3"};
    CHECK(append_full(&h, "", "", "b", 3, USER("b"), ids3, meta, 3000, NULL) == PARLEY_OK);
    char mid[37];
    CHECK(set_interface_id(&h, 3, "out-3", 3000, mid) == PARLEY_OK);
    char *before = snapshot(&h), *found_before = find_message(&h, "b", "out-3", 3000);
    reopen(&h);
    char *after = snapshot(&h), *found_after = find_message(&h, "b", "out-3", 3000);
    CHECK_STR(after, before);
    CHECK(found_before && strstr(found_before, META_ALICE)); /* its metadata stays */
    CHECK_STR(found_after, found_before);
    check_lifetime(&h, "a", 3000,
                   "6 2 [\"user\",\"assistant\",\"tool\"] 1970-01-01T00:00:01.991Z kept=1/1");
    free(before);
    free(after);
    free(found_before);
    free(found_after);
    stop(&h);
}

static void test_v4(const backend_case *bc)
{
    if (!has_v4(bc)) {
        printf("SKIPPED: %s: every version 4 check (set_interface_message_id, find_message, "
               "load_turn not implemented)\n",
               bc->backend->scheme);
        return;
    }
    test_v4_identity_round_trip(bc);
    test_v4_bad_identity_changes_nothing(bc);
    test_v4_lifetime(bc);
    test_v4_set_interface_message_id(bc);
    test_v4_find_message(bc);
    test_v4_load_turn(bc);
    test_v4_keys_and_expiry(bc);
    if (bc->durable)
        test_v4_reopen(bc);
}

/* ---- version 5: the context record ---- */

/* "<turn count> <record>" of conversation id at now_ms, or "error". */
static char *context_of(harness *h, const char *id, uint64_t now_ms)
{
    store_key key = {id, "", ""};
    pbuf out = {0};
    store_lifetime life = {99, 99, 99, 99};
    char *err = NULL;
    parley_status st = store_context_get(h->s, &key, now_ms, &out, &life, &err);
    char *text = st == PARLEY_OK ? pstr_printf("%llu %s", (unsigned long long)life.turn_count,
                                               out.data ? out.data : "")
                                 : strdup("error");
    CHECK(st != PARLEY_OK || life.turn_count || !life.message_count);
    free(err);
    pbuf_free(&out);
    return text;
}

static parley_status set_context(harness *h, const char *id, const char *json, uint64_t now_ms)
{
    store_key key = {id, "", ""};
    char *err = NULL;
    parley_status st = store_context_set(h->s, &key, json, strlen(json), NULL, 0, now_ms, &err);
    free(err);
    return st;
}

#define CHECK_CONTEXT(h, id, now, want)                                                        \
    do {                                                                                       \
        char *got_ = context_of(h, id, now);                                                   \
        CHECK_STR(got_, want);                                                                 \
        free(got_);                                                                            \
    } while (0)

static void test_v5_context(const backend_case *bc)
{
    harness h = start(bc, 2, 10, 60000);
    CHECK_CONTEXT(&h, "a", 1000, "0 "); /* unknown: nothing */
    CHECK(set_context(&h, "a", "{\"start\":1}", 1000) == PARLEY_ERR_NOT_FOUND);
    CHECK_CONTEXT(&h, "a", 1000, "0 ");
    append_at(&h, "a", 1, TURN1, 1000);
    CHECK_CONTEXT(&h, "a", 1000, "1 ");
    CHECK(set_context(&h, "a", "{\"start\":1}", 1000) == PARLEY_OK);
    CHECK_CONTEXT(&h, "a", 1000, "1 {\"start\":1}");
    append_at(&h, "a", 2, QA(2), 2000); /* a turn without a record keeps it */
    CHECK_CONTEXT(&h, "a", 2000, "2 {\"start\":1}");
    {
        store_key a = {"a", "", ""};
        pbuf out = {0};
        store_lifetime life;
        CHECK(store_context_get(h.s, &a, 2000, &out, &life, NULL) == PARLEY_OK);
        CHECK(life.message_count == 6 && life.turn_count == 2);
        CHECK(life.last_message_ms == 1991);
        pbuf_free(&out);
    }
    h.context = "{\"start\":2,\"summary\":\"caf\u00e9\"}"; /* the turn carries a new one */
    append_at(&h, "a", 3, QA(3), 3000);
    h.context = NULL;
    CHECK_CONTEXT(&h, "a", 3000, "3 {\"start\":2,\"summary\":\"caf\u00e9\"}");
    h.context = "{\"start\":9}"; /* a retried append changes nothing */
    append_at(&h, "a", 3, QA(3), 3000);
    h.context = NULL;
    CHECK_CONTEXT(&h, "a", 3000, "3 {\"start\":2,\"summary\":\"caf\u00e9\"}");
    append_at(&h, "b", 4, USER("b"), 3000);
    CHECK_CONTEXT(&h, "b", 3000, "1 "); /* per conversation */
    /* Compare and set: only over the record expected ("" = none) */
    store_key b = {"b", "", ""};
    CHECK(store_context_set(h.s, &b, "{\"x\":1}", 7, "{}", 2, 3000, NULL) == PARLEY_ERR_BUSY);
    CHECK(store_context_set(h.s, &b, "{\"x\":1}", 7, "", 0, 3000, NULL) == PARLEY_OK);
    CHECK(store_context_set(h.s, &b, "{\"x\":2}", 7, "{\"x\":9}", 7, 3000, NULL) ==
          PARLEY_ERR_BUSY);
    CHECK(store_context_set(h.s, &b, "{\"x\":2}", 7, "{\"x\":1}", 7, 3000, NULL) == PARLEY_OK);
    CHECK_CONTEXT(&h, "b", 3000, "1 {\"x\":2}");
    if (bc->durable) {
        reopen(&h);
        CHECK_CONTEXT(&h, "a", 3000, "3 {\"start\":2,\"summary\":\"caf\u00e9\"}");
    }
    /* Forgetting the conversation forgets its record. */
    store_key a = {"a", "", ""};
    CHECK(store_forget(h.s, &a, NULL) == PARLEY_OK);
    CHECK_CONTEXT(&h, "a", 3000, "0 ");
    append_at(&h, "a", 5, USER("again"), 4000);
    CHECK_CONTEXT(&h, "a", 4000, "1 ");
    /* An idle conversation restarts without it. */
    CHECK(set_context(&h, "a", "{\"start\":1}", 4000) == PARLEY_OK);
    append_at(&h, "a", 6, USER("later"), 4000 + 60001 + 1000);
    CHECK_CONTEXT(&h, "a", 4000 + 60001 + 1000, "1 ");
    /* Clearing everything clears every record. */
    CHECK(set_context(&h, "a", "{\"start\":1}", 70000) == PARLEY_OK);
    CHECK(store_forget(h.s, NULL, NULL) == PARLEY_OK);
    CHECK_CONTEXT(&h, "a", 70000, "0 ");
    stop(&h);
}

/* ---- version 6: turn sizes ---- */

/* load_sized of conversation id: "messages:tokens " per turn, and *n the messages loaded. */
static char *sizes_of(harness *h, const char *id, size_t last, uint64_t now_ms, size_t *n)
{
    store_key key = {id, "", ""};
    pbuf text = PBUF_INIT, out = PBUF_INIT;
    store_sizes z = {0};
    *n = 99;
    CHECK(store_load_sized(h->s, &key, last, now_ms, &text, n, &z, NULL) == PARLEY_OK);
    CHECK(!z.oom);
    for (size_t i = 0; i < z.n; i++)
        pbuf_printf(&out, "%u:%u ", (unsigned)z.turn[i].nmessages, (unsigned)z.turn[i].tokens);
    free(z.turn);
    pbuf_free(&text);
    return out.data ? pbuf_take(&out) : strdup("");
}

static void test_v6_turn_sizes(const backend_case *bc)
{
    harness h = start(bc, 3, 10, 0);
    size_t n;
    char *got = sizes_of(&h, "a", 0, 1000, &n);
    CHECK_STR(got, ""); /* unknown conversation: nothing */
    free(got);
    append_at(&h, "a", 1, TURN1, 1000); /* stored without a size: unknown */
    h.tokens = 70;
    append_at(&h, "a", 2, QA(2), 2000);
    h.tokens = 5000000; /* large (the memory store keeps up to 2^23 - 1) */
    append_at(&h, "a", 3, USER("three"), 3000);
    h.tokens = 0;
    got = sizes_of(&h, "a", 0, 3000, &n);
    CHECK_STR(got, "4:0 2:70 1:5000000 ");
    CHECK(n == 7);
    free(got);
    got = sizes_of(&h, "a", 2, 3000, &n); /* the last two turns only */
    CHECK_STR(got, "2:70 1:5000000 ");
    CHECK(n == 3);
    free(got);
    /* shown with the turn (and not when unknown) */
    char *conv = dump_conversation(&h, "a", 3000);
    CHECK(conv && strstr(conv, "\"finished_at\":\"1970-01-01T00:00:02.000Z\",\"tokens\":70,"));
    CHECK(conv && strstr(conv, "\"tokens\":5000000,"));
    CHECK(conv && !strstr(conv, "\"tokens\":0"));
    free(conv);
    char *turn = dump_turn(&h, 2, 3000);
    CHECK(turn && strstr(turn, "\"tokens\":70,\"messages\":["));
    free(turn);
    if (bc->durable) {
        reopen(&h);
        got = sizes_of(&h, "a", 0, 3000, &n);
        CHECK_STR(got, "4:0 2:70 1:5000000 ");
        free(got);
    }
    h.tokens = 9; /* trimming to 3 turns drops the first, sizes and all */
    append_at(&h, "a", 4, USER("four"), 4000);
    got = sizes_of(&h, "a", 0, 4000, &n);
    CHECK_STR(got, "2:70 1:5000000 1:9 ");
    free(got);
    stop(&h);
}

/* ---- durable backends ---- */

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
        store_close(s);
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
    store_close(h.s);
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
    CHECK(sqlite3_exec(db, "PRAGMA user_version = 5;", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused(bc, newer, "newer Parley (schema version 5; this one reads up to 4)");
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
    store_close(h.s);
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
        parley_status st = store_load(h.s, &key, 0, 2000, &b, &n, &e);
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
        parley_status st = store_list(h.s, 2000, &b, &e);
        CHECK(st == PARLEY_OK || st == PARLEY_ERR_STORAGE);
        free(e);
        pbuf_free(&b);
        store_close(h.s);
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
        store_close(second);
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
    CHECK(store_open(bc->backend, &cfg, &s, NULL) == PARLEY_OK);
    harness full = {bc, path, limits, s, NULL, 0};
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
    harness h = {bc, path, limits, open_at(bc, path, limits, &err), NULL, 0};
    free(err);
    CHECK(h.s != NULL);
    append_at(&h, "a", 1, TURN1, 1000);
    store_close(h.s);
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
        store_close(h.s);
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
    CHECK(store_open(bc->backend, &cfg, &s, NULL) == PARLEY_OK);
    harness h = {bc, path, limits, s, NULL, 0};
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
        test_v4(bc);
        test_v5_context(bc);
        test_v6_turn_sizes(bc);
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
    test_v4_same_bytes_everywhere();
    redis_server_stop(&redis);
    char *cmd = pstr_printf("rm -rf '%s'", tmpdir);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    return check_report();
}
