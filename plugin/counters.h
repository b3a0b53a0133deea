/* counters.h -- an agent's metrics: atomics, bumped by any thread, read by metrics(). */
#ifndef PARLEY_COUNTERS_H
#define PARLEY_COUNTERS_H

#include <stdatomic.h>

typedef struct agent_counters {
    atomic_uint_fast64_t turns_accepted, turns_ok, turns_failed, turns_cancelled;
    atomic_uint_fast64_t llm_requests, llm_retries, tool_calls, tool_errors, tool_timeouts;
    atomic_uint_fast64_t rejected_busy, rejected_invalid;
    atomic_int_fast64_t in_flight;
} agent_counters;

#endif
