/*
 * interactive.c -- the default mode: a line-at-a-time chat on stdin/stdout.
 *
 * One turn at a time.  The callbacks print the turn's output themselves
 * (deltas as they come, then steps and the reply), so a turn cancelled by
 * destroy() after Ctrl-C is still reported.  The main thread just waits on
 * g_shim.cv for `done`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "images.h"
#include "shim.h"

/* The one turn in flight.  Static, not on the stack: after a signal the
 * done callback may run inside destroy(), after run_interactive returned. */
static struct {
    size_t ndeltas; /* delta/done callbacks only (ordered by the plugin) */
    int done;       /* under g_shim.mu */
} cur;

/* Tool steps already printed live for the current turn, by call id: the
 * steps of the result repeat only what was not (e.g. an unknown tool the
 * plugin answered itself, or a timeout).  Under live_mu: the worker thread
 * and the tools' completer thread both print. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct live_step {
    char *call_id;
    int result_shown;
} * live;
static size_t nlive, live_cap;
static int interactive_on; /* set by run_interactive: JSONL mode prints no steps */

/* Last conversation id a result reported (under g_shim.mu). */
static char *conv_id;
/* Only the input thread touches these two: the persona of the next turns, and
 * the images (JSON array of {"url"}) attached to the next message. */
static char *persona;
static json_t *pending_images;

static void print_value(const char *prefix, json_t *v, const char *suffix)
{
    /* Strings as their text, anything else as compact JSON. */
    char *dumped = json_is_string(v) ? NULL : json_dumps(v, SHIM_JSON_COMPACT);
    const char *s = json_is_string(v) ? json_string_value(v) : dumped ? dumped : "";
    out_end_line();
    out_printf("%s%s%s\n", prefix, s, suffix);
    free(dumped);
}

/* "  -> name args"; args borrowed, NULL printed as {}. */
static void print_call_value(const char *name, json_t *args)
{
    char *prefix = NULL;
    if (asprintf(&prefix, "  -> %s ", name ? name : "?") < 0)
        prefix = NULL;
    json_t *empty = args ? NULL : json_object();
    print_value(prefix ? prefix : "  -> ", args ? args : empty, "");
    json_decref(empty);
    free(prefix);
}

/* The same from the callback's arguments_json: JSON text, or raw text the
 * model sent that is not JSON. */
static void print_call(const char *name, const char *args_json)
{
    json_t *args = args_json ? json_loads(args_json, JSON_DECODE_ANY, NULL) : NULL;
    if (!args && args_json)
        args = jstr(args_json);
    print_call_value(name, args);
    json_decref(args);
}

/* "  <- content [(error)]": content is JSON text or plain text. */
static void print_result(const char *content, int is_error)
{
    json_t *v = content ? json_loads(content, JSON_DECODE_ANY, NULL) : NULL;
    if (!v)
        v = content ? jstr(content) : json_null();
    print_value("  <- ", v, is_error ? " (error)" : "");
    json_decref(v);
}

static struct live_step *live_find(const char *call_id)
{
    for (size_t i = 0; call_id && i < nlive; i++)
        if (strcmp(live[i].call_id, call_id) == 0)
            return &live[i];
    return NULL;
}

static void live_reset(void)
{
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++)
        free(live[i].call_id);
    nlive = 0;
    pthread_mutex_unlock(&live_mu);
}

void interactive_tool_started(const parley_tool_call_info *info)
{
    if (!interactive_on)
        return;
    const char *id = PARLEY_HAS_FIELD(info, parley_tool_call_info, call_id) ? info->call_id : NULL;
    const char *name =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, tool_name) ? info->tool_name : NULL;
    const char *args =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, arguments_json) ? info->arguments_json : NULL;
    pthread_mutex_lock(&live_mu);
    if (id && nlive == live_cap) {
        size_t cap = live_cap ? live_cap * 2 : 8;
        struct live_step *nl = realloc(live, cap * sizeof *live);
        if (nl) {
            live = nl;
            live_cap = cap;
        }
    }
    char *copy = id && nlive < live_cap ? strdup(id) : NULL;
    if (copy)
        live[nlive++] = (struct live_step){.call_id = copy};
    if (copy) /* not remembered: leave it to the steps at the end */
        print_call(name, args);
    pthread_mutex_unlock(&live_mu);
}

