/*
 * sse.h -- an incremental Server-Sent-Events parser: the WHATWG "event
 * stream" grammar, reduced to what LLM streams need.  Feed it bytes split
 * anywhere; it calls back once per event with the event's data lines joined
 * by "\n".
 *
 * Lines end with CRLF, LF or a lone CR.  Lines starting with ':' are
 * comments; fields other than "data" ("event", "id", "retry", unknown ones)
 * are ignored; "data:" loses one space after the colon; a blank line ends
 * the event.  An event without any data field is not dispatched.  One
 * exception: an "error" field (llama.cpp's servers before October 2025 send a
 * streamed request's error as "error: {...}" after HTTP 200) makes its event's
 * data {"error": VALUE}, the error body the decoders know.
 */
#ifndef PARLEY_SSE_H
#define PARLEY_SSE_H

#include <stddef.h>

#include "lib/buf.h"

/* Returns 0 to go on, > 0 to stop parsing (that value is returned by
   sse_feed), or -1 with *err set. */
typedef int (*sse_event_fn)(void *ud, const char *data, size_t len, char **err);

typedef struct sse_parser {
    pbuf line;       /* the current line, while its end has not arrived */
    pbuf data;       /* the current event's data lines, joined with "\n" */
    int has_data;    /* a data field was seen since the last dispatch */
    int after_cr;    /* the last byte was a CR: an LF right after it ends nothing */
    size_t max_size; /* bound on one line and on one event's data */
    sse_event_fn on_event;
    void *ud;
} sse_parser;

void sse_init(sse_parser *p, size_t max_size, sse_event_fn on_event, void *ud);

/* Returns 0, the callback's positive stop value, or -1 with *err set. */
int sse_feed(sse_parser *p, const char *bytes, size_t len, char **err);

/* At end of input: 1 when an unterminated, non-empty line is pending. */
int sse_has_partial_line(const sse_parser *p);

/* At end of input: dispatch an event whose lines all ended but whose closing
   blank line never came.  Same return values as sse_feed. */
int sse_flush(sse_parser *p, char **err);

void sse_free(sse_parser *p);

#endif
