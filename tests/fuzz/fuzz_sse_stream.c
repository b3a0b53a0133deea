/*
 * fuzz_sse_stream.c -- llm_stream fed in pieces, then finished.
 *
 * Input layout: byte 0's low 3 bits give k (1..8); bytes 1..k are piece
 * sizes, used in turn (0 means "all the rest"); the remaining bytes are the
 * HTTP body.  Beyond "no crash, no leak", the outcome must not depend on how
 * the body was split: the same reply (or the same error) as when it is fed
 * whole, and on_text must have seen exactly the reply's content.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "fuzz_common.h"
#include "llm_reply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct outcome {
    int rc;
    llm_reply reply;
    char *err;
    pbuf text; /* every on_text piece */
} outcome;

static void collect_text(void *ud, const char *text, size_t len)
{
    FUZZ_CHECK(len > 0);
    pbuf_append(ud, text, len);
}

static outcome run(const char *body, size_t len, const uint8_t *sizes, size_t nsizes)
{
    outcome o = {0, {0}, NULL, PBUF_INIT};
    llm_stream *s = llm_stream_new(collect_text, &o.text);
    FUZZ_CHECK(s != NULL);
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

    outcome split = run(body, len, sizes, nsizes);
    outcome whole = run(body, len, NULL, 0);
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
    }
    outcome_free(&split);
    outcome_free(&whole);
    return 0;
}
