/*
 * think.h -- `<think>...</think>` at the start of a model's content is its
 * reasoning (qwen3, DeepSeek-R1 and others served without a reasoning
 * parser), not its answer.  This filter splits such content, fed in pieces
 * split anywhere, into text and reasoning:
 *
 *   leading whitespace, "<think>", reasoning, "</think>", whitespace, text
 *
 * Content that does not start that way is all text.  The split points are
 * ASCII, so whole-UTF-8 input pieces give whole-UTF-8 output pieces.  Fed
 * the whole content at once or in any pieces, the result is the same.
 */
#ifndef PARLEY_PROVIDER_THINK_H
#define PARLEY_PROVIDER_THINK_H

#include <stddef.h>

#include "lib/buf.h"

typedef void (*think_out_fn)(void *ud, int is_reasoning, const char *text, size_t len);

typedef struct think_filter {
    int state;     /* THINK_DECIDE, THINK_IN, THINK_AFTER, THINK_PASS (think.c) */
    pbuf held;     /* bytes whose fate is not known yet */
    think_out_fn out;
    void *ud;
} think_filter;

void think_init(think_filter *f, think_out_fn out, void *ud);
void think_feed(think_filter *f, const char *text, size_t len);
void think_finish(think_filter *f); /* flush what is held */
int think_oom(const think_filter *f);
void think_free(think_filter *f);

#endif
