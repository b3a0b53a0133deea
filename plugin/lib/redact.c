/* redact.c -- see redact.h. */
#include "lib/redact.h"

#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"

size_t redact_secrets(const char *api_key, const char *history_store,
                      secret_span out[REDACT_MAX_SECRETS])
{
    size_t n = 0;
    if (api_key && *api_key)
        out[n++] = (secret_span){api_key, strlen(api_key)};
    const char *scheme = "redis://";
    if (history_store && strncmp(history_store, scheme, strlen(scheme)) == 0) {
        const char *p = history_store + strlen(scheme);
        const char *at = strrchr(p, '@'); /* a password may itself hold '@' */
        if (at && p[0] == ':' && at > p + 1)
            out[n++] = (secret_span){p + 1, (size_t)(at - p - 1)};
    }
    return n;
}

/* Where in s[0..n) the first of the secrets occurs (*which: its index), or NULL. */
static const char *first_secret(const char *s, size_t n, const secret_span *secrets,
                                size_t nsecrets, size_t *which)
{
    const char *best = NULL;
    for (size_t k = 0; k < nsecrets; k++) {
        const secret_span *sec = &secrets[k];
        if (!sec->s || sec->n < REDACT_MIN_LEN || sec->n > n)
            continue;
        const char *hit = memmem(s, n, sec->s, sec->n);
        if (hit && (!best || hit < best || (hit == best && sec->n > secrets[*which].n))) {
            best = hit;
            *which = k;
        }
    }
    return best;
}

/* The length of the longest start of a secret (REDACT_MIN_TAIL bytes or
 * more) that s[0..n) ends with, ignoring a trailing "..." (a cut text). */
static size_t cut_secret_at_end(const char *s, size_t n, const secret_span *secrets,
                                size_t nsecrets)
{
    if (n >= 3 && memcmp(s + n - 3, "...", 3) == 0)
        n -= 3;
    size_t longest = 0;
    for (size_t k = 0; k < nsecrets; k++) {
        const secret_span *sec = &secrets[k];
        if (!sec->s || sec->n < REDACT_MIN_LEN)
            continue;
        for (size_t m = sec->n - 1 < n ? sec->n - 1 : n; m >= REDACT_MIN_TAIL && m > longest; m--)
            if (memcmp(s + n - m, sec->s, m) == 0) {
                longest = m;
                break;
            }
    }
    return longest;
}

char *redact(const char *text, const secret_span *secrets, size_t nsecrets)
{
    if (!text)
        return NULL;
    size_t n = strlen(text);
    pbuf out = PBUF_INIT;
    const char *p = text, *end = text + n;
    size_t which = 0;
    for (const char *hit; (hit = first_secret(p, (size_t)(end - p), secrets, nsecrets, &which));) {
        pbuf_append(&out, p, (size_t)(hit - p));
        pbuf_puts(&out, REDACTED);
        p = hit + secrets[which].n;
    }
    size_t rest = (size_t)(end - p);
    size_t cut = cut_secret_at_end(p, rest, secrets, nsecrets);
    if (cut) {
        size_t dots = rest >= 3 && memcmp(end - 3, "...", 3) == 0 ? 3 : 0;
        pbuf_append(&out, p, rest - dots - cut);
        pbuf_puts(&out, REDACTED);
        pbuf_append(&out, end - dots, dots);
    } else {
        pbuf_append(&out, p, rest);
    }
    if (out.oom) {
        pbuf_free(&out);
        return NULL;
    }
    return pbuf_take(&out);
}

void redact_owned(char **text, const secret_span *secrets, size_t nsecrets)
{
    if (!*text)
        return;
    char *r = redact(*text, secrets, nsecrets);
    free(*text);
    *text = r;
}
