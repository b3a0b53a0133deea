/*
 * agent.c -- the ABI's functions: create/destroy an agent, accept turns,
 * cancel them, take tool results, and read history.  Everything here runs
 * on host threads; the work itself happens on the worker (worker.c, turn.c).
 */
#include "api/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/agent_api.h"
#include "api/last_error.h"
#include "lib/buf.h"
#include "lib/clock.h"
#include "lib/host_log.h"
#include "lib/json_keys.h"
#include "api/query.h"
#include "config/selector.h"
#include "context/window.h"
#include "engine/tool_handle.h"
#include "lib/json_oom.h"
#include "turn/turn.h"
#include "turn/turn_append.h"
#include "turn/turn_input.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

/* curl_global_init is not thread-safe on older libcurls: do it exactly once. */
static void init_curl(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_error(const char *s) { return strdup(s ? s : "out of memory"); }

/* The current config snapshot, with a reference for the caller. */
static agent_config *current_config(parley_agent *a)
{
    pthread_mutex_lock(&a->cfg_mu);
    agent_config *c = config_ref(a->cfg);
    pthread_mutex_unlock(&a->cfg_mu);
    return c;
}

static void store_log(void *ud, parley_log_level level, const char *message)
{
    const parley_agent *a = ud;
    host_log(&a->host, level, "%s", message);
}

/* The history store the options name (or `backend` in its place), with their
 * limits.  0, or -1 with *err. */
static int open_store(parley_agent *a, const store_backend *backend, char **err)
{
    const parley_options *o = &a->cfg->opts;
    const char *location = "";
    const store_backend *named = store_backend_for(o->history_store, &location);
    if (!backend)
        backend = named;
    if (!backend) { /* options_parse checked the scheme */
        *err = pstr_printf("option 'history_store': unknown store");
        return -1;
    }
    /* Kept well beyond what is sent, so reply_to and queries reach older turns. */
    int64_t keep = o->history_keep_turns;
    if (keep < 0)
        keep = o->max_history_turns == 0 ? 0
               : o->max_history_turns * 4 > 200 ? o->max_history_turns * 4 : 200;
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
    if (store_open(backend, &cfg, &a->store, &serr) != PARLEY_OK) {
        a->store = NULL;
        *err = pstr_printf("option 'history_store': %s", serr ? serr : "could not open the store");
        free(serr);
        return -1;
    }
    return 0;
}

static void agent_free(parley_agent *a)
{
    if (a->store)
        store_close(a->store);
    config_unref(a->cfg);
    persona_metrics_destroy(&a->persona_metrics);
    pthread_mutex_destroy(&a->cfg_mu);
    free(a);
}

static parley_agent *create_agent(const parley_host *host, const char *options_json,
                                  const store_backend *backend, char **error);

parley_agent *agent_create(const parley_host *host, const char *options_json, char **error)
{
    return create_agent(host, options_json, NULL, error);
}

#ifdef PARLEY_TEST_HOOKS
parley_agent *agent_create_with_store(const parley_host *host, const char *options_json,
                                      const store_backend *backend, char **error)
{
    return create_agent(host, options_json, backend, error);
}
#endif

/* backend NULL: the one history_store names (always, outside the tests). */
static parley_agent *create_agent(const parley_host *host, const char *options_json,
                                  const store_backend *backend, char **error)
{
    char *err = NULL;
    pthread_once(&curl_once, init_curl);
    if (curl_init_result != CURLE_OK) {
        if (error)
            *error = dup_error("libcurl failed to initialise");
        return NULL;
    }
    parley_agent *a = calloc(1, sizeof *a);
    if (!a || pthread_mutex_init(&a->cfg_mu, NULL) != 0) {
        free(a);
        if (error)
            *error = dup_error(NULL);
        return NULL;
    }
    if (host) {
        size_t n = host->struct_size < sizeof a->host ? host->struct_size : sizeof a->host;
        memcpy(&a->host, host, n);
    }
    atomic_init(&a->next_request_id, 1);
    persona_metrics_init(&a->persona_metrics);
    parley_status st; /* create() answers with the agent or the error text alone */
    if (!(a->cfg = config_new(options_json, &st, &err)) || open_store(a, backend, &err) != 0)
        goto fail;
    worker_setup ws = {
        .store = a->store,
        .host = &a->host,
        .metrics = &a->metrics,
        .persona_metrics = &a->persona_metrics,
        .idle_timeout_ms = (uint64_t)a->cfg->opts.history_idle_timeout_s * 1000u,
        .max_connections = (size_t)a->cfg->opts.max_connections,
    };
    if (!(a->worker = worker_start(&ws, &err)))
        goto fail;
    a->box = worker_inbox(a->worker);
    if (!a->cfg->opts.verify_tls)
        host_log(&a->host, PARLEY_LOG_WARN, "verify_tls is false: the LLM server's TLS "
                 "certificate is NOT checked, so anyone on the network path can read the API key "
                 "and the conversations; use it only for testing");
    host_log(&a->host, PARLEY_LOG_INFO, "agent ready: model %s at %s", a->cfg->opts.model,
             a->cfg->display_url);
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
    worker_stop(a->worker); /* every turn called back; the store threads are gone */
    agent_free(a);
}

/* Take one of max_in_flight's slots for a new turn, or refuse: PARLEY_ERR_BUSY
 * with *error (if not NULL) explaining. */
static parley_status take_slot(parley_agent *a, const agent_config *cfg, char **error)
{
    int64_t max_in_flight = cfg->opts.max_in_flight;
    if (atomic_fetch_add(&a->metrics.in_flight, 1) < max_in_flight)
        return PARLEY_OK;
    atomic_fetch_sub(&a->metrics.in_flight, 1);
    atomic_fetch_add(&a->metrics.rejected_busy, 1);
    if (error)
        *error = pstr_printf("busy: %lld turns already in flight (max_in_flight)",
                             (long long)max_in_flight);
    return PARLEY_ERR_BUSY;
}

/*
 * Hand an accepted turn (`t`, NULL when accepting it failed with *st and err)
 * to the worker, which from then on owns it; on any failure give the slot
 * back and explain in *error.  Shared by async_process and append_message, so
 * both kinds of turn enter the same lanes in submission order.
 */
static parley_status submit_turn(parley_agent *a, turn *t, parley_status st, char *err,
                                 parley_request_id *request_id, char **error)
{
    if (!t) {
        atomic_fetch_sub(&a->metrics.in_flight, 1);
        atomic_fetch_add(&a->metrics.rejected_invalid, 1);
        goto fail;
    }
    parley_request_id id = t->id;
    /* Once submitted, the turn belongs to the worker and may be gone at any moment. */
    t->submitted.id = id;
    t->submitted.owner = t;
    st = inbox_submit(a->box, &t->submitted);
    if (st != PARLEY_OK) {
        err = dup_error(st == PARLEY_ERR_CANCELLED ? "the agent is being destroyed" : NULL);
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

/* async_process (`in`) and append_message (`message_json`, when `append`): accept
 * the input as a turn and hand it to the worker. */
static parley_status start_turn(parley_agent *a, int append, const parley_input *in,
                                const char *message_json, parley_done_fn done, void *user_data,
                                parley_request_id *request_id, char **error)
{
    char *err = NULL;
    parley_status st;
    if (!a) {
        if (error)
            *error = dup_error("agent is NULL");
        return PARLEY_ERR_INVALID_INPUT;
    }
    agent_config *cfg = current_config(a); /* the turn keeps its own reference */
    if ((st = take_slot(a, cfg, error)) != PARLEY_OK) {
        config_unref(cfg);
        return st;
    }
    parley_request_id id = atomic_fetch_add(&a->next_request_id, 1);
    turn *t = append ? turn_append_accept(cfg, id, message_json, done, user_data, &st, &err)
                     : turn_input_accept(cfg, id, in, done, user_data, &st, &err);
    config_unref(cfg);
    return submit_turn(a, t, st, err, request_id, error);
}

parley_status agent_async_process(parley_agent *a, const parley_input *in, parley_done_fn done,
                                  void *user_data, parley_request_id *request_id, char **error)
{
    return start_turn(a, 0, in, NULL, done, user_data, request_id, error);
}

parley_status agent_append_message(parley_agent *a, const char *message_json, parley_done_fn done,
                                   void *user_data, parley_request_id *request_id, char **error)
{
    return start_turn(a, 1, NULL, message_json, done, user_data, request_id, error);
}

/*
 * Options a live agent cannot change: the store (opened once, with its
 * retention and limits) and the HTTP connection pool.  The first one whose
 * value differs, or NULL.
 */
static const char *fixed_option_changed(const parley_options *now, const parley_options *next)
{
    if (strcmp(now->history_store, next->history_store) != 0)
        return "history_store";
    if (strcmp(now->history_sync, next->history_sync) != 0)
        return "history_sync";
    if (now->history_keep_turns != next->history_keep_turns)
        return "history_keep_turns";
    if (now->max_conversations != next->max_conversations)
        return "max_conversations";
    if (now->history_idle_timeout_s != next->history_idle_timeout_s)
        return "history_idle_timeout_s";
    if (strcmp(now->history_key_prefix, next->history_key_prefix) != 0)
        return "history_key_prefix";
    if (now->history_lease_ms != next->history_lease_ms)
        return "history_lease_ms";
    if (now->max_connections != next->max_connections)
        return "max_connections";
    return NULL;
}

parley_status agent_update_options(parley_agent *a, const char *options_json, char **error)
{
    char *err = NULL;
    if (error)
        *error = NULL;
    if (!a) {
        if (error)
            *error = dup_error("agent is NULL");
        return PARLEY_ERR_INVALID_INPUT;
    }
    parley_status st;
    agent_config *next = config_new(options_json, &st, &err);
    if (!next) {
        if (error)
            *error = err ? err : dup_error(NULL);
        else
            free(err);
        return st; /* INVALID_OPTIONS, or NO_MEMORY */
    }
    pthread_mutex_lock(&a->cfg_mu);
    agent_config *old = a->cfg;
    const char *fixed = fixed_option_changed(&old->opts, &next->opts);
    if (!fixed)
        a->cfg = next; /* turns accepted from now on take this one */
    pthread_mutex_unlock(&a->cfg_mu);
    if (fixed) {
        config_unref(next);
        if (error)
            *error = pstr_printf("option '%s': cannot change on a live agent (it belongs to the "
                                 "history store or the connection pool, opened once at create); "
                                 "destroy and create the agent to change it", fixed);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (!next->opts.verify_tls && old->opts.verify_tls)
        host_log(&a->host, PARLEY_LOG_WARN, "verify_tls is now false: the LLM server's TLS "
                 "certificate is NOT checked; use it only for testing");
    host_log(&a->host, PARLEY_LOG_INFO, "options updated: model %s at %s", next->opts.model,
             next->display_url);
    config_unref(old); /* turns in flight still hold it */
    return PARLEY_OK;
}

parley_status agent_cancel(parley_agent *a, parley_request_id id)
{
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    return inbox_cancel(a->box, id);
}

parley_status agent_complete_tool_call(parley_tool_call *call, const char *result, int is_error)
{
    if (!call)
        return PARLEY_ERR_INVALID_INPUT;
    parley_tool_call *h = tool_handle_take(call);
    if (!h)
        return PARLEY_ERR_NOT_FOUND; /* already completed (or never given out) */
    return inbox_complete_tool_call(h, result, is_error);
}

/* ---- history introspection ------------------------------------------------ */

static store_key key_for(const char *conversation_id)
{
    return (store_key){.conversation_id = conversation_id, .persona = "", .interface_type = ""};
}

static char *status_error_json(parley_status st, const char *field, const char *message);

/* Hand a store read to the host: its JSON in *out, or the status.  A failure
 * other than NOT_FOUND is logged as "what: the store's words" (SQLite's reason
 * for a damaged file) and, unless *out already says something, handed back in
 * *out as {"error":{"status","field":"history_store","message"}}. */
static parley_status read_result(parley_agent *a, const char *what, parley_status st, pbuf *b,
                                 char *err, char **out)
{
    if (st != PARLEY_OK && st != PARLEY_ERR_NOT_FOUND) {
        const char *why = err ? err : status_name(st);
        host_log(&a->host, PARLEY_LOG_WARN, "%s: %s", what, why);
        if (!*out)
            *out = status_error_json(st, "history_store", why);
    }
    else if (st != PARLEY_OK && err)
        last_error_set("%s", err); /* the store's words, for last_error */
    free(err);
    if (st == PARLEY_OK && !(*out = pbuf_take(b)))
        st = PARLEY_ERR_NO_MEMORY;
    pbuf_free(b);
    return st;
}

/* last_error for a conversation that is not there, naming its whole key. */
static parley_status no_conversation(parley_status st, const store_key *k)
{
    if (st != PARLEY_ERR_NOT_FOUND)
        return st;
    last_error_set("no conversation \"%s\"%s%s%s%s%s%s", k->conversation_id,
                   *k->persona ? " under persona \"" : "", k->persona, *k->persona ? "\"" : "",
                   *k->interface_type ? " on interface \"" : "", k->interface_type,
                   *k->interface_type ? "\"" : "");
    return st;
}

/*
 * A conversation's answer *out with "messages_kept": how many messages its kept turns
 * hold now, next to "message_count", how many were ever added (trimming by
 * history_keep_turns drops the former, never the latter).
 */
static parley_status count_kept(parley_status st, char **out)
{
    if (st != PARLEY_OK)
        return st;
    json_t *root = json_loads(*out, 0, NULL); /* read only: the answer keeps its bytes */
    json_t *turns = json_object_get(root, "turns");
    size_t kept = 0, i;
    json_t *t;
    json_array_foreach(turns, i, t)
        kept += json_array_size(json_object_get(t, "messages"));
    int ok = json_is_array(turns) && (*out)[0] == '{';
    json_decref(root);
    char *text = ok ? pstr_printf("{\"messages_kept\":%zu,%s", kept, *out + 1) : NULL;
    free(*out);
    *out = text;
    return text ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

/*
 * plugin.h's [blocking: store I/O] functions, called from inside a callback of
 * this agent (on its worker thread) while its store blocks (SQLite, Redis):
 * refused, because the one worker runs every turn of the agent and a disk or
 * network wait there would stall them all.  The memory store never blocks, so
 * its reads stay allowed everywhere.  *out (when given) says so in
 * {"error":{...}} form; the host's log says it too.
 */

static int refused_in_callback(parley_agent *a, const char *fn, char **out)
{
    if (!store_blocking(a->store) || !worker_is_current(a->worker))
        return 0;
    char *why = pstr_printf("%s may not be called from inside a callback of this agent while "
                            "its history_store is %s: it blocks on store I/O and would stall "
                            "every turn; call it from another thread", fn, store_scheme(a->store));
    host_log(&a->host, PARLEY_LOG_WARN, "%s", why ? why : fn);
    if (out)
        *out = why ? status_error_json(PARLEY_ERR_INVALID_INPUT, "thread", why) : NULL;
    free(why);
    return 1;
}

/* A conversation's JSON in b gets its context (the window's start, the
 * summary and what it covers: context/window.h) as "context", when the store
 * keeps a record for it.  A failure to read it leaves b as it was. */
static void add_context(parley_agent *a, const store_key *key, pbuf *b)
{
    pbuf rec = PBUF_INIT, ctx = PBUF_INIT;
    store_lifetime life;
    char *err = NULL;
    if (store_context_get(a->store, key, clock_wall_ms(), &rec, &life, &err) == PARLEY_OK &&
        rec.len && !rec.oom && b->len && b->data[b->len - 1] == '}') {
        ctx_describe(rec.data, rec.len, &ctx);
        if (!ctx.oom) {
            b->len--;
            pbuf_puts(b, ",\"context\":");
            pbuf_append(b, ctx.data, ctx.len);
            pbuf_putc(b, '}');
        }
    }
    free(err);
    pbuf_free(&rec);
    pbuf_free(&ctx);
}

parley_status agent_history_get(parley_agent *a, const char *id, char **out)
{
    last_error_clear();
    if (!a || !id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "history_get", out))
        return PARLEY_ERR_INVALID_INPUT;
    store_key key = key_for(id);
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = store_get_conversation(a->store, &key, clock_wall_ms(), &b, &err);
    if (st == PARLEY_OK)
        add_context(a, &key, &b);
    return count_kept(no_conversation(read_result(a, "history_get", st, &b, err, out), &key),
                      out);
}

/*
 * What a store's turn record does not say, added to turn_get's answer *out: the
 * conversation's "persona" and "interface_type", and the turn's "messages" in
 * history_query's form (message_id, created_at, interface ids, metadata).  From a query
 * by turn_id; a store without queries leaves the answer as it was.
 */
static parley_status describe_turn(parley_agent *a, const char *turn_id, char **out)
{
    store_query q = {.turn_id = turn_id, .until_ms = UINT64_MAX, .limit = STORE_QUERY_MAX_LIMIT};
    pbuf b = PBUF_INIT;
    size_t count = 0;
    uint64_t last = 0;
    int more = 0;
    char *err = NULL;
    pbuf_putc(&b, '[');
    parley_status st =
        store_query_run(a->store, &q, clock_wall_ms(), &b, &count, &last, &more, &err);
    pbuf_putc(&b, ']');
    json_t *msgs = st == PARLEY_OK && !b.oom ? json_loadb(b.data, b.len, 0, NULL) : NULL;
    json_t *root = msgs ? json_loads(*out, 0, NULL) : NULL;
    pbuf_free(&b);
    if (st != PARLEY_OK) {
        last_error_set("%s", err ? err : status_name(st));
        free(err);
        return st;
    }
    free(err);
    json_t *first = json_array_get(msgs, 0);
    const char *persona = json_string_value(json_object_get(first, "persona"));
    const char *iface = json_string_value(json_object_get(first, "interface_type"));
    char *text = NULL;
    if (json_is_object(root) &&
        json_object_set_new(root, "persona", json_string(persona ? persona : "")) == 0 &&
        json_object_set_new(root, "interface_type", json_string(iface ? iface : "")) == 0 &&
        json_object_set(root, "messages", msgs) == 0)
        text = json_dumps_whole(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    json_decref(msgs);
    if (!text)
        return PARLEY_ERR_NO_MEMORY;
    free(*out);
    *out = text;
    return PARLEY_OK;
}

parley_status agent_turn_get(parley_agent *a, const char *turn_id, char **out)
{
    last_error_clear();
    if (!a || !turn_id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "turn_get", out))
        return PARLEY_ERR_INVALID_INPUT;
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = store_get_turn(a->store, turn_id, clock_wall_ms(), &b, &err);
    st = read_result(a, "turn_get", st, &b, err, out);
    if (st == PARLEY_ERR_NOT_FOUND)
        last_error_set("no turn \"%s\" is stored", turn_id);
    if (st == PARLEY_OK && (st = describe_turn(a, turn_id, out)) != PARLEY_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

parley_status agent_conversations_list(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "conversations_list", out))
        return PARLEY_ERR_INVALID_INPUT;
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = store_list(a->store, clock_wall_ms(), &b, &err);
    return read_result(a, "conversations_list", st, &b, err, out);
}

static json_t *listed_conversations(parley_agent *a, parley_status *st, char **out);
static void count_clear(parley_agent *a, const char *persona);

parley_status agent_history_clear(parley_agent *a, const char *id)
{
    last_error_clear();
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    if (refused_in_callback(a, "history_clear", NULL))
        return PARLEY_ERR_INVALID_INPUT;
    store_key key = key_for(id);
    char *err = NULL;
    parley_status lst; /* clear-all: whose conversations it forgets, for the metrics */
    json_t *listed = id ? NULL : listed_conversations(a, &lst, NULL);
    parley_status st = store_forget(a->store, id ? &key : NULL, &err);
    if (st == PARLEY_OK && id)
        count_clear(a, "");
    json_t *forgotten = st == PARLEY_OK ? json_object_get(listed, "conversations") : NULL;
    size_t i;
    json_t *c;
    json_array_foreach(forgotten, i, c) { /* a clear of each, as clearing them one by one */
        const char *persona = json_string_value(json_object_get(c, "persona"));
        count_clear(a, persona ? persona : "");
    }
    json_decref(listed);
    if (err) {
        host_log(&a->host, PARLEY_LOG_WARN, "history_clear: %s", err);
        last_error_set("%s", err);
    }
    free(err);
    return id ? no_conversation(st, &key) : st;
}

/* {"error":{"status":..,"field":..,"message":..}}: how a read function whose only
 * channel is out_json names what was wrong. */
static char *status_error_json(parley_status st, const char *field, const char *message)
{
    last_error_set("%s", message);
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "{\"error\":{\"status\":");
    pbuf_json_string(&b, status_name(st), strlen(status_name(st)));
    pbuf_puts(&b, ",\"field\":");
    pbuf_json_string(&b, field, strlen(field));
    pbuf_puts(&b, ",\"message\":");
    pbuf_json_string(&b, message, strlen(message));
    pbuf_puts(&b, "}}");
    char *s = pbuf_take(&b);
    pbuf_free(&b);
    return s;
}

static char *input_error_json(const char *field, const char *message)
{
    return status_error_json(PARLEY_ERR_INVALID_INPUT, field, message);
}

parley_status agent_history_query(parley_agent *a, const char *query_json, char **out)
{
    last_error_clear();
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "history_query", out))
        return PARLEY_ERR_INVALID_INPUT;
    query_request r;
    const char *field = NULL;
    char *err = NULL;
    parley_status st = query_parse(query_json, &r, &field, &err);
    if (st != PARLEY_OK) {
        *out = err ? input_error_json(field, err) : NULL;
        free(err);
        return st;
    }
    pbuf b = PBUF_INIT;
    size_t count = 0;
    uint64_t last = 0;
    int more = 0;
    pbuf_puts(&b, "{\"messages\":[");
    st = store_query_run(a->store, &r.q, clock_wall_ms(), &b, &count, &last, &more,
                                  &err);
    if (st == PARLEY_OK) {
        char *cursor = more ? query_cursor(&r.q, last) : NULL;
        pbuf_puts(&b, "],\"next_cursor\":");
        if (cursor)
            pbuf_json_string(&b, cursor, strlen(cursor));
        else
            pbuf_puts(&b, "null");
        pbuf_putc(&b, '}');
        if (more && !cursor)
            b.oom = 1;
        free(cursor);
        if (r.q.conversation_id && !b.oom) { /* one conversation: its window and summary too */
            store_key key = {r.q.conversation_id, r.q.persona ? r.q.persona : "",
                             r.q.interface_type ? r.q.interface_type : ""};
            add_context(a, &key, &b);
        }
        if (b.oom)
            st = PARLEY_ERR_NO_MEMORY;
    }
    query_request_free(&r);
    return read_result(a, "history_query", st, &b, err, out);
}

parley_status agent_message_get(parley_agent *a, const char *message_id, char **out)
{
    last_error_clear();
    if (!a || !message_id || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "message_get", out))
        return PARLEY_ERR_INVALID_INPUT;
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st =
        store_get_message(a->store, message_id, clock_wall_ms(), &b, &err);
    st = read_result(a, "message_get", st, &b, err, out);
    if (st == PARLEY_ERR_NOT_FOUND)
        last_error_set("no message \"%s\" is stored", message_id);
    return st;
}

