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
#include <unistd.h>

#include "shim.h"

/* The one turn in flight.  Static, not on the stack: after a signal the
 * done callback may run inside destroy(), after run_interactive returned. */
static struct {
    size_t ndeltas; /* delta/done callbacks only (ordered by the plugin) */
    int done;       /* under g_shim.mu */
} cur;

/* Last conversation id a result reported (under g_shim.mu). */
static char *conv_id;

static void print_value(const char *prefix, json_t *v, const char *suffix) {
    /* Strings as their text, anything else as compact JSON. */
    char *dumped = json_is_string(v) ? NULL : json_dumps(v, SHIM_JSON_COMPACT);
    const char *s = json_is_string(v) ? json_string_value(v) : dumped ? dumped : "";
    out_printf("%s%s%s\n", prefix, s, suffix);
    free(dumped);
}

/* Tool steps, readably: "  -> name args" and "  <- content [(error)]". */
static void print_steps(const char *steps_json) {
    json_t *steps = steps_json ? json_loads(steps_json, JSON_DECODE_ANY, NULL) : NULL;
    size_t i;
    json_t *s;
    json_array_foreach(steps, i, s) {
        const char *type = json_string_value(json_object_get(s, "type"));
        const char *name = json_string_value(json_object_get(s, "name"));
        if (!type)
            continue;
        if (strcmp(type, "tool_call") == 0) {
            char *prefix = NULL;
            if (asprintf(&prefix, "  -> %s ", name ? name : "?") < 0)
                continue;
            json_t *args = json_object_get(s, "arguments");
            if (args)
                print_value(prefix, args, "");
            else
                out_printf("%s{}\n", prefix);
            free(prefix);
        } else if (strcmp(type, "tool_result") == 0) {
            json_t *content = json_object_get(s, "content");
            print_value("  <- ", content ? content : json_null(),
                        json_is_true(json_object_get(s, "is_error")) ? " (error)" : "");
        }
    }
    json_decref(steps);
}

static void on_delta(void *user_data, parley_request_id request_id, const char *text, size_t len) {
    (void)user_data;
    (void)request_id;
    if (cur.ndeltas++ == 0)
        out_text("parley> ", 8);
    if (text && len)
        out_text(text, len);
}

static void on_done(void *user_data, const parley_result *r) {
    (void)user_data;
#define FIELD(f, dflt) (SHIM_HAS_FIELD(r, parley_result, f) ? r->f : (dflt))
    parley_status status = FIELD(status, PARLEY_ERR_INTERNAL);
    const char *steps = FIELD(steps_json, NULL);
    /* Steps are known only now: before the reply normally, after it when
     * the reply was already streamed. */
    if (cur.ndeltas > 0)
        out_text("\n", 1);
    else
        print_steps(steps);
    if (status == PARLEY_OK) {
        if (cur.ndeltas == 0) {
            const char *resp = FIELD(response, NULL);
            out_printf("parley> %s\n", resp ? resp : "");
        }
    } else {
        const char *msg = FIELD(error_message, NULL);
        out_printf("parley! %s: %s\n", status_str(status), msg ? msg : status_str(status));
    }
    if (cur.ndeltas > 0)
        print_steps(steps);
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

static void run_turn(const char *text) {
    pthread_mutex_lock(&g_shim.mu);
    char *cid = conv_id ? strdup(conv_id) : NULL;
    cur.done = 0;
    pthread_mutex_unlock(&g_shim.mu);
    cur.ndeltas = 0;

    parley_input in = {
        .struct_size = sizeof in,
        .text = text,
        .conversation_id = cid,
        .on_delta = on_delta,
    };
    char *err = NULL;
    parley_status st = g_shim.pl->async_process(g_shim.agent, &in, on_done, NULL, NULL, &err);
    free(cid);
    if (st != PARLEY_OK) {
        out_printf("parley! %s: %s\n", status_str(st), err ? err : status_str(st));
        plugin_free(err);
        return;
    }
    plugin_free(err);
    pthread_mutex_lock(&g_shim.mu);
    while (!cur.done && !shim_interrupted())
        pthread_cond_wait(&g_shim.cv, &g_shim.mu);
    pthread_mutex_unlock(&g_shim.mu);
}

/* Print a snapshot (history, list, metrics) pretty, or the error. */
static void show(parley_status st, char *out, const char *what, const char *id) {
    if (st == PARLEY_OK) {
        json_t *v = out ? json_loads(out, JSON_DECODE_ANY, NULL) : NULL;
        char *pretty = v ? json_dumps(v, SHIM_JSON_PRETTY) : NULL;
        out_printf("%s\n", pretty ? pretty : out ? out : "null");
        free(pretty);
        json_decref(v);
    } else if (st == PARLEY_ERR_NOT_FOUND && id) {
        out_printf("parley! %s: no %s '%s'\n", status_str(st), what, id);
    } else {
        out_printf("parley! %s: %s failed\n", status_str(st), what);
    }
    plugin_free(out);
}

static void help(void) {
    out_printf("Type a message to talk to the agent.  Commands:\n"
               "  /new      start a new conversation (forget the conversation id)\n"
               "  /id       show the current conversation id\n"
               "  /history  show the current conversation's history\n"
               "  /list     list the conversations the agent remembers\n"
               "  /clear    forget the current conversation in the agent\n"
               "  /metrics  show the agent's counters\n"
               "  /quit     leave (end of input does too)\n"
               "  /help     this text\n");
}

/* Returns 1 to quit. */
static int command(const char *cmd) {
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
    } else if (strcmp(cmd, "/history") == 0) {
        if (!cid) {
            out_printf("(no conversation)\n");
        } else {
            parley_status st = pl->history_get(g_shim.agent, cid, &out);
            show(st, out, "conversation", cid);
        }
    } else if (strcmp(cmd, "/list") == 0) {
        parley_status st = pl->conversations_list(g_shim.agent, &out);
        show(st, out, "conversations_list", NULL);
    } else if (strcmp(cmd, "/metrics") == 0) {
        parley_status st = pl->metrics(g_shim.agent, &out);
        show(st, out, "metrics", NULL);
    } else if (strcmp(cmd, "/clear") == 0) {
        if (!cid) {
            out_printf("(no conversation)\n"); /* never clear-all by accident */
        } else {
            parley_status st = pl->history_clear(g_shim.agent, cid);
            if (st == PARLEY_OK)
                out_printf("(cleared)\n");
            else
                show(st, NULL, "conversation", cid);
        }
    } else {
        out_printf("unknown command %s (try /help)\n", cmd);
    }
    free(cid);
    return 0;
}

static void trim(char *s, size_t *len) {
    while (*len > 0 && (s[*len - 1] == '\r' || s[*len - 1] == ' ' || s[*len - 1] == '\t'))
        s[--*len] = '\0';
}

int run_interactive(void) {
    struct line_reader lr;
    if (lr_init(&lr, 0) < 0) {
        diag(PARLEY_LOG_ERROR, "out of memory");
        return 0;
    }
    int tty = isatty(0);
    for (;;) {
        if (tty)
            out_text("you> ", 5);
        enum lr_status st = lr_next(&lr);
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

void interactive_free(void) {
    free(conv_id);
    conv_id = NULL;
}
