/*
 * store_wait.c -- the turn's two store waits (loading, committing) with a
 * store that blocks, as the agent runs them on its store thread.
 *
 * The store is a "gated" backend: the memory store behind blocking = 1,
 * whose load, append and expire can be held at a gate (the test opens it when it
 * chooses) or made to fail with PARLEY_ERR_STORAGE, so each race is
 * reproduced on purpose rather than hoped for.  Checked, each a host-visible
 * fact: a failed append ends the turn `storage` with history byte-identical
 * and the agent serving on; a cancel while loading ends the turn at once; a
 * cancel while committing reports the append's real outcome; a held append
 * (or a held idle-expiry sweep) stalls no other turn; destroy() with jobs in
 * flight gives exactly one done callback per turn and returns; create()
 * reports a store that cannot open.  Run under ASan and TSan by
 * test_stress.py.
 * Prints "N passed, N failed".
 *
 *   parley-store-wait BASE_URL
 */
#include <parley/plugin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/agent_api.h"
#include "store/store.h"

static int passed, failed;
#define CHECK(c) ((c) ? (void)passed++ : (void)(failed++, fprintf(stderr, "%s:%d: CHECK failed: %s\n", \
                                                                 __FILE__, __LINE__, #c)))

/* ---- the gated store ---------------------------------------------------- */

static struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold_load, hold_append, hold_expire; /* calls wait while set */
    int loads_waiting, appends_waiting, expires_waiting;
    int fail_append;              /* appends fail with PARLEY_ERR_STORAGE */
    int loads, appends;           /* calls that returned */
} G = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static void gate_set(int *field, int value)
{
    pthread_mutex_lock(&G.mu);
    *field = value;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
}

/* Wait (up to 10 s) until *field >= n. */
static int gate_wait_for(const int *field, int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&G.mu);
    int rc = 0;
    while (*field < n && rc == 0)
        rc = pthread_cond_timedwait(&G.cv, &G.mu, &until);
    int ok = *field >= n;
    pthread_mutex_unlock(&G.mu);
    return ok;
}

static void gate_pass(int *hold, int *waiting)
{
    pthread_mutex_lock(&G.mu);
    (*waiting)++;
    pthread_cond_broadcast(&G.cv);
    while (*hold)
        pthread_cond_wait(&G.cv, &G.mu);
    (*waiting)--;
    pthread_mutex_unlock(&G.mu);
}

/* A turn's history read begins with the conversation's context record (the
 * context engine's window start; a new conversation needs nothing more), so
 * that is where the load gate stands: one gate, and one count, per turn read. */
static parley_status gated_context_get(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                       store_lifetime *life, char **err)
{
    gate_pass(&G.hold_load, &G.loads_waiting);
    parley_status st = store_memory_backend.context_get(s, key, now_ms, out, life, err);
    pthread_mutex_lock(&G.mu);
    G.loads++;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    return st;
}

static parley_status gated_append(store *s, const store_key *key, const store_turn *turn,
                                  uint64_t now_ms, char **err)
{
    gate_pass(&G.hold_append, &G.appends_waiting);
    pthread_mutex_lock(&G.mu);
    int fail = G.fail_append;
    pthread_mutex_unlock(&G.mu);
    parley_status st = PARLEY_ERR_STORAGE;
    if (fail) {
        if (err)
            *err = strdup("gated store: disk full (injected)");
    } else {
        st = store_memory_backend.append(s, key, turn, now_ms, err);
    }
    pthread_mutex_lock(&G.mu);
    G.appends++;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    return st;
}

static parley_status gated_expire(store *s, uint64_t now_ms, size_t *expired, char **err)
{
    gate_pass(&G.hold_expire, &G.expires_waiting);
    return store_memory_backend.expire(s, now_ms, expired, err);
}

static store_backend gated;

/* A memory store whose table is ours: the agent calls through s->backend. */
static parley_status gated_open(const store_config *cfg, store **out, char **err)
{
    parley_status st = store_memory_backend.open(cfg, out, err);
    if (st == PARLEY_OK)
        (*out)->backend = &gated;
    return st;
}

/* Every other function is the memory store's. */
static void gated_init(void)
{
    gated = store_memory_backend;
    gated.scheme = "gated";
    gated.blocking = 1;
    gated.open = gated_open;
    gated.context_get = gated_context_get;
    gated.append = gated_append;
    gated.expire = gated_expire;
}

