/*
 * json_oom.h -- whether a jansson load (json_loads, json_loadb) failed for want
 * of memory, so that the caller answers no_memory and not "not JSON".
 *
 * jansson tags most of its allocation failures json_error_out_of_memory, but when
 * the first one, its lexer's buffer, fails it returns NULL having set nothing:
 * the error's text stays "" (jsonp_error_init) and its code byte is never written
 * (jansson 2.14), so json_error_code() alone reads an uninitialised byte there.
 * Every other failure sets a text, so an empty one means that allocation.
 */
#ifndef PARLEY_JSON_OOM_H
#define PARLEY_JSON_OOM_H

#include <jansson.h>

/* For a load that returned NULL with *e as its error. */
static inline int json_load_oom(const json_error_t *e)
{
    return e->text[0] == '\0' || json_error_code(e) == json_error_out_of_memory;
}

#endif
