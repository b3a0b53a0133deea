/*
 * jsonl.c -- the --jsonl driver: one JSON object per input line, one JSON
 * line per answer.  seq is the 1-based input line number.
 *
 * Conversation lines become async turns; their result lines are written by
 * the done callback (on the plugin's worker thread, or on the main thread
 * during destroy), so with --concurrency > 1 they may come out of order.
 * Control lines ("op") are answered on this thread; most of them are
 * barriers that first wait for every submitted turn to be written, so tests
 * see deterministic snapshots.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* One submitted turn.  Two references: the reader's (until it has stored
 * the request id) and the done callback's, which may run before
 * async_process has even returned to us. */
struct turn {
    struct turn *prev, *next; /* in-flight list, under g_shim.mu */
    unsigned long seq;
    parley_request_id id;
    int refs;
    /* Written only by the delta callback, read by the done callback: both
     * on the plugin side of the turn, which orders them. */
    size_t ndeltas;
    char *streamed;
    size_t slen, scap;
};

/* Guarded by g_shim.mu. */
static struct turn *inflight;
static unsigned long in_flight;

static void link_turn(struct turn *t) {
    t->next = inflight;
    if (inflight)
        inflight->prev = t;
    inflight = t;
    in_flight++;
}

static void unlink_turn(struct turn *t) {
    if (t->prev)
        t->prev->next = t->next;
    else
        inflight = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
    in_flight--;
    pthread_cond_broadcast(&g_shim.cv);
}

static void free_turn(struct turn *t) {
    free(t->streamed);
    free(t);
}

/* Drop one reference; the caller holds g_shim.mu.  Returns the turn when it
 * must be freed (after unlocking). */
static struct turn *unref_locked(struct turn *t) {
    return --t->refs == 0 ? t : NULL;
}

/* ---- output lines -------------------------------------------------------- */

/* {"seq":N,"error":{...}}: a line that started no turn and is no op. */
static void error_line(unsigned long seq, json_t *error) {
    json_t *line = json_object();
    json_object_set_new(line, "seq", json_integer((json_int_t)seq));
    json_object_set_new(line, "error", error);
    out_json_line(line);
    json_decref(line);
}

static char *line_msg(unsigned long seq, const char *fmt, const char *arg) {
    char *msg = NULL, *full = NULL;
    if (asprintf(&msg, fmt, arg) < 0)
        msg = NULL;
    if (asprintf(&full, "line %lu: %s", seq, msg ? msg : "invalid input") < 0)
        full = NULL;
    free(msg);
    return full;
}

static void invalid_line(unsigned long seq, const char *fmt, const char *arg) {
    char *msg = line_msg(seq, fmt, arg);
    error_line(seq, jerror_code("invalid_input", msg));
    free(msg);
}

/* {"seq":N,"op":..,"result":..,"error":..}; result and error are stolen. */
static void op_reply(unsigned long seq, const char *op, json_t *result, json_t *error) {
    json_t *line = json_object();
    json_object_set_new(line, "seq", json_integer((json_int_t)seq));
    json_object_set_new(line, "op", jstr(op));
    json_object_set_new(line, "result", result ? result : json_null());
    json_object_set_new(line, "error", error ? error : json_null());
    out_json_line(line);
    json_decref(line);
}

/* ---- plugin callbacks ----------------------------------------------------- */

static void on_delta(void *user_data, parley_request_id request_id, const char *text, size_t len) {
    (void)request_id;
    struct turn *t = user_data;
    t->ndeltas++;
    if (!text || len == 0)
        return;
    if (t->slen + len + 1 > t->scap) {
        size_t cap = t->scap ? t->scap : 256;
        while (cap < t->slen + len + 1)
            cap *= 2;
        char *n = realloc(t->streamed, cap);
        if (!n)
            return; /* keep what we have; the count still tells the truth */
        t->streamed = n;
        t->scap = cap;
    }
    memcpy(t->streamed + t->slen, text, len);
    t->slen += len;
}

