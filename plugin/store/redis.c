/*
 * redis.c -- the Redis store: history_store "redis://[:PASSWORD@]HOST:PORT[/DB]",
 * shared by every host process pointed at the same Redis and key prefix.
 *
 * Each store operation is one Lua script (redis_scripts.h: the data layout
 * and why scripts), run over one synchronous hiredis connection guarded by a
 * mutex.  A query is the exception: a loop of bounded script calls, so that
 * one over a big store never holds Redis (or the connection) for long.  The
 * backend is `blocking`: the agent calls it from its store thread, never from
 * the worker that runs the HTTP transfers, so a slow or unreachable Redis
 * delays only the turns that need history.
 *
 * Connection faults
 *  - open() connects and checks the server (AUTH, SELECT, PING): an
 *    unreachable Redis or a wrong password fails create() at once with a
 *    clear message, rather than every turn later.
 *  - A call that finds the connection broken (Redis restarted, network cut)
 *    reconnects; a call whose command failed on the wire fails with
 *    PARLEY_ERR_STORAGE, and the next call reconnects.  Reconnection is tried
 *    at most every REDIS_RECONNECT_MS, so while Redis is down calls fail fast.
 *  - Scripts are atomic: a failed call wrote nothing, or (reply lost after the
 *    server ran it) wrote the whole turn, which a retry finds by its turn_id.
 * The password is kept for AUTH only: never in a log line or error text.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "lib/redact.h"
#include "lib/uuid.h"
#include "store/redis_scripts.h"
#include "store/store.h"
#include "store/store_json.h"

#define REDIS_CONNECT_TIMEOUT_MS 2000
#define REDIS_COMMAND_TIMEOUT_MS 5000
#define REDIS_RECONNECT_MS 250
/* Keys outlive the idle timeout by this much, so clocks of hosts that differ
 * a little never let Redis drop what the store's own check still calls live. */
#define REDIS_TTL_GRACE_MS 60000
#define REDIS_MAX_ARGS 32
#define REDIS_DEFAULT_LEASE_MS 10000
/* Leases to give back kept at most (redis_store.doubtful): past this, during
 * a long outage, one expires by itself instead (history_lease_ms). */
#define REDIS_MAX_DOUBTFUL 1024

enum {
    SCRIPT_LOAD,
    SCRIPT_APPEND,
    SCRIPT_GET_CONVERSATION,
    SCRIPT_GET_TURN,
    SCRIPT_LIST,
    SCRIPT_FORGET,
    SCRIPT_EXPIRE,
    SCRIPT_STATS,
    SCRIPT_LEASE_ACQUIRE,
    SCRIPT_LEASE_RENEW,
    SCRIPT_LEASE_RELEASE,
    SCRIPT_QUERY_CONVERSATION,
    SCRIPT_QUERY_ALL,
    SCRIPT_GET_MESSAGE,
    SCRIPT_FIND_MESSAGE,
    SCRIPT_LOAD_TURN,
    SCRIPT_SET_INTERFACE_ID,
    SCRIPT_UPGRADE,
    SCRIPT_CONTEXT_GET,
    SCRIPT_CONTEXT_SET,
    SCRIPT_COUNT
};

static const char *const SCRIPTS[SCRIPT_COUNT] = {
    REDIS_LUA_PRELUDE REDIS_LUA_LOAD,   REDIS_LUA_PRELUDE REDIS_LUA_APPEND,
    REDIS_LUA_PRELUDE REDIS_LUA_GET_CONVERSATION, REDIS_LUA_PRELUDE REDIS_LUA_GET_TURN,
    REDIS_LUA_PRELUDE REDIS_LUA_LIST,   REDIS_LUA_PRELUDE REDIS_LUA_FORGET,
    REDIS_LUA_PRELUDE REDIS_LUA_EXPIRE, REDIS_LUA_PRELUDE REDIS_LUA_STATS,
    REDIS_LUA_PRELUDE REDIS_LUA_LEASE_ACQUIRE, REDIS_LUA_PRELUDE REDIS_LUA_LEASE_RENEW,
    REDIS_LUA_PRELUDE REDIS_LUA_LEASE_RELEASE,
    REDIS_LUA_PRELUDE REDIS_LUA_QUERY_COMMON REDIS_LUA_QUERY_CONVERSATION,
    REDIS_LUA_PRELUDE REDIS_LUA_QUERY_COMMON REDIS_LUA_QUERY_ALL,
    REDIS_LUA_PRELUDE REDIS_LUA_GET_MESSAGE,
    REDIS_LUA_PRELUDE REDIS_LUA_FIND_IMID REDIS_LUA_FIND_MESSAGE,
    REDIS_LUA_PRELUDE REDIS_LUA_FIND_IMID REDIS_LUA_LOAD_TURN,
    REDIS_LUA_PRELUDE REDIS_LUA_SET_INTERFACE_ID,
    REDIS_LUA_PRELUDE REDIS_LUA_UPGRADE,
    REDIS_LUA_PRELUDE REDIS_LUA_CONTEXT_GET,
    REDIS_LUA_PRELUDE REDIS_LUA_CONTEXT_SET,
};

typedef struct redis_address {
    char *host;     /* without IPv6 brackets */
    int port;
    long db;
    char *password; /* NULL = no AUTH */
    char *name;     /* "redis store HOST:PORT/DB" for messages: no password */
} redis_address;

/* One connection to Redis, reopened on demand. */
typedef struct redis_conn {
    redisContext *ctx;          /* NULL while disconnected */
    char sha[SCRIPT_COUNT][41]; /* SHA1 of each script loaded into the server's cache ("" = not) */
    uint64_t next_connect_ms;   /* monotonic: no reconnection attempt before */
    int lost_logged;            /* the loss of the connection was logged */
} redis_conn;

/* A lease this store object holds (store.h, version 2), or may hold. */
typedef struct held_lease {
    struct held_lease *next;
    char token[UUID_STR_LEN];   /* random: names this holder in Redis */
    int zero_answers;           /* doubtful: releases Redis answered "not held" */
    char cid[];
} held_lease;

typedef struct redis_store {
    struct store base;
    redis_address addr;
    char *prefix;
    store_limits limits;
    uint64_t lease_ms;
    store_log_fn log;
    void *log_ud;

    pthread_mutex_t lock;       /* guards conn: one call at a time */
    redis_conn conn;
    atomic_size_t evicted;
    atomic_size_t trimmed; /* turns the append script dropped by keep_turns, since open */
    atomic_size_t expired;

    /* Leases: the list, and the thread that renews them on its own connection. */
    pthread_mutex_t lease_lock;
    pthread_cond_t lease_wake;
    held_lease *leases;
    /* Leases nobody may know of: an acquire (or release) whose reply never
     * came, as when Redis stalls past the command timeout.  Redis may still
     * run the command when it wakes, taking a lease for a turn that has long
     * ended; the renewer gives each back (compare-and-delete on the token)
     * as soon as Redis answers, so no later turn waits for it. */
    held_lease *doubtful;
    size_t ndoubtful;
    int stopping;
    int renewer_started;
    pthread_t renewer;
    redis_conn renew_conn;      /* the renewer's only */
} redis_store;

/* ---- the location: redis://[:PASSWORD@]HOST:PORT[/DB] ---- */

static void address_free(redis_address *a)
{
    free(a->host);
    if (a->password) /* do not leave it in freed memory */
        memset(a->password, 0, strlen(a->password));
    free(a->password);
    free(a->name);
    memset(a, 0, sizeof *a);
}

/* Decimal digits [s, end) as a number in [min, max], or -1. */
static long parse_number(const char *s, const char *end, long min, long max)
{
    if (s == end || end - s > 9)
        return -1;
    long v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v < min || v > max ? -1 : v;
}

static char *bad_location(const char *why)
{
    return pstr_printf("redis location: %s; expected redis://[:PASSWORD@]HOST:PORT[/DB]", why);
}

