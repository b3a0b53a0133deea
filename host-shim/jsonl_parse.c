/*
 * jsonl_parse.c -- classify and validate one --jsonl input line.
 *
 * The checks run in the order the shim has always made them, and the first
 * problem found is the one reported, so every error message stays the same.
 * Everything the caller needs is copied out of the parsed JSON, which is
 * freed before returning.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jsonl_parse.h"
#include "utf8_repair.h"
/* For SHIM_JSON_COMPACT only: context and tools reach the plugin serialized
 * exactly as the shim prints JSON. */
#include "shim.h"

/* A problem found in a line: a message format with at most one %s, and its
 * argument.  fmt NULL: no problem. */
struct problem {
    const char *fmt;
    const char *arg;
};

/* ---- helpers --------------------------------------------------------------- */

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* *out = a copy of s, or NULL for NULL.  -1 when out of memory. */
static int dup_opt(const char *s, char **out)
{
    *out = s ? strdup(s) : NULL;
    return s && !*out ? -1 : 0;
}

static int set_invalid(struct jsonl_line *l, struct problem p)
{
    l->kind = JSONL_INVALID;
    if (asprintf(&l->invalid.message, p.fmt, p.arg) < 0) {
        l->invalid.message = NULL;
        return -1;
    }
    return 0;
}

/* ---- conversation lines --------------------------------------------------- */

/* The optional string keys of a turn line, in the order they are checked. */
static const struct str_field {
    const char *key;
    size_t off; /* of its char * in struct jsonl_turn */
} str_fields[] = {
    {"conversation_id", offsetof(struct jsonl_turn, conversation_id)},
    {"language", offsetof(struct jsonl_turn, language)},
    {"device_id", offsetof(struct jsonl_turn, device_id)},
    {"satellite_id", offsetof(struct jsonl_turn, satellite_id)},
    {"agent_id", offsetof(struct jsonl_turn, agent_id)},
    {"extra_system_prompt", offsetof(struct jsonl_turn, extra_system_prompt)},
    {"persona", offsetof(struct jsonl_turn, persona)},
    {"interface_type", offsetof(struct jsonl_turn, interface_type)},
    {"interface_message_id", offsetof(struct jsonl_turn, interface_message_id)},
    {"timestamp", offsetof(struct jsonl_turn, timestamp)},
};
#define NSTR (sizeof str_fields / sizeof str_fields[0])

static char **str_slot(struct jsonl_turn *t, size_t i)
{
    return (char **)((char *)t + str_fields[i].off);
}

static int known_turn_key(const char *key)
{
    if (strcmp(key, "text") == 0 || strcmp(key, "context") == 0 || strcmp(key, "tools") == 0 ||
        strcmp(key, "images") == 0 || strcmp(key, "metadata") == 0 ||
        strcmp(key, "reply_to") == 0 || strcmp(key, "response_format") == 0)
        return 1;
    for (size_t i = 0; i < NSTR; i++)
        if (strcmp(key, str_fields[i].key) == 0)
            return 1;
    return 0;
}

static struct problem turn_problem(json_t *obj)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!known_turn_key(key))
            return (struct problem){"unknown key \"%s\"", key};
    }
    json_t *text = json_object_get(obj, "text");
    if (!json_is_string(text))
        return (struct problem){"%s", text ? "\"text\" must be a string" : "\"text\" is required"};
    for (size_t i = 0; i < NSTR; i++) {
        v = json_object_get(obj, str_fields[i].key);
        if (v && !json_is_string(v) && !json_is_null(v))
            return (struct problem){"\"%s\" must be a string", str_fields[i].key};
    }
    v = json_object_get(obj, "context");
    if (v && !json_is_object(v) && !json_is_null(v))
        return (struct problem){"%s", "\"context\" must be an object"};
    /* what the object holds, the plugin checks (naming metadata_json / reply_to_json) */
    v = json_object_get(obj, "metadata");
    if (v && !json_is_object(v) && !json_is_null(v))
        return (struct problem){"%s", "\"metadata\" must be an object"};
    v = json_object_get(obj, "reply_to");
    if (v && !json_is_object(v) && !json_is_null(v))
        return (struct problem){"%s", "\"reply_to\" must be an object"};
    v = json_object_get(obj, "response_format");
    if (v && !json_is_object(v) && !json_is_null(v))
        return (struct problem){"%s", "\"response_format\" must be an object"};
    v = json_object_get(obj, "tools");
    if (v && !json_is_array(v) && !json_is_null(v))
        return (struct problem){"%s", "\"tools\" must be an array"};
    v = json_object_get(obj, "images");
    if (v && !json_is_array(v) && !json_is_null(v))
        return (struct problem){"%s", "\"images\" must be an array of {\"url\"} or {\"path\"}"};
    return (struct problem){NULL, NULL};
}

