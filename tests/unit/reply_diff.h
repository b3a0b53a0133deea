/*
 * reply_diff.h -- the whole-reply decoders against each other on one body:
 * llm_reply_decode (the fast path, jansson behind it) must give what the
 * jansson decoder alone gives -- the same success or failure, every field of
 * the llm_reply, the same error text -- and whenever the fast decoder takes
 * a body on its own, jansson must decode it identically.  The same for a
 * stream with and without its chunk fast path (stream_diff).
 * Header-only like check.h (include check.h first).
 */
#ifndef PARLEY_TEST_REPLY_DIFF_H
#define PARLEY_TEST_REPLY_DIFF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "provider/openai_decode.h"

static inline int reply_diff_str_equal(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* The first field in which a and b differ, or NULL when they are identical. */
static inline const char *reply_diff_field(const llm_reply *a, const llm_reply *b)
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
        a->usage.reasoning != b->usage.reasoning || a->usage.evaluated != b->usage.evaluated ||
        a->usage.timings_cached != b->usage.timings_cached)
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

static inline void reply_diff_show(const char *body, size_t len)
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
static inline int reply_diff(const char *body, size_t len, int path)
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

/* ---- streams: a stream with the chunk fast path against one without ---- */

typedef struct stream_diff_run {
    int rc;         /* 0, or -1 from the first feed or finish that failed */
    llm_reply reply;
    char *err;
    pbuf calls;     /* every callback, in order: "t<len>:<text>" or "r<len>:<text>" */
    size_t fast_chunks;
} stream_diff_run;

static inline void stream_diff_on_text(void *ud, const char *text, size_t len)
{
    pbuf_printf(ud, "t%zu:", len);
    pbuf_append(ud, text, len);
}

static inline void stream_diff_on_reasoning(void *ud, const char *text, size_t len)
{
    pbuf_printf(ud, "r%zu:", len);
    pbuf_append(ud, text, len);
}

/* Feed body in pieces of `piece` bytes (0: whole), then finish. */
static inline stream_diff_run stream_diff_run_one(const char *body, size_t len, size_t piece, int fast)
{
    stream_diff_run run = {0, {0}, NULL, PBUF_INIT, 0};
    llm_sink sink = {stream_diff_on_text, stream_diff_on_reasoning, &run.calls};
    llm_stream *s = llm_stream_new_sink(&sink);
    if (!fast)
        llm_stream_disable_fast_path(s);
    size_t step = piece ? piece : (len ? len : 1);
    for (size_t off = 0; off < len && run.rc == 0; off += step)
        run.rc = llm_stream_feed(s, body + off, len - off < step ? len - off : step, &run.err);
    if (run.rc == 0)
        run.rc = llm_stream_finish(s, &run.reply, &run.err);
    run.fast_chunks = llm_stream_fast_chunks(s);
    llm_stream_free(s);
    return run;
}

/*
 * Stream `body` with and without the chunk fast path and CHECK that nothing
 * differs: each outcome, the error text, the reply, and every callback with
 * its text.  Returns how many chunks the fast path applied.
 */
static inline size_t stream_diff(const char *body, size_t len, size_t piece)
{
    stream_diff_run fast = stream_diff_run_one(body, len, piece, 1);
    stream_diff_run authority = stream_diff_run_one(body, len, piece, 0);
    const char *what = NULL;
    if (fast.rc != authority.rc)
        what = "success/failure";
    else if (!reply_diff_str_equal(fast.err, authority.err))
        what = "error text";
    else if ((what = reply_diff_field(&fast.reply, &authority.reply)) != NULL)
        ;
    else if (fast.calls.len != authority.calls.len ||
             (fast.calls.len && memcmp(fast.calls.data, authority.calls.data, fast.calls.len)))
        what = "callbacks";
    else if (authority.fast_chunks != 0)
        what = "llm_stream_disable_fast_path";
    CHECK(what == NULL);
    if (what) {
        fprintf(stderr, "  streams differ in %s (jansson rc %d: %s)\n", what, authority.rc,
                authority.err ? authority.err : "-");
        reply_diff_show(body, len);
    }
    size_t taken = fast.fast_chunks;
    stream_diff_run *runs[] = {&fast, &authority};
    for (size_t i = 0; i < 2; i++) {
        llm_reply_free(&runs[i]->reply);
        free(runs[i]->err);
        pbuf_free(&runs[i]->calls);
    }
    return taken;
}

#endif
