/* query.c -- see query.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* timegm */
#endif
#include "api/query.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/buf.h"
#include "lib/json_keys.h"
#include "lib/rfc3339.h"

/* FNV-1a over every filter and the order: what makes two queries the same one. */
static uint64_t fingerprint(const store_query *q)
{
    uint64_t h = 1469598103934665603ull;
    const char *strings[] = {q->conversation_id, q->persona, q->interface_type, q->role,
                             q->search, q->turn_id, q->interface_message_id};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        const char *s = strings[i] ? strings[i] : "";
        h = (h ^ (strings[i] ? 1u : 2u)) * 1099511628211ull; /* NULL differs from "" */
        for (; *s; s++)
            h = (h ^ (unsigned char)*s) * 1099511628211ull;
        h = (h ^ 0x1f) * 1099511628211ull;
    }
    uint64_t numbers[] = {q->since_ms, q->until_ms, (uint64_t)q->newest_first};
    for (size_t i = 0; i < 3; i++)
        for (int b = 0; b < 8; b++)
            h = (h ^ ((numbers[i] >> (8 * b)) & 0xff)) * 1099511628211ull;
    return h;
}

char *query_cursor(const store_query *q, uint64_t last)
{
    return pstr_printf("c1.%016" PRIx64 ".%" PRIx64, fingerprint(q), last);
}

/* Up to `max` lowercase hex digits at *p into *v (*p moves past them): how many were read. */
static size_t hex_digits(const char **p, size_t max, uint64_t *v)
{
    size_t n = 0;
    *v = 0;
    for (const char *s = *p; n < max; n++, s++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0)
            break;
        *v = *v << 4 | (uint64_t)d;
    }
    *p += n;
    return n;
}

/*
 * The position a cursor continues from; -1 if it is no cursor of this query.  Only the
 * exact text query_cursor writes is one: "c1.", 16 lowercase hex digits, ".", the position
 * in lowercase hex without leading zeros, 1 .. 2^63 - 1 (a store's row numbers).  A forged
 * variant ("+5", "0x5", upper case, 17 digits, 2^63) would otherwise read differently on
 * different stores.
 */
static int cursor_position(const store_query *q, const char *cursor, uint64_t *after)
{
    uint64_t fp, pos;
    const char *p = cursor;
    if (strncmp(p, "c1.", 3) != 0)
        return -1;
    p += 3;
    if (hex_digits(&p, 16, &fp) != 16 || *p++ != '.' || *p == '0' ||
        hex_digits(&p, 16, &pos) == 0 || *p || pos > INT64_MAX || fp != fingerprint(q))
        return -1;
    *after = pos;
    return 0;
}

static parley_status refuse(query_request *r, const char **field, char **err, const char *name,
                            const char *why)
{
    *field = name;
    *err = pstr_printf("%s: %s", name, why);
    query_request_free(r);
    return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY; /* no message: no memory */
}

/* 1 (and *out set) when v is a string of at most max bytes without NUL (non-empty when
 * nonempty); a predicate, as selector_valid_string: the caller words the refusal. */
static int string_member(json_t *v, size_t max, int nonempty, const char **out)
{
    if (!json_is_string(v) || json_string_length(v) > max ||
        (nonempty && json_string_length(v) == 0) || strlen(json_string_value(v)) != json_string_length(v))
        return 0;
    *out = json_string_value(v);
    return 1;
}

/* v's text when it is a string without NUL, else NULL: the root is read with JSON_ALLOW_NUL
 * (string_member refuses a NUL in what it reads), and "user\u0000x" is no role, as
 * "2026-11-22T19:31:00Z\u0000x" is no time. */
