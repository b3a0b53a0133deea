/* last_error.c -- see last_error.h. */
#include "api/last_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAST_ERROR_MAX 1024

static _Thread_local char message[LAST_ERROR_MAX];

void last_error_clear(void) { message[0] = '\0'; }

void last_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (n < 0) {
        message[0] = '\0';
        return;
    }
    size_t len = strlen(message);
    if ((size_t)n <= len)
        return;
    /* Cut: drop a last character the cut left incomplete. */
    size_t start = len;
    while (start > 0 && ((unsigned char)message[start - 1] & 0xC0) == 0x80)
        start--;
    if (start == 0)
        return;
    unsigned char lead = (unsigned char)message[start - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (len - (start - 1) < need)
        message[start - 1] = '\0';
}

char *last_error_copy(void) { return message[0] ? strdup(message) : NULL; }
