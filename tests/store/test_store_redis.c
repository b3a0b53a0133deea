/*
 * test_store_redis.c -- the Redis store against a real redis-server: the
 * store contract (store.h) through the backend table, then what is Redis's
 * own: the location syntax, the password never shown, two stores (hosts)
 * sharing one Redis, key prefixes, TTLs, Redis killed and restarted
 * mid-run, and the query and identity indexes (paging across script calls,
 * data of the previous layout upgraded, indexes after trim/forget/TTL).
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/check.h"
#include "redis_server.h"
#include "store/store.h"

#define T0 1764000000000ULL /* a fixed wall clock: the store uses the caller's */
#define PASSWORD "s3cret-p@ss"

static redis_server server;
static char url[160];

/* ---- helpers ---- */

static const store_backend *B = &store_redis_backend;

/* What follows "redis:" in a history_store value. */
static const char *location(const char *spec)
{
    return strncmp(spec, "redis:", 6) == 0 ? spec + 6 : spec;
}

static char log_text[8192];
static void capture_log(void *ud, parley_log_level level, const char *message)
{
    (void)ud;
    (void)level;
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", message);
}

static uint64_t lease_ms; /* for the next open_store; 0 = the default */

static store *open_store(const char *spec, const char *prefix, size_t keep, size_t max_conv,
                         uint64_t idle_ms)
{
    store_config cfg = {.location = location(spec),
                        .limits = {keep, max_conv, idle_ms},
                        .log = capture_log,
                        .key_prefix = prefix,
                        .lease_ms = lease_ms};
    store *s = NULL;
    char *err = NULL;
    parley_status st = B->open(&cfg, &s, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "open %s: %s\n", spec, err ? err : "?");
    free(err);
    return s;
}

static store_key key_of(const char *id)
{
    store_key k = {id, "", ""};
    return k;
}

/* A turn of `n` messages; texts are "<tag>-<i>". */
typedef struct test_turn {
    char turn_id[48];
    char json[4][128];
    char ids[4][48];
    store_message messages[4];
    store_turn turn;
} test_turn;

static void make_turn(test_turn *t, int number, const char *tag, size_t n)
{
    snprintf(t->turn_id, sizeof t->turn_id, "00000000-0000-4000-8000-%012d", number % 1000000);
    for (size_t i = 0; i < n; i++) {
        snprintf(t->json[i], sizeof t->json[i], "{\"role\":\"%s\",\"content\":\"%s-%zu, \\\"ok\\\"\"}",
                 i ? "assistant" : "user", tag, i);
        snprintf(t->ids[i], sizeof t->ids[i], "10000000-0000-4000-8000-%06d%06u", number % 1000000,
                 (unsigned)i);
        t->messages[i] = (store_message){t->ids[i], i ? "assistant" : "user", T0 + (uint64_t)number,
                                         t->json[i], strlen(t->json[i]), NULL, NULL, 0};
    }
    t->turn = (store_turn){t->turn_id, T0 + (uint64_t)number, T0 + (uint64_t)number + 5,
                           t->messages, n, NULL, 0, 0};
}

static parley_status append(store *s, const char *id, int number, const char *tag, size_t n,
                            uint64_t now)
{
    test_turn t;
    make_turn(&t, number, tag, n);
    store_key k = key_of(id);
    char *err = NULL;
    parley_status st = B->append(s, &k, &t.turn, now, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "append: %s\n", err ? err : "?");
    free(err);
    return st;
}