/* ---- the host ------------------------------------------------------------ */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

typedef struct outcome {
    int calls;               /* done callbacks: must end at exactly 1 */
    parley_status status;
    char message[256];
} outcome;

static void on_done(void *ud, const parley_result *r)
{
    outcome *o = ud;
    pthread_mutex_lock(&mu);
    o->calls++;
    o->status = r->status;
    snprintf(o->message, sizeof o->message, "%s", r->error_message ? r->error_message : "");
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Wait (up to 20 s) for o's callback. */
static int wait_done(outcome *o)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (o->calls == 0 && rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &until);
    int got = o->calls;
    pthread_mutex_unlock(&mu);
    return got;
}

static int calls_of(outcome *o)
{
    pthread_mutex_lock(&mu);
    int n = o->calls;
    pthread_mutex_unlock(&mu);
    return n;
}

static const char *base_url;

static parley_agent *new_agent_with(const char *more_options)
{
    char opts[512];
    snprintf(opts, sizeof opts, "{\"base_url\":\"%s\",\"model\":\"fake-model\",\"context_window\":32768%s}", base_url,
             more_options);
    char *err = NULL;
    parley_agent *a = agent_create_with_store(NULL, opts, &gated, &err);
    if (!a) {
        fprintf(stderr, "create: %s\n", err ? err : "?");
        exit(2);
    }
    return a;
}

static parley_agent *new_agent(void) { return new_agent_with(""); }

static parley_request_id submit(parley_agent *a, const char *conversation_id, const char *text,
                                outcome *o)
{
    parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = conversation_id};
    parley_request_id id = 0;
    CHECK(agent_async_process(a, &in, on_done, o, &id, NULL) == PARLEY_OK);
    return id;
}

static char *history_of(parley_agent *a, const char *conversation_id)
{
    char *out = NULL;
    return agent_history_get(a, conversation_id, &out) == PARLEY_OK ? out : strdup("(none)");
}

static void reset_gate(void)
{
    pthread_mutex_lock(&G.mu);
    G.hold_load = G.hold_append = G.hold_expire = G.fail_append = 0;
    G.loads = G.appends = 0;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
}

/* ---- the cases ----------------------------------------------------------- */

/* A failing append: `storage`, nothing stored, and the agent serves on. */
static void test_failed_append(void)
{
    reset_gate();
    parley_agent *a = new_agent();
    outcome first = {0}, failing = {0}, after = {0};
    submit(a, "c", "first", &first);
    CHECK(wait_done(&first) == 1 && first.status == PARLEY_OK);
    char *before = history_of(a, "c");

    gate_set(&G.fail_append, 1);
    submit(a, "c", "second", &failing);
    CHECK(wait_done(&failing) == 1);
    CHECK(failing.status == PARLEY_ERR_STORAGE);
    CHECK(strstr(failing.message, "disk full (injected)") != NULL); /* the store's own words */
    char *now = history_of(a, "c");
    CHECK(strcmp(now, before) == 0); /* byte-identical */
    free(now);

    gate_set(&G.fail_append, 0);
    submit(a, "c", "third", &after);
    CHECK(wait_done(&after) == 1 && after.status == PARLEY_OK);
    now = history_of(a, "c");
    CHECK(strstr(now, "third") != NULL && strstr(now, "second") == NULL);
    free(now);
    free(before);
    char *metrics = NULL;
    CHECK(agent_metrics(a, &metrics) == PARLEY_OK);
    CHECK(metrics && strstr(metrics, "\"turns_failed\":1,") && strstr(metrics, "\"stored_turns\":2,"));
    free(metrics);
    agent_destroy(a);
    CHECK(calls_of(&first) == 1 && calls_of(&failing) == 1 && calls_of(&after) == 1);
}

/* Cancel while the history is loading: cancelled at once, the late load goes nowhere. */
static void test_cancel_while_loading(void)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_load, 1);
    outcome o = {0};
    parley_request_id id = submit(a, "load", "never sent", &o);
    CHECK(gate_wait_for(&G.loads_waiting, 1));
    CHECK(agent_cancel(a, id) == PARLEY_OK);
    CHECK(wait_done(&o) == 1); /* while the load is still held */
    CHECK(o.status == PARLEY_ERR_CANCELLED);
    gate_set(&G.hold_load, 0);
    CHECK(gate_wait_for(&G.loads, 1));
    outcome next = {0}; /* the conversation is free for the next turn */
    submit(a, "load", "next", &next);
    CHECK(wait_done(&next) == 1 && next.status == PARLEY_OK);
    CHECK(agent_cancel(a, id) == PARLEY_ERR_NOT_FOUND);
    agent_destroy(a);
    CHECK(calls_of(&o) == 1 && calls_of(&next) == 1);
}

