/*
 * window.h -- which of a conversation's stored turns a request carries.
 *
 * Servers keep the prompt they last read (llama.cpp's slot, vLLM's and
 * Ollama's prefix cache, OpenAI's and Anthropic's prompt caches) and read
 * again only what follows the longest prefix a new request shares with it.
 * Sending "the last N turns" changes the first history message every turn,
 * so every request is read again from the system prompt on.  The window
 * here instead keeps its START (the first message sent) fixed across turns:
 * each request extends the previous one byte for byte, until the history no
 * longer fits the budget (or exceeds max_history_turns).  Then whole oldest
 * turns are cut, once, down to a low mark well below the limit, and the new
 * start is kept until the next cut.  A turn after an idle gap longer than the
 * servers' cache lifetime is a free moment to cut (its cache is gone anyway).
 *
 * The start is a position in the conversation's lifetime message count
 * (store_lifetime.message_count: messages ever appended), kept in the
 * conversation's context record (store.h version 5), so it survives a
 * restart and is shared by every host of a Redis store.  It is written with
 * the turn that planned it, in the same atomic append.
 *
 * Turns are whole: a cut falls only before a user message (Parley writes a
 * turn's user message first, so a tool call and its results are never
 * parted), and never inside the turn being answered (not in the history).
 *
 * Turns that leave the window are folded into a running summary (when the
 * `summarize` option is on), made ahead of the cut where possible: when the
 * window nears its limit, the turn's commit asks the model, with the
 * conversation's own prompt (which the server has cached) plus one
 * instruction, for the summary updated with the turns the next cut will
 * drop, and stores it as the record's `next` with the position it covers.
 * The cut then drops exactly those turns and the new summary takes their
 * place in the same request: one change of the prompt, no gap, and the
 * summary cost the server little more than the instruction.  Otherwise
 * (no `next`, or it does not fit) the turn that cut them keeps their text
 * (`dropped`), and once it has committed it asks the model for the summary
 * so far plus those turns, and stores the result in the record with the
 * position it covers up to (`upto`).  Later requests carry it after the
 * system prompt.  A summary that fails changes nothing: the record still
 * says up to where the summary goes, so the next turn loads the turns after
 * it again (ctx_load) and folds them at its own commit.
 *
 * Tokens are estimated from bytes (4 per token, the usual figure for English
 * text and JSON) times a correction factor learned from what the server
 * reported for earlier requests (ctx_agent), so the budget holds as the
 * server counts.  Each turn keeps its size with it in the store
 * (store_turn.tokens, ctx_turn_tokens): its bytes times the factor known
 * when it was committed.  The window counts a stored turn by that size, and
 * estimates only turns stored without one (before it was kept, or before
 * the server reported anything), so a restart, or another host of a Redis
 * store, counts the history as the host that wrote it did, before its own
 * first request has taught it the factor.  The size is the corrected
 * estimate, not a count the server gave: servers report whole prompts, and
 * the difference between two prompts also holds what changed around the
 * turn (the extra prompt, a cut, a summary) and the reasoning an answer's
 * completion count includes but the history does not keep.
 *
 * Threads: ctx_load runs where the store is called (a store thread, or the
 * worker for the memory store); everything else on the worker.
 */
#ifndef PARLEY_CONTEXT_WINDOW_PLAN_H
#define PARLEY_CONTEXT_WINDOW_PLAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config/options.h"
#include "lib/buf.h"
#include "store/store.h"

/* A turn after this long without a message is a free moment to cut: the
 * servers' caches have dropped the prompt by then (Anthropic 5 min, OpenAI
 * 5-10 min).  The default of prompt_cache_ttl_ms (ctx_budget.idle_ms). */
#define CTX_IDLE_CUT_MS (5u * 60u * 1000u)
/*
 * A cut keeps 1/CTX_LOW_MARK_DIVISOR of the history budget (and of
 * max_history_turns, at least one turn).  What a cut costs: the server reads
 * again what follows the system prompt (S: the summary, when it changed) and
 * the L tokens kept; the H - L tokens of the turns until the next cut (H: the
 * limit) are new anyway.  Evaluated per new token over that cycle:
 * 1 + (S + L) / (H - L): 2 or more at L = H/2 however small S is, and
 * 1.5 + 1.5 S/H at L = H/3 (bench/context_bench.py: docs/performance.md).  The
 * model then sees a third of the window right after a cut, and the summary of
 * the rest.
 */
