/* store.c -- choosing a backend from the history_store option (see store.h). */
#include "store/store.h"

#include <string.h>

const store_backend *store_backend_for(const char *spec, const char **location)
{
    static const store_backend *const backends[] = {&store_memory_backend, &store_sqlite_backend,
                                                      &store_redis_backend};
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        const char *scheme = backends[i]->scheme;
        size_t n = strlen(scheme);
        if (strcmp(spec, scheme) == 0) {
            *location = spec + n;
            return backends[i];
        }
        if (strncmp(spec, scheme, n) == 0 && spec[n] == ':') {
            *location = spec + n + 1;
            return backends[i];
        }
    }
    return NULL;
}
