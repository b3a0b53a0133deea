/*
 * overflow.h -- "the prompt does not fit": each server's context-overflow
 * answer, recognised in its own shape, with the sizes it names.
 *
 * A prompt longer than the model's window is refused, not answered, and each
 * server says so its own way: llama.cpp with an error type of its own and the
 * two sizes as fields, OpenAI with the code context_length_exceeded, vLLM with
 * a 400 whose message names both sizes, Anthropic with "prompt is too long".
 * The turn turns any of them into PARLEY_ERR_CONTEXT_OVERFLOW (instead of a
 * plain http_status) so the context engine can learn the window, cut, and try
 * again.  Ollama refuses nothing: it drops the oldest messages to fit num_ctx
 * and its prompt_eval_count shows the shorter prompt (see llm_usage).
 */
#ifndef PARLEY_PROVIDER_OVERFLOW_H
#define PARLEY_PROVIDER_OVERFLOW_H

#include <stddef.h>

typedef struct llm_overflow {
    long long n_prompt; /* the prompt's tokens as the server counted them; 0 when not said */
    long long n_ctx;    /* the model's context window in tokens; 0 when not said */
} llm_overflow;

/*
 * 1 when an HTTP error answer (status >= 400 and its body) says the prompt
 * does not fit the context window, with *out filled (0 for a size the server
 * did not give); else 0 and *out zeroed.  Recognises:
 *   llama.cpp  {"error":{"type":"exceed_context_size_error","n_prompt_tokens","n_ctx",
 *               "message":"request (N tokens) exceeds the available context size (M tokens), ..."}}
 *   OpenAI     {"error":{"code":"context_length_exceeded","message":"This model's maximum
 *               context length is M tokens. However, your messages resulted in N tokens. ..."}}
 *   vLLM       400 "This model's maximum context length is M tokens. However, your request has
 *               N input tokens. ..." (also "you requested N tokens (...)", and the
 *               "'max_tokens' ... is too large" form, whose N is the input), under "error" or,
 *               in older releases, at the top level ({"object":"error","message":...})
 *   Anthropic  {"type":"error","error":{"type":"invalid_request_error",
 *               "message":"prompt is too long: N tokens > M maximum"}}, or, when max_tokens
 *               does not fit beside the prompt, "input length and `max_tokens` exceed context
 *               limit: N + X > M, decrease input length or `max_tokens` and try again"
 */
int llm_overflow_parse(long status, const char *body, size_t len, llm_overflow *out);

/*
 * The same from the server's words alone (an error that came inside a
 * stream, after HTTP 200, as older llama.cpp servers send it): 1 with *out
 * filled when msg says the prompt does not fit, else 0.
 */
int llm_overflow_from_text(const char *msg, llm_overflow *out);

#endif