void interactive_tool_finished(const char *call_id, const char *result, int is_error)
{
    if (!interactive_on)
        return;
    pthread_mutex_lock(&live_mu);
    struct live_step *s = live_find(call_id);
    if (s && !s->result_shown) { /* a late answer to an earlier turn's call is not shown */
        s->result_shown = 1;
        print_result(result, is_error);
    }
    pthread_mutex_unlock(&live_mu);
}

/* The result's tool steps that were not printed live. */
static void print_missed_steps(const char *steps_json)
{
    json_t *steps = steps_json ? json_loads(steps_json, JSON_DECODE_ANY, NULL) : NULL;
    size_t i;
    json_t *s;
    pthread_mutex_lock(&live_mu);
    json_array_foreach(steps, i, s) {
        const char *type = json_string_value(json_object_get(s, "type"));
        const char *id = json_string_value(json_object_get(s, "call_id"));
        struct live_step *seen = live_find(id);
        if (!type)
            continue;
        if (strcmp(type, "tool_call") == 0 && !seen) {
            print_call_value(json_string_value(json_object_get(s, "name")),
                             json_object_get(s, "arguments"));
        } else if (strcmp(type, "tool_result") == 0 && !(seen && seen->result_shown)) {
            json_t *content = json_object_get(s, "content");
            print_value("  <- ", content ? content : json_null(),
                        json_is_true(json_object_get(s, "is_error")) ? " (error)" : "");
        }
    }
    pthread_mutex_unlock(&live_mu);
    json_decref(steps);
}

static void on_delta(void *user_data, parley_request_id request_id, const char *text, size_t len)
{
    (void)user_data;
    (void)request_id;
    cur.ndeltas++;
    /* A reply starts, or goes on after tool lines: a fresh "parley> ". */
    if (out_at_line_start())
        out_text("parley> ", 8);
    if (text && len)
        out_text(text, len);
}

static void on_done(void *user_data, const parley_result *r)
{
    (void)user_data;
#define FIELD(f, dflt) (PARLEY_HAS_FIELD(r, parley_result, f) ? r->f : (dflt))
    parley_status status = FIELD(status, PARLEY_ERR_INTERNAL);
    const char *steps = FIELD(steps_json, NULL);
    out_end_line(); /* after streamed text */
    print_missed_steps(steps);
    if (status == PARLEY_OK) {
        if (cur.ndeltas == 0) {
            const char *resp = FIELD(response, NULL);
            out_printf("parley> %s\n", resp ? resp : "");
        }
    } else {
        const char *msg = FIELD(error_message, NULL);
        out_printf("parley! %s: %s\n", status_str(status), msg ? msg : status_str(status));
    }
    const char *cid = FIELD(conversation_id, NULL);
#undef FIELD
    char *copy = cid ? strdup(cid) : NULL;
    pthread_mutex_lock(&g_shim.mu);
    /* Keep the old id when a result carries none (e.g. a failed turn). */
    if (copy) {
        free(conv_id);
        conv_id = copy;
    }
    cur.done = 1;
    pthread_cond_broadcast(&g_shim.cv);
    pthread_mutex_unlock(&g_shim.mu);
}

/* Wait for the turn's done callback.  On a terminal, show "thinking… Ns"
 * until output comes; the first Ctrl-C cancels the turn (a second quits). */
static void wait_turn(parley_request_id rid)
{
    int tty = isatty(1);
    struct timespec start, now;
    clock_gettime(CLOCK_REALTIME, &start);
    int cancelled = 0;
    pthread_mutex_lock(&g_shim.mu);
    while (!cur.done && !shim_interrupted()) {
        if (atomic_load(&g_shim.cancel_requested) && !cancelled) {
            cancelled = 1;
            pthread_mutex_unlock(&g_shim.mu);
            out_status(NULL);
            g_shim.pl->cancel(g_shim.agent, rid); /* NOT_FOUND if it just ended: fine */
            pthread_mutex_lock(&g_shim.mu);
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &now);
        if (tty && !cancelled) {
            char status[64];
            snprintf(status, sizeof status, "thinking\xe2\x80\xa6 %lds (Ctrl-C cancels)",
                     (long)(now.tv_sec - start.tv_sec));
            pthread_mutex_unlock(&g_shim.mu);
            out_status(status);
            pthread_mutex_lock(&g_shim.mu);
            if (cur.done)
                break;
        }
        struct timespec until = {.tv_sec = now.tv_sec + 1, .tv_nsec = now.tv_nsec};
        pthread_cond_timedwait(&g_shim.cv, &g_shim.mu, &until);
    }
    pthread_mutex_unlock(&g_shim.mu);
    out_status(NULL);
}

