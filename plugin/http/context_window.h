/*
 * context_window.h -- asking the server how long the model's context window
 * is, where a server says it: llama.cpp's GET /props
 * (default_generation_settings.n_ctx, the slot's window), vLLM's
 * GET /v1/models (max_model_len of the model), Ollama's POST /api/show
 * (model_info "<arch>.context_length", parameters "num_ctx").
 *
 * The context engine needs the window to keep every prompt inside it; the
 * user may set it, an overflow answer may name it (provider/overflow.h), and
 * otherwise this asks.  One blocking request or two (bounded by
 * connect_timeout_ms and request_timeout_ms each): call it off the worker's
 * event loop, once per agent or after an overflow, and keep the answer.
 * What to ask and how to read the answers is the codec's (provider.h,
 * ask_window); this file sends the questions.
 */
#ifndef PARLEY_CONTEXT_WINDOW_H
#define PARLEY_CONTEXT_WINDOW_H

#include <stddef.h>

#include "config/options.h"
#include "provider/provider.h"

/* n_ctx: the window in tokens, 0 when no server said; source: "props" (llama.cpp),
 * "models" (vLLM max_model_len), "show" (Ollama), "num_ctx" (Ollama: the num_ctx option
 * Parley sends, within the model's own length), or NULL. */
typedef provider_window context_window_info;

/*
 * Ask the server of these options what its codec's ask_window asks (openai:
 * GET <root>/props (root: base_url without a trailing /v1), then
 * GET <base_url>/models; ollama: POST <base_url>/api/show; anthropic: nothing,
 * the API does not say).
 * Returns 0 with *out filled (n_ctx 0 when no server said: not an error), or
 * -1 with *err (malloc'd) when no request got an answer at all (connection
 * refused, timeout, out of memory).
 */
int context_window_discover(const parley_options *o, context_window_info *out, char **err);

#endif
