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
 *
 * What a line asks for is decided by jsonl_parse.c; this file only acts on
 * it: submitting turns, waiting, calling the plugin, writing answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "images.h"
#include "jsonl_parse.h"
#include "shim.h"

/* One submitted turn.  Two references: the reader's (until it has stored
 * the request id) and the done callback's, which may run before
 * async_process has even returned to us. */
struct turn {
    struct turn *prev, *next; /* in-flight list, under g_shim.mu */
    unsigned long seq;
    const char *op; /* "append" for an append line; NULL for a conversation line */
    parley_request_id id;
    int refs;
    /* Written only by the delta callback, read by the done callback: both
     * on the plugin side of the turn, which orders them. */
    size_t ndeltas;
    char *streamed;
    size_t slen, scap;
    char *reasoning; /* on_reasoning deltas, joined */
    size_t rlen, rcap;
};

/* Guarded by g_shim.mu. */
static struct turn *inflight;
static unsigned long in_flight;

static void link_turn(struct turn *t)
{
    t->next = inflight;
    if (inflight)
        inflight->prev = t;
    inflight = t;
    in_flight++;
}

static void unlink_turn(struct turn *t)
{
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

static void free_turn(struct turn *t)
{
    free(t->streamed);
    free(t->reasoning);
    free(t);
}

/* Drop one reference; the caller holds g_shim.mu.  Returns the turn when it
 * must be freed (after unlocking). */
static struct turn *unref_locked(struct turn *t) { return --t->refs == 0 ? t : NULL; }

/* ---- output lines -------------------------------------------------------- */

/* {"seq":N,"error":{...}}: a line that started no turn and is no op. */
static void error_line(unsigned long seq, json_t *error)
{
    json_t *line = json_object();
    jset(line, "seq", json_integer((json_int_t)seq));
    jset(line, "error", error);
    out_json_line(line, seq, NULL);
    json_decref(line);
}

/* {"seq":N,"op":..,"result":..,"error":..}; result and error are stolen. */
static void op_reply(unsigned long seq, const char *op, json_t *result, json_t *error)
{
    json_t *line = json_object();
    jset(line, "seq", json_integer((json_int_t)seq));
    jset(line, "op", jstr(op));
    jset(line, "result", result ? result : json_null());
    jset(line, "error", error ? error : json_null());
    out_json_line(line, seq, op);
    json_decref(line);
}

/* An invalid_input answer, "line N: <what>": an op reply when the line named
 * an op (op non-NULL), else an error line. */
static void invalid_line(unsigned long seq, const char *op, const char *what)
{
    char *msg = NULL;
    if (asprintf(&msg, "line %lu: %s", seq, what) < 0)
        msg = NULL; /* jerror_code then falls back to the code */
    json_t *error = jerror_code("invalid_input", msg);
    free(msg);
    if (op)
        op_reply(seq, op, NULL, error);
    else
        error_line(seq, error);
}

static void no_memory_line(unsigned long seq)
{
    error_line(seq, jerror_code("no_memory", "parley-host: out of memory"));
}

/* ---- plugin callbacks ----------------------------------------------------- */

/* Append to a growing text; on OOM keep what we have (the count still tells the truth). */
static void append_text(char **buf, size_t *blen, size_t *bcap, const char *text, size_t len)
{
    if (!text || len == 0)
        return;
    if (*blen + len + 1 > *bcap) {
        size_t cap = *bcap ? *bcap : 256;
        while (cap < *blen + len + 1)
            cap *= 2;
        char *n = realloc(*buf, cap);
        if (!n)
            return;
        *buf = n;
        *bcap = cap;
    }
    memcpy(*buf + *blen, text, len);
    *blen += len;
}

static void on_delta(void *user_data, parley_request_id request_id, const char *text, size_t len)
{
    (void)request_id;
    struct turn *t = user_data;
    t->ndeltas++;
    append_text(&t->streamed, &t->slen, &t->scap, text, len);
}

static void on_reasoning(void *user_data, parley_request_id request_id, const char *text,
                         size_t len)
{
    (void)request_id;
    struct turn *t = user_data;
    append_text(&t->reasoning, &t->rlen, &t->rcap, text, len);
}

static void on_done(void *user_data, const parley_result *r)
{
    struct turn *t = user_data;
#define FIELD(f, dflt) (PARLEY_HAS_FIELD(r, parley_result, f) ? r->f : (dflt))
    parley_status status = FIELD(status, PARLEY_ERR_INTERNAL);
    json_t *line = json_object();
    jset(line, "seq", json_integer((json_int_t)t->seq));
    if (t->op)
        jset(line, "op", jstr(t->op));
    jset(line, "conversation_id", jstr(FIELD(conversation_id, NULL)));
    jset(line, "turn_id", jstr(FIELD(turn_id, NULL)));
    jset(line, "response", jstr(FIELD(response, NULL)));
    jset(line, "steps", jparse_plugin(FIELD(steps_json, NULL), json_array(), "steps_json"));
    jset(line, "continue_conversation", json_boolean(FIELD(continue_conversation, 0) != 0));
    jset(line, "error",
         status == PARLEY_OK ? json_null() : jerror(status, FIELD(error_message, NULL)));
    if (t->ndeltas > 0) {
        jset(line, "deltas", json_integer((json_int_t)t->ndeltas));
        jset(line, "streamed", jstrn(t->streamed ? t->streamed : "", t->slen));
    }
    if (t->rlen > 0)
        jset(line, "reasoning_streamed", jstrn(t->reasoning, t->rlen));
    if (PARLEY_HAS_FIELD(r, parley_result, usage_json))
        jset(line, "usage", jparse_plugin(r->usage_json, json_null(), "usage_json"));
    if (PARLEY_HAS_FIELD(r, parley_result, stop_reason))
        jset(line, "stop_reason", jstr(r->stop_reason));
    /* message identity: only when set (a stored turn; an input with reply_to) */
    const char *identity[][2] = {{"user_message_id", FIELD(user_message_id, NULL)},
                                 {"answer_message_id", FIELD(answer_message_id, NULL)},
                                 {"reply_context", FIELD(reply_context, NULL)}};
    for (size_t i = 0; i < sizeof identity / sizeof identity[0]; i++)
        if (identity[i][1])
            jset(line, identity[i][0], jstr(identity[i][1]));
    const char *structured = FIELD(structured_json, NULL); /* with a response_format */
    if (structured)
        jset(line, "structured", jparse_plugin(structured, json_null(), "structured_json"));
#undef FIELD
    /* Written before the turn leaves the in-flight set: a barrier that sees
     * in_flight == 0 knows every result line is out. */
    out_json_line(line, t->seq, t->op);
    json_decref(line);

    pthread_mutex_lock(&g_shim.mu);
    unlink_turn(t);
    struct turn *dead = unref_locked(t);
    pthread_mutex_unlock(&g_shim.mu);
    if (dead)
        free_turn(dead);
}

/* ---- conversation lines --------------------------------------------------- */

/* Start a turn (`in`) or an append (`append_json`) and track it until its done
 * callback; then wait for a free slot. */
static void submit_tracked(unsigned long seq, const char *op, const parley_input *in,
                           const char *append_json, unsigned long concurrency)
{
    struct turn *t = calloc(1, sizeof *t);
    if (!t) {
        no_memory_line(seq);
        return;
    }
    t->seq = seq;
    t->op = op;
    t->refs = 2;
    pthread_mutex_lock(&g_shim.mu);
    link_turn(t);
    pthread_mutex_unlock(&g_shim.mu);

    parley_request_id rid = 0;
    char *err = NULL;
    parley_status st =
        in ? g_shim.pl->async_process(g_shim.agent, in, on_done, t, &rid, &err)
           : g_shim.pl->append_message(g_shim.agent, append_json, on_done, t, &rid, &err);
    if (st != PARLEY_OK) {
        /* Not accepted: done will never come, so both references are ours. */
        pthread_mutex_lock(&g_shim.mu);
        unlink_turn(t);
        pthread_mutex_unlock(&g_shim.mu);
        free_turn(t);
        if (op) /* a refused op line is answered as an op */
            op_reply(seq, op, NULL, jerror(st, err));
        else
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

/* Submit one validated conversation line; then wait for a free slot. */
static void handle_turn(unsigned long seq, const struct jsonl_turn *req, unsigned long concurrency)
{
    char *images = NULL, *why = NULL;
    if (req->images_json && !(images = shim_images_resolve(req->images_json, &why))) {
        invalid_line(seq, NULL, why ? why : "out of memory");
        free(why);
        return;
    }
    parley_input in = {
        .struct_size = sizeof in,
        .text = req->text,
        .conversation_id = req->conversation_id,
        .language = req->language,
        .device_id = req->device_id,
        .satellite_id = req->satellite_id,
        .agent_id = req->agent_id,
        .extra_system_prompt = req->extra_system_prompt,
        .interface_type = req->interface_type,
        .interface_message_id = req->interface_message_id,
        .metadata_json = req->metadata_json,
        .reply_to_json = req->reply_to_json,
        .context_json = req->context_json,
        .tools_json = req->tools_json,
        .on_delta = on_delta,
        .on_reasoning = on_reasoning,
        .persona = req->persona,
        .images_json = images,
        .response_format_json = req->response_format_json,
        .timestamp = req->timestamp,
    };
    submit_tracked(seq, NULL, &in, NULL, concurrency);
    free(images); /* async_process copied what it keeps */
}

/* An append line: append_message, answered like a turn (by its done callback). */
static void handle_append(unsigned long seq, const char *message_json, unsigned long concurrency)
{
    const parley_plugin *pl = g_shim.pl;
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, append_message) || !pl->append_message) {
        op_reply(seq, "append", NULL,
                 jerror(PARLEY_ERR_INVALID_INPUT, "this plugin has no append_message"));
        return;
    }
    submit_tracked(seq, "append", NULL, message_json, concurrency);
}

/* ---- control lines ------------------------------------------------------- */

/* Barrier ops first wait for every submitted turn (docs/shim.md). */
static int is_barrier(enum jsonl_op_kind kind)
{
    /* update_options is no barrier: turns in flight finish under their options. */
    return kind != JSONL_OP_CANCEL && kind != JSONL_OP_SLEEP && kind != JSONL_OP_UPDATE_OPTIONS &&
           kind != JSONL_OP_PERSONA_PUT && kind != JSONL_OP_PERSONA_REMOVE;
}

/* Wait until every submitted turn has completed and its line is written.
 * Returns -1 when a signal cut the wait short. */
static int barrier(void)
{
    pthread_mutex_lock(&g_shim.mu);
    while (in_flight > 0 && !shim_interrupted())
        pthread_cond_wait(&g_shim.cv, &g_shim.mu);
    pthread_mutex_unlock(&g_shim.mu);
    return shim_interrupted() ? -1 : 0;
}

/* Why the history function this thread just called failed, in the plugin's words
 * (parley_plugin.last_error; malloc'd), or NULL from a plugin without it. */
static char *plugin_words(void)
{
    const parley_plugin *pl = g_shim.pl;
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, last_error) || !pl->last_error)
        return NULL;
    char *words = pl->last_error();
    char *copy = words ? strdup(words) : NULL;
    plugin_free(words);
    return copy;
}