static void run_turn(const char *text)
{
    pthread_mutex_lock(&g_shim.mu);
    char *cid = conv_id ? strdup(conv_id) : NULL;
    cur.done = 0;
    pthread_mutex_unlock(&g_shim.mu);
    cur.ndeltas = 0;
    live_reset();

    char *images = pending_images ? json_dumps(pending_images, JSON_COMPACT) : NULL;
    json_decref(pending_images); /* attached to this message only, sent or refused */
    pending_images = NULL;
    parley_input in = {
        .struct_size = sizeof in,
        .text = text,
        .conversation_id = cid,
        .on_delta = on_delta,
        .persona = persona,
        .images_json = images,
    };
    char *err = NULL;
    parley_request_id rid = 0;
    atomic_store(&g_shim.cancel_requested, 0);
    atomic_store(&g_shim.turn_in_flight, 1);
    parley_status st = g_shim.pl->async_process(g_shim.agent, &in, on_done, NULL, &rid, &err);
    free(cid);
    free(images);
    if (st != PARLEY_OK) {
        atomic_store(&g_shim.turn_in_flight, 0);
        out_printf("parley! %s: %s\n", status_str(st), err ? err : status_str(st));
        plugin_free(err);
        return;
    }
    plugin_free(err);
    wait_turn(rid);
    atomic_store(&g_shim.turn_in_flight, 0);
    atomic_store(&g_shim.cancel_requested, 0);
}

/* /say TEXT: append_message into the current conversation (no model call);
 * the done callback prints it like an answer. */
static void say(const char *cid, const char *text)
{
    const parley_plugin *pl = g_shim.pl;
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, append_message) || !pl->append_message) {
        out_printf("parley! invalid_input: this plugin has no append_message\n");
        return;
    }
    json_t *m = json_pack("{s:s,s:s}", "conversation_id", cid, "content", text);
    if (m && persona)
        json_object_set_new(m, "persona", json_string(persona));
    char *message = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (!message) {
        out_printf("parley! no_memory: out of memory\n");
        return;
    }
    pthread_mutex_lock(&g_shim.mu);
    cur.done = 0;
    pthread_mutex_unlock(&g_shim.mu);
    cur.ndeltas = 0;
    live_reset();
    char *err = NULL;
    parley_request_id rid = 0;
    atomic_store(&g_shim.cancel_requested, 0);
    atomic_store(&g_shim.turn_in_flight, 1);
    parley_status st = pl->append_message(g_shim.agent, message, on_done, NULL, &rid, &err);
    free(message);
    if (st == PARLEY_OK)
        wait_turn(rid);
    else
        out_printf("parley! %s: %s\n", status_str(st), err ? err : status_str(st));
    plugin_free(err);
    atomic_store(&g_shim.turn_in_flight, 0);
    atomic_store(&g_shim.cancel_requested, 0);
}

/* Print a snapshot (history, list, metrics) pretty, or the error. */
static void show(parley_status st, char *out, const char *what, const char *id)
{
    if (st == PARLEY_OK) {
        json_t *v = out ? json_loads(out, JSON_DECODE_ANY, NULL) : NULL;
        char *pretty = v ? json_dumps(v, SHIM_JSON_PRETTY) : NULL;
        out_printf("%s\n", pretty ? pretty : out ? out : "null");
        free(pretty);
        json_decref(v);
    } else if (st == PARLEY_ERR_NOT_FOUND && id) {
        out_printf("parley! %s: no %s '%s'\n", status_str(st), what, id);
    } else {
        /* a store failure comes with the store's words: {"error":{"message"}} */
        json_t *e = out ? json_loads(out, 0, NULL) : NULL;
        json_t *error = json_object_get(e, "error");
        const char *why = json_string_value(json_object_get(error, "message"));
        out_printf("parley! %s: %s failed%s%s\n", status_str(st), what, why ? ": " : "",
                   why ? why : "");
        json_decref(e);
    }
    plugin_free(out);
}

/* One line per message: "role: text", tool calls as "-> name args", tool
 * results as "<- content". */
