/*
 * fuzz_jsonl.c -- the --jsonl line parser on arbitrary input, split into
 * lines as parley-host's reader splits stdin.  Whatever a host or a test
 * feeds the shim, each line must come out as exactly one well-formed
 * description (docs/shim.md, "JSONL mode"), never a crash or a leak.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Relative: parley_fuzz_target adds no include directory for host-shim. */
#include "../../host-shim/jsonl_parse.h"

/* A failed check aborts, which libFuzzer reports with the input. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The shim prints these strings through jansson, which refuses invalid
 * UTF-8 (output.c would then repair it: the answer would not say what the
 * parser meant). */
static int valid_utf8(const char *s) {
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

static int opt_utf8(const char *s) {
    return !s || valid_utf8(s);
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* ---- exactly one kind: the members of the other kinds stay empty -------- */

static int invalid_empty(const struct jsonl_invalid *v) {
    return !v->message && !v->op;
}

static int turn_empty(const struct jsonl_turn *t) {
    return !t->text && !t->conversation_id && !t->language && !t->device_id &&
           !t->satellite_id && !t->agent_id && !t->extra_system_prompt && !t->context_json &&
           !t->tools_json && !t->interface_message_id && !t->metadata_json && !t->reply_to_json;
}

static int op_empty(const struct jsonl_op *o) {
    return o->kind == 0 && !o->name && !o->id && !o->value && o->num == 0;
}

/* ---- per kind ----------------------------------------------------------- */

static void check_invalid(const struct jsonl_invalid *v) {
    CHECK(v->message && v->message[0]);
    CHECK(valid_utf8(v->message));
    CHECK(opt_utf8(v->op));
}

/* json: compact JSON the parser produced; it must re-parse to a value of the
 * wanted type, equal to `orig`, and serialize back to the same text. */
static void check_dump(const char *json, json_t *orig, int want_object) {
    if (!json) {
        CHECK(!orig || json_is_null(orig));
        return;
    }
    json_error_t je;
    json_t *v = json_loads(json, 0, &je);
    CHECK(v != NULL);
    CHECK(want_object ? json_is_object(v) : json_is_array(v));
    CHECK(json_equal(v, orig));
    char *again = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(again && strcmp(again, json) == 0);
    free(again);
    json_decref(v);
}

static void check_str(const char *got, json_t *obj, const char *key) {
    const char *want = json_string_value(json_object_get(obj, key));
    CHECK((!got && !want) || (got && want && strcmp(got, want) == 0));
    CHECK(opt_utf8(got));
}

/* obj: the line decoded independently, as a cross-check. */
static void check_turn(const struct jsonl_turn *t, json_t *obj) {
    CHECK(t->text != NULL);
    CHECK(!json_object_get(obj, "op"));
    check_str(t->text, obj, "text");
    check_str(t->conversation_id, obj, "conversation_id");
    check_str(t->language, obj, "language");
    check_str(t->device_id, obj, "device_id");
    check_str(t->satellite_id, obj, "satellite_id");
    check_str(t->agent_id, obj, "agent_id");
    check_str(t->extra_system_prompt, obj, "extra_system_prompt");
    check_dump(t->context_json, json_object_get(obj, "context"), 1);
    check_dump(t->tools_json, json_object_get(obj, "tools"), 0);
    check_str(t->interface_message_id, obj, "interface_message_id");
    check_dump(t->metadata_json, json_object_get(obj, "metadata"), 1);
    check_dump(t->reply_to_json, json_object_get(obj, "reply_to"), 1);
}

static void check_op(const struct jsonl_op *o, json_t *obj) {
    static const char *const names[] = {"history", "turn",   "list",  "clear",
                                        "metrics", "wait",   "cancel", "sleep",
                                        "update_options", "query", "message", "find",
                                        "set_interface_message_id", "append"};
    CHECK((size_t)o->kind < sizeof names / sizeof names[0]);
    CHECK(o->name && strcmp(o->name, names[o->kind]) == 0);
    CHECK(strcmp(json_string_value(json_object_get(obj, "op")), o->name) == 0);
    switch (o->kind) {
    case JSONL_OP_HISTORY:
    case JSONL_OP_TURN:
    case JSONL_OP_MESSAGE:
    case JSONL_OP_QUERY: /* query, find, append: the line without "op", for the plugin */
    case JSONL_OP_FIND:
    case JSONL_OP_APPEND:
        CHECK(o->id && valid_utf8(o->id) && o->num == 0);
        break;
    case JSONL_OP_SET_INTERFACE_MESSAGE_ID: /* both strings, as given */
        check_str(o->id, obj, "turn_id");
        check_str(o->value, obj, "interface_message_id");
        CHECK(o->id && o->value && o->num == 0);
        break;
    case JSONL_OP_CLEAR:
        CHECK(opt_utf8(o->id) && o->num == 0);
        break;
    case JSONL_OP_CANCEL:
        CHECK(!o->id && o->num >= 1);
        break;
    case JSONL_OP_SLEEP:
        CHECK(!o->id && o->num >= 0 && o->num <= JSONL_SLEEP_MAX_MS);
        break;
    default:
        CHECK(!o->id && o->num == 0);
        break;
    }
    CHECK(o->kind == JSONL_OP_SET_INTERFACE_MESSAGE_ID || !o->value);
}

/* ---- one line ------------------------------------------------------------- */

static void check_line(const char *line, size_t len) {
    struct jsonl_line l;
    if (jsonl_parse_line(line, len, &l) < 0) {
        /* Out of memory: nothing half-built is left behind. */
        CHECK(l.kind == 0 && invalid_empty(&l.invalid) && turn_empty(&l.turn) && op_empty(&l.op));
        jsonl_line_free(&l);
        return;
    }
    CHECK((l.kind == JSONL_BLANK) == is_blank(line, len));
    CHECK(l.kind == JSONL_INVALID ? !invalid_empty(&l.invalid) : invalid_empty(&l.invalid));
    CHECK(l.kind == JSONL_TURN || turn_empty(&l.turn));
    CHECK(l.kind == JSONL_OP || op_empty(&l.op));

    /* A turn or an op is always one JSON object without duplicate keys. */
    json_t *obj = NULL;
    if (l.kind == JSONL_TURN || l.kind == JSONL_OP) {
        json_error_t je;
        obj = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
        CHECK(json_is_object(obj));
    }
    switch (l.kind) {
    case JSONL_BLANK:
        break;
    case JSONL_INVALID:
        check_invalid(&l.invalid);
        break;
    case JSONL_TURN:
        check_turn(&l.turn, obj);
        break;
    case JSONL_OP:
        check_op(&l.op, obj);
        break;
    default:
        CHECK(!"unknown kind");
    }
    json_decref(obj);
    jsonl_line_free(&l);
    CHECK(l.invalid.message == NULL && l.turn.text == NULL && l.op.id == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    /* As lr_next: lines end at '\n', one '\r' before it is dropped, and an
     * unterminated last line counts (an empty one does not). */
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (len > 0 && p[len - 1] == '\r')
            len--;
        /* An exact-size copy, so ASan sees any read past the line. */
        char *line = malloc(len ? len : 1);
        if (!line)
            return 0;
        memcpy(line, p, len);
        check_line(line, len);
        free(line);
        p = nl ? nl + 1 : end;
    }
    return 0;
}
