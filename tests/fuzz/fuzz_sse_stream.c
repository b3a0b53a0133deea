/*
 * fuzz_sse_stream.c -- llm_stream fed in pieces, then finished.
 *
 * Input layout: byte 0's low 3 bits give k (1..8); bytes 1..k are piece
 * sizes, used in turn (0 means "all the rest"); the remaining bytes are the
 * HTTP body.  Beyond "no crash, no leak", the outcome must not depend on how
 * the body was split: the same reply (or the same error) as when it is fed
 * whole, and on_text must have seen exactly the reply's content.  And the
 * chunk fast path may change nothing: the stream decoded by jansson alone
 * (llm_stream_disable_fast_path) gives the same outcome and callbacks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "fuzz_common.h"
#include "provider/llm_reply.h"
#include "provider/openai_decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct outcome {
    int rc;
    llm_reply reply;
    char *err;
    pbuf text;  /* every on_text piece */
    pbuf calls; /* every callback, text or reasoning, with its length, in order */
} outcome;

static void collect_text(void *ud, const char *text, size_t len)
{
    FUZZ_CHECK(len > 0);
    outcome *o = ud;
    pbuf_append(&o->text, text, len);
    pbuf_printf(&o->calls, "t%zu:", len);
    pbuf_append(&o->calls, text, len);
}

static void collect_reasoning(void *ud, const char *text, size_t len)
{
    FUZZ_CHECK(len > 0);
    outcome *o = ud;
    pbuf_printf(&o->calls, "r%zu:", len);
    pbuf_append(&o->calls, text, len);
}

static outcome run(const char *body, size_t len, const uint8_t *sizes, size_t nsizes, int fast)
{
    outcome o = {0, {0}, NULL, PBUF_INIT, PBUF_INIT};
    llm_sink sink = {collect_text, collect_reasoning, &o};
    llm_stream *s = llm_stream_new_sink(&sink);
    FUZZ_CHECK(s != NULL);
    if (!fast)
        llm_stream_disable_fast_path(s);
    for (size_t off = 0, turn = 0; off < len && o.rc == 0; turn++) {
        size_t piece = nsizes ? sizes[turn % nsizes] : 0;
        if (piece == 0 || piece > len - off)
            piece = len - off;
        o.rc = llm_stream_feed(s, body + off, piece, &o.err);
        off += piece;
    }
    if (o.rc == 0)
        o.rc = llm_stream_finish(s, &o.reply, &o.err);
    llm_stream_free(s);
    return o;
}

static void outcome_free(outcome *o)
{
    llm_reply_free(&o->reply);
    free(o->err);
    pbuf_free(&o->text);
    pbuf_free(&o->calls);
}

/* The chunk fast path against the jansson path alone: nothing may differ. */
static void check_same(const outcome *a, const outcome *b)
{
    FUZZ_CHECK(a->rc == b->rc);
    FUZZ_CHECK(fuzz_str_equal(a->err, b->err));
    FUZZ_CHECK(fuzz_replies_identical(&a->reply, &b->reply));
    FUZZ_CHECK(a->calls.len == b->calls.len &&
               (a->calls.len == 0 || memcmp(a->calls.data, b->calls.data, a->calls.len) == 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t nsizes = (size_t)(data[0] & 7) + 1;
    if (size < 1 + nsizes)
        return 0;
    const uint8_t *sizes = data + 1;
    const char *body = (const char *)data + 1 + nsizes;
    size_t len = size - 1 - nsizes;

    outcome split = run(body, len, sizes, nsizes, 1);
    outcome whole = run(body, len, NULL, 0, 1);
    outcome split_jansson = run(body, len, sizes, nsizes, 0);
    check_same(&split, &split_jansson);
    outcome_free(&split_jansson);
    FUZZ_CHECK(split.rc == whole.rc);
    FUZZ_CHECK(fuzz_str_equal(split.err, whole.err));
    FUZZ_CHECK(fuzz_str_equal(split.text.data, whole.text.data));
    if (split.rc == 0) {
        FUZZ_CHECK(split.err == NULL);
        fuzz_check_reply(&split.reply);
        FUZZ_CHECK(fuzz_replies_equal(&split.reply, &whole.reply));
        const char *content = split.reply.content ? split.reply.content : "";
        FUZZ_CHECK(strcmp(split.text.data ? split.text.data : "", content) == 0);
    } else {
        FUZZ_CHECK(split.reply.content == NULL && split.reply.calls == NULL);
        fuzz_check_message(split.err);
        FUZZ_CHECK(!llm_error_is_oom(split.err)); /* a refusal says why */
    }
    outcome_free(&split);
    outcome_free(&whole);
    return 0;
}
