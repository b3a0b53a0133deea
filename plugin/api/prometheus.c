/*
 * prometheus.c -- see prometheus.h.
 *
 * Names follow Prometheus' conventions: the parley_ prefix, the unit in the
 * name (_bytes), _total on counters.  Counters only grow for the agent's
 * life; gauges say what is true now (turns in flight; conversations, turns
 * and message bytes the store holds).  Labels are persona, interface_type
 * (each "" for none), reason, outcome, kind, from / to: names from the
 * options and the host, never a conversation id.
 */
#include "api/prometheus.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/agent.h"
#include "lib/buf.h"
#include "lib/host_log.h"

/* A label value, escaped as the format wants: \\, \" and \n. */
static void label_value(pbuf *b, const char *v)
{
    pbuf_putc(b, '"');
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            pbuf_putc(b, '\\');
        if (*v == '\n')
            pbuf_puts(b, "\\n");
        else
            pbuf_putc(b, *v);
    }
    pbuf_putc(b, '"');
}

static void family(pbuf *b, const char *name, const char *type, const char *help)
{
    pbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{key="value"} v, one label. */
static void sample1(pbuf *b, const char *name, const char *key, const char *value, uint64_t v)
{
    pbuf_printf(b, "%s{%s=", name, key);
    label_value(b, value);
    pbuf_printf(b, "} %" PRIu64 "\n", v);
}

static void one(pbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    pbuf_printf(b, "%s %" PRIu64 "\n", name, v);
}

/* The series (series.h) of one family: which counter of each, and an extra label. */
typedef struct series_family {
    pbuf *b;
    const char *name;
    size_t offset;     /* of the atomic in series_counters */
    const char *extra; /* NULL, or a third label: outcome="..." */
} series_family;

static void put_series(const series_counters *c, void *ud)
{
    const series_family *f = ud;
    uint64_t v = atomic_load((const atomic_uint_fast64_t *)((const char *)c + f->offset));
    pbuf_printf(f->b, "%s{persona=", f->name);
    label_value(f->b, c->persona);
    pbuf_puts(f->b, ",interface_type=");
    label_value(f->b, c->interface_type);
    if (f->extra)
        pbuf_printf(f->b, ",%s", f->extra);
    pbuf_printf(f->b, "} %" PRIu64 "\n", v);
}

static void put_switch(const persona_switch *s, void *ud)
{
    pbuf *b = ud;
    pbuf_puts(b, "parley_persona_switches_total{from=");
    label_value(b, s->from);
    pbuf_puts(b, ",to=");
    label_value(b, s->to);
    pbuf_printf(b, "} %" PRIu64 "\n", (uint64_t)atomic_load(&s->count));
}

static void series_samples(pbuf *b, series_metrics *m, const char *name, size_t offset,
                           const char *extra)
{
    series_family f = {b, name, offset, extra};
    series_each(m, put_series, NULL, &f);
}

static void turn_families(pbuf *b, series_metrics *s)
{
    family(b, "parley_turns_total", "counter",
           "Turns ended (appended messages included), by persona, interface_type and outcome.");
    series_samples(b, s, "parley_turns_total", offsetof(series_counters, turns_ok),
                   "outcome=\"ok\"");
    series_samples(b, s, "parley_turns_total", offsetof(series_counters, turns_failed),
                   "outcome=\"failed\"");
    series_samples(b, s, "parley_turns_total", offsetof(series_counters, turns_cancelled),
                   "outcome=\"cancelled\"");
    family(b, "parley_turns_stored_total", "counter",
           "Turns committed to the history store, by persona and interface_type.");
    series_samples(b, s, "parley_turns_stored_total", offsetof(series_counters, turns_stored),
                   NULL);
    family(b, "parley_messages_stored_total", "counter",
           "Messages committed to the history store, by persona and interface_type.");
    series_samples(b, s, "parley_messages_stored_total", offsetof(series_counters, messages_stored),
                   NULL);
    family(b, "parley_history_cut_turns_total", "counter",
           "Turns whose history sent was cut to max_history_turns, by persona and interface_type.");
    series_samples(b, s, "parley_history_cut_turns_total", offsetof(series_counters, history_cut),
                   NULL);
    family(b, "parley_persona_switches_total", "counter",
           "Turns under another persona than their conversation's previous turn, by from and to.");
    series_each(s, NULL, put_switch, b);
}

static void agent_families(pbuf *b, const agent_counters *m)
{
    one(b, "parley_turns_accepted_total", "counter",
        "Turns accepted by async_process and append_message.", atomic_load(&m->turns_accepted));
    one(b, "parley_turns_in_flight", "gauge", "Turns accepted and not yet ended.",
        (uint64_t)(atomic_load(&m->in_flight) > 0 ? atomic_load(&m->in_flight) : 0));
    family(b, "parley_turns_rejected_total", "counter",
           "Turns refused before they started, by reason.");
    sample1(b, "parley_turns_rejected_total", "reason", "busy", atomic_load(&m->rejected_busy));
    sample1(b, "parley_turns_rejected_total", "reason", "invalid_input",
            atomic_load(&m->rejected_invalid));
    one(b, "parley_llm_requests_total", "counter", "Requests sent to the LLM server.",
        atomic_load(&m->llm_requests));
    one(b, "parley_llm_retries_total", "counter", "Requests sent again after a failure.",
        atomic_load(&m->llm_retries));
    one(b, "parley_answers_cut_short_total", "counter", "Turns whose answer hit max_tokens.",
        atomic_load(&m->answers_cut_short));
    one(b, "parley_tool_calls_total", "counter", "Tool calls the model made.",
        atomic_load(&m->tool_calls));
    one(b, "parley_tool_errors_total", "counter", "Tool calls that ended in an error result.",
        atomic_load(&m->tool_errors));
    one(b, "parley_tool_timeouts_total", "counter",
        "Tool calls the host did not complete in tool_timeout_ms.", atomic_load(&m->tool_timeouts));
    family(b, "parley_llm_tokens_total", "counter", "Tokens as the servers counted them, by kind.");
    sample1(b, "parley_llm_tokens_total", "kind", "prompt", atomic_load(&m->tokens_prompt));
    sample1(b, "parley_llm_tokens_total", "kind", "completion", atomic_load(&m->tokens_completion));
    sample1(b, "parley_llm_tokens_total", "kind", "cache_read", atomic_load(&m->tokens_cache_read));
    sample1(b, "parley_llm_tokens_total", "kind", "cache_creation",
            atomic_load(&m->tokens_cache_creation));
    sample1(b, "parley_llm_tokens_total", "kind", "reasoning", atomic_load(&m->tokens_reasoning));
}

static void store_families(pbuf *b, const store_stats *hs, uint64_t host_clears)
{
    one(b, "parley_conversations", "gauge", "Conversations the history store holds now.",
        hs->conversations);
    one(b, "parley_stored_turns", "gauge", "Turns the history store holds now.", hs->turns);
    one(b, "parley_stored_messages", "gauge", "Messages the history store holds now.",
        hs->messages);
    one(b, "parley_stored_message_bytes", "gauge",
        "Bytes of message JSON the history store holds now.", hs->message_bytes);
    one(b, "parley_history_trimmed_turns_total", "counter",
        "Turns the history store dropped to keep history_keep_turns per conversation (since it was "
        "opened): what later turns' history no longer holds.",
        hs->trimmed);
    family(b, "parley_conversations_cleared_total", "counter",
           "Conversations forgotten, by reason: the host cleared them, idle past "
           "history_idle_timeout_s, or evicted past max_conversations.");
    sample1(b, "parley_conversations_cleared_total", "reason", "host", host_clears);
    sample1(b, "parley_conversations_cleared_total", "reason", "idle_expiry", hs->expired);
    sample1(b, "parley_conversations_cleared_total", "reason", "eviction", hs->evicted);
}

parley_status agent_metrics_prometheus(parley_agent *a, char **out)
{
    if (!a || !out)
        return PARLEY_ERR_INVALID_INPUT;
    *out = NULL;
    if (store_blocking(a->store) && worker_is_current(a->worker)) { /* plugin.h: [blocking] */
        host_log(&a->host, PARLEY_LOG_WARN,
                 "metrics_prometheus may not be called from inside a callback of this agent while "
                 "its history_store is %s: call it from another thread",
                 store_scheme(a->store));
        return PARLEY_ERR_INVALID_INPUT;
    }
    store_stats hs;
    memset(&hs, 0, sizeof hs);
    char *err = NULL;
    if (store_stats_get(a->store, &hs, &err) != PARLEY_OK)
        host_log(&a->host, PARLEY_LOG_WARN, "metrics: %s", err ? err : "store stats unavailable");
    free(err);
    pbuf b = PBUF_INIT;
    agent_families(&b, &a->metrics);
    turn_families(&b, &a->persona_metrics.series);
    store_families(&b, &hs, atomic_load(&a->persona_metrics.series.host_clears));
    if (b.oom || !(*out = pbuf_take(&b))) {
        pbuf_free(&b);
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}