/* The turn's deadline passing while its history loads ends it `timeout`. */
static void test_deadline_while_loading(void)
{
    reset_gate();
    parley_agent *a = new_agent_with(",\"turn_timeout_ms\":200");
    gate_set(&G.hold_load, 1);
    outcome o = {0};
    submit(a, "slow-load", "never sent", &o);
    CHECK(gate_wait_for(&G.loads_waiting, 1));
    CHECK(wait_done(&o) == 1); /* while the load is still held */
    CHECK(o.status == PARLEY_ERR_TIMEOUT);
    CHECK(strstr(o.message, "turn_timeout_ms") != NULL);
    gate_set(&G.hold_load, 0);
    agent_destroy(a);
    CHECK(calls_of(&o) == 1);
}

/* Cancel while committing: the append's outcome is what the host hears. */
static void test_cancel_while_committing(int fail)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    gate_set(&G.fail_append, fail);
    outcome o = {0};
    parley_request_id id = submit(a, "commit", "store me", &o);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    CHECK(agent_cancel(a, id) == PARLEY_OK); /* still live: it has not called back */
    usleep(50000);
    CHECK(calls_of(&o) == 0); /* waits for the append */
    gate_set(&G.hold_append, 0);
    CHECK(wait_done(&o) == 1);
    char *h = history_of(a, "commit");
    if (fail) {
        CHECK(o.status == PARLEY_ERR_STORAGE);
        CHECK(strcmp(h, "(none)") == 0);
    } else {
        CHECK(o.status == PARLEY_OK); /* stored: never reported cancelled */
        CHECK(strstr(h, "store me") != NULL);
    }
    free(h);
    agent_destroy(a);
    CHECK(calls_of(&o) == 1);
}

/* A held append delays its own turn only: a stateless turn runs meanwhile. */
static void test_held_append_stalls_no_other_turn(void)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    outcome slow = {0}, other = {0};
    submit(a, "slow", "slow disk", &slow);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    submit(a, NULL, "meanwhile", &other);
    CHECK(wait_done(&other) == 1 && other.status == PARLEY_OK);
    CHECK(calls_of(&slow) == 0);
    gate_set(&G.hold_append, 0);
    CHECK(wait_done(&slow) == 1 && slow.status == PARLEY_OK);
    agent_destroy(a);
}

/* Loads have their own thread: a held append delays no other conversation's load. */
static void test_held_append_delays_no_load(void)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    outcome slow = {0}, other = {0};
    submit(a, "slow", "slow disk", &slow);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    submit(a, "other", "my history, please", &other);
    CHECK(gate_wait_for(&G.loads, 2)); /* slow's load, then other's, while the append is held */
    CHECK(calls_of(&slow) == 0 && calls_of(&other) == 0); /* other's append waits its turn */
    gate_set(&G.hold_append, 0);
    CHECK(wait_done(&slow) == 1 && slow.status == PARLEY_OK);
    CHECK(wait_done(&other) == 1 && other.status == PARLEY_OK);
    agent_destroy(a);
}

/* The idle-expiry sweep runs on a store thread too: held, it stalls no turn. */
static void test_held_sweep_stalls_no_turn(void)
{
    reset_gate();
    gate_set(&G.hold_expire, 1);
    parley_agent *a = new_agent_with(",\"history_idle_timeout_s\":1");
    CHECK(gate_wait_for(&G.expires_waiting, 1)); /* the first sweep, held */
    outcome other = {0};
    submit(a, NULL, "meanwhile", &other);
    CHECK(wait_done(&other) == 1 && other.status == PARLEY_OK);
    gate_set(&G.hold_expire, 0);
    agent_destroy(a);
}

typedef struct destroyer {
    parley_agent *a;
    int returned;
} destroyer;