/* A selector's persona must be one of the current options' personas ("" = none;
 * "*" = every persona, where the selector allowed it). */
static parley_status check_selector_persona(parley_agent *a, const selector *sel, char **err)
{
    if (sel->every_persona || !*sel->key.persona)
        return PARLEY_OK;
    agent_config *cfg = current_config(a);
    parley_status rc =
        persona_check_name(&cfg->personas, sel->key.persona, 0, "selector 'persona'", err);
    config_unref(cfg);
    return rc;
}

/* One more clear of `persona`'s history in its metrics (none for persona ""). */
static void count_clear(parley_agent *a, const char *persona)
{
    persona_counters *c = *persona ? persona_metrics_for(&a->persona_metrics, persona) : NULL;
    if (c)
        atomic_fetch_add(&c->clears, 1);
    atomic_fetch_add(&a->persona_metrics.series.host_clears, 1);
}

parley_status agent_history_get_by(parley_agent *a, const char *selector_json, char **out)
{
    last_error_clear();
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "history_get_by", out))
        return PARLEY_ERR_INVALID_INPUT;
    selector sel;
    char *err = NULL;
    parley_status rc = selector_parse(selector_json, 0, &sel, &err);
    if (rc != PARLEY_OK) { /* INVALID_INPUT, or NO_MEMORY */
        *out = err ? input_error_json("selector", err) : NULL;
        free(err);
        return rc;
    }
    if ((rc = check_selector_persona(a, &sel, &err)) != PARLEY_OK) {
        *out = err ? input_error_json("persona", err) : NULL;
        free(err);
        selector_free(&sel);
        return rc;
    }
    pbuf b = PBUF_INIT;
    parley_status st =
        store_get_conversation(a->store, &sel.key, clock_wall_ms(), &b, &err);
    if (st == PARLEY_OK)
        add_context(a, &sel.key, &b);
    st = count_kept(no_conversation(read_result(a, "history_get_by", st, &b, err, out), &sel.key),
                    out);
    selector_free(&sel);
    return st;
}

