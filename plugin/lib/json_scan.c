/*
 * json_scan.c -- see json_scan.h.
 *
 * Where jansson (src/load.c) draws a line, the scanner bails on the same
 * side or earlier: the same four whitespace bytes; strings of valid UTF-8
 * (no overlongs, surrogates or code points above U+10FFFF), no raw control
 * bytes, the eight escapes and \uXXXX with surrogates only in pairs;
 * numbers of the JSON grammar (no leading zeros); lowercase literals; no
 * trailing commas; nothing after the root value but whitespace.
 */
#include "lib/json_scan.h"
#include "lib/json_word.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"

#define MAX_INTEGER_DIGITS 18  /* always inside long long: strtoll cannot overflow */
#define MAX_REAL_LENGTH 64     /* a real's text, in bytes */
#define MAX_REAL_MAGNITUDE 300 /* decimal digits before the point, exponent included */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static void skip_ws(jscan *s)
{
    while (s->p < s->end && is_ws(*s->p))
        s->p++;
}

void jscan_init(jscan *s, const char *buf, size_t len)
{
    s->p = buf;
    s->end = buf + len;
    s->depth = 0;
    s->fresh = 0;
}

jscan_type jscan_peek(jscan *s)
{
    skip_ws(s);
    if (s->p >= s->end)
        return JSCAN_BAIL;
    switch (*s->p) {
    case '{': return JSCAN_OBJECT;
    case '[': return JSCAN_ARRAY;
    case '"': return JSCAN_STRING;
    case 't': return JSCAN_TRUE;
    case 'f': return JSCAN_FALSE;
    case 'n': return JSCAN_NULL;
    default: return *s->p == '-' || is_digit(*s->p) ? JSCAN_NUMBER : JSCAN_BAIL;
    }
}

static int open_container(jscan *s, char c)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != c || s->depth >= JSCAN_MAX_DEPTH)
        return -1;
    s->p++;
    s->depth++;
    s->fresh = 1;
    return 0;
}

int jscan_object_open(jscan *s) { return open_container(s, '{'); }
int jscan_array_open(jscan *s) { return open_container(s, '['); }

/* Before an item: ',' unless the container was just opened; or its closing
   byte.  1 when an item follows, 0 when closed, -1 bail. */
static int next_item(jscan *s, char close)
{
    skip_ws(s);
    if (s->p >= s->end)
        return -1;
    int fresh = s->fresh;
    s->fresh = 0;
    if (*s->p == close) {
        s->p++;
        s->depth--;
        return 0;
    }
    if (fresh)
        return 1;
    if (*s->p != ',')
        return -1;
    s->p++;
    return 1;
}

int jscan_object_next(jscan *s, jscan_str *key)
{
    int rc = next_item(s, '}');
    if (rc != 1)
        return rc;
    if (jscan_string(s, key) != 0)
        return -1;
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':')
        return -1;
    s->p++;
    return 1;
}

int jscan_array_next(jscan *s) { return next_item(s, ']'); }

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

/* The code point of the \u escape at p (p[0] == '\\', p[1] == 'u'), a
   surrogate pair read whole; *used = its length in bytes.  -1 for what
   jansson refuses (bad hex, a lone surrogate) and for U+0000. */
static long escaped_code_point(const char *p, const char *end, size_t *used)
{
    if (end - p < 6)
        return -1;
    int hi = hex4(p + 2);
    if (hi <= 0 || (hi >= 0xDC00 && hi <= 0xDFFF))
        return -1;
    *used = 6;
    if (hi < 0xD800 || hi > 0xDBFF)
        return hi;
    if (end - p < 12 || p[6] != '\\' || p[7] != 'u')
        return -1;
    int lo = hex4(p + 8);
    if (lo < 0xDC00 || lo > 0xDFFF)
        return -1;
    *used = 12;
    return 0x10000 + (((long)hi - 0xD800) << 10) + (lo - 0xDC00);
}

static size_t utf8_length(long cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static size_t utf8_put(char *dst, long cp)
{
    unsigned char *d = (unsigned char *)dst;
    size_t n = utf8_length(cp);
    switch (n) {
    case 1: d[0] = (unsigned char)cp; break;
    case 2:
        d[0] = (unsigned char)(0xC0 | (cp >> 6));
        d[1] = (unsigned char)(0x80 | (cp & 0x3F));
        break;
    case 3:
        d[0] = (unsigned char)(0xE0 | (cp >> 12));
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (unsigned char)(0x80 | (cp & 0x3F));
        break;
    default:
        d[0] = (unsigned char)(0xF0 | (cp >> 18));
        d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[3] = (unsigned char)(0x80 | (cp & 0x3F));
        break;
    }
    return n;
}

/* The byte a one-letter escape stands for, or 0. */
static char simple_escape(char c)
{
    switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return 0;
    }
}

