/* utf8.c -- see utf8.h. */
#include "lib/utf8.h"

#include <stdint.h>
#include <string.h>

#include "lib/json_word.h"

size_t utf8_seq_len(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned char c = s[0];
    if (c == 0)
        return 0;
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        /* ASCII without NUL, the common case: 8 bytes at a time */
        while (n - i >= 8) {
            uint64_t w = json_word_load(s + i);
            if ((w | ((w - JSON_WORD_ONES) & ~w)) & JSON_WORD_HIGHS)
                break; /* a byte above 0x7F, or a 0 */
            i += 8;
        }
        if (i == n)
            break;
        size_t len = utf8_seq_len(s + i, n - i);
        if (len == 0)
            return 0;
        i += len;
    }
    return 1;
}

char *utf8_quotable(const char *s, size_t n, size_t max)
{
    pbuf b = PBUF_INIT;
    pbuf_reserve(&b, (n < max ? n : max) + 4);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq_len(s + i, n - i);
        unsigned char c = (unsigned char)s[i];
        if (i + (len ? len : 1) > max) {
            pbuf_puts(&b, "...");
            break;
        }
        if (len == 0 || c < 0x20 || c == 0x7F) {
            pbuf_printf(&b, "\\x%02X", c);
            i++;
        } else {
            pbuf_append(&b, s + i, len);
            i += len;
        }
    }
    return pbuf_take(&b);
}

char *utf8_mend(char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq_len(s + i, n - i);
        if (len == 0)
            s[i++] = '?';
        else
            i += len;
    }
    return s;
}

void utf8_append_repaired(pbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq_len(s + i, n - i);
        if (len == 0) {
            pbuf_puts(b, "\xEF\xBF\xBD"); /* U+FFFD for each byte that starts nothing valid */
            i++;
        } else {
            pbuf_append(b, s + i, len);
            i += len;
        }
    }
}
