/*
 * test_store_memory.c -- the in-memory store, through the store_backend
 * table (store.h): what load appends, what the JSON reads show, what the
 * stats count, and that a failed append changes nothing.  The semantics every
 * backend shares are also checked by the conformance suite (tests/store/).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "store/store.h"

/* ---- allocation-failure injection ----
 * Replacing malloc (glibc supports it: malloc, free, calloc, realloc) lets a
 * test fail the k-th allocation of a commit.  Sanitizers own malloc, so under
 * them the OOM test is skipped; the rest of the suite runs everywhere. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FAULT_INJECTION 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define FAULT_INJECTION 0
#endif
#endif
#if !defined(FAULT_INJECTION) && defined(__GLIBC__)
#define FAULT_INJECTION 1
#endif
#ifndef FAULT_INJECTION
#define FAULT_INJECTION 0
#endif

static long allocations_until_failure = -1; /* -1: never fail */

#if FAULT_INJECTION
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static int injected_failure(void)
{
    if (allocations_until_failure < 0)
        return 0;
    return allocations_until_failure-- == 0;
}

void *malloc(size_t n) { return injected_failure() ? NULL : __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return injected_failure() ? NULL : __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return injected_failure() ? NULL : __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
#endif

/* ---- helpers ---- */

#define USER(text) "{\"role\":\"user\",\"content\":\"" text "\"}"
#define ASSISTANT(text) "{\"role\":\"assistant\",\"content\":\"" text "\"}"
#define TOOL_CALL(id)                                                                          \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"" id "\",\"type\":"   \
    "\"function\",\"function\":{\"name\":\"HassTurnOn\",\"arguments\":\"{\\\"name\\\":"       \
    "\\\"kitchen\\\"}\"}}]}"
#define TOOL_RESULT(id) "{\"role\":\"tool\",\"tool_call_id\":\"" id "\",\"content\":\"ok\"}"

/* The store under test: the memory backend, used only through its table. */
static const store_backend *const B = &store_memory_backend;

static store *new_store(size_t keep_turns, size_t max_conversations, uint64_t idle_timeout_ms)
{
    store_config cfg = {.location = "", .limits = {keep_turns, max_conversations, idle_timeout_ms}};
    store *s = NULL;
    char *err = NULL;
    parley_status st = B->open(&cfg, &s, &err);
    free(err);
    return st == PARLEY_OK ? s : NULL;
}

static void close_store(store *h)
{
    if (h)
        B->close(h);
}

static store_key key_of(const char *id)
{
    return (store_key){.conversation_id = id, .persona = "", .interface_type = ""};
}

/* A turn as the tests write it: its messages comma-joined. */
typedef struct joined_turn {
    const char *turn_id;
    uint64_t started_ms, finished_ms;
    const char *messages;
    size_t messages_len;
    size_t nmessages;
} joined_turn;

/* Split "{..},{..}" into its top-level objects (strings may hold braces). */
static size_t split_messages(const char *text, size_t len, store_message *out, size_t max)
{
    size_t n = 0, depth = 0, start = 0;
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' && depth++ == 0) {
            start = i;
        } else if (c == '}' && --depth == 0 && n < max) {
            out[n++] = (store_message){.message_id = "00000000-0000-4000-8000-00000000000a",
                                       .role = "user", .created_ms = 1, .json = text + start,
                                       .json_len = i + 1 - start};
        }
    }
    return n;
}

/* 0, -1 when refused, -2 when out of memory (checked by the tests below). */
static int append_turn(store *h, const char *id, const joined_turn *in, uint64_t now_ms)
{
    store_message msgs[16]; /* on the stack: only the store's allocations may fail */
    store_turn t = {0};
    if (in) {
        size_t n = in->messages ? split_messages(in->messages, in->messages_len, msgs, 16) : 0;
        if (in->messages && n != in->nmessages)
            return -1;
        if (!in->messages && in->nmessages) { /* a message without text */
            msgs[0] = (store_message){.message_id = "x", .role = "user", .json = NULL};
            n = 1;
        }
        t = (store_turn){.turn_id = in->turn_id, .started_ms = in->started_ms,
                         .finished_ms = in->finished_ms, .messages = msgs, .nmessages = n};
    }
    store_key key = key_of(id);
    char *err = NULL;
    parley_status st = B->append(h, id ? &key : NULL, in ? &t : NULL, now_ms, &err);
    free(err);
    return st == PARLEY_OK ? 0 : st == PARLEY_ERR_NO_MEMORY ? -2 : -1;
}

static size_t load_all(store *h, const char *id, uint64_t now_ms, pbuf *out)
{
    store_key key = key_of(id);
    size_t n = 0;
    char *err = NULL;
    B->load(h, &key, 0, now_ms, out, &n, &err);
    free(err);
    return n;
}

/* Reads as 0, -1 not found, -2 out of memory; *out malloc'd. */
static int read_result(parley_status st, pbuf *b, char *err, char **out)
{
    free(err);
    *out = NULL;
    if (st == PARLEY_OK && !(*out = pbuf_take(b)))
        st = PARLEY_ERR_NO_MEMORY;
    pbuf_free(b);
    return st == PARLEY_OK ? 0 : st == PARLEY_ERR_NOT_FOUND ? -1 : -2;
}

static int get_conversation(store *h, const char *id, uint64_t now_ms, char **out)
{
    store_key key = key_of(id);
    pbuf b = PBUF_INIT;
    char *err = NULL;
    return read_result(B->get_conversation(h, &key, now_ms, &b, &err), &b, err, out);
}

static int get_turn(store *h, const char *turn_id, uint64_t now_ms, char **out)
{
    pbuf b = PBUF_INIT;
    char *err = NULL;
    return read_result(B->get_turn(h, turn_id, now_ms, &b, &err), &b, err, out);
}

static int list_all(store *h, uint64_t now_ms, char **out)
{
    pbuf b = PBUF_INIT;
    char *err = NULL;
    return read_result(B->list(h, now_ms, &b, &err), &b, err, out);
}

static int forget(store *h, const char *id)
{
    store_key key = key_of(id);
    char *err = NULL;
    parley_status st = B->forget(h, id ? &key : NULL, &err);
    free(err);
    return st == PARLEY_OK ? 0 : -1;
}

static size_t expire(store *h, uint64_t now_ms)
{
    size_t n = 0;
    B->expire(h, now_ms, &n, NULL);
    return n;
}

/* A 36-char turn id that encodes n, so tests can name turns by number. */
static void turn_id_for(unsigned n, char out[37])
{
    snprintf(out, 37, "%08x-0000-4000-8000-%012x", n, n);
}

