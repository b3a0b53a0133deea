/*
 * check.h -- the unit tests' tiny assertion kit.  Each failed CHECK prints
 * where and what; the program ends with the line "checks: N passed, N failed"
 * (scripts/test_progress.py counts it)
 * and exits non-zero when anything failed.
 */
#ifndef PARLEY_CHECK_H
#define PARLEY_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) {                                                                  \
            check_passed++;                                                          \
        } else {                                                                     \
            check_failed++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECK_STR(a, b)                                                                 \
    do {                                                                                \
        const char *check_a_ = (a), *check_b_ = (b);                                    \
        if (check_a_ && check_b_ && strcmp(check_a_, check_b_) == 0) {                  \
            check_passed++;                                                             \
        } else {                                                                        \
            check_failed++;                                                             \
            fprintf(stderr, "%s:%d: CHECK_STR failed: %s == %s\n  got:      %s\n  expected: %s\n", \
                    __FILE__, __LINE__, #a, #b, check_a_ ? check_a_ : "(null)",         \
                    check_b_ ? check_b_ : "(null)");                                    \
        }                                                                               \
    } while (0)

static inline int check_report(void)
{
    printf("checks: %d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
