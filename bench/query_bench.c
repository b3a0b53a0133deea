/*
 * query_bench.c -- history_query at scale, at the store interface: a store of
 * N messages (default 1,000,000: 10,000 conversations of 10 turns of 10
 * messages) in memory and in SQLite, then the median and p90 latency of
 *   by conversation   one conversation's newest 20 messages
 *   search, common    a word in 1 message in 10, across all conversations, limit 20
 *   search, rare      a word in 1 message in 100,000 (a full scan), limit 20
 *   role + search     assistant messages holding a common word, oldest first, limit 20
 *   message by id     message_get
 * and, as the floor measured in the same run, one pass of memmem over all the
 * stored message bytes (what any scan that looks at every message costs at
 * least).  Nothing is asserted: it prints what it measured.
 *
 *   query-bench [N] [DIR] [STORES]   (DIR for the SQLite file, default /tmp;
 *                                     STORES e.g. "memory,redis", default all)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tests/store/redis_server.h"
#include "store/store.h"

#define MESSAGES_PER_TURN 10
#define TURNS_PER_CONVERSATION 10
#define RUNS 15

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *const WORDS[] = {"kitchen", "light", "heating", "door", "garage", "music",
                                    "timer", "weather", "window", "blinds", "oven", "alarm"};

/* Message k's text: words by k, "laundry" in 1 of 10, "zeppelin" in 1 of 100,000. */
static int message_json(unsigned long k, const char *role, char *out, size_t cap)
{
    return snprintf(out, cap,
                    "{\"role\":\"%s\",\"content\":\"Message %lu about the %s and the %s%s%s, "
                    "please check it soon.\"}",
                    role, k, WORDS[k % 12], WORDS[(k / 12) % 12],
                    k % 10 == 3 ? " after the laundry" : "",
                    k % 100000 == 77777 ? " and the zeppelin" : "");
}

static void id_of(unsigned long n, unsigned tag, char out[37])
{
    unsigned v = (unsigned)(n & 0xffffffffu);
    snprintf(out, 37, "%08x-%04x-4000-8000-%012x", v, tag & 0xffffu, v);
}

static store *fill(const store_backend *b, const char *location, unsigned long nmessages,
                   size_t *bytes)
{
    store_config cfg = {.location = location, .limits = {0, 1000000, 0}};
    store *s = NULL;
    char *err = NULL;
    if (b->open(&cfg, &s, &err) != PARLEY_OK) {
        fprintf(stderr, "query-bench: open %s: %s\n", b->scheme, err ? err : "?");
        exit(1);
    }
    unsigned long turns = nmessages / MESSAGES_PER_TURN, k = 0;
    static char text[MESSAGES_PER_TURN][256];
    char mids[MESSAGES_PER_TURN][37], tid[37], conv[32];
    *bytes = 0;
    for (unsigned long t = 0; t < turns; t++) {
        store_message msgs[MESSAGES_PER_TURN];
        uint64_t when = 1700000000000ull + t * 1000;
        for (unsigned i = 0; i < MESSAGES_PER_TURN; i++, k++) {
            const char *role = i == 0 ? "user" : i % 2 ? "assistant" : "tool";
            int n = message_json(k, role, text[i], sizeof text[i]);
            id_of(k, 1, mids[i]);
            msgs[i] = (store_message){mids[i], role, when + i, text[i], (size_t)n, NULL, NULL, 0};
            *bytes += (size_t)n + 1;
        }
        id_of(t, 2, tid);
        /* turns interleave across conversations, as they do in a busy home */
        snprintf(conv, sizeof conv, "conv-%lu", t % (turns / TURNS_PER_CONVERSATION));
        store_key key = {conv, "", ""};
        store_turn turn = {tid, when, when + MESSAGES_PER_TURN, msgs, MESSAGES_PER_TURN, NULL, 0, 0};
        if (b->append(s, &key, &turn, when + MESSAGES_PER_TURN, &err) != PARLEY_OK) {
            fprintf(stderr, "query-bench: append: %s\n", err ? err : "?");
            exit(1);
        }
    }
    return s;
}

typedef struct scenario {
    const char *name;
    store_query q;
    const char *message_id; /* for message by id */
} scenario;