static int commit_at(store *h, const char *id, unsigned turn_no, const char *messages,
                     size_t nmessages, uint64_t now_ms)
{
    char tid[37];
    turn_id_for(turn_no, tid);
    joined_turn in = {tid, now_ms > 500 ? now_ms - 500 : 0, now_ms, messages, strlen(messages),
                      nmessages};
    return append_turn(h, id, &in, now_ms);
}

/* The rendered text (malloc'd) and, through *count, the return value. */
static char *render(store *h, const char *id, uint64_t now_ms, size_t *count)
{
    pbuf b = PBUF_INIT;
    size_t n = load_all(h, id, now_ms, &b);
    if (count)
        *count = n;
    return pbuf_take(&b);
}

static char *dump_conversation(store *h, const char *id, uint64_t now_ms)
{
    char *out = NULL;
    return get_conversation(h, id, now_ms, &out) == 0 ? out : NULL;
}

static char *dump_list(store *h, uint64_t now_ms)
{
    char *out = NULL;
    return list_all(h, now_ms, &out) == 0 ? out : NULL;
}

static int turn_exists(store *h, unsigned turn_no, uint64_t now_ms)
{
    char tid[37], *out = NULL;
    turn_id_for(turn_no, tid);
    int rc = get_turn(h, tid, now_ms, &out);
    free(out);
    return rc == 0;
}

/* The conversation ids of dump_list, in order, joined by ' '. */
static char *listed_ids(store *h, uint64_t now_ms)
{
    char *text = dump_list(h, now_ms);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    pbuf ids = PBUF_INIT;
    json_t *conversations = json_object_get(root, "conversations");
    for (size_t i = 0; i < json_array_size(conversations); i++) {
        json_t *id = json_object_get(json_array_get(conversations, i), "conversation_id");
        if (i)
            pbuf_putc(&ids, ' ');
        pbuf_puts(&ids, json_is_string(id) ? json_string_value(id) : "?");
    }
    json_decref(root);
    return pbuf_take(&ids);
}

static store_stats stats_of(store *h)
{
    store_stats s;
    memset(&s, 0, sizeof s);
    B->stats(h, &s, NULL);
    return s;
}

/* ---- tests ---- */

static void test_unknown_id(void)
{
    store *h = new_store(0, 10, 0);
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "[");
    CHECK(load_all(h, "nobody", 1000, &b) == 0);
    CHECK_STR(b.data, "["); /* nothing appended, earlier bytes intact */
    pbuf_free(&b);
    char *out = (char *)"sentinel";
    CHECK(get_conversation(h, "nobody", 1000, &out) == -1);
    CHECK(out == NULL);
    out = (char *)"sentinel";
    CHECK(get_turn(h, "00000000-0000-4000-8000-000000000000", 1000, &out) == -1);
    CHECK(out == NULL);
    CHECK(forget(h, "nobody") == -1);
    char *list = dump_list(h, 1000);
    CHECK_STR(list, "{\"conversations\":[]}");
    free(list);
    close_store(h);
}

static void test_commit_then_render_exact(void)
{
    store *h = new_store(0, 10, 0);
    const char *turn1 = USER("turn on the kitchen") "," TOOL_CALL("call_1") ","
        TOOL_RESULT("call_1") "," ASSISTANT("done");
    const char *turn2 = USER("thanks") "," ASSISTANT("you are welcome");
    CHECK(commit_at(h, "c1", 1, turn1, 4, 1000) == 0);
    CHECK(commit_at(h, "c1", 2, turn2, 2, 2000) == 0);

    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "[{\"role\":\"system\",\"content\":\"sys\"},");
    size_t n = load_all(h, "c1", 2500, &b);
    CHECK(n == 6);
    pbuf expected = PBUF_INIT;
    pbuf_printf(&expected, "[{\"role\":\"system\",\"content\":\"sys\"},%s,%s,", turn1, turn2);
    CHECK_STR(b.data, expected.data);

    /* What a caller does next: close the array; it must be valid JSON. */
    b.len--; /* the trailing ',' */
    pbuf_puts(&b, "]");
    json_t *arr = json_loads(b.data, 0, NULL);
    CHECK(json_array_size(arr) == 7);
    CHECK_STR(json_string_value(json_object_get(json_array_get(arr, 3), "role")), "tool");
    json_decref(arr);
    pbuf_free(&b);
    pbuf_free(&expected);
    close_store(h);
}

static void test_max_turns_keeps_last_whole_turns(void)
{
    store *h = new_store(3, 10, 0);
    const char *turns[5] = {
        USER("one"),
        USER("two") "," TOOL_CALL("c2") "," TOOL_RESULT("c2") "," ASSISTANT("two done"),
        USER("three") "," ASSISTANT("three done"),
        USER("four") "," TOOL_CALL("c4") "," TOOL_RESULT("c4") "," ASSISTANT("four done"),
        USER("five") "," ASSISTANT("five done"),
    };
    const size_t nmessages[5] = {1, 4, 2, 4, 2};
    for (unsigned i = 0; i < 5; i++)
        CHECK(commit_at(h, "c", i + 1, turns[i], nmessages[i], 1000 + i) == 0);

    size_t n = 0;
    char *text = render(h, "c", 2000, &n);
    pbuf expected = PBUF_INIT;
    pbuf_printf(&expected, "%s,%s,%s,", turns[2], turns[3], turns[4]);
    CHECK_STR(text, expected.data);
    CHECK(n == 8);
    free(text);

    for (unsigned i = 1; i <= 2; i++)
        CHECK(!turn_exists(h, i, 2000)); /* dropped turns are gone from the index */
    for (unsigned i = 3; i <= 5; i++)
        CHECK(turn_exists(h, i, 2000));

    store_stats s = stats_of(h);
    CHECK(s.conversations == 1);
    CHECK(s.turns == 3);
    CHECK(s.message_bytes == strlen(turns[2]) + strlen(turns[3]) + strlen(turns[4]));
    pbuf_free(&expected);
    close_store(h);
}

