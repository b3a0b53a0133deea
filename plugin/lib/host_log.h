/* host_log.h -- a log line through the host's callback (any thread; a no-op without one). */
#ifndef PARLEY_HOST_LOG_H
#define PARLEY_HOST_LOG_H

#include <parley/plugin.h>

void host_log(const parley_host *host, parley_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
