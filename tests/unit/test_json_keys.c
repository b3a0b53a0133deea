/* test_json_keys.c -- json_keys_check: the one unknown-key refusal every reader of host JSON uses. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/json_keys.h"

static const char *const KNOWN[] = {"conversation_id", "persona", "limit", NULL};

/* json_keys_check on the object `text`: its status, and *err (malloc'd or NULL). */
static parley_status check_text(const char *text, const char *what, char **err)
{
    json_t *o = json_loads(text, JSON_ALLOW_NUL, NULL);
    *err = (char *)"untouched";
    parley_status st = json_keys_check(o, KNOWN, what, err);
    json_decref(o);
    return st;
}

static void test_known_keys_pass(void)
{
    char *err;
    CHECK(check_text("{}", "query", &err) == PARLEY_OK && err == NULL);
    CHECK(check_text("{\"persona\":1,\"conversation_id\":\"c\",\"limit\":[]}", "query", &err) ==
              PARLEY_OK &&
          err == NULL);
    CHECK(check_text("[\"colour\"]", "query", &err) == PARLEY_OK &&
          err == NULL); /* not an object */
}

static void test_unknown_key_refused(void)
{
    char *err;
    CHECK(check_text("{\"persona\":\"p\",\"colour\":1,\"size\":2}", "query", &err) ==
          PARLEY_ERR_INVALID_INPUT);
    /* the first unknown key, and what was expected, from the same list */
    CHECK_STR(err, "query: unknown key \"colour\" (expected conversation_id, persona, limit)");
    free(err);
    CHECK(check_text("{\"Limit\":1}", NULL, &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "unknown key \"Limit\" (expected conversation_id, persona, limit)");
    free(err);
}

static void test_key_is_quoted_safely(void)
{
    char *err;
    CHECK(check_text("{\"a\\u0001b\":1}", "sel", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "sel: unknown key \"a\\x01b\" (expected conversation_id, persona, limit)");
    free(err);
    char text[300] = "{\"";
    memset(text + 2, 'k', 200);
    strcpy(text + 202, "\":1}");
    CHECK(check_text(text, "sel", &err) == PARLEY_ERR_INVALID_INPUT);
    char want[200];
    snprintf(want, sizeof want, "sel: unknown key \"%.*s...\" (expected", JSON_KEYS_QUOTE_MAX,
             text + 2);
    CHECK(err && strncmp(err, want, strlen(want)) == 0);
    free(err);
}

/* The empty key quotes as "" (the fuzzer's crash: utf8_quotable's buffer, only reserved, was
 * unterminated, and printing it with %s read past its end under ASan). */
static void test_empty_key_quoted(void)
{
    char *err;
    CHECK(check_text("{\"\":1}", "sel", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK_STR(err, "sel: unknown key \"\" (expected conversation_id, persona, limit)");
    free(err);
}

int main(void)
{
    test_known_keys_pass();
    test_unknown_key_refused();
    test_key_is_quoted_safely();
    test_empty_key_quoted();
    return check_report();
}