static void test_lru_eviction_order(void)
{
    store *h = new_store(0, 3, 0);
    commit_at(h, "a", 1, USER("a"), 1, 100);
    commit_at(h, "b", 2, USER("b"), 1, 200);
    commit_at(h, "c", 3, USER("c"), 1, 300);
    commit_at(h, "a", 4, USER("a again"), 1, 400); /* a is now the most recent */
    char *order = listed_ids(h, 400);
    CHECK_STR(order, "a c b");
    free(order);

    /* Reads never count as use: rendering and dumping b must not save it. */
    free(render(h, "b", 450, NULL));
    free(dump_conversation(h, "b", 450));
    CHECK(commit_at(h, "d", 5, USER("d"), 1, 500) == 0);
    order = listed_ids(h, 500);
    CHECK_STR(order, "d a c");
    free(order);
    CHECK(!turn_exists(h, 2, 500)); /* b's turn left with it */
    CHECK(stats_of(h).evicted == 1);

    CHECK(commit_at(h, "e", 6, USER("e"), 1, 600) == 0);
    order = listed_ids(h, 600);
    CHECK_STR(order, "e d a");
    free(order);

    store_stats s = stats_of(h);
    CHECK(s.conversations == 3);
    CHECK(s.evicted == 2);
    CHECK(s.expired == 0);
    CHECK(s.turns == 4); /* a has two */
    close_store(h);

    /* With room for one, each new conversation replaces the last, never itself. */
    h = new_store(0, 1, 0);
    commit_at(h, "x", 1, USER("x"), 1, 1);
    commit_at(h, "y", 2, USER("y"), 1, 2);
    size_t n = 0;
    char *text = render(h, "y", 3, &n);
    CHECK(n == 1);
    CHECK_STR(text, USER("y") ",");
    free(text);
    CHECK(stats_of(h).conversations == 1);
    close_store(h);
}

static void test_idle_expiry_on_render(void)
{
    store *h = new_store(0, 10, 1000);
    commit_at(h, "c", 1, USER("hi"), 1, 10000);
    size_t n = 0;
    char *text = render(h, "c", 11000, &n); /* exactly the timeout: still alive */
    CHECK(n == 1);
    free(text);
    text = render(h, "c", 11001, &n);
    CHECK(n == 0);
    CHECK_STR(text, "");
    free(text);
    CHECK(stats_of(h).expired == 1);
    CHECK(stats_of(h).conversations == 0);
    CHECK(stats_of(h).turns == 0);
    /* Forgotten, not hidden: an earlier clock does not bring it back. */
    text = render(h, "c", 10500, &n);
    CHECK(n == 0);
    free(text);
    CHECK(!turn_exists(h, 1, 10500));
    close_store(h);
}

static void test_idle_expiry_on_dumps(void)
{
    store *h = new_store(0, 10, 1000);
    commit_at(h, "old", 1, USER("old"), 1, 1000);
    commit_at(h, "mid", 2, USER("mid"), 1, 1500);
    commit_at(h, "new", 3, USER("new"), 1, 2500);

    char *out = (char *)"sentinel";
    CHECK(get_conversation(h, "old", 2001, &out) == -1);
    CHECK(out == NULL);
    CHECK(stats_of(h).expired == 1);
    CHECK(get_turn(h, "00000002-0000-4000-8000-000000000002", 2600, &out) == -1);
    CHECK(stats_of(h).expired == 2);
    CHECK(turn_exists(h, 3, 2600));

    commit_at(h, "mid2", 4, USER("mid2"), 1, 2600);
    char *order = listed_ids(h, 3550); /* "new" is idle 1050 ms: dropped from the list */
    CHECK_STR(order, "mid2");
    free(order);
    store_stats s = stats_of(h);
    CHECK(s.expired == 3);
    CHECK(s.conversations == 1);
    CHECK(s.evicted == 0);
    close_store(h);
}

static void test_expire(void)
{
    store *h = new_store(0, 10, 1000);
    CHECK(expire(h, 5000) == 0);
    commit_at(h, "a", 1, USER("a"), 1, 0);
    commit_at(h, "b", 2, USER("b"), 1, 500);
    commit_at(h, "c", 3, USER("c"), 1, 900);
    commit_at(h, "a", 4, USER("a2"), 1, 950); /* a touched: b is now the oldest */
    CHECK(expire(h, 1400) == 0);
    CHECK(expire(h, 1501) == 1); /* b */
    char *order = listed_ids(h, 1501);
    CHECK_STR(order, "a c");
    free(order);
    CHECK(expire(h, 1951) == 2);
    CHECK(stats_of(h).conversations == 0);
    CHECK(stats_of(h).expired == 3);
    CHECK(!turn_exists(h, 4, 1951));
    close_store(h);

    h = new_store(0, 10, 0); /* timeout 0: never */
    commit_at(h, "a", 1, USER("a"), 1, 0);
    CHECK(expire(h, UINT64_MAX) == 0);
    CHECK(turn_exists(h, 1, UINT64_MAX));
    close_store(h);
}

/* A turn committed after the timeout starts the conversation afresh. */
static void test_commit_after_idle_restarts(void)
{
    store *h = new_store(0, 10, 1000);
    commit_at(h, "c", 1, USER("stale"), 1, 1000);
    commit_at(h, "c", 2, USER("fresh"), 1, 5000);
    size_t n = 0;
    char *text = render(h, "c", 5000, &n);
    CHECK_STR(text, USER("fresh") ",");
    CHECK(n == 1);
    free(text);
    CHECK(!turn_exists(h, 1, 5000));
    char *dump = dump_conversation(h, "c", 5000);
    json_t *root = dump ? json_loads(dump, 0, NULL) : NULL;
    CHECK_STR(json_string_value(json_object_get(root, "created_at")), "1970-01-01T00:00:05.000Z");
    json_decref(root);
    free(dump);
    store_stats s = stats_of(h);
    CHECK(s.expired == 1);
    CHECK(s.turns == 1);
    CHECK(s.message_bytes == strlen(USER("fresh")));
    close_store(h);
}

static void test_clear(void)
{
    store *h = new_store(0, 10, 0);
    commit_at(h, "a", 1, USER("a"), 1, 1);
    commit_at(h, "b", 2, USER("b"), 1, 2);
    commit_at(h, "b", 3, USER("b2"), 1, 3);
    CHECK(forget(h, "b") == 0);
    CHECK(forget(h, "b") == -1);
    size_t n = 0;
    free(render(h, "b", 4, &n));
    CHECK(n == 0);
    CHECK(!turn_exists(h, 2, 4) && !turn_exists(h, 3, 4));
    free(render(h, "a", 4, &n));
    CHECK(n == 1);
    store_stats s = stats_of(h);
    CHECK(s.conversations == 1 && s.turns == 1 && s.message_bytes == strlen(USER("a")));
    CHECK(s.evicted == 0 && s.expired == 0); /* clearing is neither */

    for (unsigned i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof id, "bulk-%u", i);
        commit_at(h, id, 100 + i, USER("x"), 1, 10 + i);
    }
    CHECK(forget(h, NULL) == 0);
    s = stats_of(h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0);
    CHECK(!turn_exists(h, 1, 200) && !turn_exists(h, 150, 200));
    char *list = dump_list(h, 200);
    CHECK_STR(list, "{\"conversations\":[]}");
    free(list);
    CHECK(commit_at(h, "a", 1, USER("again"), 1, 300) == 0); /* usable afterwards */
    char *text = render(h, "a", 300, &n);
    CHECK_STR(text, USER("again") ",");
    free(text);
    close_store(h);
}

