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

/* s[0..n) made fit to quote in an error message (malloc'd, NULL out of memory): error
   text is always valid UTF-8, whatever the input.  Each byte that starts no valid
   character, and each control character, becomes the four characters \xNN; the rest is
   kept.  Past `max` bytes of s it stops at a character's start and adds "...", so a long
   value is never cut inside a character (as "%.64s" would).  Use it wherever input may
   be quoted before it was found to be UTF-8, or cut. */
char *utf8_quotable(const char *s, size_t n, size_t max);

/* s (NUL-terminated) made valid UTF-8 in place: each byte that starts no valid character
   becomes '?'.  Returns s.  For jansson's error text (json_error_t.text), which quotes the
   input near the error one byte at a time: it can end inside a character ("invalid
   escape near '\"\\\xC3'" for "\é"), so quote it through this. */
char *utf8_mend(char *s);

#endif