static void op_plugin_error(unsigned long seq, const char *op, parley_status st, char *out);

/* The answer of a history function: parsed JSON (out is consumed), or the
 * error in the plugin's words (else: `what`/`id` name the object for a
 * not_found message). */
static void op_answer(unsigned long seq, const char *op, parley_status st, char *out,
                      const char *what, const char *id)
{
    if (st == PARLEY_OK) {
        op_reply(seq, op, jparse_plugin(out, json_null(), op), NULL);
        plugin_free(out);
        return;
    }
    if (out && st != PARLEY_ERR_NOT_FOUND) { /* a store failure in the store's words */
        op_plugin_error(seq, op, st, out);
        return;
    }
    plugin_free(out);
    char *msg = plugin_words();
    int n = msg                                  ? 0
            : st == PARLEY_ERR_NOT_FOUND && what ? asprintf(&msg, "no %s '%s'", what, id)
                                                 : asprintf(&msg, "%s: %s", op, status_str(st));
    op_reply(seq, op, NULL, jerror(st, n < 0 ? NULL : msg));
    free(msg);
}

/* An error whose words are in the plugin's {"error":{..,"message"}} (invalid_input from a
 * query: it says which key; storage: what the store cannot do). */
static void op_plugin_error(unsigned long seq, const char *op, parley_status st, char *out)
{
    json_t *answer = out ? json_loads(out, 0, NULL) : NULL;
    const char *msg =
        json_string_value(json_object_get(json_object_get(answer, "error"), "message"));
    op_reply(seq, op, NULL,
             jerror(st, msg                              ? msg
                        : st == PARLEY_ERR_INVALID_INPUT ? "invalid query"
                                                         : status_str(st)));
    json_decref(answer);
    plugin_free(out);
}