static void test_dumps_are_json(void)
{
    store *h = new_store(0, 10, 0);
    const uint64_t t0 = 1795375860123ULL; /* 2026-11-22T19:31:00.123Z */
    const char *id = "odd \"id\"\\\n\x01";  /* needs escaping */
    const char *turn1 = USER("lights?") "," TOOL_CALL("k1") "," TOOL_RESULT("k1") ","
        ASSISTANT("Done.");
    joined_turn in1 = {"11111111-1111-4111-8111-111111111111", t0, t0 + 2000, turn1,
                           strlen(turn1), 4};
    CHECK(append_turn(h, id, &in1, t0 + 2000) == 0);
    const char *turn2 = USER("bye") "," ASSISTANT("Bye!");
    joined_turn in2 = {"22222222-2222-4222-8222-222222222222", 1709251199999ULL,
                           1709251200000ULL, turn2, strlen(turn2), 2};
    CHECK(append_turn(h, id, &in2, t0 + 9000) == 0);
    CHECK(commit_at(h, "other", 7, USER("x"), 1, t0 + 10000) == 0);

    char *text = dump_conversation(h, id, t0 + 10000);
    json_error_t err;
    json_t *conv = text ? json_loads(text, 0, &err) : NULL;
    CHECK(conv != NULL);
    CHECK_STR(json_string_value(json_object_get(conv, "conversation_id")), id);
    CHECK_STR(json_string_value(json_object_get(conv, "created_at")), "2026-11-22T19:31:02.123Z");
    CHECK_STR(json_string_value(json_object_get(conv, "last_used_at")), "2026-11-22T19:31:09.123Z");
    json_t *turns = json_object_get(conv, "turns");
    CHECK(json_array_size(turns) == 2);
    json_t *first = json_array_get(turns, 0), *second = json_array_get(turns, 1);
    CHECK_STR(json_string_value(json_object_get(first, "turn_id")),
              "11111111-1111-4111-8111-111111111111");
    CHECK_STR(json_string_value(json_object_get(first, "started_at")), "2026-11-22T19:31:00.123Z");
    CHECK_STR(json_string_value(json_object_get(first, "finished_at")), "2026-11-22T19:31:02.123Z");
    json_t *messages = json_object_get(first, "messages");
    CHECK(json_array_size(messages) == 4);
    json_t *call = json_array_get(json_object_get(json_array_get(messages, 1), "tool_calls"), 0);
    CHECK_STR(json_string_value(json_object_get(call, "id")), "k1");
    CHECK_STR(json_string_value(json_object_get(json_array_get(messages, 3), "content")), "Done.");
    CHECK_STR(json_string_value(json_object_get(second, "started_at")), "2024-02-29T23:59:59.999Z");
    CHECK_STR(json_string_value(json_object_get(second, "finished_at")), "2024-03-01T00:00:00.000Z");
    CHECK(json_array_size(json_object_get(second, "messages")) == 2);
    json_decref(conv);
    free(text);

    char *out = NULL;
    CHECK(get_turn(h, "22222222-2222-4222-8222-222222222222", t0 + 10000, &out) == 0);
    json_t *turn = out ? json_loads(out, 0, NULL) : NULL;
    CHECK_STR(json_string_value(json_object_get(turn, "conversation_id")), id);
    json_t *inner = json_object_get(turn, "turn");
    CHECK_STR(json_string_value(json_object_get(inner, "turn_id")),
              "22222222-2222-4222-8222-222222222222");
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(inner, "messages"), 1),
                                                "content")),
              "Bye!");
    json_decref(turn);
    free(out);

    text = dump_list(h, t0 + 10000);
    json_t *list = text ? json_loads(text, 0, NULL) : NULL;
    json_t *all = json_object_get(list, "conversations");
    CHECK(json_array_size(all) == 2);
    json_t *mru = json_array_get(all, 0), *lru = json_array_get(all, 1);
    CHECK_STR(json_string_value(json_object_get(mru, "conversation_id")), "other");
    CHECK(json_integer_value(json_object_get(mru, "turns")) == 1);
    CHECK_STR(json_string_value(json_object_get(lru, "conversation_id")), id);
    CHECK(json_integer_value(json_object_get(lru, "turns")) == 2);
    CHECK_STR(json_string_value(json_object_get(lru, "created_at")), "2026-11-22T19:31:02.123Z");
    CHECK(json_object_get(lru, "last_used_at") != NULL);
    json_decref(list);
    free(text);
    close_store(h);
}

/* Reading is not using: a render (or dump) leaves every dump byte-identical. */
static void test_render_does_not_change_dumps(void)
{
    store *h = new_store(0, 10, 60000);
    commit_at(h, "a", 1, USER("a"), 1, 1000);
    commit_at(h, "b", 2, USER("b"), 1, 2000);
    char *list_before = dump_list(h, 3000), *a_before = dump_conversation(h, "a", 3000);
    free(render(h, "a", 50000, NULL));
    free(render(h, "unknown", 50000, NULL));
    free(dump_conversation(h, "a", 50000));
    CHECK(turn_exists(h, 1, 50000));
    char *list_after = dump_list(h, 3000), *a_after = dump_conversation(h, "a", 3000);
    CHECK_STR(list_after, list_before);
    CHECK_STR(a_after, a_before);
    free(list_before);
    free(list_after);
    free(a_before);
    free(a_after);
    close_store(h);
}

static void test_stats(void)
{
    store *h = new_store(2, 2, 100);
    store_stats s = stats_of(h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0 && s.evicted == 0 &&
          s.expired == 0);
    commit_at(h, "a", 1, USER("1"), 1, 10);
    commit_at(h, "a", 2, USER("22"), 1, 20);
    commit_at(h, "a", 3, USER("333"), 1, 30); /* drops turn 1 */
    s = stats_of(h);
    CHECK(s.conversations == 1 && s.turns == 2);
    CHECK(s.message_bytes == strlen(USER("22")) + strlen(USER("333")));
    commit_at(h, "b", 4, USER("b"), 1, 40);
    commit_at(h, "c", 5, USER("c"), 1, 50); /* evicts a (live) */
    s = stats_of(h);
    CHECK(s.conversations == 2 && s.turns == 2 && s.evicted == 1 && s.expired == 0);
    CHECK(s.message_bytes == strlen(USER("b")) + strlen(USER("c")));
    commit_at(h, "d", 6, USER("d"), 1, 145); /* tail b idle 105 > 100: counted as expired */
    s = stats_of(h);
    CHECK(s.evicted == 1 && s.expired == 1);
    CHECK(expire(h, 1000) == 2);
    s = stats_of(h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0 && s.expired == 3);
    close_store(h);
}