/* The loaded messages as a string ("" when none); *count gets their number. */
static char *load(store *s, const char *id, size_t last, uint64_t now, size_t *count)
{
    store_key k = key_of(id);
    pbuf b = PBUF_INIT;
    size_t n = 0;
    char *err = NULL;
    parley_status st = B->load(s, &k, last, now, &b, &n, &err);
    free(err);
    if (count)
        *count = n;
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static char *dump_conversation(store *s, const char *id, uint64_t now, parley_status *st)
{
    store_key k = key_of(id);
    pbuf b = PBUF_INIT;
    *st = B->get_conversation(s, &k, now, &b, NULL);
    return pbuf_take(&b);
}

static char *dump_list(store *s, uint64_t now)
{
    pbuf b = PBUF_INIT;
    B->list(s, now, &b, NULL);
    return pbuf_take(&b);
}

static store_stats stats_of(store *s)
{
    store_stats st;
    B->stats(s, &st, NULL);
    return st;
}

static void forget_everything(store *s)
{
    CHECK(B->forget(s, NULL, NULL) == PARLEY_OK);
}

/* ---- the location ---- */

static void test_bad_locations(void)
{
    static const char *const bad[][2] = {
        {"redis:127.0.0.1:6379", "must start with"},
        {"redis://127.0.0.1", "port is missing"},
        {"redis://127.0.0.1:0", "port must be"},
        {"redis://127.0.0.1:65536", "port must be"},
        {"redis://127.0.0.1:63x9", "port must be"},
        {"redis://:6379", "host is empty"},
        {"redis://user:" PASSWORD "@127.0.0.1:6379", "credentials"},
        {"redis://:@127.0.0.1:6379", "credentials"},
        {"redis://:" PASSWORD "@127.0.0.1:6379/x", "database"},
        {"redis://:" PASSWORD "@127.0.0.1:6379/", "database"},
        {"redis://127.0.0.1:6379/1/2", "database"},
        {"redis://[::1:6379", "IPv6"},
        {"redis://ho st:6379", "not allowed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        store_config cfg = {.location = location(bad[i][0]), .limits = {0, 10, 0}};
        store *s = NULL;
        char *err = NULL;
        CHECK(B->open(&cfg, &s, &err) == PARLEY_ERR_INVALID_INPUT);
        CHECK(s == NULL);
        CHECK(err && strstr(err, bad[i][1]));
        CHECK(err && strstr(err, "expected redis://[:PASSWORD@]HOST:PORT[/DB]"));
        CHECK(err && !strstr(err, PASSWORD));
        if (!err || !strstr(err, bad[i][1]))
            fprintf(stderr, "  location %s: %s\n", bad[i][0], err ? err : "(null)");
        free(err);
    }
}

/* Redis down at open: create() fails at once, naming the store, not the password. */
static void test_unreachable_at_open(void)
{
    char spec[160];
    snprintf(spec, sizeof spec, "redis://:" PASSWORD "@127.0.0.1:%d/3", server.port == 1 ? 2 : 1);
    store_config cfg = {.location = location(spec), .limits = {0, 10, 0}};
    store *s = NULL;
    char *err = NULL;
    CHECK(B->open(&cfg, &s, &err) == PARLEY_ERR_STORAGE);
    CHECK(s == NULL);
    CHECK(err && strstr(err, "redis store 127.0.0.1:"));
    CHECK(err && strstr(err, "cannot connect"));
    CHECK(err && !strstr(err, PASSWORD));
    free(err);
}

static void test_wrong_password(void)
{
    char spec[160];
    snprintf(spec, sizeof spec, "redis://:wrong-" PASSWORD "@127.0.0.1:%d", server.port);
    store_config cfg = {.location = location(spec), .limits = {0, 10, 0}};
    store *s = NULL;
    char *err = NULL;
    CHECK(B->open(&cfg, &s, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "authentication failed"));
    CHECK(err && !strstr(err, PASSWORD));
    free(err);
    /* and no password at all, when the server needs one */
    snprintf(spec, sizeof spec, "redis://127.0.0.1:%d", server.port);
    cfg.location = location(spec);
    CHECK(B->open(&cfg, &s, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "NOAUTH"));
    free(err);
}

/* ---- the store contract ---- */

static void test_round_trip(store *s)
{
    forget_everything(s);
    size_t n = 99;
    char *text = load(s, "kitchen", 0, T0, &n);
    CHECK_STR(text, "");
    CHECK(n == 0);
    free(text);

    CHECK(append(s, "kitchen", 1, "a", 2, T0 + 10) == PARLEY_OK);
    CHECK(append(s, "kitchen", 2, "b", 3, T0 + 20) == PARLEY_OK);
    text = load(s, "kitchen", 0, T0 + 30, &n);
    CHECK(n == 5);
    CHECK_STR(text, "{\"role\":\"user\",\"content\":\"a-0, \\\"ok\\\"\"},"
                    "{\"role\":\"assistant\",\"content\":\"a-1, \\\"ok\\\"\"},"
                    "{\"role\":\"user\",\"content\":\"b-0, \\\"ok\\\"\"},"
                    "{\"role\":\"assistant\",\"content\":\"b-1, \\\"ok\\\"\"},"
                    "{\"role\":\"assistant\",\"content\":\"b-2, \\\"ok\\\"\"},");
    free(text);
    text = load(s, "kitchen", 1, T0 + 30, &n); /* the last turn only: whole */
    CHECK(n == 3);
    static const char last_turn[] = "{\"role\":\"user\",\"content\":\"b-0";
    CHECK(text && strncmp(text, last_turn, strlen(last_turn)) == 0);
    free(text);

    parley_status st;
    char *json = dump_conversation(s, "kitchen", T0 + 30, &st);
    CHECK(st == PARLEY_OK);
    CHECK_STR(json,
              "{\"conversation_id\":\"kitchen\",\"created_at\":\"2025-11-24T16:00:00.010Z\","
              "\"last_used_at\":\"2025-11-24T16:00:00.020Z\","
              "\"last_message_at\":\"2025-11-24T16:00:00.002Z\",\"message_count\":5,"
              "\"turn_count\":2,\"participants\":[\"user\",\"assistant\"],\"turns\":["
              "{\"turn_id\":\"00000000-0000-4000-8000-000000000001\",\"started_at\":"
              "\"2025-11-24T16:00:00.001Z\",\"finished_at\":\"2025-11-24T16:00:00.006Z\","
              "\"messages\":[{\"role\":\"user\",\"content\":\"a-0, \\\"ok\\\"\"},"
              "{\"role\":\"assistant\",\"content\":\"a-1, \\\"ok\\\"\"}]},"
              "{\"turn_id\":\"00000000-0000-4000-8000-000000000002\",\"started_at\":"
              "\"2025-11-24T16:00:00.002Z\",\"finished_at\":\"2025-11-24T16:00:00.007Z\","
              "\"messages\":[{\"role\":\"user\",\"content\":\"b-0, \\\"ok\\\"\"},"
              "{\"role\":\"assistant\",\"content\":\"b-1, \\\"ok\\\"\"},"
              "{\"role\":\"assistant\",\"content\":\"b-2, \\\"ok\\\"\"}]}]}");
    free(json);

    pbuf b = PBUF_INIT;
    CHECK(B->get_turn(s, "00000000-0000-4000-8000-000000000002", T0 + 30, &b, NULL) == PARLEY_OK);
    static const char turn_head[] = "{\"conversation_id\":\"kitchen\",\"turn\":{\"turn_id\":"
                                    "\"00000000-0000-4000-8000-000000000002\",";
    CHECK(b.data && strncmp(b.data, turn_head, strlen(turn_head)) == 0);
    pbuf_reset(&b);
    CHECK(B->get_turn(s, "00000000-0000-4000-8000-000000000099", T0 + 30, &b, NULL) ==
          PARLEY_ERR_NOT_FOUND);
    pbuf_free(&b);
    json = dump_conversation(s, "nobody", T0, &st);
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    free(json);

    store_stats ss = stats_of(s);
    CHECK(ss.conversations == 1);
    CHECK(ss.turns == 2);
    test_turn t1, t2; /* bytes of the messages joined by ',' within each turn */
    make_turn(&t1, 1, "a", 2);
    make_turn(&t2, 2, "b", 3);
    size_t bytes = 1 + 2;
    for (int i = 0; i < 2; i++)
        bytes += strlen(t1.json[i]);
    for (int i = 0; i < 3; i++)
        bytes += strlen(t2.json[i]);
    CHECK(ss.message_bytes == bytes);
}

/* A retried append (same turn_id) changes nothing, not even last_used. */
static void test_idempotent(store *s)
{
    forget_everything(s);
    CHECK(append(s, "c", 1, "a", 1, T0) == PARLEY_OK);
    parley_status st;
    char *before = dump_conversation(s, "c", T0, &st);
    CHECK(append(s, "c", 1, "a", 1, T0 + 1000) == PARLEY_OK);
    CHECK(append(s, "other", 1, "a", 1, T0 + 1000) == PARLEY_OK); /* a turn id is global */
    char *after = dump_conversation(s, "c", T0, &st);
    CHECK_STR(after, before);
    CHECK(stats_of(s).turns == 1);
    CHECK(stats_of(s).conversations == 1);
    free(before);
    free(after);
}

/* keep_turns drops whole oldest turns at append. */
static void test_trim(void)
{
    store *s = open_store(url, "trim:", 2, 100, 0);
    CHECK(s != NULL);
    if (!s)
        return;
    forget_everything(s);
    for (int i = 1; i <= 5; i++)
        CHECK(append(s, "c", i, i % 2 ? "odd" : "even", (size_t)(i % 3) + 1, T0 + (uint64_t)i) ==
              PARLEY_OK);
    size_t n;
    char *text = load(s, "c", 0, T0 + 10, &n);
    CHECK(n == 2 + 3); /* turns 4 and 5: (i % 3) + 1 messages each */
    free(text);
    store_stats ss = stats_of(s);
    CHECK(ss.turns == 2);
    pbuf b = PBUF_INIT;
    CHECK(B->get_turn(s, "00000000-0000-4000-8000-000000000003", T0 + 10, &b, NULL) ==
          PARLEY_ERR_NOT_FOUND);
    CHECK(B->get_turn(s, "00000000-0000-4000-8000-000000000004", T0 + 10, &b, NULL) == PARLEY_OK);
    pbuf_free(&b);
    B->close(s);
}

/* max_conversations forgets the least recently committed, never the one appended to. */
static void test_lru(void)
{
    store *s = open_store(url, "lru:", 0, 2, 0);
    CHECK(s != NULL);
    if (!s)
        return;
    forget_everything(s);
    CHECK(append(s, "a", 1, "x", 1, T0 + 1) == PARLEY_OK);
    CHECK(append(s, "b", 2, "x", 1, T0 + 2) == PARLEY_OK);
    char *text = load(s, "a", 0, T0 + 3, NULL); /* reading does not refresh */
    free(text);
    CHECK(append(s, "c", 3, "x", 1, T0 + 3) == PARLEY_OK); /* evicts a */
    char *list = dump_list(s, T0 + 4);
    CHECK(list && strstr(list, "\"conversation_id\":\"c\"") && strstr(list, "\"conversation_id\":\"b\"") &&
          !strstr(list, "\"conversation_id\":\"a\""));
    CHECK(list && strstr(list, "\"c\"") < strstr(list, "\"b\"")); /* most recently used first */
    free(list);
    CHECK(append(s, "b", 4, "x", 1, T0 + 5) == PARLEY_OK);
    CHECK(append(s, "d", 5, "x", 1, T0 + 6) == PARLEY_OK); /* evicts c, not b */
    parley_status st;
    free(dump_conversation(s, "c", T0 + 7, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    free(dump_conversation(s, "b", T0 + 7, &st));
    CHECK(st == PARLEY_OK);
    store_stats ss = stats_of(s);
    CHECK(ss.conversations == 2);
    CHECK(ss.evicted == 2);
    B->close(s);
}

/* Idle past the timeout: gone for reads, restarted by an append, swept by expire(). */
static void test_idle(void)
{
    const uint64_t idle = 1000;
    store *s = open_store(url, "idle:", 0, 100, idle);
    CHECK(s != NULL);
    if (!s)
        return;
    forget_everything(s);
    CHECK(append(s, "c", 1, "old", 1, T0) == PARLEY_OK);
    size_t n;
    char *text = load(s, "c", 0, T0 + idle, &n); /* exactly the timeout: still live */
    CHECK(n == 1);
    free(text);
    CHECK(append(s, "c", 2, "new", 1, T0 + 2 * idle + 1) == PARLEY_OK); /* restarts it */
    text = load(s, "c", 0, T0 + 2 * idle + 2, &n);
    CHECK(n == 1);
    CHECK(text && strstr(text, "new-0") && !strstr(text, "old-0"));
    free(text);
    parley_status st;
    char *json = dump_conversation(s, "c", T0 + 2 * idle + 2, &st);
    CHECK(json && strstr(json, "\"created_at\":\"2025-11-24T16:00:02.001Z\""));
    free(json);
    CHECK(stats_of(s).expired == 1);

    CHECK(append(s, "d", 3, "x", 1, T0 + 2 * idle + 500) == PARLEY_OK);
    text = load(s, "c", 0, T0 + 4 * idle, &n); /* c idle: forgotten on access */
    CHECK(n == 0);
    CHECK_STR(text, "");
    free(text);
    size_t swept = 0;
    CHECK(B->expire(s, T0 + 4 * idle, &swept, NULL) == PARLEY_OK);
    CHECK(swept == 1); /* d */
    store_stats ss = stats_of(s);
    CHECK(ss.conversations == 0);
    CHECK(ss.expired == 3);

    /* The keys carry a Redis TTL of the timeout plus a grace. */
    CHECK(append(s, "e", 4, "x", 1, T0) == PARLEY_OK);
    redisContext *c = redisConnect("127.0.0.1", server.port);
    redisReply *r = redisCommand(c, "AUTH %s", PASSWORD);
    freeReplyObject(r);
    r = redisCommand(c, "PTTL idle:c:0:/0:/e");
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 1000 && r->integer <= 61000);
    freeReplyObject(r);
    r = redisCommand(c, "PTTL idle:turn:00000000-0000-4000-8000-000000000004");
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 1000 && r->integer <= 61000);
    freeReplyObject(r);
    redisFree(c);
    B->close(s);
}

static void test_persona_and_interface(store *s)
{
    forget_everything(s);
    store_key plain = {"c", "", ""}, chef = {"c", "chef", ""}, voice = {"c", "", "voice"};
    test_turn t1, t2, t3;
    make_turn(&t1, 1, "plain", 1);
    make_turn(&t2, 2, "chef", 1);
    make_turn(&t3, 3, "voice", 1);
    CHECK(B->append(s, &plain, &t1.turn, T0, NULL) == PARLEY_OK);
    CHECK(B->append(s, &chef, &t2.turn, T0, NULL) == PARLEY_OK);
    CHECK(B->append(s, &voice, &t3.turn, T0, NULL) == PARLEY_OK);
    pbuf b = PBUF_INIT;
    size_t n;
    CHECK(B->load(s, &chef, 0, T0, &b, &n, NULL) == PARLEY_OK);
    CHECK(n == 1 && b.data && strstr(b.data, "chef-0") && !strstr(b.data, "plain"));
    pbuf_free(&b);
    CHECK(stats_of(s).conversations == 3);
    CHECK(B->forget(s, &chef, NULL) == PARLEY_OK);
    CHECK(B->forget(s, &chef, NULL) == PARLEY_ERR_NOT_FOUND);
    CHECK(stats_of(s).conversations == 2);
    forget_everything(s);
    CHECK(stats_of(s).conversations == 0);
    CHECK(stats_of(s).turns == 0);
}

/* Two stores on one Redis are two hosts: each sees the other's turns.  A
 * different prefix is another world. */
static void test_two_hosts_and_prefixes(store *s)
{
    forget_everything(s);
    store *other = open_store(url, NULL, 0, 100, 0);
    store *elsewhere = open_store(url, "elsewhere:", 0, 100, 0);
    CHECK(other && elsewhere);
    if (!other || !elsewhere)
        return;
    CHECK(append(s, "shared", 1, "one", 1, T0) == PARLEY_OK);
    test_turn t;
    make_turn(&t, 2, "two", 1);
    store_key k = key_of("shared");
    CHECK(B->append(other, &k, &t.turn, T0 + 1, NULL) == PARLEY_OK);
    size_t n;
    char *text = load(s, "shared", 0, T0 + 2, &n);
    CHECK(n == 2 && text && strstr(text, "one-0") < strstr(text, "two-0"));
    free(text);
    pbuf b = PBUF_INIT;
    CHECK(B->load(elsewhere, &k, 0, T0 + 2, &b, &n, NULL) == PARLEY_OK);
    CHECK(n == 0);
    pbuf_free(&b);
    B->close(other);
    B->close(elsewhere);
}

/* The server's script cache flushed under a connection that loaded the
 * scripts (SCRIPT FLUSH, a failover): calls fall back to EVAL and go on. */
static void test_script_cache_flushed(store *s)
{
    forget_everything(s);
    CHECK(append(s, "c", 1, "one", 1, T0) == PARLEY_OK);
    redisContext *c = redisConnect("127.0.0.1", server.port);
    freeReplyObject(redisCommand(c, "AUTH %s", PASSWORD));
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    redisFree(c);
    CHECK(append(s, "c", 2, "two", 1, T0 + 1) == PARLEY_OK);
    size_t n;
    char *text = load(s, "c", 0, T0 + 2, &n);
    CHECK(n == 2 && text && strstr(text, "two-0"));
    free(text);
}

/* Host threads read while turns append: the backend serialises its connection. */
typedef struct worker_arg {
    store *s;
    int base;
} worker_arg;

static void *appender(void *p)
{
    worker_arg *w = p;
    char id[32];
    snprintf(id, sizeof id, "thread-%d", w->base);
    for (int i = 0; i < 50; i++) {
        if (append(w->s, id, w->base * 1000 + i, "t", 2, T0 + (uint64_t)i) != PARLEY_OK)
            break;
        char *text = load(w->s, id, 0, T0 + (uint64_t)i, NULL);
        free(text);
    }
    return NULL;
}

static void test_threads(store *s)
{
    forget_everything(s);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){s, i + 1};
        pthread_create(&th[i], NULL, appender, &args[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    store_stats ss = stats_of(s);
    CHECK(ss.conversations == 4);
    CHECK(ss.turns == 200);
}

/* Redis killed mid-run: calls fail with `storage` (the store named, no
 * password), and the store reconnects by itself once Redis is back. */
static void test_redis_killed_and_restarted(store *s)
{
    forget_everything(s);
    CHECK(append(s, "c", 1, "before", 1, T0) == PARLEY_OK);
    log_text[0] = '\0';
    redis_server_kill(&server);

    test_turn t;
    make_turn(&t, 2, "during", 1);
    store_key k = key_of("c");
    char *err = NULL;
    CHECK(B->append(s, &k, &t.turn, T0 + 1, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "redis store 127.0.0.1:"));
    CHECK(err && !strstr(err, PASSWORD));
    free(err);
    err = NULL;
    pbuf b = PBUF_INIT;
    size_t n = 7;
    CHECK(B->load(s, &k, 0, T0 + 1, &b, &n, &err) == PARLEY_ERR_STORAGE);
    CHECK(b.len == 0 && n == 0); /* nothing half-appended to the caller's buffer */
    CHECK(err && !strstr(err, PASSWORD));
    free(err);
    CHECK(B->get_conversation(s, &k, T0, &b, NULL) == PARLEY_ERR_STORAGE);
    CHECK(b.len == 0);

    CHECK(redis_server_restart(&server) == 0);
    /* The server came back empty (no persistence in tests); service resumes
     * within the reconnection interval, without reopening the store. */
    parley_status st = PARLEY_ERR_STORAGE;
    for (int i = 0; i < 100 && st != PARLEY_OK; i++) {
        st = B->append(s, &k, &t.turn, T0 + 2, NULL);
        if (st != PARLEY_OK) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    CHECK(st == PARLEY_OK);
    CHECK(B->load(s, &k, 0, T0 + 3, &b, &n, NULL) == PARLEY_OK);
    CHECK(n == 1 && b.data && strstr(b.data, "during-0"));
    pbuf_free(&b);
    CHECK(strstr(log_text, "fail until it is back") != NULL);
    CHECK(strstr(log_text, "connected again") != NULL);
    CHECK(strstr(log_text, PASSWORD) == NULL);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double slowdown(void)
{
    const char *v = getenv("PARLEY_TEST_SLOWDOWN");
    return v && atof(v) > 1 ? atof(v) : 1;
}

/* ---- leases (version 2) ---- */

/* One holder at a time; a release hands over at once; a held lease is
 * renewed for as long as it is held. */
static void test_lease_exclusive_and_renewed(void)
{
    lease_ms = (uint64_t)(400 * slowdown());
    store *a = open_store(url, "lease:", 0, 100, 0), *b = open_store(url, "lease:", 0, 100, 0);
    lease_ms = 0;
    CHECK(a && b);
    if (!a || !b)
        return;
    CHECK(B->version >= 2 && B->lease_acquire && B->lease_release);
    store_key k = key_of("c"), other = key_of("d");
    uint64_t retry = 0;
    CHECK(B->lease_acquire(a, &k, &retry, NULL) == PARLEY_OK);
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_ERR_BUSY);
    CHECK(retry > 0 && retry <= (uint64_t)(400 * slowdown()));
    CHECK(B->lease_acquire(b, &other, &retry, NULL) == PARLEY_OK); /* per conversation */
    B->lease_release(b, &other);
    sleep_ms((long)(1200 * slowdown())); /* three lease lives: renewed, still a's */
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_ERR_BUSY);
    B->lease_release(b, &k); /* not b's: changes nothing */
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_ERR_BUSY);
    B->lease_release(a, &k);
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_OK);
    B->lease_release(b, &k);
    B->close(a);
    B->close(b);
}

/* A holder that dies (closed without releasing: no more renewals) blocks the
 * conversation only until its lease expires. */
static void test_lease_of_a_dead_holder_expires(void)
{
    lease_ms = (uint64_t)(300 * slowdown());
    store *a = open_store(url, "lease:", 0, 100, 0), *b = open_store(url, "lease:", 0, 100, 0);
    uint64_t life = lease_ms;
    lease_ms = 0;
    CHECK(a && b);
    if (!a || !b)
        return;
    store_key k = key_of("dead");
    uint64_t retry = 0;
    CHECK(B->lease_acquire(a, &k, &retry, NULL) == PARLEY_OK);
    B->close(a);
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_ERR_BUSY);
    sleep_ms((long)(life + 100));
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_OK);
    B->lease_release(b, &k);
    B->close(b);
}

