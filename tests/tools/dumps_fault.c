/*
 * dumps_fault.c -- an LD_PRELOAD library for the integration tests: jansson's
 * json_dumps fails, as out of memory makes it, for the object whose "seq"
 * member is $PARLEY_FAULT_DUMPS_SEQ (parley-host's answer to that input line);
 * every other call goes through.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>

typedef char *(*dumps_fn)(const json_t *, size_t);

char *json_dumps(const json_t *json, size_t flags)
{
    dumps_fn real = (dumps_fn)dlsym(RTLD_NEXT, "json_dumps");
    const char *seq = getenv("PARLEY_FAULT_DUMPS_SEQ");
    json_t *s = json_is_object(json) ? json_object_get(json, "seq") : NULL;
    if (seq && json_is_integer(s) && json_integer_value(s) == atoll(seq))
        return NULL;
    return real(json, flags);
}