/* `loc` is what follows "redis:".  Messages never quote the text, which may hold the password. */
static parley_status parse_location(const char *loc, redis_address *a, char **err)
{
    memset(a, 0, sizeof *a);
    if (strncmp(loc, "//", 2) != 0) {
        *err = bad_location("the location must start with \"redis://\"");
        return PARLEY_ERR_INVALID_INPUT;
    }
    const char *p = loc + 2;
    const char *at = strrchr(p, '@'); /* a password may itself hold '@' */
    if (at) {
        if (p[0] != ':' || at == p + 1) {
            *err = bad_location("credentials must be \":PASSWORD@\" (a non-empty password, no user)");
            return PARLEY_ERR_INVALID_INPUT;
        }
        a->password = strndup(p + 1, (size_t)(at - p - 1));
        if (!a->password)
            return PARLEY_ERR_NO_MEMORY;
        p = at + 1;
    }
    const char *host = p, *host_end;
    if (*p == '[') { /* [IPv6]:PORT */
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end || host_end[1] != ':') {
            address_free(a);
            *err = bad_location("an IPv6 host must be written [ADDRESS]:PORT");
            return PARLEY_ERR_INVALID_INPUT;
        }
        p = host_end + 1;
    } else {
        host_end = strchr(p, ':');
        if (!host_end) {
            address_free(a);
            *err = bad_location("the port is missing");
            return PARLEY_ERR_INVALID_INPUT;
        }
        p = host_end;
    }
    for (const char *h = host; h < host_end; h++) {
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              *h == '.' || *h == '-' || *h == ':' || *h == '_')) {
            address_free(a);
            *err = bad_location("the host has a character that is not allowed");
            return PARLEY_ERR_INVALID_INPUT;
        }
    }
    if (host == host_end) {
        address_free(a);
        *err = bad_location("the host is empty");
        return PARLEY_ERR_INVALID_INPUT;
    }
    const char *port = p + 1, *port_end = port + strcspn(port, "/");
    long port_number = parse_number(port, port_end, 1, 65535);
    if (port_number < 0) {
        address_free(a);
        *err = bad_location("the port must be a number from 1 to 65535");
        return PARLEY_ERR_INVALID_INPUT;
    }
    a->port = (int)port_number;
    if (*port_end == '/') {
        a->db = parse_number(port_end + 1, port_end + strlen(port_end), 0, 1000000);
        if (a->db < 0) {
            address_free(a);
            *err = bad_location("the database must be a number (0, 1, ...) after the port");
            return PARLEY_ERR_INVALID_INPUT;
        }
    }
    a->host = strndup(host, (size_t)(host_end - host));
    a->name = a->host ? pstr_printf("redis store %s%.*s%s:%d/%ld", host[-1] == '[' ? "[" : "",
                                    (int)(host_end - host), host, host[-1] == '[' ? "]" : "",
                                    a->port, a->db)
                      : NULL;
    if (!a->host || !a->name) {
        address_free(a);
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}

/* ---- errors and logging ---- */

/* `text` (Redis's or hiredis's words, perhaps) without the password. */
static void scrub(const redis_store *s, char **text)
{
    secret_span password = {s->addr.password, s->addr.password ? strlen(s->addr.password) : 0};
    redact_owned(text, &password, 1);
}

static void say(redis_store *s, parley_log_level level, const char *fmt, const char *detail)
{
    if (!s->log)
        return;
    char *line = pstr_printf(fmt, s->addr.name, detail);
    scrub(s, &line);
    if (line)
        s->log(s->log_ud, level, line);
    free(line);
}

/* PARLEY_ERR_STORAGE with "<store name>: <what>: <detail>". */
static parley_status fail(redis_store *s, char **err, const char *what, const char *detail)
{
    if (err) {
        *err = pstr_printf("%s: %s%s%s", s->addr.name, what, detail ? ": " : "", detail ? detail : "");
        scrub(s, err);
    }
    return PARLEY_ERR_STORAGE;
}

/* ---- the connection ---- */

