/* image.c -- see image.h. */
#include "provider/image.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/utf8.h"

static const char *const MIME_TYPES[] = {"image/png", "image/jpeg", "image/webp", "image/gif"};

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int image_base64_decode(const char *s, size_t n, unsigned char *head, size_t cap, size_t *len)
{
    *len = 0;
    if (n == 0 || n % 4 != 0)
        return -1;
    size_t out = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            /* '=' only in the last quantum, only at its end ("xx==" or "xxx=") */
            if (c == '=' && i + 4 == n && k >= 2 && (k == 3 || s[i + 3] == '=')) {
                v[k] = 0;
                pad++;
            } else if ((v[k] = b64_value(c)) < 0) {
                return -1;
            }
        }
        uint32_t q = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        unsigned char bytes[3] = {(unsigned char)(q >> 16), (unsigned char)(q >> 8), (unsigned char)q};
        for (int k = 0; k < 3 - pad; k++, out++)
            if (out < cap)
                head[out] = bytes[k];
    }
    *len = out;
    return 0;
}

const char *image_sniff_mime(const unsigned char *p, size_t n)
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

static const char *known_mime(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof MIME_TYPES / sizeof MIME_TYPES[0]; i++)
        if (strlen(MIME_TYPES[i]) == n && strncasecmp(s, MIME_TYPES[i], n) == 0)
            return MIME_TYPES[i];
    return NULL;
}

/* data:<mime>;base64,<payload> */
static parley_status check_data_url(const char *url, size_t index, const image_limits *lim,
                                    image *out, char **err)
{
    const char *type = url + 5, *semi = strchr(type, ';'), *comma = strchr(type, ',');
    if (!comma || !semi || semi > comma || (size_t)(comma - semi) != 7 ||
        strncasecmp(semi, ";base64", 7) != 0) {
        *err = pstr_printf("input 'images_json': image %zu: a data URL must be "
                           "data:<image type>;base64,<data>", index + 1);
        return PARLEY_ERR_INVALID_INPUT;
    }
    out->mime = known_mime(type, (size_t)(semi - type));
    if (!out->mime) { /* quoted, not cut with %.*s: a cut may fall inside a character */
        char *q = utf8_quotable(type, (size_t)(semi - type), 64);
        *err = pstr_printf("input 'images_json': image %zu: type \"%s\" is not image/png, "
                           "image/jpeg, image/webp or image/gif", index + 1, q ? q : "?");
        free(q);
        return PARLEY_ERR_INVALID_INPUT;
    }
    out->base64 = comma + 1;
    out->base64_len = strlen(out->base64);
    unsigned char head[12];
    if (image_base64_decode(out->base64, out->base64_len, head, sizeof head, &out->bytes) != 0) {
        *err = pstr_printf("input 'images_json': image %zu: the data is not valid base64",
                           index + 1);
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (out->bytes > lim->max_bytes) {
        *err = pstr_printf("input 'images_json': image %zu: %zu bytes, more than max_image_bytes "
                           "(%zu)", index + 1, out->bytes, lim->max_bytes);
        return PARLEY_ERR_INVALID_INPUT;
    }
    const char *sniffed = image_sniff_mime(head, out->bytes < sizeof head ? out->bytes : sizeof head);
    if (!sniffed) {
        *err = pstr_printf("input 'images_json': image %zu: the data does not start with the "
                           "magic bytes of %s", index + 1, out->mime);
        return PARLEY_ERR_INVALID_INPUT;
    }
    if (sniffed != out->mime) {
        *err = pstr_printf("input 'images_json': image %zu: the data is %s, not %s as the data "
                           "URL says", index + 1, sniffed, out->mime);
        return PARLEY_ERR_INVALID_INPUT;
    }
    return PARLEY_OK;
}

int image_data_url_split(const char *url, const char **mime, size_t *mime_len, const char **data)
{
    if (strncasecmp(url, "data:", 5) != 0)
        return -1;
    const char *semi = strchr(url + 5, ';'), *comma = strchr(url + 5, ',');
    if (!semi || !comma || semi > comma)
        return -1;
    *mime = url + 5;
    *mime_len = (size_t)(semi - *mime);
    *data = comma + 1;
    return 0;
}

parley_status image_check_url(const char *url, size_t index, const image_limits *lim, image *out,
                              char **err)
{
    memset(out, 0, sizeof *out);
    if (strncasecmp(url, "data:", 5) == 0)
        return check_data_url(url, index, lim, out, err);
    if (strncasecmp(url, "https://", 8) == 0 || strncasecmp(url, "http://", 7) == 0) {
        const char *host = strstr(url, "://") + 3;
        for (const char *p = url; *p; p++)
            if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
                *err = pstr_printf("input 'images_json': image %zu: the URL contains a space or "
                                   "control character", index + 1);
                return PARLEY_ERR_INVALID_INPUT;
            }
        if (!*host || *host == '/') {
            *err = pstr_printf("input 'images_json': image %zu: the URL has no host", index + 1);
            return PARLEY_ERR_INVALID_INPUT;
        }
        return PARLEY_OK;
    }
    const char *colon = strchr(url, ':');
    size_t n = colon ? (size_t)(colon - url) : 0;
    char *scheme = n ? utf8_quotable(url, n, 16) : NULL;
    *err = pstr_printf("input 'images_json': image %zu: the URL must be data:, http: or "
                       "https:%s%s%s",
                       index + 1, scheme ? " (not " : "", scheme ? scheme : "", scheme ? ":)" : "");
    free(scheme);
    return PARLEY_ERR_INVALID_INPUT;
}

