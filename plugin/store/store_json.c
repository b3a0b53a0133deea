/* store_json.c -- see store_json.h. */
#include "store_json.h"

#include <string.h>
#include <time.h>

void store_json_timestamp(pbuf *b, uint64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    if ((uint64_t)secs != ms / 1000 || !gmtime_r(&secs, &tm)) {
        pbuf_puts(b, "\"1970-01-01T00:00:00.000Z\""); /* beyond what time_t can show */
        return;
    }
    pbuf_printf(b, "\"%04d-%02d-%02dT%02d:%02d:%02d.%03uZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(ms % 1000));
}

static void key(pbuf *b, const char *name)
{
    pbuf_putc(b, '"');
    pbuf_puts(b, name);
    pbuf_puts(b, "\":");
}

static void string_field(pbuf *b, const char *name, const char *value)
{
    key(b, name);
    pbuf_json_string(b, value, strlen(value));
}

static void time_field(pbuf *b, const char *name, uint64_t ms)
{
    key(b, name);
    store_json_timestamp(b, ms);
}

void store_json_turn(pbuf *b, const char *turn_id, uint64_t started_ms, uint64_t finished_ms,
                     const char *messages, size_t messages_len)
{
    pbuf_putc(b, '{');
    string_field(b, "turn_id", turn_id);
    pbuf_putc(b, ',');
    time_field(b, "started_at", started_ms);
    pbuf_putc(b, ',');
    time_field(b, "finished_at", finished_ms);
    pbuf_puts(b, ",\"messages\":[");
    pbuf_append(b, messages, messages_len); /* already valid JSON: verbatim */
    pbuf_puts(b, "]}");
}

void store_json_conversation_head(pbuf *b, const char *conversation_id, uint64_t created_ms,
                                  uint64_t last_used_ms)
{
    pbuf_putc(b, '{');
    string_field(b, "conversation_id", conversation_id);
    pbuf_putc(b, ',');
    time_field(b, "created_at", created_ms);
    pbuf_putc(b, ',');
    time_field(b, "last_used_at", last_used_ms);
}
