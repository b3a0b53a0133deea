/* test_buf.c -- pbuf_json_string against a trivially correct reference
 * (one byte at a time) and against jansson reading it back; utf8_valid, which
 * skips ASCII 8 bytes at a time too, against the byte-at-a-time walk; utf8_mend. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/utf8.h"
#include "check.h"

static void reference(pbuf *b, const unsigned char *s, size_t n)
{
    pbuf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"')
            pbuf_puts(b, "\\\"");
        else if (c == '\\')
            pbuf_puts(b, "\\\\");
        else if (c == '\n')
            pbuf_puts(b, "\\n");
        else if (c == '\r')
            pbuf_puts(b, "\\r");
        else if (c == '\t')
            pbuf_puts(b, "\\t");
        else if (c == '\b')
            pbuf_puts(b, "\\b");
        else if (c == '\f')
            pbuf_puts(b, "\\f");
        else if (c < 0x20)
            pbuf_printf(b, "\\u%04x", c);
        else
            pbuf_putc(b, (char)c);
    }
    pbuf_putc(b, '"');
}

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static unsigned next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng >> 32);
}

static void check_one(const unsigned char *s, size_t n, const char *prefix)
{
    pbuf got = PBUF_INIT, want = PBUF_INIT;
    pbuf_puts(&got, prefix); /* appends after what is there */
    pbuf_puts(&want, prefix);
    pbuf_json_string(&got, (const char *)s, n);
    reference(&want, s, n);
    int same = got.len == want.len && memcmp(got.data, want.data, got.len) == 0;
    CHECK(same);
    CHECK(got.data[got.len] == '\0');
    static int shown;
    if (!same && shown++ < 3)
        fprintf(stderr, "  %zu bytes: got %s\n  want %s\n", n, got.data, want.data);
    /* Valid UTF-8 in, the same string back out of a JSON reader. */
    int ascii = 1;
    for (size_t i = 0; i < n; i++)
        ascii &= s[i] != 0 && s[i] < 0x80;
    if (ascii) {
        json_t *back = json_loadb(got.data + strlen(prefix), got.len - strlen(prefix),
                                  JSON_DECODE_ANY, NULL);
        CHECK(back && json_string_length(back) == n && memcmp(json_string_value(back), s, n) == 0);
        json_decref(back);
    }
    pbuf_free(&got);
    pbuf_free(&want);
}

static int utf8_valid_reference(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq_len(s + i, n - i);
        if (len == 0)
            return 0;
        i += len;
    }
    return 1;
}

/* Mostly ASCII with a bad or multi-byte sequence (or a NUL) somewhere: the
 * word loop must stop for it wherever it falls in or across a word. */
static void check_utf8_valid(void)
{
    static const char *const odd[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xc3",
                                      "\xe2\x82", "\xff", "\x80", "\xed\xa0\x80", ""};
    char s[64];
    for (int round = 0; round < 20000; round++) {
        size_t n = next() % 40, at = n ? next() % (n + 1) : 0;
        for (size_t i = 0; i < n; i++)
            s[i] = (char)('a' + next() % 26);
        const char *ins = odd[next() % (sizeof odd / sizeof odd[0])];
        size_t k = strlen(ins);
        int nul = next() % 8 == 0;
        if (nul)
            k = 1, ins = "";
        memmove(s + at + k, s + at, n - at);
        memcpy(s + at, nul ? "\0" : ins, k);
        CHECK(utf8_valid(s, n + k) == utf8_valid_reference(s, n + k));
        CHECK(utf8_valid(s, at) == 1);
    }
}

/* A buffer that was only reserved is the empty string when taken (utf8_quotable of ""). */
static void check_reserved_is_empty(void)
{
    pbuf b = PBUF_INIT;
    CHECK(pbuf_reserve(&b, 40) == 0);
    char *p = pbuf_take(&b);
    CHECK(p && p[0] == '\0');
    free(p);
    char *q = utf8_quotable("", 0, 64);
    CHECK(q && strcmp(q, "") == 0);
    free(q);
}

/* utf8_mend: valid text kept, each byte that starts no character made '?', in place. */
static void check_utf8_mend(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {{"", ""},
                 {"caf\xc3\xa9 \x01", "caf\xc3\xa9 \x01"},
                 {"invalid escape near '\"\\\xc3'", "invalid escape near '\"\\?'"},
                 {"\xf2\xa4\xa3.", "???."},
                 {"\xff\xc0\xaf\xed\xa0\x80x", "??????x"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "%s", cases[i].in);
        CHECK(utf8_mend(text) == text);
        CHECK_STR(text, cases[i].out);
    }
    for (int round = 0; round < 2000; round++) {
        char text[40];
        size_t n = next() % sizeof text;
        for (size_t k = 0; k < n; k++)
            text[k] = (char)(1 + next() % 255);
        text[n] = '\0';
        utf8_mend(text);
        CHECK(strlen(text) == n && utf8_valid(text, n));
    }
}

int main(void)
{
    check_reserved_is_empty();
    check_utf8_mend();
    check_utf8_valid();
    const char *fixed[] = {"", "plain", "\"", "\\", "a\"b\\c", "\n\r\t\b\f\v", "\x01\x1f ",
                           "ends with escape\n", "\x7f del is not escaped", "caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        check_one((const unsigned char *)fixed[i], strlen(fixed[i]), "");
        check_one((const unsigned char *)fixed[i], strlen(fixed[i]), "{\"k\":");
    }
    unsigned char nul[] = {'a', 0, 'b'};
    check_one(nul, sizeof nul, "");
    /* Random strings: mostly plain, some dense with characters to escape. */
    unsigned char s[600];
    for (int round = 0; round < 20000; round++) {
        size_t n = next() % sizeof s;
        unsigned density = next() % 4; /* 0: none escaped ... 3: any byte */
        for (size_t i = 0; i < n; i++) {
            unsigned r = next();
            if (density == 0)
                s[i] = (unsigned char)(0x20 + r % 95) == '"' ? 'q' : (unsigned char)(0x20 + r % 95);
            else if (density == 3 || r % 8 == 0)
                s[i] = (unsigned char)(r >> 8);
            else
                s[i] = (unsigned char)('a' + r % 26);
        }
        if (density == 0)
            for (size_t i = 0; i < n; i++)
                if (s[i] == '\\')
                    s[i] = 'b';
        check_one(s, n, round % 2 ? "x" : "");
    }
    return check_report();
}
