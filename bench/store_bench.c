/*
 * store_bench.c -- the store backends at the store interface (store.h), no
 * HTTP: what a turn's load + append costs, and what opening a big SQLite
 * store costs.  Nothing is asserted: it prints what it measured.
 *
 *   store-bench ops [TURNS] [DIR]   per backend: TURNS turns of one conversation,
 *                                   each load(last 20) + append(2 messages);
 *                                   mean and p99 microseconds per turn
 *   store-bench open N [DIR]        a SQLite store with N conversations (3 turns
 *                                   each) in DIR, then, in a fresh process: the
 *                                   time to open it, RSS before/after, and the
 *                                   first load and append of one conversation
 *
 * The big file is written with SQLite directly into the schema the backend
 * created (one transaction per 10,000 conversations), so building it takes
 * seconds, not an hour of appends; the store then opens it like any other.
 */
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static store *open_store(const store_backend *b, const char *location, size_t max_conversations)
{
    store_config cfg = {.location = location, .limits = {0, max_conversations, 0}};
    store *s = NULL;
    char *err = NULL;
    if (b->open(&cfg, &s, &err) != PARLEY_OK) {
        fprintf(stderr, "store-bench: open %s: %s\n", location, err ? err : "?");
        exit(1);
    }
    free(err);
    return s;
}

static void remove_store(const char *path)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-lock"};
    for (size_t i = 0; i < 4; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s%s", path, suffixes[i]);
        unlink(file);
    }
}

/* One turn: load the last 20 turns, append a user + assistant pair. */
static int one_turn(const store_backend *b, store *s, const store_key *key, unsigned i,
                    uint64_t now_ms)
{
    pbuf out = PBUF_INIT;
    size_t n = 0;
    int rc = b->load(s, key, 20, now_ms, &out, &n, NULL) != PARLEY_OK;
    pbuf_free(&out);
    char tid[37], mid[2][37], user[160], assistant[200];
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", i, i);
    snprintf(mid[0], 37, "%08x-1111-4000-8000-%012x", i, i);
    snprintf(mid[1], 37, "%08x-2222-4000-8000-%012x", i, i);
    int ul = snprintf(user, sizeof user,
                      "{\"role\":\"user\",\"content\":\"turn %u: please turn on the kitchen "
                      "light and set it to 40 percent\"}", i);
    int al = snprintf(assistant, sizeof assistant,
                      "{\"role\":\"assistant\",\"content\":\"Done: the kitchen light is on at "
                      "40 percent. Anything else for turn %u?\"}", i);
    store_message msgs[2] = {{mid[0], "user", now_ms, user, (size_t)ul, NULL, NULL, 0},
                             {mid[1], "assistant", now_ms, assistant, (size_t)al, NULL, NULL, 0}};
    store_turn t = {tid, now_ms, now_ms, msgs, 2, NULL, 0, (uint32_t)(ul + al + 2) / 4 + 1};
    rc |= b->append(s, key, &t, now_ms, NULL) != PARLEY_OK;
    return rc;
}

static void bench_ops(unsigned turns, const char *dir)
{
    const store_backend *backends[] = {&store_memory_backend, &store_sqlite_backend};
    double *lat = calloc(turns, sizeof *lat);
    for (size_t k = 0; k < 2; k++) {
        const store_backend *b = backends[k];
        char path[4096] = "";
        if (k == 1) {
            snprintf(path, sizeof path, "%s/store-bench-ops-%ld.db", dir, (long)getpid());
            remove_store(path);
        }
        store *s = open_store(b, path, 1000);
        store_key key = {"bench-conversation", "", ""};
        int failures = 0;
        double t0 = now_s();
        for (unsigned i = 0; i < turns; i++) {
            double s0 = now_s();
            failures += one_turn(b, s, &key, i, 1700000000000ULL + i);
            lat[i] = now_s() - s0;
        }
        double total = now_s() - t0;
        b->close(s);
        if (k == 1)
            remove_store(path);
        qsort(lat, turns, sizeof *lat, cmp_double);
        printf("%-7s %u turns: mean %.1f us, p50 %.1f us, p99 %.1f us per load(20)+append, "
               "failures %d\n",
               b->scheme, turns, total / turns * 1e6, lat[turns / 2] * 1e6,
               lat[turns * 99 / 100] * 1e6, failures);
    }
    free(lat);
}

/* ---- open ---- */

