/*
 * personas_live.h -- add, replace or remove one persona of a live agent
 * (parley_plugin.persona_put / persona_remove), without sending the whole
 * options again: a voice app loads its characters at run time.
 *
 * The next config snapshot is made from the current one's options text with
 * that one persona changed, validated exactly as create() validates the
 * `personas` option, and swapped in like update_options' (turns in flight
 * keep the snapshot they started with).  Histories are keyed by persona name
 * in the store and are never touched: a replaced persona keeps its
 * conversations, and a removed one's stay stored (history_clear_by with
 * persona "*" still finds them; adding the persona again brings them back).
 */
#ifndef PARLEY_PERSONAS_LIVE_H
#define PARLEY_PERSONAS_LIVE_H

#include <parley/plugin.h>

parley_status agent_persona_put(parley_agent *a, const char *name, const char *persona_json,
                                char **error);
parley_status agent_persona_remove(parley_agent *a, const char *name, char **error);

#endif
