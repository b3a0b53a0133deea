/*
 * test_store_redis_oom.c -- the Redis store out of memory (hiredis's
 * allocations as much as Parley's), against a real redis-server: a read run
 * once per allocation it makes, failing that one and every later one
 * (tests/unit/alloc_fail.h), on a live connection and on one the server
 * dropped (so the store connects, authenticates and loads its scripts again
 * under the failures).  Each run ends in no_memory or in the read's result,
 * never `storage` (the server did nothing wrong), and the next read, with
 * memory back, succeeds at once: running out of memory does not hold the
 * store off for the reconnect pause a lost server earns.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <execinfo.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/alloc_fail.h"
#include "../unit/check.h"
#include "redis_server.h"
#include "store/store.h"

#define T0       1764000000000ULL
#define PASSWORD "s3cret-p@ss"

static redis_server server;
static const store_backend *B = &store_redis_backend;

/* Every client of the server but this one is disconnected (the store's too). */
static void drop_clients(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    redisReply *r = c && !c->err ? redisCommand(c, "AUTH %s", PASSWORD) : NULL;
    freeReplyObject(r);
    r = c && !c->err ? redisCommand(c, "CLIENT KILL TYPE normal SKIPME yes") : NULL;
    freeReplyObject(r);
    if (c)
        redisFree(c);
}

static parley_status load(store *s, size_t *n, char **err)
{
    store_key k = {"kitchen", "", ""};
    pbuf b = PBUF_INIT;
    parley_status st = B->load(s, &k, 0, T0 + 100, &b, n, err);
    pbuf_free(&b);
    return st;
}

/* hiredis 0.14 crashes when some allocations of its own fail: its allocator aborts
 * (HIREDIS_OOM_HANDLER, abort() in 0.14), and redisBufferWrite replaces the written
 * output buffer with sdsempty() and reads its length unchecked (both gone in hiredis 1.0).
 * A child whose crash comes from inside libhiredis (the first frame below the handler
 * that is not libc's) while allocations fail exits 77: that run is hiredis's fault, not
 * the store's. */
static const char *object_of(void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) && info.dli_fname ? info.dli_fname : "";
}

