/*
 * fuzz_message_text.c -- the stored message text's walker (store/message_text.h)
 * on any bytes.
 *
 * A store file is untrusted.  Every message the walker gives lies inside the
 * text, after the one before, from a '{' to its '}'; a plain one has the plain
 * shape; and when jansson reads the text (without its trailing ',', wrapped in
 * []) as a list of objects, the walker gives exactly those objects and ends
 * cleanly (tests/unit/test_message_text.c checks the same on random texts).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "store/message_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The plain shape: {"role":"user"|"assistant","content":"..."}; 1 also when the
   message is not JSON (the walker does not check inside a message). */
static int plain_shape(const char *json, size_t len)
{
    json_t *o = json_loadb(json, len, 0, NULL);
    if (!o)
        return 1;
    const char *role = json_string_value(json_object_get(o, "role"));
    int plain = json_object_size(o) == 2 && json_is_string(json_object_get(o, "content")) && role &&
                (!strcmp(role, "user") || !strcmp(role, "assistant"));
    json_decref(o);
    return plain;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    msgtext_iter it;
    msgtext_msg m;
    int rc;
    size_t count = 0;
    const char *at = text;
    msgtext_msg *msgs = malloc((size / 2 + 1) * sizeof *msgs);
    FUZZ_CHECK(msgs);
    msgtext_begin(&it, size ? text : NULL, size);
    while ((rc = msgtext_next(&it, &m)) > 0) {
        FUZZ_CHECK(m.json >= at && m.len >= 2 && m.json + m.len <= text + size);
        FUZZ_CHECK(m.json[0] == '{' && m.json[m.len - 1] == '}');
        if (m.plain)
            FUZZ_CHECK(plain_shape(m.json, m.len));
        at = m.json + m.len;
        FUZZ_CHECK(count < size / 2 + 1);
        msgs[count++] = m;
    }
    FUZZ_CHECK(rc == 0 || rc == -1);
    FUZZ_CHECK(msgtext_next(&it, &m) == rc); /* it stays where it stopped */

    size_t w = size;
    while (w && text[w - 1] == ',')
        w--;
    char *wrapped = malloc(w + 2);
    FUZZ_CHECK(wrapped);
    wrapped[0] = '[';
    memcpy(wrapped + 1, text, w);
    wrapped[w + 1] = ']';
    json_t *arr = json_loadb(wrapped, w + 2, 0, NULL);
    int objects = arr && json_array_size(arr) > 0;
    for (size_t i = 0; objects && i < json_array_size(arr); i++)
        objects = json_is_object(json_array_get(arr, i));
    if (objects) {
        FUZZ_CHECK(rc == 0 && count == json_array_size(arr));
        for (size_t i = 0; i < count; i++) {
            json_t *one = json_loadb(msgs[i].json, msgs[i].len, 0, NULL);
            FUZZ_CHECK(json_equal(one, json_array_get(arr, i)));
            json_decref(one);
        }
    }
    json_decref(arr);
    free(wrapped);
    free(msgs);
    return 0;
}