static void *destroy_thread(void *arg)
{
    destroyer *d = arg;
    agent_destroy(d->a);
    pthread_mutex_lock(&mu);
    d->returned = 1;
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* destroy() with an append and a load held in the store threads: one callback each. */
static void test_destroy_with_jobs_in_flight(int fail)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    gate_set(&G.fail_append, fail);
    outcome committing = {0}, loading = {0}, queued = {0};
    submit(a, "b", "committing", &committing);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    gate_set(&G.hold_load, 1);
    submit(a, "a", "loading", &loading);
    CHECK(gate_wait_for(&G.loads_waiting, 1));
    submit(a, "b", "queued", &queued);    /* waits for its conversation */
    usleep(20000);
    destroyer d = {a, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, destroy_thread, &d) == 0);
    CHECK(wait_done(&loading) == 1 && loading.status == PARLEY_ERR_CANCELLED);
    CHECK(wait_done(&queued) == 1 && queued.status == PARLEY_ERR_CANCELLED);
    usleep(20000);
    pthread_mutex_lock(&mu);
    int returned_early = d.returned;
    pthread_mutex_unlock(&mu);
    CHECK(!returned_early); /* destroy waits for the append's outcome */
    gate_set(&G.hold_load, 0);  /* the load comes back to nobody */
    gate_set(&G.hold_append, 0);
    pthread_join(th, NULL);
    CHECK(calls_of(&committing) == 1);
    CHECK(committing.status == (fail ? PARLEY_ERR_STORAGE : PARLEY_OK));
    CHECK(calls_of(&loading) == 1 && calls_of(&queued) == 1);
}

/* ---- append_message: the same store path, through the write thread ------- */

static parley_request_id append(parley_agent *a, const char *conversation_id, const char *content,
                                outcome *o)
{
    char json[256];
    snprintf(json, sizeof json, "{\"conversation_id\":\"%s\",\"content\":\"%s\"}",
             conversation_id, content);
    parley_request_id id = 0;
    CHECK(agent_append_message(a, json, on_done, o, &id, NULL) == PARLEY_OK);
    return id;
}

/* An append the store refuses: `storage` in the store's words, history byte-identical. */
static void test_append_message_failed_store(void)
{
    reset_gate();
    parley_agent *a = new_agent();
    outcome first = {0}, failing = {0}, after = {0};
    submit(a, "n", "first", &first);
    CHECK(wait_done(&first) == 1 && first.status == PARLEY_OK);
    char *before = history_of(a, "n");
    gate_set(&G.fail_append, 1);
    append(a, "n", "washer done", &failing);
    CHECK(wait_done(&failing) == 1);
    CHECK(failing.status == PARLEY_ERR_STORAGE);
    CHECK(strstr(failing.message, "disk full (injected)") != NULL);
    char *now = history_of(a, "n");
    CHECK(strcmp(now, before) == 0);
    free(now);
    gate_set(&G.fail_append, 0);
    append(a, "n", "dryer done", &after);
    CHECK(wait_done(&after) == 1 && after.status == PARLEY_OK);
    now = history_of(a, "n");
    CHECK(strstr(now, "dryer done") != NULL && strstr(now, "washer done") == NULL);
    free(now);
    free(before);
    agent_destroy(a);
    CHECK(calls_of(&first) == 1 && calls_of(&failing) == 1 && calls_of(&after) == 1);
}

/* Behind a turn whose commit is held: the append waits (not stored, not called back),
 * then lands after it; a cancel once its own append runs reports the store's outcome. */
static void test_append_message_behind_a_held_commit(int fail)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    outcome turn = {0}, note = {0};
    submit(a, "q", "the turn", &turn);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    parley_request_id id = append(a, "q", "the note", &note);
    usleep(50000);
    pthread_mutex_lock(&G.mu);
    int appends_waiting = G.appends_waiting;
    pthread_mutex_unlock(&G.mu);
    CHECK(calls_of(&note) == 0 && appends_waiting == 1); /* queued behind the turn */
    gate_set(&G.fail_append, fail);
    gate_set(&G.hold_append, 0); /* the turn's append passes ... */
    CHECK(wait_done(&turn) == 1);
    CHECK(turn.status == (fail ? PARLEY_ERR_STORAGE : PARLEY_OK));
    CHECK(wait_done(&note) == 1);
    CHECK(note.status == (fail ? PARLEY_ERR_STORAGE : PARLEY_OK));
    CHECK(agent_cancel(a, id) == PARLEY_ERR_NOT_FOUND); /* called back: no longer live */
    char *h = history_of(a, "q");
    const char *t = strstr(h, "the turn"), *n = strstr(h, "the note");
    CHECK(fail ? (!t && !n) : (t && n && t < n)); /* the turn first, whole, then the note */
    free(h);
    agent_destroy(a);
    CHECK(calls_of(&turn) == 1 && calls_of(&note) == 1);
}

