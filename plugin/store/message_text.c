/* message_text.c -- see message_text.h. */
#include "store/message_text.h"

#include <string.h>

/* Stored text is mostly string content, so jump from quote to quote with
 * memchr (a byte loop ran at ~8 instructions a byte, and even for short keys
 * a memchr call costs less); a quote is the closing one when an even number
 * of backslashes precedes it. */
const char *msgtext_string_end(const char *p, const char *end)
{
    const char *start = p + 1;
    for (const char *q = start; q < end; q++) {
        q = memchr(q, '"', (size_t)(end - q));
        if (!q)
            return NULL;
        const char *b = q;
        while (b > start && b[-1] == '\\')
            b--;
        if ((q - b) % 2 == 0)
            return q;
    }
    return NULL;
}

/* p at a message's '{': the byte after its '}' when it has the plain shape
 * (message_text.h), else NULL.  Two compares and one memchr over the content. */
static const char *plain_end(const char *p, const char *end)
{
    static const char user[] = "{\"role\":\"user\",\"content\":\"";
    static const char assistant[] = "{\"role\":\"assistant\",\"content\":\"";
    size_t n = (size_t)(end - p);
    const char *open_quote;
    if (n > sizeof user && memcmp(p, user, sizeof user - 1) == 0)
        open_quote = p + sizeof user - 2;
    else if (n > sizeof assistant && memcmp(p, assistant, sizeof assistant - 1) == 0)
        open_quote = p + sizeof assistant - 2;
    else
        return NULL;
    const char *close = msgtext_string_end(open_quote, end);
    return close && close + 1 < end && close[1] == '}' ? close + 2 : NULL;
}

/* p at a message's '{': the byte after its '}' by counting brackets outside
 * strings, or NULL when it does not close (or a ']' does). */
static const char *object_end(const char *p, const char *end)
{
    int depth = 0;
    for (; p < end; p++) {
        switch (*p) {
        case '"':
            if (!(p = msgtext_string_end(p, end)))
                return NULL;
            break;
        case '{':
        case '[':
            depth++;
            break;
        case '}':
        case ']':
            if (--depth == 0) /* the message's own bracket must close it */
                return *p == '}' ? p + 1 : NULL;
            break;
        default:
            break;
        }
    }
    return NULL;
}

int msgtext_next(msgtext_iter *it, msgtext_msg *m)
{
    const char *p = it->p, *end = it->end;
    while (p < end && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    it->p = p;
    if (p == end)
        return 0;
    if (*p != '{')
        return -1;
    const char *next = plain_end(p, end);
    m->plain = next != NULL;
    if (!next && !(next = object_end(p, end)))
        return -1;
    m->json = p;
    m->len = (size_t)(next - p);
    it->p = next;
    return 1;
}

void msgtext_append(pbuf *b, const char *json, size_t len)
{
    pbuf_append(b, json, len);
    pbuf_putc(b, ',');
}
