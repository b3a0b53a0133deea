/*
 * json_oom.h -- jansson out of memory, told and not hidden.
 *
 * Loads: jansson tags most of its allocation failures json_error_out_of_memory,
 * but when the first one, its lexer's buffer, fails it returns NULL having set
 * nothing: the error's text stays "" (jsonp_error_init) and its code byte is
 * never written (jansson 2.14), so json_error_code() alone reads an
 * uninitialised byte there.  Every other failure sets a text, so an empty one
 * means that allocation.
 *
 * Dumps: jansson 2.14 ignores a failed write of an object's key (do_dump drops
 * dump_string's result) and goes on, so out of memory json_dumps can return
 * text with a key missing -- JSON that is not the value, or not JSON at all.
 * json_dumps_whole writes through its own callback and returns NULL when any
 * write failed.
 */
#ifndef PARLEY_JSON_OOM_H
#define PARLEY_JSON_OOM_H

#include <jansson.h>

/* For a load that returned NULL with *e as its error. */
static inline int json_load_oom(const json_error_t *e)
{
    return e->text[0] == '\0' || json_error_code(e) == json_error_out_of_memory;
}

/* The same, and also when jansson called a failed allocation a syntax error (its lexer
 * does): text (len bytes) that jansson found "invalid syntax" but that is a valid JSON
 * object or array (json_scan.h's checks) failed for want of memory.  (A scalar is not: a
 * load without JSON_DECODE_ANY refuses one as a syntax error.) */
int json_load_oom_text(const json_error_t *e, const char *text, size_t len);

/* json_dumps(json, flags), or NULL (out of memory) rather than text with a part missing. */
char *json_dumps_whole(const json_t *json, size_t flags);

#endif