static void on_crash(int sig)
{
    void *frames[16];
    int n = backtrace(frames, 16), i = 1;
    while (i < n && strstr(object_of(frames[i]), "libc.so"))
        i++;
    if (i < n && strstr(object_of(frames[i]), "libhiredis"))
        _exit(77);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* One read with the k-th allocation and every later one failing, in a child on a
 * connection of its own (the parent's is dropped with it); the next read, with memory
 * back, must succeed at once.  The child's exit: 0, 1 (a check failed), 2 (the read made
 * fewer than k allocations), 77 (hiredis crashed), 78 (hiredis misreported). */
static int run_child(store *s, long k, int reconnecting)
{
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc_s now: the handler must not allocate */
    signal(SIGSEGV, on_crash);
    signal(SIGABRT, on_crash);
    drop_clients();
    size_t n = 0;
    char *err = NULL;
    if (!reconnecting && load(s, &n, &err) != PARLEY_OK) /* a connection of the child's own */
        return 1;
    free(err);
    err = NULL;
    af_arm(k, 1);
    parley_status st = load(s, &n, &err);
    long failures = af_failures();
    af_disarm();
    /* hiredis 0.14 reports glibc's getaddrinfo out of memory as "Address family for hostname
     * not supported" (it asks again for IPv6 and reports that answer): a connection
     * refused so, or with its message lost to the failures, is hiredis's word, not the
     * store's. */
    if (reconnecting && st == PARLEY_ERR_STORAGE && (!err || strstr(err, "cannot connect"))) {
        free(err);
        return 78;
    }
    if (st != PARLEY_OK && st != PARLEY_ERR_NO_MEMORY)
        fprintf(stderr, "allocation %ld failed (%s): status %d: %s\n", k,
                reconnecting ? "reconnecting" : "connected", (int)st, err ? err : "?");
    CHECK(st == PARLEY_OK || st == PARLEY_ERR_NO_MEMORY);
    free(err);
    err = NULL;
    n = 0;
    st = load(s, &n, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "after allocation %ld failed: %s\n", k, err ? err : "?");
    CHECK(st == PARLEY_OK && n == 2);
    free(err);
    return check_failed ? 1 : failures == 0 ? 2 : 0;
}

/* Runs the read failing each allocation in turn; returns how many it makes. */
static long fail_each_allocation(store *s, int reconnecting, long *hiredis_faults)
{
    for (long k = 1;; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            _exit(run_child(s, k, reconnecting));
        int status = 0;
        waitpid(pid, &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == 77 || code == 78)
            (*hiredis_faults)++;
        else if (code != 0 && code != 2)
            fprintf(stderr, "allocation %ld (%s): child %s %d\n", k,
                    reconnecting ? "reconnecting" : "connected",
                    WIFSIGNALED(status) ? "killed by signal" : "exited",
                    WIFSIGNALED(status) ? WTERMSIG(status) : code);
        CHECK(code == 0 || code == 2 || code == 77 || code == 78);
        if (code == 2 || check_failed > 20)
            return k - 1;
    }
}

/* An append on a connection the server dropped, with its k-th allocation failing (once):
 * a turn reported failed must not be stored -- a reply hiredis could not read for want of
 * memory is tried again (the append is idempotent on its turn_id), not reported lost. */
static int append_child(store *s, long k)
{
    signal(SIGSEGV, on_crash);
    signal(SIGABRT, on_crash);
    drop_clients();
    char json[2][64] = {"{\"role\":\"user\",\"content\":\"more\"}",
                        "{\"role\":\"assistant\",\"content\":\"sure\"}"};
    store_message m[2] = {{"20000000-0000-4000-8000-000000000001", "user", T0, json[0],
                           strlen(json[0]), NULL, NULL, 0},
                          {"20000000-0000-4000-8000-000000000002", "assistant", T0, json[1],
                           strlen(json[1]), NULL, NULL, 0}};
    char turn_id[48], conversation[32]; /* each run its own: the server keeps what ran */
    snprintf(turn_id, sizeof turn_id, "00000000-0000-4000-8000-%012ld", 1000 + k);
    snprintf(conversation, sizeof conversation, "append-%ld", k);
    store_turn t = {turn_id, T0 + 20, T0 + 25, m, 2, NULL, 0, 0};
    store_key key = {conversation, "", ""};
    char *err = NULL;
    af_arm(k, 0);
    parley_status st = B->append(s, &key, &t, T0 + 30, &err);
    long failures = af_failures();
    af_disarm();
    char said[200];
    snprintf(said, sizeof said, "%s", err ? err : "");
    free(err);
    if (st != PARLEY_OK && st != PARLEY_ERR_NO_MEMORY)
        return 78; /* hiredis's misreported connection (see run_child) */
    size_t n = 0;
    pbuf b = PBUF_INIT;
    err = NULL;
    parley_status lst = B->load(s, &key, 0, T0 + 100, &b, &n, &err);
    pbuf_free(&b);
    free(err);
    int stored = lst == PARLEY_OK && n == 2;
    if (st != PARLEY_OK && stored)
        fprintf(stderr, "allocation %ld failed: the append said %d (%s) but the turn is stored\n",
                k, (int)st, said);
    CHECK(st == PARLEY_OK ? stored : !stored);
    return check_failed ? 1 : failures == 0 ? 2 : 0;
}

static void fail_each_allocation_of_an_append(store *s, long *hiredis_faults)
{
    for (long k = 1; k < 100000; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            _exit(append_child(s, k));
        int status = 0;
        waitpid(pid, &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == 77 || code == 78)
            (*hiredis_faults)++;
        CHECK(code == 0 || code == 2 || code == 77 || code == 78);
        if (code == 2 || check_failed > 20)
            return;
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* a write to a connection the server dropped: EPIPE */
    if (redis_server_start(&server, PASSWORD) != 0) {
        fprintf(stderr, "cannot start redis-server (scripts/setup.sh installs it)\n");
        return 1;
    }
    char url[160];
    redis_server_url(&server, url, sizeof url);
    store_config cfg = {.location = url + strlen("redis:"), .limits = {0, 100, 0}};
    store *s = NULL;
    char *err = NULL;
    CHECK(B->open(&cfg, &s, &err) == PARLEY_OK);
    free(err);
    if (s) {
        char json[2][64] = {"{\"role\":\"user\",\"content\":\"hi\"}",
                            "{\"role\":\"assistant\",\"content\":\"hello\"}"};
        store_message m[2] = {{"10000000-0000-4000-8000-000000000001", "user", T0, json[0],
                               strlen(json[0]), NULL, NULL, 0},
                              {"10000000-0000-4000-8000-000000000002", "assistant", T0, json[1],
                               strlen(json[1]), NULL, NULL, 0}};
        store_turn t = {"00000000-0000-4000-8000-000000000001", T0, T0 + 5, m, 2, NULL, 0, 0};
        store_key k = {"kitchen", "", ""};
        CHECK(B->append(s, &k, &t, T0 + 10, &err) == PARLEY_OK);
        free(err);
        long crashes = 0;
        long connected = fail_each_allocation(s, 0, &crashes);
        long reconnecting = fail_each_allocation(s, 1, &crashes);
        printf("allocations of a read: %ld connected, %ld reconnecting; hiredis crashed or "
               "misreported at %ld\n",
               connected, reconnecting, crashes);
        CHECK(connected > 0);
        CHECK(reconnecting > connected); /* the reconnection's allocations were failed too */
        fail_each_allocation_of_an_append(s, &crashes);
        B->close(s);
    }
    redis_server_stop(&server);
    return check_report();
}