static void op_input_error(unsigned long seq, const char *op, char *out)
{
    op_plugin_error(seq, op, PARLEY_ERR_INVALID_INPUT, out);
}

/* A plugin older than the function `what`: say so instead of calling it. */
static int lacks(unsigned long seq, const char *op, const void *fn, const char *what)
{
    if (fn)
        return 0;
    char *msg = NULL;
    if (asprintf(&msg, "this plugin has no %s", what) < 0)
        msg = NULL;
    op_reply(seq, op, NULL, jerror(PARLEY_ERR_INVALID_INPUT, msg));
    free(msg);
    return 1;
}

static void op_cancel(unsigned long seq, long long target)
{
    parley_request_id id = 0;
    pthread_mutex_lock(&g_shim.mu);
    for (struct turn *t = inflight; t; t = t->next)
        if ((long long)t->seq == target)
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
                ? asprintf(&msg, "no turn from line %lld is in flight", target)
                : asprintf(&msg, "cancel: %s", status_str(st));
    op_reply(seq, "cancel", NULL, jerror(st, n < 0 ? NULL : msg));
    free(msg);
}

/* Run one validated op line and write its answer. */
static void handle_op(unsigned long seq, const struct jsonl_op *op)
{
    if (is_barrier(op->kind) && barrier() < 0)
        return; /* interrupted: the run is ending, no answer */

    const parley_plugin *pl = g_shim.pl;
    parley_agent *ag = g_shim.agent;
    const char *name = op->name, *id = op->id;
    char *out = NULL;
    parley_status st;
    /* (Call, then pass `out`: argument evaluation order is unspecified.) */
    switch (op->kind) {
    case JSONL_OP_HISTORY:
        if (op->json &&
            !(PARLEY_HAS_FIELD(pl, parley_plugin, history_get_by) && pl->history_get_by)) {
            op_reply(seq, name, NULL,
                     jerror(PARLEY_ERR_INVALID_INPUT,
                            "this plugin has no history_get_by (\"persona\")"));
            break;
        }
        st = op->json ? pl->history_get_by(ag, op->json, &out) : pl->history_get(ag, id, &out);
        if (st == PARLEY_ERR_INVALID_INPUT && op->json)
            op_input_error(seq, name, out);
        else
            op_answer(seq, name, st, out, "conversation", id);
        break;
    case JSONL_OP_TURN:
        st = pl->turn_get(ag, id, &out);
        op_answer(seq, name, st, out, "turn", id);
        break;
    case JSONL_OP_LIST:
        if (!op->json)
            st = pl->conversations_list(ag, &out);
        else if (PARLEY_HAS_FIELD(pl, parley_plugin, conversations_list_by) &&
                 pl->conversations_list_by)
            st = pl->conversations_list_by(ag, op->json, &out);
        else
            st = PARLEY_ERR_INVALID_INPUT; /* an older plugin: no filtered list */
        if (st == PARLEY_ERR_INVALID_INPUT && out)
            op_input_error(seq, name, out); /* names the filter's bad key */
        else
            op_answer(seq, name, st, out, NULL, NULL);
        break;
    case JSONL_OP_METRICS:
        st = pl->metrics(ag, &out);
        op_answer(seq, name, st, out, NULL, NULL);
        break;
    case JSONL_OP_CLEAR:
        if (op->json &&
            !(PARLEY_HAS_FIELD(pl, parley_plugin, history_clear_by) && pl->history_clear_by)) {
            op_reply(seq, name, NULL,
                     jerror(PARLEY_ERR_INVALID_INPUT,
                            "this plugin has no history_clear_by (\"persona\")"));
            break;
        }
        st = op->json ? pl->history_clear_by(ag, op->json) : pl->history_clear(ag, id);
        if (st == PARLEY_OK)
            op_reply(seq, name, NULL, NULL);
        else
            op_answer(seq, name, st, NULL, id ? "conversation" : NULL, id);
        break;
    case JSONL_OP_QUERY:
        st = pl->history_query(ag, id, &out);
        if (st == PARLEY_ERR_INVALID_INPUT)
            op_input_error(seq, name, out);
        else
            op_answer(seq, name, st, out, NULL, NULL);
        break;
    case JSONL_OP_MESSAGE:
        st = pl->message_get(ag, id, &out);
        op_answer(seq, name, st, out, "message", id);
        break;
    case JSONL_OP_FIND:
        if (lacks(seq, name,
                  PARLEY_HAS_FIELD(pl, parley_plugin, message_find) ? pl->message_find : NULL,
                  "message_find"))
            break;
        st = pl->message_find(ag, id, &out);
        if (st == PARLEY_ERR_NOT_FOUND)
            op_reply(seq, name, NULL,
                     jerror(st, "no message with that interface_message_id in "
                                "that conversation"));
        else if (st != PARLEY_OK && out)
            op_plugin_error(seq, name, st, out);
        else
            op_answer(seq, name, st, out, NULL, NULL);
        break;
    case JSONL_OP_SET_INTERFACE_MESSAGE_ID: {
        if (lacks(seq, name,
                  PARLEY_HAS_FIELD(pl, parley_plugin, set_interface_message_id)
                      ? pl->set_interface_message_id
                      : NULL,
                  "set_interface_message_id"))
            break;
        st = pl->set_interface_message_id(ag, id, op->value);
        char *msg = st == PARLEY_OK ? NULL : plugin_words();
        int n = msg                          ? 0
                : st == PARLEY_ERR_NOT_FOUND ? asprintf(&msg, "no stored turn '%s'", id)
                : st == PARLEY_ERR_INVALID_INPUT
                    ? asprintf(&msg, "interface_message_id: must be 1 to 256 bytes of "
                                     "UTF-8")
                    : asprintf(&msg, "%s: %s", name, status_str(st));
        op_reply(seq, name, NULL, st == PARLEY_OK ? NULL : jerror(st, n < 0 ? NULL : msg));
        free(msg);
        break;
    }
    case JSONL_OP_APPEND: /* handle_line runs it, like a conversation line */
        break;
    case JSONL_OP_WAIT:
        op_reply(seq, name, NULL, NULL);
        break;
    case JSONL_OP_CANCEL:
        op_cancel(seq, op->num);
        break;
    case JSONL_OP_UPDATE_OPTIONS: {
        char *msg = NULL;
        st = live_options_apply(json_loads(op->json, 0, NULL), &msg);
        op_reply(seq, name, NULL, st == PARLEY_OK ? NULL : jerror(st, msg));
        free(msg);
        break;
    }
    case JSONL_OP_PERSONA_PUT:
    case JSONL_OP_PERSONA_REMOVE: { /* like update_options: turns in flight keep theirs */
        int put = op->kind == JSONL_OP_PERSONA_PUT;
        if (lacks(seq, name,
                  PARLEY_HAS_FIELD(pl, parley_plugin, persona_remove)
                      ? (put ? (const void *)pl->persona_put : (const void *)pl->persona_remove)
                      : NULL,
                  name))
            break;
        char *msg = NULL;
        st = put ? pl->persona_put(ag, id, op->json, &msg) : pl->persona_remove(ag, id, &msg);
        op_reply(seq, name, NULL, st == PARLEY_OK ? NULL : jerror(st, msg ? msg : status_str(st)));
        plugin_free(msg);
        break;
    }
    case JSONL_OP_SLEEP: /* stop reading for a while; turns keep running */
        if (shim_sleep_ms((long)op->num) == 0)
            op_reply(seq, name, NULL, NULL); /* interrupted: no answer, as for barriers */
        break;
    }
}