/* Fencing: a holder whose lease was taken over cannot commit over the new
 * holder; its append fails with `storage` and writes nothing. */
static void test_lease_fences_append(void)
{
    store *a = open_store(url, "fence:", 0, 100, 0), *b = open_store(url, "fence:", 0, 100, 0);
    CHECK(a && b);
    if (!a || !b)
        return;
    forget_everything(a);
    store_key k = key_of("c");
    uint64_t retry;
    CHECK(B->lease_acquire(a, &k, &retry, NULL) == PARLEY_OK);
    CHECK(append(a, "c", 1, "a-held", 1, T0) == PARLEY_OK); /* under its lease... */
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_OK); /* ...which it gave back */
    B->lease_release(b, &k);
    CHECK(B->lease_acquire(a, &k, &retry, NULL) == PARLEY_OK);
    /* a stalls past its lease (as a paused VM would) and b takes the conversation */
    redisContext *c = redisConnect("127.0.0.1", server.port);
    freeReplyObject(redisCommand(c, "AUTH %s", PASSWORD));
    freeReplyObject(redisCommand(c, "DEL fence:lease:0:/0:/c"));
    redisFree(c);
    CHECK(B->lease_acquire(b, &k, &retry, NULL) == PARLEY_OK);
    test_turn t;
    make_turn(&t, 2, "a-late", 1);
    char *err = NULL;
    CHECK(B->append(a, &k, &t.turn, T0 + 1, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "lease"));
    free(err);
    B->lease_release(a, &k); /* a's stale release must not free b's lease */
    store *x = open_store(url, "fence:", 0, 100, 0);
    CHECK(x && B->lease_acquire(x, &k, &retry, NULL) == PARLEY_ERR_BUSY);
    CHECK(append(b, "c", 3, "b-turn", 1, T0 + 2) == PARLEY_OK);
    size_t n;
    char *text = load(b, "c", 0, T0 + 3, &n);
    CHECK(n == 2 && text && strstr(text, "a-held-0") && strstr(text, "b-turn-0") &&
          !strstr(text, "a-late"));
    free(text);
    CHECK(x && B->lease_acquire(x, &k, &retry, NULL) == PARLEY_OK); /* b's commit freed it */
    if (x)
        B->lease_release(x, &k);
    B->lease_release(b, &k);
    if (x)
        B->close(x);
    B->close(a);
    B->close(b);
}