static struct timeval ms_to_timeval(long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static void disconnect(redis_conn *c)
{
    if (c->ctx)
        redisFree(c->ctx);
    c->ctx = NULL;
}

/* Run one command while connecting: 0, or -1 with *err (-2: hiredis ran out of memory). */
static int setup_command(redis_store *s, redis_conn *c, char **err, int argc, const char **argv)
{
    redisReply *r = redisCommandArgv(c->ctx, argc, argv, NULL);
    if (!r) {
        fail(s, err, "lost the connection while connecting", c->ctx->errstr);
        return c->ctx->err == REDIS_ERR_OOM ? -2 : -1;
    }
    int ok = r->type != REDIS_REPLY_ERROR;
    if (!ok) /* e.g. "WRONGPASS invalid username-password pair": the server never echoes it */
        fail(s, err, strcmp(argv[0], "AUTH") == 0 ? "authentication failed" : "refused", r->str);
    freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Connect, authenticate, select the database.  PARLEY_OK or PARLEY_ERR_STORAGE. */
/* Load every script into the server's script cache (one pipelined round
 * trip), so calls send EVALSHA and a 40-byte hash instead of the script. */
static void load_scripts(redis_conn *c)
{
    for (int i = 0; i < SCRIPT_COUNT; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", SCRIPTS[i]};
        c->sha[i][0] = '\0';
        redisAppendCommandArgv(c->ctx, 3, argv, NULL);
    }
    for (int i = 0; i < SCRIPT_COUNT; i++) {
        void *reply = NULL;
        if (redisGetReply(c->ctx, &reply) != REDIS_OK)
            return; /* the connection broke: the next call finds out */
        redisReply *r = reply;
        if (r->type == REDIS_REPLY_STRING && r->len == 40)
            memcpy(c->sha[i], r->str, 41);
        freeReplyObject(r);
    }
}

static parley_status connect_now(redis_store *s, redis_conn *c, char **err)
{
    disconnect(c);
    c->ctx = redisConnectWithTimeout(s->addr.host, s->addr.port,
                                     ms_to_timeval(REDIS_CONNECT_TIMEOUT_MS));
    if (!c->ctx)
        return PARLEY_ERR_NO_MEMORY;
    if (c->ctx->err) {
        parley_status st = c->ctx->err == REDIS_ERR_OOM ? PARLEY_ERR_NO_MEMORY : PARLEY_ERR_STORAGE;
        fail(s, err, "cannot connect", c->ctx->errstr);
        disconnect(c);
        return st;
    }
    redisSetTimeout(c->ctx, ms_to_timeval(REDIS_COMMAND_TIMEOUT_MS));
    redisEnableKeepAlive(c->ctx);
    char db[24];
    snprintf(db, sizeof db, "%ld", s->addr.db);
    const char *auth[] = {"AUTH", s->addr.password};
    const char *select[] = {"SELECT", db};
    const char *ping[] = {"PING"};
    int rc = s->addr.password ? setup_command(s, c, err, 2, auth) : 0;
    if (rc == 0 && s->addr.db)
        rc = setup_command(s, c, err, 2, select);
    if (rc == 0)
        rc = setup_command(s, c, err, 1, ping);
    if (rc != 0) {
        disconnect(c);
        return rc == -2 ? PARLEY_ERR_NO_MEMORY : PARLEY_ERR_STORAGE;
    }
    load_scripts(c);
    return PARLEY_OK;
}

/* A usable connection: the current one, or a new one (at most every REDIS_RECONNECT_MS). */
static parley_status ensure_connected(redis_store *s, redis_conn *c, int *fresh, char **err)
{
    *fresh = 0;
    if (c->ctx && !c->ctx->err)
        return PARLEY_OK;
    if (clock_mono_ms() < c->next_connect_ms)
        return fail(s, err, "not connected (retrying shortly)", NULL);
    char *why = NULL;
    parley_status st = connect_now(s, c, &why);
    if (st != PARLEY_OK) {
        /* Out of memory here is ours, not the server's: the next call may try again at once. */
        if (st != PARLEY_ERR_NO_MEMORY)
            c->next_connect_ms = clock_mono_ms() + REDIS_RECONNECT_MS;
        if (!c->lost_logged && s->log && why) { /* why names the store already */
            char *line = pstr_printf("%s; turns that need history fail until it is back", why);
            if (line)
                s->log(s->log_ud, PARLEY_LOG_WARN, line);
            free(line);
        }
        c->lost_logged = 1;
        if (err)
            *err = why;
        else
            free(why);
        return st;
    }
    if (c->lost_logged)
        say(s, PARLEY_LOG_INFO, "%s: %s", "connected again");
    c->lost_logged = 0;
    *fresh = 1;
    return PARLEY_OK;
}

/* ---- running a script ---- */

/* A script's arguments after the common three (prefix, now, idle timeout). */
typedef struct script_args {
    int argc;
    const char *argv[REDIS_MAX_ARGS];
    size_t len[REDIS_MAX_ARGS];
    char numbers[REDIS_MAX_ARGS][24];
} script_args;

static void arg_bytes(script_args *a, const char *p, size_t n)
{
    a->argv[a->argc] = p;
    a->len[a->argc] = n;
    a->argc++;
}

static void arg_str(script_args *a, const char *p)
{
    arg_bytes(a, p, strlen(p));
}

static void arg_u64(script_args *a, uint64_t v)
{
    char *slot = a->numbers[a->argc];
    int n = snprintf(slot, sizeof a->numbers[0], "%llu", (unsigned long long)v);
    arg_bytes(a, slot, (size_t)n);
}

static void args_init(script_args *a, redis_store *s, uint64_t now_ms)
{
    a->argc = 3; /* EVAL, script, numkeys */
    arg_str(a, s->prefix);
    arg_u64(a, now_ms);
    arg_u64(a, s->limits.idle_timeout_ms);
}

/*
 * Run script `id`: EVALSHA when the connection loaded it, else (or when the
 * server's script cache was flushed meanwhile: NOSCRIPT) EVAL with its text.
 * A connection found broken at the first attempt is reopened and the
 * script sent once more when `retry` (scripts that may safely run twice:
 * reads, and append, idempotent on turn_id).  *reply is never an error
 * reply; PARLEY_ERR_STORAGE otherwise, or *lease_lost when the append's
 * fencing refused it.
 */
static parley_status run_on(redis_store *s, redis_conn *c, int id, script_args *a, int retry,
                            redisReply **reply, char **err)
{
    a->argv[2] = "0";
    a->len[2] = 1;
    *reply = NULL;
    for (int attempt = 0;; attempt++) {
        int fresh;
        parley_status st = ensure_connected(s, c, &fresh, err);
        if (st != PARLEY_OK)
            return st;
        int by_sha = c->sha[id][0] != '\0';
        a->argv[0] = by_sha ? "EVALSHA" : "EVAL";
        a->len[0] = strlen(a->argv[0]);
        a->argv[1] = by_sha ? c->sha[id] : SCRIPTS[id];
        a->len[1] = strlen(a->argv[1]);
        redisReply *r = redisCommandArgv(c->ctx, a->argc, a->argv, a->len);
        if (!r) {
            /* hiredis out of memory (its reply unread: the script may have run) is tried again
               once more, even on a fresh connection: the server is fine, and a retryable script
               is idempotent, so an append that ran says so rather than "failed" */
            int oom = c->ctx->err == REDIS_ERR_OOM;
            int again = retry && ((attempt == 0 && !fresh) || (oom && attempt < 2));
            if (!again) {
                st = fail(s, err, "lost the connection", c->ctx->errstr);
                if (c->ctx->err == REDIS_ERR_OOM) /* hiredis' allocation: the server is fine */
                    st = PARLEY_ERR_NO_MEMORY;
                say(s, PARLEY_LOG_WARN, "%s: lost the connection (%s); reconnecting on the next call",
                    c->ctx->errstr);
            }
            disconnect(c);
            if (again)
                continue;
            return st;
        }
        if (r->type == REDIS_REPLY_ERROR && by_sha && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r); /* SCRIPT FLUSH, or a failover: nothing ran */
            c->sha[id][0] = '\0';
            attempt--;
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            st = fail(s, err, "error", r->str);
            freeReplyObject(r);
            return st;
        }
        *reply = r;
        return PARLEY_OK;
    }
}

/* run_on the store's shared connection, one call at a time. */
static parley_status run_script(redis_store *s, int id, script_args *a, int retry,
                                redisReply **reply, char **err)
{
    pthread_mutex_lock(&s->lock);
    parley_status st = run_on(s, &s->conn, id, a, retry, reply, err);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- replies ---- */

static int is_array(const redisReply *r, size_t min)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= min;
}

static long long reply_int(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

/* A bulk string: its bytes, or NULL. */
static const char *reply_str(const redisReply *r, size_t *len)
{
    if (!r || r->type != REDIS_REPLY_STRING)
        return NULL;
    if (len)
        *len = (size_t)r->len;
    return r->str;
}

static uint64_t reply_u64(const redisReply *r)
{
    const char *p = reply_str(r, NULL);
    return p ? strtoull(p, NULL, 10) : (uint64_t)(r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0);
}

static parley_status bad_reply(redis_store *s, redisReply *r, char **err)
{
    freeReplyObject(r);
    return fail(s, err, "unexpected reply (data written by something else under the key prefix?)",
                NULL);
}

/* A turn's or message's JSON that is not what Parley wrote (store_json_object_list): never
 * spliced into what the store returns.  The storage error names the conversation; the reply
 * (which may hold the id) is freed after. */
static parley_status damaged(redis_store *s, redisReply *r, const char *conversation_id,
                             size_t len, char **err)
{
    parley_status st = store_json_damaged(s->addr.name, conversation_id ? conversation_id : "",
                                          conversation_id ? len : 0, err);
    freeReplyObject(r);
    return st;
}

/* A query leaves a damaged message out and answers with the rest: the log says why. */
static void skipped_damaged(redis_store *s, const char *conversation_id, size_t len)
{
    char *why = NULL;
    store_json_damaged(s->addr.name, conversation_id, len, &why);
    if (s->log && why) {
        char *line = pstr_printf("%s (a query left it out)", why);
        if (line)
            s->log(s->log_ud, PARLEY_LOG_WARN, line);
        free(line);
    }
    free(why);
}

static void count_expired(redis_store *s, long long n)
{
    if (n > 0)
        atomic_fetch_add(&s->expired, (size_t)n);
}

/* ---- keys ---- */

/* The conversation's key part: id qualified by persona and interface, with
 * lengths so that no two keys can spell the same string. */
static char *conversation_key(const store_key *k)
{
    return pstr_printf("%zu:%s/%zu:%s/%s", strlen(k->persona), k->persona,
                       strlen(k->interface_type), k->interface_type, k->conversation_id);
}

/* ---- the backend ---- */

static void *renewer_main(void *arg);
static parley_status upgrade_store(redis_store *s, char **err);

/* The lease mutex and condition (on the monotonic clock): 0, or -1. */
static int lease_sync_init(redis_store *s)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&s->lease_wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        return -1;
    if (pthread_mutex_init(&s->lease_lock, NULL) != 0) {
        pthread_cond_destroy(&s->lease_wake);
        return -1;
    }
    return 0;
}

static parley_status redis_open(const store_config *cfg, store **out, char **err)
{
    *out = NULL;
    redis_store *s = calloc(1, sizeof *s);
    if (!s)
        return PARLEY_ERR_NO_MEMORY;
    s->base.backend = &store_redis_backend;
    parley_status st = parse_location(cfg->location, &s->addr, err);
    if (st != PARLEY_OK) {
        free(s);
        return st;
    }
    const char *prefix = cfg->key_prefix ? cfg->key_prefix : "parley:";
    s->prefix = strdup(prefix);
    s->limits = cfg->limits;
    if (s->limits.max_conversations == 0)
        s->limits.max_conversations = 1;
    s->lease_ms = cfg->lease_ms ? cfg->lease_ms : REDIS_DEFAULT_LEASE_MS;
    s->log = cfg->log;
    s->log_ud = cfg->log_ud;
    if (!s->prefix || pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s->prefix);
        address_free(&s->addr);
        free(s);
        return PARLEY_ERR_NO_MEMORY;
    }
    if (lease_sync_init(s) != 0) {
        pthread_mutex_destroy(&s->lock);
        free(s->prefix);
        address_free(&s->addr);
        free(s);
        return PARLEY_ERR_NO_MEMORY;
    }
    st = connect_now(s, &s->conn, err);
    if (st == PARLEY_OK)
        st = upgrade_store(s, err);
    if (st == PARLEY_OK) {
        s->renewer_started = pthread_create(&s->renewer, NULL, renewer_main, s) == 0;
        if (!s->renewer_started) {
            st = PARLEY_ERR_NO_MEMORY;
            if (err)
                *err = pstr_printf("%s: cannot start the lease renewal thread", s->addr.name);
        }
    }
    if (st != PARLEY_OK) {
        store_redis_backend.close(&s->base);
        return st;
    }
    *out = &s->base;
    return PARLEY_OK;
}

