/*
 * json_word.h -- 8 bytes of a JSON string tested at once (SWAR: "SIMD
 * within a register"), for the loops that copy, escape or check long runs of
 * plain text: buf.c's pbuf_json_string and json_scan.c's string reader.
 *
 * (x - 0x01..) & ~x & 0x80.. is non-zero if and only if some byte of x is 0;
 * with 0x20.. instead of 0x01.., if and only if some byte is below 0x20.  A
 * byte above 0x7F never sets its own high bit there (~x clears it), so these
 * are exact yes/no answers for any bytes.
 */
#ifndef PARLEY_JSON_WORD_H
#define PARLEY_JSON_WORD_H

#include <stdint.h>
#include <string.h>

#define JSON_WORD_ONES UINT64_C(0x0101010101010101)
#define JSON_WORD_HIGHS UINT64_C(0x8080808080808080)

static inline uint64_t json_word_load(const char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* Non-zero when some byte of w is '"', '\\' or below 0x20: a byte a JSON
 * string must escape (bytes above 0x7F need no escaping). */
static inline uint64_t json_word_special(uint64_t w)
{
    uint64_t quote = w ^ (JSON_WORD_ONES * '"'), backslash = w ^ (JSON_WORD_ONES * '\\');
    return (((w - JSON_WORD_ONES * 0x20) & ~w) | ((quote - JSON_WORD_ONES) & ~quote) |
            ((backslash - JSON_WORD_ONES) & ~backslash)) &
           JSON_WORD_HIGHS;
}

/* Non-zero when some byte of w is special (above) or above 0x7F. */
static inline uint64_t json_word_not_ascii_plain(uint64_t w)
{
    return json_word_special(w) | (w & JSON_WORD_HIGHS);
}

#endif
