/*
 * agent.c -- the ABI's functions: create/destroy an agent, accept turns,
 * cancel them, take tool results, and read history.  Everything here runs
 * on host threads; the work itself happens on the worker (worker.c, turn.c).
 */
#include "agent.h"
#include "provider/provider.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "agent_api.h"
#include "tool_handle.h"
#include "turn.h"
#include "utf8.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

/* curl_global_init is not thread-safe on older libcurls: do it exactly once. */
static void init_curl(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* Whole messages, never cut (a debug body may be megabytes), always valid UTF-8. */
void agent_log(parley_agent *a, parley_log_level level, const char *fmt, ...)
{
    if (!a->host.log)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = pstr_vprintf(fmt, ap);
    va_end(ap);
    if (!msg)
        return; /* out of memory: a log line is not worth failing for */
    size_t n = strlen(msg);
    if (utf8_valid(msg, n)) {
        a->host.log(a->host.host_data, level, msg);
    } else {
        pbuf repaired = PBUF_INIT;
        utf8_append_repaired(&repaired, msg, n);
        if (!repaired.oom)
            a->host.log(a->host.host_data, level, repaired.data);
        pbuf_free(&repaired);
    }
    free(msg);
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

/* Everything requests share: the URL, the headers (the provider's), the limits. */
static int setup_http(parley_agent *a)
{
    const parley_options *o = &a->opts;
    a->prov = provider_find(o->provider); /* options_parse accepted only known names */
    if (!a->prov)
        return -1;
    const char *base = o->base_url ? o->base_url : a->prov->default_base_url;
    if (!(a->url = pstr_printf("%s%s", base, a->prov->path)))
        return -1;
    if (!(a->display_url = http_display_url(a->url)))
        return -1;
    const char *lines[] = {"Content-Type: application/json",
                           o->stream ? a->prov->stream_accept : NULL};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i])
            continue;
        struct curl_slist *more = curl_slist_append(a->headers, lines[i]);
        if (!more) /* the list so far stays in a->headers, freed by agent_free */
            return -1;
        a->headers = more;
    }
    if (a->prov->headers(o, &a->headers) != 0)
        return -1;
    a->http = (http_config){
        .url = a->url,
        .display_url = a->display_url,
        .headers = a->headers,
        .connect_timeout_ms = (long)o->connect_timeout_ms,
        /* Streamed answers are timed by the turn: first byte, then idle gaps. */
        .request_timeout_ms = o->stream ? 0 : (long)o->request_timeout_ms,
        .verify_tls = o->verify_tls,
        .max_response_bytes = (size_t)o->max_response_bytes,
    };
    return 0;
}

static void agent_free(parley_agent *a)
{
    http_pool_cleanup(&a->pool);
    dict_free(a->lanes);
    free(a->reaped);
    timer_heap_free(&a->timers);
    curl_slist_free_all(a->headers);
    free(a->url);
    free(a->display_url);
    toolset_free(a->tools);
    history_free(a->hist);
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
    history_limits lim = {
        .max_turns = (size_t)a->opts.max_history_turns,
        .max_conversations = (size_t)a->opts.max_conversations,
        .idle_timeout_ms = (uint64_t)a->opts.history_idle_timeout_s * 1000u,
    };
    a->hist = history_new(&lim);
    a->box = inbox_new();
    if (!a->hist || !a->box || setup_http(a) != 0)
        goto fail;
    if (worker_start(a) != 0) {
        err = dup_error("could not start the worker thread");
        goto fail;
    }
    if (!a->opts.verify_tls)
        agent_log(a, PARLEY_LOG_WARN, "verify_tls is false: the LLM server's TLS certificate "
                  "is NOT checked, so anyone on the network path can read the API key and the "
                  "conversations; use it only for testing");
    agent_log(a, PARLEY_LOG_INFO, "agent ready: model %s at %s", a->opts.model, a->display_url);
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

parley_status agent_complete_tool_call(parley_tool_call *call, const char *result, int is_error)
{
    if (!call)
        return PARLEY_ERR_INVALID_INPUT;
    parley_tool_call *h = tool_handle_take(call);
    if (!h)
        return PARLEY_ERR_NOT_FOUND; /* already completed (or never given out) */
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

static parley_status dump_status(int rc)
{
    return rc == 0 ? PARLEY_OK : rc == -1 ? PARLEY_ERR_NOT_FOUND : PARLEY_ERR_NO_MEMORY;
}

parley_status agent_history_get(parley_agent *a, const char *id, char **out)
{
    if (!a || !id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    return dump_status(history_dump_conversation(a->hist, id, clock_wall_ms(), out));
}

parley_status agent_turn_get(parley_agent *a, const char *turn_id, char **out)
{
    if (!a || !turn_id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    return dump_status(history_dump_turn(a->hist, turn_id, clock_wall_ms(), out));
}

parley_status agent_conversations_list(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    return dump_status(history_dump_list(a->hist, clock_wall_ms(), out));
}

parley_status agent_history_clear(parley_agent *a, const char *id)
{
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    return history_clear(a->hist, id) == 0 ? PARLEY_OK : PARLEY_ERR_NOT_FOUND;
}

/* The token counters, added at the end of the metrics object in *out. */
static parley_status append_token_metrics(const agent_counters *m, char **out)
{
    pbuf b = PBUF_INIT;
    pbuf_append(&b, *out, strlen(*out) - 1); /* without the closing brace */
    pbuf_printf(&b,
                ",\"tokens_prompt\":%llu,\"tokens_completion\":%llu,\"tokens_cache_read\":%llu,"
                "\"tokens_cache_creation\":%llu,\"tokens_reasoning\":%llu,"
                "\"answers_cut_short\":%llu}",
                (unsigned long long)m->tokens_prompt, (unsigned long long)m->tokens_completion,
                (unsigned long long)m->tokens_cache_read,
                (unsigned long long)m->tokens_cache_creation,
                (unsigned long long)m->tokens_reasoning, (unsigned long long)m->answers_cut_short);
    free(*out);
    *out = b.oom ? NULL : pbuf_take(&b);
    pbuf_free(&b);
    return *out ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

parley_status agent_metrics(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    history_stats hs;
    history_get_stats(a->hist, &hs);
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
    return append_token_metrics(m, out);
}