static void redis_close(store *base)
{
    redis_store *s = (redis_store *)base;
    if (!s)
        return;
    if (s->renewer_started) {
        pthread_mutex_lock(&s->lease_lock);
        s->stopping = 1;
        pthread_cond_signal(&s->lease_wake);
        pthread_mutex_unlock(&s->lease_lock);
        pthread_join(s->renewer, NULL);
    }
    held_lease *lists[] = {s->leases, s->doubtful};
    for (int i = 0; i < 2; i++) { /* still held: they expire by themselves */
        while (lists[i]) {
            held_lease *next = lists[i]->next;
            free(lists[i]);
            lists[i] = next;
        }
    }
    disconnect(&s->conn);
    disconnect(&s->renew_conn);
    pthread_cond_destroy(&s->lease_wake);
    pthread_mutex_destroy(&s->lease_lock);
    pthread_mutex_destroy(&s->lock);
    free(s->prefix);
    address_free(&s->addr);
    free(s);
}

/* A stored size in tokens: 0 (unknown) when missing or not a number that fits. */
static uint32_t reply_tokens(const redisReply *r)
{
    uint64_t v = reply_u64(r);
    return v <= UINT32_MAX ? (uint32_t)v : 0;
}

/* load's "n:tokens," per turn into sizes. */
static void parse_sizes(const char *p, size_t len, store_sizes *sizes)
{
    const char *end = p + len;
    while (p < end) {
        char *colon, *comma;
        unsigned long long n = strtoull(p, &colon, 10);
        if (colon >= end || *colon != ':')
            break;
        unsigned long long tokens = strtoull(colon + 1, &comma, 10);
        if (comma >= end || *comma != ',')
            break;
        store_sizes_add(sizes, n <= UINT32_MAX ? (uint32_t)n : 0,
                        tokens <= UINT32_MAX ? (uint32_t)tokens : 0);
        p = comma + 1;
    }
}

static parley_status redis_load_sized(store *base, const store_key *key, size_t last_turns,
                                      uint64_t now_ms, pbuf *out, size_t *nmessages,
                                      store_sizes *sizes, char **err)
{
    redis_store *s = (redis_store *)base;
    *nmessages = 0;
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    arg_u64(&a, last_turns);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_LOAD, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        size_t len;
        const char *msgs = is_array(r, 3) ? reply_str(r->element[2], &len) : NULL;
        if (!msgs) {
            st = bad_reply(s, r, err);
        } else {
            count_expired(s, reply_int(r->element[0]));
            pbuf_append(out, msgs, len);
            *nmessages = (size_t)reply_int(r->element[1]);
            size_t slen = 0;
            const char *z = r->elements > 3 ? reply_str(r->element[3], &slen) : NULL;
            if (sizes && z)
                parse_sizes(z, slen, sizes);
            freeReplyObject(r);
            if (out->oom)
                st = PARLEY_ERR_NO_MEMORY;
        }
    }
    free(cid);
    return st;
}

static parley_status redis_load(store *base, const store_key *key, size_t last_turns,
                                uint64_t now_ms, pbuf *out, size_t *nmessages, char **err)
{
    return redis_load_sized(base, key, last_turns, now_ms, out, nmessages, NULL, err);
}

/* Take the lease this store holds on `cid` off the list (NULL when none). */
static held_lease *unlist_lease(redis_store *s, const char *cid)
{
    held_lease *found = NULL;
    pthread_mutex_lock(&s->lease_lock);
    for (held_lease **p = &s->leases; *p; p = &(*p)->next) {
        if (strcmp((*p)->cid, cid) == 0) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&s->lease_lock);
    return found;
}

/* Whether this store still holds `token` (the renewer's check before it warns). */
static int holds_token(redis_store *s, const char *token)
{
    int held = 0;
    pthread_mutex_lock(&s->lease_lock);
    for (held_lease *l = s->leases; l && !held; l = l->next)
        held = strcmp(l->token, token) == 0;
    pthread_mutex_unlock(&s->lease_lock);
    return held;
}

/* The token of the lease this store holds on `cid` into token ("" when none). */
static void lease_token(redis_store *s, const char *cid, char token[UUID_STR_LEN])
{
    pthread_mutex_lock(&s->lease_lock);
    for (held_lease *l = s->leases; l; l = l->next) {
        if (strcmp(l->cid, cid) == 0) {
            memcpy(token, l->token, UUID_STR_LEN);
            break;
        }
    }
    pthread_mutex_unlock(&s->lease_lock);
}

/* "id\trole\tcreated_ms\n" per message: what the store indexes besides the JSON. */
static void turn_meta(pbuf *b, const store_turn *t)
{
    for (size_t i = 0; i < t->nmessages; i++) {
        const store_message *m = &t->messages[i];
        pbuf_printf(b, "%s\t%s\t%llu\n", m->message_id, m->role, (unsigned long long)m->created_ms);
    }
}

/* "l1,l2,...": each message's length in the joined text (what a query splits it by). */
static void turn_lens(pbuf *b, const store_turn *t)
{
    for (size_t i = 0; i < t->nmessages; i++)
        pbuf_printf(b, "%s%zu", i ? "," : "", t->messages[i].json_len);
}

static unsigned role_bit(const char *role)
{
    return strcmp(role, "user") == 0        ? STORE_ROLE_USER
           : strcmp(role, "assistant") == 0 ? STORE_ROLE_ASSISTANT
           : strcmp(role, "tool") == 0      ? STORE_ROLE_TOOL
           : strcmp(role, "system") == 0    ? STORE_ROLE_SYSTEM
                                            : 0;
}

/* Per message "LEN:interface message id" then "LEN:metadata" (length-prefixed:
 * either may hold any byte); nothing at all when no message has either. */
static void turn_identity(pbuf *b, const store_turn *t)
{
    size_t mark = b->len;
    int any = 0;
    for (size_t i = 0; i < t->nmessages; i++) {
        const store_message *m = &t->messages[i];
        size_t imid_len = m->interface_message_id ? strlen(m->interface_message_id) : 0;
        size_t md_len = m->metadata ? m->metadata_len : 0;
        any |= imid_len || md_len;
        pbuf_printf(b, "%zu:", imid_len);
        pbuf_append(b, m->interface_message_id, imid_len);
        pbuf_printf(b, "%zu:", md_len);
        pbuf_append(b, m->metadata, md_len);
    }
    if (!any)
        b->len = mark;
}

/* The TTL of a conversation's keys: the idle timeout plus a grace; 0 = none. */
static uint64_t key_ttl(const redis_store *s)
{
    uint64_t idle = s->limits.idle_timeout_ms;
    return idle ? idle + REDIS_TTL_GRACE_MS : 0;
}

/* The turn's messages joined by ','. */
static void turn_messages(pbuf *b, const store_turn *t)
{
    for (size_t i = 0; i < t->nmessages; i++) {
        if (i)
            pbuf_putc(b, ',');
        pbuf_append(b, t->messages[i].json, t->messages[i].json_len);
    }
}

/* A whole turn: an id, and messages that each have an id, a role and JSON. */
static int turn_is_valid(const store_turn *t)
{
    if (!t || !t->turn_id || !*t->turn_id || !t->messages || t->nmessages == 0)
        return 0;
    for (size_t i = 0; i < t->nmessages; i++) {
        const store_message *m = &t->messages[i];
        if (!m->json || m->json_len == 0 || !m->message_id || !m->role ||
            (m->interface_message_id &&
             strlen(m->interface_message_id) > STORE_MAX_INTERFACE_MESSAGE_ID) ||
            (m->metadata_len && !m->metadata))
            return 0;
    }
    return 1;
}

