/*
 * stress.c -- thread stress of parley.so through its public ABI only
 * (dlopen + the function table), meant to run under ThreadSanitizer.
 *
 *   parley-stress PLUGIN.so BASE_URL [THREADS [TURNS_PER_THREAD]]
 *
 * BASE_URL points at a running parley-fake-llm (tests/integration/
 * test_stress.py starts one).  Phase 1: THREADS submitter threads each
 * submit TURNS_PER_THREAD turns, half on NSHARED shared conversation ids and
 * half on ids of their own; some turns are cancelled right after submission;
 * some done callbacks call back into the plugin (history_get, async_process);
 * a reader thread keeps calling history_get / conversations_list / metrics /
 * turn_get meanwhile.  Phase 2: turns that would take seconds are submitted
 * and the agent is destroyed at once.
 *
 * Checked: exactly one done callback per accepted turn (none for rejected
 * ones), all on one thread, with the right request id, conversation id and
 * an answer echoing the turn's text; cancelled turns never reach history;
 * every completed turn does; on each shared id the history lists the turns
 * in submission order, at every moment a reader looks; destroy() returns
 * promptly and leaves no turn without its (cancelled) callback.
 *
 * Prints "N passed, N failed" and exits non-zero on any failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parley/plugin.h"

#define NSHARED 4
#define MAX_FOLLOWUPS 4096
#define PHASE2_TURNS 40

/* ---- checks ------------------------------------------------------------- */

static atomic_long n_pass, n_fail;

