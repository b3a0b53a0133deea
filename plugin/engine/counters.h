/* counters.h -- an agent's metrics: atomics, bumped by any thread, read by metrics(). */
#ifndef PARLEY_COUNTERS_H
#define PARLEY_COUNTERS_H

#include <stdatomic.h>

typedef struct agent_counters {
    atomic_uint_fast64_t turns_accepted, turns_ok, turns_failed, turns_cancelled;
    /* tokens, as the servers counted them, over every request */
    atomic_uint_fast64_t tokens_prompt, tokens_completion, tokens_cache_read;
    atomic_uint_fast64_t tokens_cache_creation, tokens_reasoning;
    atomic_uint_fast64_t tokens_prompt_evaluated; /* prompt tokens not read from a cache */
    atomic_uint_fast64_t answers_cut_short; /* turns whose answer hit max_tokens */
    atomic_uint_fast64_t llm_requests, llm_retries, tool_calls, tool_errors, tool_timeouts;
    atomic_uint_fast64_t rejected_busy, rejected_invalid;
    atomic_int_fast64_t in_flight;
    /* the context (context/window.h) */
    atomic_uint_fast64_t context_cuts;      /* planned moves of a window's start */
    atomic_uint_fast64_t context_overflows_recovered; /* overflow answers cut and sent again */
    atomic_uint_fast64_t summaries_made, summaries_failed;
    atomic_uint_fast64_t cache_breaks;      /* requests that did not extend their
                                               conversation's previous one, unplanned */
} agent_counters;

#endif
