/*
 * persona.h -- the characters one agent can speak as (option `personas`).
 *
 * A persona is a name with its own system prompt and, optionally, its own
 * model, sampling parameters, subset of the agent's tools and history depth.
 * Each (persona, conversation id) is its own history (store_key.persona), so
 * two personas on one conversation never see each other's turns.  A turn
 * without a persona uses the agent's options and the persona "".
 *
 * A persona set is parsed once per config snapshot (config.h) and read-only
 * after: any thread may read it while it holds the snapshot.
 */
#ifndef PARLEY_PERSONA_H
#define PARLEY_PERSONA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "lib/buf.h"
#include "lib/plugin_status.h"
#include "config/options.h"
#include "config/series.h"
#include "config/toolset.h"

/* Longest persona name (bytes). */
#define PERSONA_MAX_NAME 64

typedef struct persona_spec {
    char *name;
    char *prompt;               /* the system prompt ("" = none) */
    char *model;                /* NULL: the agent's */
    double temperature, top_p;  /* < 0: the agent's */
    int64_t max_tokens;         /* 0: the agent's */
    int64_t max_history_turns;  /* < 0: the agent's */
    toolset *tools;             /* NULL: all the agent's tools */
} persona_spec;

typedef struct persona_set {
    persona_spec *items;
    size_t n;
} persona_set;

/*
 * Parse the `personas` option (a JSON object name -> settings) against the
 * agent's tools.  PARLEY_OK, or PARLEY_ERR_INVALID_OPTIONS (or NO_MEMORY) with
 * *err (malloc'd) naming the persona and the key: "option 'personas': persona
 * \"chef\": tool \"oven\" is not one of the agent's tools".
 */
parley_status persona_set_parse(const char *json_object, const toolset *agent_tools,
                                persona_set *out, char **err);
void persona_set_free(persona_set *s);

/* The persona called `name`, or NULL. */
const persona_spec *persona_find(const persona_set *s, const char *name);

/*
 * Check a persona name from a host (input `persona`, a history selector's
 * "persona"): "" is the agent's own (no persona), "*" every persona (only
 * where all_ok), else it must be one of the set.  PARLEY_OK, or
 * PARLEY_ERR_INVALID_INPUT with *err (malloc'd): "<where>: unknown persona
 * \"pirate\" (personas: \"chef\")".
 */
parley_status persona_check_name(const persona_set *s, const char *name, int all_ok,
                                 const char *where, char **err);

/* Names of every persona for a message ("\"chef\", \"butler\""), malloc'd. */
char *persona_names(const persona_set *s);

/*
 * The options one request of persona p is made with: *o with p's overrides
 * (a shallow copy: its strings are borrowed from p and `base`).  p NULL: *base.
 */
void persona_apply(const persona_spec *p, const parley_options *base, parley_options *o);

/* Per-persona metrics: kept by the agent for its whole life, across option updates. */
typedef struct persona_counters {
    char *name;
    atomic_uint_fast64_t turns, turns_stored, messages_stored, truncations, clears;
    struct persona_counters *next;
} persona_counters;

typedef struct persona_metrics {
    pthread_mutex_t lock;
    persona_counters *head;
    series_metrics series; /* the same turns by (persona, interface_type), and switches */
} persona_metrics;

void persona_metrics_init(persona_metrics *m);
void persona_metrics_destroy(persona_metrics *m);
/* The counters of `name` (created on first use; stable until destroy), or NULL on OOM. */
persona_counters *persona_metrics_for(persona_metrics *m, const char *name);
/* Append "personas":{name:{"turns":N,...},...} (every persona that had a turn or a clear). */
void persona_metrics_json(persona_metrics *m, pbuf *out);

#endif
