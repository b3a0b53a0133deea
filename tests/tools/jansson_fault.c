/*
 * jansson_fault.c -- an LD_PRELOAD library for the integration tests: jansson
 * runs out of memory in parley-host where a test says.
 *   PARLEY_FAULT_DUMPS_SEQ=N   json_dump_callback (what parley-host writes its
 *                              lines with) fails for the object whose "seq" member
 *                              is N (parley-host's answer to input line N);
 *   PARLEY_FAULT_LOADB_MARK=S  json_loadb of a text holding S runs with every
 *                              allocation of jansson's failing (the parse of an
 *                              input line that holds S).
 * Every other call goes through.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef int (*dump_callback_fn)(const json_t *, json_dump_callback_t, void *, size_t);
typedef json_t *(*loadb_fn)(const char *, size_t, size_t, json_error_t *);

int json_dump_callback(const json_t *json, json_dump_callback_t callback, void *data, size_t flags)
{
    dump_callback_fn real = (dump_callback_fn)dlsym(RTLD_NEXT, "json_dump_callback");
    const char *seq = getenv("PARLEY_FAULT_DUMPS_SEQ");
    json_t *s = json_is_object(json) ? json_object_get(json, "seq") : NULL;
    if (seq && json_is_integer(s) && json_integer_value(s) == atoll(seq))
        return -1;
    return real(json, callback, data, flags);
}

static void *no_memory(size_t n)
{
    (void)n;
    return NULL;
}

json_t *json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    loadb_fn real = (loadb_fn)dlsym(RTLD_NEXT, "json_loadb");
    const char *mark = getenv("PARLEY_FAULT_LOADB_MARK");
    if (!mark || !buffer || !memmem(buffer, buflen, mark, strlen(mark)))
        return real(buffer, buflen, flags, error);
    json_set_alloc_funcs(no_memory, free);
    json_t *v = real(buffer, buflen, flags, error);
    json_set_alloc_funcs(malloc, free);
    return v;
}
