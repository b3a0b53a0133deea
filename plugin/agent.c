/*
 * agent.c -- the ABI's functions: create/destroy an agent, accept turns,
 * cancel them, take tool results, and read history.  Everything here runs
 * on host threads; the work itself happens on the worker (worker.c, turn.c).
 */
#include "agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "agent_api.h"
#include "turn.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

/* curl_global_init is not thread-safe on older libcurls: do it exactly once. */
static void init_curl(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

void agent_log(parley_agent *a, parley_log_level level, const char *fmt, ...)
{
    if (!a->host.log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    a->host.log(a->host.host_data, level, msg);
}

static char *dup_error(const char *s) { return strdup(s ? s : "out of memory"); }

static const char *live_key(const void *e) { return ((const turn *)e)->id_key; }

static inbox *inbox_new(void)
{
    inbox *box = calloc(1, sizeof *box);
    if (!box)
        return NULL;
    box->live = dict_new(live_key);
    if (!box->live || pthread_mutex_init(&box->mu, NULL) != 0) {
        dict_free(box->live);
        free(box);
        return NULL;
    }
    box->refs = 1;
    box->alive = 1;
    return box;
}

/* Everything requests share: the URL, the headers, the limits. */
static int setup_http(parley_agent *a)
{
    const parley_options *o = &a->opts;
    if (asprintf(&a->url, "%s/chat/completions", o->base_url) < 0) {
        a->url = NULL;
        return -1;
    }
    char *auth = NULL;
    if (o->api_key && asprintf(&auth, "Authorization: Bearer %s", o->api_key) < 0)
        return -1;
    const char *lines[] = {"Content-Type: application/json",
                           o->stream ? "Accept: text/event-stream" : NULL, auth};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i])
            continue;
        struct curl_slist *more = curl_slist_append(a->headers, lines[i]);
        if (!more) { /* the list so far stays in a->headers, freed by agent_free */
            free(auth);
            return -1;
        }
        a->headers = more;
    }
    free(auth);
    a->http = (http_config){
        .url = a->url,
        .headers = a->headers,
        .connect_timeout_ms = (long)o->connect_timeout_ms,
        /* Streamed answers are timed by the turn: first byte, then idle gaps. */
        .request_timeout_ms = o->stream ? 0 : (long)o->request_timeout_ms,
        .verify_tls = o->verify_tls,
        .max_response_bytes = (size_t)o->max_response_bytes,
    };
    return 0;
}

static void store_log(void *ud, parley_log_level level, const char *message)
{
    agent_log(ud, level, "%s", message);
}

/* The history store the options name, with their limits.  0, or -1 with *err. */
static int open_store(parley_agent *a, char **err)
{
    const parley_options *o = &a->opts;
    const char *location = "";
    const store_backend *backend = store_backend_for(o->history_store, &location);
    if (!backend) { /* options_parse checked the scheme */
        *err = pstr_printf("option 'history_store': unknown store");
        return -1;
    }
    int64_t keep = o->history_keep_turns < 0 ? o->max_history_turns : o->history_keep_turns;
    store_config cfg = {
        .location = location,
        .limits = {.keep_turns = (size_t)keep,
                   .max_conversations = (size_t)o->max_conversations,
                   .idle_timeout_ms = (uint64_t)o->history_idle_timeout_s * 1000u},
        .sync_full = strcmp(o->history_sync, "full") == 0,
        .log = store_log,
        .log_ud = a,
        .key_prefix = o->history_key_prefix,
        .lease_ms = (uint64_t)o->history_lease_ms,
    };
    char *serr = NULL;
    if (backend->open(&cfg, &a->store, &serr) != PARLEY_OK) {
        a->store = NULL;
        *err = pstr_printf("option 'history_store': %s", serr ? serr : "could not open the store");
        free(serr);
        return -1;
    }
    return 0;
}

static void agent_free(parley_agent *a)
{
    if (a->multi)
        curl_multi_cleanup(a->multi);
    dict_free(a->lanes);
    free(a->reaped);
    timer_heap_free(&a->timers);
    curl_slist_free_all(a->headers);
    free(a->url);
    toolset_free(a->tools);
    if (a->store)
        a->store->backend->close(a->store);
    options_free(&a->opts);
    if (a->box)
        inbox_unref(a->box);
    free(a);
}


