/*
 * images.h -- images for a turn from the shim's input: {"path": "photo.jpg"}
 * becomes {"url": "data:image/jpeg;base64,..."} (the MIME type from the
 * file's magic bytes), {"url": ...} passes through for the plugin to check.
 */
#ifndef PARLEY_HOST_IMAGES_H
#define PARLEY_HOST_IMAGES_H

/* Largest image file the shim reads (the plugin's max_image_bytes decides). */
#define SHIM_IMAGE_MAX_FILE (64L * 1024 * 1024)

/* The data URL of the image file at `path` (malloc'd), or NULL with *err
 * (malloc'd) naming the file and the reason. */
char *shim_image_data_url(const char *path, char **err);

/* `images_json` (an array of {"url"} or {"path"}) with every path replaced
 * by its data URL, as compact JSON (malloc'd), or NULL with *err. */
char *shim_images_resolve(const char *images_json, char **err);

#endif
