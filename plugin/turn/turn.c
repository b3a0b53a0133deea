/* turn.c -- one turn's data path; see turn.h for the map. */
#include "turn/turn.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "lib/clock.h"
#include "lib/json_oom.h"
#include "lib/rfc3339.h"
#include "lib/host_log.h"
#include "lib/json_schema.h"
#include "lib/redact.h"
#include "lib/utf8.h"
#include "engine/store_jobs.h"
#include "turn/budget.h"
#include "turn/recording.h"
#include "turn/summary.h"
#include "turn/tools.h"
#include "store/message_text.h"
#include "store/store_json.h"

void turn_free(turn *t)
{
    if (!t)
        return;
    free(t->in.text);
    free(t->in.extra_system_prompt);
    free(t->in.context_json);
    free(t->in.language);
    free(t->in.device_id);
    free(t->in.satellite_id);
    free(t->in.agent_id);
    free(t->in.metadata);
    free(t->in.interface_message_id);
    response_format_free(t->in.format);
    free(t->rec.structured);
    reply_context_free(&t->in.reply);
    free(t->conv.conversation_id);
    free(t->conv.persona_name);
    image_list_free(&t->in.images);
    pbuf_free(&t->rec.stored_user);
    free(t->conv.own_interface_type);
    toolset_free(t->in.own_tools);
    pbuf_free(&t->ctx.history);
    ctx_window_free(&t->ctx.window);
    json_decref(t->ctx.history_msgs);
    free(t->req.stop_reason);
    pbuf_free(&t->rec.messages);
    free(t->rec.index);
    pbuf_free(&t->rec.steps);
    llm_call_ids_free(t->tool.ids);
    pbuf_free(&t->req.body);
    free(t->req.stream_error);
    free(t->rec.answer);
    provider_stream_free(t->req.stream);
    tools_free(t);
    free(t->conv.persona_opts);
    config_unref(t->cfg);
    free(t);
}

int turn_apply_persona(turn *t)
{
    t->opts = &t->cfg->opts;
    if (!t->conv.persona_def)
        return 0;
    if (!t->conv.persona_opts && !(t->conv.persona_opts = malloc(sizeof *t->conv.persona_opts)))
        return -1;
    persona_apply(t->conv.persona_def, &t->cfg->opts, t->conv.persona_opts);
    t->opts = t->conv.persona_opts;
    return 0;
}

/* ======================================================================
 * Phases: where the turn is (turn.h), changed only by turn_enter
 * ====================================================================== */