static parley_status redis_append(store *base, const store_key *key, const store_turn *turn,
                                  uint64_t now_ms, char **err)
{
    redis_store *s = (redis_store *)base;
    if (!key || !key->conversation_id || !turn_is_valid(turn))
        return fail(s, err, "cannot append",
                    "a turn needs a conversation id, a turn id and messages with ids, roles and "
                    "JSON (interface message ids of at most 256 bytes)");
    char *cid = conversation_key(key);
    pbuf msgs = PBUF_INIT, meta = PBUF_INIT, lens = PBUF_INIT, identity = PBUF_INIT;
    turn_messages(&msgs, turn);
    turn_meta(&meta, turn);
    turn_lens(&lens, turn);
    turn_identity(&identity, turn);
    unsigned roles = 0;
    for (size_t i = 0; i < turn->nmessages; i++)
        roles |= role_bit(turn->messages[i].role);
    if (!cid || msgs.oom || meta.oom || lens.oom || identity.oom) {
        free(cid);
        pbuf_free(&msgs);
        pbuf_free(&meta);
        pbuf_free(&lens);
        pbuf_free(&identity);
        return PARLEY_ERR_NO_MEMORY;
    }
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    arg_str(&a, key->conversation_id);
    arg_str(&a, key->persona);
    arg_str(&a, key->interface_type);
    arg_str(&a, turn->turn_id);
    arg_u64(&a, turn->started_ms);
    arg_u64(&a, turn->finished_ms);
    arg_u64(&a, turn->nmessages);
    arg_bytes(&a, msgs.data, msgs.len);
    arg_bytes(&a, meta.data, meta.len);
    arg_u64(&a, s->limits.keep_turns);
    arg_u64(&a, s->limits.max_conversations);
    arg_u64(&a, key_ttl(s));
    char token[UUID_STR_LEN] = "";
    lease_token(s, cid, token); /* held: the append is fenced by it */
    arg_str(&a, token);
    arg_bytes(&a, lens.data, lens.len);
    arg_u64(&a, roles);
    arg_u64(&a, turn->messages[turn->nmessages - 1].created_ms);
    arg_bytes(&a, identity.data ? identity.data : "", identity.len);
    arg_str(&a, turn->context ? "1" : "0");
    arg_bytes(&a, turn->context ? turn->context : "", turn->context ? turn->context_len : 0);
    arg_u64(&a, turn->tokens);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_APPEND, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        if (!is_array(r, 3)) {
            st = bad_reply(s, r, err);
        } else {
            long long evicted = reply_int(r->element[1]);
            atomic_fetch_add(&s->evicted, evicted > 0 ? (size_t)evicted : 0);
            count_expired(s, reply_int(r->element[2]));
            long long trimmed = r->elements > 3 ? reply_int(r->element[3]) : 0;
            atomic_fetch_add(&s->trimmed, trimmed > 0 ? (size_t)trimmed : 0);
            freeReplyObject(r);
        }
    }
    if (st == PARLEY_OK && token[0]) /* the script gave the lease back with the commit */
        free(unlist_lease(s, cid));
    free(cid);
    pbuf_free(&msgs);
    pbuf_free(&meta);
    pbuf_free(&lens);
    pbuf_free(&identity);
    return st;
}

/* A conversation's lifetime from the four replies lm, mc, tc, roles (each
 * nil, a string or a number: read as 0 when missing). */
static store_lifetime lifetime_of(redisReply *const *f)
{
    store_lifetime life = {.last_message_ms = reply_u64(f[0]), .message_count = reply_u64(f[1]),
                           .turn_count = reply_u64(f[2]), .roles = (unsigned)reply_u64(f[3])};
    return life;
}

/* {turn_id, started, finished, msgs[, tokens]} as the ABI's turn JSON: 0, -1 when it is not that
 * shape, -2 when msgs is not message objects (nothing written). */
static int write_turn(pbuf *out, const redisReply *t)
{
    size_t len;
    const char *id = is_array(t, 4) ? reply_str(t->element[0], NULL) : NULL;
    const char *msgs = id ? reply_str(t->element[3], &len) : NULL;
    if (!msgs)
        return -1;
    if (store_json_object_list(msgs, len) < 1)
        return -2;
    store_json_turn(out, id, reply_u64(t->element[1]), reply_u64(t->element[2]),
                    t->elements > 4 ? reply_tokens(t->element[4]) : 0, msgs, len);
    return 0;
}

/* Status of a {0} / {1} / {2, ...} reply: found, or NOT_FOUND (counting an expiry). */
static parley_status found_or_not(redis_store *s, redisReply *r, size_t min, char **err)
{
    long long tag = is_array(r, 1) ? reply_int(r->element[0]) : -1;
    if (tag == 0 || tag == 1) {
        count_expired(s, tag);
        freeReplyObject(r);
        return PARLEY_ERR_NOT_FOUND;
    }
    if (tag != 2 || r->elements < min)
        return bad_reply(s, r, err);
    return PARLEY_OK;
}

static parley_status redis_get_conversation(store *base, const store_key *key, uint64_t now_ms,
                                            pbuf *out, char **err)
{
    redis_store *s = (redis_store *)base;
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_GET_CONVERSATION, &a, 1, &r, err);
    if (st == PARLEY_OK)
        st = found_or_not(s, r, 8, err);
    free(cid);
    if (st != PARLEY_OK)
        return st;
    const char *id = reply_str(r->element[1], NULL);
    size_t mark = out->len;
    if (id) {
        store_json_conversation_head(out, id, key->persona, strlen(key->persona),
                                     key->interface_type, strlen(key->interface_type),
                                     reply_u64(r->element[2]), reply_u64(r->element[3]));
        store_lifetime life = lifetime_of(r->element + 4);
        store_json_lifetime(out, &life);
        pbuf_puts(out, ",\"turns\":[");
        int rc = 0;
        for (size_t i = 8; i < r->elements && rc == 0; i++) {
            if (i > 8)
                pbuf_putc(out, ',');
            rc = write_turn(out, r->element[i]);
        }
        pbuf_puts(out, "]}");
        if (rc == -2) {
            out->len = mark;
            return damaged(s, r, key->conversation_id, strlen(key->conversation_id), err);
        }
        if (rc != 0)
            id = NULL;
    }
    if (!id) {
        out->len = mark;
        return bad_reply(s, r, err);
    }
    freeReplyObject(r);
    return out->oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

static parley_status redis_get_turn(store *base, const char *turn_id, uint64_t now_ms, pbuf *out,
                                    char **err)
{
    redis_store *s = (redis_store *)base;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, turn_id);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_GET_TURN, &a, 1, &r, err);
    if (st == PARLEY_OK)
        st = found_or_not(s, r, 5, err);
    if (st != PARLEY_OK)
        return st;
    size_t len;
    const char *conv = reply_str(r->element[1], NULL);
    const char *msgs = reply_str(r->element[4], &len);
    if (!conv || !msgs)
        return bad_reply(s, r, err);
    if (store_json_object_list(msgs, len) < 1)
        return damaged(s, r, conv, strlen(conv), err);
    pbuf_puts(out, "{\"conversation_id\":");
    pbuf_json_string(out, conv, strlen(conv));
    pbuf_puts(out, ",\"turn\":");
    store_json_turn(out, turn_id, reply_u64(r->element[2]), reply_u64(r->element[3]),
                    r->elements > 5 ? reply_tokens(r->element[5]) : 0, msgs, len);
    pbuf_putc(out, '}');
    freeReplyObject(r);
    return out->oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

static parley_status redis_list(store *base, uint64_t now_ms, pbuf *out, char **err)
{
    redis_store *s = (redis_store *)base;
    script_args a;
    args_init(&a, s, now_ms);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_LIST, &a, 1, &r, err);
    if (st == PARLEY_OK && !is_array(r, 1))
        st = bad_reply(s, r, err);
    if (st == PARLEY_OK)
        count_expired(s, reply_int(r->element[0]));
    if (st != PARLEY_OK)
        return st;
    size_t mark = out->len;
    pbuf_puts(out, "{\"conversations\":[");
    for (size_t i = 1; i < r->elements; i++) {
        const redisReply *c = r->element[i];
        const char *id = is_array(c, 10) ? reply_str(c->element[0], NULL) : NULL;
        if (!id) {
            out->len = mark;
            return bad_reply(s, r, err);
        }
        if (i > 1)
            pbuf_putc(out, ',');
        size_t persona_len = 0, interface_len = 0;
        const char *persona = reply_str(c->element[4], &persona_len);
        const char *interface_type = reply_str(c->element[5], &interface_len);
        store_json_conversation_head(out, id, persona ? persona : "", persona ? persona_len : 0,
                                     interface_type ? interface_type : "",
                                     interface_type ? interface_len : 0,
                                     reply_u64(c->element[1]), reply_u64(c->element[2]));
        store_lifetime life = lifetime_of(c->element + 6);
        store_json_lifetime(out, &life);
        pbuf_printf(out, ",\"turns\":%lld}", reply_int(c->element[3]));
    }
    pbuf_puts(out, "]}");
    freeReplyObject(r);
    return out->oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

