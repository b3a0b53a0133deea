/*
 * tools.c -- the tools parley-host offers and how it answers tool calls.
 *
 * Two sources: a tools file (canned results, optionally late, from another
 * thread, or never), or the built-in demo home (four devices with on/off
 * state).  Every handle the plugin gives us is completed exactly once: at
 * once, by the completer thread after its delay, or -- for "never" tools and
 * anything still queued -- by tools_shutdown() after destroy().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "shim.h"

enum tool_kind { TOOL_CANNED, TOOL_DEMO_ON, TOOL_DEMO_OFF, TOOL_DEMO_STATE };

struct tool {
    enum tool_kind kind;
    char *name;
    json_t *decl; /* {"name","description","parameters"} as sent in options */
    char *result; /* canned result as JSON text; NULL = "no output" */
    int is_error;
    long delay_ms;
    int from_thread;
    int never;
};

static struct tool *tools;
static size_t ntools;

/* ---- demo home --------------------------------------------------------- */

struct device {
    const char *name;
    const char *type;
    int on;
};

/* Tool calls of one agent come from its worker thread only, but the mutex
 * keeps the state correct for any host threading. */
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct device devices[] = {
    {"kitchen", "light", 0},
    {"bedroom", "light", 0},
    {"living room", "light", 0},
    {"coffee maker", "switch", 0},
};
#define NDEVICES (sizeof devices / sizeof devices[0])

/* ---- pending completions ------------------------------------------------ */

struct pending {
    struct pending *next;
    parley_tool_call *call;
    char *call_id; /* for the interactive "<- result" line; may be NULL */
    const struct tool *tool;
    struct timespec due; /* CLOCK_MONOTONIC */
};

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv;
static struct pending *q_head;     /* delayed calls, sorted by due time */
static struct pending *never_head; /* calls we deliberately never answer */
static int q_stop;
static int q_started;
static pthread_t q_thread;

/* call_id: the call's id when the result is the host's answer (shown live in
 * interactive mode), NULL for teardown answers nobody reads. */
static void complete(parley_tool_call *call, const char *call_id, const char *result, int is_error)
{
    if (call_id)
        interactive_tool_finished(call_id, result, is_error);
    parley_status st = g_shim.pl->complete_tool_call(call, result, is_error);
    if (st != PARLEY_OK)
        diag(PARLEY_LOG_WARN, "complete_tool_call: %s", status_str(st));
}

/* Complete with a JSON value we built (stolen). */
static void complete_json(parley_tool_call *call, const char *call_id, json_t *v, int is_error)
{
    char *s = json_dumps(v, SHIM_JSON_COMPACT);
    json_decref(v);
    complete(call, call_id, s, is_error);
    free(s);
}

static json_t *error_obj(const char *fmt, const char *arg)
{
    char *msg = NULL;
    if (asprintf(&msg, fmt, arg) < 0)
        return json_pack("{s:s}", "error", "out of memory");
    json_t *v = json_object();
    json_object_set_new(v, "error", jstr(msg));
    free(msg);
    return v;
}

static json_t *device_json(const struct device *d, int with_type)
{
    json_t *v = json_object();
    json_object_set_new(v, "ok", json_true());
    json_object_set_new(v, "name", json_string(d->name));
    if (with_type)
        json_object_set_new(v, "type", json_string(d->type));
    json_object_set_new(v, "state", json_string(d->on ? "on" : "off"));
    return v;
}

/* Run one demo tool; returns the result and sets *is_error. */
static json_t *demo_call(enum tool_kind kind, const char *arguments_json, int *is_error)
{
    *is_error = 1;
    json_t *args = arguments_json ? json_loads(arguments_json, 0, NULL) : json_object();
    if (!json_is_object(args)) {
        json_decref(args);
        return error_obj("%s", "arguments must be a JSON object");
    }
    json_t *jname = json_object_get(args, "name");
    json_t *res;
    if (jname && !json_is_string(jname)) {
        res = error_obj("%s", "'name' must be a string");
    } else if (!jname && kind != TOOL_DEMO_STATE) {
        res = error_obj("%s", "missing 'name'");
    } else {
        pthread_mutex_lock(&dev_mu);
        if (!jname) {
            /* get_state without a name: every device. */
            res = json_object();
            json_object_set_new(res, "ok", json_true());
            json_t *arr = json_array();
            for (size_t i = 0; i < NDEVICES; i++) {
                json_t *d = device_json(&devices[i], 1);
                json_object_del(d, "ok");
                json_array_append_new(arr, d);
            }
            json_object_set_new(res, "devices", arr);
            *is_error = 0;
        } else {
            const char *name = json_string_value(jname);
            struct device *d = NULL;
            for (size_t i = 0; i < NDEVICES && !d; i++)
                if (strcasecmp(devices[i].name, name) == 0)
                    d = &devices[i];
            if (!d) {
                res = error_obj("no device named '%s'", name);
            } else {
                if (kind == TOOL_DEMO_ON)
                    d->on = 1;
                else if (kind == TOOL_DEMO_OFF)
                    d->on = 0;
                res = device_json(d, kind == TOOL_DEMO_STATE);
                *is_error = 0;
            }
        }
        pthread_mutex_unlock(&dev_mu);
    }
    json_decref(args);
    return res;
}