#define CTX_LOW_MARK_DIVISOR 3
/* Kept free besides the reserve: estimates are estimates. */
#define CTX_MARGIN_PERCENT 3
/* Bytes per token before correction. */
#define CTX_BYTES_PER_TOKEN 4
/* The factor learned from servers stays within these (ctx_learn_factor): a
 * stored size outside what they give the turn's bytes was not written by
 * Parley (an edited file) and is estimated instead. */
#define CTX_FACTOR_MIN 0.1
#define CTX_FACTOR_MAX 10.0

/* Why a window moved (metrics, logs). */
typedef enum ctx_cut_reason {
    CTX_CUT_NONE,
    CTX_CUT_TOKENS,  /* over the token budget */
    CTX_CUT_TURNS,   /* over max_history_turns */
    CTX_CUT_IDLE,    /* a free moment after an idle gap */
    CTX_CUT_STORE,   /* the start was no longer in the store (history_keep_turns) */
    CTX_CUT_OVERFLOW /* the server said the prompt did not fit */
} ctx_cut_reason;

/* The conversation's context record, as stored (JSON: {"start":N,"summary":S,"upto":M}). */
typedef struct ctx_record {
    uint64_t start;       /* lifetime message index of the first message sent */
    char *summary;        /* the running summary, NULL when there is none */
    uint64_t upto;        /* the summary covers the messages before this index */
    char *next;           /* the summary made ahead for the next cut, NULL when none */
    uint64_t next_upto;   /* it covers the messages before this index */
    /* The prompt tokens the server counted for the turn's last request, and that request's
     * bytes: what the next request, a little longer, should count at least (ctx_shrunk). */
    uint64_t last_prompt;
    uint64_t last_bytes;
    uint64_t prefix_len;  /* what the next request should start with: its length */
    uint64_t prefix_hash; /* and its hash (ctx_prefix_hash); 0 = not known */
} ctx_record;

/* How many messages before the window's start a turn loads to fold into the
 * summary (a summary that failed, or summarize just turned on): older ones
 * are left out of it. */
#define CTX_PENDING_MAX_MESSAGES 400
/* The longest summary kept (bytes, about 750 tokens): a model that writes on
 * past what it was asked for must not eat the window. */
#define CTX_SUMMARY_MAX_BYTES 3000

/* What the agent learns of one model (a persona may name another). */
#define CTX_MODELS 8
#define CTX_MODEL_NAME 96
typedef struct ctx_model {
    char name[CTX_MODEL_NAME]; /* "" = a free slot */
    double factor;             /* server tokens per estimated token; 0 = none learned yet */
    int64_t window;            /* a window the server named (overflow, truncation); 0 = none */
} ctx_model;

/* What the agent learns across turns (worker thread only, but `discovered`). */
typedef struct ctx_agent {
    ctx_model models[CTX_MODELS]; /* by model name; the oldest slot is reused */
    unsigned next_slot;
    atomic_llong discovered; /* the window the server said when asked (GET /props, ...),
                                written by the discovery thread; 0 = not (yet) known */
    pthread_t thread;        /* the discovery, asked once per agent */
    int started;
    const parley_options *opts; /* the discovery's options, kept alive by ref */
    void *ref;
    void (*release)(void *ref);
} ctx_agent;

/*
 * Ask the server for the model's window (context_window_discover, blocking:
 * on a thread of its own) unless asked already; `o` stays valid until
 * release(ref), which the thread calls when done.  The turns meanwhile use
 * the fallback window.  -1 (release called) when no thread could start.
 */
int ctx_discover_start(ctx_agent *a, const parley_options *o, void *ref,
                       void (*release)(void *ref));
/* Wait for the discovery (when one runs): the worker's end. */
void ctx_agent_stop(ctx_agent *a);

/* The prefix hash the cache break check took after the history (ctx_prefix_kept),
 * for the commit to go on from instead of hashing the history again
 * (ctx_set_prefix): the same bytes at the same address, while the window
 * holds them (ctx_split and ctx_cut forget it). */