parley_agent *agent_create(const parley_host *host, const char *options_json, char **error)
{
    char *err = NULL;
    pthread_once(&curl_once, init_curl);
    if (curl_init_result != CURLE_OK) {
        if (error)
            *error = dup_error("libcurl failed to initialise");
        return NULL;
    }
    parley_agent *a = calloc(1, sizeof *a);
    if (!a) {
        if (error)
            *error = dup_error(NULL);
        return NULL;
    }
    if (host) {
        size_t n = host->struct_size < sizeof a->host ? host->struct_size : sizeof a->host;
        memcpy(&a->host, host, n);
    }
    atomic_init(&a->next_request_id, 1);
    if (options_parse(options_json, &a->opts, &err) != 0)
        goto fail;
    char *terr = NULL;
    a->tools = toolset_parse(a->opts.tools_json, NULL, &terr);
    if (!a->tools) {
        if (asprintf(&err, "option 'tools': %s", terr ? terr : "out of memory") < 0)
            err = NULL;
        free(terr);
        goto fail;
    }
    if (open_store(a, &err) != 0)
        goto fail;
    a->box = inbox_new();
    if (!a->box || setup_http(a) != 0)
        goto fail;
    if (worker_start(a) != 0) {
        err = dup_error("could not start the worker thread");
        goto fail;
    }
    agent_log(a, PARLEY_LOG_INFO, "agent ready: model %s at %s", a->opts.model, a->url);
    return a;
fail:
    if (error)
        *error = err ? err : dup_error(NULL);
    else
        free(err);
    agent_free(a);
    return NULL;
}

void agent_destroy(parley_agent *a)
{
    if (!a)
        return;
    worker_stop(a);
    agent_free(a);
}