const char *turn_phase_name(turn_phase p)
{
    static const char *const names[] = {
        [TURN_QUEUED] = "queued",         [TURN_LOADING] = "loading",
        [TURN_LEASE_WAIT] = "lease_wait", [TURN_REQUESTING] = "requesting",
        [TURN_BACKOFF] = "backoff",       [TURN_TOOLS] = "tools",
        [TURN_COMMITTING] = "committing", [TURN_SUMMARIZING] = "summarizing",
        [TURN_SUMMARY_SAVING] = "summary_saving", [TURN_ENDED] = "ended",
    };
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

#ifndef NDEBUG
/* The moves the data path makes (turn.h); any other is a bug in this file. */
static int legal_move(turn_phase from, turn_phase to)
{
    if (to == TURN_ENDED)
        return from != TURN_ENDED; /* any failure, cancel or deadline; once */
    switch (from) {
    case TURN_QUEUED: /* a stateless turn asks at once; an append commits at once */
        return to == TURN_LOADING || to == TURN_REQUESTING || to == TURN_COMMITTING;
    case TURN_LOADING:
        return to == TURN_LEASE_WAIT || to == TURN_REQUESTING || to == TURN_COMMITTING;
    case TURN_LEASE_WAIT:
        return to == TURN_LOADING;
    case TURN_REQUESTING: /* again at once: a context overflow sent shorter */
        return to == TURN_REQUESTING || to == TURN_BACKOFF || to == TURN_TOOLS ||
               to == TURN_COMMITTING;
    case TURN_BACKOFF:
    case TURN_TOOLS:
        return to == TURN_REQUESTING;
    case TURN_COMMITTING:
        return to == TURN_SUMMARIZING;
    case TURN_SUMMARIZING:
        return to == TURN_SUMMARY_SAVING;
    default:
        return 0;
    }
}
#endif

/* The one place a turn changes phase. */
static void turn_enter(turn *t, turn_phase to)
{
#ifndef NDEBUG
    if (!legal_move(t->phase, to)) {
        fprintf(stderr, "parley: turn %s: illegal phase change %s -> %s\n", t->turn_id,
                turn_phase_name(t->phase), turn_phase_name(to));
        assert(!"illegal turn phase change");
    }
#endif
    t->phase = to;
}

/* ======================================================================
 * 1. Begin: the last turns of the conversation, from the store
 * ====================================================================== */

static void turn_request(turn *t);
static void turn_commit(turn *t);

static store_key key_of(const turn *t)
{
    return (store_key){t->conv.conversation_id, t->conv.persona, t->conv.interface_type};
}

/* Hand a job to the store threads and wait for it (0), or -1 (the turn ended). */
static int wait_for_store(turn *t, store_job *job)
{
    if (job) {
        job->owner = t;
        t->job = job;
    }
    if (!job || store_jobs_submit(t->env->jobs, job) != 0) {
        t->job = NULL;
        store_job_free(job);
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    return 0;
}

static void turn_load_history(turn *t);

uint64_t turn_clock_ms(const turn *t)
{
    uint64_t now = clock_wall_ms();
    if (!t->in.host_time_ms)
        return now;
    if (!t->rec.nmessages || t->append) /* the user's message (or the appended one): as given */
        return t->in.host_time_ms;
    return t->in.host_time_ms + (now > t->started_wall_ms ? now - t->started_wall_ms : 0);
}

parley_status turn_set_host_time(turn *t, const char *text, const char *field, char **err)
{
    if (!text)
        return PARLEY_OK;
    if (rfc3339_parse(text, &t->in.host_time_ms) == 0 && t->in.host_time_ms != 0)
        return PARLEY_OK;
    t->in.host_time_ms = 0;
    *err = pstr_printf("%s: must be an RFC 3339 time after 1970, e.g. "
                       "\"2026-11-22T19:31:00Z\" or \"2026-11-22T20:31:00.250+01:00\"", field);
    return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

/* append_message's turn: one message, stored as it is, without the model. */
static void append_commit(turn *t)
{
    t->rec.index[0].created_ms = turn_clock_ms(t);
    turn_commit(t);
}

void turn_begin(turn *t)
{
    const turn_env *env = t->env;
    t->started_wall_ms = clock_wall_ms();
    if (t->conv.persona_name && env->persona_metrics &&
        (t->conv.counters = persona_metrics_for(env->persona_metrics, t->conv.persona_name)) &&
        !t->append)
        atomic_fetch_add(&t->conv.counters->turns, 1);
    if (env->persona_metrics) { /* the labelled series (series.h) */
        t->conv.series =
            series_for(&env->persona_metrics->series, t->conv.persona, t->conv.interface_type);
        if (!t->append)
            series_turn_begins(&env->persona_metrics->series, t->conv.conversation_id,
                               t->conv.interface_type, t->conv.persona);
    }
    if (t->append) { /* append_message: its lane reached it; store it, no model */
        if (env->jobs && store_shared(env->store)) {
            turn_load_history(t); /* a shared store: take the lease first (turn_on_history) */
            return;
        }
        append_commit(t);
        return;
    }
    if (!t->conv.conversation_id) {
        turn_on_history(t, PARLEY_OK, NULL);
        return;
    }
    turn_load_history(t);
}

/*
 * The conversation's window (context/window.h): its history from the start
 * its context record names, at most max_history_turns turns.  With a store
 * several processes share (store.h v2), the read thread first takes the
 * conversation's lease; while another process holds it the job comes back
 * PARLEY_ERR_BUSY and the turn waits on its wait timer and tries again
 * (20, 40, 80, then every 160 ms, never past the holder's remaining lease);
 * turn_timeout_ms bounds the wait.
 */
static void turn_load_history(turn *t)
{
    const turn_env *env = t->env;
    store_key key = key_of(t);
    size_t last = (size_t)t->opts->max_history_turns;
    if (t->append)
        last = 1; /* an append only takes the lease: read as little as the store allows */
    size_t window = (size_t)t->opts->max_history_turns; /* what is sent: reply_to's window */
    turn_enter(t, TURN_LOADING);
    if (env->jobs) { /* WAIT loading: the store's read thread loads */
        store_job *job = store_job_new(STORE_JOB_LOAD, &key);
        if (job) {
            job->last_turns = last;
            job->plan_window = !t->append;
            job->summarize = t->opts->summarize;
            job->window_turns = window;
            if (reply_context_copy_target(&job->reply, &t->in.reply) != 0) {
                store_job_free(job);
                job = NULL;
            }
        }
        wait_for_store(t, job);
        return;
    }
    size_t n = 0;
    char *err = NULL;
    uint64_t now = clock_wall_ms();
    parley_status st = t->append
                           ? store_load(env->store, &key, last, now, &t->ctx.history, &n, &err)
                           : ctx_load(env->store, &key, last, t->opts->summarize, now,
                                      &t->ctx.history, &n, &t->ctx.window, &err);
    if (st == PARLEY_OK && reply_context_wanted(&t->in.reply))
        st = reply_context_load(env->store, &key, ctx_reply_window(&t->ctx.window, window), now,
                                &t->in.reply, &err);
    t->ctx.nhistory = n;
    turn_on_history(t, st, err);
    free(err);
}

/*
 * The turn reply_to names, when it is older than the history sent: its
 * messages go after the history, just before the new user message (whole
 * turns, so roles still alternate and every tool call keeps its results);
 * the system prompt says what they are (system_prompt).  Sent, not stored.
 */
static void add_reply_context(turn *t)
{
    reply_context *r = &t->in.reply;
    if (r->outcome != REPLY_INCLUDED)
        return;
    pbuf_append(&t->ctx.history, r->messages.data, r->messages.len);
    t->ctx.nhistory += r->nmessages;
    json_decref(t->ctx.history_msgs); /* parsed again with them, if the codec parses */
    t->ctx.history_msgs = NULL;
}

void turn_on_history(turn *t, parley_status status, const char *message)
{
    t->job = NULL;
    if (status == PARLEY_ERR_BUSY) { /* another host runs a turn on this conversation */
        uint64_t delay = 20u << (t->lease.waits < 3 ? t->lease.waits : 3);
        t->lease.waits++;
        if (t->lease.retry_ms && t->lease.retry_ms < delay)
            delay = t->lease.retry_ms;
        t->lease.retry_ms = 0;
        turn_enter(t, TURN_LEASE_WAIT);
        if (timer_arm(t->env->timers, &t->wait, clock_mono_ms() + delay) != 0)
            turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (status != PARLEY_OK) {
        char *m = pstr_printf("could not load the conversation's history: %s",
                              message ? message : status_name(status));
        turn_end(t, status, m ? m : status_name(status));
        free(m);
        return;
    }
    if (t->append) { /* the lease is ours: other hosts' turns on this conversation wait */
        append_commit(t);
        return;
    }
    add_reply_context(t);
    record_user_message(t);
    turn_request(t);
}

/* ======================================================================
 * 2. Request: render the body (within the window's budget: budget.c), start the HTTP call
 * ====================================================================== */

static void on_stream_text(void *ud, const char *text, size_t len)
{
    turn *t = ud;
    t->req.streamed |= len > 0;
    if (t->host.on_delta && len)
        t->host.on_delta(t->host.user_data, t->id, text, len);
}

static void on_stream_reasoning(void *ud, const char *text, size_t len)
{
    turn *t = ud;
    t->req.streamed |= len > 0;
    if (t->host.on_reasoning && len)
        t->host.on_reasoning(t->host.user_data, t->id, text, len);
}

/*
 * A streamed answer has no total time limit (it may speak for minutes); it
 * must start within request_timeout_ms, then keep coming: each piece pushes
 * the idle deadline back by stream_idle_timeout_ms.  The turn's own deadline
 * still bounds it all.
 */
static int arm_stream_timer(turn *t, int first_byte)
{
    int64_t ms = first_byte ? t->cfg->opts.request_timeout_ms : t->cfg->opts.stream_idle_timeout_ms;
    return timer_arm(t->env->timers, &t->wait, clock_mono_ms() + (uint64_t)ms);
}

/*
 * After [DONE] the answer is whole.  The body's end normally follows at once
 * (and then the connection can be reused); a server that holds the
 * connection open, or keeps sending keep-alive comments, gets this long
 * before the turn ends without it.  Nothing after [DONE] re-arms a timer.
 */
#define STREAM_END_GRACE_MS 50

static int stream_sink(void *owner, const char *data, size_t len)
{
    turn *t = owner;
    char *err = NULL;
    if (provider_stream_feed(t->req.stream, data, len, &err) != 0) {
        free(t->req.stream_error);
        t->req.stream_error = err;
        return -1;
    }
    int done = provider_stream_done(t->req.stream);
    if (done ? timer_arm(t->env->timers, &t->wait, clock_mono_ms() + STREAM_END_GRACE_MS)
             : arm_stream_timer(t, 0)) {
        free(t->req.stream_error);
        t->req.stream_error = strdup("out of memory");
        return -1;
    }
    return done ? HTTP_SINK_COMPLETE : 0;
}

#define JSON_ANSWER_NOTE "Answer with one JSON object and nothing else."

/*
 * The system prompt of every request: the persona's or the agent's, then the
 * running summary.  Both stay the same from turn to turn (the summary changes
 * only at a planned cut), so the server's cached prefix holds.
 */
#define SUMMARY_HEADING "Summary of the earlier conversation (its older turns are not shown):\n"

static char *system_prompt(const turn *t)
{
    const char *summary = ctx_summary(&t->ctx.window);
    const char *prompt = t->opts->prompt ? t->opts->prompt : "";
    if (!summary)
        return strdup(prompt);
    return pstr_printf("%s%s%s%s", prompt, *prompt ? "\n\n" : "", SUMMARY_HEADING, summary);
}

/*
 * What changes from turn to turn: the turn's extra_system_prompt, the note on
 * a replied-to turn sent again, the JSON note.  It goes AFTER the stable part
 * (system prompt, tools, summary, history), in the turn's own user message
 * (provider_request.turn_note), never stored: in the system prompt, any
 * change of it would make the server read the whole conversation again.  Not
 * a system message of its own either: many chat templates refuse a system
 * message that is not the first (Qwen 3.x: "System message must be at the
 * beginning", ggml-org/llama.cpp#20733, #27367) or move it to the top.
 * NULL when there is none; *oom on out of memory.
 */
#define TURN_NOTE_HEADING "[Instructions for this turn, from the system, not from the user]\n"

static char *turn_note(const turn *t, int *oom)
{
    const char *reply = t->in.reply.outcome == REPLY_INCLUDED ? REPLY_CONTEXT_NOTE : NULL;
    /* JSON mode without a schema: the model must be told (OpenAI refuses a request
       whose messages never say "JSON"). */
    const char *json_note = t->in.format && !t->in.format->schema ? JSON_ANSWER_NOTE : NULL;
    const char *parts[] = {t->in.extra_system_prompt, reply, json_note};
    pbuf b = PBUF_INIT;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!parts[i] || !*parts[i])
            continue;
        pbuf_puts(&b, b.len ? "\n\n" : TURN_NOTE_HEADING);
        pbuf_puts(&b, parts[i]);
    }
    *oom = b.oom;
    return b.len && !b.oom ? pbuf_take(&b) : (pbuf_free(&b), NULL);
}

/* No more tool calls: the last round (max_tool_iterations spent), or tool_choice "none". */
static int tools_refused(const turn *t)
{
    return t->tool.rounds >= t->cfg->opts.max_tool_iterations ||
           strcmp(t->opts->tool_choice, "none") == 0;
}

/* The tool_choice option on the turn's first request ("required" or a tool's name), or
   NULL: forcing every round would loop until max_tool_iterations. */
static const char *forced_tool_choice(const turn *t)
{
    const char *c = t->opts->tool_choice;
    if (t->tool.rounds > 0 || !c || strcmp(c, "auto") == 0 || strcmp(c, "none") == 0)
        return NULL;
    return c;
}

/* The provider codec renders the neutral messages into t->req.body. */
int turn_render_request(turn *t, char **err)
{
    const provider *prov = t->cfg->prov;
    const char *stored = t->ctx.history.data ? t->ctx.history.data : "";
    const char *turn_text = t->rec.messages.data ? t->rec.messages.data : "";
    if (!prov->reads_history_text && !t->ctx.history_msgs &&
        !(t->ctx.history_msgs = provider_parse_messages(stored, t->ctx.history.len, err)))
        return -1;
    json_t *messages = prov->reads_history_text ? NULL
                                                : provider_parse_messages(t->rec.messages.data,
                                                                          t->rec.messages.len, err);
    char *system = system_prompt(t);
    int note_oom = 0;
    char *note = turn_note(t, &note_oom);
    int rc = -1;
    if ((messages || prov->reads_history_text) && system && !note_oom) {
        provider_request r = {
            .system = system,
            .system_fixed_len = strlen(system),
            .turn_note = note,
            .history = t->ctx.history_msgs,
            .history_text = prov->reads_history_text ? stored : NULL,
            .history_text_len = t->ctx.history.len,
            .messages = messages,
            .messages_text = prov->reads_history_text ? turn_text : NULL,
            .messages_text_len = t->rec.messages.len,
            .tools_json = toolset_json(t->in.tools),
            .tool_choice_none = tools_refused(t),
            .tool_choice = forced_tool_choice(t),
            .response_format = t->in.format,
            .cache_key = t->conv.conversation_id,
        };
        rc = prov->encode(&t->req.body, t->opts, &r, err); /* the persona's model, sampling */
    } else if (!*err) {
        *err = pstr_printf("out of memory");
    }
    json_decref(messages);
    free(system);
    free(note);
    return rc;
}

static void turn_request(turn *t)
{
    char *err = NULL;
    if (t->rec.messages.oom || t->rec.steps.oom || t->ctx.history.oom) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory building the request");
        return;
    }
    int rendered = turn_render_request(t, &err);
    if (rendered == 0 && budget_plan(t)) /* the window moved: render it again */
        rendered = turn_render_request(t, &err);
    if (rendered != 0) {
        /* Only a store holding something that is not a message gets here: checked now, on
           the failure path (store_json_object_list), so every turn does not pay for it. */
        char *m = NULL;
        parley_status st = llm_error_is_oom(err) ? PARLEY_ERR_NO_MEMORY : PARLEY_ERR_INTERNAL;
        if (t->ctx.history.len &&
            store_json_object_list(t->ctx.history.data, t->ctx.history.len) < 0 &&
            t->conv.conversation_id)
            st = store_json_damaged("history", t->conv.conversation_id,
                                    strlen(t->conv.conversation_id), &m);
        else
            m = pstr_printf("cannot build the request: %s", err ? err : "out of memory");
        turn_end(t, st, m ? m : "cannot build the request");
        free(m);
        free(err);
        return;
    }
    /* The body stays allocated for the whole wait (libcurl may send it again
     * on a fresh connection): keep only its bytes, not the render's margin. */
    pbuf_fit(&t->req.body);
    if (t->cfg->opts.debug_log_bodies)
        host_log(t->env->host, PARLEY_LOG_DEBUG, "turn %s request: %s", t->turn_id,
                 t->req.body.data);
    provider_stream_free(t->req.stream);
    t->req.stream = NULL;
    t->req.streamed = 0;
    llm_sink sink = {on_stream_text, on_stream_reasoning, t};
    if (t->cfg->opts.stream && !(t->req.stream = provider_stream_new(
                                     t->cfg->prov, t->cfg->opts.strip_think_tags, &sink))) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    turn_enter(t, TURN_REQUESTING);
    t->req.http = http_call_start(t->env->pool, &t->cfg->http, t->req.body.data, t->req.body.len, t,
                              t->req.stream ? stream_sink : NULL);
    if (!t->req.http) {
        turn_end(t, errno == ENOMEM ? PARLEY_ERR_NO_MEMORY : PARLEY_ERR_INTERNAL,
                 errno == ENOMEM ? "out of memory starting the HTTP request"
                                 : "could not start the HTTP request");
        return;
    }
    if (t->req.stream && arm_stream_timer(t, 1) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    t->req.requests++;
    atomic_fetch_add(&t->env->metrics->llm_requests, 1);
}

/* ======================================================================
 * 3. The reply: retry, fail, run tools, or answer
 * ====================================================================== */

static void turn_run_tools(turn *t, llm_reply *reply);
static void finish_answer(turn *t, const llm_reply *reply, const char *content);

/* Exponential backoff with jitter, or the server's Retry-After; capped. */
static uint64_t retry_delay_ms(const turn *t, int64_t retry_after_ms)
{
    const parley_options *o = &t->cfg->opts;
    uint64_t cap = (uint64_t)o->retry_max_delay_ms;
    if (retry_after_ms >= 0)
        return (uint64_t)retry_after_ms < cap ? (uint64_t)retry_after_ms : cap;
    uint64_t d = (uint64_t)o->retry_backoff_ms << (t->req.attempt < 16 ? t->req.attempt : 16);
    if (d > cap)
        d = cap;
    unsigned r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r)
        r = (unsigned)clock_mono_ms();
    return d / 2 + (d / 2 ? r % (d / 2 + 1) : 0); /* "equal jitter": [d/2, d] */
}

/* `text` (a server's words, perhaps) without the agent's secrets: a new
 * string, or NULL (text NULL, or out of memory). */
static char *without_secrets(const turn *t, const char *text)
{
    secret_span secrets[REDACT_MAX_SECRETS];
    size_t n = redact_secrets(t->cfg->opts.api_key, t->cfg->opts.history_store, secrets);
    return redact(text, secrets, n);
}

/* 1 when a retry was scheduled. */
static int maybe_retry(turn *t, parley_status st, const char *msg, int64_t retry_after_ms)
{
    if (t->req.attempt >= t->cfg->opts.max_retries)
        return 0;
    uint64_t delay = retry_delay_ms(t, retry_after_ms);
    uint64_t at = clock_mono_ms() + delay;
    if (timer_armed(&t->deadline) && at >= t->deadline.when_ms)
        return 0; /* would pass the turn's deadline: fail now instead */
    if (timer_arm(t->env->timers, &t->wait, at) != 0)
        return 0;
    turn_enter(t, TURN_BACKOFF);
    t->req.attempt++;
    atomic_fetch_add(&t->env->metrics->llm_retries, 1);
    char *said = without_secrets(t, msg);
    host_log(t->env->host, PARLEY_LOG_WARN, "turn %s: %s (%s); retry %d of %lld in %llu ms",
             t->turn_id, status_name(st), said ? said : "", t->req.attempt,
             (long long)t->cfg->opts.max_retries, (unsigned long long)delay);
    free(said);
    return 1;
}

static int decode_reply(turn *t, llm_reply *reply, char **err)
{
    if (t->req.stream)
        return provider_stream_finish(t->req.stream, reply, err);
    const pbuf *b = &t->req.http->body;
    return provider_decode(t->cfg->prov, t->cfg->opts.strip_think_tags, b->data ? b->data : "",
                           b->len, reply, err);
}

/* An HTTP error status: the codec reads the server's words and says whether to retry. */
static void explain_http_error(turn *t, char **msg, int *retryable)
{
    const provider *p = t->cfg->prov;
    const pbuf *b = &t->req.http->body;
    const char *body = b->data ? b->data : "";
    long status = http_call_status(t->req.http);
    char *text = p->error_text(body, b->len);
    char *m = pstr_printf("%s%s%s%s%s%s", *msg ? *msg : "LLM server error", text ? ": " : "",
                          text ? text : "", status == 404 ? " (check base_url: " : "",
                          status == 404 ? p->not_found_hint : "",
                          status == 404 ? "; and check the model name)" : "");
    if (m) {
        free(*msg);
        *msg = m;
    }
    free(text);
    *retryable = p->retryable(status, body, b->len);
}

/* The server said the prompt does not fit its context window: keep the sizes it
 * named (t->ctx.overflow) and say so in *msg, which explain_http_error then extends
 * with the server's own words.  No retry: the same prompt cannot fit. */
static char *overflow_message(const llm_overflow *o, const char *server_text)
{
    const char *sep = server_text ? ": " : "";
    const char *text = server_text ? server_text : "";
    return o->n_prompt && o->n_ctx
               ? pstr_printf("the prompt does not fit the model's context window "
                             "(%lld tokens > %lld)%s%s", o->n_prompt, o->n_ctx, sep, text)
               : pstr_printf("the prompt does not fit the model's context window%s%s", sep, text);
}

static int is_overflow(turn *t, char **msg)
{
    const pbuf *b = &t->req.http->body;
    if (!llm_overflow_parse(http_call_status(t->req.http), b->data, b->len, &t->ctx.overflow))
        return 0;
    char *m = overflow_message(&t->ctx.overflow, NULL);
    if (m) {
        free(*msg);
        *msg = m;
    }
    return 1;
}

/* Tokens and the stop reason of one decoded reply, into the turn and the metrics. */
static void account_reply(turn *t, const llm_reply *reply)
{
    agent_counters *m = t->env->metrics;
    llm_usage settled = reply->usage;
    llm_usage_settle(&settled);
    const llm_usage *u = &settled;
    t->req.usage.prompt += u->prompt;
    t->req.usage.evaluated += u->evaluated;
    t->req.usage.completion += u->completion;
    t->req.usage.cache_read += u->cache_read;
    t->req.usage.cache_creation += u->cache_creation;
    t->req.usage.reasoning += u->reasoning;
    if (!t->in.images.n && !t->ctx.truncated) /* base64 bytes are not tokens; a cut prompt lies */
        ctx_learn_factor(ctx_model_of(t->env->ctx, t->opts->model), t->req.body.len, u->prompt);
    if (!t->ctx.truncated) {
        t->ctx.last_prompt = u->prompt;
        t->ctx.last_bytes = t->req.body.len;
    }
    atomic_fetch_add(&m->tokens_prompt, (uint64_t)u->prompt);
    atomic_fetch_add(&m->tokens_completion, (uint64_t)u->completion);
    atomic_fetch_add(&m->tokens_cache_read, (uint64_t)u->cache_read);
    atomic_fetch_add(&m->tokens_cache_creation, (uint64_t)u->cache_creation);
    atomic_fetch_add(&m->tokens_prompt_evaluated, (uint64_t)u->evaluated);
    atomic_fetch_add(&m->tokens_reasoning, (uint64_t)u->reasoning);
    free(t->req.stop_reason);
    t->req.stop_reason = reply->finish_reason ? strdup(reply->finish_reason) : NULL;
}

/*
 * "length": what cut the answer?  max_tokens when the reply used it all; when
 * it stopped short of it (or none was set), the end of the model's context
 * window (llama.cpp stops there with finish_reason "length", Anthropic says
 * model_context_window_exceeded): a bigger max_tokens would not help there,
 * a shorter history would.
 */
static void log_cut_short(const turn *t, const llm_reply *reply)
{
    long long max = t->opts->max_tokens > 0 ? t->opts->max_tokens
                                            : t->cfg->prov->default_max_tokens;
    if (t->opts->max_tokens <= 0 && max > 0 && t->opts->thinking_budget_tokens > 0)
        max = t->opts->thinking_budget_tokens + max; /* Anthropic's default with thinking */
    long long used = reply->usage.completion;
    const char *id = t->turn_id;
    if (reply->context_full || (max > 0 && used > 0 && used < max))
        host_log(t->env->host, PARLEY_LOG_WARN, "turn %s: the end of the model's context window "
                 "cut the answer short (prompt %lld + answer %lld tokens; max_tokens %lld not "
                 "reached): shorten the history (max_history_turns) or give the model a larger "
                 "context", id, reply->usage.prompt, used, max);
    else if (max > 0)
        host_log(t->env->host, PARLEY_LOG_WARN, "turn %s: the model hit max_tokens (%lld); the "
                 "answer may be cut short", id, max);
    else
        host_log(t->env->host, PARLEY_LOG_WARN, "turn %s: the answer was cut short by a length "
                 "limit with max_tokens unset: the end of the model's context window (prompt "
                 "%lld + answer %lld tokens) or the server's own output limit", id,
                 reply->usage.prompt, used);
}

/* Structured output through a forced tool (Anthropic): the call to the answer tool is the
   answer, its input the JSON.  Other calls beside it are dropped: the turn is answered. */
static void take_answer_call(const turn *t, llm_reply *reply)
{
    size_t i = 0;
    while (t->in.format && i < reply->ncalls &&
           strcmp(reply->calls[i].name, t->in.format->name) != 0)
        i++;
    if (!t->in.format || i == reply->ncalls)
        return;
    free(reply->content);
    reply->content = reply->calls[i].arguments;
    reply->calls[i].arguments = NULL;
    for (size_t k = 0; k < reply->ncalls; k++) {
        free(reply->calls[k].id);
        free(reply->calls[k].name);
        free(reply->calls[k].arguments);
    }
    free(reply->calls);
    reply->calls = NULL;
    reply->ncalls = 0;
}

static int blank(const char *s)
{
    return s[strspn(s, " \t\r\n")] == '\0';
}

/* Why the answer is empty, in words a host can act on. */
static char *empty_answer_message(const turn *t, const llm_reply *reply)
{
    int cut = reply->finish_reason && strcmp(reply->finish_reason, "length") == 0;
    int reasoned = reply->reasoning && *reply->reasoning;
    if (cut && reasoned)
        return pstr_printf("the model spent its whole answer budget reasoning and gave no answer "
                           "(stop_reason \"length\", %lld tokens): raise max_tokens (%lld) or ask "
                           "for less reasoning", reply->usage.completion,
                           (long long)t->opts->max_tokens);
    if (cut)
        return pstr_printf("the model's answer was cut off before any text (stop_reason "
                           "\"length\"): raise max_tokens or shorten the history");
    if (reasoned)
        return pstr_printf("the model reasoned, then stopped without an answer (empty text "
                           "after its reasoning)");
    return pstr_printf("the model gave an empty answer");
}

/* The JSON in an answer: the text itself, or inside a ``` fence some models add anyway. */
static json_t *answer_json(const char *text, json_error_t *jerr)
{
    const char *p = text + strspn(text, " \t\r\n");
    if (strncmp(p, "```", 3) != 0)
        return json_loads(p, JSON_DECODE_ANY, jerr);
    p = strchr(p, '\n');
    const char *end = p ? strstr(p, "```") : NULL;
    if (!end)
        return json_loads(text, JSON_DECODE_ANY, jerr);
    return json_loadb(p, (size_t)(end - p), JSON_DECODE_ANY, jerr);
}

/* The answer checked against the response format: compact JSON (malloc'd), or NULL
   with *why. */
static char *structured_answer(const turn *t, const llm_reply *reply, const char *content,
                               char **why)
{
    const response_format *f = t->in.format;
    const char *cut = reply->finish_reason && strcmp(reply->finish_reason, "length") == 0
                          ? "; the answer was cut short (stop_reason \"length\"): raise max_tokens"
                          : "";
    json_error_t jerr;
    json_t *v = answer_json(content, &jerr);
    char *problem = NULL, *out = NULL;
    if (!v)
        *why = pstr_printf("the model's answer is not JSON (%s)%s", utf8_mend(jerr.text), cut);
    else if (!json_is_object(v))
        *why = pstr_printf("the model's answer is JSON but not an object%s", cut);
    else if (f->schema && json_schema_validate(f->schema, v, &problem) != 0)
        *why = pstr_printf("the model's answer does not match the response format '%s': %s%s",
                           f->name, problem ? problem : "out of memory", cut);
    else if (!(out = json_dumps_whole(v, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        *why = pstr_printf("out of memory");
    free(problem);
    json_decref(v);
    return out;
}

/*
 * The model answered: commit it -- unless it said nothing (a reasoning model
 * that spent max_tokens thinking, or stopped right after </think>) or, with a
 * response format, not the JSON asked for.  Those fail the turn
 * (bad_response, saying why; the steps show what came), history unchanged.
 */
static void finish_answer(turn *t, const llm_reply *reply, const char *content)
{
    char *why = NULL, *json = NULL;
    if (blank(content))
        why = empty_answer_message(t, reply);
    else if (t->in.format)
        json = structured_answer(t, reply, content, &why);
    record_answer(t, reply, json ? json : content);
    if (why || (t->in.format && !json)) {
        turn_end(t, PARLEY_ERR_BAD_RESPONSE, why ? why : "out of memory");
        free(why);
        return;
    }
    t->rec.structured = json;
    turn_commit(t);
}

static void summary_on_http_done(turn *t, CURLcode code);

void turn_on_http_done(turn *t, CURLcode code)
{
    if (t->phase == TURN_SUMMARIZING) {
        summary_on_http_done(t, code);
        return;
    }
    char *msg = NULL;
    int retryable = 0;
    parley_status st = http_call_outcome(t->req.http, code, &msg, &retryable);
    if (st == PARLEY_ERR_HTTP_STATUS && is_overflow(t, &msg))
        st = PARLEY_ERR_CONTEXT_OVERFLOW;
    if (st == PARLEY_ERR_HTTP_STATUS || st == PARLEY_ERR_RATE_LIMITED ||
        st == PARLEY_ERR_CONTEXT_OVERFLOW)
        explain_http_error(t, &msg, &retryable);
    if (st == PARLEY_ERR_BAD_RESPONSE && !msg && t->req.stream_error &&
        llm_overflow_from_text(t->req.stream_error, &t->ctx.overflow)) {
        st = PARLEY_ERR_CONTEXT_OVERFLOW; /* said inside the stream (older llama.cpp) */
        msg = overflow_message(&t->ctx.overflow, t->req.stream_error);
    }
    if (st == PARLEY_ERR_BAD_RESPONSE && !msg && t->req.stream_error &&
        llm_error_is_oom(t->req.stream_error)) {
        st = PARLEY_ERR_NO_MEMORY; /* the stream's decoder, not the server */
        msg = pstr_printf("out of memory decoding the streamed answer");
    }
    if (st == PARLEY_ERR_BAD_RESPONSE && !msg && t->req.stream_error) {
        st = llm_server_error_status(t->req.stream_error, &retryable); /* an error event? */
        retryable &= !t->req.streamed; /* the host has part of this answer: never twice */
        msg = st == PARLEY_ERR_BAD_RESPONSE
                  ? pstr_printf("bad streamed response: %s", t->req.stream_error)
                  : pstr_printf("LLM server error (an error event in the stream): %s",
                                t->req.stream_error + strlen(LLM_SERVER_ERROR));
    }
    int64_t retry_after = t->req.http->retry_after_ms;
    timer_disarm(t->env->timers, &t->wait); /* the stream idle timer, if any */
    if (st != PARLEY_OK) {
        http_call_free(t->req.http);
        t->req.http = NULL;
        if (st == PARLEY_ERR_CONTEXT_OVERFLOW && budget_overflow_cut(t)) {
            turn_request(t); /* without the window's oldest turns */
            free(msg);
            return;
        }
        if (!(retryable && maybe_retry(t, st, msg, retry_after)))
            turn_end(t, st, msg ? msg : status_name(st));
        free(msg);
        return;
    }
    if (t->cfg->opts.debug_log_bodies && !t->req.stream) {
        char *body = without_secrets(t, t->req.http->body.data ? t->req.http->body.data : "");
        host_log(t->env->host, PARLEY_LOG_DEBUG, "turn %s response: %s", t->turn_id,
                  body ? body : "(out of memory)");
        free(body);
    }
    llm_reply reply;
    memset(&reply, 0, sizeof reply);
    char *err = NULL;
    int rc = decode_reply(t, &reply, &err);
    http_call_free(t->req.http);
    t->req.http = NULL;
    if (rc != 0) { /* an error object with a 200 says what went wrong: classify it */
        int again = 0;
        parley_status est = llm_error_is_oom(err) ? PARLEY_ERR_NO_MEMORY
                                                  : llm_server_error_status(err, &again);
        char *m = est == PARLEY_ERR_NO_MEMORY ? pstr_printf("out of memory decoding the answer")
                  : est == PARLEY_ERR_BAD_RESPONSE
                      ? pstr_printf("bad response from the LLM server: %s",
                                    err ? err : "undecodable")
                      : pstr_printf("LLM server error (in a 200 answer): %s",
                                    err + strlen(LLM_SERVER_ERROR));
        if (!(again && maybe_retry(t, est, m, -1)))
            turn_end(t, est, m);
        free(m);
        free(err);
        llm_reply_free(&reply);
        return;
    }
    t->req.attempt = 0;
    t->ctx.truncated = budget_truncated(t, &reply.usage);
    if (t->ctx.truncated && !t->ctx.overflow_retried && t->ctx.window.nturns) {
        account_reply(t, &reply); /* an answer to part of the prompt: its tokens were spent */
        long long read = reply.usage.prompt;
        llm_reply_free(&reply);
        t->ctx.truncated = 0;
        if (budget_truncation_cut(t, read))
            turn_request(t); /* without the window's oldest turns */
        else
            turn_end(t, PARLEY_ERR_CONTEXT_OVERFLOW, "the server dropped the start of the "
                     "prompt to fit its context window, and it could not be shortened");
        return;
    } /* (else the answer stands: the newest message is what the server kept) */
    if (t->ctx.overflow_retried == 1) { /* the shorter prompt was answered */
        t->ctx.overflow_retried = 2;
        atomic_fetch_add(&t->env->metrics->context_overflows_recovered, 1);
    }
    account_reply(t, &reply);
    t->ctx.truncated = 0;
    if (reply.finish_reason && strcmp(reply.finish_reason, "length") == 0)
        log_cut_short(t, &reply);
    take_answer_call(t, &reply);
    if (reply.ncalls == 0) {
        finish_answer(t, &reply, reply.content ? reply.content : "");
        llm_reply_free(&reply);
        return;
    }
    if (tools_refused(t)) {
        /* We said tool_choice "none" and the model still wants tools. */
        if (reply.content && *reply.content) {
            finish_answer(t, &reply, reply.content);
        } else {
            char *m =
                pstr_printf("the model kept calling tools after %d rounds and tool_choice \"none\"",
                            t->tool.rounds);
            turn_end(t, PARLEY_ERR_TOOL_LOOP, m);
            free(m);
        }
        llm_reply_free(&reply);
        return;
    }
    turn_run_tools(t, &reply);
    llm_reply_free(&reply);
}

/* ======================================================================
 * 4. Tools: the host runs the round's calls (tools.c), then ask again
 * ====================================================================== */

/* Every call of the round has a result: record them, ask the model again. */
static void after_tools(turn *t)
{
    record_tool_results(t);
    tools_free(t);
    turn_request(t);
}

/* The model asked for tools: record the round, hand the calls to the host, wait for their
   results (turn_on_tool_result) at most tool_timeout_ms. */
static void turn_run_tools(turn *t, llm_reply *reply)
{
    turn_enter(t, TURN_TOOLS);
    if (tools_take(t, reply) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    record_tool_calls(t, reply);
    t->tool.rounds++;
    if (tools_send(t) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (t->tool.pending == 0) {
        after_tools(t);
        return;
    }
    if (timer_arm(t->env->timers, &t->wait,
                  clock_mono_ms() + (uint64_t)t->cfg->opts.tool_timeout_ms) != 0)
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
}

void turn_on_tool_result(turn *t, parley_tool_call *h)
{
    if (tools_take_result(t, h) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (t->tool.pending == 0) {
        timer_disarm(t->env->timers, &t->wait);
        after_tools(t);
    }
}

/* The host did not answer some calls in time: they fail, the turn goes on. */
static void tool_timeout(turn *t)
{
    if (tools_time_out(t) != 0) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    after_tools(t);
}

/* ======================================================================
 * 5. Timers
 * ====================================================================== */

/* The request's `wait` timer: [DONE] came but not the body's end, no first byte in time
   (counted from when it got a connection), or a stream gone quiet. */
static void request_timer(turn *t)
{
    const parley_options *o = &t->cfg->opts;
    http_call *h = t->req.http;
    if (h->complete) {
        turn_on_http_done(t, CURLE_OK); /* [DONE] came, the body's end did not: done anyway */
        return;
    }
    uint64_t due = h->started_ms + (uint64_t)o->request_timeout_ms;
    if (!h->received && (!h->started || clock_mono_ms() < due)) {
        if (timer_arm(t->env->timers, &t->wait,
                      h->started ? due : clock_mono_ms() + (uint64_t)o->request_timeout_ms))
            turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory");
        return;
    }
    char *m = h->received
                  ? pstr_printf("the streamed answer stalled: no data for "
                                "stream_idle_timeout_ms (%lld ms)",
                                (long long)o->stream_idle_timeout_ms)
                  : pstr_printf("no answer from the LLM server within request_timeout_ms (%lld ms)",
                                (long long)o->request_timeout_ms);
    turn_end(t, PARLEY_ERR_TIMEOUT, m ? m : "stream timeout");
    free(m);
}

/* The deadline, or `wait`: what `wait` meant is the phase's (turn.h). */
void turn_on_timer(turn *t, ptimer *which)
{
    if (which == &t->deadline) {
        char *m = pstr_printf("the turn took longer than turn_timeout_ms (%lld ms)",
                      (long long)t->cfg->opts.turn_timeout_ms);
        turn_end(t, PARLEY_ERR_TIMEOUT, m ? m : "turn timeout");
        free(m);
        return;
    }
    switch (t->phase) {
    case TURN_REQUESTING:
        request_timer(t);
        break;
    case TURN_TOOLS:
        tool_timeout(t);
        break;
    case TURN_LEASE_WAIT:
        turn_load_history(t); /* the conversation's lease was busy: try again */
        break;
    case TURN_BACKOFF:
        turn_request(t); /* the backoff before a retry is over */
        break;
    default: /* no other phase arms `wait`, and turn_commit and turn_end disarm it */
        assert(!"a wait timer in a phase that never arms it");
        break;
    }
}

/* ======================================================================
 * 6. Commit: the whole turn into the store, then end
 * ====================================================================== */

/* Home Assistant's rule: a reply ending in a question keeps the mic open. */
static int ends_in_question(const char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        n--;
    if (n == 0)
        return 0;
    if (s[n - 1] == '?' || s[n - 1] == ';')
        return 1;
    return n >= 3 && memcmp(s + n - 3, "\xEF\xBC\x9F", 3) == 0; /* fullwidth '?' */
}

/*
 * The answer is in: append the whole turn to its conversation, then end.
 * The turn is reported ok only once the store has it; a store failure ends
 * it with that failure, the conversation unchanged.  From here on only the
 * append's outcome ends the turn (no timer runs, cancel waits for it).
 */
static void turn_commit(turn *t)
{
    const turn_env *env = t->env;
    if (!t->rec.answer || t->rec.messages.oom) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory recording the turn");
        return;
    }
    if (!t->conv.conversation_id) {
        turn_end(t, PARLEY_OK, NULL);
        return;
    }
    store_message *msgs = record_store_messages(t);
    if (!msgs) {
        turn_end(t, PARLEY_ERR_NO_MEMORY, "out of memory committing the turn");
        return;
    }
    timer_disarm(env->timers, &t->deadline);
    timer_disarm(env->timers, &t->wait);
    uint64_t now = clock_wall_ms();
    store_turn in = {.turn_id = t->turn_id,
                     .started_ms = t->in.host_time_ms ? t->in.host_time_ms : t->started_wall_ms,
                     .finished_ms = turn_clock_ms(t),
                     .messages = msgs, .nmessages = t->rec.nmessages,
                     .tokens = ctx_turn_tokens(msgs, t->rec.nmessages,
                                               ctx_model_of(t->env->ctx, t->opts->model)->factor)};
    if (t->ctx.window.enabled && t->ctx.last_prompt > 0) { /* what the next turn's server count */
        t->ctx.window.rec.last_prompt = (uint64_t)t->ctx.last_prompt;
        t->ctx.window.rec.last_bytes = t->ctx.last_bytes;
    }
    if (t->ctx.window.enabled) { /* what the next request should start with */
        pbuf turn_text = PBUF_INIT;
        for (size_t i = 0; i < t->rec.nmessages; i++)
            msgtext_append(&turn_text, msgs[i].json, msgs[i].json_len);
        char *stable = budget_stable_prompt(t);
        ctx_set_prefix(&t->ctx.window, stable ? stable : "", toolset_json(t->in.tools),
                       t->ctx.history.data, budget_window_len(t), turn_text.data, turn_text.len);
        if (turn_text.oom || !stable)
            t->ctx.window.rec.prefix_hash = 0; /* unknown: the next turn checks nothing */
        free(stable);
        pbuf_free(&turn_text);
    }
    if (t->ctx.window.enabled &&
        ctx_record_write(&t->ctx.window) == 0) { /* the window's start goes with it */
        in.context = t->ctx.window.record.data;
        in.context_len = t->ctx.window.record.len;
    }
    store_key key = key_of(t);
    turn_enter(t, TURN_COMMITTING);
    if (env->jobs) { /* WAIT committing: the store's write thread appends */
        store_job *job = store_job_new(STORE_JOB_APPEND, &key);
        if (job)
            job->turn = in; /* takes msgs */
        else
            free(msgs);
        wait_for_store(t, job);
        return;
    }
    char *err = NULL;
    parley_status st = store_append(env->store, &key, &in, now, &err);
    free(msgs);
    turn_on_committed(t, st, err);
    free(err);
}

/* ======================================================================
 * 6b. The summary: after the commit, off the answer's path (its work: summary.c)
 * ====================================================================== */

/*
 * After the commit: when a summary is due (summary.h), report the turn to the
 * host now and ask the model for it.  The conversation's lane stays with this
 * turn until the summary is stored (or given up), so the next turn of the
 * conversation reads it.  1 when started.
 */
static int summary_start(turn *t)
{
    if (!summary_render(t))
        return 0;
    t->end.status = PARLEY_OK;
    t->end.message = NULL;
    if (t->rec.steps.len)
        pbuf_putc(&t->rec.steps, ']');
    turn_report(t); /* the answer is the host's now */
    turn_enter(t, TURN_SUMMARIZING);
    provider_stream_free(t->req.stream);
    t->req.stream = NULL;
    t->req.http =
        http_call_start(t->env->pool, &t->cfg->http, t->req.body.data, t->req.body.len, t, NULL);
    if (!t->req.http) {
        summary_end(t, 0, "could not start the HTTP request");
        return 1;
    }
    atomic_fetch_add(&t->env->metrics->llm_requests, 1);
    return 1;
}

/* The summary's answer: into the window's record, which the store then keeps. */
static void summary_on_http_done(turn *t, CURLcode code)
{
    char *expected = NULL;
    size_t expected_len = 0;
    if (summary_take(t, code, &expected, &expected_len) != 0)
        return; /* given up: the turn ended */
    store_key key = key_of(t);
    turn_enter(t, TURN_SUMMARY_SAVING);
    summary_save(t, &key, expected, expected_len);
}

void turn_on_committed(turn *t, parley_status status, const char *message)
{
    t->job = NULL;
    if (t->phase == TURN_SUMMARY_SAVING) { /* the summary's record, not the turn */
        summary_saved(t, status, message);
        return;
    }
    if (status == PARLEY_OK && t->conv.counters) {
        atomic_fetch_add(&t->conv.counters->turns_stored, 1);
        atomic_fetch_add(&t->conv.counters->messages_stored, t->rec.nmessages);
    }
    if (status == PARLEY_OK && t->conv.series) {
        atomic_fetch_add(&t->conv.series->turns_stored, 1);
        atomic_fetch_add(&t->conv.series->messages_stored, t->rec.nmessages);
    }
    if (status == PARLEY_OK) {
        t->lease.held = 0; /* the append gave it back (store.h v2) */
        if (!summary_start(t))
            turn_end(t, PARLEY_OK, NULL);
        return;
    }
    char *m = pstr_printf("could not store the turn: %s", message ? message : status_name(status));
    turn_end(t, status, m ? m : status_name(status));
    free(m);
}

/* ======================================================================
 * 7. End: stop everything, let the worker report and release the turn
 * ====================================================================== */

void turn_cancel(turn *t, const char *message)
{
    if (t->phase == TURN_COMMITTING)
        return; /* the append may already be on disk: its outcome ends the turn */
    turn_end(t, PARLEY_ERR_CANCELLED, message);
}

void turn_end(turn *t, parley_status status, const char *message)
{
    if (t->phase == TURN_ENDED)
        return;
    turn_enter(t, TURN_ENDED);
    /* Stop everything still running for this turn. */
    http_call_free(t->req.http);
    t->req.http = NULL;
    timer_disarm(t->env->timers, &t->deadline);
    timer_disarm(t->env->timers, &t->wait);
    tools_detach(t);
    if (t->lease.held && t->env->jobs) { /* ended before a commit gave the lease back */
        store_key key = key_of(t);
        store_job *release = store_job_new(STORE_JOB_RELEASE_LEASE, &key);
        if (release && store_jobs_submit(t->env->jobs, release) != 0)
            store_job_free(release); /* stopping: the store's close lets it expire */
        t->lease.held = 0;
    }
    if (t->job) { /* a load in flight: its result will go nowhere */
        t->job->owner = NULL;
        t->job = NULL;
    }
    if (t->rec.steps.len && !t->end.reported)
        pbuf_putc(&t->rec.steps, ']');
    t->end.status = status;
    t->end.message = status == PARLEY_OK ? NULL : (message ? message : status_name(status));
    t->env->ended(t->env->worker, t); /* reports (turn_report), then frees t */
}

/* key, then v in decimal (as %lld): usage_json is written per turn, without printf. */
static char *put_count(char *o, const char *key, long long v)
{
    size_t n = strlen(key);
    memcpy(o, key, n);
    o += n;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char digits[20];
    size_t d = 0;
    do {
        digits[d++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *o++ = '-';
    while (d)
        *o++ = digits[--d];
    return o;
}

void turn_report(turn *t)
{
    if (t->end.reported)
        return;
    t->end.reported = 1;
    parley_status status = t->end.status;
    const char *answer = t->rec.answer;
    char usage[400], *u = usage;
    u = put_count(u, "{\"prompt_tokens\":", t->req.usage.prompt);
    u = put_count(u, ",\"completion_tokens\":", t->req.usage.completion);
    u = put_count(u, ",\"cache_read_tokens\":", t->req.usage.cache_read);
    u = put_count(u, ",\"cache_creation_tokens\":", t->req.usage.cache_creation);
    u = put_count(u, ",\"prompt_tokens_evaluated\":", t->req.usage.evaluated);
    u = put_count(u, ",\"reasoning_tokens\":", t->req.usage.reasoning);
    u = put_count(u, ",\"requests\":", t->req.requests);
    memcpy(u, "}", 2);
    /* The server's words may quote the key back: never pass it on. */
    char *error_message = without_secrets(t, t->end.message);
    parley_result r = {
        .struct_size = sizeof r,
        .request_id = t->id,
        .status = status,
        .error_message = error_message || !t->end.message ? error_message : "out of memory",
        .conversation_id = t->conv.conversation_id,
        .turn_id = t->turn_id,
        .response = status == PARLEY_OK ? answer : NULL,
        .steps_json = t->rec.steps.len && !t->rec.steps.oom ? t->rec.steps.data : "[]",
        .continue_conversation = status == PARLEY_OK && ends_in_question(answer),
        .usage_json = usage,
        .stop_reason = t->req.stop_reason,
        .reply_context = reply_outcome_name(t->in.reply.outcome),
        .structured_json = status == PARLEY_OK ? t->rec.structured : NULL,
    };
    if (status == PARLEY_OK && t->conv.conversation_id &&
        t->rec.nmessages) { /* stored: it has ids */
        r.user_message_id = t->rec.index[0].id;
        r.answer_message_id = t->rec.index[t->rec.nmessages - 1].id;
    }
    if (t->append) /* append_message: one message, the "answer"; no user message */
        r.user_message_id = NULL;
    agent_counters *m = t->env->metrics;
    if (status == PARLEY_OK && t->req.stop_reason && strcmp(t->req.stop_reason, "length") == 0)
        atomic_fetch_add(&m->answers_cut_short, 1);
    if (status == PARLEY_OK)
        atomic_fetch_add(&m->turns_ok, 1);
    else if (status == PARLEY_ERR_CANCELLED)
        atomic_fetch_add(&m->turns_cancelled, 1);
    else
        atomic_fetch_add(&m->turns_failed, 1);
    if (!t->conv.series && t->env->persona_metrics) /* ended before it began (cancelled queued) */
        t->conv.series =
            series_for(&t->env->persona_metrics->series, t->conv.persona, t->conv.interface_type);
    if (t->conv.series) /* (NULL: no memory) */
        atomic_fetch_add(status == PARLEY_OK                ? &t->conv.series->turns_ok
                         : status == PARLEY_ERR_CANCELLED ? &t->conv.series->turns_cancelled
                                                          : &t->conv.series->turns_failed,
                         1);
    if (status != PARLEY_OK && status != PARLEY_ERR_CANCELLED)
        host_log(t->env->host, PARLEY_LOG_INFO, "turn %s failed: %s: %s", t->turn_id,
                 status_name(status), r.error_message);
    t->host.done(t->host.user_data, &r);
    free(error_message);
}
