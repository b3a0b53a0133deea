/*
 * provider.h -- one LLM provider's wire format, as a codec (in the manner of
 * curl's lib/vtls/ and SQLite's sqlite3_vfs: this one interface, and each API's
 * codec in files of its own, named after it).  Everything server-specific
 * lives behind it:
 *
 *   endpoint     the request URL path and the provider's own headers
 *   encode       request body from Parley's neutral messages (docs/history.md),
 *                the tools and the turn's parameters
 *   decode       a whole (non-streamed) reply body -> llm_reply
 *   stream_*     an incremental decoder of a streamed reply (SSE or NDJSON)
 *   error_text   the server's own words from an error body
 *   retryable    whether an HTTP error status is worth another attempt
 *   ask_window   what to ask the server about its context window, and how to
 *                read the answer (http/context_window.c sends the questions)
 *   the rest     what the turn, the connection check and the options' help
 *                would otherwise decide by the provider's name: the window to
 *                assume, a 404's likely cause, silent truncation, a summary
 *
 * The turn sees only this table and the helpers below; http/ sends what the
 * codec renders and knows no server at all.  Codecs: openai.c (Chat Completions, default; its
 * decoders, the largest, are openai_reply.c and openai_stream.c),
 * anthropic.c (Messages), ollama.c (native /api/chat).  What they share is
 * codec.h; the reply they all fill, llm_reply.h.
 */
#ifndef PARLEY_PROVIDER_H
#define PARLEY_PROVIDER_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>

#include "lib/buf.h"
#include "provider/llm_reply.h"
#include "config/options.h"
#include "config/response_format.h"

/* What one request is made of, in neutral form (all borrowed). */
typedef struct provider_request {
    const char *system;       /* system prompt of this request; NULL or "" for none */
    size_t system_fixed_len;  /* how much of it is the agent's own prompt, the same every
                                 turn (the rest: "\n\n" and the turn's extra prompt) */
    const json_t *history;    /* array: stored messages of earlier turns, oldest first;
                                 NULL when history_text is given instead */
    const char *history_text; /* or the same as stored text ("m,m,"), for a codec with
                                 reads_history_text; NULL otherwise */
    size_t history_text_len;
    const json_t *messages;   /* array: this turn's messages so far (user message first);
                                 NULL when messages_text is given instead */
    const char *messages_text; /* or the same as text ("m,m,"), for a codec with
                                  reads_history_text; NULL otherwise */
    size_t messages_text_len;
    const char *tools_json;   /* tools in OpenAI form (toolset_json); "[]" for none */
    int tool_choice_none;     /* the last round: the model must answer in text */
    const char *tool_choice;  /* NULL: the model chooses; "required": it must call a tool;
                                 else the name of the tool it must call (option
                                 tool_choice, first request of a turn).  Not with
                                 tool_choice_none, nor without tools */
    const response_format *response_format; /* the answer as JSON of this form; NULL: text */
    const char *cache_key;    /* the conversation, for a server's cache routing
                                 (OpenAI's prompt_cache_key); NULL: stateless */
    const char *turn_note;    /* what changes from turn to turn (extra_system_prompt, ...),
                                 sent after the stable prefix: in the turn's user message
                                 (messages' first), after its text; never stored.  NULL:
                                 none */
} provider_request;

/* What a server said of the model's context window. */
typedef struct provider_window {
    long long n_ctx;    /* the window in tokens; 0 when no server said */
    const char *source; /* which answer said it (a codec's word: "props", "show", ...), or NULL */
} provider_window;

/* One question to the server, sent by the caller of ask_window (the HTTP layer, which
 * the codecs may not include): GET url, or POST post_body when it is not NULL, with the
 * codec's headers.  *answer (PBUF_INIT on entry; the asker's caller frees it) gets the
 * body of a 2xx answer, and stays empty for any other status.  0, or -1 with *err when no
 * HTTP answer came (refused, timeout; a NULL url is out of memory). */
typedef int (*provider_ask_fn)(void *ctx, const char *url, const char *post_body, pbuf *answer,
                               char **err);

