/*
 * llm_reply.h -- what the LLM answered, in Parley's words whatever the
 * provider: every codec's decoders (provider.h), whole body or stream, fill
 * this same llm_reply, so a streamed turn commits exactly the same history as
 * a non-streamed one.  Its functions are in codec.c.
 *
 * Decoders never trust the server: any shape they do not expect is an error
 * with a message saying what was wrong (it becomes PARLEY_ERR_BAD_RESPONSE).
 */
#ifndef PARLEY_LLM_REPLY_H
#define PARLEY_LLM_REPLY_H

#include <stddef.h>

#include "lib/plugin_status.h"
#include "lib/dict.h"

/*
 * The most tool calls one answer may hold: the same streamed or not, on every
 * provider.  More is PARLEY_ERR_BAD_RESPONSE, "the answer has more than 1024
 * tool calls".  It bounds what a looping or hostile server makes Parley hold
 * (a stream's calls are gathered as they come) and the host run in one round.
 */
#define LLM_MAX_TOOL_CALLS 1024

typedef struct llm_tool_call {
    char *id;        /* the model's call id; "call_<position>" when the server gave none
                        (llm_reply_claim_ids makes them unique in the turn) */
    char *name;      /* function name; never NULL, may be "" if the server sent an empty one */
    char *arguments; /* the arguments as JSON TEXT as sent (an object sent instead of a
                        string, as Ollama does, is serialised; missing/empty -> "{}");
                        NOT validated here */
} llm_tool_call;

/* Token counts of one request; 0 where the server gave none. */
typedef struct llm_usage {
    long long prompt, completion; /* prompt: all input tokens, cached ones included */
    long long cache_read;         /* input tokens read from the server's prompt cache */
    long long cache_creation;     /* input tokens written to it (Anthropic) */
    long long reasoning;          /* output tokens spent reasoning, where reported */
    long long evaluated;          /* prompt tokens the server evaluated, not read from its cache:
                                     llama.cpp's timings.prompt_n; else llm_usage_settle sets
                                     prompt - cache_read */
    long long timings_cached;     /* llama.cpp's timings.cache_n (its usage may lack the details) */
} llm_usage;

/* Fill in what one reply's usage implies: llama.cpp's timings stand in for the usage
 * figures a server left out (an older llama.cpp reports no cached_tokens), and
 * `evaluated` is prompt - cache_read where the server gave no figure of its own. */
void llm_usage_settle(llm_usage *u);

typedef struct llm_reply {
    char *content;         /* assistant text; NULL when there is none (tool calls only) */
    llm_tool_call *calls;  /* ncalls entries, in the order the model gave them */
    size_t ncalls;
    char *finish_reason;   /* in Chat Completions words ("stop", "tool_calls", "length",
                              "content_filter", ...; other providers' reasons are mapped
                              to these), or NULL if absent */
    char *reasoning;       /* the model's reasoning text, never part of content; or NULL */
    char *provider_data;   /* JSON object text kept with the assistant message for the
                              provider that produced it ({"anthropic":{...}}), or NULL */
    llm_usage usage;
    int ids_minted;        /* the server gives calls no ids (Ollama): the turn names them */
    int context_full;      /* finish_reason "length" because the context window was full, as
                              the server said (Anthropic model_context_window_exceeded) */
} llm_reply;

void llm_reply_free(llm_reply *r); /* frees the members; r itself may be on the stack */

/*
 * Tool-call ids must be unique within a turn, across all its rounds: servers
 * refuse a history holding one id twice ("Duplicate tool call id"), and models
 * do send duplicates (two calls "call_1", or "call_1" and none, which the
 * decoders fill as "call_<position>").  Each call of `r` whose id is empty,
 * already in `*taken` (the ids of the turn's earlier calls; created on first
 * use) or minted by the turn (ids_minted) gets a fresh "call_<at>_<i>" (`at`:
 * where the assistant message stands in the conversation, `i`: the call's
 * place in the reply) with a further "_<k>" while that is taken too; every id
 * then goes into `*taken`.  0, or -1 out of memory.
 */
int llm_reply_claim_ids(llm_reply *r, dict **taken, size_t at);
void llm_call_ids_free(dict *taken); /* the set and the ids it holds; NULL is fine */

/*
 * The server's own error text from an error body (OpenAI {"error":{"message":..}},
 * Ollama {"error":"..."}, or a short plain-text body), malloc'd, or NULL when
 * there is nothing readable.  At most ~500 bytes; control characters removed.
 */
char *llm_error_text(const char *body, size_t len);

/*
 * The words every decoder starts its error with when the reply was the server's error
 * object instead of an answer: a 200 body {"error":{...}} (mock servers, some proxies),
 * an SSE error event, Anthropic {"type":"error"}, an Ollama {"error":"..."} line.  The
 * text goes on with the object's message and its type / code.
 */
#define LLM_SERVER_ERROR "server returned an error: "

/*
 * What such an error (a decoder's *err starting with LLM_SERVER_ERROR) stands for, read
 * from its type / code (or, where the server gives none, its message), as the HTTP status
 * it would have come with: an invalid key or a refused permission is "http_status" and not
 * retried; a rate limit "rate_limited", retried (a spent quota: not); an overloaded or
 * failing server "http_status", retried; a bad request or an unknown model "http_status",
 * not retried.  Anything else, and any other decode error: "bad_response", not retried.
 */
parley_status llm_server_error_status(const char *decode_error, int *retryable);

/* The codecs' *err when out of memory (codec_oom), and whether an encoder's or decoder's
   *err says that: it does, or it is NULL (not even a message could be made). */
#define LLM_OUT_OF_MEMORY "out of memory"
int llm_error_is_oom(const char *err);

/* ---- streaming ---- */

/* Called with each piece of assistant text as soon as it is decoded. */
typedef void (*llm_text_fn)(void *ud, const char *text, size_t len);

/* Where a stream decoder sends what it decodes (whole UTF-8 characters). */
typedef struct llm_sink {
    llm_text_fn text;      /* assistant text; may be NULL */
    llm_text_fn reasoning; /* reasoning text; may be NULL */
    void *ud;
} llm_sink;

#endif