parley_status agent_message_find(parley_agent *a, const char *selector_json, char **out)
{
    last_error_clear();
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "message_find", out))
        return PARLEY_ERR_INVALID_INPUT;
    selector sel;
    char *err = NULL;
    parley_status st = selector_parse(selector_json, SELECTOR_INTERFACE_MESSAGE_ID, &sel, &err);
    if (st != PARLEY_OK) { /* INVALID_INPUT, or NO_MEMORY */
        *out = err ? input_error_json(sel.bad_key, err) : NULL;
        free(err);
        return st;
    }
    st = PARLEY_ERR_INVALID_INPUT;
    if (!sel.interface_message_id) {
        *out = input_error_json("interface_message_id", "interface_message_id: required");
    } else if ((st = check_selector_persona(a, &sel, &err)) != PARLEY_OK) {
        *out = err ? input_error_json("persona", err) : NULL;
    } else {
        pbuf b = PBUF_INIT;
        st = store_find_message(a->store, &sel.key, sel.interface_message_id,
                                             clock_wall_ms(), &b, &err);
        st = read_result(a, "message_find", st, &b, err, out); /* the store's words */
        err = NULL;
    }
    free(err);
    selector_free(&sel);
    return st;
}

parley_status agent_set_interface_message_id(parley_agent *a, const char *turn_id,
                                             const char *interface_message_id)
{
    last_error_clear();
    if (!a || !turn_id)
        return PARLEY_ERR_INVALID_INPUT;
    if (refused_in_callback(a, "set_interface_message_id", NULL))
        return PARLEY_ERR_INVALID_INPUT;
    json_t *id = interface_message_id ? json_string(interface_message_id) : NULL;
    int valid = selector_valid_string(id, STORE_MAX_INTERFACE_MESSAGE_ID, 1);
    json_decref(id);
    if (!valid) { /* no out channel: the host's log says why */
        host_log(&a->host, PARLEY_LOG_WARN, "set_interface_message_id: interface_message_id must "
                 "be 1 to %d bytes of UTF-8", STORE_MAX_INTERFACE_MESSAGE_ID);
        last_error_set("interface_message_id: must be 1 to %d bytes of UTF-8",
                       STORE_MAX_INTERFACE_MESSAGE_ID);
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (strlen(turn_id) != STORE_ID_LEN) { /* not a turn id Parley gave: no such turn */
        last_error_set("no turn \"%s\" is stored", turn_id);
        return PARLEY_ERR_NOT_FOUND;
    }
    char *err = NULL;
    parley_status st = store_set_interface_message_id(
        a->store, turn_id, interface_message_id, clock_wall_ms(), NULL, &err);
    if (st != PARLEY_OK && st != PARLEY_ERR_NOT_FOUND)
        host_log(&a->host, PARLEY_LOG_WARN, "set_interface_message_id: %s",
                 err ? err : status_name(st));
    if (st == PARLEY_ERR_NOT_FOUND)
        last_error_set("no turn \"%s\" is stored", turn_id);
    else if (st != PARLEY_OK)
        last_error_set("%s", err ? err : status_name(st));
    free(err);
    return st;
}

/* The personas under which (id, interface) has a conversation, as a JSON object's keys
 * (found with the query: the store keeps no index by id alone).  NULL on failure. */
static json_t *personas_of(parley_agent *a, const store_key *key, parley_status *st)
{
    store_query q = {.conversation_id = key->conversation_id,
                     .interface_type = key->interface_type, .until_ms = UINT64_MAX,
                     .limit = STORE_QUERY_MAX_LIMIT};
    json_t *personas = json_object();
    int more = 1;
    *st = personas ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
    while (*st == PARLEY_OK && more) {
        pbuf b = PBUF_INIT;
        size_t count = 0;
        char *err = NULL;
        pbuf_putc(&b, '[');
        *st = store_query_run(a->store, &q, clock_wall_ms(), &b, &count, &q.after, &more,
                                       &err);
        pbuf_putc(&b, ']');
        if (*st != PARLEY_OK)
            host_log(&a->host, PARLEY_LOG_WARN, "history_clear_by: %s",
                     err ? err : status_name(*st));
        free(err);
        json_t *msgs = *st == PARLEY_OK && !b.oom ? json_loadb(b.data, b.len, 0, NULL) : NULL;
        if (*st == PARLEY_OK && !msgs)
            *st = PARLEY_ERR_NO_MEMORY;
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m) {
            const char *p = json_string_value(json_object_get(m, "persona"));
            if (p && json_object_set_new(personas, p, json_true()) != 0)
                *st = PARLEY_ERR_NO_MEMORY;
        }
        json_decref(msgs);
        pbuf_free(&b);
    }
    if (*st != PARLEY_OK) {
        json_decref(personas);
        return NULL;
    }
    return personas;
}