/* ---- loading ------------------------------------------------------------ */

static json_t *make_decl(const char *name, const char *description, json_t *parameters)
{
    json_t *d = json_object();
    json_object_set_new(d, "name", json_string(name));
    json_object_set_new(d, "description", json_string(description));
    json_object_set_new(d, "parameters", parameters);
    return d;
}

static struct tool *add_tool(void)
{
    struct tool *nt = realloc(tools, (ntools + 1) * sizeof *tools);
    if (!nt)
        return NULL;
    tools = nt;
    struct tool *t = &tools[ntools++];
    memset(t, 0, sizeof *t);
    return t;
}

static const struct tool *find_tool(const char *name)
{
    for (size_t i = 0; name && i < ntools; i++)
        if (strcmp(tools[i].name, name) == 0)
            return &tools[i];
    return NULL;
}

static int load_demo(char **err)
{
    static const char devices_text[] =
        "Devices: kitchen, bedroom, living room (lights) and coffee maker (switch).";
    static const struct {
        enum tool_kind kind;
        const char *name;
        const char *what;
        int name_required;
    } demo[] = {
        {TOOL_DEMO_ON, "turn_on", "Turn on a device in the home.", 1},
        {TOOL_DEMO_OFF, "turn_off", "Turn off a device in the home.", 1},
        {TOOL_DEMO_STATE, "get_state",
         "Get the state of a device, or of every device when no name is given.", 0},
    };
    for (size_t i = 0; i < sizeof demo / sizeof demo[0]; i++) {
        struct tool *t = add_tool();
        if (!t)
            goto oom;
        t->kind = demo[i].kind;
        t->name = strdup(demo[i].name);
        char *desc = NULL;
        if (asprintf(&desc, "%s %s", demo[i].what, devices_text) < 0)
            desc = NULL;
        /* No "enum" on name: an unknown device must reach us so the model
         * sees the host's own error. */
        json_t *params = json_pack("{s:s, s:{s:{s:s, s:s}}}", "type", "object", "properties",
                                   "name", "type", "string", "description", "Device name");
        if (params && demo[i].name_required)
            json_object_set_new(params, "required", json_pack("[s]", "name"));
        if (!t->name || !desc || !params) {
            free(desc);
            json_decref(params);
            goto oom;
        }
        t->decl = make_decl(demo[i].name, desc, params);
        free(desc);
    }
    return 0;
oom:
    *err = strdup("out of memory");
    return -1;
}

static int entry_error(char **err, const char *path, size_t i, const char *msg)
{
    if (asprintf(err, "%s: tools[%zu]: %s", path, i, msg) < 0)
        *err = NULL;
    return -1;
}