static parley_status redis_forget(store *base, const store_key *key, char **err)
{
    redis_store *s = (redis_store *)base;
    char *cid = key ? conversation_key(key) : NULL;
    if (key && !cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, 0);
    arg_str(&a, cid ? cid : "");
    redisReply *r;
    /* Not retried: a second run would answer NOT_FOUND for what the first forgot. */
    parley_status st = run_script(s, SCRIPT_FORGET, &a, 0, &r, err);
    if (st == PARLEY_OK) {
        long long n = reply_int(r);
        freeReplyObject(r);
        if (n < 0)
            st = fail(s, err, "unexpected reply", NULL);
        else if (key && n == 0)
            st = PARLEY_ERR_NOT_FOUND;
    }
    free(cid);
    return st;
}

static parley_status redis_expire(store *base, uint64_t now_ms, size_t *expired, char **err)
{
    redis_store *s = (redis_store *)base;
    if (expired)
        *expired = 0;
    if (s->limits.idle_timeout_ms == 0)
        return PARLEY_OK; /* nothing can be idle: spare Redis the scan */
    script_args a;
    args_init(&a, s, now_ms);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_EXPIRE, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        long long n = reply_int(r);
        freeReplyObject(r);
        if (n < 0) {
            st = fail(s, err, "unexpected reply", NULL);
        } else {
            count_expired(s, n);
            if (expired)
                *expired = (size_t)n;
        }
    }
    return st;
}

static parley_status redis_stats(store *base, store_stats *out, char **err)
{
    redis_store *s = (redis_store *)base;
    memset(out, 0, sizeof *out);
    script_args a;
    args_init(&a, s, 0);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_STATS, &a, 1, &r, err);
    if (st == PARLEY_OK && !is_array(r, 4))
        st = bad_reply(s, r, err);
    if (st == PARLEY_OK) {
        out->conversations = (size_t)reply_int(r->element[0]);
        out->turns = (size_t)reply_int(r->element[1]);
        out->message_bytes = (size_t)reply_int(r->element[2]);
        out->messages = (size_t)reply_int(r->element[3]);
        freeReplyObject(r);
    }
    out->evicted = atomic_load(&s->evicted);
    out->trimmed = atomic_load(&s->trimmed);
    out->expired = atomic_load(&s->expired);
    return st;
}

/* ---- queries and messages (store.h versions 3 and 4) ---- */

/* Turns one query script call reads at most: what bounds the time a query
 * over a big store holds Redis (docs/performance.md). */
#define REDIS_QUERY_SLICE_TURNS 256

/* A message reply {position, id, turn id, role, created, json, interface
 * message id, metadata, conversation id, persona, interface}: its fields
 * (f[1..10], with lengths), or -1 when it is not that shape. */
static int message_fields(const redisReply *m, const char *f[11], size_t len[11])
{
    if (!is_array(m, 11))
        return -1;
    for (size_t i = 1; i < 11; i++)
        if (!(f[i] = reply_str(m->element[i], &len[i])))
            return -1;
    return 0;
}

/* Does a message's field equal the query's filter (NULL: any)? */
static int field_is(const char *field, size_t len, const char *want)
{
    return !want || (strlen(want) == len && memcmp(field, want, len) == 0);
}

/* A message reply as store_json_message: 0, -1 when it is not that shape, -2 when its JSON
 * or metadata is not one object (nothing written). */
static int write_message(pbuf *out, const redisReply *m)
{
    const char *f[11];
    size_t len[11];
    if (message_fields(m, f, len) != 0)
        return -1;
    if (store_json_object_list(f[5], len[5]) != 1 ||
        (len[7] && store_json_object_list(f[7], len[7]) != 1))
        return -2;
    store_json_message(out, f[1], f[8], len[8], f[9], len[9], f[10], len[10], f[2], f[3],
                       reply_u64(m->element[4]), f[5], len[5], f[6], len[6], f[7], len[7]);
    return 0;
}

/* The search text in lower case when the script may prefilter with it: plain
 * printable ASCII without '"', '\\' or '/' (the characters JSON may escape),
 * so a decoded match is also a raw match wherever the message has no \u
 * escape.  NULL otherwise: every candidate then comes to the C check. */
static int prefilter_needle(const char *search, char **lower)
{
    *lower = NULL;
    for (const char *p = search; *p; p++)
        if (*p < 0x20 || *p > 0x7e || *p == '"' || *p == '\\' || *p == '/')
            return 0;
    if (!(*lower = strdup(search)))
        return -1;
    for (char *p = *lower; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p + 32);
    return 0;
}

static void arg_filter(script_args *a, const char *value)
{
    arg_str(a, value ? "1" : "0");
    arg_str(a, value ? value : "");
}

/*
 * A query is a loop of bounded script calls: each reads at most
 * REDIS_QUERY_SLICE_TURNS turns from the position the last one reached and
 * returns up to the matches still wanted plus one (to know whether there are
 * more).  The search rule is applied here, on each match the script returns
 * (store_json_content_matches, the same rule as every store); the script only
 * prefilters.  One conversation (an exact key) walks its own turn list; any
 * other query walks the store-wide position index.
 */
static parley_status redis_query(store *base, const store_query *query, uint64_t now_ms,
                                 pbuf *out, size_t *count, uint64_t *last, int *more, char **err)
{
    redis_store *s = (redis_store *)base;
    const store_query copy = *query, *q = &copy; /* `last` may be &query->after */
    *count = 0;
    *last = 0;
    *more = 0;
    int one = q->conversation_id && q->persona && q->interface_type;
    store_key key = {q->conversation_id, q->persona, q->interface_type};
    char *cid = one ? conversation_key(&key) : NULL;
    const char *search = q->search && *q->search ? q->search : NULL;
    char *needle = NULL;
    if ((one && !cid) || (search && prefilter_needle(search, &needle) != 0)) {
        free(cid);
        return PARLEY_ERR_NO_MEMORY;
    }
    size_t mark = out->len;
    uint64_t after = q->after;
    parley_status st = PARLEY_OK;
    for (int done = 0; !done && !*more && st == PARLEY_OK;) {
        script_args a;
        args_init(&a, s, now_ms);
        arg_str(&a, one ? cid : "");
        arg_str(&a, q->newest_first ? "1" : "0");
        arg_u64(&a, after);
        arg_u64(&a, q->limit - *count + 1);
        arg_u64(&a, REDIS_QUERY_SLICE_TURNS);
        arg_str(&a, q->role ? q->role : "");
        arg_u64(&a, q->since_ms);
        if (q->until_ms == UINT64_MAX)
            arg_str(&a, "");
        else
            arg_u64(&a, q->until_ms);
        arg_str(&a, needle ? needle : "");
        arg_filter(&a, q->conversation_id);
        arg_filter(&a, q->persona);
        arg_filter(&a, q->interface_type);
        redisReply *r;
        st = run_script(s, one ? SCRIPT_QUERY_CONVERSATION : SCRIPT_QUERY_ALL, &a, 1, &r, err);
        if (st != PARLEY_OK)
            break;
        if (!is_array(r, 3)) {
            st = bad_reply(s, r, err);
            break;
        }
        done = reply_int(r->element[0]) == 1;
        uint64_t reached = reply_u64(r->element[1]);
        count_expired(s, reply_int(r->element[2]));
        int malformed = 0;
        for (size_t i = 3; i < r->elements && !malformed; i++) {
            const char *f[11];
            size_t len[11];
            malformed = message_fields(r->element[i], f, len) != 0;
            if (malformed || (search && !store_json_content_matches(f[5], len[5], search)) ||
                !field_is(f[2], len[2], q->turn_id) ||
                !field_is(f[6], len[6], q->interface_message_id))
                continue;
            if (*count == q->limit) {
                *more = 1;
                break;
            }
            size_t before = out->len;
            if (*count)
                pbuf_putc(out, ',');
            *last = reply_u64(r->element[i]->element[0]);
            if (write_message(out, r->element[i]) != 0) {
                out->len = before; /* the rest of the query still answers */
                skipped_damaged(s, f[8], len[8]);
                continue;
            }
            (*count)++;
        }
        if (malformed) {
            st = bad_reply(s, r, err);
            break;
        }
        freeReplyObject(r);
        if (!done && reached == after)
            break; /* no progress (every turn read moves it, so never): do not spin */
        after = reached;
    }
    free(cid);
    free(needle);
    if (st == PARLEY_OK && out->oom)
        st = PARLEY_ERR_NO_MEMORY;
    if (st != PARLEY_OK) {
        out->len = mark;
        *count = 0;
        *last = 0;
        *more = 0;
    }
    return st;
}

