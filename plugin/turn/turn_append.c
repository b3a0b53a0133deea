/*
 * turn_append.c -- the host-thread half of append_message: validate the
 * message, then build the turn that carries it (see turn_append.h).  The
 * worker half is a few lines of turn.c: turn_begin goes straight to the
 * commit (record_store_messages gives the store the message's identity, as for a
 * user message), and turn_report names no user message.
 */
#include "turn/turn_append.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "lib/json_keys.h"
#include "config/selector.h"
#include "lib/json_oom.h"

/* PARLEY_ERR_INVALID_INPUT with *err = the message (malloc'd): the input is refused;
   NO_MEMORY when the message could not be made. */
static parley_status refuse(char **err, char *message)
{
    *err = message;
    return message ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

/* The keys selector_parse does not read: role, content, metadata. */
static parley_status check_message_keys(json_t *root, size_t max_bytes, const char **role,
                                        const char **content, char **metadata, char **err)
{
    static const char *const known[] = {"conversation_id", "content", "role", "interface_type",
                                        "persona", "interface_message_id", "metadata",
                                        "timestamp", NULL};
    parley_status st = json_keys_check(root, known, "message_json", err);
    if (st != PARLEY_OK)
        return st;
    json_t *r = json_object_get(root, "role");
    *role = r ? json_string_value(r) : "assistant";
    if (!*role || (r && strlen(*role) != json_string_length(r)) || /* "user\u0000x": no role */
        (strcmp(*role, "assistant") != 0 && strcmp(*role, "system") != 0 &&
         strcmp(*role, "user") != 0))
        return refuse(err, pstr_printf("message_json 'role': must be \"assistant\" (the default), "
                                       "\"user\" or \"system\" (a tool message belongs to a "
                                       "turn)"));
    json_t *c = json_object_get(root, "content");
    *content = json_string_value(c);
    if (!*content || !**content || strlen(*content) != json_string_length(c))
        return refuse(err, pstr_printf("message_json 'content': required, a non-empty string"));
    if (json_string_length(c) > max_bytes)
        return refuse(err, pstr_printf("message_json 'content': %zu bytes, more than "
                                       "max_input_bytes (%zu)", json_string_length(c), max_bytes));
    json_t *m = json_object_get(root, "metadata");
    if (!m)
        return PARLEY_OK;
    if (!json_is_object(m))
        return refuse(err, pstr_printf("message_json 'metadata': must be a JSON object"));
    if (!(*metadata = json_dumps_whole(m, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        return PARLEY_ERR_NO_MEMORY;
    if (strlen(*metadata) > max_bytes)
        return refuse(err, pstr_printf("message_json 'metadata': %zu bytes, more than "
                                       "max_input_bytes (%zu)", strlen(*metadata), max_bytes));
    return PARLEY_OK;
}

/* The turn's one message, recorded as a model turn records its messages (turn.h). */
static parley_status record_the_message(turn *t, const char *role, const char *content)
{
    pbuf_puts(&t->rec.messages, "{\"role\":");
    pbuf_json_string(&t->rec.messages, role, strlen(role));
    pbuf_puts(&t->rec.messages, ",\"content\":");
    pbuf_json_string(&t->rec.messages, content, strlen(content));
    pbuf_putc(&t->rec.messages, '}');
    t->rec.index = calloc(1, sizeof *t->rec.index);
    if (t->rec.messages.oom || !t->rec.index || !(t->rec.answer = strdup(content)))
        return PARLEY_ERR_NO_MEMORY;
    turn_message *m = &t->rec.index[0];
    m->offset = 0;
    m->len = t->rec.messages.len;
    m->role = strcmp(role, "system") == 0 ? "system"   /* static, as turn.h wants */
              : strcmp(role, "user") == 0 ? "user"
                                          : "assistant";
    t->rec.index_cap = t->rec.nmessages = 1;
    return uuid4(m->id) == 0 ? PARLEY_OK : PARLEY_ERR_INVALID_INPUT; /* no randomness */
}

/* Everything the turn keeps: PARLEY_OK, INVALID_INPUT (refused, *err) or NO_MEMORY. */
static parley_status build(turn *t, agent_config *cfg, const selector *sel, char **err)
{
    const char *role = NULL, *content = NULL;
    parley_status rc = check_message_keys(sel->root, (size_t)cfg->opts.max_input_bytes, &role,
                                          &content, &t->in.metadata, err);
    if (rc != PARLEY_OK)
        return rc;
    json_t *ts = json_object_get(sel->root, "timestamp");
    if (ts && (!json_is_string(ts) || strlen(json_string_value(ts)) != json_string_length(ts)))
        return refuse(err, pstr_printf("message_json 'timestamp': must be a string, an RFC 3339 "
                                       "time"));
    rc = turn_set_host_time(t, json_string_value(ts), "message_json 'timestamp'", err);
    if (rc != PARLEY_OK)
        return rc;
    const char *persona = sel->key.persona;
    if (*persona) {
        rc = persona_check_name(&cfg->personas, persona, 0, "message_json 'persona'", err);
        if (rc != PARLEY_OK)
            return rc;
        t->conv.persona_def = persona_find(&cfg->personas, persona);
        if (!(t->conv.persona_name = strdup(persona)))
            return PARLEY_ERR_NO_MEMORY;
    }
    if (turn_apply_persona(t) != 0)
        return PARLEY_ERR_NO_MEMORY;
    t->conv.persona = t->conv.persona_name ? t->conv.persona_name : "";
    if (!(t->conv.conversation_id = strdup(sel->key.conversation_id)))
        return PARLEY_ERR_NO_MEMORY;
    t->conv.interface_type = "";
    if (*sel->key.interface_type) {
        if (!(t->conv.own_interface_type = strdup(sel->key.interface_type)))
            return PARLEY_ERR_NO_MEMORY;
        t->conv.interface_type = t->conv.own_interface_type;
    }
    if (sel->interface_message_id &&
        !(t->in.interface_message_id = strdup(sel->interface_message_id)))
        return PARLEY_ERR_NO_MEMORY;
    rc = record_the_message(t, role, content);
    if (rc == PARLEY_OK && uuid4(t->turn_id) != 0)
        rc = PARLEY_ERR_INVALID_INPUT;
    if (rc == PARLEY_ERR_INVALID_INPUT)
        *err = pstr_printf("no randomness available for a message id");
    return rc;
}

turn *turn_append_accept(agent_config *cfg, parley_request_id id, const char *message_json,
                         parley_done_fn done, void *user_data, parley_status *status, char **err)
{
    *err = NULL;
    *status = PARLEY_ERR_INVALID_INPUT;
    if (!done) {
        *err = pstr_printf("done callback is required");
        return NULL;
    }
    selector sel;
    char *serr = NULL;
    parley_status sst = selector_parse(
        message_json, SELECTOR_INTERFACE_MESSAGE_ID | SELECTOR_OTHER_KEYS, &sel, &serr);
    if (sst != PARLEY_OK) {
        *err = sst == PARLEY_ERR_NO_MEMORY ? NULL : pstr_printf("message_json: %s", serr);
        *status = *err ? sst : PARLEY_ERR_NO_MEMORY;
        free(serr);
        return NULL;
    }
    turn *t = calloc(1, sizeof *t);
    if (!t) {
        selector_free(&sel);
        *status = PARLEY_ERR_NO_MEMORY;
        *err = pstr_printf("out of memory");
        return NULL;
    }
    t->append = 1;
    t->cfg = config_ref(cfg);
    t->host.done = done;
    t->host.user_data = user_data;
    t->deadline = (ptimer)PTIMER_INIT(t);
    t->wait = (ptimer)PTIMER_INIT(t);
    parley_status rc = build(t, cfg, &sel, err);
    selector_free(&sel);
    if (rc != PARLEY_OK) {
        *status = rc;
        if (rc == PARLEY_ERR_NO_MEMORY && !*err)
            *err = pstr_printf("out of memory");
        turn_free(t);
        return NULL;
    }
    t->accepted_mono_ms = clock_mono_ms(); /* turn_timeout_ms counts from here, as for a turn */
    t->id = id;
    *status = PARLEY_OK;
    return t;
}
