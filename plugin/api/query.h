/*
 * query.h -- the JSON a host passes to history_query, read into a
 * store_query, and the cursor that pages through its results.
 *
 * A cursor is opaque to the host: "c1.<fingerprint>.<position>", where the
 * fingerprint hashes every filter and the order, so a cursor given to a
 * different query is refused instead of silently skipping messages.
 */
#ifndef PARLEY_QUERY_H
#define PARLEY_QUERY_H

#include <jansson.h>

#include "lib/plugin_status.h"
#include "store/store.h"

#define QUERY_DEFAULT_LIMIT 100
#define QUERY_MAX_SEARCH 1024 /* bytes of search text */

typedef struct query_request {
    store_query q;
    json_t *root; /* owns the strings q points into */
} query_request;

/* Read `json` into *r.  PARLEY_ERR_INVALID_INPUT with *field (static) naming
 * the offending key and *err (malloc'd) saying why; then *r holds nothing. */
parley_status query_parse(const char *json, query_request *r, const char **field, char **err);
void query_request_free(query_request *r);

/* The cursor continuing r's query after position `last` (malloc'd; NULL on OOM). */
char *query_cursor(const store_query *q, uint64_t last);

#endif
