/*
 * buf.h -- a growable byte buffer (in the spirit of redis' sds, but a plain
 * struct): the plugin builds request bodies and JSON text with it.
 *
 * The data is always NUL-terminated so it can be handed out as a C string.
 * Allocation failure is sticky: after it, `oom` is set, appends are no-ops,
 * and the owner checks `oom` once at the end instead of after every append.
 */
#ifndef PARLEY_BUF_H
#define PARLEY_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct pbuf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len;
    size_t cap;
    int oom;    /* set when an allocation failed */
} pbuf;

#define PBUF_INIT {NULL, 0, 0, 0}

void pbuf_append(pbuf *b, const void *p, size_t n);
void pbuf_puts(pbuf *b, const char *s);
void pbuf_putc(pbuf *b, char c);
void pbuf_printf(pbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append `s` (n bytes of UTF-8) as a quoted, escaped JSON string. */
void pbuf_json_string(pbuf *b, const char *s, size_t n);
/* Make room for `extra` more bytes; returns 0, or -1 (and sets oom). */
int pbuf_reserve(pbuf *b, size_t extra);
void pbuf_reset(pbuf *b);  /* len = 0, keep the memory */
/* Give back the room past the data (the contents stay; a failure keeps the room). */
void pbuf_fit(pbuf *b);
/* Hand the data to the caller (never NULL unless oom; "" when empty); the buffer is reset. */
char *pbuf_take(pbuf *b);
void pbuf_free(pbuf *b);

/* A malloc'd formatted string (for error messages), or NULL on OOM. */
char *pstr_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *pstr_vprintf(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

#endif
