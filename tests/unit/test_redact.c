/* test_redact.c -- the agent's secrets out of server text (lib/redact.h). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/redact.h"

static void expect(const char *key, const char *store, const char *text, const char *want)
{
    secret_span s[REDACT_MAX_SECRETS];
    char *got = redact(text, s, redact_secrets(key, store, s));
    CHECK_STR(got, want);
    free(got);
}

static void test_the_secrets_of_options(void)
{
    secret_span s[REDACT_MAX_SECRETS];
    CHECK(redact_secrets(NULL, "memory", s) == 0);
    CHECK(redact_secrets("", "sqlite:/x:pw@y", s) == 0);
    CHECK(redact_secrets("sk-1", NULL, s) == 1 && s[0].n == 4);
    /* the password is split at the last '@', as the Redis store splits it */
    CHECK(redact_secrets("k", "redis://:s3cr@t-pw@host:6379/2", s) == 2);
    CHECK(s[1].n == 9 && memcmp(s[1].s, "s3cr@t-pw", 9) == 0);
    CHECK(redact_secrets(NULL, "redis://host:6379", s) == 0);
    CHECK(redact_secrets(NULL, "redis://:@host:6379", s) == 0);
}

static void test_redaction(void)
{
    const char *key = "sk-proj-Abc123Def456";
    expect(key, NULL, "Incorrect API key provided: Bearer sk-proj-Abc123Def456.",
           "Incorrect API key provided: Bearer [redacted].");
    expect(key, NULL, "sk-proj-Abc123Def456sk-proj-Abc123Def456 x sk-proj-Abc123Def456",
           "[redacted][redacted] x [redacted]");
    expect(key, NULL, "nothing to see", "nothing to see");
    expect(key, NULL, "", "");
    /* cut off by a bounded text: its start is redacted too, before "..." or at the end */
    expect(key, NULL, "key sk-proj-Abc1...", "key [redacted]...");
    expect(key, NULL, "key sk-proj-Abc123Def45", "key [redacted]");
    expect(key, NULL, "ends in sk-", "ends in sk-"); /* fewer than REDACT_MIN_TAIL bytes */
    /* a placeholder key ("ollama") is not a secret worth blotting words for */
    expect("ollama", NULL, "run ollama pull llama3", "run ollama pull llama3");
    /* both secrets, the Redis password holding '@' */
    expect(key, "redis://:s3cr@t-pw-long@h:1", "auth s3cr@t-pw-long, key sk-proj-Abc123Def456",
           "auth [redacted], key [redacted]");
    secret_span none[1];
    CHECK(redact(NULL, none, 0) == NULL);
}

int main(void)
{
    test_the_secrets_of_options();
    test_redaction();
    return check_report();
}