static void test_rejected_input_changes_nothing(void)
{
    store *h = new_store(0, 10, 0);
    commit_at(h, "a", 1, USER("a"), 1, 1);
    char *before = dump_list(h, 2);
    joined_turn no_messages = {"00000009-0000-4000-8000-000000000009", 1, 2, "", 0, 0};
    CHECK(append_turn(h, "a", &no_messages, 2) == -1);
    CHECK(append_turn(h, "new", &no_messages, 2) == -1);
    joined_turn null_text = {"00000009-0000-4000-8000-000000000009", 1, 2, NULL, 5, 1};
    CHECK(append_turn(h, "a", &null_text, 2) == -1);
    CHECK(append_turn(h, "a", NULL, 2) == -1);
    CHECK(append_turn(h, NULL, &null_text, 2) == -1);
    /* Turn ids are stored binary, so only a lowercase UUID is one. */
    joined_turn short_id = {"turn-9", 1, 2, USER("x"), sizeof USER("x") - 1, 1};
    CHECK(append_turn(h, "a", &short_id, 2) == -1);
    joined_turn upper_id = {"0000000A-0000-4000-8000-00000000000A", 1, 2, USER("x"),
                            sizeof USER("x") - 1, 1};
    CHECK(append_turn(h, "a", &upper_id, 2) == -1);
    char *err = NULL;
    store_message m = {.message_id = "00000009-0000-4000-8000-000000000009", .role = "user",
                       .json = USER("x"), .json_len = sizeof USER("x") - 1};
    store_turn t = {.turn_id = "turn-9", .messages = &m, .nmessages = 1};
    store_key key = key_of("a");
    CHECK(B->append(h, &key, &t, 2, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "turn id must be a UUID") != NULL);
    free(err);
    char *after = dump_list(h, 2);
    CHECK_STR(after, before);
    CHECK(stats_of(h).turns == 1);
    free(before);
    free(after);
    close_store(h);
}

/* A turn id comes back exactly as given, and in capitals it names no turn
 * (as in sqlite, which compares the text). */
static void test_turn_id_round_trip(void)
{
    store *h = new_store(0, 10, 0);
    joined_turn lower = {"0000000a-00bc-4000-8000-0000000000ef", 1, 2, USER("x"),
                         sizeof USER("x") - 1, 1};
    CHECK(append_turn(h, "a", &lower, 2) == 0);
    char *out = NULL;
    CHECK(get_turn(h, "0000000a-00bc-4000-8000-0000000000ef", 2, &out) == 0);
    CHECK(out && strstr(out, "\"turn_id\":\"0000000a-00bc-4000-8000-0000000000ef\""));
    free(out);
    out = (char *)"sentinel";
    CHECK(get_turn(h, "0000000A-00BC-4000-8000-0000000000EF", 2, &out) == -1 && !out);
    out = (char *)"sentinel";
    CHECK(get_turn(h, "not-a-uuid", 2, &out) == -1 && !out);
    close_store(h);
}

static void test_limit_edges(void)
{
    store *h = new_store(0, 0, 0); /* max_conversations 0 is out of contract: acts as 1 */
    CHECK(h != NULL);
    commit_at(h, "a", 1, USER("a"), 1, 1);
    commit_at(h, "b", 2, USER("b"), 1, 2);
    char *order = listed_ids(h, 3);
    CHECK_STR(order, "b");
    free(order);

    pbuf failed = PBUF_INIT; /* a buffer that already ran out of memory */
    failed.oom = 1;
    CHECK(load_all(h, "b", 3, &failed) == 0);
    CHECK(failed.len == 0);
    close_store(h);
}

/* Appending a turn id already stored changes nothing and succeeds: a retried
 * append never duplicates a turn (store.h: idempotent on turn_id). */
static void test_duplicate_turn_id(void)
{
    store *h = new_store(1, 10, 0);
    CHECK(commit_at(h, "a", 1, USER("first"), 1, 1) == 0);
    char *before = dump_list(h, 2);
    CHECK(commit_at(h, "a", 1, USER("first"), 1, 2) == 0);   /* the same turn again */
    CHECK(commit_at(h, "b", 1, USER("second"), 1, 2) == 0);  /* same id elsewhere */
    char *after = dump_list(h, 2);
    CHECK_STR(after, before);
    CHECK(stats_of(h).turns == 1 && stats_of(h).conversations == 1);
    char *out = NULL;
    CHECK(get_turn(h, "00000001-0000-4000-8000-000000000001", 3, &out) == 0);
    CHECK(out && strstr(out, "first") != NULL);
    free(out);
    CHECK(commit_at(h, "a", 2, USER("a2"), 1, 4) == 0); /* drops turn 1 */
    CHECK(stats_of(h).turns == 1);
    CHECK(!turn_exists(h, 1, 6));
    CHECK(commit_at(h, "b", 1, USER("second"), 1, 5) == 0); /* its id is free again */
    CHECK(turn_exists(h, 1, 6));
    free(before);
    free(after);
    close_store(h);
}

/* Snapshot of everything observable, to compare around a failed commit.
 * Taken at time 0, which is never idle, so taking it expires nothing. */
static char *snapshot(store *h)
{
    const uint64_t now_ms = 0;
    pbuf b = PBUF_INIT;
    char *list = dump_list(h, now_ms);
    pbuf_puts(&b, list ? list : "(no list)");
    json_t *root = list ? json_loads(list, 0, NULL) : NULL;
    json_t *all = json_object_get(root, "conversations");
    for (size_t i = 0; i < json_array_size(all); i++) {
        const char *id =
            json_string_value(json_object_get(json_array_get(all, i), "conversation_id"));
        char *conv = id ? dump_conversation(h, id, now_ms) : NULL;
        pbuf_puts(&b, conv ? conv : "(missing)");
        free(conv);
    }
    store_stats s = stats_of(h);
    pbuf_printf(&b, "|%zu %zu %zu %zu %zu", s.conversations, s.turns, s.message_bytes, s.evicted,
                s.expired);
    json_decref(root);
    free(list);
    return pbuf_take(&b);
}

