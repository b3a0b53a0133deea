/* budget.c -- the turn's side of the context window; see budget.h. */
#include "turn/budget.h"

#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "lib/host_log.h"

/* An image costs the model about this many tokens, whatever its base64 length. */
#define IMAGE_TOKENS 1000

/* What the turn may send: the window, the reserve, the turn bound, the factor. */
ctx_budget budget_of(const turn *t)
{
    const parley_options *o = t->opts;
    const ctx_model *learned = ctx_model_of(t->env->ctx, t->opts->model);
    ctx_budget b = {.max_turns = (size_t)o->max_history_turns,
                    .factor = learned->factor > 0 ? learned->factor : 1.0,
                    .idle_ms = (uint64_t)o->prompt_cache_ttl_ms};
    int64_t discovered = atomic_load(&t->env->ctx->discovered);
    if (o->context_window > 0)
        b.window = o->context_window;
    else if (learned->window > 0)
        b.window = learned->window;
    else if (discovered > 0)
        b.window = discovered;
    else
        b.window = t->cfg->prov->default_window(o);        /* what the API's models usually have */
    if (learned->window > 0 && learned->window < b.window) /* the server knows better */
        b.window = learned->window;
    b.reserve = o->context_reserve >= 0 ? o->context_reserve
                : o->max_tokens > 0     ? o->max_tokens
                                        : 1024;
    if (b.reserve > b.window / 2) /* a max_tokens near the window must leave room to ask */
        b.reserve = b.window / 2;
    return b;
}

/* The request body in estimated tokens, images counted as IMAGE_TOKENS. */
int64_t budget_body_tokens(const turn *t, double factor)
{
    size_t image_bytes = 0;
    for (size_t i = 0; i < t->in.images.n; i++)
        image_bytes += strlen(t->in.images.items[i].url);
    size_t text = t->req.body.len > image_bytes ? t->req.body.len - image_bytes : 0;
    return ctx_tokens(text, factor) + (int64_t)t->in.images.n * IMAGE_TOKENS;
}

/* Cut n oldest turns of the window (a planned cut: counted, logged). */
static void cut_window(turn *t, size_t n, ctx_cut_reason why)
{
    size_t msgs = ctx_cut(&t->ctx.window, &t->ctx.history, n, why);
    t->ctx.nhistory = t->ctx.nhistory > msgs ? t->ctx.nhistory - msgs : 0;
    json_decref(t->ctx.history_msgs); /* parsed again without them, if the codec parses */
    t->ctx.history_msgs = NULL;
    atomic_fetch_add(&t->env->metrics->context_cuts, 1);
    if (t->conv.counters)
        atomic_fetch_add(&t->conv.counters->truncations, 1);
    if (t->conv.series)
        atomic_fetch_add(&t->conv.series->history_cut, 1);
    host_log(t->env->host, PARLEY_LOG_DEBUG,
             "turn %s: the context window starts %zu turns later (%s), at message %llu", t->turn_id,
             n, ctx_cut_reason_name(why), (unsigned long long)t->ctx.window.first);
}

/* The bytes of t->ctx.history that are the window (reply context may follow). */
size_t budget_window_len(const turn *t)
{
    return t->ctx.window.nturns ? t->ctx.window.end[t->ctx.window.nturns - 1] : 0;
}

static void release_config(void *cfg) { config_unref(cfg); }

/* What comes before the history in every request of the turn, for the cache
 * break check: the prompt (the turn note comes after the history: turn_note;
 * malloc'd; NULL on OOM). */
char *budget_stable_prompt(const turn *t) { return strdup(t->opts->prompt ? t->opts->prompt : ""); }

/* Before the turn's first request: keep the window within the budget
 * (context/window.h).  1 when the history changed (render again). */
int budget_plan(turn *t)
{
    if (!t->ctx.window.enabled || t->ctx.planned)
        return 0;
    t->ctx.planned = 1;
    if (t->cfg->opts.context_window == 0 && !t->env->ctx->started) /* ask the server, once */
        ctx_discover_start(t->env->ctx, &t->cfg->opts, config_ref(t->cfg), release_config);
    ctx_budget b = budget_of(t);
    ctx_cut_reason why;
    size_t n =
        ctx_plan(&t->ctx.window, &b, budget_body_tokens(t, b.factor), clock_wall_ms(), 0, &why);
    char *stable = why == CTX_CUT_NONE ? budget_stable_prompt(t) : NULL;
    int kept = !stable || ctx_prefix_kept(&t->ctx.window, stable, toolset_json(t->in.tools),
                                          t->ctx.history.data, budget_window_len(t));
    free(stable);
    if (!kept) {
        atomic_fetch_add(&t->env->metrics->cache_breaks, 1);
        host_log(t->env->host, PARLEY_LOG_INFO,
                 "turn %s: this request does not extend the conversation's previous one (the "
                 "prompt, the tools or the stored history changed): the server reads it again",
                 t->turn_id);
    }
    if (why == CTX_CUT_NONE)
        return 0;
    int use_next = 0;
    n = ctx_cut_for_next(&t->ctx.window, &b, budget_body_tokens(t, b.factor), n, &use_next);
    cut_window(t, n, why);
    if (use_next) /* the summary made ahead takes the cut turns' place */
        ctx_take_next(&t->ctx.window);
    return n > 0 || use_next;
}

