/* test_json_scan.c -- the strict JSON cursor (plugin/lib/json_scan.h) on its own. */
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "check.h"
#include "lib/json_scan.h"

/* 0 when `text` is one valid value (skipped whole) and nothing else. */
static int skims(const char *text)
{
    jscan s;
    jscan_init(&s, text, strlen(text));
    return jscan_skip(&s) == 0 && jscan_end(&s) == 0 ? 0 : -1;
}

/* The decoded string value of `text` (malloc'd), or NULL when it bails. */
static char *string_of(const char *text)
{
    jscan s;
    jscan_str str;
    jscan_init(&s, text, strlen(text));
    if (jscan_peek(&s) != JSCAN_STRING || jscan_string(&s, &str) != 0 || jscan_end(&s) != 0)
        return NULL;
    char *copy = jscan_str_dup(&str);
    CHECK(copy && strlen(copy) == str.len);
    return copy;
}

static void expect_string(const char *text, const char *want)
{
    char *got = string_of(text);
    if (want)
        CHECK_STR(got, want);
    else
        CHECK(got == NULL);
    free(got);
}

static void test_walk(void)
{
    const char *text = " {\"a\" : [1, -0, 2.5e1, true, false, null, {}], \"b\\n\":{\"c\":\"d\"} } ";
    jscan s;
    jscan_str key, str;
    jscan_num num;
    jscan_init(&s, text, strlen(text));
    CHECK(jscan_peek(&s) == JSCAN_OBJECT && jscan_object_open(&s) == 0);
    CHECK(jscan_object_next(&s, &key) == 1 && JSCAN_STR_IS(&key, "a"));
    CHECK(jscan_peek(&s) == JSCAN_ARRAY && jscan_array_open(&s) == 0);
    CHECK(jscan_array_next(&s) == 1 && jscan_number(&s, &num) == 0);
    CHECK(num.is_integer && num.integer == 1);
    CHECK(jscan_array_next(&s) == 1 && jscan_number(&s, &num) == 0);
    CHECK(num.is_integer && num.integer == 0);
    CHECK(jscan_array_next(&s) == 1 && jscan_number(&s, &num) == 0 && !num.is_integer);
    for (int i = 0; i < 4; i++)
        CHECK(jscan_array_next(&s) == 1 && jscan_skip(&s) == 0);
    CHECK(jscan_array_next(&s) == 0);
    CHECK(jscan_object_next(&s, &key) == 1 && key.escaped && !JSCAN_STR_IS(&key, "b\n"));
    CHECK(jscan_object_open(&s) == 0 && jscan_object_next(&s, &key) == 1);
    CHECK(jscan_string(&s, &str) == 0 && JSCAN_STR_IS(&str, "d"));
    CHECK(jscan_object_next(&s, &key) == 0);
    CHECK(jscan_object_next(&s, &key) == 0);
    CHECK(jscan_end(&s) == 0);
}

static void test_strings(void)
{
    expect_string("\"plain\"", "plain");
    expect_string("\"\"", "");
    expect_string("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t");
    expect_string("\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\"", "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    expect_string("\"x\xc3\xa9y\xf4\x8f\xbf\xbf\"", "x\xc3\xa9y\xf4\x8f\xbf\xbf");
    expect_string("\"0123456789abcdef0123456789\\\"after an 8-byte run\"",
                  "0123456789abcdef0123456789\"after an 8-byte run");
    /* what jansson refuses, or the scanner will not decide */
    static const char *const bails[] = {
        "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\u12\"", "\"\\x\"",
        "\"a\nb\"", "\"\x01\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
        "\"unterminated", "\"ends in a backslash\\", "'single'"};
    for (size_t i = 0; i < sizeof bails / sizeof *bails; i++)
        expect_string(bails[i], NULL);

    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "say: ");
    jscan s;
    jscan_str str;
    const char *text = "\"caf\\u00e9\"";
    jscan_init(&s, text, strlen(text));
    CHECK(jscan_string(&s, &str) == 0);
    jscan_str_append(&b, &str);
    CHECK_STR(b.data, "say: caf\xc3\xa9");
    CHECK(b.len == strlen("say: caf\xc3\xa9"));
    pbuf_free(&b);
}

static void test_numbers(void)
{
    static const char *const fine[] = {"0", "-0", "7", "-12", "1.5", "1e3", "1E+3", "-2.5e-3",
                                       "999999999999999999", "1e-400", "1e299"};
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++)
        CHECK(skims(fine[i]) == 0);
    static const char *const bails[] = {
        "01", "-", "1.", ".5", "+1", "1e", "1e+", "0x1", "1.5.3", "--1", "NaN", "Infinity",
        "9223372036854775807", "1000000000000000000", /* 19 digits: left to jansson */
        "1e309", "1e300" /* a fine double, but past the scanner's bound */};
    for (size_t i = 0; i < sizeof bails / sizeof *bails; i++)
        CHECK(skims(bails[i]) == -1);
    jscan s;
    jscan_num num;
    jscan_init(&s, "-999999999999999999", 19);
    CHECK(jscan_number(&s, &num) == 0 && num.is_integer && num.integer == -999999999999999999LL);
}

static void test_structure(void)
{
    static const char *const fine[] = {"{}", "[]", " [ 1 , [ ] , { \"a\" : null } ] ", "true",
                                       "null", "{\"a\":1,\"a\":2}"};
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++)
        CHECK(skims(fine[i]) == 0);
    static const char *const bails[] = {
        "", " ", "{", "[1,]", "{\"a\":1,}", "[,1]", "{,}", "{\"a\" 1}", "{\"a\"::1}", "{a:1}",
        "[1 2]", "nul", "nullx", "True", "[true1]", "{} x", "{}{}", "\xef\xbb\xbf{}", "{\f}",
        "[1]]"};
    for (size_t i = 0; i < sizeof bails / sizeof *bails; i++)
        CHECK(skims(bails[i]) == -1);
    /* JSCAN_MAX_DEPTH containers open at once, not one more */
    for (int depth = JSCAN_MAX_DEPTH; depth <= JSCAN_MAX_DEPTH + 1; depth++) {
        pbuf b = PBUF_INIT;
        for (int i = 0; i < depth; i++)
            pbuf_putc(&b, '[');
        for (int i = 0; i < depth; i++)
            pbuf_putc(&b, ']');
        CHECK(skims(b.data) == (depth <= JSCAN_MAX_DEPTH ? 0 : -1));
        pbuf_free(&b);
    }
}

int main(void)
{
    test_walk();
    test_strings();
    test_numbers();
    test_structure();
    return check_report();
}
