/* uuid.c -- see uuid.h. */
#include "lib/uuid.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

/* Random bytes from a per-thread pool: one getrandom() per 16 UUIDs, not one per UUID. */
static int random_bytes(uint8_t *dst, size_t n)
{
    static __thread uint8_t pool[256];
    static __thread size_t left;
    if (n > sizeof pool)
        return -1;
    if (left < n) {
        size_t got = 0;
        while (got < sizeof pool) {
            ssize_t r = getrandom(pool + got, sizeof pool - got, 0);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                return -1;
            }
            got += (size_t)r;
        }
        left = sizeof pool;
    }
    memcpy(dst, pool + sizeof pool - left, n);
    memset(pool + sizeof pool - left, 0, n); /* used bytes are not kept around */
    left -= n;
    return 0;
}

int uuid4(char out[UUID_STR_LEN])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t b[16];
    if (random_bytes(b, sizeof b) != 0)
        return -1;
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    char *o = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *o++ = '-';
        *o++ = hex[b[i] >> 4];
        *o++ = hex[b[i] & 15];
    }
    *o = '\0';
    return 0;
}

int uuid_valid(const char *s)
{
    for (int i = 0; i < UUID_STR_LEN - 1; i++) {
        char c = s[i];
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (dash ? c != '-' : !hex)
            return 0; /* also stops at the NUL of a shorter string */
    }
    return s[UUID_STR_LEN - 1] == '\0';
}
