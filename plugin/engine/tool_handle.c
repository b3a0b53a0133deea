/* tool_handle.c -- see tool_handle.h. */
#include "engine/tool_handle.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/inbox.h"
#include "lib/dict.h"

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static dict *registry;      /* id text -> handle; NULL while empty (valgrind sees no leak) */
static uint64_t next_id = 1; /* under registry_mu; 0 is never used (it would be NULL) */

static const char *handle_key(const void *e) { return ((const parley_tool_call *)e)->key; }

parley_tool_call *tool_handle_register(parley_tool_call *h)
{
    pthread_mutex_lock(&registry_mu);
    if (!registry)
        registry = dict_new(handle_key);
    uint64_t id = next_id;
    snprintf(h->key, sizeof h->key, "%llu", (unsigned long long)id);
    int ok = registry && dict_add(registry, h) == 0;
    if (ok)
        next_id++;
    pthread_mutex_unlock(&registry_mu);
    return ok ? (parley_tool_call *)(uintptr_t)id : NULL;
}

parley_tool_call *tool_handle_take(parley_tool_call *public_value)
{
    char key[24];
    snprintf(key, sizeof key, "%llu", (unsigned long long)(uintptr_t)public_value);
    pthread_mutex_lock(&registry_mu);
    parley_tool_call *h = registry ? dict_remove(registry, key) : NULL;
    if (registry && dict_size(registry) == 0) {
        dict_free(registry);
        registry = NULL;
    }
    pthread_mutex_unlock(&registry_mu);
    return h;
}
