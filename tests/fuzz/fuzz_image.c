/*
 * fuzz_image.c -- the image checks on arbitrary text: any URL or images_json
 * a host passes is accepted (and then consistent) or refused with a message
 * naming images_json, never a crash or a leak.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "provider/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    image_limits lim = {4096, 3};

    /* The text as one URL. */
    image im;
    char *err = NULL;
    if (image_check_url(text, 0, &lim, &im, &err) == PARLEY_OK) {
        if (err)
            abort();
        if (im.base64) { /* an accepted data URL: real base64 of a matching image, in bounds */
            size_t n = 0;
            unsigned char head[12];
            if (!im.mime || im.bytes > lim.max_bytes ||
                image_base64_decode(im.base64, im.base64_len, head, sizeof head, &n) != 0 ||
                n != im.bytes || image_sniff_mime(head, n < 12 ? n : 12) != im.mime)
                abort();
        }
    } else {
        if (!err || !strstr(err, "input 'images_json': image 1: "))
            abort();
        free(err);
    }

    /* The text as images_json. */
    image_list l;
    err = NULL;
    parley_status rc = image_list_parse(text, &lim, &l, &err);
    if (rc == PARLEY_OK) {
        if (err || l.n > lim.max_images)
            abort();
        pbuf b = PBUF_INIT;
        for (size_t i = 0; i < l.n; i++)
            image_placeholder(&b, &l.items[i]);
        pbuf_free(&b);
        image_list_free(&l);
    } else {
        if (!err || (rc == PARLEY_ERR_INVALID_INPUT && !strstr(err, "input 'images_json'")) ||
            l.n || l.items)
            abort();
        free(err);
    }
    free(text);
    return 0;
}