/* Compact JSON of v, or NULL when absent or null (its type is checked). */
static int dump_opt(json_t *v, char **out)
{
    int want = v && !json_is_null(v);
    *out = want ? json_dumps(v, SHIM_JSON_COMPACT) : NULL;
    return want && !*out ? -1 : 0;
}

/* Copy a valid turn line out of obj. */
static int build_turn(json_t *obj, struct jsonl_turn *t)
{
    if (dup_opt(json_string_value(json_object_get(obj, "text")), &t->text) < 0)
        return -1;
    for (size_t i = 0; i < NSTR; i++)
        if (dup_opt(json_string_value(json_object_get(obj, str_fields[i].key)), str_slot(t, i)) < 0)
            return -1;
    if (dump_opt(json_object_get(obj, "context"), &t->context_json) < 0)
        return -1;
    if (dump_opt(json_object_get(obj, "images"), &t->images_json) < 0)
        return -1;
    if (dump_opt(json_object_get(obj, "metadata"), &t->metadata_json) < 0 ||
        dump_opt(json_object_get(obj, "reply_to"), &t->reply_to_json) < 0 ||
        dump_opt(json_object_get(obj, "response_format"), &t->response_format_json) < 0)
        return -1;
    return dump_opt(json_object_get(obj, "tools"), &t->tools_json);
}

static int parse_turn(json_t *obj, struct jsonl_line *l)
{
    struct problem p = turn_problem(obj);
    if (p.fmt)
        return set_invalid(l, p);
    l->kind = JSONL_TURN;
    return build_turn(obj, &l->turn);
}

/* ---- control lines ------------------------------------------------------- */

static const struct op_def {
    const char *name;
    enum jsonl_op_kind kind;
    const char *arg; /* the one key besides "op" it accepts, or NULL; "*": any keys */
} ops[] = {
    {"history", JSONL_OP_HISTORY, "conversation_id"},
    {"turn", JSONL_OP_TURN, "turn_id"},
    {"list", JSONL_OP_LIST, "filter"},
    {"clear", JSONL_OP_CLEAR, "conversation_id"},
    {"metrics", JSONL_OP_METRICS, NULL},
    {"wait", JSONL_OP_WAIT, NULL},
    {"cancel", JSONL_OP_CANCEL, "seq"},
    {"sleep", JSONL_OP_SLEEP, "ms"},
    {"update_options", JSONL_OP_UPDATE_OPTIONS, "options"},
    {"query", JSONL_OP_QUERY, "*"},
    {"message", JSONL_OP_MESSAGE, "message_id"},
    {"find", JSONL_OP_FIND, "*"},
    {"set_interface_message_id", JSONL_OP_SET_INTERFACE_MESSAGE_ID, "turn_id"},
    {"append", JSONL_OP_APPEND, "*"},
    {"persona_put", JSONL_OP_PERSONA_PUT, "name"},
    {"persona_remove", JSONL_OP_PERSONA_REMOVE, "name"},
};

static const struct op_def *find_op(const char *name)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(ops[i].name, name) == 0)
            return &ops[i];
    return NULL;
}

