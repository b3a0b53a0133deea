/*
 * llm_request.h -- render one Chat Completions request body.
 *
 * Stored history is already message JSON text, so rendering is mostly
 * copying: system prompt, the conversation's turns, this turn's messages,
 * then the generation parameters.
 */
#ifndef PARLEY_LLM_REQUEST_H
#define PARLEY_LLM_REQUEST_H

#include "buf.h"
#include "options.h"

typedef struct llm_request {
    const char *extra_system_prompt; /* may be NULL */
    const char *history;             /* "m,m," (each message followed by ','), may be "" */
    size_t history_len;
    const char *messages;            /* this turn's "m,m" (at least the user message) */
    size_t messages_len;
    const char *tools_json;          /* OpenAI tools array, "[]" for none */
    int tool_choice_none;            /* the last round: make the model answer in text */
} llm_request;

/* Render into out (reset first).  Check out->oom afterwards. */
void llm_request_render(pbuf *out, const parley_options *o, const llm_request *r);

#endif
