/* summary.c -- the summary a turn makes after its commit; see summary.h. */
#include "turn/summary.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/store_jobs.h"
#include "lib/clock.h"
#include "lib/host_log.h"
#include "lib/json_oom.h"
#include "store/message_text.h"
#include "turn/budget.h"

static const char SUMMARY_PROMPT[] =
    "You keep a running summary of a conversation between a user and an assistant, for the "
    "assistant to read later in place of the turns it covers. You get the summary so far and "
    "the turns that follow it. Write the updated summary: the facts, names, preferences, "
    "requests, decisions and open questions worth remembering, including what the tools "
    "returned, in the conversation's language, at most 250 words. Write only the summary.";

/* The summary made ahead: the conversation's own request (which the server
 * has cached), then this. */
static const char AHEAD_PROMPT[] =
    "Before the conversation goes on: write the summary of the earlier conversation (shown "
    "after the instructions at the top, if there is one) updated with the first %zu "
    "exchanges of the conversation below it (an exchange: a user message, any tool calls and "
    "results, and the answer). Keep the facts, names, preferences, requests, decisions and "
    "open questions worth remembering, including what the tools returned, in the "
    "conversation's language, at most 250 words. Write only the summary.";

void summary_end(turn *t, int made, const char *why)
{
    atomic_fetch_add(made ? &t->env->metrics->summaries_made : &t->env->metrics->summaries_failed,
                     1);
    if (!made)
        host_log(t->env->host, PARLEY_LOG_WARN,
                 "turn %s: the conversation's summary could not be updated (%s): its turns are "
                 "kept and folded in later",
                 t->turn_id, why ? why : "failed");
    turn_end(t, PARLEY_OK, NULL);
}

/* The summary request's body, in the codec's form, into t->req.body. */
static int render_summary(turn *t, char **err)
{
    ctx_budget b = budget_of(t); /* its request must fit the window: about 3/4 of it */
    double bytes = (double)(b.window - b.reserve) * CTX_BYTES_PER_TOKEN * 0.75 / b.factor;
    char *input = ctx_summary_input(&t->ctx.window, bytes > 1024 ? (size_t)bytes : 1024);
    json_t *msg = input ? json_pack("{s:s,s:s}", "role", "user", "content", input) : NULL;
    json_t *msgs = msg ? json_pack("[O]", msg) : NULL;
    json_t *none = json_array();
    char *text = msg ? json_dumps_whole(msg, JSON_COMPACT) : NULL;
    pbuf text_list = PBUF_INIT; /* the one message as stored text */
    if (text)
        msgtext_append(&text_list, text, strlen(text));
    parley_options o = *t->opts; /* a shallow copy: the summary's own model, no stream */
    o.stream = 0;
    if (o.summary_model)
        o.model = o.summary_model;
    if (o.max_tokens <= 0 || o.max_tokens > 600)
        o.max_tokens = 600;
    int rc = -1;
    if (msgs && none && text && !text_list.oom) {
        int as_text = t->cfg->prov->reads_history_text; /* the codec's form (turn_render_request) */
        provider_request r = {
            .system = SUMMARY_PROMPT,
            .system_fixed_len = sizeof SUMMARY_PROMPT - 1,
            .history = as_text ? NULL : none,
            .history_text = as_text ? "" : NULL,
            .messages = as_text ? NULL : msgs,
            .messages_text = as_text ? text_list.data : NULL,
            .messages_text_len = text_list.len,
            .tools_json = "[]",
        };
        rc = t->cfg->prov->encode(&t->req.body, &o, &r, err);
    }
    free(input);
    free(text);
    pbuf_free(&text_list);
    json_decref(msg);
    json_decref(msgs);
    json_decref(none);
    return rc;
}

/* The request for the summary made ahead of the next cut: this turn's own
 * last request plus its answer and the instruction, in the conversation's
 * codec and options (so the server reads all but the instruction from its
 * cache), without streaming or tools, into t->req.body. */
static int render_ahead(turn *t, size_t k, char **err)
{
    char *instruction = pstr_printf(AHEAD_PROMPT, k);
    if (!instruction)
        return -1;
    size_t mark = t->rec.messages.len;
    pbuf_puts(&t->rec.messages,
              mark ? ",{\"role\":\"user\",\"content\":" : "{\"role\":\"user\",\"content\":");
    pbuf_json_string(&t->rec.messages, instruction, strlen(instruction));
    pbuf_putc(&t->rec.messages, '}');
    free(instruction);
    parley_options o = *t->opts; /* a shallow copy: one answer, not streamed */
    o.stream = 0;
    const parley_options *saved = t->opts;
    int rounds = t->tool.rounds;
    t->opts = &o;
    t->tool.rounds = (int)t->cfg->opts.max_tool_iterations; /* tool_choice "none" */
    int rc = t->rec.messages.oom ? -1 : turn_render_request(t, err);
    t->opts = saved;
    t->tool.rounds = rounds;
    t->rec.messages.len = mark; /* the turn's messages as committed */
    if (t->rec.messages.data)
        t->rec.messages.data[mark] = '\0';
    return rc;
}

/* How many turns of the window the summary made ahead of the next cut
 * covers, when one is due: 0 for none. */
