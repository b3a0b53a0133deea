/*
 * turn_input.c -- the first step of a turn, on the host thread inside
 * async_process: validate the input, copy what the turn keeps, and resolve
 * which conversation (history key) it belongs to.  Nothing here touches the
 * worker, the store or the network.
 */
#include "turn/turn_input.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "lib/json_oom.h"
#include "lib/utf8.h"

/* A conversation id or an interface type: 1..256 bytes of UTF-8, no control characters. */
static int valid_key_part(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > STORE_MAX_CONVERSATION_ID || !utf8_valid(id, n))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

/* Copy an optional text field, checking it is UTF-8 and not too long. */
static parley_status copy_field(const char *name, const char *src, size_t max, char **dst,
                                char **err)
{
    *dst = NULL;
    if (!src)
        return PARLEY_OK;
    size_t n = strlen(src);
    if (n > max) {
        *err = pstr_printf("input '%s': %zu bytes, more than max_input_bytes (%zu)", name, n, max);
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (!utf8_valid(src, n)) {
        *err = pstr_printf("input '%s': not valid UTF-8", name);
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (!(*dst = strdup(src))) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}

/* A JSON object given as text, compacted (what the store keeps verbatim). */
static parley_status compact_object(const char *name, const char *text, char **out, char **err)
{
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(v)) {
        *err = pstr_printf("input '%s': must be a JSON object%s%s", name, v ? "" : ": ",
                           v ? "" : utf8_mend(jerr.text));
        json_decref(v);
        return PARLEY_ERR_INVALID_INPUT;
    }
    *out = json_dumps_whole(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(v);
    if (!*out) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}

/* What identifies the user's message (metadata, the interface's id) and what it replies to. */
static parley_status copy_identity(turn *t, size_t max, const parley_input *in, char **err)
{
    if (in->metadata_json) {
        char *given = NULL;
        parley_status rc = copy_field("metadata_json", in->metadata_json, max, &given, err);
        if (rc == PARLEY_OK)
            rc = compact_object("metadata_json", given, &t->in.metadata, err);
        free(given);
        if (rc != PARLEY_OK)
            return rc;
    }
    if (in->interface_message_id) {
        size_t n = strlen(in->interface_message_id);
        if (n == 0 || n > STORE_MAX_INTERFACE_MESSAGE_ID ||
            !utf8_valid(in->interface_message_id, n)) {
            *err = pstr_printf("input 'interface_message_id': must be 1 to %d bytes of UTF-8",
                               STORE_MAX_INTERFACE_MESSAGE_ID);
            return PARLEY_ERR_INVALID_INPUT;
        }
        if (!(t->in.interface_message_id = strdup(in->interface_message_id))) {
            *err = pstr_printf("out of memory");
            return PARLEY_ERR_NO_MEMORY;
        }
    }
    if (in->reply_to_json) {
        size_t n = strlen(in->reply_to_json);
        if (n > max) {
            *err = pstr_printf("input 'reply_to_json': %zu bytes, more than max_input_bytes (%zu)",
                               n, max);
            return PARLEY_ERR_INVALID_INPUT;
        }
        return reply_context_parse(in->reply_to_json, &t->in.reply, err);
    }
    return PARLEY_OK;
}

static parley_status copy_input(turn *t, const agent_config *cfg, const parley_input *in,
                                char **err)
{
    size_t max = (size_t)cfg->opts.max_input_bytes;
    if (!in->text || (!*in->text && !in->images_json)) { /* images_json: a photo, no caption */
        *err = pstr_printf("input 'text': required, and must not be empty (it may be \"\" "
                           "only when images_json shows images)");
        return PARLEY_ERR_INVALID_INPUT;
    }
    const struct { const char *name, *src; char **dst; } fields[] = {
        {"text", in->text, &t->in.text},
        {"language", in->language, &t->in.language},
        {"device_id", in->device_id, &t->in.device_id},
        {"satellite_id", in->satellite_id, &t->in.satellite_id},
        {"agent_id", in->agent_id, &t->in.agent_id},
        {"extra_system_prompt", in->extra_system_prompt, &t->in.extra_system_prompt},
        {"context_json", in->context_json, &t->in.context_json},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        parley_status rc = copy_field(fields[i].name, fields[i].src, max, fields[i].dst, err);
        if (rc != PARLEY_OK)
            return rc;
    }
    if (t->in.context_json) {
        json_error_t jerr;
        json_t *ctx = json_loads(t->in.context_json, 0, &jerr);
        int ok = json_is_object(ctx);
        json_decref(ctx);
        if (!ok) {
            *err = pstr_printf("input 'context_json': must be a JSON object%s%s", ctx ? "" : ": ",
                       ctx ? "" : utf8_mend(jerr.text));
            return PARLEY_ERR_INVALID_INPUT;
        }
    }
    parley_status rc = copy_identity(t, max, in, err);
    if (rc == PARLEY_OK)
        rc = turn_set_host_time(t, in->timestamp, "input 'timestamp'", err);
    if (rc != PARLEY_OK)
        return rc;
    const toolset *base =
        t->conv.persona_def && t->conv.persona_def->tools ? t->conv.persona_def->tools : cfg->tools;
    t->in.tools = base;
    if (in->tools_json) {
        char *terr = NULL;
        parley_status st = toolset_parse(in->tools_json, base, &t->in.own_tools, &terr);
        if (st != PARLEY_OK) {
            *err = pstr_printf("input 'tools_json': %s", terr ? terr : "out of memory");
            free(terr);
            return st;
        }
        t->in.tools = t->in.own_tools;
    }
    return PARLEY_OK;
}

/* extra_body keys that carry a response format: the input's would collide with them. */
static const char *extra_body_format_key(const char *extra_body)
{
    static const char *const keys[] = {"response_format", "format", "output_config", NULL};
    json_t *extra = extra_body ? json_loads(extra_body, 0, NULL) : NULL;
    const char *found = NULL;
    for (int i = 0; extra && !found && keys[i]; i++)
        if (json_object_get(extra, keys[i]))
            found = keys[i];
    json_decref(extra);
    return found;
}

/*
 * The answer's form (structured output): parsed and its schema checked here,
 * so a bad schema is the host's error now rather than the server's later.
 * Its name also names Anthropic's answer tool: it must not be a tool's.
 */
static parley_status accept_response_format(turn *t, const agent_config *cfg,
                                            const parley_input *in, char **err)
{
    if (!in->response_format_json)
        return PARLEY_OK;
    size_t n = strlen(in->response_format_json), max = (size_t)cfg->opts.max_input_bytes;
    if (n > max) {
        *err = pstr_printf("input 'response_format_json': %zu bytes, more than max_input_bytes "
                           "(%zu)", n, max);
        return PARLEY_ERR_INVALID_INPUT;
    }
    char *why = NULL;
    parley_status st = response_format_parse(in->response_format_json, &t->in.format, &why);
    if (st != PARLEY_OK) {
        *err = pstr_printf("input 'response_format_json': %s", why ? why : "out of memory");
        free(why);
        return st;
    }
    if (toolset_has(t->in.tools, t->in.format->name)) {
        *err = pstr_printf("input 'response_format_json': name '%s' is also a tool's; name the "
                           "response format otherwise", t->in.format->name);
        return PARLEY_ERR_INVALID_INPUT;
    }
    const char *key = extra_body_format_key(t->opts->extra_body);
    if (key) {
        *err = pstr_printf("input 'response_format_json': the extra_body option sets '%s' "
                           "already; remove it there to give the format per turn", key);
        return PARLEY_ERR_INVALID_INPUT;
    }
    return PARLEY_OK;
}

/* The tool the tool_choice option names must be one this turn offers (a persona's
   tools are a subset of the agent's). */
static parley_status check_tool_choice(const turn *t, char **err)
{
    const char *c = t->opts->tool_choice;
    if (strcmp(c, "auto") == 0 || strcmp(c, "none") == 0 || strcmp(c, "required") == 0 ||
        toolset_has(t->in.tools, c))
        return PARLEY_OK;
    *err = pstr_printf("option 'tool_choice' names the tool '%s', which this turn does not "
                       "offer (persona '%s' has no such tool)", c,
                       t->conv.persona_name ? t->conv.persona_name : "");
    return PARLEY_ERR_INVALID_INPUT;
}

/* The persona the input names (one of the `personas` option's), or none. */
static parley_status resolve_persona(turn *t, const agent_config *cfg, const parley_input *in,
                                     char **err)
{
    if (in->persona && *in->persona) {
        parley_status rc = persona_check_name(&cfg->personas, in->persona, 0, "input 'persona'",
                                              err);
        if (rc != PARLEY_OK)
            return rc;
        t->conv.persona_def = persona_find(&cfg->personas, in->persona);
        if (!(t->conv.persona_name = strdup(in->persona))) {
            *err = pstr_printf("out of memory");
            return PARLEY_ERR_NO_MEMORY;
        }
    }
    if (turn_apply_persona(t) != 0) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}

/* The input's images, checked before anything is sent or stored. */
static parley_status accept_images(turn *t, const agent_config *cfg, const parley_input *in,
                                   char **err)
{
    if (!in->images_json)
        return PARLEY_OK;
    image_limits lim = {(size_t)cfg->opts.max_image_bytes, (size_t)cfg->opts.max_images_per_turn};
    /* Bound the text before parsing it: every image at its largest, as base64, plus room. */
    size_t most = lim.max_images * (lim.max_bytes / 3 * 4 + 4 + 4096) + 64;
    size_t len = strlen(in->images_json);
    if (len > most) {
        *err = pstr_printf("input 'images_json': %zu bytes, more than max_images_per_turn images "
                           "of max_image_bytes could need (%zu)", len, most);
        return PARLEY_ERR_INVALID_INPUT;
    }
    parley_status rc = image_list_parse(in->images_json, &lim, &t->in.images, err);
    for (size_t i = 0; rc == PARLEY_OK && i < t->in.images.n; i++) {
        if (!t->in.images.items[i].base64 && !cfg->prov->images_by_url) {
            *err = pstr_printf("input 'images_json': image %zu: provider %s cannot be sent an "
                               "image by URL (only as base64 data); give it as a data: URL",
                               i + 1, cfg->prov->name);
            rc = PARLEY_ERR_INVALID_INPUT;
        }
    }
    return rc;
}

/*
 * The conversation this turn belongs to: given, minted, or none (stateless).
 * Its history key is the id qualified by persona and interface (store.h);
 * both are "" until the input carries them.
 */
static parley_status resolve_conversation(turn *t, const agent_config *cfg,
                                          const parley_input *in, char **err)
{
    if (in->conversation_id) {
        if (!valid_key_part(in->conversation_id)) {
            *err = pstr_printf("input 'conversation_id': must be 1 to %d bytes of UTF-8 without control "
                       "characters", STORE_MAX_CONVERSATION_ID);
            return PARLEY_ERR_INVALID_INPUT;
        }
        t->conv.conversation_id = strdup(in->conversation_id);
    } else if (cfg->opts.auto_create_conversation_id) {
        char id[UUID_STR_LEN];
        if (uuid4(id) != 0) {
            *err = pstr_printf("no randomness available for a conversation id");
            return PARLEY_ERR_INVALID_INPUT;
        }
        t->conv.conversation_id = strdup(id);
    } else if (reply_context_wanted(&t->in.reply)) {
        *err = pstr_printf("input 'reply_to_json': a turn without a conversation (no "
                           "conversation_id) has no earlier turn to reply to");
        return PARLEY_ERR_INVALID_INPUT;
    } else {
        return PARLEY_OK; /* stateless */
    }
    t->conv.persona = t->conv.persona_name ? t->conv.persona_name : "";
    t->conv.interface_type = "";
    if (!t->conv.conversation_id) {
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    if (in->interface_type && *in->interface_type) { /* "" is "no interface" */
        if (!valid_key_part(in->interface_type)) {
            *err = pstr_printf("input 'interface_type': must be 1 to %d bytes of UTF-8 without "
                               "control characters", STORE_MAX_CONVERSATION_ID);
            return PARLEY_ERR_INVALID_INPUT;
        }
        if (!(t->conv.own_interface_type = strdup(in->interface_type))) {
            *err = pstr_printf("out of memory");
            return PARLEY_ERR_NO_MEMORY;
        }
        t->conv.interface_type = t->conv.own_interface_type;
    }
    return PARLEY_OK;
}

turn *turn_input_accept(agent_config *cfg, parley_request_id id, const parley_input *in,
                        parley_done_fn done, void *user_data, parley_status *status, char **err)
{
    *err = NULL;
    *status = PARLEY_ERR_INVALID_INPUT;
    if (!in || in->struct_size < offsetof(parley_input, text) + sizeof in->text || !done) {
        *err = pstr_printf(!done ? "done callback is required" : "input is missing or too small");
        return NULL;
    }
    /* Read only the fields the host's struct has (it may be older than ours). */
    parley_input copy;
    memset(&copy, 0, sizeof copy);
    memcpy(&copy, in, in->struct_size < sizeof copy ? in->struct_size : sizeof copy);

    turn *t = calloc(1, sizeof *t);
    if (!t) {
        *status = PARLEY_ERR_NO_MEMORY;
        *err = pstr_printf("out of memory");
        return NULL;
    }
    t->cfg = config_ref(cfg);
    t->host.done = done;
    t->host.user_data = user_data;
    t->host.on_delta = copy.on_delta;
    t->host.on_reasoning = copy.on_reasoning;
    t->deadline = (ptimer)PTIMER_INIT(t);
    t->wait = (ptimer)PTIMER_INIT(t);
    parley_status rc = resolve_persona(t, cfg, &copy, err);
    if (rc == PARLEY_OK)
        rc = copy_input(t, cfg, &copy, err);
    if (rc == PARLEY_OK)
        rc = accept_images(t, cfg, &copy, err);
    if (rc == PARLEY_OK && !*t->in.text && !t->in.images.n) {
        *err = pstr_printf("input 'text': must not be empty when images_json shows no image");
        rc = PARLEY_ERR_INVALID_INPUT;
    }
    if (rc == PARLEY_OK)
        rc = accept_response_format(t, cfg, &copy, err);
    if (rc == PARLEY_OK)
        rc = check_tool_choice(t, err);
    if (rc == PARLEY_OK)
        rc = resolve_conversation(t, cfg, &copy, err);
    if (rc != PARLEY_OK) {
        *status = rc;
        goto fail;
    }
    if (uuid4(t->turn_id) != 0) {
        *err = pstr_printf("no randomness available for a turn id");
        goto fail;
    }
    t->accepted_mono_ms = clock_mono_ms(); /* turn_timeout_ms counts from here */
    t->id = id;
    *status = PARLEY_OK;
    return t;
fail:
    if (*status == PARLEY_ERR_INVALID_INPUT && !*err) /* the refusal's message: no memory */
        *status = PARLEY_ERR_NO_MEMORY;
    turn_free(t);
    return NULL;
}