static int get_bool(json_t *e, const char *key, int *out, int *bad)
{
    json_t *v = json_object_get(e, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v)) {
        *bad = 1;
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int load_file(const char *path, char **err)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        int n = je.line > 0 ? asprintf(err, "%s:%d:%d: not valid JSON: %s", path, je.line,
                                       je.column, json_error_reason(&je))
                            : asprintf(err, "%s", je.text);
        if (n < 0)
            *err = NULL;
        return -1;
    }
    int rc = -1;
    json_t *arr = json_object_get(root, "tools");
    if (!json_is_object(root) || !json_is_array(arr) || json_object_size(root) != 1) {
        if (asprintf(err, "%s: expected an object {\"tools\": [...]}", path) < 0)
            *err = NULL;
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        if (!json_is_object(e)) {
            entry_error(err, path, i, "not an object");
            goto out;
        }
        const char *key;
        json_t *v;
        json_object_foreach(e, key, v) {
            static const char *known[] = {"name",  "description", "parameters",  "result",
                                          "error", "delay_ms",    "from_thread", "never"};
            int ok = 0;
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                ok |= strcmp(key, known[k]) == 0;
            if (!ok) {
                char *m = NULL;
                if (asprintf(&m, "unknown key \"%s\"", key) >= 0) {
                    entry_error(err, path, i, m);
                    free(m);
                }
                goto out;
            }
        }
        json_t *name = json_object_get(e, "name");
        json_t *desc = json_object_get(e, "description");
        json_t *params = json_object_get(e, "parameters");
        json_t *delay = json_object_get(e, "delay_ms");
        if (!json_is_string(name) || json_string_length(name) == 0) {
            entry_error(err, path, i, "\"name\" must be a non-empty string");
            goto out;
        }
        if (find_tool(json_string_value(name))) {
            entry_error(err, path, i, "duplicate tool name");
            goto out;
        }
        if (desc && !json_is_string(desc)) {
            entry_error(err, path, i, "\"description\" must be a string");
            goto out;
        }
        if (params && !json_is_object(params)) {
            entry_error(err, path, i, "\"parameters\" must be an object (a JSON Schema)");
            goto out;
        }
        if (delay && (!json_is_integer(delay) || json_integer_value(delay) < 0 ||
                      json_integer_value(delay) > 86400000)) {
            entry_error(err, path, i, "\"delay_ms\" must be an integer from 0 to 86400000");
            goto out;
        }
        struct tool *t = add_tool();
        if (!t) {
            *err = strdup("out of memory");
            goto out;
        }
        t->kind = TOOL_CANNED;
        int bad = 0;
        get_bool(e, "error", &t->is_error, &bad);
        if (bad) {
            entry_error(err, path, i, "\"error\" must be a boolean");
            goto out;
        }
        get_bool(e, "from_thread", &t->from_thread, &bad);
        if (bad) {
            entry_error(err, path, i, "\"from_thread\" must be a boolean");
            goto out;
        }
        get_bool(e, "never", &t->never, &bad);
        if (bad) {
            entry_error(err, path, i, "\"never\" must be a boolean");
            goto out;
        }
        t->delay_ms = delay ? (long)json_integer_value(delay) : 0;
        t->name = strdup(json_string_value(name));
        json_t *res = json_object_get(e, "result");
        if (res)
            t->result = json_dumps(res, SHIM_JSON_COMPACT);
        t->decl = make_decl(json_string_value(name), desc ? json_string_value(desc) : "",
                            params ? json_deep_copy(params)
                                   : json_pack("{s:s, s:{}}", "type", "object", "properties"));
        if (!t->name || !t->decl || (res && !t->result)) {
            *err = strdup("out of memory");
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int tools_load(const char *spec, char **err)
{
    *err = NULL;
    if (strcmp(spec, "demo") == 0)
        return load_demo(err);
    return load_file(spec, err);
}

int tools_declare(json_t *options, char **err)
{
    *err = NULL;
    if (ntools == 0)
        return 0;
    json_t *arr = json_object_get(options, "tools");
    if (!arr) {
        arr = json_array();
        json_object_set_new(options, "tools", arr);
    } else if (!json_is_array(arr)) {
        *err = strdup("the option \"tools\" is not an array, cannot add the tools to it");
        return -1;
    }
    for (size_t i = 0; i < ntools; i++)
        json_array_append(arr, tools[i].decl);
    return 0;
}

/* ---- completer thread --------------------------------------------------- */

static int ts_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Completes queued calls when due; once stopping, completes the rest at
 * once (after destroy() the plugin simply discards them). */
static void *completer(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&q_mu);
    for (;;) {
        struct pending *p = q_head;
        if (!p) {
            if (q_stop)
                break;
            pthread_cond_wait(&q_cv, &q_mu);
            continue;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!q_stop && ts_before(&now, &p->due)) {
            pthread_cond_timedwait(&q_cv, &q_mu, &p->due);
            continue;
        }
        q_head = p->next;
        pthread_mutex_unlock(&q_mu);
        diag(PARLEY_LOG_DEBUG, "tool %s: completing from the completer thread", p->tool->name);
        complete(p->call, p->call_id, p->tool->result, p->tool->is_error);
        free(p->call_id);
        free(p);
        pthread_mutex_lock(&q_mu);
    }
    pthread_mutex_unlock(&q_mu);
    return NULL;
}

int tools_start(char **err)
{
    *err = NULL;
    int need = 0;
    for (size_t i = 0; i < ntools; i++)
        need |= tools[i].kind == TOOL_CANNED && !tools[i].never &&
                (tools[i].delay_ms > 0 || tools[i].from_thread);
    if (!need)
        return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* delays immune to clock changes */
    pthread_cond_init(&q_cv, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&q_thread, NULL, completer, NULL);
    if (e != 0) {
        pthread_cond_destroy(&q_cv);
        if (asprintf(err, "cannot start the tool thread: %s", strerror(e)) < 0)
            *err = NULL;
        return -1;
    }
    q_started = 1;
    return 0;
}

void tools_on_call(void *host_data, parley_tool_call *call, const parley_tool_call_info *info)
{
    (void)host_data;
    const char *name =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, tool_name) ? info->tool_name : NULL;
    const char *args =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, arguments_json) ? info->arguments_json : NULL;
    const char *call_id =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, call_id) ? info->call_id : NULL;
    const char *iface =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, interface_type) ? info->interface_type : NULL;
    const char *persona =
        PARLEY_HAS_FIELD(info, parley_tool_call_info, persona) ? info->persona : NULL;
    diag(PARLEY_LOG_DEBUG, "tool call %s %s", name ? name : "(null)", args ? args : "(null)");
    if (iface || persona)
        diag(PARLEY_LOG_DEBUG, "  from interface %s, persona %s", iface ? iface : "(none)",
             persona ? persona : "(none)");
    interactive_tool_started(info);
    const struct tool *t = find_tool(name);
    if (!t) {
        complete(call, call_id, "{\"error\":\"unknown tool\"}", 1);
        return;
    }
    if (t->kind != TOOL_CANNED) {
        int is_error;
        json_t *res = demo_call(t->kind, args, &is_error);
        complete_json(call, call_id, res, is_error);
        return;
    }
    if (!t->never && t->delay_ms == 0 && !t->from_thread) {
        complete(call, call_id, t->result, t->is_error);
        return;
    }
    struct pending *p = calloc(1, sizeof *p);
    char *id_copy = call_id ? strdup(call_id) : NULL;
    if (!p || (call_id && !id_copy)) {
        free(p);
        free(id_copy);
        complete(call, call_id, "{\"error\":\"host out of memory\"}", 1);
        return;
    }
    p->call_id = id_copy;
    p->call = call;
    p->tool = t;
    clock_gettime(CLOCK_MONOTONIC, &p->due);
    p->due.tv_sec += t->delay_ms / 1000;
    p->due.tv_nsec += (t->delay_ms % 1000) * 1000000L;
    if (p->due.tv_nsec >= 1000000000L) {
        p->due.tv_sec++;
        p->due.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q_mu);
    if (t->never) {
        p->next = never_head;
        never_head = p;
    } else {
        /* Insert after every entry due no later: equal delays keep call order. */
        struct pending **pp = &q_head;
        while (*pp && !ts_before(&p->due, &(*pp)->due))
            pp = &(*pp)->next;
        p->next = *pp;
        *pp = p;
        pthread_cond_signal(&q_cv);
    }
    pthread_mutex_unlock(&q_mu);
}

void tools_shutdown(void)
{
    if (q_started) {
        pthread_mutex_lock(&q_mu);
        q_stop = 1;
        pthread_cond_signal(&q_cv);
        pthread_mutex_unlock(&q_mu);
        pthread_join(q_thread, NULL);
        pthread_cond_destroy(&q_cv);
        q_started = 0;
    }
    /* The ABI keeps unanswered handles alive until completed: answer them
     * now so nothing leaks (the agent is gone, so this is discarded). */
    pthread_mutex_lock(&q_mu);
    struct pending *p = never_head;
    never_head = NULL;
    pthread_mutex_unlock(&q_mu);
    while (p) {
        struct pending *next = p->next;
        complete(p->call, NULL, "{\"error\":\"host shutting down\"}", 1);
        free(p->call_id);
        free(p);
        p = next;
    }
    for (size_t i = 0; i < ntools; i++) {
        free(tools[i].name);
        free(tools[i].result);
        json_decref(tools[i].decl);
    }
    free(tools);
    tools = NULL;
    ntools = 0;
}