parley_status agent_async_process(parley_agent *a, const parley_input *in, parley_done_fn done,
                                  void *user_data, parley_request_id *request_id, char **error)
{
    char *err = NULL;
    parley_status st;
    if (!a) {
        if (error)
            *error = dup_error("agent is NULL");
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (atomic_fetch_add(&a->metrics.in_flight, 1) >= a->opts.max_in_flight) {
        atomic_fetch_sub(&a->metrics.in_flight, 1);
        atomic_fetch_add(&a->metrics.rejected_busy, 1);
        if (error && asprintf(error, "busy: %lld turns already in flight (max_in_flight)",
                              (long long)a->opts.max_in_flight) < 0)
            *error = NULL;
        return PARLEY_ERR_BUSY;
    }
    turn *t = turn_new(a, in, done, user_data, &st, &err);
    if (!t) {
        atomic_fetch_sub(&a->metrics.in_flight, 1);
        atomic_fetch_add(&a->metrics.rejected_invalid, 1);
        goto fail;
    }
    /* Once queued, the turn belongs to the worker and may be gone at any moment. */
    parley_request_id id = t->id;
    inbox *box = a->box;
    pthread_mutex_lock(&box->mu);
    if (!box->alive || box->stop) {
        st = PARLEY_ERR_CANCELLED;
        err = dup_error("the agent is being destroyed");
    } else if (dict_add(box->live, t) != 0) {
        st = PARLEY_ERR_NO_MEMORY;
        err = dup_error(NULL);
    } else {
        t->inbox_next = NULL;
        if (box->submitted_tail)
            box->submitted_tail->inbox_next = t;
        else
            box->submitted_head = t;
        box->submitted_tail = t;
        curl_multi_wakeup(box->multi);
    }
    pthread_mutex_unlock(&box->mu);
    if (st != PARLEY_OK) {
        atomic_fetch_sub(&a->metrics.in_flight, 1);
        turn_free(t);
        goto fail;
    }
    atomic_fetch_add(&a->metrics.turns_accepted, 1);
    if (request_id)
        *request_id = id;
    return PARLEY_OK;
fail:
    if (error)
        *error = err ? err : dup_error(NULL);
    else
        free(err);
    return st;
}

parley_status agent_cancel(parley_agent *a, parley_request_id id)
{
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    inbox *box = a->box;
    char key[24];
    snprintf(key, sizeof key, "%llu", (unsigned long long)id);
    parley_status st = PARLEY_OK;
    pthread_mutex_lock(&box->mu);
    if (!dict_find(box->live, key)) {
        st = PARLEY_ERR_NOT_FOUND;
    } else {
        if (box->ncancels == box->cancels_cap) {
            size_t cap = box->cancels_cap ? box->cancels_cap * 2 : 8;
            uint64_t *c = realloc(box->cancels, cap * sizeof *c);
            if (c) {
                box->cancels = c;
                box->cancels_cap = cap;
            }
        }
        if (box->ncancels < box->cancels_cap) {
            box->cancels[box->ncancels++] = id;
            curl_multi_wakeup(box->multi);
        } else {
            st = PARLEY_ERR_NO_MEMORY;
        }
    }
    pthread_mutex_unlock(&box->mu);
    return st;
}

parley_status agent_complete_tool_call(parley_tool_call *h, const char *result, int is_error)
{
    if (!h)
        return PARLEY_ERR_INVALID_INPUT;
    char *copy = result ? strdup(result) : NULL;
    parley_status st = result && !copy ? PARLEY_ERR_NO_MEMORY : PARLEY_OK;
    inbox *box = h->box;
    int queued = 0;
    pthread_mutex_lock(&box->mu);
    if (box->alive && h->owner) {
        h->result = copy;
        h->is_error = is_error || st != PARLEY_OK;
        h->next = box->completed;
        box->completed = h;
        curl_multi_wakeup(box->multi);
        queued = 1;
    }
    pthread_mutex_unlock(&box->mu);
    if (!queued) { /* the turn no longer waits for it: just free the handle */
        free(copy);
        free(h);
        inbox_unref(box);
    }
    return st;
}

/* ---- history introspection ------------------------------------------------ */

static store_key key_for(const char *conversation_id)
{
    return (store_key){.conversation_id = conversation_id, .persona = "", .interface_type = ""};
}

/* Hand a store read to the host: its JSON in *out, or the status (the message is dropped:
 * the ABI's read functions return a status only). */
static parley_status read_result(parley_status st, pbuf *b, char *err, char **out)
{
    free(err);
    if (st == PARLEY_OK && !(*out = pbuf_take(b)))
        st = PARLEY_ERR_NO_MEMORY;
    pbuf_free(b);
    return st;
}

parley_status agent_history_get(parley_agent *a, const char *id, char **out)
{
    if (!a || !id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    store_key key = key_for(id);
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = a->store->backend->get_conversation(a->store, &key, clock_wall_ms(), &b, &err);
    return read_result(st, &b, err, out);
}

parley_status agent_turn_get(parley_agent *a, const char *turn_id, char **out)
{
    if (!a || !turn_id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = a->store->backend->get_turn(a->store, turn_id, clock_wall_ms(), &b, &err);
    return read_result(st, &b, err, out);
}

parley_status agent_conversations_list(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = a->store->backend->list(a->store, clock_wall_ms(), &b, &err);
    return read_result(st, &b, err, out);
}

parley_status agent_history_clear(parley_agent *a, const char *id)
{
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    store_key key = key_for(id);
    char *err = NULL;
    parley_status st = a->store->backend->forget(a->store, id ? &key : NULL, &err);
    if (err)
        agent_log(a, PARLEY_LOG_WARN, "history_clear: %s", err);
    free(err);
    return st;
}

parley_status agent_metrics(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    store_stats hs;
    memset(&hs, 0, sizeof hs);
    char *err = NULL;
    if (a->store->backend->stats(a->store, &hs, &err) != PARLEY_OK)
        agent_log(a, PARLEY_LOG_WARN, "metrics: %s", err ? err : "store stats unavailable");
    free(err);
    const agent_counters *m = &a->metrics;
    if (asprintf(out,
                 "{\"turns_accepted\":%llu,\"turns_ok\":%llu,\"turns_failed\":%llu,"
                 "\"turns_cancelled\":%llu,\"in_flight\":%lld,\"rejected_busy\":%llu,"
                 "\"rejected_invalid\":%llu,\"llm_requests\":%llu,\"llm_retries\":%llu,"
                 "\"tool_calls\":%llu,\"tool_errors\":%llu,\"tool_timeouts\":%llu,"
                 "\"conversations\":%zu,\"stored_turns\":%zu,\"stored_message_bytes\":%zu,"
                 "\"conversations_evicted\":%zu,\"conversations_expired\":%zu}",
                 (unsigned long long)m->turns_accepted, (unsigned long long)m->turns_ok,
                 (unsigned long long)m->turns_failed, (unsigned long long)m->turns_cancelled,
                 (long long)m->in_flight, (unsigned long long)m->rejected_busy,
                 (unsigned long long)m->rejected_invalid, (unsigned long long)m->llm_requests,
                 (unsigned long long)m->llm_retries, (unsigned long long)m->tool_calls,
                 (unsigned long long)m->tool_errors, (unsigned long long)m->tool_timeouts,
                 hs.conversations, hs.turns, hs.message_bytes, hs.evicted, hs.expired) < 0) {
        *out = NULL;
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}
