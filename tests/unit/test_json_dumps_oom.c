/*
 * test_json_dumps_oom.c -- json_dumps_whole (lib/json_oom.h) out of memory: each
 * allocation of a dump is failed in turn (alloc_fail.h), and every run gives the
 * whole text or NULL, never the text with a key missing, which jansson 2.14's
 * own json_dumps returns (it ignores a failed write of an object's key).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_fail.h"
#include "check.h"
#include "lib/json_oom.h"

typedef char *(*dump_fn)(const json_t *, size_t);

/* Runs dump once per allocation it makes; returns how many runs gave a wrong text. */
static int wrong_texts(dump_fn dump, const json_t *v, const char *whole)
{
    int wrong = 0;
    for (long k = 1; k < 10000; k++) {
        af_arm(k, 0);
        char *s = dump(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        long failures = af_failures();
        af_disarm();
        if (s && strcmp(s, whole) != 0)
            wrong++;
        free(s);
        if (!failures)
            break;
    }
    return wrong;
}

static char *dumps(const json_t *v, size_t flags) { return json_dumps(v, flags); }

int main(void)
{
    json_t *v = json_pack("{s:i,s:{s:s,s:s},s:[s,s]}", "seq", 17, "error", "code", "no_memory",
                          "message", "out of memory", "steps", "a", "b");
    char *whole = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(v && whole);
    if (v && whole) {
        CHECK(wrong_texts(json_dumps_whole, v, whole) == 0);
        /* what it guards against: jansson's own dump with one key lost (when this fails, a
           jansson that checks its writes is installed, and json_dumps_whole may go) */
        CHECK(wrong_texts(dumps, v, whole) > 0);
    }
    free(whole);
    json_decref(v);
    return check_report();
}
