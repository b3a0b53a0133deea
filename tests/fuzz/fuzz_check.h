/*
 * fuzz_check.h -- the check every fuzz target's properties use.  A failed
 * check aborts, which libFuzzer reports as a crash with the input that caused it.
 */
#ifndef PARLEY_FUZZ_CHECK_H
#define PARLEY_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* Two strings alike, NULL only like NULL. */
static inline int fuzz_str_equal(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

#endif