/* ---- queries and message identity (store.h versions 3 and 4) ---- */

static redisContext *raw_connect(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    freeReplyObject(redisCommand(c, "AUTH %s", PASSWORD));
    return c;
}

/* An integer reply of one raw command (-1 when not an integer). */
static long long raw_int(redisContext *c, const char *command, const char *key)
{
    redisReply *r = redisCommand(c, "%s %s", command, key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* The short ids ("NNNNNNIIIIII": turn number, message index) of every page
 * of q, joined by ' '; *pages counts the pages. */
static char *all_pages(store *s, store_query q, int *pages)
{
    pbuf ids = PBUF_INIT;
    if (!q.until_ms)
        q.until_ms = UINT64_MAX;
    *pages = 0;
    for (;;) {
        pbuf b = PBUF_INIT;
        size_t count;
        int more;
        char *err = NULL;
        parley_status st = B->query(s, &q, T0 + 100000, &b, &count, &q.after, &more, &err);
        CHECK(st == PARLEY_OK);
        free(err);
        for (const char *p = b.data; p && (p = strstr(p, "\"message_id\":\"")); p += 14) {
            if (ids.len)
                pbuf_putc(&ids, ' ');
            pbuf_append(&ids, p + 14 + 24, 12);
        }
        pbuf_free(&b);
        (*pages)++;
        if (st != PARLEY_OK || !more)
            break;
        CHECK(count == q.limit);
    }
    char *out = pbuf_take(&ids);
    pbuf_free(&ids);
    return out ? out : strdup("");
}

/* What all_pages should print for turns first..last (step 1 or -1) whose
 * number satisfies keep(number), messages `from` to `to` of each. */
static char *expected_ids(int first, int last, int mod, int rem, int newest)
{
    pbuf b = PBUF_INIT;
    int step = first <= last ? 1 : -1;
    for (int n = first;; n += step) {
        if (mod == 0 || n % mod == rem) {
            for (int k = 0; k < 2; k++) {
                int i = newest ? 1 - k : k;
                pbuf_printf(&b, "%s%06d%06d", b.len ? " " : "", n, i);
            }
        }
        if (n == last)
            break;
    }
    char *out = pbuf_take(&b);
    pbuf_free(&b);
    return out ? out : strdup("");
}

/* More turns than one script call reads (REDIS_QUERY_SLICE_TURNS): pages
 * continue across calls in exact order, every message once, both orders,
 * across all conversations and within one. */
static void test_query_across_slices(void)
{
    store *s = open_store(url, "slices:", 0, 100, 0);
    CHECK(s != NULL);
    if (!s)
        return;
    char id[8];
    for (int n = 1; n <= 700; n++) {
        snprintf(id, sizeof id, "c%d", n % 3);
        CHECK(append(s, id, n, "m", 2, T0 + (uint64_t)n) == PARLEY_OK);
    }
    int pages;
    char *got = all_pages(s, (store_query){.limit = 37}, &pages);
    char *want = expected_ids(1, 700, 0, 0, 0);
    CHECK_STR(got, want);
    CHECK(pages == (1400 + 36) / 37);
    free(got);
    free(want);
    got = all_pages(s, (store_query){.limit = 37, .newest_first = 1}, &pages);
    want = expected_ids(700, 1, 0, 0, 1);
    CHECK_STR(got, want);
    free(got);
    free(want);
    /* conversation_id alone (every persona and interface): the store-wide index, filtered */
    got = all_pages(s, (store_query){.conversation_id = "c1", .limit = 50}, &pages);
    want = expected_ids(1, 700, 3, 1, 0);
    CHECK_STR(got, want);
    free(got);
    free(want);
    /* the exact key: the conversation's own turns, from a binary search for the cursor */
    got = all_pages(s, (store_query){.conversation_id = "c1", .persona = "", .interface_type = "",
                                     .limit = 50, .newest_first = 1}, &pages);
    want = expected_ids(700, 1, 3, 1, 1);
    CHECK_STR(got, want);
    free(got);
    free(want);
    got = all_pages(s, (store_query){.conversation_id = "c2", .persona = "", .interface_type = "",
                                     .limit = 9999}, &pages);
    want = expected_ids(2, 698, 3, 2, 0);
    CHECK_STR(got, want);
    CHECK(pages == 1);
    free(got);
    free(want);
    /* search: prefiltered by the script ("OK"), or checked here only ("\"ok\"") */
    got = all_pages(s, (store_query){.search = "M-1, \"OK", .limit = 10000}, &pages);
    want = expected_ids(1, 700, 0, 0, 0);
    CHECK(got && strlen(got) == 700 * 13 - 1);
    free(got);
    got = all_pages(s, (store_query){.search = "m-1, ", .role = "assistant", .limit = 300,
                                     .since_ms = T0 + 101, .until_ms = T0 + 600}, &pages);
    CHECK(got && strlen(got) == 500 * 13 - 1 && strncmp(got, "000101000001", 12) == 0);
    CHECK(pages == 2);
    free(got);
    free(want);
    B->close(s);
}

/* The short id of message i of turn n, as make_turn names it. */
static void message_id_of(int n, unsigned i, char out[48])
{
    snprintf(out, 48, "10000000-0000-4000-8000-%06d%06u", n, i);
}

static char *get_message(store *s, int n, unsigned i, parley_status *st)
{
    char mid[48];
    message_id_of(n, i, mid);
    pbuf b = PBUF_INIT;
    *st = B->get_message(s, mid, T0 + 100000, &b, NULL);
    char *out = pbuf_take(&b);
    pbuf_free(&b);
    return out;
}

/* Data written before queries existed (no positions, indexes or lifetime:
 * the layout of the Redis store of 0.2) reads as before, and is upgraded
 * when a store opens: queries, message reads and lifetimes see it. */
static void test_data_of_the_previous_layout(void)
{
    redisContext *c = raw_connect();
    const char *tool = "{\"role\":\"tool\",\"content\":\"a, {b}] \\\"c,\\\" d\\\\\"}";
    char msgs1[256], meta1[256], meta2[128];
    snprintf(msgs1, sizeof msgs1, "%s,%s", "{\"role\":\"user\",\"content\":\"x,y\"}",
             "{\"role\":\"assistant\",\"content\":\"[z]\"}");
    snprintf(meta1, sizeof meta1,
             "10000000-0000-4000-8000-000001000000\tuser\t%llu\n"
             "10000000-0000-4000-8000-000001000001\tassistant\t%llu\n",
             T0 + 1, T0 + 2);
    snprintf(meta2, sizeof meta2, "10000000-0000-4000-8000-000002000000\ttool\t%llu\n", T0 + 3);
    const char *cid = "0:/0:/kitchen";
    freeReplyObject(redisCommand(c, "HSET old:c:%s id kitchen persona %s iface %s created %llu "
                                    "last_used %llu bytes %llu",
                                 cid, "", "", T0, T0 + 3,
                                 (unsigned long long)(strlen(msgs1) + strlen(tool))));
    freeReplyObject(redisCommand(c, "RPUSH old:t:%s 00000000-0000-4000-8000-000000000001 "
                                    "00000000-0000-4000-8000-000000000002", cid));
    freeReplyObject(redisCommand(c, "HSET old:turn:00000000-0000-4000-8000-000000000001 cid %s "
                                    "started %llu finished %llu n 2 msgs %s meta %s",
                                 cid, T0, T0 + 2, msgs1, meta1));
    freeReplyObject(redisCommand(c, "HSET old:turn:00000000-0000-4000-8000-000000000002 cid %s "
                                    "started %llu finished %llu n 1 msgs %s meta %s",
                                 cid, T0 + 3, T0 + 3, tool, meta2));
    freeReplyObject(redisCommand(c, "ZADD old:lru 2 %s", cid));
    freeReplyObject(redisCommand(c, "SET old:seq 2"));

    store *s = open_store(url, "old:", 0, 100, 0);
    CHECK(s != NULL);
    if (!s) {
        redisFree(c);
        return;
    }
    CHECK(raw_int(c, "EXISTS", "old:v4") == 1);
    int pages;
    char *got = all_pages(s, (store_query){.limit = 10}, &pages);
    CHECK_STR(got, "000001000000 000001000001 000002000000");
    free(got);
    parley_status st;
    char *m = get_message(s, 2, 0, &st);
    CHECK(st == PARLEY_OK);
    char *tail = pstr_printf(",\"message\":%s}", tool);
    CHECK(m && strlen(m) > strlen(tail) && strcmp(m + strlen(m) - strlen(tail), tail) == 0);
    free(tail);
    free(m);
    char *conv = dump_conversation(s, "kitchen", T0 + 10, &st);
    CHECK(conv && strstr(conv, "\"message_count\":3,\"turn_count\":2,"
                               "\"participants\":[\"user\",\"assistant\",\"tool\"]"));
    free(conv);
    /* It goes on: a new turn comes after, counted on top. */
    CHECK(append(s, "kitchen", 3, "new", 2, T0 + 20) == PARLEY_OK);
    got = all_pages(s, (store_query){.limit = 2, .newest_first = 1}, &pages);
    CHECK_STR(got, "000003000001 000003000000 000002000000 000001000001 000001000000");
    free(got);
    conv = dump_conversation(s, "kitchen", T0 + 30, &st);
    CHECK(conv && strstr(conv, "\"message_count\":5,\"turn_count\":3,"));
    free(conv);
    size_t n;
    char *text = load(s, "kitchen", 0, T0 + 30, &n);
    CHECK(n == 5 && text && strstr(text, tool));
    free(text);
    B->close(s);
    redisFree(c);
}

/* The store-wide indexes follow what is kept: trimmed, forgotten and (by
 * the sweep, or when a read meets them) TTL-dropped turns leave nothing
 * behind, and are never returned. */
static void test_indexes_follow_the_data(void)
{
    store *s = open_store(url, "kept:", 1, 100, 0);
    redisContext *c = raw_connect();
    CHECK(s && c);
    if (!s || !c)
        return;
    for (int n = 1; n <= 3; n++)
        CHECK(append(s, "a", n, "t", 2, T0 + (uint64_t)n) == PARLEY_OK);
    CHECK(raw_int(c, "HLEN", "kept:msg") == 2);
    CHECK(raw_int(c, "ZCARD", "kept:tpos") == 1);
    parley_status st;
    free(get_message(s, 1, 0, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    forget_everything(s);
    CHECK(raw_int(c, "HLEN", "kept:msg") == 0);
    CHECK(raw_int(c, "ZCARD", "kept:tpos") == 0);
    B->close(s);

    s = open_store(url, "gone:", 0, 100, 3600000);
    CHECK(append(s, "a", 1, "one", 2, T0) == PARLEY_OK);
    CHECK(append(s, "b", 2, "two", 2, T0 + 1) == PARLEY_OK);
    /* Redis drops b's keys by their TTL (done here by hand) */
    freeReplyObject(redisCommand(c, "DEL gone:c:0:/0:/b gone:t:0:/0:/b "
                                    "gone:turn:00000000-0000-4000-8000-000000000002"));
    free(get_message(s, 2, 0, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    CHECK(raw_int(c, "HLEN", "gone:msg") == 3); /* the read removed the entry it met */
    int pages;
    char *got = all_pages(s, (store_query){.limit = 10}, &pages);
    CHECK_STR(got, "000001000000 000001000001");
    free(got);
    CHECK(raw_int(c, "ZCARD", "gone:tpos") == 1); /* the query removed the turn it met */
    size_t expired;
    CHECK(B->expire(s, T0 + 2, &expired, NULL) == PARLEY_OK);
    CHECK(raw_int(c, "HLEN", "gone:msg") == 2); /* the sweep removed the rest */
    B->close(s);
    redisFree(c);
}

/* An interface id moved to another message: find_message still finds the
 * newest message that has it (the index entry left stale is redone). */
static void test_interface_id_moved(void)
{
    store *s = open_store(url, "moved:", 0, 100, 0);
    CHECK(s != NULL);
    if (!s)
        return;
    CHECK(append(s, "a", 1, "one", 2, T0) == PARLEY_OK);
    CHECK(append(s, "a", 2, "two", 2, T0 + 1) == PARLEY_OK);
    char mid[STORE_ID_LEN + 1], want[48];
    CHECK(B->set_interface_message_id(s, "00000000-0000-4000-8000-000000000001", "x", T0 + 2, mid,
                                      NULL) == PARLEY_OK);
    CHECK(B->set_interface_message_id(s, "00000000-0000-4000-8000-000000000002", "x", T0 + 2, mid,
                                      NULL) == PARLEY_OK);
    message_id_of(2, 1, want);
    CHECK_STR(mid, want);
    store_key k = key_of("a");
    pbuf b = PBUF_INIT;
    CHECK(B->find_message(s, &k, "x", T0 + 3, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strstr(b.data, want));
    pbuf_free(&b);
    CHECK(B->set_interface_message_id(s, "00000000-0000-4000-8000-000000000002", "y", T0 + 3, mid,
                                      NULL) == PARLEY_OK);
    message_id_of(1, 1, want);
    b = (pbuf)PBUF_INIT;
    CHECK(B->find_message(s, &k, "x", T0 + 4, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strstr(b.data, want) && strstr(b.data, "\"interface_message_id\":\"x\""));
    pbuf_free(&b);
    /* setting the older one again does not take the id from a newer holder */
    CHECK(B->set_interface_message_id(s, "00000000-0000-4000-8000-000000000002", "x", T0 + 5, mid,
                                      NULL) == PARLEY_OK);
    CHECK(B->set_interface_message_id(s, "00000000-0000-4000-8000-000000000001", "x", T0 + 5, mid,
                                      NULL) == PARLEY_OK);
    message_id_of(2, 1, want);
    b = (pbuf)PBUF_INIT;
    CHECK(B->find_message(s, &k, "x", T0 + 6, &b, NULL) == PARLEY_OK);
    CHECK(b.data && strstr(b.data, want));
    pbuf_free(&b);
    B->close(s);
}

int main(void)
{
    test_bad_locations();
    if (redis_server_start(&server, PASSWORD) != 0) {
        fprintf(stderr, "cannot start redis-server (scripts/setup.sh installs it)\n");
        return 1;
    }
    redis_server_url(&server, url, sizeof url);
    test_unreachable_at_open();
    test_wrong_password();

    store *s = open_store(url, NULL, 0, 100, 0);
    CHECK(s != NULL);
    if (s) {
        test_round_trip(s);
        test_idempotent(s);
        test_persona_and_interface(s);
        test_two_hosts_and_prefixes(s);
        test_threads(s);
        test_script_cache_flushed(s);
    }
    test_trim();
    test_lru();
    test_idle();
    test_lease_exclusive_and_renewed();
    test_lease_of_a_dead_holder_expires();
    test_lease_fences_append();
    test_query_across_slices();
    test_data_of_the_previous_layout();
    test_indexes_follow_the_data();
    test_interface_id_moved();
    if (s) {
        test_redis_killed_and_restarted(s);
        B->close(s);
    }
    redis_server_stop(&server);
    return check_report();
}