/* Median and p90 in ms of RUNS runs; *found the count of the last one. */
static void measure(store *s, const scenario *sc, double *median, double *p90, size_t *found)
{
    double t[RUNS];
    for (int r = 0; r < RUNS; r++) {
        pbuf out = PBUF_INIT;
        size_t count = 1;
        uint64_t last;
        int more;
        double t0 = now_s();
        parley_status st = sc->message_id
                               ? store_get_message(s, sc->message_id, 1ull << 62, &out, NULL)
                               : store_query_run(s, &sc->q, 1ull << 62, &out, &count, &last,
                                                   &more, NULL);
        t[r] = (now_s() - t0) * 1000;
        if (st != PARLEY_OK) {
            fprintf(stderr, "query-bench: %s: %s\n", sc->name, status_name(st));
            exit(1);
        }
        *found = count;
        pbuf_free(&out);
    }
    qsort(t, RUNS, sizeof t[0], cmp_double);
    *median = t[RUNS / 2];
    *p90 = t[RUNS * 9 / 10];
}

/* The floor: one memmem pass for a word that is not there over `bytes` of text. */
static double floor_ms(size_t bytes)
{
    char *all = malloc(bytes);
    if (!all)
        return -1;
    char line[256];
    for (size_t off = 0, k = 0; off < bytes; k++) {
        int n = message_json(k, "assistant", line, sizeof line);
        size_t take = (size_t)n + 1 < bytes - off ? (size_t)n + 1 : bytes - off;
        memcpy(all + off, line, take);
        off += take;
    }
    double t[RUNS];
    volatile int hits = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s();
        hits += memmem(all, bytes, "absent-word", 11) != NULL;
        t[r] = (now_s() - t0) * 1000;
    }
    free(all);
    if (hits) /* "absent-word" is never there; reading hits keeps the scans */
        fprintf(stderr, "query-bench: the floor's word was found\n");
    qsort(t, RUNS, sizeof t[0], cmp_double);
    return t[RUNS / 2];
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    const char *dir = argc > 2 ? argv[2] : "/tmp";
    if (n < MESSAGES_PER_TURN * TURNS_PER_CONVERSATION) {
        fprintf(stderr, "usage: query-bench [N >= 100] [DIR]\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/query-bench-%ld.db", dir, (long)getpid());
    char some_id[37];
    id_of(n / 2 + 1, 1, some_id);
    const scenario scenarios[] = {
        {"by conversation", {.conversation_id = "conv-42", .persona = "", .interface_type = "",
                             .until_ms = UINT64_MAX, .limit = 20, .newest_first = 1}, NULL},
        {"search, common", {.search = "LAUNDRY", .until_ms = UINT64_MAX, .limit = 20,
                            .newest_first = 1}, NULL},
        {"search, rare", {.search = "zeppelin", .until_ms = UINT64_MAX, .limit = 20,
                          .newest_first = 1}, NULL},
        {"role + search, oldest", {.search = "laundry", .role = "assistant",
                                   .until_ms = UINT64_MAX, .limit = 20}, NULL},
        {"message by id", {0}, some_id},
    };
    const store_backend *backends[] = {&store_memory_backend, &store_sqlite_backend,
                                       &store_redis_backend};
    redis_server redis = {0};
    char redis_location[64] = "";
    const char *skip = getenv("SKIP_REDIS");
    size_t nbackends = 2;
    if (!(skip && *skip == '1') && redis_server_start(&redis, NULL) == 0) {
        snprintf(redis_location, sizeof redis_location, "//127.0.0.1:%d", redis.port);
        nbackends = 3;
    }
    const char *locations[] = {"", path, redis_location};
    printf("query-bench: %lu messages (%lu conversations), limit 20, median / p90 of %d runs\n",
           n, n / (MESSAGES_PER_TURN * TURNS_PER_CONVERSATION), RUNS);
    const char *only = argc > 3 ? argv[3] : NULL;
    for (size_t b = 0; b < nbackends; b++) {
        if (only && !strstr(only, backends[b]->scheme))
            continue;
        size_t bytes = 0;
        double t0 = now_s();
        store *s = fill(backends[b], locations[b], n, &bytes);
        double fill_s = now_s() - t0, floor = floor_ms(bytes);
        printf("\n%s: filled in %.1f s; floor (memmem over %.0f MB) %.2f ms\n",
               backends[b]->scheme, fill_s, bytes / 1e6, floor);
        for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
            double median, p90;
            size_t found;
            measure(s, &scenarios[i], &median, &p90, &found);
            printf("  %-24s %9.3f ms  p90 %9.3f ms  (%zu found)  %.2f x floor\n",
                   scenarios[i].name, median, p90, found, median / floor);
        }
        store_close(s);
    }
    if (redis.pid)
        redis_server_stop(&redis);
    static const char *const suffixes[] = {"", "-wal", "-shm", "-lock"};
    for (size_t i = 0; i < 4; i++) {
        char file[4200];
        snprintf(file, sizeof file, "%s%s", path, suffixes[i]);
        unlink(file);
    }
    return 0;
}