static void print_history_compact(const char *json)
{
    json_t *h = json ? json_loads(json, 0, NULL) : NULL;
    size_t i, j, k;
    json_t *turn, *m, *call;
    json_array_foreach(json_object_get(h, "turns"), i, turn) {
        json_array_foreach(json_object_get(turn, "messages"), j, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *content = json_object_get(m, "content");
            char *prefix = NULL;
            if (asprintf(&prefix, "%s: %s", role ? role : "?",
                         role && strcmp(role, "tool") == 0 ? "<- " : "") < 0)
                continue;
            if (json_is_string(content)) {
                /* One line per message: line breaks in the text become spaces. */
                char *text = strdup(json_string_value(content));
                for (char *c = text; c && *c; c++)
                    if (*c == '\n' || *c == '\r')
                        *c = ' ';
                out_printf("%s%s\n", prefix, text ? text : "");
                free(text);
            } else if (content && !json_is_null(content)) {
                print_value(prefix, content, ""); /* content parts: compact JSON */
            }
            json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
                json_t *fn = json_object_get(call, "function");
                const char *name = json_string_value(json_object_get(fn, "name"));
                const char *args = json_string_value(json_object_get(fn, "arguments"));
                out_printf("%s: -> %s %s\n", role ? role : "?", name ? name : "?",
                           args ? args : "{}");
            }
            free(prefix);
        }
    }
    if (!h)
        out_printf("%s\n", json ? json : "null");
    json_decref(h);
}

/* /search TEXT: history_query over every conversation, newest first, one line
 * per message: "[conversation_id created_at] role: text". */
static void search(const char *text)
{
    json_t *q = json_pack("{s:s, s:i}", "search", text, "limit", 20);
    char *qs = q ? json_dumps(q, SHIM_JSON_COMPACT) : NULL;
    json_decref(q);
    char *out = NULL;
    parley_status st = qs ? g_shim.pl->history_query(g_shim.agent, qs, &out) : PARLEY_ERR_NO_MEMORY;
    free(qs);
    json_t *r = out ? json_loads(out, 0, NULL) : NULL;
    if (st != PARLEY_OK) {
        const char *why =
            json_string_value(json_object_get(json_object_get(r, "error"), "message"));
        out_printf("search: %s%s%s\n", status_str(st), why ? ": " : "", why ? why : "");
    } else if (json_array_size(json_object_get(r, "messages")) == 0) {
        out_printf("(no message holds \"%s\")\n", text);
    }
    size_t i;
    json_t *m;
    json_array_foreach(st == PARLEY_OK ? json_object_get(r, "messages") : NULL, i, m) {
        const char *content =
            json_string_value(json_object_get(json_object_get(m, "message"), "content"));
        char *line = strdup(content ? content : "");
        for (char *c = line; c && *c; c++)
            if (*c == '\n' || *c == '\r')
                *c = ' ';
        out_printf("[%s %s] %s: %s\n", json_string_value(json_object_get(m, "conversation_id")),
                   json_string_value(json_object_get(m, "created_at")),
                   json_string_value(json_object_get(m, "role")), line ? line : "");
        free(line);
    }
    json_decref(r);
    plugin_free(out);
}

/* A URL-valued option with credentials ("redis://:pw@host", "https://u:pw@h")
 * as a new string with the user-info masked, or NULL when it has none.  The
 * user-info ends at the last '@', as the plugin reads it: for Redis anywhere
 * (its password may hold '@', '/', '?' or '#'), else within the authority. */
static json_t *masked_credentials(json_t *v)
{
    const char *s = json_string_value(v);
    const char *scheme_end = s ? strstr(s, "://") : NULL;
    if (!scheme_end)
        return NULL;
    const char *host = scheme_end + 3;
    int redis = strncmp(s, "redis://", 8) == 0;
    size_t authority = redis ? strlen(host) : strcspn(host, "/?#");
    const char *at = NULL;
    for (const char *p = host; p < host + authority; p++)
        if (*p == '@')
            at = p;
    if (!at)
        return NULL;
    char *masked = NULL;
    if (asprintf(&masked, "%.*s********%s", (int)(host - s), s, at) < 0)
        return NULL;
    json_t *out = json_string(masked);
    free(masked);
    return out;
}

/* The options create() got, completed with the schema's defaults; secrets
 * (writeOnly in the schema, and credentials inside URLs such as a Redis
 * history_store's password) masked.  Returns a new object. */