typedef struct ctx_prefix_memo {
    int valid;
    uint64_t head_h, head_len; /* the state before the history */
    uint64_t h;                /* and after it */
    const char *history;
    size_t history_len;
} ctx_prefix_memo;

/* One turn's view of its conversation's window. */
typedef struct ctx_window {
    int enabled;           /* the store keeps context records: the window is planned */
    ctx_record rec;        /* as loaded */
    store_lifetime life;   /* the conversation at load */
    uint64_t first;        /* lifetime index of the first message in the history held */
    int start_lost;        /* the record's start lies before what the store still holds */
    size_t nturns;         /* whole turns in the history held */
    size_t *end;           /* byte offset just past turn i (its last ',') */
    size_t *nmsgs;         /* messages of turn i */
    uint32_t *tokens;      /* turn i's size as stored (store_turn.tokens); 0: estimated */
    ctx_cut_reason cut;    /* why this turn moved the start (NONE: it did not) */
    size_t cut_turns;      /* turns this turn's cuts dropped */
    pbuf record;           /* the record the commit writes */
    int summarize;         /* fold what leaves the window into the summary */
    pbuf dropped;          /* the messages before the start not yet in the summary ("m,m,") */
    uint64_t dropped_from; /* lifetime index of dropped's first message */
    ctx_prefix_memo memo;  /* the check's hash, for the commit */
} ctx_window;

typedef struct ctx_budget {
    int64_t window;   /* the model's context, tokens */
    int64_t reserve;  /* kept for the answer */
    size_t max_turns; /* max_history_turns; 0 = no bound */
    double factor;    /* correction factor (1 when none is known) */
    uint64_t idle_ms; /* prompt_cache_ttl_ms: a longer idle gap is a free moment to cut; 0 = never */
} ctx_budget;

void ctx_window_free(ctx_window *w);

/*
 * Read the conversation's record, then the history from its start (at most
 * max_turns whole turns when max_turns > 0) into `history` ("m,m,") with
 * *nmessages, and find its turns (ctx_split).  A store without records
 * (version < 5) loads the last max_turns turns as before, w->enabled = 0.
 */
parley_status ctx_load(store *s, const store_key *key, size_t max_turns, int summarize,
                       uint64_t now_ms, pbuf *history, size_t *nmessages, ctx_window *w,
                       char **err);

/* Find the whole turns of the history held.  0, or -1 out of memory. */
int ctx_split(ctx_window *w, const pbuf *history);

/* The turns reply_to counts as "in the window" (reply_context.h): those the
 * window holds, or max_turns without a planned window. */
size_t ctx_reply_window(const ctx_window *w, size_t max_turns);

/* Estimated tokens of `bytes` bytes of request text. */
int64_t ctx_tokens(size_t bytes, double factor);

/* The most a request may hold in tokens: the window less the reserve for the
   answer and CTX_MARGIN_PERCENT of the window (estimates are estimates). */
int64_t ctx_limit(const ctx_budget *b);

/* The size to store with a turn being committed (store_turn.tokens): its
 * messages' bytes as the window holds them, times `factor`, the correction
 * learned from what the server reported for this model.  0 (unknown: the
 * window estimates it at each load) while no factor is learned (factor <= 0). */
uint32_t ctx_turn_tokens(const store_message *msgs, size_t n, double factor);

/*
 * How many of the oldest turns to cut before sending a request whose body
 * is estimated at body_tokens (history included), and why (*why).  0 when
 * the window stays.  Cuts go down to the low mark.  `force`: cut even when
 * within budget (an overflow answer), at least one turn when there is one.
 */
size_t ctx_plan(const ctx_window *w, const ctx_budget *b, int64_t body_tokens, uint64_t now_ms,
                int force, ctx_cut_reason *why);

/* Count every turn from its bytes from now on, not by the size stored with
 * it: the server refused a request the stored sizes said would fit, so they
 * undercount (a file edited or copied, sizes kept with another model), and
 * a cut by them would keep what was just refused. */
void ctx_forget_sizes(ctx_window *w);

/* Drop the oldest n turns from `history` and move the start past them;
 * returns the messages dropped. */
size_t ctx_cut(ctx_window *w, pbuf *history, size_t n, ctx_cut_reason why);

/* The record to store with the turn (w->record): the window's start, the
 * summary as loaded.  0, or -1 out of memory. */
int ctx_record_write(ctx_window *w);

