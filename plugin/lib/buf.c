/* buf.c -- see buf.h. */
#include "lib/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json_word.h"

int pbuf_reserve(pbuf *b, size_t extra)
{
    if (b->oom)
        return -1;
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0'; /* a buffer only reserved is still an empty string */
    return 0;
}

void pbuf_append(pbuf *b, const void *p, size_t n)
{
    if (pbuf_reserve(b, n) != 0)
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void pbuf_puts(pbuf *b, const char *s) { pbuf_append(b, s, strlen(s)); }

void pbuf_putc(pbuf *b, char c) { pbuf_append(b, &c, 1); }

void pbuf_printf(pbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        pbuf_append(b, small, (size_t)n);
        return;
    }
    if (pbuf_reserve(b, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* How many bytes escaping adds to each byte: 1 for \" \\ \n \r \t \b \f,
 * 5 for the other control characters (\u00XX), 0 for everything else. */
static const unsigned char json_escape_extra[256] = {
    5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 5, 1, 1, 5, 5, /* \b \t \n \f \r: 1 */
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
    0, 0, 1, ['\\'] = 1,                              /* '"' and '\\' */
};

/* The index of the first byte at or after i that a JSON string must escape,
 * or n: plain text is skipped 8 bytes at a time. */
static size_t plain_run_end(const char *s, size_t i, size_t n)
{
    while (n - i >= 8 && !json_word_special(json_word_load(s + i)))
        i += 8;
    while (i < n && !json_escape_extra[(unsigned char)s[i]])
        i++;
    return i;
}

void pbuf_json_string(pbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Measure first, then reserve exactly: a worst-case reservation (6 bytes
     * a byte) grew request bodies, which stay allocated while in flight. */
    size_t extra = 0;
    for (size_t i = plain_run_end(s, 0, n); i < n; i = plain_run_end(s, i + 1, n))
        extra += json_escape_extra[(unsigned char)s[i]];
    if (pbuf_reserve(b, n + extra + 2) != 0)
        return;
    char *o = b->data + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        size_t run = extra ? plain_run_end(s, i, n) : n; /* nothing to escape: one copy */
        memcpy(o, s + i, run - i);
        o += run - i;
        if (run == n)
            break;
        unsigned char c = (unsigned char)s[run];
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            *o++ = 'u'; *o++ = '0'; *o++ = '0';
            *o++ = hex[c >> 4]; *o++ = hex[c & 15];
        }
        i = run + 1;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
}

void pbuf_reset(pbuf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void pbuf_fit(pbuf *b)
{
    if (!b->data || b->oom || b->len + 1 >= b->cap)
        return;
    char *p = realloc(b->data, b->len + 1);
    if (p) {
        b->data = p;
        b->cap = b->len + 1;
    }
}

char *pbuf_take(pbuf *b)
{
    if (b->oom) {
        pbuf_free(b);
        return NULL;
    }
    char *p = b->data ? b->data : strdup("");
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void pbuf_free(pbuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

char *pstr_vprintf(const char *fmt, va_list ap)
{
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    return s;
}

char *pstr_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = pstr_vprintf(fmt, ap);
    va_end(ap);
    return s;
}