parley_status image_list_parse(const char *json, const image_limits *lim, image_list *out,
                               char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    parley_status st = PARLEY_ERR_INVALID_INPUT;
    if (!json_is_array(root)) {
        *err = pstr_printf("input 'images_json': must be a JSON array of {\"url\": ...}%s%s",
                           root ? "" : ": ", root ? "" : utf8_mend(jerr.text));
        goto done;
    }
    size_t n = json_array_size(root);
    if (n > lim->max_images) {
        *err = pstr_printf("input 'images_json': %zu images, more than max_images_per_turn (%zu)",
                           n, lim->max_images);
        goto done;
    }
    if (n && !(out->items = calloc(n, sizeof *out->items))) {
        st = PARLEY_ERR_NO_MEMORY;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(root, i);
        const char *url = json_string_value(json_object_get(item, "url"));
        if (!json_is_object(item) || !url || json_object_size(item) != 1) {
            st = PARLEY_ERR_INVALID_INPUT; /* an earlier image's check left PARLEY_OK here */
            *err = pstr_printf("input 'images_json': image %zu: must be {\"url\": \"data:...\" or "
                               "\"https://...\"}", i + 1);
            goto done;
        }
        image im;
        if ((st = image_check_url(url, i, lim, &im, err)) != PARLEY_OK)
            goto done;
        if (!(im.url = strdup(url))) {
            st = PARLEY_ERR_NO_MEMORY;
            goto done;
        }
        if (im.base64)
            im.base64 = im.url + (im.base64 - url);
        out->items[out->n++] = im;
    }
    st = PARLEY_OK;
done:
    json_decref(root);
    if (st != PARLEY_OK && !*err) { /* out of memory, or a message that could not be made */
        *err = pstr_printf("out of memory");
        st = PARLEY_ERR_NO_MEMORY;
    }
    if (st != PARLEY_OK)
        image_list_free(out);
    return st;
}

void image_list_free(image_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i].url);
    free(l->items);
    memset(l, 0, sizeof *l);
}

/* Where an http(s) URL's host starts (after any user:password@), and its
 * authority's end: the user-info ends at the authority's last '@'. */
static const char *url_host(const char *url, const char **authority_end)
{
    const char *start = strstr(url, "://") + 3, *host = start;
    *authority_end = start + strcspn(start, "/?#");
    for (const char *p = start; p < *authority_end; p++)
        if (*p == '@')
            host = p + 1;
    return host;
}

int image_url_has_secrets(const image *im)
{
    if (im->mime)
        return 0;
    const char *end;
    const char *host = url_host(im->url, &end);
    return host != strstr(im->url, "://") + 3 || strpbrk(im->url, "?#") != NULL;
}

void image_placeholder(pbuf *b, const image *im)
{
    if (!im->mime) { /* without user:password@, ?query and #fragment: tokens live there */
        const char *end;
        const char *host = url_host(im->url, &end);
        const char *scheme_end = strstr(im->url, "://") + 3;
        pbuf_puts(b, "[image: ");
        pbuf_append(b, im->url, (size_t)(scheme_end - im->url));
        pbuf_append(b, host, strcspn(host, "?#"));
        pbuf_putc(b, ']');
        return;
    }
    if (im->bytes < 1024)
        pbuf_printf(b, "[image: %s, %zu bytes]", im->mime, im->bytes);
    else
        pbuf_printf(b, "[image: %s, %zu KB]", im->mime, (im->bytes + 512) / 1024);
}
