/*
 * fuzz_options.c -- the options parser and the tools validator on arbitrary
 * text: whatever the host passes to create() must give an agent's options or
 * a clear error naming an option, never a crash or a leak.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/options.h"
#include "store/store.h"
#include "config/toolset.h"

/* options.c checks history_store's scheme with store_backend_for (store.c):
 * the parser needs the backends' scheme names only, not their code. */
const store_backend store_memory_backend = {.scheme = "memory"};
const store_backend store_sqlite_backend = {.scheme = "sqlite"};
const store_backend store_redis_backend = {.scheme = "redis"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    parley_options o;
    char *err = NULL;
    if (options_parse(text, &o, &err) == 0) {
        if (err)
            abort(); /* success never comes with an error */
        toolset *t = NULL;
        if ((toolset_parse(o.tools_json, NULL, &t, &err) == PARLEY_OK) != !!t || !t == !err)
            abort(); /* exactly one of a toolset and an error */
        toolset_free(t);
        free(err);
        options_free(&o);
    } else {
        /* Every failure explains itself, naming an option or the JSON problem. */
        if (!err || (!strstr(err, "option '") && !strstr(err, "options")))
            abort();
        free(err);
    }
    /* The same text as a per-turn tools array. */
    err = NULL;
    toolset *t = NULL;
    if ((toolset_parse(text, NULL, &t, &err) == PARLEY_OK) != !!t || !t == !err)
        abort();
    toolset_free(t);
    free(err);
    free(text);
    return 0;
}