/*
 * Fail each allocation of op(h, arg) in turn: every failure must return -1
 * and leave view(h) exactly as it was; the first run with no failure
 * succeeds.  Returns how many failures were injected.
 */
static int all_or_nothing_under_oom(store *h, char *(*view)(store *),
                                    int (*op)(store *, const void *), const void *arg)
{
    char *before = view(h);
    int failures = 0, unchanged = 1;
    for (long k = 0;; k++) {
        allocations_until_failure = k;
        int rc = op(h, arg);
        int injected = allocations_until_failure < 0;
        allocations_until_failure = -1;
        if (rc == 0) /* a failed best-effort allocation (a shrink) may still commit */
            break;
        CHECK(injected); /* -1 only ever for an allocation failure */
        if (!injected)
            break;
        failures++;
        char *after = view(h);
        unchanged &= after && before && strcmp(after, before) == 0;
        free(after);
    }
    CHECK(unchanged);
    free(before);
    return failures;
}

typedef struct commit_args {
    const char *id;
    unsigned turn_no;
    uint64_t now_ms;
} commit_args;

static int commit_op(store *h, const void *arg)
{
    const commit_args *a = arg;
    return commit_at(h, a->id, a->turn_no, USER("under pressure"), 1, a->now_ms);
}

static int commit_under_oom(store *h, const char *id, unsigned turn_no, uint64_t now_ms)
{
    commit_args a = {id, turn_no, now_ms};
    return all_or_nothing_under_oom(h, snapshot, commit_op, &a);
}

/* Whether our malloc is the one in use: valgrind, for one, replaces it too. */
static int fault_injection_works(void)
{
    void *(*volatile allocate)(size_t) = malloc; /* keep the call from being folded */
    allocations_until_failure = 0;
    void *p = allocate(16);
    allocations_until_failure = -1;
    free(p);
    return p == NULL;
}

static void test_commit_is_all_or_nothing_under_oom(void)
{
    if (!FAULT_INJECTION || !fault_injection_works()) {
        printf("test_commit_is_all_or_nothing_under_oom: skipped (malloc is not ours to fail)\n");
        return;
    }
    store *h = new_store(2, 20, 1000);
    int most = 0;
    unsigned turn_no = 1;
    for (unsigned i = 0; i < 40; i++) { /* new conversations: both dicts grow on the way */
        char id[16];
        snprintf(id, sizeof id, "conv-%u", i);
        int f = commit_under_oom(h, id, turn_no++, 100 + i);
        most = f > most ? f : most;
    }
    CHECK(most >= 3); /* turn, conversation, and a dict growth at some point */
    CHECK(stats_of(h).conversations == 20);
    CHECK(stats_of(h).evicted == 20);
    CHECK(commit_under_oom(h, "conv-39", turn_no++, 200) >= 1); /* existing */
    CHECK(commit_under_oom(h, "conv-39", turn_no++, 201) >= 1); /* trims */
    CHECK(commit_under_oom(h, "conv-30", turn_no++, 1300) >= 1); /* idle: restarts */
    CHECK(stats_of(h).expired == 1);
    size_t n = 0;
    char *text = render(h, "conv-39", 300, &n);
    CHECK_STR(text, USER("under pressure") "," USER("under pressure") ",");
    free(text);

    /* Dumps report -2 and hand out nothing; the store is untouched. */
    char *before = snapshot(h);
    int dump_failures = 0, dumps_ok = 1;
    for (long k = 0;; k++) {
        char *out = (char *)"sentinel";
        allocations_until_failure = k;
        int rc = get_conversation(h, "conv-39", 300, &out);
        allocations_until_failure = -1;
        if (rc == 0) {
            free(out);
            break;
        }
        dump_failures++;
        dumps_ok &= rc == -2 && out == NULL;
    }
    CHECK(dump_failures >= 1 && dumps_ok);
    char *after = snapshot(h);
    CHECK_STR(after, before);
    free(before);
    free(after);

    /* Clearing everything cannot fail, not even without memory for fresh tables. */
    allocations_until_failure = 0;
    int rc = forget(h, NULL);
    allocations_until_failure = -1;
    CHECK(rc == 0);
    store_stats s = stats_of(h);
    CHECK(s.conversations == 0 && s.turns == 0 && s.message_bytes == 0);
    CHECK(!turn_exists(h, turn_no - 1, 300));
    CHECK(commit_at(h, "after", 1, USER("x"), 1, 300) == 0);
    close_store(h);
}

/* ---- version 4 under allocation failure ---- */

/* Every message with its identity (a query shows it), then the snapshot. */
static char *identity_view(store *h)
{
    store_query q = {.until_ms = UINT64_MAX, .limit = 100, .newest_first = 1};
    pbuf b = PBUF_INIT;
    size_t count = 0;
    uint64_t last = 0;
    int more = 0;
    CHECK(B->query(h, &q, 0, &b, &count, &last, &more, NULL) == PARLEY_OK);
    char *snap = snapshot(h);
    pbuf_printf(&b, "|%s", snap ? snap : "(none)");
    free(snap);
    return pbuf_take(&b);
}

typedef struct identity_op {
    int set;                    /* 0: append turn_no with identity; 1: set its answer's id */
    unsigned turn_no;
    const char *conversation_id;
    const char *interface_id;
    uint64_t now_ms;
} identity_op;

/* 0, or -1 on failure (the tests below only ever fail allocations). */
static int run_identity_op(store *h, const void *arg)
{
    const identity_op *op = arg;
    char tid[37], mids[2][37];
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", op->turn_no, op->turn_no);
    if (op->set)
        return B->set_interface_message_id(h, tid, op->interface_id, op->now_ms, NULL, NULL) ==
                       PARLEY_OK
                   ? 0
                   : -1;
    for (unsigned i = 0; i < 2; i++)
        snprintf(mids[i], sizeof mids[i], "%08x-2222-4000-8000-%012x", op->turn_no, i);
    const char *meta = "{\"chat\":7}";
    store_message m[2] = {
        {mids[0], "user", op->now_ms, USER("q"), strlen(USER("q")), op->interface_id, meta,
         strlen(meta)},
        {mids[1], "assistant", op->now_ms, ASSISTANT("a"), strlen(ASSISTANT("a")), NULL, NULL, 0},
    };
    store_turn t = {tid, op->now_ms, op->now_ms, m, 2, NULL, 0, 0};
    store_key key = key_of(op->conversation_id);
    return B->append(h, &key, &t, op->now_ms, NULL) == PARLEY_OK ? 0 : -1;
}

