/* rfc3339.c -- see rfc3339.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* timegm */
#endif
#include "lib/rfc3339.h"

#include <string.h>
#include <time.h>

static int digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

static int days_in_month(int year, int month)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : days[month - 1];
}

int rfc3339_parse(const char *s, uint64_t *ms)
{
    int year, mon, day, hour, min, sec;
    if (!s || strlen(s) < 20 || digits(s, 4, &year) || s[4] != '-' || digits(s + 5, 2, &mon) ||
        s[7] != '-' || digits(s + 8, 2, &day) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        digits(s + 11, 2, &hour) || s[13] != ':' || digits(s + 14, 2, &min) || s[16] != ':' ||
        digits(s + 17, 2, &sec))
        return -1;
    if (year < 1970 || mon < 1 || mon > 12 || day < 1 || day > days_in_month(year, mon) ||
        hour > 23 || min > 59 || sec > 60)
        return -1;
    const char *p = s + 19;
    int frac_ms = 0;
    if (*p == '.') {
        int n = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, n++)
            if (n < 3)
                frac_ms = frac_ms * 10 + (*p - '0');
        if (n == 0)
            return -1;
        for (; n < 3; n++)
            frac_ms *= 10;
    }
    long offset_s = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        if (digits(p + 1, 2, &oh) || p[3] != ':' || digits(p + 4, 2, &om) || oh > 23 || om > 59)
            return -1;
        offset_s = (*p == '-' ? -1 : 1) * (long)(oh * 3600 + om * 60);
        p += 6;
    } else {
        return -1;
    }
    if (*p)
        return -1;
    struct tm tm = {.tm_year = year - 1900,
                    .tm_mon = mon - 1,
                    .tm_mday = day,
                    .tm_hour = hour,
                    .tm_min = min,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    if (t == (time_t)-1 || (long long)t - offset_s < 0)
        return -1;
    *ms = (uint64_t)((long long)t - offset_s) * 1000 + (uint64_t)frac_ms;
    return 0;
}