static void check_(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void check_(int ok, const char *file, int line, const char *fmt, ...)
{
    if (ok) {
        atomic_fetch_add(&n_pass, 1);
        return;
    }
    long n = atomic_fetch_add(&n_fail, 1);
    if (n >= 40) /* the first failures tell the story */
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
#define CHECK(cond, ...) check_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- one submitted turn ----------------------------------------------------- */

enum kind { K_SHARED, K_SOLO, K_FOLLOW, K_PHASE2 };

struct rec {
    enum kind kind;
    int thread, k;
    int sid;   /* shared id index, or -1 */
    long seq;  /* submission order on that shared id */
    char conv[64];
    char text[128];
    int accepted;
    parley_request_id rid;
    int cancel_sent;           /* cancel() returned OK */
    atomic_int done_count;
    atomic_int status;
    atomic_ullong rid_done;
    atomic_int followed;       /* index of the follow-up rec + 1, or 0 */
};

static const parley_plugin *P;
static parley_agent *agent;

static int nthreads = 8, nturns = 200;
static struct rec *recs;        /* nthreads * nturns */
static struct rec *followups;   /* MAX_FOLLOWUPS, filled from callbacks */
static atomic_int nfollowups;
static struct rec phase2[PHASE2_TURNS];

static pthread_mutex_t shared_mu[NSHARED];
static long shared_next[NSHARED];
static char shared_conv[NSHARED][32];

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static long accepted_total, done_total; /* under done_mu */

static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static int cb_thread_known;
static pthread_t cb_thread;
static atomic_int destroying;

static atomic_int stop_reader;

/* ---- history dumps ------------------------------------------------------------ */

/* The seq of every shared-id user message in a history dump, in dump order.
 * User messages are rendered as {"role":"user","content":"stress sid=..."}; the
 * assistant's echo starts with "You said:", so it never matches. */
static size_t dump_seqs(const char *json, int sid, long *out, size_t max)
{
    static const char pat[] = "\"role\":\"user\",\"content\":\"stress sid=";
    size_t n = 0;
    for (const char *p = strstr(json, pat); p; p = strstr(p + 1, pat)) {
        int s;
        long q;
        if (sscanf(p + sizeof pat - 1, "%d seq=%ld", &s, &q) != 2) {
            CHECK(0, "unparsable user message in history: %.80s", p);
            continue;
        }
        CHECK(s == sid, "history of shared id %d holds a message of id %d", sid, s);
        if (n < max)
            out[n] = q;
        n++;
    }
    return n;
}

static size_t count_str(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static long json_int(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

static int history_has(const char *conv, const char *text)
{
    char *out = NULL;
    parley_status st = P->history_get(agent, conv, &out);
    int has = st == PARLEY_OK && out && strstr(out, text) != NULL;
    P->free_string(out);
    return has;
}

/* ---- callbacks ------------------------------------------------------------------- */

static void submit_followup(const struct rec *parent);

static void on_done(void *user_data, const parley_result *r)
{
    struct rec *rec = user_data;

    pthread_mutex_lock(&cb_mu);
    if (!cb_thread_known) {
        cb_thread = pthread_self();
        cb_thread_known = 1;
    } else {
        CHECK(pthread_equal(cb_thread, pthread_self()),
              "done callbacks arrive on more than one thread");
    }
    pthread_mutex_unlock(&cb_mu);

    int prev = atomic_fetch_add(&rec->done_count, 1);
    CHECK(prev == 0, "turn '%s': done called %d times", rec->text, prev + 1);
    atomic_store(&rec->status, (int)r->status);
    atomic_store(&rec->rid_done, (unsigned long long)r->request_id);

    CHECK(r->conversation_id && strcmp(r->conversation_id, rec->conv) == 0,
          "turn '%s': conversation_id %s, want %s", rec->text,
          r->conversation_id ? r->conversation_id : "(null)", rec->conv);
    CHECK(r->turn_id && strlen(r->turn_id) == 36, "turn '%s': bad turn_id", rec->text);
    CHECK(r->steps_json != NULL, "turn '%s': steps_json NULL", rec->text);
    if (r->status == PARLEY_OK) {
        CHECK(r->response && strstr(r->response, rec->text),
              "turn '%s': answer does not echo the text: %s", rec->text,
              r->response ? r->response : "(null)");
        CHECK(r->error_message == NULL, "turn '%s': OK with an error message", rec->text);
        /* Committed before done: visible from inside the callback. */
        if (rec->k % 5 == 0)
            CHECK(history_has(rec->conv, rec->text),
                  "turn '%s': done OK but not in history yet", rec->text);
        /* Re-entrancy: start another turn from inside the callback. */
        if (rec->kind == K_SOLO && rec->k % 10 == 1 && !atomic_load(&destroying))
            submit_followup(rec);
    } else {
        CHECK(r->response == NULL, "turn '%s': failed but has a response", rec->text);
        CHECK(r->error_message != NULL, "turn '%s': failed without a message", rec->text);
    }

    pthread_mutex_lock(&done_mu);
    done_total++;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&done_mu);
}

static int submit(struct rec *rec)
{
    parley_input in = {
        .struct_size = sizeof in,
        .text = rec->text,
        .conversation_id = rec->conv,
        .language = "en",
    };
    char *err = NULL;
    parley_request_id rid = 0;
    /* Count it accepted before the call: done may run before we return. */
    pthread_mutex_lock(&done_mu);
    accepted_total++;
    pthread_mutex_unlock(&done_mu);
    parley_status st = P->async_process(agent, &in, on_done, rec, &rid, &err);
    if (st != PARLEY_OK) {
        pthread_mutex_lock(&done_mu);
        accepted_total--;
        pthread_cond_broadcast(&done_cv);
        pthread_mutex_unlock(&done_mu);
        CHECK(0, "turn '%s' rejected: %s: %s", rec->text, P->status_name(st),
              err ? err : "(no message)");
        P->free_string(err);
        return -1;
    }
    P->free_string(err);
    CHECK(rid != 0, "turn '%s': request id 0", rec->text);
    rec->rid = rid;
    rec->accepted = 1;
    return 0;
}

static void submit_followup(const struct rec *parent)
{
    int i = atomic_fetch_add(&nfollowups, 1);
    if (i >= MAX_FOLLOWUPS)
        return;
    struct rec *f = &followups[i];
    f->kind = K_FOLLOW;
    f->thread = parent->thread;
    f->k = parent->k + 1; /* K_FOLLOW: never followed up itself */
    f->sid = -1;
    snprintf(f->conv, sizeof f->conv, "%s", parent->conv);
    snprintf(f->text, sizeof f->text, "follow thr=%d k=%d", parent->thread, parent->k);
    /* The rec is ours until submit() returns; the parent learns its index after. */
    if (submit(f) == 0)
        atomic_store(&((struct rec *)parent)->followed, i + 1);
}

/* ---- threads ---------------------------------------------------------------------- */

static void *submitter(void *arg)
{
    int th = (int)(intptr_t)arg;
    unsigned seed = 12345u + (unsigned)th;
    for (int k = 0; k < nturns; k++) {
        struct rec *rec = &recs[th * nturns + k];
        rec->thread = th;
        rec->k = k;
        if (k % 2 == 0) {
            int sid = (th + k / 2) % NSHARED;
            rec->kind = K_SHARED;
            rec->sid = sid;
            snprintf(rec->conv, sizeof rec->conv, "%s", shared_conv[sid]);
            /* Submission order on a shared id is defined by this lock. */
            pthread_mutex_lock(&shared_mu[sid]);
            rec->seq = shared_next[sid]++;
            snprintf(rec->text, sizeof rec->text, "stress sid=%d seq=%06ld thr=%d k=%d", sid,
                     rec->seq, th, k);
            submit(rec);
            pthread_mutex_unlock(&shared_mu[sid]);
        } else {
            rec->kind = K_SOLO;
            rec->sid = -1;
            snprintf(rec->conv, sizeof rec->conv, "solo-%d-%d", th, k);
            snprintf(rec->text, sizeof rec->text, "solo thr=%d k=%d", th, k);
            submit(rec);
        }
        if (rec->accepted && (k % 10 == 3 || k % 10 == 6)) { /* solo and shared turns */
            parley_status st = P->cancel(agent, rec->rid);
            CHECK(st == PARLEY_OK || st == PARLEY_ERR_NOT_FOUND, "cancel: %s",
                  P->status_name(st));
            rec->cancel_sent = st == PARLEY_OK;
        }
        if (rand_r(&seed) % 8 == 0)
            sched_yield();
    }
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    size_t last_len[NSHARED] = {0};
    long *seqs = malloc(sizeof *seqs * (size_t)(nthreads * nturns + 16));
    unsigned long loops = 0;
    while (!atomic_load(&stop_reader)) {
        for (int sid = 0; sid < NSHARED; sid++) {
            char *out = NULL;
            parley_status st = P->history_get(agent, shared_conv[sid], &out);
            CHECK(st == PARLEY_OK || st == PARLEY_ERR_NOT_FOUND, "history_get: %s",
                  P->status_name(st));
            if (st == PARLEY_OK) {
                CHECK(out && out[0] == '{', "history_get returned no JSON object");
                size_t n = dump_seqs(out, sid, seqs, (size_t)(nthreads * nturns + 16));
                for (size_t i = 1; i < n; i++)
                    CHECK(seqs[i - 1] < seqs[i],
                          "reader: shared id %d out of order: seq %ld before %ld", sid,
                          seqs[i - 1], seqs[i]);
                CHECK(n >= last_len[sid], "reader: shared id %d history shrank %zu -> %zu", sid,
                      last_len[sid], n);
                last_len[sid] = n;
                /* turn_get on a turn found in the dump. */
                const char *tid = strstr(out, "\"turn_id\":\"");
                if (tid && loops % 16 == 0) {
                    char id[40] = {0};
                    memcpy(id, tid + 11, 36);
                    char *t = NULL;
                    st = P->turn_get(agent, id, &t);
                    CHECK(st == PARLEY_OK && t && strstr(t, id),
                          "turn_get(%s) of a committed turn: %s", id, P->status_name(st));
                    P->free_string(t);
                }
            }
            P->free_string(out);
        }
        char *out = NULL;
        parley_status st = P->conversations_list(agent, &out);
        CHECK(st == PARLEY_OK && out && strstr(out, "\"conversations\""),
              "conversations_list: %s", P->status_name(st));
        P->free_string(out);
        out = NULL;
        st = P->metrics(agent, &out);
        CHECK(st == PARLEY_OK && out && json_int(out, "turns_ok") >= 0, "metrics: %s",
              P->status_name(st));
        P->free_string(out);
        loops++;
        sleep_ms(1);
    }
    CHECK(loops > 0, "the reader never ran");
    free(seqs);
    return NULL;
}

/* ---- final checks ------------------------------------------------------------------ */

static void check_rec_done(const struct rec *r)
{
    int dc = atomic_load(&r->done_count);
    if (!r->accepted) {
        CHECK(dc == 0, "rejected turn '%s' got %d done callbacks", r->text, dc);
        return;
    }
    CHECK(dc == 1, "turn '%s': %d done callbacks", r->text, dc);
    CHECK(atomic_load(&r->rid_done) == r->rid, "turn '%s': done request_id %llu, want %llu",
          r->text, (unsigned long long)atomic_load(&r->rid_done), (unsigned long long)r->rid);
    int st = atomic_load(&r->status);
    if (r->kind == K_PHASE2)
        return;
    CHECK(st == PARLEY_OK || (st == PARLEY_ERR_CANCELLED && r->cancel_sent),
          "turn '%s': status %s (cancel sent: %d)", r->text,
          P->status_name((parley_status)st), r->cancel_sent);
}

static void check_history(void)
{
    long *seqs = malloc(sizeof *seqs * (size_t)(nthreads * nturns + 16));
    long total = nthreads * nturns;
    for (int sid = 0; sid < NSHARED; sid++) {
        char *out = NULL;
        parley_status st = P->history_get(agent, shared_conv[sid], &out);
        CHECK(st == PARLEY_OK, "history_get(%s): %s", shared_conv[sid], P->status_name(st));
        if (st != PARLEY_OK) {
            P->free_string(out);
            continue;
        }
        size_t n = dump_seqs(out, sid, seqs, (size_t)total + 16);
        for (size_t i = 1; i < n; i++)
            CHECK(seqs[i - 1] < seqs[i], "shared id %d out of submission order: %ld before %ld",
                  sid, seqs[i - 1], seqs[i]);
        /* Exactly the completed turns of that id, each once. */
        size_t want = 0;
        for (long i = 0; i < total; i++) {
            const struct rec *r = &recs[i];
            if (r->kind != K_SHARED || r->sid != sid || !r->accepted)
                continue;
            char needle[160];
            snprintf(needle, sizeof needle, "\"content\":\"%s\"", r->text);
            size_t c = count_str(out, needle);
            if (atomic_load(&r->status) == PARLEY_OK) {
                want++;
                CHECK(c == 1, "completed turn '%s' appears %zu times in history", r->text, c);
            } else {
                CHECK(c == 0, "cancelled turn '%s' is in the history", r->text);
            }
        }
        CHECK(n == want, "shared id %d: history has %zu turns, %zu completed", sid, n, want);
        P->free_string(out);
    }
    free(seqs);

    long solo_ok = 0;
    for (long i = 0; i < total; i++) {
        const struct rec *r = &recs[i];
        if (r->kind != K_SOLO || !r->accepted)
            continue;
        int ok = atomic_load(&r->status) == PARLEY_OK;
        solo_ok += ok;
        char *out = NULL;
        parley_status st = P->history_get(agent, r->conv, &out);
        if (!ok) {
            CHECK(st == PARLEY_ERR_NOT_FOUND || (out && !strstr(out, r->text)),
                  "cancelled turn '%s' reached history", r->text);
        } else {
            CHECK(st == PARLEY_OK && out && strstr(out, r->text),
                  "completed turn '%s' missing from history", r->text);
            int f = atomic_load(&r->followed);
            if (st == PARLEY_OK && f) {
                const struct rec *fr = &followups[f - 1];
                const char *a = strstr(out, r->text), *b = strstr(out, fr->text);
                if (atomic_load(&fr->status) == PARLEY_OK)
                    CHECK(a && b && a < b, "follow-up of '%s' not after it in history", r->text);
            }
        }
        P->free_string(out);
    }

    char *out = NULL;
    parley_status st = P->conversations_list(agent, &out);
    CHECK(st == PARLEY_OK, "conversations_list: %s", P->status_name(st));
    if (out) {
        long n = (long)count_str(out, "\"conversation_id\"");
        CHECK(n == NSHARED + solo_ok, "conversations_list has %ld conversations, want %ld", n,
              NSHARED + solo_ok);
    }
    P->free_string(out);
}

static void check_metrics(long accepted)
{
    char *out = NULL;
    parley_status st = P->metrics(agent, &out);
    CHECK(st == PARLEY_OK && out, "metrics: %s", P->status_name(st));
    if (!out)
        return;
    long ok = json_int(out, "turns_ok"), cancelled = json_int(out, "turns_cancelled"),
         failed = json_int(out, "turns_failed"), in_flight = json_int(out, "in_flight");
    CHECK(ok + cancelled + failed == accepted,
          "metrics: ok %ld + cancelled %ld + failed %ld != accepted %ld", ok, cancelled, failed,
          accepted);
    CHECK(failed == 0, "metrics: %ld turns failed", failed);
    CHECK(in_flight == 0, "metrics: in_flight %ld after every turn is done", in_flight);
    P->free_string(out);
}

/* ---- main ------------------------------------------------------------------------------- */

static void on_log(void *host_data, parley_log_level level, const char *message)
{
    (void)host_data;
    if (level <= PARLEY_LOG_WARN)
        fprintf(stderr, "parley[%d]: %s\n", (int)level, message);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PLUGIN.so BASE_URL [THREADS [TURNS_PER_THREAD]]\n", argv[0]);
        return 2;
    }
    if (argc > 3)
        nthreads = atoi(argv[3]);
    if (argc > 4)
        nturns = atoi(argv[4]);
    if (nthreads < 1 || nthreads > 256 || nturns < 2 || nturns > 100000) {
        fprintf(stderr, "bad THREADS / TURNS_PER_THREAD\n");
        return 2;
    }
    double slow = getenv("PARLEY_TEST_SLOWDOWN") ? atof(getenv("PARLEY_TEST_SLOWDOWN")) : 1;
    if (slow < 1)
        slow = 1;

    void *dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    void *sym = dlsym(dl, PARLEY_ENTRY_SYMBOL);
    parley_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    if (!sym || !(P = entry(PARLEY_ABI_VERSION))) {
        fprintf(stderr, "no usable %s in %s\n", PARLEY_ENTRY_SYMBOL, argv[1]);
        return 2;
    }

    char opts[1024];
    snprintf(opts, sizeof opts,
             "{\"base_url\":\"%s\",\"model\":\"fake-model\",\"prompt\":\"Stress.\","
             "\"max_history_turns\":0,\"summarize\":false,\"context_window\":1000000,"
             "\"max_retries\":2,\"retry_backoff_ms\":20,"
             "\"request_timeout_ms\":60000,\"turn_timeout_ms\":300000}",
             argv[2]);
    parley_host host = {.struct_size = sizeof host, .log = on_log};
    char *err = NULL;
    agent = P->create(&host, opts, &err);
    if (!agent) {
        fprintf(stderr, "create failed: %s\n", err ? err : "?");
        return 2;
    }
    P->free_string(err);

    for (int i = 0; i < NSHARED; i++) {
        pthread_mutex_init(&shared_mu[i], NULL);
        snprintf(shared_conv[i], sizeof shared_conv[i], "shared-%d", i);
    }
    recs = calloc((size_t)nthreads * (size_t)nturns, sizeof *recs);
    followups = calloc(MAX_FOLLOWUPS, sizeof *followups);
    if (!recs || !followups)
        return 2;

    /* ---- phase 1 ---- */
    uint64_t t0 = now_ms();
    pthread_t rd, *ths = calloc((size_t)nthreads, sizeof *ths);
    pthread_create(&rd, NULL, reader, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&ths[i], NULL, submitter, (void *)(intptr_t)i);
    for (int i = 0; i < nthreads; i++)
        pthread_join(ths[i], NULL);

    uint64_t deadline = now_ms() + (uint64_t)(180000 * slow);
    pthread_mutex_lock(&done_mu);
    while (done_total < accepted_total && now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&done_cv, &done_mu, &ts);
    }
    long accepted = accepted_total, done = done_total;
    pthread_mutex_unlock(&done_mu);
    atomic_store(&stop_reader, 1);
    pthread_join(rd, NULL);
    CHECK(done == accepted, "phase 1: %ld of %ld turns done before the deadline", done, accepted);
    fprintf(stderr, "phase 1: %ld turns (%d follow-ups) in %llu ms\n", accepted,
            atomic_load(&nfollowups), (unsigned long long)(now_ms() - t0));

    long total = (long)nthreads * nturns;
    for (long i = 0; i < total; i++)
        check_rec_done(&recs[i]);
    for (int i = 0; i < atomic_load(&nfollowups) && i < MAX_FOLLOWUPS; i++)
        check_rec_done(&followups[i]);
    if (done == accepted) {
        check_history();
        check_metrics(accepted);
    }

    /* ---- phase 2: destroy with turns in flight ---- */
    atomic_store(&destroying, 1);
    for (int i = 0; i < PHASE2_TURNS; i++) {
        struct rec *r = &phase2[i];
        r->kind = K_PHASE2;
        r->k = i;
        r->sid = i % 2 ? -1 : i % NSHARED;
        if (r->sid >= 0)
            snprintf(r->conv, sizeof r->conv, "%s", shared_conv[r->sid]);
        else
            snprintf(r->conv, sizeof r->conv, "late-%d", i);
        snprintf(r->text, sizeof r->text, "late %d [[latency:5000]]", i);
        submit(r);
    }
    sleep_ms(50); /* let some of them reach the server */
    uint64_t d0 = now_ms();
    P->destroy(agent);
    uint64_t took = now_ms() - d0;
    CHECK(took < (uint64_t)(3000 * slow), "destroy took %llu ms with turns in flight",
          (unsigned long long)took);
    int counts[PHASE2_TURNS];
    for (int i = 0; i < PHASE2_TURNS; i++) {
        const struct rec *r = &phase2[i];
        check_rec_done(r);
        counts[i] = atomic_load(&r->done_count);
        if (r->accepted)
            CHECK(atomic_load(&r->status) == PARLEY_ERR_CANCELLED,
                  "in-flight turn '%s' at destroy: %s", r->text,
                  P->status_name((parley_status)atomic_load(&r->status)));
    }
    sleep_ms(200); /* nothing may arrive after destroy() returned */
    for (int i = 0; i < PHASE2_TURNS; i++)
        CHECK(atomic_load(&phase2[i].done_count) == counts[i], "late callback after destroy");
    pthread_mutex_lock(&done_mu);
    CHECK(done_total == accepted_total, "after destroy: %ld done of %ld accepted", done_total,
          accepted_total);
    pthread_mutex_unlock(&done_mu);

    dlclose(dl);
    free(ths);
    free(recs);
    free(followups);
    long p = atomic_load(&n_pass), f = atomic_load(&n_fail);
    printf("%ld passed, %ld failed\n", p, f);
    return f == 0 ? 0 : 1;
}
