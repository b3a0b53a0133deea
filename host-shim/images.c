/* images.c -- see images.h. */
#include "images.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *sniff_mime(const unsigned char *p, size_t n)
{
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0)
        return "image/png";
    if (n >= 3 && memcmp(p, "\xff\xd8\xff", 3) == 0)
        return "image/jpeg";
    if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0)
        return "image/webp";
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
        return "image/gif";
    return NULL;
}

static char *fail(char **err, const char *fmt, const char *path, const char *why)
{
    if (asprintf(err, fmt, path, why) < 0)
        *err = NULL;
    return NULL;
}

char *shim_image_data_url(const char *path, char **err)
{
    *err = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, "image %s: %s", path, strerror(errno));
    unsigned char *data = malloc(SHIM_IMAGE_MAX_FILE + 1);
    size_t n = data ? fread(data, 1, SHIM_IMAGE_MAX_FILE + 1, f) : 0;
    int read_error = ferror(f);
    fclose(f);
    if (!data)
        return fail(err, "image %s: %s", path, "out of memory");
    const char *mime = sniff_mime(data, n);
    const char *why = read_error                ? "could not be read"
                      : n > SHIM_IMAGE_MAX_FILE ? "larger than 64 MiB"
                      : !mime                   ? "not a PNG, JPEG, WebP or GIF file"
                                                : NULL;
    if (why) {
        free(data);
        return fail(err, "image %s: %s", path, why);
    }
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t head = strlen("data:;base64,") + strlen(mime);
    char *url = malloc(head + (n + 2) / 3 * 4 + 1);
    if (!url) {
        free(data);
        return fail(err, "image %s: %s", path, "out of memory");
    }
    char *w = url + sprintf(url, "data:%s;base64,", mime);
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)data[i] << 16 | (i + 1 < n ? (unsigned)data[i + 1] << 8 : 0) |
                     (i + 2 < n ? data[i + 2] : 0);
        *w++ = A[v >> 18 & 63];
        *w++ = A[v >> 12 & 63];
        *w++ = i + 1 < n ? A[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? A[v & 63] : '=';
    }
    *w = 0;
    free(data);
    return url;
}

char *shim_images_resolve(const char *images_json, char **err)
{
    *err = NULL;
    json_t *arr = json_loads(images_json, 0, NULL);
    char *out = NULL;
    if (!json_is_array(arr)) {
        json_decref(arr);
        return fail(err, "%s%s", "\"images\" must be an array of {\"url\"} or {\"path\"}", "");
    }
    size_t i;
    json_t *item;
    json_array_foreach(arr, i, item) {
        const char *path = json_string_value(json_object_get(item, "path"));
        if (!path)
            continue; /* {"url"} or anything else: the plugin checks it and names it */
        char *url = shim_image_data_url(path, err);
        if (!url)
            goto done;
        json_t *replaced = json_pack("{s:s}", "url", url);
        free(url);
        if (!replaced || json_array_set_new(arr, i, replaced) != 0) {
            fail(err, "%s%s", "out of memory", "");
            goto done;
        }
    }
    out = json_dumps(arr, JSON_COMPACT);
    if (!out)
        fail(err, "%s%s", "out of memory", "");
done:
    json_decref(arr);
    return out;
}