/*
 * The server refused the prompt as longer than its window: learn the window
 * (and the tokens it counted) from its answer, cut the window's oldest turns
 * down to the low mark, for the turn to send again -- once per turn.  0 when that cannot
 * help (no window, nothing left to cut, already tried): the turn then fails
 * with context_overflow, its history unchanged.
 */
int budget_overflow_cut(turn *t)
{
    if (t->ctx.overflow_retried || !t->ctx.window.enabled)
        return 0;
    t->ctx.overflow_retried = 1;
    ctx_model *learned = ctx_model_of(t->env->ctx, t->opts->model);
    if (t->ctx.overflow.n_ctx > 0)
        learned->window = t->ctx.overflow.n_ctx;
    if (t->ctx.overflow.n_prompt > 0 && !t->in.images.n)
        ctx_learn_factor(learned, t->req.body.len, t->ctx.overflow.n_prompt);
    ctx_forget_sizes(&t->ctx.window); /* they said it would fit */
    ctx_budget b = budget_of(t);
    ctx_cut_reason why;
    size_t n =
        ctx_plan(&t->ctx.window, &b, budget_body_tokens(t, b.factor), clock_wall_ms(), 1, &why);
    if (!n)
        return 0;
    host_log(t->env->host, PARLEY_LOG_WARN,
             "turn %s: the prompt did not fit the model's context window (%lld tokens > %lld): "
             "sending it again without its %zu oldest turns",
             t->turn_id, t->ctx.overflow.n_prompt, t->ctx.overflow.n_ctx, n);
    cut_window(t, n, CTX_CUT_OVERFLOW);
    return 1;
}

/*
 * Ollama answers a prompt longer than its window after silently dropping the
 * oldest messages: its prompt_eval_count then counts far fewer tokens than
 * were sent (by the estimate, once the factor is known).
 */
int budget_truncated(const turn *t, const llm_usage *u)
{
    if (!t->cfg->prov->truncates_silently || !t->ctx.window.enabled || t->in.images.n ||
        u->prompt <= 0)
        return 0;
    double f = ctx_model_of(t->env->ctx, t->opts->model)->factor;
    if (f <= 0)
        return 0;
    if (!t->tool.rounds && !t->ctx.overflow_retried &&
        ctx_shrunk(&t->ctx.window, t->req.body.len, u->prompt, f))
        return 1; /* longer than the conversation's last request, yet counted shorter */
    return budget_body_tokens(t, f) > u->prompt + u->prompt * 3 / 10 + 16; /* far fewer than sent */
}

/* After a silent truncation: what the server kept is its window (and the
 * answer's room); cut the window's oldest turns for the turn to send again, once. */
int budget_truncation_cut(turn *t, long long read)
{
    if (t->ctx.overflow_retried || !t->ctx.window.enabled)
        return 0;
    t->ctx.overflow_retried = 1;
    ctx_forget_sizes(&t->ctx.window); /* they said it would fit */
    ctx_budget b = budget_of(t);
    int64_t sent = budget_body_tokens(t, b.factor);
    /* the window whose limit (less the reserve and the margin of itself) is what it read */
    ctx_model_of(t->env->ctx, t->opts->model)->window =
        ((int64_t)read + b.reserve) * 100 / (100 - CTX_MARGIN_PERCENT);
    b = budget_of(t);
    ctx_cut_reason why;
    size_t n = ctx_plan(&t->ctx.window, &b, sent, clock_wall_ms(), 1, &why);
    if (!n)
        return 0;
    host_log(t->env->host, PARLEY_LOG_WARN,
             "turn %s: the server read only %lld of about %lld prompt tokens (it dropped the "
             "oldest messages to fit its window): sending it again without its %zu oldest turns",
             t->turn_id, read, (long long)sent, n);
    cut_window(t, n, CTX_CUT_OVERFLOW);
    return 1;
}
