/*
 * live_options.c -- changing the options of the running agent
 * (update_options): the JSONL "update_options" op and the interactive /set.
 *
 * The new options replace the old ones whole, as the ABI says; the --tools
 * declarations are appended again, as at start-up, so the host's tools stay
 * offered.  On success g_shim.options (what /options and the banner show)
 * becomes the new object.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static json_t *owned; /* the options object this file made current, if any */

parley_status live_options_apply(json_t *next, char **msg)
{
    *msg = NULL;
    const parley_plugin *pl = g_shim.pl;
    if (!next) {
        *msg = strdup("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, update_options) || !pl->update_options) {
        json_decref(next);
        *msg = strdup("this plugin has no update_options");
        return PARLEY_ERR_INVALID_INPUT;
    }
    char *terr = NULL;
    if (tools_declare(next, &terr) < 0) {
        json_decref(next);
        *msg = terr ? terr : strdup("cannot declare the tools");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    char *text = json_dumps(next, SHIM_JSON_COMPACT);
    if (!text) {
        json_decref(next);
        *msg = strdup("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    char *perr = NULL;
    parley_status st = pl->update_options(g_shim.agent, text, &perr);
    free(text);
    if (st != PARLEY_OK) {
        json_decref(next);
        *msg = perr ? strdup(perr) : NULL;
        plugin_free(perr);
        return st;
    }
    plugin_free(perr);
    json_decref(owned);
    owned = next;
    g_shim.options = next;
    return PARLEY_OK;
}

void live_options_free(void)
{
    json_decref(owned);
    owned = NULL;
}