int jscan_string(jscan *s, jscan_str *out)
{
    skip_ws(s);
    const char *p = s->p, *end = s->end;
    if (p >= end || *p != '"')
        return -1;
    p++;
    out->raw = p;
    out->escaped = 0;
    size_t len = 0;
    for (;;) {
        const char *run = p; /* plain ASCII, the common case: 8 bytes at a time */
        while (end - p >= 8 && !json_word_not_ascii_plain(json_word_load(p)))
            p += 8;
        while (p < end && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x80 && *p != '"' &&
               *p != '\\')
            p++;
        len += (size_t)(p - run);
        if (p >= end)
            return -1;
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            break;
        if (c < 0x20)
            return -1; /* a raw control byte: jansson refuses it */
        if (c >= 0x80) {
            size_t n = utf8_seq_len(p, (size_t)(end - p));
            if (n == 0)
                return -1;
            p += n;
            len += n;
            continue;
        }
        /* a backslash */
        out->escaped = 1;
        if (end - p < 2)
            return -1;
        if (p[1] == 'u') {
            size_t used = 0;
            long cp = escaped_code_point(p, end, &used);
            if (cp < 0)
                return -1;
            p += used;
            len += utf8_length(cp);
        } else if (simple_escape(p[1])) {
            p += 2;
            len++;
        } else {
            return -1;
        }
    }
    out->raw_len = (size_t)(p - out->raw);
    out->len = len;
    s->p = p + 1;
    return 0;
}

int jscan_number(jscan *s, jscan_num *out)
{
    skip_ws(s);
    const char *p = s->p, *end = s->end;
    int negative = p < end && *p == '-';
    if (negative)
        p++;
    const char *digits = p;
    if (p < end && *p == '0') {
        p++;
        if (p < end && is_digit(*p))
            return -1; /* a leading zero */
    } else {
        while (p < end && is_digit(*p))
            p++;
    }
    size_t ndigits = (size_t)(p - digits);
    if (ndigits == 0)
        return -1;
    int is_integer = 1;
    long exponent = 0;
    if (p < end && *p == '.') {
        is_integer = 0;
        const char *frac = ++p;
        while (p < end && is_digit(*p))
            p++;
        if (p == frac)
            return -1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_integer = 0;
        p++;
        int exp_negative = p < end && *p == '-';
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const char *exp = p;
        while (p < end && is_digit(*p)) {
            if (exponent < 100000)
                exponent = exponent * 10 + (*p - '0');
            p++;
        }
        if (p == exp)
            return -1;
        if (exp_negative)
            exponent = -exponent;
    }
    out->is_integer = is_integer;
    out->integer = 0;
    if (is_integer) {
        if (ndigits > MAX_INTEGER_DIGITS)
            return -1; /* jansson may refuse it ("too big integer"): let it say so */
        long long v = 0;
        for (const char *d = digits; d < p; d++)
            v = v * 10 + (*d - '0');
        out->integer = negative ? -v : v;
    } else {
        /* jansson refuses a real that overflows a double; underflow is fine.
           |x| < 10^(ndigits + exponent) (ndigits counts a lone leading 0). */
        if ((size_t)(p - s->p) > MAX_REAL_LENGTH || (long)ndigits + exponent > MAX_REAL_MAGNITUDE)
            return -1;
    }
    s->p = p;
    return 0;
}

static int literal(jscan *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return -1;
    s->p += n;
    /* jansson reads a whole run of letters as one word ("nullx" is no null) */
    if (s->p < s->end && ((*s->p >= 'a' && *s->p <= 'z') || (*s->p >= 'A' && *s->p <= 'Z')))
        return -1;
    return 0;
}

int jscan_skip(jscan *s)
{
    jscan_str str;
    jscan_num num;
    int rc;
    switch (jscan_peek(s)) {
    case JSCAN_OBJECT:
        if (jscan_object_open(s) != 0)
            return -1;
        while ((rc = jscan_object_next(s, &str)) == 1)
            if (jscan_skip(s) != 0)
                return -1;
        return rc;
    case JSCAN_ARRAY:
        if (jscan_array_open(s) != 0)
            return -1;
        while ((rc = jscan_array_next(s)) == 1)
            if (jscan_skip(s) != 0)
                return -1;
        return rc;
    case JSCAN_STRING: return jscan_string(s, &str);
    case JSCAN_NUMBER: return jscan_number(s, &num);
    case JSCAN_TRUE: return literal(s, "true", 4);
    case JSCAN_FALSE: return literal(s, "false", 5);
    case JSCAN_NULL: return literal(s, "null", 4);
    case JSCAN_BAIL: break;
    }
    return -1;
}

int jscan_end(jscan *s)
{
    skip_ws(s);
    return s->p == s->end && s->depth == 0 ? 0 : -1;
}

void jscan_str_decode(const jscan_str *str, char *dst)
{
    const char *p = str->raw, *end = str->raw + str->raw_len;
    if (!str->escaped) {
        memcpy(dst, p, str->raw_len);
        return;
    }
    while (p < end) {
        const char *bs = memchr(p, '\\', (size_t)(end - p));
        size_t run = (size_t)((bs ? bs : end) - p);
        memcpy(dst, p, run);
        dst += run;
        p += run;
        if (!bs)
            break;
        if (p[1] == 'u') {
            size_t used = 0;
            long cp = escaped_code_point(p, end, &used); /* checked by jscan_string */
            dst += utf8_put(dst, cp);
            p += used;
        } else {
            *dst++ = simple_escape(p[1]);
            p += 2;
        }
    }
}

char *jscan_str_dup(const jscan_str *str)
{
    char *text = malloc(str->len + 1);
    if (!text)
        return NULL;
    jscan_str_decode(str, text);
    text[str->len] = '\0';
    return text;
}

void jscan_str_append(pbuf *b, const jscan_str *str)
{
    if (pbuf_reserve(b, str->len) != 0)
        return;
    jscan_str_decode(str, b->data + b->len);
    b->len += str->len;
    b->data[b->len] = '\0';
}