static json_t *effective_options(void)
{
    char *text = g_shim.pl->options_schema();
    json_t *schema = text ? json_loads(text, 0, NULL) : NULL;
    plugin_free(text);
    json_t *eff = json_object();
    const char *name;
    json_t *p;
    json_object_foreach(json_object_get(schema, "properties"), name, p) {
        json_t *v = g_shim.options ? json_object_get(g_shim.options, name) : NULL;
        if (!v)
            v = json_object_get(p, "default");
        if (!v)
            continue;
        json_t *masked = masked_credentials(v);
        if (json_is_true(json_object_get(p, "writeOnly")) && !json_is_null(v))
            json_object_set_new(eff, name, json_string("********"));
        else if (masked)
            json_object_set_new(eff, name, masked);
        else
            json_object_set(eff, name, v);
        if (masked && json_object_get(eff, name) != masked)
            json_decref(masked);
    }
    json_decref(schema);
    return eff;
}

static void banner(void)
{
    json_t *o = effective_options();
    const char *model = json_string_value(json_object_get(o, "model"));
    const char *url = json_string_value(json_object_get(o, "base_url"));
    size_t ntools = json_array_size(json_object_get(o, "tools"));
    out_printf("parley %s: model %s at %s%s, %zu tool%s. /help for commands.\n",
               g_shim.pl->version ? g_shim.pl->version : "?", model ? model : "?", url ? url : "?",
               json_is_true(json_object_get(o, "stream")) ? ", streaming" : "", ntools,
               ntools == 1 ? "" : "s");
    json_decref(o);
}

static void help(void)
{
    out_printf("Type a message to talk to the agent.  Commands:\n"
               "  /new      start a new conversation (forget the conversation id)\n"
               "  /id       show the current conversation id\n"
               "  /history  show the current conversation (of the current persona),\n"
               "            one line per message\n"
               "            (/history --json: the full JSON)\n"
               "  /options  show the effective options (secrets masked)\n"
               "  /list     list the conversations the agent remembers\n"
               "  /clear    forget the current conversation (of the current persona)\n"
               "  /search TEXT  the 20 newest messages of any conversation holding TEXT\n"
               "  /say TEXT  add TEXT to the conversation as the assistant's message,\n"
               "            without asking the model (append_message)\n"
               "  /metrics  show the agent's counters\n"
               "  /persona NAME  speak to persona NAME from now on (its own history);\n"
               "            /persona alone: back to the agent's own prompt\n"
               "  /image PATH  attach an image file to the next message\n"
               "  /quit     leave (end of input and Ctrl-C at the prompt do too)\n"
               "Ctrl-C while the agent is thinking cancels that turn.\n"
               "  /help     this text\n");
}

/* The selector of conversation `cid` under the current persona (compact JSON, malloc'd). */
static char *persona_selector(const char *cid)
{
    json_t *sel = json_pack("{s:s,s:s}", "conversation_id", cid, "persona", persona);
    char *text = sel ? json_dumps(sel, JSON_COMPACT) : NULL;
    json_decref(sel);
    return text;
}

/* history_get (no persona) or history_get_by (the current persona). */
static parley_status history_of(const char *cid, char **out)
{
    const parley_plugin *pl = g_shim.pl;
    if (!persona)
        return pl->history_get(g_shim.agent, cid, out);
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, history_get_by) || !pl->history_get_by)
        return PARLEY_ERR_INVALID_INPUT;
    char *sel = persona_selector(cid);
    parley_status st = sel ? pl->history_get_by(g_shim.agent, sel, out) : PARLEY_ERR_NO_MEMORY;
    free(sel);
    return st;
}

static parley_status clear_of(const char *cid)
{
    const parley_plugin *pl = g_shim.pl;
    if (!persona)
        return pl->history_clear(g_shim.agent, cid);
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, history_clear_by) || !pl->history_clear_by)
        return PARLEY_ERR_INVALID_INPUT;
    char *sel = persona_selector(cid);
    parley_status st = sel ? pl->history_clear_by(g_shim.agent, sel) : PARLEY_ERR_NO_MEMORY;
    free(sel);
    return st;
}

