/*
 * redact.h -- the agent's secrets out of text it did not write.
 *
 * A server's error text may quote the API key back ("Incorrect API key
 * provided: Bearer sk-...", as some gateways do), and whatever reaches an
 * error_message or a log line leaves the process.  Every such text passes
 * through redact() first, with the secrets of the options that made it: the
 * API key and the password of a Redis history_store.
 *
 * A secret shorter than REDACT_MIN_LEN is taken for a placeholder ("ollama",
 * "none": what local servers are given) and left alone, so that ordinary
 * words in a message are not blotted out.  A secret cut off by the end of
 * the text (server texts are bounded) is redacted too, from REDACT_MIN_TAIL
 * bytes of it.
 */
#ifndef PARLEY_REDACT_H
#define PARLEY_REDACT_H

#include <stddef.h>

#define REDACT_MIN_LEN 8
#define REDACT_MIN_TAIL 4
#define REDACTED "[redacted]"

typedef struct secret_span {
    const char *s; /* not NUL-terminated; NULL = none */
    size_t n;
} secret_span;

enum { REDACT_MAX_SECRETS = 2 };

/* The secrets of an agent's options: its API key (NULL: none) and the
 * password inside `history_store` ("redis://:PASSWORD@HOST:PORT", split at
 * the last '@' as the store does).  Fills out[] and returns how many. */
size_t redact_secrets(const char *api_key, const char *history_store,
                      secret_span out[REDACT_MAX_SECRETS]);

/* `text` with each secret replaced by REDACTED: a new string (NULL: text
 * was NULL, or out of memory: nothing is shown rather than a secret). */
char *redact(const char *text, const secret_span *secrets, size_t nsecrets);

/* redact() in place of a malloc'd *text (freed); *text NULL on OOM. */
void redact_owned(char **text, const secret_span *secrets, size_t nsecrets);

#endif
