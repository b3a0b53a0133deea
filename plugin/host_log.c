/* host_log.c -- see host_log.h. */
#include "host_log.h"

#include <stdarg.h>
#include <stdio.h>

void host_log(const parley_host *host, parley_log_level level, const char *fmt, ...)
{
    if (!host->log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->log(host->host_data, level, msg);
}
