/* status.c -- the stable names of the public status codes (see docs/errors.md). */
#include "lib/plugin_status.h"

const char *status_name(parley_status s)
{
    switch (s) {
    case PARLEY_OK: return "ok";
    case PARLEY_ERR_INVALID_INPUT: return "invalid_input";
    case PARLEY_ERR_INVALID_OPTIONS: return "invalid_options";
    case PARLEY_ERR_BUSY: return "busy";
    case PARLEY_ERR_CANCELLED: return "cancelled";
    case PARLEY_ERR_TIMEOUT: return "timeout";
    case PARLEY_ERR_CONNECT: return "connect";
    case PARLEY_ERR_RATE_LIMITED: return "rate_limited";
    case PARLEY_ERR_HTTP_STATUS: return "http_status";
    case PARLEY_ERR_BAD_RESPONSE: return "bad_response";
    case PARLEY_ERR_TOOL_LOOP: return "tool_loop";
    case PARLEY_ERR_NOT_FOUND: return "not_found";
    case PARLEY_ERR_NO_MEMORY: return "no_memory";
    case PARLEY_ERR_INTERNAL: return "internal";
    case PARLEY_ERR_STORAGE: return "storage";
    case PARLEY_ERR_CONTEXT_OVERFLOW: return "context_overflow";
    }
    return "unknown";
}