static void on_done(void *user_data, const parley_result *r) {
    struct turn *t = user_data;
#define FIELD(f, dflt) (SHIM_HAS_FIELD(r, parley_result, f) ? r->f : (dflt))
    parley_status status = FIELD(status, PARLEY_ERR_INTERNAL);
    json_t *line = json_object();
    json_object_set_new(line, "seq", json_integer((json_int_t)t->seq));
    json_object_set_new(line, "conversation_id", jstr(FIELD(conversation_id, NULL)));
    json_object_set_new(line, "turn_id", jstr(FIELD(turn_id, NULL)));
    json_object_set_new(line, "response", jstr(FIELD(response, NULL)));
    json_object_set_new(line, "steps",
                        jparse_plugin(FIELD(steps_json, NULL), json_array(), "steps_json"));
    json_object_set_new(line, "continue_conversation",
                        json_boolean(FIELD(continue_conversation, 0) != 0));
    json_object_set_new(line, "error",
                        status == PARLEY_OK ? json_null()
                                            : jerror(status, FIELD(error_message, NULL)));
    if (t->ndeltas > 0) {
        json_object_set_new(line, "deltas", json_integer((json_int_t)t->ndeltas));
        json_object_set_new(line, "streamed", jstrn(t->streamed ? t->streamed : "", t->slen));
    }
#undef FIELD
    /* Written before the turn leaves the in-flight set: a barrier that sees
     * in_flight == 0 knows every result line is out. */
    out_json_line(line);
    json_decref(line);

    pthread_mutex_lock(&g_shim.mu);
    unlink_turn(t);
    struct turn *dead = unref_locked(t);
    pthread_mutex_unlock(&g_shim.mu);
    if (dead)
        free_turn(dead);
}

/* ---- conversation lines --------------------------------------------------- */

static const char *const str_fields[] = {"conversation_id", "language", "device_id",
                                         "satellite_id",    "agent_id", "extra_system_prompt"};
#define NSTR (sizeof str_fields / sizeof str_fields[0])

/* Validate and submit one conversation line; then wait for a free slot. */
static void handle_turn(unsigned long seq, json_t *obj, unsigned long concurrency) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int known = strcmp(key, "text") == 0 || strcmp(key, "context") == 0 ||
                    strcmp(key, "tools") == 0;
        for (size_t i = 0; i < NSTR; i++)
            known |= strcmp(key, str_fields[i]) == 0;
        if (!known) {
            invalid_line(seq, "unknown key \"%s\"", key);
            return;
        }
    }
    json_t *text = json_object_get(obj, "text");
    if (!json_is_string(text)) {
        invalid_line(seq, "%s", text ? "\"text\" must be a string" : "\"text\" is required");
        return;
    }
    const char *strs[NSTR];
    for (size_t i = 0; i < NSTR; i++) {
        v = json_object_get(obj, str_fields[i]);
        if (v && !json_is_string(v) && !json_is_null(v)) {
            invalid_line(seq, "\"%s\" must be a string", str_fields[i]);
            return;
        }
        strs[i] = json_string_value(v); /* NULL for absent or null */
    }
    json_t *context = json_object_get(obj, "context");
    if (context && !json_is_object(context) && !json_is_null(context)) {
        invalid_line(seq, "%s", "\"context\" must be an object");
        return;
    }
    json_t *tools = json_object_get(obj, "tools");
    if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        invalid_line(seq, "%s", "\"tools\" must be an array");
        return;
    }

    char *context_json = json_is_object(context) ? json_dumps(context, SHIM_JSON_COMPACT) : NULL;
    char *tools_json = json_is_array(tools) ? json_dumps(tools, SHIM_JSON_COMPACT) : NULL;
    parley_input in = {
        .struct_size = sizeof in,
        .text = json_string_value(text),
        .conversation_id = strs[0],
        .language = strs[1],
        .device_id = strs[2],
        .satellite_id = strs[3],
        .agent_id = strs[4],
        .extra_system_prompt = strs[5],
        .context_json = context_json,
        .tools_json = tools_json,
        .on_delta = on_delta,
    };
    struct turn *t = calloc(1, sizeof *t);
    if (!t) {
        error_line(seq, jerror_code("no_memory", "parley-host: out of memory"));
        free(context_json);
        free(tools_json);
        return;
    }
    t->seq = seq;
    t->refs = 2;
    pthread_mutex_lock(&g_shim.mu);
    link_turn(t);
    pthread_mutex_unlock(&g_shim.mu);

    parley_request_id rid = 0;
    char *err = NULL;
    parley_status st = g_shim.pl->async_process(g_shim.agent, &in, on_done, t, &rid, &err);
    free(context_json);
    free(tools_json);
    if (st != PARLEY_OK) {
        /* Not accepted: done will never come, so both references are ours. */
        pthread_mutex_lock(&g_shim.mu);
        unlink_turn(t);
        pthread_mutex_unlock(&g_shim.mu);
        free_turn(t);
        error_line(seq, jerror(st, err));
        plugin_free(err);
        return;
    }
    plugin_free(err);

    pthread_mutex_lock(&g_shim.mu);
    t->id = rid;
    struct turn *dead = unref_locked(t);
    /* At most `concurrency` in flight; with 1, each turn ends before the
     * next line is even read. */
    while (in_flight >= concurrency && !shim_interrupted())
        pthread_cond_wait(&g_shim.cv, &g_shim.mu);
    pthread_mutex_unlock(&g_shim.mu);
    if (dead)
        free_turn(dead);
}

