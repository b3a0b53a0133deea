/*
 * image.h -- the images a turn carries (input `images_json`): parsed and
 * checked once on the host thread, before anything is sent or stored.
 *
 * An image is a `data:` URL (image/png, image/jpeg, image/webp or image/gif,
 * base64) whose bytes must decode and start with the magic bytes of the MIME
 * type it names, or an http(s) URL the model's server fetches itself.  Each
 * refusal names the image ("images_json[1]: ...").
 */
#ifndef PARLEY_IMAGE_H
#define PARLEY_IMAGE_H

#include <stddef.h>

#include "lib/buf.h"
#include "lib/plugin_status.h"

typedef struct image {
    char *url;          /* as given (malloc'd) */
    const char *mime;   /* static "image/png"...; NULL for an http(s) URL */
    const char *base64; /* data URL: the payload, inside url; NULL for an http(s) URL */
    size_t base64_len;
    size_t bytes;       /* data URL: decoded size */
} image;

typedef struct image_list {
    image *items;
    size_t n;
} image_list;

typedef struct image_limits {
    size_t max_bytes;   /* decoded bytes per image */
    size_t max_images;  /* per turn */
} image_limits;

/*
 * Parse `json` (an array of {"url": "..."}) into *out.  PARLEY_OK, or
 * PARLEY_ERR_INVALID_INPUT (NO_MEMORY) with *err (malloc'd) naming the image;
 * *out then holds nothing.
 */
parley_status image_list_parse(const char *json, const image_limits *lim, image_list *out,
                               char **err);
void image_list_free(image_list *l);

/* Check one URL as above (index only names it in *err): PARLEY_OK, or
   PARLEY_ERR_INVALID_INPUT with *err. */
parley_status image_check_url(const char *url, size_t index, const image_limits *lim, image *out,
                              char **err);

/*
 * Strict base64 (RFC 4648 standard alphabet, '=' padding required): the
 * decoded length in *len, the first min(cap, len) bytes in head (may be
 * NULL when cap is 0).  0, or -1 when `s` is not base64.
 */
int image_base64_decode(const char *s, size_t n, unsigned char *head, size_t cap, size_t *len);

/*
 * A data URL already checked (image_check_url) split for a codec: its MIME
 * type (*mime, *mime_len bytes) and its base64 (*data, to the end).  0, or
 * -1 when `url` is no base64 data URL (an http(s) URL).
 */
int image_data_url_split(const char *url, const char **mime, size_t *mime_len, const char **data);

/* The MIME type the bytes' magic says (png, jpeg, webp, gif), or NULL. */
const char *image_sniff_mime(const unsigned char *p, size_t n);

/* What history keeps instead of the image: "[image: image/jpeg, 183 KB]" or
 * "[image: https://host/path]": a URL without its user:password@, query and
 * fragment, where credentials and tokens go (Home Assistant's camera proxy:
 * ".../camera_proxy/camera.door?token=..."). */
void image_placeholder(pbuf *b, const image *im);

/* 1 for an http(s) image whose URL has user-info, a query or a fragment:
 * history never keeps that URL, even with history_images "keep". */
int image_url_has_secrets(const image *im);

#endif