/* A {0} / {1} / {2, message} reply written as store_json_message. */
static parley_status message_reply(redis_store *s, redisReply *r, pbuf *out, char **err)
{
    parley_status st = found_or_not(s, r, 2, err);
    if (st != PARLEY_OK)
        return st;
    size_t mark = out->len;
    int rc = write_message(out, r->element[1]);
    if (rc == -2) {
        size_t len;
        const char *conv = reply_str(r->element[1]->element[8], &len);
        return damaged(s, r, conv, len, err);
    }
    if (rc != 0) {
        out->len = mark;
        return bad_reply(s, r, err);
    }
    freeReplyObject(r);
    return out->oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

static parley_status redis_get_message(store *base, const char *message_id, uint64_t now_ms,
                                       pbuf *out, char **err)
{
    redis_store *s = (redis_store *)base;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, message_id);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_GET_MESSAGE, &a, 1, &r, err);
    return st == PARLEY_OK ? message_reply(s, r, out, err) : st;
}

static parley_status redis_find_message(store *base, const store_key *key,
                                        const char *interface_message_id, uint64_t now_ms,
                                        pbuf *out, char **err)
{
    redis_store *s = (redis_store *)base;
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    arg_str(&a, interface_message_id);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_FIND_MESSAGE, &a, 1, &r, err);
    free(cid);
    return st == PARLEY_OK ? message_reply(s, r, out, err) : st;
}

/* Copy an id reply into a STORE_ID_LEN + 1 buffer (out may be NULL): 0, or -1
 * when it is not one. */
static int copy_id(const redisReply *r, char *out)
{
    size_t len;
    const char *id = reply_str(r, &len);
    if (!id || len > STORE_ID_LEN)
        return -1;
    if (out)
        memcpy(out, id, len + 1);
    return 0;
}

static parley_status redis_set_interface_message_id(store *base, const char *turn_id,
                                                    const char *interface_message_id,
                                                    uint64_t now_ms, char *message_id, char **err)
{
    redis_store *s = (redis_store *)base;
    size_t len = interface_message_id ? strlen(interface_message_id) : 0;
    if (len == 0 || len > STORE_MAX_INTERFACE_MESSAGE_ID)
        return fail(s, err, "cannot set the interface message id", "it must be 1 to 256 bytes");
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, turn_id);
    arg_str(&a, interface_message_id);
    arg_u64(&a, key_ttl(s));
    redisReply *r;
    /* Retried safely: setting the same id twice leaves what setting it once does. */
    parley_status st = run_script(s, SCRIPT_SET_INTERFACE_ID, &a, 1, &r, err);
    if (st == PARLEY_OK)
        st = found_or_not(s, r, 2, err);
    if (st != PARLEY_OK)
        return st;
    if (copy_id(r->element[1], message_id) != 0)
        return bad_reply(s, r, err);
    freeReplyObject(r);
    return PARLEY_OK;
}

static parley_status redis_load_turn(store *base, const store_key *key, const char *turn_id,
                                     const char *interface_message_id, size_t window_turns,
                                     uint64_t now_ms, pbuf *out, size_t *nmessages,
                                     char *turn_id_out, int *in_window, char **err)
{
    redis_store *s = (redis_store *)base;
    *nmessages = 0;
    *in_window = 0;
    if (!turn_id && !interface_message_id)
        return PARLEY_ERR_NOT_FOUND;
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    arg_str(&a, turn_id ? turn_id : "");
    arg_str(&a, interface_message_id ? interface_message_id : "");
    arg_u64(&a, window_turns);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_LOAD_TURN, &a, 1, &r, err);
    free(cid);
    if (st == PARLEY_OK)
        st = found_or_not(s, r, 3, err);
    if (st != PARLEY_OK)
        return st;
    char found[STORE_ID_LEN + 1];
    long long in = reply_int(r->element[2]);
    size_t len = 0;
    const char *msgs = in == 0 && r->elements >= 5 ? reply_str(r->element[4], &len) : NULL;
    if (copy_id(r->element[1], found) != 0 || (in != 0 && in != 1) || (in == 0 && !msgs))
        return bad_reply(s, r, err);
    if (turn_id_out)
        memcpy(turn_id_out, found, strlen(found) + 1);
    *in_window = (int)in;
    if (!in) {
        pbuf_append(out, msgs, len);
        pbuf_putc(out, ',');
        *nmessages = (size_t)reply_int(r->element[3]);
    }
    freeReplyObject(r);
    return out->oom ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
}

/* At open: upgrade what was stored before positions and lifetimes existed, a
 * slice of conversations per call (once per Redis: the script marks it done). */
#define REDIS_UPGRADE_SLICE 100

static parley_status upgrade_store(redis_store *s, char **err)
{
    char start[32] = "-inf";
    for (;;) {
        script_args a;
        args_init(&a, s, clock_wall_ms());
        arg_str(&a, start);
        arg_u64(&a, REDIS_UPGRADE_SLICE);
        redisReply *r;
        parley_status st = run_script(s, SCRIPT_UPGRADE, &a, 1, &r, err);
        if (st != PARLEY_OK)
            return st;
        size_t len;
        const char *next = is_array(r, 3) ? reply_str(r->element[1], &len) : NULL;
        if (!next || len >= sizeof start)
            return bad_reply(s, r, err);
        count_expired(s, reply_int(r->element[2]));
        int done = reply_int(r->element[0]) == 1;
        memcpy(start, next, len + 1);
        freeReplyObject(r);
        if (done)
            return PARLEY_OK;
    }
}

/* ---- leases (store.h, version 2) ---- */

/* `l` may be held in Redis without anyone knowing: the renewer gives it back. */
static void doubt(redis_store *s, held_lease *l)
{
    l->zero_answers = 0;
    pthread_mutex_lock(&s->lease_lock);
    int full = s->ndoubtful >= REDIS_MAX_DOUBTFUL;
    if (!full) {
        l->next = s->doubtful;
        s->doubtful = l;
        s->ndoubtful++;
        pthread_cond_signal(&s->lease_wake);
    }
    pthread_mutex_unlock(&s->lease_lock);
    if (full) {
        say(s, PARLEY_LOG_WARN, "%s: %s", "too many conversation leases to give back; one "
            "expires by itself (history_lease_ms)");
        free(l);
    }
}

static parley_status redis_lease_acquire(store *base, const store_key *key, uint64_t *retry_ms,
                                         char **err)
{
    redis_store *s = (redis_store *)base;
    *retry_ms = 0;
    char *cid = conversation_key(key);
    held_lease *l = cid ? malloc(sizeof *l + strlen(cid) + 1) : NULL;
    if (!l) {
        free(cid);
        return PARLEY_ERR_NO_MEMORY;
    }
    strcpy(l->cid, cid);
    free(cid);
    if (uuid4(l->token) != 0) {
        free(l);
        return fail(s, err, "no randomness for a lease token", NULL);
    }
    script_args a;
    args_init(&a, s, 0);
    arg_str(&a, l->cid);
    arg_str(&a, l->token);
    arg_u64(&a, s->lease_ms);
    redisReply *r;
    /* Retried safely: the script takes a lease that already holds our token. */
    parley_status st = run_script(s, SCRIPT_LEASE_ACQUIRE, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        long long taken = is_array(r, 1) ? reply_int(r->element[0]) : -1;
        if (taken == 0) {
            long long left = r->elements > 1 ? reply_int(r->element[1]) : 0;
            *retry_ms = left > 0 ? (uint64_t)left : 1;
            st = PARLEY_ERR_BUSY;
        } else if (taken != 1) {
            st = fail(s, err, "unexpected reply", NULL);
        }
        freeReplyObject(r);
    }
    if (st == PARLEY_ERR_STORAGE) {
        doubt(s, l); /* the script may still run when Redis answers again */
        return st;
    }
    if (st != PARLEY_OK) {
        free(l);
        return st;
    }
    pthread_mutex_lock(&s->lease_lock);
    l->next = s->leases;
    s->leases = l;
    pthread_cond_signal(&s->lease_wake); /* the renewer may have been idle */
    pthread_mutex_unlock(&s->lease_lock);
    return PARLEY_OK;
}