/* The record once `summary` covers everything before the window (w->record).
 * 0, or -1 out of memory. */
int ctx_record_write_summary(ctx_window *w, const char *summary);

/* The record with a summary made ahead (w->record): `next`, covering the
 * first n_turns turns of the window.  0, or -1 out of memory. */
int ctx_record_write_next(ctx_window *w, const char *next, size_t n_turns);

/* When the window is near its limit (the request of body_tokens, the turn's
 * answer included) and no summary made ahead is waiting: how many of the
 * oldest turns the next cut would drop (0: nothing to make ahead). */
size_t ctx_ahead_turns(const ctx_window *w, const ctx_budget *b, int64_t body_tokens);

/* At a cut of n turns (why != NONE): the turns the summary made ahead covers,
 * when it can take their place (it covers exactly a whole-turn prefix of the
 * window, and cutting there keeps the request within the limit and the turn
 * bound: then the cut goes exactly there, a little short of the low mark
 * perhaps), else n.  *use_next says whether to (ctx_take_next after the cut). */
size_t ctx_cut_for_next(const ctx_window *w, const ctx_budget *b, int64_t body_tokens, size_t n,
                        int *use_next);

/* After ctx_cut with use_next: the summary made ahead becomes the summary, and
 * what it covers leaves `dropped` (what is left there is folded after the commit). */
void ctx_take_next(ctx_window *w);

/* The summary to send (NULL: none). */
const char *ctx_summary(const ctx_window *w);

/* The summary request's user message: the summary so far and the dropped
 * turns as a transcript, at most about max_bytes (the oldest lines go first:
 * a summary request must fit the window too).  malloc'd, NULL on OOM. */
char *ctx_summary_input(const ctx_window *w, size_t max_bytes);

/* What the agent learned of `model` (a slot made for it when it has none). */
ctx_model *ctx_model_of(ctx_agent *a, const char *model);

/* Learn the correction factor from a request of body_bytes the server counted
 * as prompt_tokens. */
void ctx_learn_factor(ctx_model *m, size_t body_bytes, long long prompt_tokens);

const char *ctx_cut_reason_name(ctx_cut_reason why);

/*
 * Cache breaks.  A request that does not start with everything the previous
 * request of its conversation sent (the agent's prompt, the tools, the
 * history, that turn's messages) makes the server read it again.  The commit
 * stores the hash of that prefix (ctx_set_prefix); the next turn checks that
 * its own stable part starts with it (ctx_prefix_kept, which keeps its hash
 * after the history for the commit: w->memo) unless it moved the
 * window on purpose.  FNV-1a over prompt, 0x1e, tools, 0x1e, history.
 */
void ctx_set_prefix(ctx_window *w, const char *prompt, const char *tools, const char *history,
                    size_t history_len, const char *turn, size_t turn_len);
/* 1 when the stored prefix is unknown or kept; 0: a cache break. */
int ctx_prefix_kept(ctx_window *w, const char *prompt, const char *tools, const char *history,
                    size_t history_len);

/*
 * A server that silently drops the start of a prompt too long for it (Ollama
 * past num_ctx) counts fewer tokens than the previous request of the
 * conversation although this one is longer.  1 when the first request of a
 * turn whose window did not move (body_bytes long) was counted as `prompt`
 * tokens by such a server: it grew by less than half of what it should.
 */
int ctx_shrunk(const ctx_window *w, size_t body_bytes, long long prompt, double factor);

/* Read a stored record (the fields it has; all 0 when it does not parse): 0, or -1 out
 * of memory (then all 0 too). */
int ctx_record_parse(const char *json, size_t len, ctx_record *out);
#ifdef PARLEY_TEST_HOOKS
/* Its two readers alone, for the fuzz target that checks they agree: the fast
 * one for the form record_put writes without summaries (1, or 0 and *out
 * untouched), and jansson's for any record. */
int ctx_record_parse_plain(const char *json, size_t len, ctx_record *out);
void ctx_record_parse_json(const char *json, size_t len, ctx_record *out);
#endif

/* What history_get shows of a stored record: appends
 * {"window_start":S,"summary":TEXT|null,"summary_covers":U} to out (positions
 * in the conversation's lifetime message count). */
void ctx_describe(const char *record, size_t len, pbuf *out);

#endif
