/*
 * json_scan.h -- a strict, allocation-free JSON reader: a cursor over a
 * buffer that hands out one value at a time, for fast paths in front of
 * jansson.
 *
 * The contract is one-sided: the scanner accepts only text that jansson's
 * json_loadb (default flags) accepts too, and reads every string and
 * integer exactly as jansson does.  Whatever it is not sure of -- malformed
 * JSON, and also valid JSON it chooses not to handle (\u0000, nesting deeper
 * than JSCAN_MAX_DEPTH, integers of more than 18 digits, reals that could
 * overflow a double) -- makes a call return -1 ("bail").  It gives no
 * error messages: after a bail the caller hands the whole text to jansson,
 * which stays the authority and the author of every message.
 *
 * Usage: read a value's type with jscan_peek, then consume it whole with
 * the matching call (jscan_string, jscan_number, jscan_object_open then
 * jscan_object_next until it returns 0, ...) or with jscan_skip, which still
 * validates it.  Finish with jscan_end.  Every call skips the whitespace
 * before what it reads.
 */
#ifndef PARLEY_JSON_SCAN_H
#define PARLEY_JSON_SCAN_H

#include <stddef.h>
#include <string.h>

#include "lib/buf.h"

#define JSCAN_MAX_DEPTH 64 /* objects and arrays open at once */

typedef enum jscan_type {
    JSCAN_BAIL = 0, /* no value starts here */
    JSCAN_OBJECT,
    JSCAN_ARRAY,
    JSCAN_STRING,
    JSCAN_NUMBER,
    JSCAN_TRUE,
    JSCAN_FALSE,
    JSCAN_NULL,
} jscan_type;

typedef struct jscan {
    const char *p, *end;
    unsigned depth; /* containers open */
    int fresh;      /* a container was just opened: no ',' before its first item */
} jscan;

/* A string value or key as found in the buffer (valid UTF-8, escapes checked). */
typedef struct jscan_str {
    const char *raw; /* between the quotes, escapes as sent */
    size_t raw_len;
    size_t len;      /* bytes once unescaped (never more than raw_len) */
    int escaped;     /* raw holds backslash escapes; else raw is the text itself */
} jscan_str;

typedef struct jscan_num {
    int is_integer;     /* no fraction and no exponent: jansson makes it a json_integer */
    long long integer;  /* its value (0 for reals) */
} jscan_num;

void jscan_init(jscan *s, const char *buf, size_t len);

/* Skip whitespace; the type of the value that starts there (not consumed). */
jscan_type jscan_peek(jscan *s);

/* Consume '{' / '['.  0, or -1 (not one, or too deep). */
int jscan_object_open(jscan *s);
int jscan_array_open(jscan *s);

/* The next member of the innermost open object: 1 with *key set and the ':'
   consumed (consume the value next), 0 when the '}' was consumed, -1 bail. */
int jscan_object_next(jscan *s, jscan_str *key);

/* The next element of the innermost open array: 1 when one follows (consume
   it next), 0 when the ']' was consumed, -1 bail. */
int jscan_array_next(jscan *s);

int jscan_string(jscan *s, jscan_str *out);
int jscan_number(jscan *s, jscan_num *out);
/* Consume any one value, validating it.  0, or -1. */
int jscan_skip(jscan *s);
/* 0 when nothing but whitespace is left. */
int jscan_end(jscan *s);

/* 1 when the string is exactly `lit` (a string without escapes only). */
static inline int jscan_str_is(const jscan_str *str, const char *lit, size_t lit_len)
{
    return !str->escaped && str->raw_len == lit_len && (lit_len == 0 || str->raw[0] == lit[0]) &&
           memcmp(str->raw, lit, lit_len) == 0;
}
#define JSCAN_STR_IS(str, lit) jscan_str_is((str), (lit), sizeof(lit) - 1)

/* Write the unescaped text, str->len bytes, to dst (no NUL added). */
void jscan_str_decode(const jscan_str *str, char *dst);
/* The unescaped text, malloc'd and NUL-terminated; NULL when out of memory. */
char *jscan_str_dup(const jscan_str *str);
/* Append the unescaped text to b (sticky oom, as pbuf_append). */
void jscan_str_append(pbuf *b, const jscan_str *str);

#endif
