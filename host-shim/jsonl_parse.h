/*
 * jsonl_parse.h -- the pure half of the --jsonl driver: one input line in, a
 * validated, self-contained description of what it asks for out.  No I/O, no
 * globals, no plugin calls, so it can be tested and fuzzed on its own;
 * jsonl.c performs what the description says (docs/shim.md, "JSONL mode").
 */
#ifndef PARLEY_HOST_JSONL_PARSE_H
#define PARLEY_HOST_JSONL_PARSE_H

#include <stddef.h>

enum jsonl_kind {
    JSONL_BLANK,   /* only spaces, tabs, CRs: no answer at all */
    JSONL_INVALID, /* answered with an invalid_input error */
    JSONL_TURN,    /* a conversation turn for async_process */
    JSONL_OP,      /* a control line ("op") */
};

enum jsonl_op_kind {
    JSONL_OP_HISTORY,
    JSONL_OP_TURN,
    JSONL_OP_LIST,
    JSONL_OP_CLEAR,
    JSONL_OP_METRICS,
    JSONL_OP_WAIT,
    JSONL_OP_CANCEL,
    JSONL_OP_SLEEP,
    JSONL_OP_UPDATE_OPTIONS,
    JSONL_OP_QUERY,
    JSONL_OP_MESSAGE,
    JSONL_OP_FIND,
    JSONL_OP_SET_INTERFACE_MESSAGE_ID,
    JSONL_OP_APPEND,
    JSONL_OP_PERSONA_PUT,    /* id: the name; json: the persona's settings */
    JSONL_OP_PERSONA_REMOVE, /* id: the name */
};

/* Longest "ms" a sleep op accepts: one day. */
#define JSONL_SLEEP_MAX_MS 86400000

struct jsonl_invalid {
    /* What is wrong, e.g. "unknown key \"x\"": valid UTF-8, never empty.
     * The shim prints it as "line N: <message>". */
    char *message;
    /* The "op" string as given when the line is an op line (even an unknown
     * op): the answer is then an op reply echoing it.  NULL: an error line. */
    char *op;
};

/* Exactly what the shim puts in parley_input.  NULL: absent or null. */
struct jsonl_turn {
    char *text; /* never NULL */
    char *conversation_id;
    char *language;
    char *device_id;
    char *satellite_id;
    char *agent_id;
    char *extra_system_prompt;
    char *interface_type;
    char *context_json; /* a JSON object, serialized compactly */
    char *tools_json;   /* a JSON array, serialized compactly */
    char *persona;
    char *images_json; /* a JSON array ({"url"} or {"path"}), serialized compactly */
    char *interface_message_id;
    char *metadata_json;        /* "metadata": a JSON object, serialized compactly */
    char *reply_to_json;        /* "reply_to": a JSON object, serialized compactly */
    char *response_format_json; /* "response_format": a JSON object, serialized compactly */
    char *timestamp;            /* RFC 3339: when the user said it (the plugin checks it) */
};

struct jsonl_op {
    enum jsonl_op_kind kind;
    const char *name; /* "history", "turn", ...: static, never freed */
    /* history: the conversation id, turn: the turn id, message: the message
     * id (never NULL); clear: the conversation id, or NULL for all; query,
     * find, append: the line without "op", compact JSON (the plugin checks
     * its keys); set_interface_message_id: the turn id; other ops: NULL. */
    char *id;
    /* set_interface_message_id: the interface_message_id (never NULL); else NULL. */
    char *value;
    /* cancel: the input line number of the turn (>= 1); sleep: milliseconds
     * (0..JSONL_SLEEP_MAX_MS); other ops: 0. */
    long long num;
    /* update_options: the "options" object, serialized compactly; history and
     * clear with a "persona": the selector {"conversation_id","persona"}; list
     * with a "filter": that object; else NULL. */
    char *json;
};

/* Only the member that `kind` names is filled; the others are zeroed. */
struct jsonl_line {
    enum jsonl_kind kind;
    struct jsonl_invalid invalid;
    struct jsonl_turn turn;
    struct jsonl_op op;
};

/* Classify and validate one input line (without its "\n" or "\r\n"; it may
 * hold any bytes, NULs included).  Returns 0 with *out filled, or -1 when out
 * of memory, with *out zeroed.  Free *out with jsonl_line_free either way. */
int jsonl_parse_line(const char *line, size_t len, struct jsonl_line *out);
void jsonl_line_free(struct jsonl_line *l);

#endif
