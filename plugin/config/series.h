/*
 * series.h -- the agent's labelled metrics, for the Prometheus text that
 * parley_plugin.metrics_prometheus returns (api/prometheus.c renders them).
 *
 * The JSON `metrics` counts per persona; a monitoring system wants the
 * same counts split by (persona, interface_type) as labels, and two things
 * the JSON never had: persona switches within a conversation (a voice app
 * switching characters) and clears by the host.  Labels are names the
 * options and the host give (personas, interfaces), never a conversation id:
 * a label per conversation would grow the series without bound.
 *
 * Counters only ever grow, for the agent's life (across update_options and
 * persona changes).  Any thread; one mutex guards the lists, the counters
 * are atomics.
 */
#ifndef PARLEY_SERIES_H
#define PARLEY_SERIES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "lib/buf.h"
#include "lib/dict.h"

/* One (persona, interface_type): "" for none. */
typedef struct series_counters {
    char *persona, *interface_type;
    atomic_uint_fast64_t turns_ok, turns_failed, turns_cancelled;
    atomic_uint_fast64_t turns_stored, messages_stored;
    atomic_uint_fast64_t history_cut; /* turns sent with their history cut by the window */
    struct series_counters *next;
} series_counters;

/* A persona switch within a conversation: a turn under `to` whose conversation's
 * previous turn (same conversation id and interface) was under `from`. */
typedef struct persona_switch {
    char *from, *to;
    atomic_uint_fast64_t count;
    struct persona_switch *next;
} persona_switch;

/* Conversations whose last persona is remembered, at most: past it the memory starts
 * over (a switch in a conversation forgotten so is not counted). */
#define SERIES_MAX_TRACKED 65536

typedef struct series_metrics {
    pthread_mutex_t lock;
    series_counters *head;
    persona_switch *switches;
    dict *last_persona;               /* conversation id + interface -> its last persona */
    atomic_uint_fast64_t host_clears; /* conversations the host cleared (one, or all) */
} series_metrics;

void series_init(series_metrics *m);
void series_destroy(series_metrics *m);

/* The counters of (persona, interface_type) (created on first use; stable until
 * destroy), or NULL out of memory.  NULL arguments are "". */
series_counters *series_for(series_metrics *m, const char *persona, const char *interface_type);

/* A turn of conversation_id on interface_type begins under persona: count a switch when
 * the conversation's previous turn was under another persona. */
void series_turn_begins(series_metrics *m, const char *conversation_id, const char *interface_type,
                        const char *persona);

/* Call fn for each series / switch, under the lock (fn must not call back in). */
void series_each(series_metrics *m, void (*fn)(const series_counters *c, void *ud),
                 void (*sw)(const persona_switch *s, void *ud), void *ud);

#endif