/* ---- control lines ------------------------------------------------------- */

enum op_kind { OP_HISTORY, OP_TURN, OP_LIST, OP_CLEAR, OP_METRICS, OP_WAIT, OP_CANCEL, OP_SLEEP };

struct op_def {
    const char *name;
    enum op_kind kind;
    int barrier;
    const char *arg; /* the one key besides "op" it accepts, or NULL */
};

static const struct op_def ops[] = {
    {"history", OP_HISTORY, 1, "conversation_id"},
    {"turn", OP_TURN, 1, "turn_id"},
    {"list", OP_LIST, 1, NULL},
    {"clear", OP_CLEAR, 1, "conversation_id"},
    {"metrics", OP_METRICS, 1, NULL},
    {"wait", OP_WAIT, 1, NULL},
    {"cancel", OP_CANCEL, 0, "seq"},
    {"sleep", OP_SLEEP, 0, "ms"},
};

/* Wait until every submitted turn has completed and its line is written.
 * Returns -1 when a signal cut the wait short. */
static int barrier(void) {
    pthread_mutex_lock(&g_shim.mu);
    while (in_flight > 0 && !shim_interrupted())
        pthread_cond_wait(&g_shim.cv, &g_shim.mu);
    pthread_mutex_unlock(&g_shim.mu);
    return shim_interrupted() ? -1 : 0;
}

/* The answer of a history function: parsed JSON (out is consumed), or the
 * error.  `what`/`id` name the object for a not_found message. */
static void op_answer(unsigned long seq, const char *op, parley_status st, char *out,
                      const char *what, const char *id) {
    if (st == PARLEY_OK) {
        op_reply(seq, op, jparse_plugin(out, json_null(), op), NULL);
        plugin_free(out);
        return;
    }
    plugin_free(out);
    char *msg = NULL;
    int n = st == PARLEY_ERR_NOT_FOUND && what ? asprintf(&msg, "no %s '%s'", what, id)
                                               : asprintf(&msg, "%s: %s", op, status_str(st));
    op_reply(seq, op, NULL, jerror(st, n < 0 ? NULL : msg));
    free(msg);
}

static void op_cancel(unsigned long seq, json_int_t target) {
    parley_request_id id = 0;
    pthread_mutex_lock(&g_shim.mu);
    for (struct turn *t = inflight; t; t = t->next)
        if ((json_int_t)t->seq == target)
            id = t->id;
    pthread_mutex_unlock(&g_shim.mu);
    /* Outside our lock: cancel may take the plugin's locks, which its
     * worker may hold while it waits to run our done callback. */
    parley_status st = id ? g_shim.pl->cancel(g_shim.agent, id) : PARLEY_ERR_NOT_FOUND;
    if (st == PARLEY_OK) {
        op_reply(seq, "cancel", NULL, NULL);
        return;
    }
    char *msg = NULL;
    int n = st == PARLEY_ERR_NOT_FOUND
                ? asprintf(&msg, "no turn from line %lld is in flight", (long long)target)
                : asprintf(&msg, "cancel: %s", status_str(st));
    op_reply(seq, "cancel", NULL, jerror(st, n < 0 ? NULL : msg));
    free(msg);
}