/* ---- the loop --------------------------------------------------------------- */

static void handle_line(unsigned long seq, const struct jsonl_line *l, unsigned long concurrency)
{
    switch (l->kind) {
    case JSONL_BLANK: /* no answer */
        break;
    case JSONL_INVALID:
        invalid_line(seq, l->invalid.op, l->invalid.message);
        break;
    case JSONL_TURN:
        handle_turn(seq, &l->turn, concurrency);
        break;
    case JSONL_OP:
        if (l->op.kind == JSONL_OP_APPEND)
            handle_append(seq, l->op.id, concurrency);
        else
            handle_op(seq, &l->op);
        break;
    }
}

int run_jsonl(unsigned long concurrency)
{
    struct line_reader lr;
    if (lr_init(&lr, 0) < 0) {
        diag(PARLEY_LOG_ERROR, "out of memory");
        return 0;
    }
    unsigned long seq = 0;
    while (!shim_interrupted() && lr_next(&lr) == LR_LINE) {
        seq++; /* every line counts, blank or not */
        if (lr.too_long) {
            char what[64];
            snprintf(what, sizeof what, "line longer than %u bytes", SHIM_MAX_LINE);
            invalid_line(seq, NULL, what);
            continue;
        }
        struct jsonl_line l;
        if (jsonl_parse_line(lr.line, lr.len, &l) < 0)
            no_memory_line(seq);
        else
            handle_line(seq, &l, concurrency);
        jsonl_line_free(&l);
    }
    lr_free(&lr);
    /* EOF: let every turn finish (a signal cuts this short; destroy() in
     * main then cancels the rest, and their lines are still written). */
    barrier();
    return 0;
}
