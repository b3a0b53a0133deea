/*
 * read_file.h -- the tests' whole-file reader (corpus files, store files
 * compared byte for byte).  Header-only like check.h; needs buf.c linked.
 */
#ifndef PARLEY_TEST_READ_FILE_H
#define PARLEY_TEST_READ_FILE_H

#include <stdio.h>

#include "lib/buf.h"

/* The bytes of `path`, NUL-terminated (malloc'd), their count in *len (may
 * be NULL); NULL if it cannot be opened. */
static inline char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    pbuf b = PBUF_INIT;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        pbuf_append(&b, chunk, n);
    fclose(f);
    if (len)
        *len = b.len;
    return pbuf_take(&b);
}

#endif
