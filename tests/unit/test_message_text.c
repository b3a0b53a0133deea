/* test_message_text.c -- the stored message text's walker (store/message_text.h). */
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

    pbuf b = PBUF_INIT;
    msgtext_append(&b, "{\"a\":1}", 7);
    msgtext_append(&b, "{\"b\":2}", 7);
    CHECK_STR(b.data, "{\"a\":1},{\"b\":2},");
    CHECK_STR(walk(b.data), "{\"a\":1}|{\"b\":2}");
    pbuf_free(&b);
    return check_report();
}
