/* utf8.h -- UTF-8 validation for text that crosses the ABI or goes into JSON. */
#ifndef PARLEY_UTF8_H
#define PARLEY_UTF8_H

#include <stddef.h>

/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or NUL bytes). */
int utf8_valid(const char *s, size_t n);

#endif
