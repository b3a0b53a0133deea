/*
 * options.h -- the agent's options: parsed once from the host's JSON text at
 * create(), validated strictly (unknown key, wrong type, out of range: each is
 * an error naming the option), then read-only for the agent's life.  An
 * integer option left null holds one less than its minimum ("unset").
 *
 * One table in options.c describes every option (name, type, range, default,
 * doc); the parser, the defaults and the JSON Schema are all derived from it,
 * so they cannot drift apart.
 */
#ifndef PARLEY_OPTIONS_H
#define PARLEY_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "lib/plugin_status.h"

typedef struct parley_options {
    /* LLM endpoint */
    char *provider;              /* a codec of provider/provider.h's registry: checked, and
                                    when not given set to its first, by provider_options_parse
                                    (options_parse leaves it NULL) */
    char *base_url;              /* without trailing '/'; the provider's default when not given */
    char *model;
    char *api_key;               /* resolved from api_key or api_key_env; NULL = none */
    char *api_key_env;
    int verify_tls;
    /* generation */
    char *prompt;                /* system prompt; "" = none */
    double temperature;          /* < 0: not sent */
    double top_p;                /* < 0: not sent */
    int64_t max_tokens;          /* 0: not sent */
    int stream;
    /* time */
    int64_t connect_timeout_ms;
    int64_t request_timeout_ms;
    int64_t stream_idle_timeout_ms;
    int64_t turn_timeout_ms;
    int64_t tool_timeout_ms;
    int64_t max_retries;
    int64_t retry_backoff_ms;
    int64_t retry_max_delay_ms;
    /* history */
    char *history_store;         /* "memory", "sqlite:PATH" or "redis://..." (scheme checked) */
    char *history_sync;          /* "normal" or "full" */
    int64_t max_history_turns;   /* turns sent: the last N; 0 = all kept */
    int64_t history_keep_turns;  /* turns kept; 0 = all; -1 (null) = max_history_turns */
    int64_t max_conversations;
    int64_t history_idle_timeout_s; /* 0 = never */
    char *history_key_prefix;    /* shared stores (redis): prefix of every key */
    int64_t history_lease_ms;    /* shared stores: a conversation lease's life without renewal */
    int auto_create_conversation_id;
    /* tools */
    int64_t max_tool_iterations;
    char *tools_json;            /* the `tools` option as compact JSON text ("[]" if absent) */
    /* personas and images */
    char *personas_json;         /* the `personas` object as compact JSON text ("{}" if absent) */
    char *history_images;        /* "placeholder" or "keep" */
    int64_t max_image_bytes;
    int64_t max_images_per_turn;
    /* bounds */
    int64_t max_in_flight;
    int64_t max_connections;     /* connections to the LLM server open at once */
    int64_t max_input_bytes;
    int64_t max_response_bytes;
    int64_t max_tool_result_bytes;
    /* diagnostics */
    int debug_log_bodies;
    /* reasoning */
    int strip_think_tags;        /* <think>...</think> at the start of content is reasoning */
    /* provider details */
    char *max_tokens_field;      /* Chat Completions: "max_tokens" or "max_completion_tokens" */
    char *reasoning_effort;      /* Chat Completions; NULL = not sent */
    char *extra_body;            /* JSON object text merged into every request; NULL = none */
    int64_t thinking_budget_tokens; /* Anthropic extended thinking; 0 = off */
    int prompt_cache;            /* Anthropic: cache_control on the system prompt and tools */
    char *keep_alive;            /* Ollama: JSON text (a string or number); NULL = not sent */
    int64_t num_ctx;             /* Ollama: context window; 0 = not sent */
    /* the context (context/window.h) */
    int64_t context_window;      /* tokens; 0 = discovered / learned / a default */
    int64_t context_reserve;     /* tokens kept for the answer; -1 (null) = from max_tokens */
    int summarize;               /* fold turns that leave the window into a summary */
    char *summary_model;         /* NULL = the request's model */
    int prompt_cache_key;        /* openai: 1 send, 0 never, -1 (null) OpenAI's API only */
    int64_t prompt_cache_ttl_ms; /* an idle gap past it is a free moment to cut; 0 = never */
    char *think;                 /* Ollama: JSON text (true/false/"high"...); NULL = not sent */
    /* tools, continued */
    char *tool_choice;           /* "auto", "none", "required" or a tool's name */
} parley_options;

/*
 * Parse and validate.  PARLEY_OK, or PARLEY_ERR_INVALID_OPTIONS (NO_MEMORY) with
 * *err (malloc'd) naming the option: "option 'temperature': must be a number
 * from 0 to 2".  On failure *opts holds nothing that needs freeing.
 */
parley_status options_parse(const char *json_text, parley_options *opts, char **err);
void options_free(parley_options *opts);

/* JSON Schema of every option with its default and description (malloc'd); what the
   provider registry knows (the `provider` option's names and default, the providers'
   URLs) is added by provider_options_schema. */
char *options_schema(void);

#endif
