/* store.c -- choosing a backend from the history_store option, and the door every
 * caller outside store/ goes through (see store.h, "The door"). */
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
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

/* ---- the door ------------------------------------------------------------ */

/* The first required method a table lacks, or NULL. */
static const char *missing_method(const store_backend *b)
{
#define REQUIRE(m)  \
    if (!b->m)      \
        return #m;
    REQUIRE(open) REQUIRE(close) REQUIRE(load) REQUIRE(append) REQUIRE(get_conversation)
    REQUIRE(get_turn) REQUIRE(list) REQUIRE(forget) REQUIRE(expire) REQUIRE(stats)
    REQUIRE(query) REQUIRE(get_message) REQUIRE(set_interface_message_id)
    REQUIRE(find_message) REQUIRE(load_turn) REQUIRE(context_get) REQUIRE(context_set) REQUIRE(load_sized)
#undef REQUIRE
    if (!b->lease_acquire != !b->lease_release)
        return b->lease_acquire ? "lease_release" : "lease_acquire";
    return NULL;
}

static parley_status bad_table(const store_backend *b, const char *what, char **err)
{
    if (err) {
        size_t n = strlen(b->scheme) + strlen(what) + 64;
        if ((*err = malloc(n)))
            snprintf(*err, n, "%s store backend: %s", b->scheme, what);
    }
    return PARLEY_ERR_STORAGE;
}

parley_status store_open(const store_backend *b, const store_config *cfg, store **out, char **err)
{
    *out = NULL;
    if (b->version != STORE_BACKEND_VERSION)
        return bad_table(b, "built for another version of the store interface", err);
    const char *missing = missing_method(b);
    if (missing) {
        char what[64];
        snprintf(what, sizeof what, "no %s method", missing);
        return bad_table(b, what, err);
    }
    return b->open(cfg, out, err);
}

void store_close(store *s)
{
    if (s)
        s->backend->close(s);
}

const char *store_scheme(const store *s) { return s->backend->scheme; }
int store_blocking(const store *s) { return s->backend->blocking; }
int store_shared(const store *s) { return s->backend->lease_acquire != NULL; }

parley_status store_load(store *s, const store_key *key, size_t last_turns, uint64_t now_ms,
                         pbuf *out, size_t *nmessages, char **err)
{
    return s->backend->load(s, key, last_turns, now_ms, out, nmessages, err);
}

parley_status store_load_sized(store *s, const store_key *key, size_t last_turns,
                               uint64_t now_ms, pbuf *out, size_t *nmessages, store_sizes *sizes,
                               char **err)
{
    return s->backend->load_sized(s, key, last_turns, now_ms, out, nmessages, sizes, err);
}

void store_sizes_add(store_sizes *z, uint32_t nmessages, uint32_t tokens)
{
    if (z->oom)
        return;
    if (z->n == z->cap) {
        size_t cap = z->cap ? 2 * z->cap : 16;
        store_turn_size *turn = realloc(z->turn, cap * sizeof *turn);
        if (!turn) {
            z->oom = 1;
            return;
        }
        z->turn = turn;
        z->cap = cap;
    }
    z->turn[z->n++] = (store_turn_size){nmessages, tokens};
}

parley_status store_context_get(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                store_lifetime *life, char **err)
{
    return s->backend->context_get(s, key, now_ms, out, life, err);
}

parley_status store_context_set(store *s, const store_key *key, const char *json, size_t len,
                                const char *expected, size_t expected_len, uint64_t now_ms,
                                char **err)
{
    return s->backend->context_set(s, key, json, len, expected, expected_len, now_ms, err);
}

parley_status store_append(store *s, const store_key *key, const store_turn *turn,
                           uint64_t now_ms, char **err)
{
    return s->backend->append(s, key, turn, now_ms, err);
}

parley_status store_get_conversation(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                     char **err)
{
    return s->backend->get_conversation(s, key, now_ms, out, err);
}

parley_status store_get_turn(store *s, const char *turn_id, uint64_t now_ms, pbuf *out,
                             char **err)
{
    return s->backend->get_turn(s, turn_id, now_ms, out, err);
}

parley_status store_list(store *s, uint64_t now_ms, pbuf *out, char **err)
{
    return s->backend->list(s, now_ms, out, err);
}

parley_status store_forget(store *s, const store_key *key, char **err)
{
    return s->backend->forget(s, key, err);
}

parley_status store_expire(store *s, uint64_t now_ms, size_t *expired, char **err)
{
    return s->backend->expire(s, now_ms, expired, err);
}

parley_status store_stats_get(store *s, store_stats *out, char **err)
{
    return s->backend->stats(s, out, err);
}

parley_status store_lease_acquire(store *s, const store_key *key, uint64_t *retry_ms,
                                  char **err)
{
    return s->backend->lease_acquire ? s->backend->lease_acquire(s, key, retry_ms, err)
                                     : PARLEY_OK;
}

void store_lease_release(store *s, const store_key *key)
{
    if (s->backend->lease_release)
        s->backend->lease_release(s, key);
}

parley_status store_query_run(store *s, const store_query *q, uint64_t now_ms, pbuf *out,
                          size_t *count, uint64_t *last, int *more, char **err)
{
    return s->backend->query(s, q, now_ms, out, count, last, more, err);
}

parley_status store_get_message(store *s, const char *message_id, uint64_t now_ms, pbuf *out,
                                char **err)
{
    return s->backend->get_message(s, message_id, now_ms, out, err);
}

parley_status store_set_interface_message_id(store *s, const char *turn_id,
                                             const char *interface_message_id, uint64_t now_ms,
                                             char *message_id, char **err)
{
    return s->backend->set_interface_message_id(s, turn_id, interface_message_id, now_ms,
                                                message_id, err);
}

parley_status store_find_message(store *s, const store_key *key,
                                 const char *interface_message_id, uint64_t now_ms, pbuf *out,
                                 char **err)
{
    return s->backend->find_message(s, key, interface_message_id, now_ms, out, err);
}

parley_status store_load_turn(store *s, const store_key *key, const char *turn_id,
                              const char *interface_message_id, size_t window_turns,
                              uint64_t now_ms, pbuf *out, size_t *nmessages, char *turn_id_out,
                              int *in_window, char **err)
{
    return s->backend->load_turn(s, key, turn_id, interface_message_id, window_turns, now_ms,
                                 out, nmessages, turn_id_out, in_window, err);
}
