/*
 * config.h -- an agent's configuration as one immutable, reference-counted
 * snapshot: the parsed options, the toolset they declare, and the HTTP
 * settings every request shares (URL, headers, limits).
 *
 * The agent holds the current snapshot; each turn takes a reference when it
 * is accepted and drops it when it ends, so swapping the agent's snapshot
 * (a later update_options) never changes a turn in flight: it finishes under
 * the options it started with.  Nothing in a snapshot changes after
 * config_new, so any thread may read it while it holds a reference.
 *
 * The history store is not part of a snapshot: it is opened once per agent.
 */
#ifndef PARLEY_CONFIG_H
#define PARLEY_CONFIG_H

#include <curl/curl.h>
#include <stdatomic.h>

#include "http/llm_http.h"
#include "config/options.h"
#include "config/persona.h"
#include "config/toolset.h"

typedef struct agent_config {
    atomic_int refs;
    parley_options opts;
    toolset *tools;              /* from opts.tools_json */
    persona_set personas;        /* from opts.personas_json */
    const struct provider *prov; /* the `provider` option's codec (provider/provider.h) */
    http_config http;            /* points into url and headers below */
    char *url;                   /* <base_url> + the provider's path */
    char *display_url;           /* url without credentials, query or fragment: for messages */
    struct curl_slist *headers;
    char *options_json;          /* the options text it was made from: persona_put and
                                    persona_remove make the next snapshot from it */
} agent_config;

/* Parse and validate options_json into a new snapshot (one reference), or
 * NULL with *status PARLEY_ERR_INVALID_OPTIONS and *err (malloc'd) naming the
 * option, or PARLEY_ERR_NO_MEMORY ("out of memory"). */
agent_config *config_new(const char *options_json, parley_status *status, char **err);
agent_config *config_ref(agent_config *c);
void config_unref(agent_config *c);  /* frees it with the last reference; NULL is a no-op */

#endif
