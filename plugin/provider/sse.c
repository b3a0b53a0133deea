/* sse.c -- see sse.h. */
#include "provider/sse.h"

#include <stdlib.h>
#include <string.h>

static int fail(char **err, const char *msg)
{
    if (err)
        *err = strdup(msg);
    return -1;
}

void sse_init(sse_parser *p, size_t max_size, sse_event_fn on_event, void *ud)
{
    memset(p, 0, sizeof *p);
    p->max_size = max_size;
    p->on_event = on_event;
    p->ud = ud;
}

void sse_free(sse_parser *p)
{
    pbuf_free(&p->line);
    pbuf_free(&p->data);
}

int sse_has_partial_line(const sse_parser *p) { return p->line.len > 0; }

static int dispatch(sse_parser *p, char **err)
{
    if (!p->has_data)
        return 0;
    int rc = p->on_event(p->ud, p->data.data ? p->data.data : "", p->data.len, err);
    pbuf_reset(&p->data);
    p->has_data = 0;
    return rc;
}

static int is_field(const char *name, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(name, want, n) == 0;
}

static int add_data(sse_parser *p, const char *value, size_t n, char **err)
{
    size_t sep = p->has_data ? 1 : 0;
    if (p->data.len + sep + n > p->max_size)
        return fail(err, "stream event larger than the limit (8 MiB)");
    if (sep)
        pbuf_putc(&p->data, '\n');
    pbuf_append(&p->data, value, n);
    p->has_data = 1;
    return p->data.oom ? fail(err, "out of memory") : 0;
}

/* An "error" field's value, as the data {"error": VALUE} of its own event. */
static int add_error(sse_parser *p, const char *value, size_t n, char **err)
{
    pbuf_reset(&p->data);
    p->has_data = 0;
    static const char open[] = "{\"error\":";
    int rc = add_data(p, open, sizeof open - 1, err);
    if (rc == 0 && p->data.len + n + 1 > p->max_size)
        rc = fail(err, "stream event larger than the limit (8 MiB)");
    if (rc == 0) {
        pbuf_append(&p->data, value, n);
        pbuf_putc(&p->data, '}');
        rc = p->data.oom ? fail(err, "out of memory") : 0;
    }
    return rc;
}

/* One complete line, without its line end. */
static int process_line(sse_parser *p, const char *s, size_t n, char **err)
{
    if (n == 0)
        return dispatch(p, err);
    if (s[0] == ':')
        return 0; /* a comment, e.g. a keep-alive */
    const char *colon = memchr(s, ':', n);
    size_t name_len = colon ? (size_t)(colon - s) : n;
    int error_field = is_field(s, name_len, "error");
    if (!is_field(s, name_len, "data") && !error_field)
        return 0; /* event, id, retry and unknown fields mean nothing to us */
    const char *value = colon ? colon + 1 : s + n;
    size_t value_len = n - (size_t)(value - s);
    if (value_len > 0 && value[0] == ' ') {
        value++;
        value_len--;
    }
    if (error_field) /* llama.cpp before Oct 2025 (server_sent_event(sink, "error", ...)):
                        a streamed request's error as "error: {...}" -- the data
                        {"error": {...}} every decoder already takes for an error */
        return add_error(p, value, value_len, err);
    return add_data(p, value, value_len, err);
}

/* The line that ends at `s + n`: the buffered start (if any) plus s[0..n). */
static int end_line(sse_parser *p, const char *s, size_t n, char **err)
{
    if (p->line.len + n > p->max_size)
        return fail(err, "stream line larger than the limit (8 MiB)");
    if (p->line.len == 0)
        return process_line(p, s, n, err); /* the common case: no copy */
    pbuf_append(&p->line, s, n);
    if (p->line.oom)
        return fail(err, "out of memory");
    int rc = process_line(p, p->line.data, p->line.len, err);
    pbuf_reset(&p->line);
    return rc;
}

static int keep_partial_line(sse_parser *p, const char *s, size_t n, char **err)
{
    if (p->line.len + n > p->max_size)
        return fail(err, "stream line larger than the limit (8 MiB)");
    pbuf_append(&p->line, s, n);
    return p->line.oom ? fail(err, "out of memory") : 0;
}

/* A byte loop rather than two memchr: memchr for a missing '\r' would rescan
   the rest of the input once per line. */
static const char *find_line_end(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n' || s[i] == '\r')
            return s + i;
    return NULL;
}

int sse_feed(sse_parser *p, const char *bytes, size_t len, char **err)
{
    while (len > 0) {
        if (p->after_cr) {
            p->after_cr = 0;
            if (bytes[0] == '\n') { /* the second half of a CRLF */
                bytes++;
                len--;
                continue;
            }
        }
        const char *end = find_line_end(bytes, len);
        if (!end)
            return keep_partial_line(p, bytes, len, err);
        size_t n = (size_t)(end - bytes);
        p->after_cr = *end == '\r';
        int rc = end_line(p, bytes, n, err);
        if (rc != 0)
            return rc;
        bytes += n + 1;
        len -= n + 1;
    }
    return 0;
}

int sse_flush(sse_parser *p, char **err)
{
    return dispatch(p, err);
}