static size_t ahead_turns(turn *t)
{
    const char *own = t->opts->summary_model;
    /* Ahead of the cut only with the conversation's own model: another model
     * has none of its prompt cached, so the turns' transcript costs it less. */
    if ((own && strcmp(own, t->opts->model) != 0) || t->in.format) /* not its own answer */
        return 0;
    ctx_budget b = budget_of(t);
    int64_t tokens = budget_body_tokens(t, b.factor) + ctx_tokens(strlen(t->rec.answer), b.factor) +
                     ctx_tokens(sizeof AHEAD_PROMPT, b.factor);
    /* its request must fit too (else the cut's transcript makes the summary) */
    if (tokens > ctx_limit(&b))
        return 0;
    return ctx_ahead_turns(&t->ctx.window, &b, tokens);
}

int summary_render(turn *t)
{
    if (!t->ctx.window.enabled || !t->ctx.window.summarize || t->append)
        return 0;
    size_t ahead = 0;
    if (!t->ctx.window.dropped.len && !(ahead = ahead_turns(t)))
        return 0; /* no turn left the window, and none is about to */
    t->ctx.summary_ahead = ahead;
    char *err = NULL;
    if ((ahead ? render_ahead(t, ahead, &err) : render_summary(t, &err)) != 0) {
        host_log(t->env->host, PARLEY_LOG_WARN, "turn %s: no summary request: %s", t->turn_id,
                 err ? err : "out of memory");
        free(err);
        atomic_fetch_add(&t->env->metrics->summaries_failed, 1);
        return 0;
    }
    pbuf_fit(&t->req.body);
    return 1;
}

int summary_take(turn *t, CURLcode code, char **expected, size_t *expected_len)
{
    char *msg = NULL;
    int retryable = 0;
    parley_status st = http_call_outcome(t->req.http, code, &msg, &retryable);
    llm_reply reply;
    memset(&reply, 0, sizeof reply);
    char *err = NULL;
    const pbuf *body = &t->req.http->body; /* never streamed: the whole answer is here */
    if (st == PARLEY_OK &&
        provider_decode(t->cfg->prov, t->cfg->opts.strip_think_tags, body->data ? body->data : "",
                        body->len, &reply, &err) != 0)
        st = PARLEY_ERR_BAD_RESPONSE;
    http_call_free(t->req.http);
    t->req.http = NULL;
    const char *summary = reply.content;
    while (summary && (*summary == ' ' || *summary == '\n'))
        summary++;
    /* the record the commit wrote: the summary replaces it only if no other host's turn
       has written one since (a shared store) */
    *expected_len = t->ctx.window.record.len;
    *expected = malloc(*expected_len + 1);
    if (*expected)
        memcpy(*expected, t->ctx.window.record.data ? t->ctx.window.record.data : "",
               *expected_len + 1);
    int rc = -1;
    if (!*expected) {
        summary_end(t, 0, "out of memory");
    } else if (st != PARLEY_OK || !summary || !*summary) {
        summary_end(t, 0,
                    st != PARLEY_OK ? (err   ? err
                                       : msg ? msg
                                             : status_name(st))
                                    : "an empty answer");
    } else if ((t->ctx.summary_ahead
                    ? ctx_record_write_next(&t->ctx.window, summary, t->ctx.summary_ahead)
                    : ctx_record_write_summary(&t->ctx.window, summary)) != 0) {
        summary_end(t, 0, "out of memory");
    } else { /* the record: the same start, the new summary up to it */
        rc = 0;
    }
    if (rc != 0) { /* (the turn has ended: t is gone) */
        free(*expected);
        *expected = NULL;
    }
    free(msg);
    free(err);
    llm_reply_free(&reply);
    return rc;
}

void summary_save(turn *t, const store_key *key, char *expected, size_t expected_len)
{
    if (!t->env->jobs) {
        char *serr = NULL;
        parley_status sst = store_context_set(t->env->store, key, t->ctx.window.record.data,
                                              t->ctx.window.record.len, expected, expected_len,
                                              clock_wall_ms(), &serr);
        free(expected);
        summary_saved(t, sst, serr);
        free(serr);
        return;
    }
    store_job *job = store_job_new(STORE_JOB_SET_CONTEXT, key);
    char *copy = job ? malloc(t->ctx.window.record.len + 1) : NULL;
    if (copy) { /* the job's own: the turn may end before it runs */
        memcpy(copy, t->ctx.window.record.data, t->ctx.window.record.len + 1);
        job->turn.context = copy;
        job->turn.context_len = t->ctx.window.record.len;
        job->expected = expected;
        job->expected_len = expected_len;
        expected = NULL; /* the job's */
        job->owner = t;
        t->job = job;
    }
    if (!copy || store_jobs_submit(t->env->jobs, job) != 0) {
        t->job = NULL;
        store_job_free(job);
        free(expected);
        summary_end(t, 0, "out of memory");
    }
}

void summary_saved(turn *t, parley_status status, const char *message)
{
    t->job = NULL;
    if (status != PARLEY_OK) {
        char *m = pstr_printf("could not store it: %s", message ? message : status_name(status));
        summary_end(t, 0, m ? m : "could not store it");
        free(m);
        return;
    }
    summary_end(t, 1, NULL);
}
