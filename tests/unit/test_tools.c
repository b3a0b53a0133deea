/* test_tools.c -- a tool round's calls as tools_send checks them (turn/tools.c): a call
 * that cannot go to the host gets its error content, and when that content cannot be
 * written (out of memory) the round fails: the call never goes to the host unchecked. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/config.h"
#include "turn/tools.h"

static int calls_seen;

static void record_call(void *host_data, parley_tool_call *call, const parley_tool_call_info *info)
{
    (void)host_data;
    (void)call;
    (void)info;
    calls_seen++;
}

/* While set, every allocation jansson makes fails. */
static int jansson_out_of_memory;

static void *jansson_malloc(size_t n) { return jansson_out_of_memory ? NULL : malloc(n); }

typedef struct tool_round {
    turn t;
    turn_env env;
    agent_counters metrics;
    parley_host host;
} tool_round;

static void round_init(tool_round *r, agent_config *cfg, inbox *box, const char *name,
                       const char *arguments)
{
    memset(r, 0, sizeof *r);
    r->host.tool_call = record_call;
    r->env.metrics = &r->metrics;
    r->env.host = &r->host;
    r->env.box = box;
    r->t.env = &r->env;
    r->t.cfg = cfg;
    r->t.in.tools = cfg->tools;
    r->t.tool.calls = calloc(1, sizeof *r->t.tool.calls);
    r->t.tool.ncalls = r->t.tool.pending = 1;
    r->t.tool.calls[0].id = strdup("call_1");
    r->t.tool.calls[0].name = strdup(name);
    r->t.tool.calls[0].arguments = strdup(arguments);
}

/* A call the host must not get: its error content, or, out of memory, a failed round. */
static void check_refused_call(agent_config *cfg, inbox *box, const char *name,
                               const char *arguments, const char *kind)
{
    tool_round r;
    round_init(&r, cfg, box, name, arguments);
    calls_seen = 0;
    CHECK(tools_send(&r.t) == 0);
    CHECK(calls_seen == 0 && r.t.tool.pending == 0 && r.t.tool.calls[0].is_error);
    CHECK(r.t.tool.calls[0].content && strstr(r.t.tool.calls[0].content, kind));
    tools_free(&r.t);

    round_init(&r, cfg, box, name, arguments);
    jansson_out_of_memory = 1;
    int rc = tools_send(&r.t);
    jansson_out_of_memory = 0;
    CHECK(rc == -1);
    CHECK(calls_seen == 0);
    tools_free(&r.t);
}

int main(void)
{
    parley_status st;
    char *err = NULL;
    agent_config *cfg = config_new("{\"model\":\"m\",\"tools\":[{\"name\":\"lamp\"}]}", &st, &err);
    inbox *box = inbox_new();
    CHECK(cfg && box);
    if (!cfg || !box) {
        fprintf(stderr, "config: %s\n", err ? err : "no inbox");
        return check_report();
    }
    json_set_alloc_funcs(jansson_malloc, free);
    check_refused_call(cfg, box, "lamp", "[1]", "invalid_arguments");
    check_refused_call(cfg, box, "lamp", "{\"a\":", "invalid_arguments");
    check_refused_call(cfg, box, "kettle", "{}", "unknown_tool");
    json_set_alloc_funcs(malloc, free);
    inbox_unref(box);
    config_unref(cfg);
    return check_report();
}