/* The store's conversation list, parsed: {"conversations":[...]}.  NULL with *st on failure. */
static json_t *listed_conversations(parley_agent *a, parley_status *st, char **out)
{
    pbuf b = PBUF_INIT;
    char *err = NULL;
    *st = store_list(a->store, clock_wall_ms(), &b, &err);
    if (*st != PARLEY_OK) { /* logged, and in *out (if given) the store's words */
        pbuf_free(&b);
        char *ignored = NULL;
        read_result(a, "conversations_list", *st, &b, err, out ? out : &ignored);
        free(ignored);
        return NULL;
    }
    free(err);
    json_t *root = *st == PARLEY_OK && !b.oom ? json_loadb(b.data, b.len, 0, NULL) : NULL;
    if (*st == PARLEY_OK && !json_is_object(root))
        *st = PARLEY_ERR_NO_MEMORY;
    pbuf_free(&b);
    if (*st != PARLEY_OK) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Does a listed conversation have this member (absent = "") equal to want? */
static int listed_field_is(json_t *conversation, const char *member, const char *want)
{
    const char *have = json_string_value(json_object_get(conversation, member));
    return strcmp(have ? have : "", want) == 0;
}

parley_status agent_conversations_list_by(parley_agent *a, const char *filter_json, char **out)
{
    last_error_clear();
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (refused_in_callback(a, "conversations_list_by", out))
        return PARLEY_ERR_INVALID_INPUT;
    const char *want_persona = NULL, *want_interface = NULL;
    json_t *filter = NULL;
    if (filter_json) {
        filter = json_loads(filter_json, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(filter)) {
            json_decref(filter);
            *out = input_error_json("filter", "must be a JSON object");
            return PARLEY_ERR_INVALID_INPUT;
        }
        static const char *const known[] = {"persona", "interface_type", NULL};
        char *why = NULL;
        parley_status st = json_keys_check(filter, known, "filter", &why);
        json_t *persona = json_object_get(filter, "persona");
        json_t *interface = json_object_get(filter, "interface_type");
        const char *field = st != PARLEY_OK                            ? "filter"
                            : persona && !json_is_string(persona)     ? "persona"
                            : interface && !json_is_string(interface) ? "interface_type"
                                                                      : NULL;
        if (field) {
            *out = why || st == PARLEY_OK ? input_error_json(field, why ? why : "must be a string")
                                          : NULL;
            free(why);
            json_decref(filter);
            return st == PARLEY_OK ? PARLEY_ERR_INVALID_INPUT : st;
        }
        want_persona = json_string_value(persona);
        want_interface = json_string_value(interface);
    }
    char *err = NULL;
    if (want_persona && *want_persona) {
        agent_config *cfg = current_config(a);
        parley_status rc =
            persona_check_name(&cfg->personas, want_persona, 0, "filter 'persona'", &err);
        config_unref(cfg);
        if (rc != PARLEY_OK) {
            *out = err ? input_error_json("persona", err) : NULL;
            free(err);
            json_decref(filter);
            return rc; /* NO_MEMORY stays NO_MEMORY */
        }
    }
    parley_status st;
    json_t *root = listed_conversations(a, &st, out);
    json_t *all = json_object_get(root, "conversations");
    json_t *kept = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(all, i, c) {
        if ((!want_persona || listed_field_is(c, "persona", want_persona)) &&
            (!want_interface || listed_field_is(c, "interface_type", want_interface)) &&
            json_array_append(kept, c) != 0)
            st = PARLEY_ERR_NO_MEMORY;
    }
    json_decref(filter);
    if (!root || !kept) { /* (no root: the list failed, st says why) */
        if (root)
            st = PARLEY_ERR_NO_MEMORY;
        json_decref(kept);
    } else if (json_object_set_new(root, "conversations", kept) != 0) { /* it took kept */
        st = PARLEY_ERR_NO_MEMORY;
    }
    if (st == PARLEY_OK && !(*out = json_dumps_whole(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        st = PARLEY_ERR_NO_MEMORY;
    json_decref(root);
    return st;
}

parley_status agent_history_clear_by(parley_agent *a, const char *selector_json)
{
    last_error_clear();
    if (!a)
        return PARLEY_ERR_INVALID_INPUT;
    if (refused_in_callback(a, "history_clear_by", NULL))
        return PARLEY_ERR_INVALID_INPUT;
    selector sel;
    char *err = NULL;
    parley_status rc = selector_parse(selector_json, SELECTOR_EVERY_PERSONA, &sel, &err);
    if (rc == PARLEY_OK) /* a refusal left nothing to free */
        rc = check_selector_persona(a, &sel, &err);
    if (rc != PARLEY_OK) { /* INVALID_INPUT, or NO_MEMORY (no message) */
        const char *why = err                         ? err
                          : rc == PARLEY_ERR_NO_MEMORY ? "out of memory"
                                                       : "invalid selector";
        host_log(&a->host, PARLEY_LOG_WARN, "history_clear_by: %s", why);
        last_error_set("%s", why);
        free(err);
        selector_free(&sel);
        return rc;
    }
    parley_status st = PARLEY_ERR_NOT_FOUND;
    if (!sel.every_persona) {
        st = store_forget(a->store, &sel.key, &err);
        if (st == PARLEY_OK)
            count_clear(a, sel.key.persona);
    } else {
        /* Which personas have this conversation: a query of its messages. */
        json_t *personas = personas_of(a, &sel.key, &st);
        const char *persona;
        json_t *unused;
        if (personas && json_object_size(personas) == 0)
            st = PARLEY_ERR_NOT_FOUND;
        json_object_foreach(personas, persona, unused) {
            store_key k = sel.key;
            k.persona = persona;
            char *one = NULL;
            parley_status fst = store_forget(a->store, &k, &one);
            if (fst == PARLEY_OK)
                count_clear(a, persona);
            if (fst != PARLEY_OK && fst != PARLEY_ERR_NOT_FOUND) {
                st = fst;
                free(err);
                err = one;
            } else {
                free(one);
            }
        }
        json_decref(personas);
    }
    if (err) {
        host_log(&a->host, PARLEY_LOG_WARN, "history_clear_by: %s", err);
        last_error_set("%s", err);
    }
    free(err);
    if (st == PARLEY_ERR_NOT_FOUND && sel.every_persona)
        sel.key.persona = ""; /* named without the "*" */
    st = no_conversation(st, &sel.key);
    selector_free(&sel);
    return st;
}

/* The token counters, added at the end of the metrics object in *out. */
static parley_status append_token_metrics(const agent_counters *m, char **out)
{
    pbuf b = PBUF_INIT;
    pbuf_append(&b, *out, strlen(*out) - 1); /* without the closing brace */
    pbuf_printf(&b,
                ",\"tokens_prompt\":%llu,\"tokens_completion\":%llu,\"tokens_cache_read\":%llu,"
                "\"tokens_cache_creation\":%llu,\"tokens_reasoning\":%llu,"
                "\"answers_cut_short\":%llu,\"tokens_prompt_evaluated\":%llu}",
                (unsigned long long)m->tokens_prompt, (unsigned long long)m->tokens_completion,
                (unsigned long long)m->tokens_cache_read,
                (unsigned long long)m->tokens_cache_creation,
                (unsigned long long)m->tokens_reasoning, (unsigned long long)m->answers_cut_short,
                (unsigned long long)m->tokens_prompt_evaluated);
    free(*out);
    *out = b.oom ? NULL : pbuf_take(&b);
    pbuf_free(&b);
    return *out ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

/* The context engine's counters (context/window.h), added the same way. */
static parley_status append_context_metrics(const agent_counters *m, char **out)
{
    pbuf b = PBUF_INIT;
    pbuf_append(&b, *out, strlen(*out) - 1);
    pbuf_printf(&b,
                ",\"context_cuts\":%llu,\"context_overflows_recovered\":%llu,"
                "\"summaries_made\":%llu,\"summaries_failed\":%llu,\"cache_breaks\":%llu}",
                (unsigned long long)m->context_cuts,
                (unsigned long long)m->context_overflows_recovered,
                (unsigned long long)m->summaries_made, (unsigned long long)m->summaries_failed,
                (unsigned long long)m->cache_breaks);
    free(*out);
    *out = b.oom ? NULL : pbuf_take(&b);
    pbuf_free(&b);
    return *out ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

parley_status agent_metrics(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    if (refused_in_callback(a, "metrics", out))
        return PARLEY_ERR_INVALID_INPUT;
    store_stats hs;
    memset(&hs, 0, sizeof hs);
    char *err = NULL;
    if (store_stats_get(a->store, &hs, &err) != PARLEY_OK)
        host_log(&a->host, PARLEY_LOG_WARN, "metrics: %s", err ? err : "store stats unavailable");
    free(err);
    const agent_counters *m = &a->metrics;
    if (asprintf(out,
                 "{\"turns_accepted\":%llu,\"turns_ok\":%llu,\"turns_failed\":%llu,"
                 "\"turns_cancelled\":%llu,\"in_flight\":%lld,\"rejected_busy\":%llu,"
                 "\"rejected_invalid\":%llu,\"llm_requests\":%llu,\"llm_retries\":%llu,"
                 "\"tool_calls\":%llu,\"tool_errors\":%llu,\"tool_timeouts\":%llu,"
                 "\"conversations\":%zu,\"stored_turns\":%zu,\"stored_message_bytes\":%zu,"
                 "\"conversations_evicted\":%zu,\"conversations_expired\":%zu,",
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
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, *out);
    free(*out);
    persona_metrics_json(&a->persona_metrics, &b);
    pbuf_putc(&b, '}');
    if (b.oom || !(*out = pbuf_take(&b))) {
        pbuf_free(&b);
        *out = NULL;
        return PARLEY_ERR_NO_MEMORY;
    }
    parley_status st = append_token_metrics(m, out);
    return st == PARLEY_OK ? append_context_metrics(m, out) : st;
}
