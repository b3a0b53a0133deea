/*
 * message_text.h -- the stored message text: a conversation's messages, or a
 * turn's, as their JSON objects joined by ',' ("m,m," as a store's load()
 * returns it, with one trailing ','; "m,m" as a turn records it).  Every
 * layer that reads such text (the codecs rendering a request, the context
 * window splitting history into turns, the turn) walks it with msgtext_next,
 * so what separates two messages and where one ends is decided here only.
 *
 * The text is what Parley wrote (each message one JSON object), but a store
 * can be changed behind its back: the walker stops with -1 at anything that
 * does not start as an object or does not close; it does not check the JSON
 * inside a message (a reader that parses it does; store_json_object_list
 * checks a whole text).
 */
#ifndef PARLEY_STORE_MESSAGE_TEXT_H
#define PARLEY_STORE_MESSAGE_TEXT_H

#include <stddef.h>

#include "lib/buf.h"

typedef struct msgtext_iter {
    const char *p, *end;
} msgtext_iter;

/* One message of the text. */
typedef struct msgtext_msg {
    const char *json; /* its '{' */
    size_t len;       /* up to and with its '}' */
    int plain;        /* exactly {"role":"user"|"assistant","content":"..."}: the shape
                         Parley records for a text turn's messages */
} msgtext_msg;

static inline void msgtext_begin(msgtext_iter *it, const char *text, size_t len)
{
    it->p = text;
    it->end = text ? text + len : text; /* (NULL + 0 is undefined) */
}

/* The next message into *m: 1; 0 at the end of the text; -1 when the text is
   damaged there (not an object, or one that does not close). */
int msgtext_next(msgtext_iter *it, msgtext_msg *m);

/* p at a string's opening quote in stored text: its closing quote, or NULL
   when it does not close before end (for scanners of a message's inside). */
const char *msgtext_string_end(const char *p, const char *end);

/* Append one message and its ',' to `b` (load()'s form). */
void msgtext_append(pbuf *b, const char *json, size_t len);

#endif
