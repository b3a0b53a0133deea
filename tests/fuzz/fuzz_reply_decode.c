/*
 * fuzz_reply_decode.c -- llm_reply_decode and llm_error_text on any body.
 *
 * Beyond "no crash, no leak": a decoded reply keeps the header's promises,
 * messages are clean text, and -- the property the history relies on -- the
 * same message sent as one SSE chunk decodes to the identical reply -- and
 * the fast path (llm_reply_decode_fast) never disagrees with the jansson
 * decoder it stands in front of.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "fuzz_common.h"
#include "provider/llm_reply.h"
#include "provider/openai_decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* choices[0].message as a chunk's delta, tool calls given their index. */
static char *as_stream(const json_t *root)
{
    const json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *delta = json_deep_copy(json_object_get(choice, "message"));
    json_t *calls = json_object_get(delta, "tool_calls");
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) json_object_set_new(call, "index", json_integer((json_int_t)i));
    json_t *stream_choice = json_pack("{s:o}", "delta", delta);
    json_t *reason = json_object_get(choice, "finish_reason");
    if (reason)
        json_object_set(stream_choice, "finish_reason", reason);
    json_t *chunk = json_pack("{s:[o]}", "choices", stream_choice);
    char *text = json_dumps(chunk, JSON_COMPACT); /* 17 digits: reals read back exactly */
    json_decref(chunk);
    FUZZ_CHECK(text != NULL);
    pbuf sse = PBUF_INIT;
    pbuf_printf(&sse, "data: %s\n\ndata: [DONE]\n\n", text);
    free(text);
    return pbuf_take(&sse);
}

static void check_streamed_alike(const uint8_t *data, size_t size, const llm_reply *whole)
{
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    FUZZ_CHECK(root != NULL);
    char *sse = as_stream(root);
    json_decref(root);
    llm_stream *s = llm_stream_new(NULL, NULL);
    llm_reply streamed;
    char *err = NULL;
    FUZZ_CHECK(llm_stream_feed(s, sse, strlen(sse), &err) == 0);
    FUZZ_CHECK(llm_stream_finish(s, &streamed, &err) == 0);
    FUZZ_CHECK(fuzz_replies_equal(whole, &streamed));
    llm_reply_free(&streamed);
    llm_stream_free(s);
    free(sse);
}

/* The fast path against jansson alone (the authority): the same success or
   failure, the same reply field by field, the same error text. */
static void check_fast_path_agrees(const uint8_t *data, size_t size, int rc, const llm_reply *reply,
                                   const char *err)
{
    llm_reply authority, fast;
    char *authority_err = NULL;
    int authority_rc = llm_reply_decode_jansson((const char *)data, size, &authority, &authority_err);
    FUZZ_CHECK(rc == authority_rc);
    FUZZ_CHECK(fuzz_str_equal(err, authority_err));
    FUZZ_CHECK(fuzz_replies_identical(reply, &authority));
    if (llm_reply_decode_fast((const char *)data, size, &fast)) {
        FUZZ_CHECK(authority_rc == 0);
        FUZZ_CHECK(fuzz_replies_identical(&fast, &authority));
    } else {
        FUZZ_CHECK(!fast.content && !fast.calls && !fast.finish_reason && !fast.reasoning);
    }
    llm_reply_free(&fast);
    llm_reply_free(&authority);
    free(authority_err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llm_reply reply;
    char *err = NULL;
    int rc = llm_reply_decode((const char *)data, size, &reply, &err);
    check_fast_path_agrees(data, size, rc, &reply, err);
    if (rc == 0) {
        FUZZ_CHECK(err == NULL);
        fuzz_check_reply(&reply);
        check_streamed_alike(data, size, &reply);
        llm_reply_free(&reply);
    } else {
        FUZZ_CHECK(reply.content == NULL && reply.calls == NULL && reply.finish_reason == NULL);
        fuzz_check_message(err);
        FUZZ_CHECK(!llm_error_is_oom(err)); /* a refusal says why: out of memory is not one */
        free(err);
    }

    char *text = llm_error_text((const char *)data, size);
    if (text) {
        size_t n = strlen(text);
        FUZZ_CHECK(n > 0 && n <= 503 && text[0] != ' ' && text[n - 1] != ' ');
        fuzz_check_message(text);
        free(text);
    }
    return 0;
}
