/*
 * rfc3339.h -- RFC 3339 times as the host writes them.  Both query bounds
 * (since, until) and the times a host gives its messages (an input's and an
 * appended message's timestamp) are read here, so a time accepted in one
 * place is accepted in the other and means the same instant.
 */
#ifndef PARLEY_RFC3339_H
#define PARLEY_RFC3339_H

#include <stdint.h>

/* "2026-11-22T19:31:00Z", "...00.123+01:00" as ms since the epoch: 0, or -1
 * if it is not one (or before 1970).  Digits past milliseconds are dropped. */
int rfc3339_parse(const char *text, uint64_t *ms);

#endif
