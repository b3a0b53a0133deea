/* test_message_text.c -- the stored message text's walker (store/message_text.h). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "store/message_text.h"

/* Walk `text`: the messages' JSON joined by '|', then "!" when the walk stopped at damage;
   each plain message is marked with a leading '*'. */
static const char *walk(const char *text)
{
    static char out[512];
    msgtext_iter it;
    msgtext_msg m;
    int rc;
    size_t n = 0;
    msgtext_begin(&it, text, text ? strlen(text) : 0);
    while ((rc = msgtext_next(&it, &m)) > 0) {
        if (n)
            out[n++] = '|';
        if (m.plain)
            out[n++] = '*';
        memcpy(out + n, m.json, m.len);
        n += m.len;
    }
    if (rc < 0)
        out[n++] = '!';
    out[n] = '\0';
    return out;
}

/* Random texts of whole messages, separators and stray JSON bytes: every span the walker
   gives lies inside the text, in order, from a '{' to a '}'; and when the text is a list of
   objects by jansson's reading (the old provider_parse_messages: wrapped in [] after its
   trailing ','), the walker finds each of them and ends cleanly. */
static void test_random_texts(void)
{
    static const char *const pieces[] = {"{}",
                                         "{\"a\":1}",
                                         "{\"a\":\"}\\\"]\"}",
                                         "{\"role\":\"user\",\"content\":\"x\"}",
                                         "{\"role\":\"assistant\",\"content\":\"\\\\\"}",
                                         "{\"b\":[{},[]]}",
                                         ",",
                                         ",",
                                         " ",
                                         "\n",
                                         "\"",
                                         "\\",
                                         "{",
                                         "}",
                                         "[",
                                         "]",
                                         "1"};
    enum { NPIECES = sizeof pieces / sizeof pieces[0] };
    uint32_t seed = 12345;
    int lists = 0;
    for (int round = 0; round < 100000; round++) {
        char text[256];
        size_t n = 0, k = (seed = seed * 1103515245u + 12345u) >> 16 & 7;
        while (k--) {
            const char *piece = pieces[((seed = seed * 1103515245u + 12345u) >> 16) % NPIECES];
            memcpy(text + n, piece, strlen(piece));
            n += strlen(piece);
        }
        char *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees a read past the end */
        memcpy(copy, text, n);
        msgtext_iter it;
        msgtext_msg m;
        int rc;
        size_t count = 0;
        const char *at = copy;
        msgtext_begin(&it, copy, n);
        while ((rc = msgtext_next(&it, &m)) > 0) {
            CHECK(m.json >= at && m.len >= 2 && m.json + m.len <= copy + n);
            CHECK(m.json[0] == '{' && m.json[m.len - 1] == '}');
            at = m.json + m.len;
            count++;
        }
        size_t w = n;
        while (w && text[w - 1] == ',')
            w--;
        char wrapped[260];
        snprintf(wrapped, sizeof wrapped, "[%.*s]", (int)w, text);
        json_t *arr = json_loads(wrapped, 0, NULL);
        int objects = arr && json_array_size(arr) > 0;
        for (size_t i = 0; objects && i < json_array_size(arr); i++)
            objects = json_is_object(json_array_get(arr, i));
        if (objects) {
            lists++;
            CHECK(rc == 0 && count == json_array_size(arr));
        }
        json_decref(arr);
        free(copy);
    }
    CHECK(lists > 1000); /* the property was tested, not only the bounds */
}

int main(void)
{
    CHECK_STR(walk(NULL), "");
    CHECK_STR(walk(""), "");
    CHECK_STR(walk(",\n"), "");
    /* load()'s form (a trailing ','), and a turn's (none) */
    CHECK_STR(
        walk("{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"},"),
        "*{\"role\":\"user\",\"content\":\"hi\"}|*{\"role\":\"assistant\",\"content\":\"yo\"}");
    CHECK_STR(walk("{\"a\":1},{\"b\":[1,{\"c\":2}]}"), "{\"a\":1}|{\"b\":[1,{\"c\":2}]}");
    /* braces, brackets and escaped quotes inside strings do not count */
    CHECK_STR(walk("{\"role\":\"user\",\"content\":\"a}\\\"]{\\\\\"},{\"x\":\"}\"}"),
              "*{\"role\":\"user\",\"content\":\"a}\\\"]{\\\\\"}|{\"x\":\"}\"}");
    /* the plain shape exactly: another key after the content is not plain */
    CHECK_STR(walk("{\"role\":\"user\",\"content\":\"a\",\"name\":\"b\"}"),
              "{\"role\":\"user\",\"content\":\"a\",\"name\":\"b\"}");
    CHECK_STR(walk("{\"role\":\"tool\",\"content\":\"a\"}"),
              "{\"role\":\"tool\",\"content\":\"a\"}");
    /* damage: not an object, or one that does not close */
    CHECK_STR(walk("{\"a\":1},[1]"), "{\"a\":1}!");
    CHECK_STR(walk("{\"a\":1},\"x\""), "{\"a\":1}!");
    CHECK_STR(walk("{\"a\":\"1}"), "!");
    CHECK_STR(walk("{\"role\":\"user\",\"content\":\"x"), "!");
    CHECK_STR(walk("{\"a\":{}"), "!");
    CHECK_STR(walk("{\"a\":1]"), "!");

    pbuf b = PBUF_INIT;
    msgtext_append(&b, "{\"a\":1}", 7);
    msgtext_append(&b, "{\"b\":2}", 7);
    CHECK_STR(b.data, "{\"a\":1},{\"b\":2},");
    CHECK_STR(walk(b.data), "{\"a\":1}|{\"b\":2}");
    pbuf_free(&b);
    test_random_texts();
    return check_report();
}