static void build_big_store(const char *path, long n)
{
    remove_store(path);
    store *s = open_store(&store_sqlite_backend, path, (size_t)n + 10);
    store_close(s); /* the schema, exactly as the backend writes it */
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK) {
        fprintf(stderr, "store-bench: %s\n", sqlite3_errmsg(db));
        exit(1);
    }
    sqlite3_exec(db, "PRAGMA synchronous=OFF", NULL, NULL, NULL);
    const long batch = 10000;
    const char *user = "{\"role\":\"user\",\"content\":\"please turn on the kitchen light\"}";
    const char *assistant = "{\"role\":\"assistant\",\"content\":\"Done: the kitchen light is on.\"}";
    int64_t bytes_per_turn = (int64_t)(strlen(user) + 1 + strlen(assistant));
    for (long start = 0; start < n; start += batch) {
        long end = start + batch < n ? start + batch : n;
        char *sql = sqlite3_mprintf(
            "BEGIN;"
            "WITH RECURSIVE c(i) AS (SELECT %ld UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %ld)"
            " INSERT INTO conversations(id, persona, interface_type, conversation_id, created_ms,"
            " last_used_ms, use_seq, turns, message_bytes)"
            " SELECT i + 1, '', '', printf('conversation-%%08d', i), 1700000000000 + i,"
            " 1700000000000 + i, i + 1, 3, 3 * %lld FROM c;"
            "WITH RECURSIVE c(i) AS (SELECT %ld UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %ld),"
            " k(j) AS (VALUES (0), (1), (2))"
            " INSERT INTO turns(id, conversation, turn_id, started_ms, finished_ms, message_bytes)"
            " SELECT 3 * i + j + 1, i + 1, printf('%%08x-0000-4000-8000-%%012x', i, j),"
            " 1700000000000 + i, 1700000000000 + i, %lld FROM c, k;"
            "WITH RECURSIVE c(i) AS (SELECT %ld UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %ld),"
            " k(j) AS (VALUES (0), (1), (2)), r(m, role, json) AS (VALUES (0, 'user', %Q),"
            " (1, 'assistant', %Q))"
            " INSERT INTO messages(id, turn, message_id, role, created_ms, json)"
            " SELECT 6 * i + 2 * j + m + 1, 3 * i + j + 1,"
            " printf('%%08x-1111-4000-8000-%%08x%%04x', i, j, m), role, 1700000000000 + i, json"
            " FROM c, k, r;"
            "COMMIT;",
            start, end, (long long)bytes_per_turn, start, end, (long long)bytes_per_turn, start,
            end, user, assistant);
        char *err = NULL;
        if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
            fprintf(stderr, "store-bench: building: %s\n", err ? err : "?");
            exit(1);
        }
        sqlite3_free(sql);
    }
    char *meta = sqlite3_mprintf("UPDATE store_meta SET conversations = %ld, turns = %ld,"
                                 " message_bytes = %lld WHERE id = 1; PRAGMA wal_checkpoint(TRUNCATE);",
                                 n, 3 * n, (long long)(3 * n * bytes_per_turn));
    sqlite3_exec(db, meta, NULL, NULL, NULL);
    sqlite3_free(meta);
    sqlite3_close(db);
}

/* In a fresh process: open, measure, first load and append, close. */
static void measure_open(const char *path, long n)
{
    long rss_before = status_kib("VmRSS");
    double t0 = now_s();
    store *s = open_store(&store_sqlite_backend, path, (size_t)n + 10);
    double open_s = now_s() - t0;
    long rss_open = status_kib("VmRSS");
    store_stats st;
    store_sqlite_backend.stats(s, &st, NULL);
    char id[32];
    snprintf(id, sizeof id, "conversation-%08d", (int)(n / 2));
    store_key key = {id, "", ""};
    pbuf out = PBUF_INIT;
    size_t msgs = 0;
    t0 = now_s();
    parley_status ls = store_load(s, &key, 20, 1700000000000ULL + (uint64_t)n, &out,
                                                 &msgs, NULL);
    double load_s = now_s() - t0;
    pbuf_free(&out);
    t0 = now_s();
    int failed = one_turn(&store_sqlite_backend, s, &key, 0xfffffff0u,
                          1700000000000ULL + (uint64_t)n + 1);
    double append_s = now_s() - t0;
    long rss_used = status_kib("VmRSS");
    store_close(s);
    printf("conversations %zu\n", st.conversations);
    printf("open_ms %.2f\n", open_s * 1e3);
    printf("rss_before_kib %ld\nrss_after_open_kib %ld\nrss_open_growth_kib %ld\n", rss_before,
           rss_open, rss_open - rss_before);
    printf("first_load_ms %.3f (%zu messages, %s)\n", load_s * 1e3, msgs,
           ls == PARLEY_OK ? "ok" : "FAILED");
    printf("first_append_ms %.3f (%s)\n", append_s * 1e3, failed ? "FAILED" : "ok");
    printf("rss_after_use_kib %ld\n", rss_used);
}

static void bench_open(long n, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/store-bench-open-%ld.db", dir, n);
    double t0 = now_s();
    build_big_store(path, n);
    FILE *f = fopen(path, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (f)
        fclose(f);
    printf("built %ld conversations (%ld turns, %ld messages) in %.1f s: %.1f MiB\n", n, 3 * n,
           6 * n, now_s() - t0, size / 1048576.0);
    fflush(stdout);
    for (int run = 1; run <= 3; run++) { /* a fresh process each time: clean RSS */
        printf("-- open run %d\n", run);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            measure_open(path, n);
            fflush(stdout);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
    }
    remove_store(path);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "ops") == 0) {
        unsigned turns = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 5000;
        bench_ops(turns ? turns : 5000, argc > 3 ? argv[3] : "/tmp");
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "open") == 0) {
        bench_open(strtol(argv[2], NULL, 10), argc > 3 ? argv[3] : "/tmp");
        return 0;
    }
    fprintf(stderr, "usage: store-bench ops [TURNS] [DIR] | store-bench open N [DIR]\n");
    return 2;
}
