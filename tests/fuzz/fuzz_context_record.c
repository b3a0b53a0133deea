/*
 * fuzz_context_record.c -- the stored context record (context/window.h) read
 * from any bytes.
 *
 * A store file is untrusted.  The record has two readers: a fast one for the
 * form record_put writes without summaries, and jansson's for the rest.  What
 * the fast one accepts, jansson must read alike; what it refuses leaves the
 * record untouched; bytes that are not a JSON object give an empty record;
 * every field read is whole (a summary is a non-empty string with what it
 * covers, a prefix has its length and a 16-digit hash), what history_get
 * shows of it is JSON, and nothing leaks.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context/window.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int records_equal(const ctx_record *a, const ctx_record *b)
{
    return a->start == b->start && fuzz_str_equal(a->summary, b->summary) && a->upto == b->upto &&
           fuzz_str_equal(a->next, b->next) && a->next_upto == b->next_upto &&
           a->last_prompt == b->last_prompt && a->last_bytes == b->last_bytes &&
           a->prefix_len == b->prefix_len && a->prefix_hash == b->prefix_hash;
}

static void record_free(ctx_record *r)
{
    free(r->summary);
    free(r->next);
}

/* A JSON integer that fits what the record holds, or absent (-1). */
static long long json_nonneg(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

/* Each field of r came whole from the JSON object root (or is 0). */
static void check_fields(const ctx_record *r, json_t *root)
{
    static const ctx_record zero;
    if (!json_is_object(root)) {
        FUZZ_CHECK(records_equal(r, &zero));
        return;
    }
    long long start = json_nonneg(root, "start");
    FUZZ_CHECK(r->start == (start < 0 ? 0 : (uint64_t)start));
    FUZZ_CHECK(!r->summary || (r->summary[0] && json_nonneg(root, "upto") == (long long)r->upto));
    FUZZ_CHECK(r->summary || !r->upto);
    FUZZ_CHECK(!r->next ||
               (r->next[0] && json_nonneg(root, "next_upto") == (long long)r->next_upto));
    FUZZ_CHECK(r->next || !r->next_upto);
    if (r->last_prompt || r->last_bytes)
        FUZZ_CHECK(json_nonneg(root, "lp") == (long long)r->last_prompt &&
                   json_nonneg(root, "lb") == (long long)r->last_bytes);
    if (r->prefix_hash || r->prefix_len) {
        const char *h = json_string_value(json_object_get(root, "phash"));
        FUZZ_CHECK(json_nonneg(root, "plen") == (long long)r->prefix_len);
        FUZZ_CHECK(h && strlen(h) == 16 && strspn(h, "0123456789abcdefABCDEF") == 16);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *json = (const char *)data;
    ctx_record fast, slow, both;
    memset(&fast, 0xa5, sizeof fast);
    ctx_record before = fast;
    int plain = ctx_record_parse_plain(json, size, &fast);
    ctx_record_parse_json(json, size, &slow);
    ctx_record_parse(json, size, &both);
    if (plain) {
        FUZZ_CHECK(!fast.summary && !fast.next);
        FUZZ_CHECK(records_equal(&fast, &slow));
    } else {
        FUZZ_CHECK(memcmp(&fast, &before, sizeof fast) == 0); /* untouched, not half-filled */
    }
    FUZZ_CHECK(records_equal(&both, &slow));
    json_t *root = json_loadb(json, size, 0, NULL);
    check_fields(&slow, root);
    json_decref(root);
    pbuf shown = PBUF_INIT; /* what history_get shows of it: JSON, whatever was stored */
    ctx_describe(json, size, &shown);
    json_t *described = json_loadb(shown.data, shown.len, 0, NULL);
    FUZZ_CHECK(json_is_object(described) && json_object_size(described) == 3);
    json_decref(described);
    pbuf_free(&shown);
    record_free(&slow);
    record_free(&both);
    return 0;
}
