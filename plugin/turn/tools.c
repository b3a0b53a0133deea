/* tools.c -- the host's side of a tool round; see tools.h. */
#include "turn/tools.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tool_handle.h"
#include "lib/json_oom.h"
#include "lib/utf8.h"

void tools_free(turn *t)
{
    for (size_t i = 0; i < t->tool.ncalls; i++) {
        free(t->tool.calls[i].id);
        free(t->tool.calls[i].name);
        free(t->tool.calls[i].arguments);
        free(t->tool.calls[i].content);
    }
    free(t->tool.calls);
    t->tool.calls = NULL;
    t->tool.ncalls = t->tool.pending = 0;
}

static char *error_content(const char *kind, const char *text)
{
    json_t *o = json_pack("{s:s,s:s}", "error", kind, "error_text", text);
    char *s = o ? json_dumps_whole(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

int tools_take(turn *t, llm_reply *reply)
{
    tools_free(t);
    t->tool.calls = calloc(reply->ncalls, sizeof *t->tool.calls);
    if (!t->tool.calls)
        return -1;
    t->tool.ncalls = reply->ncalls;
    /* Before anything is sent or stored: ids the calls of the turn do not share. */
    if (llm_reply_claim_ids(reply, &t->tool.ids, t->ctx.nhistory + t->rec.nmessages) != 0)
        return -1;
    for (size_t i = 0; i < reply->ncalls; i++) {
        /* Take the strings over from the reply instead of copying them. */
        t->tool.calls[i].id = reply->calls[i].id;
        t->tool.calls[i].name = reply->calls[i].name;
        t->tool.calls[i].arguments = reply->calls[i].arguments;
        reply->calls[i].id = reply->calls[i].name = reply->calls[i].arguments = NULL;
    }
    return 0;
}

/* 1 when the call cannot go to the host, with *content its error content (NULL out of
   memory: never a call sent on because its refusal could not be written); 0 when it can. */
static int call_problem(const turn *t, const turn_call *c, char **content)
{
    if (!toolset_has(t->in.tools, c->name)) {
        *content = error_content("unknown_tool", "No tool with this name is available");
        return 1;
    }
    json_error_t jerr;
    json_t *args = json_loads(c->arguments, 0, &jerr);
    int is_object = json_is_object(args);
    json_decref(args);
    if (!is_object) {
        char *text = pstr_printf("Arguments are not a JSON object%s%s", args ? "" : ": ",
                                 args ? "" : utf8_mend(jerr.text));
        *content = error_content("invalid_arguments", text ? text : "invalid arguments");
        free(text);
        return 1;
    }
    if (!t->env->host->tool_call) {
        *content = error_content("no_executor", "The host does not execute tools");
        return 1;
    }
    return 0;
}

int tools_send(turn *t)
{
    /* Count every call pending first: the host may complete one inside its callback. */
    t->tool.pending = t->tool.ncalls;
    for (size_t i = 0; i < t->tool.ncalls; i++) {
        turn_call *c = &t->tool.calls[i];
        atomic_fetch_add(&t->env->metrics->tool_calls, 1);
        char *problem = NULL;
        if (call_problem(t, c, &problem)) {
            if (!problem)
                return -1;
            c->content = problem;
            c->is_error = 1;
            t->tool.pending--;
            atomic_fetch_add(&t->env->metrics->tool_errors, 1);
            continue;
        }
        parley_tool_call *h = inbox_handle_new(t->env->box, t, i);
        parley_tool_call *given = h ? tool_handle_register(h) : NULL;
        if (!given) {
            if (h)
                inbox_handle_free(h);
            return -1;
        }
        c->handle = h;
        parley_tool_call_info info = {
            .struct_size = sizeof info,
            .request_id = t->id,
            .conversation_id = t->conv.conversation_id,
            .turn_id = t->turn_id,
            .call_id = c->id,
            .tool_name = c->name,
            .arguments_json = c->arguments,
            .user_data = t->host.user_data,
            .language = t->in.language,
            .device_id = t->in.device_id,
            .satellite_id = t->in.satellite_id,
            .agent_id = t->in.agent_id,
            .context_json = t->in.context_json,
            .interface_type =
                t->conv.interface_type && *t->conv.interface_type ? t->conv.interface_type : NULL,
            .persona = t->conv.persona_name,
        };
        /* The host cannot end the turn from here: cancel and results go through the inbox. */
        t->env->host->tool_call(t->env->host->host_data, given, &info);
    }
    return 0;
}

/* The tool message content for what the host gave back. */
static char *result_content(const turn *t, const char *result, int is_error, int *is_error_out)
{
    size_t max = (size_t)t->cfg->opts.max_tool_result_bytes;
    const char *text = result ? result : "";
    size_t n = strlen(text);
    *is_error_out = 1;
    if (n > max) {
        char *m =
            pstr_printf("The tool result of %zu bytes exceeds max_tool_result_bytes (%zu)", n, max);
        char *s = error_content("result_too_large", m ? m : "result too large");
        free(m);
        return s;
    }
    if (!utf8_valid(text, n))
        return error_content("invalid_result", "The tool result is not valid UTF-8");
    if (is_error) {
        /* A JSON string means the text inside; other JSON stays JSON, under
         * "details" (never JSON inside a string), with its message, if it has
         * one, as the error_text; anything else is the text itself. */
        json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
        if (!v || json_is_string(v)) {
            char *s = error_content("tool_error", v       ? json_string_value(v)
                                                  : *text ? text
                                                          : "The tool failed");
            json_decref(v);
            return s;
        }
        const char *said = json_string_value(json_object_get(v, "message"));
        if (!said)
            said = json_string_value(json_object_get(v, "error"));
        json_t *o = json_pack("{s:s,s:s,s:O}", "error", "tool_error", "error_text",
                              said ? said : "The tool failed (see details)", "details", v);
        char *s = o ? json_dumps_whole(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        json_decref(v);
        return s;
    }
    *is_error_out = 0;
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    char *s =
        v ? json_dumps_whole(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : strdup(text);
    json_decref(v);
    return s;
}

/* Drop the turn's claim on a handle: a later completion is then discarded. */
static void detach_handle(turn_call *c)
{
    if (!c->handle)
        return;
    inbox_handle_detach(c->handle);
    c->handle = NULL;
}

void tools_detach(turn *t)
{
    for (size_t i = 0; i < t->tool.ncalls; i++)
        detach_handle(&t->tool.calls[i]);
}

int tools_take_result(turn *t, parley_tool_call *h)
{
    turn_call *c = &t->tool.calls[h->index];
    c->handle = NULL;
    c->content = result_content(t, h->result, h->is_error, &c->is_error);
    if (c->is_error)
        atomic_fetch_add(&t->env->metrics->tool_errors, 1);
    if (!c->content)
        return -1;
    t->tool.pending--;
    return 0;
}

int tools_time_out(turn *t)
{
    for (size_t i = 0; i < t->tool.ncalls; i++) {
        turn_call *c = &t->tool.calls[i];
        if (c->content)
            continue;
        detach_handle(c);
        char *m = pstr_printf("The host did not answer within %lld ms",
                              (long long)t->cfg->opts.tool_timeout_ms);
        c->content = error_content("timeout", m ? m : "timeout");
        c->is_error = 1;
        free(m);
        atomic_fetch_add(&t->env->metrics->tool_timeouts, 1);
        if (!c->content)
            return -1;
    }
    t->tool.pending = 0;
    return 0;
}
