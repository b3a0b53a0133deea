/* utf8.h -- UTF-8 validation for text that crosses the ABI or goes into JSON. */
#ifndef PARLEY_UTF8_H
#define PARLEY_UTF8_H

#include <stddef.h>

#include "lib/buf.h"

/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or NUL bytes). */
int utf8_valid(const char *s, size_t n);

/* Length of the well-formed character at s (n >= 1 bytes available), or 0. */
size_t utf8_seq_len(const char *s, size_t n);

/* Append s[0..n) with every byte that starts no valid character replaced by U+FFFD. */
void utf8_append_repaired(pbuf *b, const char *s, size_t n);

#endif
