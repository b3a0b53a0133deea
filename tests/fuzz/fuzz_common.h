/*
 * fuzz_common.h -- checks the llm_reply fuzz targets share (fuzz_check.h:
 * FUZZ_CHECK and fuzz_str_equal).
 */
#ifndef PARLEY_FUZZ_COMMON_H
#define PARLEY_FUZZ_COMMON_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "provider/llm_reply.h"


static inline int fuzz_replies_equal(const llm_reply *a, const llm_reply *b)
{
    if (!fuzz_str_equal(a->content, b->content) ||
        !fuzz_str_equal(a->finish_reason, b->finish_reason) || a->ncalls != b->ncalls)
        return 0;
    for (size_t i = 0; i < a->ncalls; i++)
        if (!fuzz_str_equal(a->calls[i].id, b->calls[i].id) ||
            !fuzz_str_equal(a->calls[i].name, b->calls[i].name) ||
            !fuzz_str_equal(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

/* Every field alike, reasoning, provider data, usage and ids_minted included. */
static inline int fuzz_replies_identical(const llm_reply *a, const llm_reply *b)
{
    return fuzz_replies_equal(a, b) && fuzz_str_equal(a->reasoning, b->reasoning) &&
           fuzz_str_equal(a->provider_data, b->provider_data) &&
           memcmp(&a->usage, &b->usage, sizeof a->usage) == 0 &&
           a->ids_minted == b->ids_minted && (a->calls == NULL) == (b->calls == NULL);
}

/* What the header promises about a decoded reply. */
static inline void fuzz_check_reply(const llm_reply *r)
{
    FUZZ_CHECK(r->content || r->ncalls > 0);
    FUZZ_CHECK((r->calls != NULL) == (r->ncalls > 0));
    for (size_t i = 0; i < r->ncalls; i++) {
        FUZZ_CHECK(r->calls[i].id && r->calls[i].id[0]);
        FUZZ_CHECK(r->calls[i].name);
        FUZZ_CHECK(r->calls[i].arguments && r->calls[i].arguments[0]);
    }
}

/* Messages carry server text: it must be valid UTF-8 (jansson would refuse
   it in a JSON string otherwise) without ASCII control characters. */
static inline void fuzz_check_message(const char *msg)
{
    if (!msg) /* only when out of memory */
        return;
    const unsigned char *s = (const unsigned char *)msg;
    for (size_t i = 0; s[i]; i++)
        FUZZ_CHECK(s[i] >= 0x20 && s[i] != 0x7F);
    json_t *as_json = json_string(msg);
    FUZZ_CHECK(as_json != NULL);
    json_decref(as_json);
}

#endif