/* Returns 1 to quit. */
static int command(const char *cmd)
{
    const parley_plugin *pl = g_shim.pl;
    char *out = NULL;
    /* Only this thread changes conv_id between turns; no turn runs now. */
    pthread_mutex_lock(&g_shim.mu);
    char *cid = conv_id ? strdup(conv_id) : NULL;
    pthread_mutex_unlock(&g_shim.mu);

    if (strcmp(cmd, "/quit") == 0) {
        free(cid);
        return 1;
    } else if (strcmp(cmd, "/help") == 0) {
        help();
    } else if (strcmp(cmd, "/new") == 0) {
        pthread_mutex_lock(&g_shim.mu);
        free(conv_id);
        conv_id = NULL;
        pthread_mutex_unlock(&g_shim.mu);
        out_printf("(new conversation)\n");
    } else if (strcmp(cmd, "/id") == 0) {
        out_printf("%s\n", cid ? cid : "(none)");
    } else if (strcmp(cmd, "/history") == 0 || strcmp(cmd, "/history --json") == 0) {
        if (!cid) {
            out_printf("(no conversation)\n");
        } else {
            parley_status st = history_of(cid, &out);
            if (st == PARLEY_OK && strcmp(cmd, "/history") == 0) {
                print_history_compact(out);
                plugin_free(out);
            } else {
                show(st, out, "conversation", cid);
            }
        }
    } else if (strcmp(cmd, "/options") == 0) {
        json_t *o = effective_options();
        char *pretty = json_dumps(o, SHIM_JSON_PRETTY);
        out_printf("%s\n", pretty ? pretty : "{}");
        free(pretty);
        json_decref(o);
    } else if (strcmp(cmd, "/list") == 0) {
        parley_status st = pl->conversations_list(g_shim.agent, &out);
        show(st, out, "conversations_list", NULL);
    } else if (strncmp(cmd, "/search ", 8) == 0 && cmd[8]) {
        search(cmd + 8);
    } else if (strncmp(cmd, "/say ", 5) == 0 && cmd[5]) {
        if (cid)
            say(cid, cmd + 5);
        else
            out_printf("(no conversation: say something first)\n");
    } else if (strcmp(cmd, "/metrics") == 0) {
        parley_status st = pl->metrics(g_shim.agent, &out);
        show(st, out, "metrics", NULL);
    } else if (strcmp(cmd, "/clear") == 0) {
        if (!cid) {
            out_printf("(no conversation)\n"); /* never clear-all by accident */
        } else {
            parley_status st = clear_of(cid);
            if (st == PARLEY_OK)
                out_printf("(cleared)\n");
            else
                show(st, NULL, "conversation", cid);
        }
    } else if (strcmp(cmd, "/persona") == 0 || strncmp(cmd, "/persona ", 9) == 0) {
        const char *name = cmd[8] ? cmd + 9 : "";
        free(persona);
        persona = *name ? strdup(name) : NULL; /* the plugin checks the name at the next turn */
        if (persona)
            out_printf("(persona %s)\n", persona);
        else
            out_printf("(no persona: the agent's own prompt)\n");
    } else if (strncmp(cmd, "/image ", 7) == 0 && cmd[7]) {
        char *why = NULL, *url = shim_image_data_url(cmd + 7, &why);
        if (!url) {
            out_printf("parley! invalid_input: %s\n", why ? why : "out of memory");
        } else {
            if (!pending_images)
                pending_images = json_array();
            json_array_append_new(pending_images, json_pack("{s:s}", "url", url));
            out_printf("(image %s attached to the next message)\n", cmd + 7);
        }
        free(url);
        free(why);
    } else {
        out_printf("unknown command %s (try /help)\n", cmd);
    }
    free(cid);
    return 0;
}

static void trim(char *s, size_t *len)
{
    while (*len > 0 && (s[*len - 1] == '\r' || s[*len - 1] == ' ' || s[*len - 1] == '\t'))
        s[--*len] = '\0';
}

int run_interactive(void)
{
    struct line_reader lr;
    if (lr_init(&lr, 0) < 0) {
        diag(PARLEY_LOG_ERROR, "out of memory");
        return 0;
    }
    int tty = isatty(0);
    interactive_on = 1;
    banner();
    for (;;) {
        if (tty)
            out_text("you> ", 5);
        enum lr_status st = lr_next(&lr);
        if (tty && st == LR_LINE)
            out_input_echoed();
        if (st != LR_LINE) {
            if (tty)
                out_text("\n", 1); /* leave the terminal on a fresh line */
            break;
        }
        if (lr.too_long) {
            out_printf("parley! invalid_input: line longer than %u bytes\n", SHIM_MAX_LINE);
            continue;
        }
        trim(lr.line, &lr.len);
        const char *p = lr.line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            continue;
        if (*p == '/') {
            if (command(p))
                break;
        } else {
            run_turn(p);
        }
        if (shim_interrupted())
            break;
    }
    lr_free(&lr);
    return 0;
}

void interactive_free(void)
{
    free(conv_id);
    conv_id = NULL;
    free(persona);
    persona = NULL;
    json_decref(pending_images);
    pending_images = NULL;
    live_reset();
    free(live);
    live = NULL;
    live_cap = 0;
}