/* What is wrong with the op's argument: a format naming def->arg, or NULL. */
static const char *op_arg_problem(const struct op_def *def, json_t *arg)
{
    switch (def->kind) {
    case JSONL_OP_HISTORY:
    case JSONL_OP_TURN:
    case JSONL_OP_MESSAGE:
    case JSONL_OP_SET_INTERFACE_MESSAGE_ID:
    case JSONL_OP_PERSONA_PUT:
    case JSONL_OP_PERSONA_REMOVE:
        return json_is_string(arg) ? NULL : "\"%s\" must be a string";
    case JSONL_OP_CLEAR:
        return !arg || json_is_string(arg) || json_is_null(arg) ? NULL
                                                                : "\"%s\" must be a string or null";
    case JSONL_OP_CANCEL:
        return json_is_integer(arg) && json_integer_value(arg) >= 1
                   ? NULL
                   : "\"%s\" must be a positive integer";
    case JSONL_OP_SLEEP:
        return json_is_integer(arg) && json_integer_value(arg) >= 0 &&
                       json_integer_value(arg) <= JSONL_SLEEP_MAX_MS
                   ? NULL
                   : "\"%s\" must be an integer from 0 to 86400000";
    case JSONL_OP_UPDATE_OPTIONS:
        return json_is_object(arg) ? NULL : "\"%s\" must be an object";
    case JSONL_OP_LIST:
        return !arg || json_is_null(arg) || json_is_object(arg)
                   ? NULL
                   : "\"%s\" must be an object or null";
    default:
        return NULL;
    }
}

/* history and clear also take "persona" and "interface_type": the conversation under
 * that key (history_get_by / history_clear_by; clear: persona "*" = under every persona). */
static int takes_persona(const struct op_def *def)
{
    return def->kind == JSONL_OP_HISTORY || def->kind == JSONL_OP_CLEAR;
}

static struct problem op_problem(json_t *obj, const char *name, const struct op_def *def)
{
    if (!def)
        return (struct problem){"unknown op \"%s\"", name};
    if (def->arg && strcmp(def->arg, "*") == 0)
        return (struct problem){NULL, NULL}; /* the plugin checks every key */
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (takes_persona(def) &&
            (strcmp(key, "persona") == 0 || strcmp(key, "interface_type") == 0)) {
            if (!json_is_string(v))
                return (struct problem){"\"%s\" must be a string", key};
            if (!json_is_string(json_object_get(obj, def->arg)))
                return (struct problem){strcmp(key, "persona") == 0
                                            ? "\"persona\" needs a \"%s\""
                                            : "\"interface_type\" needs a \"%s\"",
                                        def->arg};
            continue;
        }
        if (def->kind == JSONL_OP_SET_INTERFACE_MESSAGE_ID &&
            strcmp(key, "interface_message_id") == 0)
            continue; /* its second key, checked below */
        if (def->kind == JSONL_OP_PERSONA_PUT && strcmp(key, "persona") == 0)
            continue; /* its second key, checked below */
        if (strcmp(key, "op") != 0 && (!def->arg || strcmp(key, def->arg) != 0))
            return (struct problem){"unknown key \"%s\"", key};
    }
    if (def->kind == JSONL_OP_SET_INTERFACE_MESSAGE_ID &&
        !json_is_string(json_object_get(obj, "interface_message_id")))
        return (struct problem){"\"%s\" must be a string", "interface_message_id"};
    if (def->kind == JSONL_OP_PERSONA_PUT && !json_is_object(json_object_get(obj, "persona")))
        return (struct problem){"\"%s\" must be an object (the persona's settings)", "persona"};
    json_t *arg = def->arg ? json_object_get(obj, def->arg) : NULL;
    return (struct problem){op_arg_problem(def, arg), def->arg};
}

