/* json_keys.c -- see json_keys.h. */
#include "lib/json_keys.h"

#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/utf8.h"

static int is_known(const char *key, const char *const known[])
{
    for (size_t i = 0; known[i]; i++)
        if (strcmp(known[i], key) == 0)
            return 1;
    return 0;
}

/* `what: unknown key "key" (expected a, b)`, malloc'd, or NULL out of memory. */
static char *unknown_key_message(const char *key, const char *const known[], const char *what)
{
    char *q = utf8_quotable(key, strlen(key), JSON_KEYS_QUOTE_MAX);
    pbuf b = PBUF_INIT;
    if (what)
        pbuf_printf(&b, "%s: ", what);
    pbuf_printf(&b, "unknown key \"%s\" (expected ", q ? q : "");
    for (size_t i = 0; known[i]; i++)
        pbuf_printf(&b, "%s%s", i ? ", " : "", known[i]);
    pbuf_putc(&b, ')');
    char *message = q && !b.oom ? pbuf_take(&b) : NULL;
    pbuf_free(&b);
    free(q);
    return message;
}

parley_status json_keys_check(const json_t *obj, const char *const known[], const char *what,
                              char **err)
{
    const char *key;
    json_t *v;
    *err = NULL;
    json_object_foreach((json_t *)obj, key, v) {
        if (is_known(key, known))
            continue;
        *err = unknown_key_message(key, known, what);
        return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
    }
    return PARLEY_OK;
}