static const char *whole_string(const json_t *v)
{
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

parley_status query_parse(const char *json, query_request *r, const char **field, char **err)
{
    memset(r, 0, sizeof *r);
    r->q.until_ms = UINT64_MAX;
    r->q.limit = QUERY_DEFAULT_LIMIT;
    r->q.newest_first = 1;
    json_error_t jerr;
    r->root = json ? json_loads(json, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr) : json_object();
    if (!json_is_object(r->root))
        return refuse(r, field, err, "query", "must be a JSON object");
    static const char *const known[] = {"conversation_id", "interface_type", "persona", "role",
                                        "since", "until", "search", "limit", "order", "cursor",
                                        "turn_id", "interface_message_id", NULL};
    parley_status st = json_keys_check(r->root, known, "query", err);
    if (st != PARLEY_OK) {
        *field = "query";
        query_request_free(r);
        return st;
    }
    const char *key, *cursor = NULL;
    json_t *v;
    json_object_foreach(r->root, key, v) {
        if (strcmp(key, "conversation_id") == 0) {
            if (!string_member(v, STORE_MAX_CONVERSATION_ID, 1, &r->q.conversation_id))
                return refuse(r, field, err, "conversation_id", "must be a string of 1 to 256 bytes");
        } else if (strcmp(key, "interface_type") == 0 || strcmp(key, "persona") == 0) {
            const char **dst = key[0] == 'i' ? &r->q.interface_type : &r->q.persona;
            if (!string_member(v, STORE_MAX_CONVERSATION_ID, 0, dst))
                return refuse(r, field, err, key[0] == 'i' ? "interface_type" : "persona",
                              "must be a string of at most 256 bytes");
        } else if (strcmp(key, "role") == 0) {
            const char *role = whole_string(v);
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                          strcmp(role, "tool") && strcmp(role, "system")))
                return refuse(r, field, err, "role", "must be user, assistant, tool or system");
            r->q.role = role;
        } else if (strcmp(key, "since") == 0 || strcmp(key, "until") == 0) {
            uint64_t *dst = key[0] == 's' ? &r->q.since_ms : &r->q.until_ms;
            if (rfc3339_parse(whole_string(v), dst) != 0)
                return refuse(r, field, err, key[0] == 's' ? "since" : "until",
                              "must be an RFC 3339 time, e.g. \"2026-11-22T19:31:00Z\"");
        } else if (strcmp(key, "turn_id") == 0 || strcmp(key, "interface_message_id") == 0) {
            int turn = key[0] == 't';
            if (!string_member(v, turn ? STORE_ID_LEN : STORE_MAX_INTERFACE_MESSAGE_ID, 1,
                              turn ? &r->q.turn_id : &r->q.interface_message_id))
                return refuse(r, field, err, turn ? "turn_id" : "interface_message_id",
                              turn ? "must be a turn id (a UUID string)"
                                   : "must be a string of 1 to 256 bytes");
        } else if (strcmp(key, "search") == 0) {
            if (!string_member(v, QUERY_MAX_SEARCH, 0, &r->q.search))
                return refuse(r, field, err, "search", "must be a string of at most 1024 bytes");
        } else if (strcmp(key, "limit") == 0) {
            json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;
            if (n < 1 || n > STORE_QUERY_MAX_LIMIT)
                return refuse(r, field, err, "limit", "must be an integer from 1 to 10000");
            r->q.limit = (size_t)n;
        } else if (strcmp(key, "order") == 0) {
            const char *order = whole_string(v);
            if (!order || (strcmp(order, "newest") && strcmp(order, "oldest")))
                return refuse(r, field, err, "order", "must be \"newest\" or \"oldest\"");
            r->q.newest_first = strcmp(order, "newest") == 0;
        } else if (strcmp(key, "cursor") == 0) {
            if (!json_is_null(v) && !(cursor = whole_string(v)))
                return refuse(r, field, err, "cursor", "must be a string from next_cursor");
        }
    }
    if (r->q.since_ms > r->q.until_ms)
        return refuse(r, field, err, "since", "is after until");
    if (cursor && cursor_position(&r->q, cursor, &r->q.after) != 0)
        return refuse(r, field, err, "cursor", "does not belong to this query (or is not a cursor)");
    return PARLEY_OK;
}

void query_request_free(query_request *r)
{
    json_decref(r->root);
    r->root = NULL;
}