typedef struct provider {
    const char *name;             /* the `provider` option's value */
    const char *default_base_url; /* base_url when the options give none */
    const char *path;             /* appended to base_url, e.g. "/chat/completions" */
    const char *models_path;      /* the model list (connection check), e.g. "/models" */
    const char *not_found_hint;   /* what an HTTP 404 most likely means for this API */
    const char *stream_accept;    /* Accept header line of a streamed request */
    long long default_max_tokens; /* max_tokens when the options give none; 0 = not sent */
    int images_by_url;            /* the API takes an image as an http(s) URL (else only as
                                     base64 data: the turn refuses URL images) */
    int reads_history_text;       /* encode takes history_text and messages_text: no parse
                                     per request (the stored form is already close to this
                                     wire format) */

    /* Append the provider's own headers (auth, version) to *list; -1 on OOM. */
    int (*headers)(const parley_options *o, struct curl_slist **list);
    /* Render the request body into out (reset first).  0, or -1 with *err. */
    int (*encode)(pbuf *out, const parley_options *o, const provider_request *r, char **err);
    /* Decode a whole reply.  0, or -1 with *err (then *out is empty). */
    int (*decode)(const char *body, size_t len, llm_reply *out, char **err);

    /* Streamed replies: same contract as llm_stream_* in openai_decode.h. */
    void *(*stream_new)(const llm_sink *sink);
    int (*stream_feed)(void *s, const char *data, size_t len, char **err);
    int (*stream_finish)(void *s, llm_reply *out, char **err);
    void (*stream_free)(void *s);
    /* 1 once the stream said it is whole ([DONE], message_stop, "done": true): the rest
       of the body can be dropped. */
    int (*stream_done)(const void *s);

    /* The server's error text from an error body (malloc'd, cleaned, bounded) or NULL. */
    char *(*error_text)(const char *body, size_t len);
    /* 1 when an answer with this HTTP error status may succeed if tried again. */
    int (*retryable)(long status, const char *body, size_t len);
    /* Rules this API puts on the options beyond each option's own range (NULL:
       none): PARLEY_OK, or PARLEY_ERR_INVALID_OPTIONS with *err naming the option. */
    parley_status (*check_options)(const parley_options *o, char **err);

    /* What this API is, for the `provider` option's help, e.g. "Messages API". */
    const char *summary;
    /* The context window (tokens) to assume when neither the options, the server nor an
       overflow answer said one. */
    long long (*default_window)(const parley_options *o);
    /* Ask the server the model's context window through ask (o->base_url is set); NULL
       when the API does not say.  0 with *out filled (n_ctx 0 when no server said: not an
       error), or -1 with *err when no question got an answer at all. */
    int (*ask_window)(const parley_options *o, provider_ask_fn ask, void *ctx, provider_window *out,
                      char **err);
    /* The server silently drops the oldest messages of a prompt longer than its window
       instead of refusing it (Ollama): the turn compares the prompt tokens it read with
       those sent, and cuts and sends again. */
    int truncates_silently;
} provider;

extern const provider provider_openai, provider_anthropic, provider_ollama;

/* The registry: every codec, in the order docs and errors list them; NULL ends
 * it.  Adding a provider is a codec file and one entry here (provider.c). */
extern const provider *const provider_registry[];

/* The codec named `name`, or NULL. */
const provider *provider_find(const char *name);

/* options_parse, then what the registry adds: `provider` must name one of its
 * codecs, and that codec's check_options must pass.  PARLEY_OK, or
 * PARLEY_ERR_INVALID_OPTIONS (NO_MEMORY) with *err (malloc'd; the options then
 * hold nothing to free). */
parley_status provider_options_parse(const char *json, parley_options *o, char **err);

/* options_schema() with the `provider` option's "enum" from the registry
 * (malloc'd JSON text; NULL out of memory). */
char *provider_options_schema(void);

/*
 * Parse stored message text ("m,m," or "m,m": JSON objects joined by ',')
 * into a new JSON array.  NULL with *err when it is not that.
 */
json_t *provider_parse_messages(const char *text, size_t len, char **err);

/*
 * Decoding with Parley's own rules on top of the codec: `<think>...</think>`
 * at the start of the content becomes reasoning (when strip_think_tags), in
 * the whole reply and in the stream alike (the tags may be split across
 * deltas), so reasoning never reaches the text the host is given.
 */
int provider_decode(const provider *p, int strip_think, const char *body, size_t len,
                    llm_reply *out, char **err);

typedef struct provider_stream provider_stream;
provider_stream *provider_stream_new(const provider *p, int strip_think, const llm_sink *sink);
int provider_stream_feed(provider_stream *s, const char *data, size_t len, char **err);
int provider_stream_finish(provider_stream *s, llm_reply *out, char **err);
int provider_stream_done(const provider_stream *s);
void provider_stream_free(provider_stream *s);

/* What servers say of their window, read by the codecs' ask_window (apart, so they can be
 * tested on the servers' bodies).  llama.cpp /props: default_generation_settings.n_ctx (or
 * a top-level n_ctx); 0 if none. */
long long provider_window_from_props(const char *body, size_t len);
/* vLLM /v1/models: max_model_len of the entry whose id is model (of the only entry when
   model is NULL or matches none and there is one); 0 if none. */
long long provider_window_from_models(const char *body, size_t len, const char *model);
/* Ollama /api/show: *num_ctx = the "num_ctx" line of parameters (0 if none); returns
   model_info["<general.architecture>.context_length"] (0 if none). */
long long provider_window_from_show(const char *body, size_t len, long long *num_ctx);

/* 429 and 5xx, except a 429 saying the account has no quota left (retrying cannot help). */
int provider_retryable_default(long status, const char *body, size_t len);

#endif