/* Each failure leaves everything as it was, ids and metadata included. */
static int identity_op_under_oom(store *h, const identity_op *op)
{
    return all_or_nothing_under_oom(h, identity_view, run_identity_op, op);
}

static void test_identity_is_all_or_nothing_under_oom(void)
{
    if (!FAULT_INJECTION || !fault_injection_works()) {
        printf("test_identity_is_all_or_nothing_under_oom: skipped (malloc is not ours to fail)\n");
        return;
    }
    store *h = new_store(2, 20, 0);
    int most = 0;
    for (unsigned i = 0; i < 30; i++) { /* the identity dict grows on the way */
        char id[16], iface[16];
        snprintf(id, sizeof id, "conv-%u", i % 10);
        snprintf(iface, sizeof iface, "in-%u", i);
        identity_op op = {0, 100 + i, id, iface, 1000 + i};
        int f = identity_op_under_oom(h, &op);
        most = f > most ? f : most;
    }
    CHECK(most >= 3); /* turn, identity block, and a dict growth at some point */
    /* Setting an answer's id: a new block replaces the old (or is added). */
    identity_op set = {1, 129, NULL, "out-129", 2000};
    CHECK(identity_op_under_oom(h, &set) >= 1);
    identity_op set_again = {1, 129, NULL, "out-129b", 2000};
    CHECK(identity_op_under_oom(h, &set_again) >= 1);
    store_key key = key_of("conv-9");
    pbuf b = PBUF_INIT;
    CHECK(B->find_message(h, &key, "out-129b", 2000, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strstr(b.data, ASSISTANT("a")));
    pbuf_free(&b);
    CHECK(B->find_message(h, &key, "in-29", 2000, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strstr(b.data, "\"metadata\":{\"chat\":7}"));
    pbuf_free(&b);
    close_store(h);
}

/* ---- concurrency ---- */

enum { THREADS = 4, ITERATIONS = 1500, MAX_TURNS = 40 };

typedef struct worker {
    store *h;
    unsigned index;
    int errors;
} worker;

/* Rendered turns are "user T, assistant T" pairs: never a half of one. */
static int pairs_are_whole(const char *text)
{
    const char *p = text;
    while (*p) {
        char user_tag[32], assistant_tag[32];
        int used = 0;
        if (sscanf(p, "{\"role\":\"user\",\"content\":\"%31[^\"]\"},%n", user_tag, &used) != 1 ||
            !used)
            return 0;
        p += used;
        used = 0;
        if (sscanf(p, "{\"role\":\"assistant\",\"content\":\"%31[^\"]\"},%n", assistant_tag,
                   &used) != 1 || !used)
            return 0;
        p += used;
        if (strcmp(user_tag, assistant_tag) != 0)
            return 0;
    }
    return 1;
}

static void *work(void *arg)
{
    worker *w = arg;
    char own[16], messages[128], tid[37];
    snprintf(own, sizeof own, "own-%u", w->index);
    for (unsigned i = 0; i < ITERATIONS; i++) {
        unsigned turn_no = w->index * 1000000u + i;
        snprintf(messages, sizeof messages, USER("t%u") "," ASSISTANT("t%u"), turn_no, turn_no);
        int to_scratch = i % 7 == 3;
        const char *target = to_scratch ? "scratch" : i % 2 ? "shared" : own;
        turn_id_for(turn_no, tid);
        joined_turn in = {tid, i, i + 1, messages, strlen(messages), 2};
        w->errors += append_turn(w->h, target, &in, i + 1) != 0;

        size_t n = 0;
        char *text = render(w->h, i % 3 ? own : "shared", i + 1, &n);
        w->errors += !text || !pairs_are_whole(text) || n % 2 != 0 || n > 2 * MAX_TURNS;
        free(text);

        char *out = NULL;
        if (i % 5 == 0) {
            w->errors += list_all(w->h, i + 1, &out) != 0;
            free(out);
            out = NULL;
        }
        if (i % 5 == 1) {
            w->errors += get_conversation(w->h, "shared", i + 1, &out) == -2;
            free(out);
            out = NULL;
        }
        if (target == own) { /* only this thread commits there: still present */
            w->errors += get_turn(w->h, tid, i + 1, &out) != 0;
            free(out);
        }
        if (w->index == 3 && i % 100 == 0)
            forget(w->h, "scratch");
        if (w->index == 2 && i % 50 == 0) {
            store_stats s;
            s = stats_of(w->h);
            w->errors += s.turns > 6 * MAX_TURNS || s.conversations > 6;
        }
    }
    return NULL;
}

static void test_concurrent_use(void)
{
    store *h = new_store(MAX_TURNS, 100, 0);
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        workers[i] = (worker){h, i, 0};
        CHECK(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    int errors = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        errors += workers[i].errors;
    }
    CHECK(errors == 0);

    for (unsigned i = 0; i < THREADS; i++) {
        char own[16];
        snprintf(own, sizeof own, "own-%u", i);
        size_t n = 0;
        free(render(h, own, ITERATIONS, &n));
        CHECK(n == 2 * MAX_TURNS);
    }
    size_t n = 0;
    char *text = render(h, "shared", ITERATIONS, &n);
    CHECK(n == 2 * MAX_TURNS);
    CHECK(text && pairs_are_whole(text));
    free(text);
    char *list = dump_list(h, ITERATIONS);
    json_t *root = list ? json_loads(list, 0, NULL) : NULL;
    size_t listed = json_array_size(json_object_get(root, "conversations"));
    CHECK(listed == 5 || listed == 6); /* 4 own + shared (+ scratch unless just cleared) */
    json_decref(root);
    free(list);
    char *dump = dump_conversation(h, "shared", ITERATIONS);
    root = dump ? json_loads(dump, 0, NULL) : NULL;
    CHECK(json_array_size(json_object_get(root, "turns")) == MAX_TURNS);
    json_decref(root);
    free(dump);
    close_store(h);
}

/* load() sends the last N whole turns of what is kept; N = 0 sends all. */
static void test_load_last_turns(void)
{
    store *h = new_store(0, 10, 0);
    CHECK(commit_at(h, "c", 1, USER("one"), 1, 1) == 0);
    CHECK(commit_at(h, "c", 2, USER("two") "," ASSISTANT("two done"), 2, 2) == 0);
    CHECK(commit_at(h, "c", 3, USER("three"), 1, 3) == 0);
    store_key key = key_of("c");
    const struct { size_t last; const char *expected; size_t n; } cases[] = {
        {0, USER("one") "," USER("two") "," ASSISTANT("two done") "," USER("three") ",", 4},
        {1, USER("three") ",", 1},
        {2, USER("two") "," ASSISTANT("two done") "," USER("three") ",", 3},
        {3, USER("one") "," USER("two") "," ASSISTANT("two done") "," USER("three") ",", 4},
        {99, USER("one") "," USER("two") "," ASSISTANT("two done") "," USER("three") ",", 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pbuf b = PBUF_INIT;
        size_t n = 0;
        CHECK(B->load(h, &key, cases[i].last, 4, &b, &n, NULL) == PARLEY_OK);
        CHECK_STR(b.data, cases[i].expected);
        CHECK(n == cases[i].n);
        pbuf_free(&b);
    }
    CHECK(stats_of(h).turns == 3); /* loading fewer keeps all */
    close_store(h);
}

/* The same conversation id under another persona or interface is another conversation. */
static void test_key_qualifiers(void)
{
    store *h = new_store(0, 10, 0);
    const store_key keys[] = {
        {"c", "", ""}, {"c", "nova", ""}, {"c", "", "nova"}, {"c", "no", "va"}, {"c", "nov", "a"},
    };
    const size_t nkeys = sizeof keys / sizeof keys[0];
    for (size_t i = 0; i < nkeys; i++) {
        char tid[37], text[64];
        turn_id_for((unsigned)i + 1, tid);
        snprintf(text, sizeof text, USER("k%zu"), i);
        store_message m = {"00000000-0000-4000-8000-000000000001", "user", 1, text, strlen(text), NULL, NULL, 0};
        store_turn t = {tid, 1, 2, &m, 1, NULL, 0, 0};
        CHECK(B->append(h, &keys[i], &t, 2, NULL) == PARLEY_OK);
    }
    CHECK(stats_of(h).conversations == nkeys);
    for (size_t i = 0; i < nkeys; i++) {
        char expected[64];
        snprintf(expected, sizeof expected, USER("k%zu") ",", i);
        pbuf b = PBUF_INIT;
        size_t n = 0;
        CHECK(B->load(h, &keys[i], 0, 3, &b, &n, NULL) == PARLEY_OK);
        CHECK_STR(b.data, expected);
        pbuf_free(&b);
    }
    /* Reads show the conversation id alone, whatever qualifies it. */
    pbuf b = PBUF_INIT;
    CHECK(B->get_conversation(h, &keys[3], 3, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strncmp(b.data, "{\"conversation_id\":\"c\",", 23) == 0);
    pbuf_free(&b);
    CHECK(B->forget(h, &keys[1], NULL) == PARLEY_OK);
    CHECK(B->forget(h, &keys[1], NULL) == PARLEY_ERR_NOT_FOUND);
    CHECK(stats_of(h).conversations == nkeys - 1);
    close_store(h);
}

/* Message ids come back as given, in turns of every size: the first ids of a
 * turn are parsed once while it is checked, the rest again when stored. */
static void test_message_ids_of_long_turns(void)
{
    store *h = new_store(0, 10, 0);
    for (size_t n = 1; n <= 12; n += 11) { /* 1 and 12 messages */
        store_message msgs[12];
        char ids[12][37];
        for (size_t i = 0; i < n; i++) {
            snprintf(ids[i], sizeof ids[i], "%08zx-1111-4222-8333-%012zx", n, i);
            msgs[i] = (store_message){.message_id = ids[i], .role = i % 2 ? "assistant" : "user",
                                      .created_ms = 1, .json = "{\"content\":\"x\"}",
                                      .json_len = 15};
        }
        char tid[37];
        turn_id_for((unsigned)(700 + n), tid);
        store_turn t = {tid, 1, 2, msgs, n, NULL, 0, 0};
        store_key key = key_of("long");
        char *err = NULL;
        CHECK(B->append(h, &key, &t, 3, &err) == PARLEY_OK);
        free(err);
        for (size_t i = 0; i < n; i++) { /* each message found by its id, in its turn */
            pbuf b = PBUF_INIT;
            CHECK(B->get_message(h, ids[i], 3, &b, &err) == PARLEY_OK);
            CHECK(b.data && strstr(b.data, tid) != NULL);
            pbuf_free(&b);
            free(err);
            err = NULL;
        }
    }
    close_store(h);
}

/* A turn's size in tokens rides in the header's spare bits: 23 of them, so a
 * larger size is kept as 2^23 - 1 (more than any model's window), never wrapped. */
static void test_turn_size_saturates(void)
{
    store *h = new_store(0, 10, 0);
    store_key key = key_of("big");
    const uint32_t sizes[] = {1, (1u << 23) - 1, 1u << 23, UINT32_MAX};
    for (unsigned i = 0; i < 4; i++) {
        char tid[37];
        turn_id_for(i + 1, tid);
        const char *text = USER("x");
        store_message m = {"00000000-0000-4000-8000-000000000001", "user", 1, text,
                           strlen(text), NULL, NULL, 0};
        store_turn t = {tid, 1, 2, &m, 1, NULL, 0, sizes[i]};
        CHECK(B->append(h, &key, &t, 2, NULL) == PARLEY_OK);
    }
    pbuf b = PBUF_INIT;
    store_sizes z = {0};
    size_t n = 0;
    CHECK(B->load_sized(h, &key, 0, 3, &b, &n, &z, NULL) == PARLEY_OK);
    CHECK(n == 4 && z.n == 4 && !z.oom);
    const uint32_t kept[] = {1, (1u << 23) - 1, (1u << 23) - 1, (1u << 23) - 1};
    for (unsigned i = 0; i < 4 && i < z.n; i++)
        CHECK(z.turn[i].nmessages == 1 && z.turn[i].tokens == kept[i]);
    free(z.turn);
    pbuf_free(&b);
    close_store(h);
}

int main(void)
{
    test_turn_size_saturates();
    test_load_last_turns();
    test_key_qualifiers();
    test_unknown_id();
    test_commit_then_render_exact();
    test_max_turns_keeps_last_whole_turns();
    test_lru_eviction_order();
    test_idle_expiry_on_render();
    test_idle_expiry_on_dumps();
    test_expire();
    test_commit_after_idle_restarts();
    test_clear();
    test_dumps_are_json();
    test_render_does_not_change_dumps();
    test_stats();
    test_rejected_input_changes_nothing();
    test_turn_id_round_trip();
    test_limit_edges();
    test_duplicate_turn_id();
    test_commit_is_all_or_nothing_under_oom();
    test_identity_is_all_or_nothing_under_oom();
    test_concurrent_use();
    test_message_ids_of_long_turns();
    close_store(NULL);
    return check_report();
}