/* Cancel while its own append is held: the outcome of that append is reported. */
static void test_append_message_cancel_while_committing(int fail)
{
    reset_gate();
    parley_agent *a = new_agent();
    gate_set(&G.hold_append, 1);
    gate_set(&G.fail_append, fail);
    outcome o = {0};
    parley_request_id id = append(a, "ac", "kept", &o);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    CHECK(agent_cancel(a, id) == PARLEY_OK);
    usleep(50000);
    CHECK(calls_of(&o) == 0);
    gate_set(&G.hold_append, 0);
    CHECK(wait_done(&o) == 1);
    CHECK(o.status == (fail ? PARLEY_ERR_STORAGE : PARLEY_OK));
    char *h = history_of(a, "ac");
    CHECK(fail ? strcmp(h, "(none)") == 0 : strstr(h, "kept") != NULL);
    free(h);
    agent_destroy(a);
    CHECK(calls_of(&o) == 1);
}

/* Queued behind a commit that outlasts turn_timeout_ms: the append times out while it
 * waits, stores nothing, and the turn ahead still reports its own (stored) outcome. */
static void test_append_message_deadline_while_queued(void)
{
    reset_gate();
    parley_agent *a = new_agent_with(",\"turn_timeout_ms\":200");
    gate_set(&G.hold_append, 1);
    outcome turn = {0}, note = {0};
    submit(a, "dq", "the turn", &turn);
    CHECK(gate_wait_for(&G.appends_waiting, 1));
    append(a, "dq", "too late", &note);
    CHECK(wait_done(&note) == 1); /* while the turn's commit is still held */
    CHECK(note.status == PARLEY_ERR_TIMEOUT);
    CHECK(strstr(note.message, "turn_timeout_ms") != NULL);
    CHECK(calls_of(&turn) == 0);
    gate_set(&G.hold_append, 0);
    CHECK(wait_done(&turn) == 1 && turn.status == PARLEY_OK);
    char *h = history_of(a, "dq");
    CHECK(strstr(h, "the turn") != NULL && strstr(h, "too late") == NULL);
    free(h);
    agent_destroy(a);
    CHECK(calls_of(&turn) == 1 && calls_of(&note) == 1);
}

static parley_status refusing_open(const store_config *cfg, store **out, char **err)
{
    (void)cfg;
    *out = NULL;
    if (err)
        *err = strdup("gated store /nowhere/history.db: not a Parley store");
    return PARLEY_ERR_STORAGE;
}

/* create() fails with the store's own message, naming the option. */
static void test_open_failure(void)
{
    store_backend refusing = gated;
    refusing.open = refusing_open;
    char opts[512];
    snprintf(opts, sizeof opts, "{\"base_url\":\"%s\",\"model\":\"fake-model\",\"context_window\":32768}", base_url);
    char *err = NULL;
    parley_agent *a = agent_create_with_store(NULL, opts, &refusing, &err);
    CHECK(a == NULL);
    CHECK(err && strcmp(err, "option 'history_store': gated store /nowhere/history.db: "
                             "not a Parley store") == 0);
    free(err);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s BASE_URL\n", argv[0]);
        return 2;
    }
    base_url = argv[1];
    gated_init();
    test_open_failure();
    test_failed_append();
    test_cancel_while_loading();
    test_deadline_while_loading();
    test_cancel_while_committing(0);
    test_cancel_while_committing(1);
    test_held_append_stalls_no_other_turn();
    test_held_append_delays_no_load();
    test_held_sweep_stalls_no_turn();
    for (int round = 0; round < 5; round++) {
        test_destroy_with_jobs_in_flight(round % 2);
    }
    test_append_message_failed_store();
    test_append_message_behind_a_held_commit(0);
    test_append_message_behind_a_held_commit(1);
    test_append_message_cancel_while_committing(0);
    test_append_message_cancel_while_committing(1);
    test_append_message_deadline_while_queued();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
