/*
 * reply_diff.h -- the whole-reply decoders against each other on one body:
 * llm_reply_decode (the fast path, jansson behind it) must give what the
 * jansson decoder alone gives -- the same success or failure, every field of
 * the llm_reply, the same error text -- and whenever the fast decoder takes
 * a body on its own, jansson must decode it identically.
 * Header-only like check.h (include check.h first).
 */
#ifndef PARLEY_TEST_REPLY_DIFF_H
#define PARLEY_TEST_REPLY_DIFF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_reply.h"

static int reply_diff_str_equal(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* The first field in which a and b differ, or NULL when they are identical. */
static const char *reply_diff_field(const llm_reply *a, const llm_reply *b)
{
    if (!reply_diff_str_equal(a->content, b->content))
        return "content";
    if (!reply_diff_str_equal(a->finish_reason, b->finish_reason))
        return "finish_reason";
    if (!reply_diff_str_equal(a->reasoning, b->reasoning))
        return "reasoning";
    if (!reply_diff_str_equal(a->provider_data, b->provider_data))
        return "provider_data";
    if (a->usage.prompt != b->usage.prompt || a->usage.completion != b->usage.completion ||
        a->usage.cache_read != b->usage.cache_read ||
        a->usage.cache_creation != b->usage.cache_creation ||
        a->usage.reasoning != b->usage.reasoning)
        return "usage";
    if (a->ids_minted != b->ids_minted)
        return "ids_minted";
    if (a->ncalls != b->ncalls || (a->calls == NULL) != (b->calls == NULL))
        return "ncalls";
    for (size_t i = 0; i < a->ncalls; i++) {
        if (!reply_diff_str_equal(a->calls[i].id, b->calls[i].id))
            return "calls[].id";
        if (!reply_diff_str_equal(a->calls[i].name, b->calls[i].name))
            return "calls[].name";
        if (!reply_diff_str_equal(a->calls[i].arguments, b->calls[i].arguments))
            return "calls[].arguments";
    }
    return NULL;
}

static void reply_diff_show(const char *body, size_t len)
{
    fprintf(stderr, "  body (%zu bytes): ", len);
    for (size_t i = 0; i < len && i < 600; i++) {
        unsigned char c = (unsigned char)body[i];
        if (c >= 0x20 && c < 0x7F)
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fputc('\n', stderr);
}

enum { REPLY_DIFF_ANY = -1, REPLY_DIFF_JANSSON = 0, REPLY_DIFF_FAST = 1 };

/*
 * Decode `body` both ways and CHECK that they agree.  `path` says which
 * decoder must take it: REPLY_DIFF_FAST (the fast path must decode it),
 * REPLY_DIFF_JANSSON (it must say "not mine"), REPLY_DIFF_ANY.  Returns 1
 * when the fast path took it.
 */
static int reply_diff(const char *body, size_t len, int path)
{
    llm_reply authority, combined, fast;
    char *authority_err = NULL, *combined_err = NULL;
    int authority_rc = llm_reply_decode_jansson(body, len, &authority, &authority_err);
    int combined_rc = llm_reply_decode(body, len, &combined, &combined_err);
    int fast_took = llm_reply_decode_fast(body, len, &fast);

    const char *what = NULL;
    if (combined_rc != authority_rc)
        what = "success/failure";
    else if (!reply_diff_str_equal(combined_err, authority_err))
        what = "error text";
    else if ((what = reply_diff_field(&combined, &authority)) != NULL)
        ;
    else if (fast_took && authority_rc != 0)
        what = "fast path took a body jansson refuses";
    else if (fast_took && (what = reply_diff_field(&fast, &authority)) != NULL)
        ;
    else if (!fast_took && (fast.content || fast.calls || fast.finish_reason || fast.reasoning))
        what = "fast path left a reply behind after \"not mine\"";
    else if (path == REPLY_DIFF_FAST && !fast_took)
        what = "the fast path did not take it";
    else if (path == REPLY_DIFF_JANSSON && fast_took)
        what = "the fast path took it";
    CHECK(what == NULL);
    if (what) {
        fprintf(stderr, "  decoders differ in %s (jansson rc %d: %s)\n", what, authority_rc,
                authority_err ? authority_err : "-");
        reply_diff_show(body, len);
    }
    llm_reply_free(&authority);
    llm_reply_free(&combined);
    llm_reply_free(&fast);
    free(authority_err);
    free(combined_err);
    return fast_took;
}

#endif
