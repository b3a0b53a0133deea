/* host_log.c -- see host_log.h. */
#include "lib/host_log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/utf8.h"

/* Whole messages, never cut (a debug body may be megabytes), always valid UTF-8. */
void host_log(const parley_host *host, parley_log_level level, const char *fmt, ...)
{
    if (!host->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = pstr_vprintf(fmt, ap);
    va_end(ap);
    if (!msg)
        return; /* out of memory: a log line is not worth failing for */
    size_t n = strlen(msg);
    if (utf8_valid(msg, n)) {
        host->log(host->host_data, level, msg);
    } else {
        pbuf repaired = PBUF_INIT;
        utf8_append_repaired(&repaired, msg, n);
        if (!repaired.oom)
            host->log(host->host_data, level, repaired.data);
        pbuf_free(&repaired);
    }
    free(msg);
}