static void handle_op(unsigned long seq, json_t *obj, json_t *jop) {
    if (!json_is_string(jop)) {
        invalid_line(seq, "%s", "\"op\" must be a string");
        return;
    }
    const char *op = json_string_value(jop);
    const struct op_def *def = NULL;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && !def; i++)
        if (strcmp(ops[i].name, op) == 0)
            def = &ops[i];
    char *msg = NULL;
    if (!def) {
        msg = line_msg(seq, "unknown op \"%s\"", op);
        goto invalid;
    }
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (strcmp(key, "op") != 0 && (!def->arg || strcmp(key, def->arg) != 0)) {
            msg = line_msg(seq, "unknown key \"%s\"", key);
            goto invalid;
        }
    }
    json_t *arg = def->arg ? json_object_get(obj, def->arg) : NULL;
    const char *id = json_string_value(arg);
    const char *want = NULL;
    switch (def->kind) {
    case OP_HISTORY:
    case OP_TURN:
        if (!id)
            want = "\"%s\" must be a string";
        break;
    case OP_CLEAR:
        if (arg && !id && !json_is_null(arg))
            want = "\"%s\" must be a string or null";
        break;
    case OP_CANCEL:
        if (!json_is_integer(arg) || json_integer_value(arg) < 1)
            want = "\"%s\" must be a positive integer";
        break;
    case OP_SLEEP:
        if (!json_is_integer(arg) || json_integer_value(arg) < 0 ||
            json_integer_value(arg) > 86400000)
            want = "\"%s\" must be an integer from 0 to 86400000";
        break;
    default:
        break;
    }
    if (want) {
        msg = line_msg(seq, want, def->arg);
        goto invalid;
    }

    if (def->barrier && barrier() < 0)
        return; /* interrupted: the run is ending, no answer */

    const parley_plugin *pl = g_shim.pl;
    parley_agent *ag = g_shim.agent;
    char *out = NULL;
    parley_status st;
    /* (Call, then pass `out`: argument evaluation order is unspecified.) */
    switch (def->kind) {
    case OP_HISTORY:
        st = pl->history_get(ag, id, &out);
        op_answer(seq, op, st, out, "conversation", id);
        break;
    case OP_TURN:
        st = pl->turn_get(ag, id, &out);
        op_answer(seq, op, st, out, "turn", id);
        break;
    case OP_LIST:
        st = pl->conversations_list(ag, &out);
        op_answer(seq, op, st, out, NULL, NULL);
        break;
    case OP_METRICS:
        st = pl->metrics(ag, &out);
        op_answer(seq, op, st, out, NULL, NULL);
        break;
    case OP_CLEAR:
        st = pl->history_clear(ag, id);
        if (st == PARLEY_OK)
            op_reply(seq, op, NULL, NULL);
        else
            op_answer(seq, op, st, NULL, id ? "conversation" : NULL, id);
        break;
    case OP_WAIT:
        op_reply(seq, op, NULL, NULL);
        break;
    case OP_CANCEL:
        op_cancel(seq, json_integer_value(arg));
        break;
    case OP_SLEEP: /* stop reading for a while; turns keep running */
        if (shim_sleep_ms((long)json_integer_value(arg)) == 0)
            op_reply(seq, op, NULL, NULL); /* interrupted: no answer, as for barriers */
        break;
    }
    return;

invalid:
    op_reply(seq, op, NULL, jerror_code("invalid_input", msg));
    free(msg);
}

/* ---- the loop --------------------------------------------------------------- */

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

int run_jsonl(unsigned long concurrency) {
    struct line_reader lr;
    if (lr_init(&lr, 0) < 0) {
        diag(PARLEY_LOG_ERROR, "out of memory");
        return 0;
    }
    unsigned long seq = 0;
    while (!shim_interrupted() && lr_next(&lr) == LR_LINE) {
        seq++; /* every line counts, blank or not */
        if (lr.too_long) {
            char lim[32];
            snprintf(lim, sizeof lim, "%u", SHIM_MAX_LINE);
            invalid_line(seq, "line longer than %s bytes", lim);
            continue;
        }
        if (blank(lr.line, lr.len))
            continue;
        json_error_t je;
        json_t *obj = json_loadb(lr.line, lr.len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        if (!obj) {
            invalid_line(seq, "%s", je.text);
            continue;
        }
        json_t *op = json_object_get(obj, "op");
        if (!json_is_object(obj))
            invalid_line(seq, "%s", "not a JSON object");
        else if (op)
            handle_op(seq, obj, op);
        else
            handle_turn(seq, obj, concurrency);
        json_decref(obj);
    }
    lr_free(&lr);
    /* EOF: let every turn finish (a signal cuts this short; destroy() in
     * main then cancels the rest, and their lines are still written). */
    barrier();
    return 0;
}
