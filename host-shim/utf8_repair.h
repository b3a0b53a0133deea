/* utf8_repair.h -- make text safe to print as JSON: invalid UTF-8 bytes become U+FFFD. */
#ifndef PARLEY_SHIM_UTF8_REPAIR_H
#define PARLEY_SHIM_UTF8_REPAIR_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at p (RFC 3629), or 0 if invalid. */
size_t utf8_seq(const unsigned char *p, size_t n);

/*
 * A malloc'd, NUL-terminated copy of s[0..n) with every byte that starts no
 * valid UTF-8 sequence replaced by U+FFFD; its length goes to *out_len when
 * that is not NULL.  NULL on OOM.
 */
char *utf8_repaired(const char *s, size_t n, size_t *out_len);

#endif
