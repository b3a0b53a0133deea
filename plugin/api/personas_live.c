/* personas_live.c -- see personas_live.h. */
#include "api/personas_live.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/agent.h"
#include "lib/buf.h"
#include "lib/host_log.h"
#include "lib/json_oom.h"

/* Another update swapped the snapshot between our read and our swap: read it again.  Each
 * retry follows a change that did land, so a handful is plenty. */
#define SWAP_TRIES 8

static parley_status refuse(char **error, parley_status st, char *message)
{
    if (error)
        *error = message;
    else
        free(message);
    return st;
}

/* The options text of `base` with persona `name` set to def (NULL: removed).  NULL with
 * *st when the persona to remove is not there (NOT_FOUND) or out of memory. */
static char *options_with(const agent_config *base, const char *name, json_t *def,
                          parley_status *st)
{
    *st = PARLEY_ERR_NO_MEMORY;
    json_t *root = json_loads(base->options_json, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    json_t *personas = json_object_get(root, "personas");
    if (!json_is_object(personas)) {
        personas = json_object();
        if (!personas || json_object_set_new(root, "personas", personas) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    char *text = NULL;
    if (!def && !json_object_get(personas, name))
        *st = PARLEY_ERR_NOT_FOUND;
    else if ((def ? json_object_set(personas, name, def) : json_object_del(personas, name)) == 0)
        text = json_dumps_whole(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (text)
        *st = PARLEY_OK;
    return text;
}

/* Swap in `next` if the agent still has `base`: 1 done, 0 someone else changed it first. */
static int swap_if_current(parley_agent *a, agent_config *base, agent_config *next)
{
    pthread_mutex_lock(&a->cfg_mu);
    int current = a->cfg == base;
    if (current)
        a->cfg = next;
    pthread_mutex_unlock(&a->cfg_mu);
    if (current)
        config_unref(base); /* the agent's reference; turns in flight keep theirs */
    return current;
}

static parley_status change_persona(parley_agent *a, const char *name, json_t *def, char **error)
{
    for (int tries = 0; tries < SWAP_TRIES; tries++) {
        pthread_mutex_lock(&a->cfg_mu);
        agent_config *base = config_ref(a->cfg);
        pthread_mutex_unlock(&a->cfg_mu);
        parley_status st;
        char *text = options_with(base, name, def, &st);
        if (!text) {
            char *names = st == PARLEY_ERR_NOT_FOUND ? persona_names(&base->personas) : NULL;
            config_unref(base);
            if (st != PARLEY_ERR_NOT_FOUND)
                return refuse(error, st, pstr_printf("out of memory"));
            char *m = pstr_printf("name: no persona \"%s\" (personas: %s)", name,
                                  names && *names ? names : "none");
            free(names);
            return refuse(error, st, m);
        }
        char *err = NULL;
        agent_config *next = config_new(text, &st, &err);
        free(text);
        if (!next) {
            config_unref(base);
            char *m = pstr_printf("persona_json: %s", err ? err : "out of memory");
            free(err);
            return refuse(error, m && st != PARLEY_ERR_NO_MEMORY ? PARLEY_ERR_INVALID_INPUT
                                                                 : PARLEY_ERR_NO_MEMORY, m);
        }
        int swapped = swap_if_current(a, base, next);
        config_unref(base);
        if (swapped) {
            host_log(&a->host, PARLEY_LOG_INFO, "persona \"%s\" %s", name, def ? "set" : "removed");
            return PARLEY_OK;
        }
        config_unref(next);
    }
    return refuse(error, PARLEY_ERR_BUSY,
                  pstr_printf("the options kept changing under persona_put/persona_remove; "
                              "try again"));
}

/* A name a host may give: a non-empty string (the personas option checks the rest). */
static parley_status check_name(const char *name, char **error)
{
    if (name && *name && strcmp(name, "*") != 0)
        return PARLEY_OK;
    return refuse(error, PARLEY_ERR_INVALID_INPUT,
                  pstr_printf("name: a persona needs a non-empty name other than \"*\""));
}

parley_status agent_persona_put(parley_agent *a, const char *name, const char *persona_json,
                                char **error)
{
    if (error)
        *error = NULL;
    if (!a)
        return refuse(error, PARLEY_ERR_INVALID_INPUT, pstr_printf("agent is NULL"));
    if (check_name(name, error) != PARLEY_OK)
        return PARLEY_ERR_INVALID_INPUT;
    json_error_t jerr;
    json_t *def = persona_json ? json_loads(persona_json, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!json_is_object(def)) {
        json_decref(def);
        return refuse(error, PARLEY_ERR_INVALID_INPUT,
                      pstr_printf("persona_json: must be a JSON object as in the personas "
                                  "option, e.g. {\"prompt\":\"You are a chef.\"}"));
    }
    parley_status st = change_persona(a, name, def, error);
    json_decref(def);
    return st;
}

parley_status agent_persona_remove(parley_agent *a, const char *name, char **error)
{
    if (error)
        *error = NULL;
    if (!a)
        return refuse(error, PARLEY_ERR_INVALID_INPUT, pstr_printf("agent is NULL"));
    if (check_name(name, error) != PARLEY_OK)
        return PARLEY_ERR_INVALID_INPUT;
    return change_persona(a, name, NULL, error);
}