static int parse_op(json_t *obj, json_t *jop, struct jsonl_line *l)
{
    /* Not even an op name to echo: a plain error line. */
    if (!json_is_string(jop))
        return set_invalid(l, (struct problem){"%s", "\"op\" must be a string"});
    const char *name = json_string_value(jop);
    const struct op_def *def = find_op(name);
    struct problem p = op_problem(obj, name, def);
    if (p.fmt)
        return set_invalid(l, p) < 0 ? -1 : dup_opt(name, &l->invalid.op);

    l->kind = JSONL_OP;
    l->op.kind = def->kind;
    l->op.name = def->name;
    if (def->kind == JSONL_OP_QUERY || def->kind == JSONL_OP_FIND || def->kind == JSONL_OP_APPEND) {
        json_object_del(obj, "op");
        return (l->op.id = json_dumps(obj, SHIM_JSON_COMPACT)) ? 0 : -1;
    }
    json_t *arg = def->arg ? json_object_get(obj, def->arg) : NULL;
    if (def->kind == JSONL_OP_SET_INTERFACE_MESSAGE_ID &&
        dup_opt(json_string_value(json_object_get(obj, "interface_message_id")), &l->op.value) < 0)
        return -1;
    if (def->kind == JSONL_OP_PERSONA_PUT &&
        !(l->op.json = json_dumps(json_object_get(obj, "persona"), SHIM_JSON_COMPACT)))
        return -1;
    if (takes_persona(def) &&
        (json_object_get(obj, "persona") || json_object_get(obj, "interface_type"))) {
        /* a selector */
        json_object_del(obj, "op");
        if (!(l->op.json = json_dumps(obj, SHIM_JSON_COMPACT)))
            return -1;
    }
    l->op.num = json_integer_value(arg); /* 0 unless an integer */
    if (json_is_object(arg) && !(l->op.json = json_dumps(arg, SHIM_JSON_COMPACT)))
        return -1;
    return dup_opt(json_string_value(arg), &l->op.id);
}

/* ---- lines --------------------------------------------------------------- */

static int decode_error(struct jsonl_line *l, const char *text)
{
    l->kind = JSONL_INVALID;
    l->invalid.message = utf8_repaired(text, strlen(text), NULL);
    return l->invalid.message ? 0 : -1;
}

static int parse_nonblank(const char *line, size_t len, struct jsonl_line *l)
{
    /* DECODE_ANY: any other value is "not a JSON object", not a syntax error. */
    json_error_t je;
    json_t *obj = json_loadb(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!obj && (je.text[0] == '\0' || json_error_code(&je) == json_error_out_of_memory))
        return -1; /* out of memory (an empty text: jansson's first allocation failed) */
    if (!obj)
        return decode_error(l, je.text);
    json_t *jop = json_object_get(obj, "op");
    int rc;
    if (!json_is_object(obj))
        rc = set_invalid(l, (struct problem){"%s", "not a JSON object"});
    else if (jop)
        rc = parse_op(obj, jop, l);
    else
        rc = parse_turn(obj, l);
    json_decref(obj);
    return rc;
}

int jsonl_parse_line(const char *line, size_t len, struct jsonl_line *out)
{
    memset(out, 0, sizeof *out);
    if (blank(line, len)) {
        out->kind = JSONL_BLANK;
        return 0;
    }
    if (parse_nonblank(line, len, out) < 0) {
        jsonl_line_free(out);
        return -1;
    }
    return 0;
}

void jsonl_line_free(struct jsonl_line *l)
{
    free(l->invalid.message);
    free(l->invalid.op);
    free(l->turn.text);
    for (size_t i = 0; i < NSTR; i++)
        free(*str_slot(&l->turn, i));
    free(l->turn.context_json);
    free(l->turn.tools_json);
    free(l->turn.images_json);
    free(l->turn.metadata_json);
    free(l->turn.reply_to_json);
    free(l->turn.response_format_json);
    free(l->op.id);
    free(l->op.value);
    free(l->op.json);
    memset(l, 0, sizeof *l);
}
