/*
 * fuzz_provider_stream.h -- a provider's stream decoder (with Parley's
 * <think> rules on top, provider_stream_*) fed in pieces, then finished.
 * Included by one small target per provider, which defines FUZZ_PROVIDER.
 *
 * Input layout as fuzz_sse_stream.c: byte 0's low 3 bits give k (1..8);
 * bytes 1..k are piece sizes used in turn (0 = all the rest); the rest is the
 * body.  Beyond "no crash, no leak": the outcome does not depend on how the
 * body was split, the text deltas are exactly the reply's content and the
 * reasoning deltas exactly its reasoning (reasoning never leaks into text).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "fuzz_common.h"
#include "provider/llm_reply.h"
#include "provider/provider.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct outcome {
    int rc;
    llm_reply reply;
    char *err;
    pbuf text, reasoning;
} outcome;

static void on_text(void *ud, const char *s, size_t n)
{
    FUZZ_CHECK(n > 0);
    pbuf_append(&((outcome *)ud)->text, s, n);
}

static void on_reasoning(void *ud, const char *s, size_t n)
{
    FUZZ_CHECK(n > 0);
    pbuf_append(&((outcome *)ud)->reasoning, s, n);
}

static void run(outcome *o, const char *body, size_t len, const uint8_t *sizes, size_t nsizes)
{
    memset(o, 0, sizeof *o);
    llm_sink sink = {on_text, on_reasoning, o};
    provider_stream *s = provider_stream_new(provider_find(FUZZ_PROVIDER), 1, &sink);
    FUZZ_CHECK(s != NULL);
    for (size_t off = 0, turn = 0; off < len && o->rc == 0; turn++) {
        size_t piece = nsizes ? sizes[turn % nsizes] : 0;
        if (piece == 0 || piece > len - off)
            piece = len - off;
        o->rc = provider_stream_feed(s, body + off, piece, &o->err);
        off += piece;
    }
    if (o->rc == 0)
        o->rc = provider_stream_finish(s, &o->reply, &o->err);
    provider_stream_free(s);
}

static void outcome_free(outcome *o)
{
    llm_reply_free(&o->reply);
    free(o->err);
    pbuf_free(&o->text);
    pbuf_free(&o->reasoning);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t k = (size_t)(data[0] & 7) + 1;
    if (size < 1 + k)
        return 0;
    const uint8_t *sizes = data + 1;
    const char *body = (const char *)data + 1 + k;
    size_t len = size - 1 - k;

    outcome whole, split;
    run(&whole, body, len, NULL, 0);
    run(&split, body, len, sizes, k);
    FUZZ_CHECK((whole.rc == 0) == (split.rc == 0));
    if (whole.rc == 0) {
        FUZZ_CHECK(fuzz_replies_equal(&whole.reply, &split.reply));
        FUZZ_CHECK(fuzz_str_equal(whole.reply.reasoning, split.reply.reasoning));
        FUZZ_CHECK(fuzz_str_equal(whole.reply.provider_data, split.reply.provider_data));
        const char *content = split.reply.content ? split.reply.content : "";
        FUZZ_CHECK(strcmp(split.text.data ? split.text.data : "", content) == 0);
        const char *reasoning = split.reply.reasoning ? split.reply.reasoning : "";
        FUZZ_CHECK(strcmp(split.reasoning.data ? split.reasoning.data : "", reasoning) == 0);
    } else {
        FUZZ_CHECK(!llm_error_is_oom(whole.err) && !llm_error_is_oom(split.err));
    }
    outcome_free(&whole);
    outcome_free(&split);
    return 0;
}