static void redis_lease_release(store *base, const store_key *key)
{
    redis_store *s = (redis_store *)base;
    char *cid = conversation_key(key);
    if (!cid)
        return; /* the lease expires by itself */
    held_lease *found = unlist_lease(s, cid);
    free(cid);
    if (!found)
        return;
    script_args a;
    args_init(&a, s, 0);
    arg_str(&a, found->cid);
    arg_str(&a, found->token);
    arg_u64(&a, s->lease_ms);
    redisReply *r;
    char *err = NULL;
    if (run_script(s, SCRIPT_LEASE_RELEASE, &a, 1, &r, &err) == PARLEY_OK) {
        freeReplyObject(r);
        free(found);
    } else {
        say(s, PARLEY_LOG_WARN, "%s: a conversation lease was not released yet; it is given back "
            "as soon as Redis answers (%s)", err ? err : "out of memory");
        doubt(s, found);
    }
    free(err);
}

/* Give back what `doubtful` may hold, on the renewer's connection (lease_lock
 * held on entry and exit).  An entry goes once Redis deleted it, or once two
 * answers a pass apart said it is not held: the first answer may race the
 * stalled command (Redis wakes to both connections at once), the second comes
 * after Redis has read everything sent before it.  The pass stops at the
 * first call that gets no answer, so a stalled Redis holds the renewer up
 * for one command timeout, not one per entry. */
static void release_doubtful(redis_store *s)
{
    held_lease *todo = s->doubtful, *keep = NULL;
    s->doubtful = NULL;
    pthread_mutex_unlock(&s->lease_lock);
    int answering = 1;
    while (todo) {
        held_lease *l = todo;
        todo = l->next;
        int done = 0;
        if (answering) {
            script_args a;
            args_init(&a, s, 0);
            arg_str(&a, l->cid);
            arg_str(&a, l->token);
            arg_u64(&a, s->lease_ms);
            redisReply *r;
            answering = run_on(s, &s->renew_conn, SCRIPT_LEASE_RELEASE, &a, 0, &r, NULL) ==
                        PARLEY_OK;
            if (answering) {
                long long deleted = reply_int(r);
                freeReplyObject(r);
                if (deleted == 1)
                    say(s, PARLEY_LOG_INFO, "%s: %s", "gave back a conversation lease taken "
                        "while Redis did not answer (its turn had ended)");
                done = deleted == 1 || ++l->zero_answers >= 2;
            }
        }
        if (done) {
            free(l);
            pthread_mutex_lock(&s->lease_lock);
            s->ndoubtful--;
            pthread_mutex_unlock(&s->lease_lock);
        } else {
            l->next = keep;
            keep = l;
        }
    }
    pthread_mutex_lock(&s->lease_lock);
    while (keep) { /* back on the list, with any that came meanwhile */
        held_lease *l = keep;
        keep = l->next;
        l->next = s->doubtful;
        s->doubtful = l;
    }
}

/* One pass of the renewer: extend every lease still held (lease_lock held on entry and exit). */
static void renew_all(redis_store *s)
{
    size_t n = 0;
    for (held_lease *l = s->leases; l; l = l->next)
        n++;
    char(*tokens)[UUID_STR_LEN] = malloc(n * sizeof *tokens + 1);
    char **cids = calloc(n + 1, sizeof *cids);
    size_t i = 0;
    for (held_lease *l = s->leases; l && tokens && cids; l = l->next, i++) {
        memcpy(tokens[i], l->token, UUID_STR_LEN);
        cids[i] = strdup(l->cid);
    }
    pthread_mutex_unlock(&s->lease_lock);
    for (size_t k = 0; k < n && tokens && cids; k++) {
        if (!cids[k])
            continue;
        script_args a;
        args_init(&a, s, 0);
        arg_str(&a, cids[k]);
        arg_str(&a, tokens[k]);
        arg_u64(&a, s->lease_ms);
        redisReply *r;
        if (run_on(s, &s->renew_conn, SCRIPT_LEASE_RENEW, &a, 1, &r, NULL) == PARLEY_OK) {
            if (reply_int(r) == 0 && holds_token(s, tokens[k]))
                say(s, PARLEY_LOG_WARN, "%s: a conversation lease expired before it was renewed%s",
                    "; that turn's commit will be refused");
            freeReplyObject(r);
        }
        free(cids[k]);
    }
    free(cids);
    free(tokens);
    pthread_mutex_lock(&s->lease_lock);
}

/* Renews held leases every third of their life, on its own connection, so a
 * turn's lease outlives any wait for the shared connection. */
static void *renewer_main(void *arg)
{
    redis_store *s = arg;
    uint64_t period = s->lease_ms / 3 ? s->lease_ms / 3 : 1;
    uint64_t due = 0; /* monotonic ms of the next pass; 0 while nothing is held */
    pthread_mutex_lock(&s->lease_lock);
    while (!s->stopping) {
        if (s->doubtful) {
            release_doubtful(s);
            if (s->stopping)
                break; /* close signalled while the lock was let go */
        }
        if (!s->leases && !s->doubtful) {
            due = 0;
            pthread_cond_wait(&s->lease_wake, &s->lease_lock);
            continue;
        }
        uint64_t now = clock_mono_ms();
        if (!due)
            due = now + period;
        if (s->leases && now >= due) {
            renew_all(s);
            due = clock_mono_ms() + period;
            continue;
        }
        /* Woken early by a new lease or by close: the pass stays due when it was. */
        uint64_t wake = s->leases ? due : now + REDIS_RECONNECT_MS;
        if (s->doubtful && wake > now + REDIS_RECONNECT_MS)
            wake = now + REDIS_RECONNECT_MS; /* the doubtful ones are tried again soon */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (wake - now) * 1000000u;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&s->lease_wake, &s->lease_lock, &until);
    }
    pthread_mutex_unlock(&s->lease_lock);
    return NULL;
}

/* ---- the context record (version 5) ---- */

static parley_status redis_context_get(store *base, const store_key *key, uint64_t now_ms,
                                       pbuf *out, store_lifetime *life, char **err)
{
    redis_store *s = (redis_store *)base;
    *life = (store_lifetime){0, 0, 0, 0};
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_CONTEXT_GET, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        size_t len;
        const char *record = is_array(r, 6) ? reply_str(r->element[1], &len) : NULL;
        if (!record) {
            st = bad_reply(s, r, err);
        } else {
            count_expired(s, reply_int(r->element[0]));
            *life = lifetime_of(r->element + 2);
            pbuf_append(out, record, len);
            freeReplyObject(r);
            if (out->oom)
                st = PARLEY_ERR_NO_MEMORY;
        }
    }
    free(cid);
    return st;
}

static parley_status redis_context_set(store *base, const store_key *key, const char *json,
                                       size_t len, const char *expected, size_t expected_len,
                                       uint64_t now_ms, char **err)
{
    redis_store *s = (redis_store *)base;
    char *cid = conversation_key(key);
    if (!cid)
        return PARLEY_ERR_NO_MEMORY;
    script_args a;
    args_init(&a, s, now_ms);
    arg_str(&a, cid);
    arg_bytes(&a, json, len);
    arg_str(&a, expected ? "1" : "0");
    arg_bytes(&a, expected ? expected : "", expected ? expected_len : 0);
    redisReply *r;
    parley_status st = run_script(s, SCRIPT_CONTEXT_SET, &a, 1, &r, err);
    if (st == PARLEY_OK) {
        long long written = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
        if (written < 0) {
            st = bad_reply(s, r, err);
        } else {
            freeReplyObject(r);
            if (written != 1) {
                if (err)
                    *err = NULL;
                st = written == 2 ? PARLEY_ERR_BUSY : PARLEY_ERR_NOT_FOUND;
            }
        }
    }
    free(cid);
    return st;
}

const store_backend store_redis_backend = {
    .version = STORE_BACKEND_VERSION,
    .scheme = "redis",
    .blocking = 1,
    .open = redis_open,
    .close = redis_close,
    .load = redis_load,
    .load_sized = redis_load_sized,
    .append = redis_append,
    .get_conversation = redis_get_conversation,
    .get_turn = redis_get_turn,
    .list = redis_list,
    .forget = redis_forget,
    .expire = redis_expire,
    .stats = redis_stats,
    .lease_acquire = redis_lease_acquire,
    .lease_release = redis_lease_release,
    .query = redis_query,
    .get_message = redis_get_message,
    .set_interface_message_id = redis_set_interface_message_id,
    .find_message = redis_find_message,
    .load_turn = redis_load_turn,
    .context_get = redis_context_get,
    .context_set = redis_context_set,
};
