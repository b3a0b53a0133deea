/*
 * openai_decode.h -- OpenAI's Chat Completions replies decoded: a whole JSON
 * body (openai_reply.c) and a Server-Sent-Events stream of
 * chat.completion.chunk objects (openai_stream.c).  openai.c's table points at
 * these; the tests call them directly.
 *
 * Both fill an llm_reply (llm_reply.h) through codec.c's finishing steps, and
 * read every member with the pieces at the end of this header, so a stream
 * decodes to the same reply as the same answer sent whole.
 */
#ifndef PARLEY_PROVIDER_OPENAI_DECODE_H
#define PARLEY_PROVIDER_OPENAI_DECODE_H

#include <jansson.h>
#include <stddef.h>

#include "lib/buf.h"
#include "lib/json_scan.h"
#include "provider/llm_reply.h"

/*
 * Decode a complete (non-streamed) response body.  message.reasoning_content
 * (llama.cpp, DeepSeek) or message.reasoning (vLLM, Ollama, OpenRouter) is the
 * reasoning; usage (with prompt_tokens_details.cached_tokens and
 * completion_tokens_details.reasoning_tokens) is read.  Returns 0 and fills *out,
 * or -1 and sets *err (malloc'd) to e.g. "response is not JSON: ..." or
 * "response has no choices".  Invalid UTF-8 is an error.  A reply with
 * neither content nor tool calls decodes as content "" (models do that).
 */
int llm_reply_decode(const char *body, size_t len, llm_reply *out, char **err);

/*
 * The two decoders behind llm_reply_decode, exposed for the differential
 * tests (tests/unit/test_llm_reply_fast.c, tests/fuzz/fuzz_reply_decode.c);
 * callers use llm_reply_decode.  The fast one reads the usual shape in one
 * pass without a JSON tree: it returns 1 having filled *out, or 0 ("not
 * mine", *out empty) for anything it does not read exactly as the jansson
 * one does -- which then decides, and words every error.
 */
int llm_reply_decode_fast(const char *body, size_t len, llm_reply *out);
int llm_reply_decode_jansson(const char *body, size_t len, llm_reply *out, char **err);

/* ---- streaming ---- */

typedef struct llm_stream llm_stream;

/* A stream that hands text deltas to sink->text and reasoning deltas (reasoning_content /
 * reasoning) to sink->reasoning. */
llm_stream *llm_stream_new_sink(const llm_sink *sink);
#ifdef PARLEY_TEST_HOOKS
/* For tests only (see plugin/README.md): a stream with a text callback alone. */
static inline llm_stream *llm_stream_new(llm_text_fn on_text, void *ud)
{
    llm_sink sink = {.text = on_text, .ud = ud};
    return llm_stream_new_sink(&sink);
}
#endif

/*
 * Feed raw bytes of the HTTP body as they arrive, split anywhere (mid-line,
 * mid-UTF-8 sequence).  Handles "data:" lines (with or without the space),
 * CRLF or LF line ends, comment lines (":..."), "event:"/"id:"/"retry:" fields
 * (ignored), multi-line data joined with "\n", and "data: [DONE]".  Each
 * event's data is a chat.completion.chunk JSON: choices[0].delta.content
 * pieces are appended (and passed to on_text); delta.tool_calls pieces are
 * merged by `index` (id and function.name set when first given,
 * function.arguments concatenated; deltas without an index, as older Ollama
 * sends, continue the last call unless they bring a new id or name);
 * finish_reason is kept.  An event whose
 * data is {"error":...} is an error carrying its message.
 * Returns 0, or -1 with *err set (then the stream is dead).
 */
int llm_stream_feed(llm_stream *s, const char *data, size_t len, char **err);

/* 1 once "[DONE]" was fed: the answer is whole, the rest of the body can be dropped. */
int llm_stream_done(const llm_stream *s);

/*
 * The body ended.  Returns 0 and moves the accumulated reply into *out when
 * the stream was complete ("[DONE]" seen, or at least a finish_reason seen and
 * no partial line pending; a last event whose blank line never came is still
 * decoded); else -1 and *err ("stream ended before [DONE]").
 */
int llm_stream_finish(llm_stream *s, llm_reply *out, char **err);

void llm_stream_free(llm_stream *s);

/* For the differential tests: every chunk of this stream is decoded by the
   jansson path alone (by default a fast path like llm_reply_decode_fast's
   takes each chunk it reads exactly alike, on the same terms). */
void llm_stream_disable_fast_path(llm_stream *s);
/* How many chunks the fast path applied so far. */
size_t llm_stream_fast_chunks(const llm_stream *s);

/* ---- what the two decoders share (openai_reply.c; not for other callers) ---- */

/* The OpenAI-compatible servers' names for the reasoning text, in the order tried:
   reasoning_content (llama.cpp, DeepSeek), reasoning (vLLM, Ollama, OpenRouter). */
#define OPENAI_NREASONING 2
extern const char *const openai_reasoning_fields[OPENAI_NREASONING];
/* DeepSeek wants reasoning_content sent back with the tool calls it came with: note in
   out->provider_data that the server used that field.  0, or -1 out of memory. */
int openai_note_reasoning_field(llm_reply *out, const char *field, char **err);
/* usage (and llama.cpp's timings) of a response or of a stream chunk into *u; anything
   malformed counts as absent. */
void openai_read_usage(const json_t *usage, llm_usage *u);
void openai_read_timings(const json_t *timings, llm_usage *u);
/* Append a message's (or a delta's) content: a string, null, or text parts.  0 or -1. */
int openai_append_content(pbuf *text, const json_t *content, const char *what, char **err);
/* Append a call's arguments: a string (or a piece of one) as is, an object serialised;
   absent adds nothing.  0 or -1. */
int openai_append_arguments(pbuf *args, const json_t *value, const char *what, char **err);
/* Keep the choice's finish_reason in *dst when it has one (a later chunk's wins). */
int openai_take_finish_reason(const json_t *choice, char **dst, const char *what, char **err);

/* The fast paths (json_scan, no tree): each reads a member exactly as the jansson path
   does, or answers -1, "not mine", and the jansson path decides. */
typedef struct fast_key {
    const char *name;
    size_t len;
} fast_key;

#define FAST_KEY(s)      \
    {                    \
        s, sizeof(s) - 1 \
    }

/* A tool call's members as scanned: spans of the body. */
typedef struct fast_call {
    jscan_str id, name, arguments;
    int has_id, has_name, has_arguments; /* present and not null */
    int has_function;
} fast_call;

/* Reads the member value of keys[which]: 0, or -1 (not mine). */
typedef int (*fast_member_fn)(jscan *s, size_t which, void *ctx);

/* An object whose `keys` go to on_member, each at most once (32 at most); other members
   are skipped. */
int openai_fast_object(jscan *s, const fast_key *keys, size_t nkeys, fast_member_fn on_member,
                       void *ctx);
/* A string member that the jansson path treats null as absent and refuses as anything
   else: *has = 1 and *out its span when it is a string. */
int openai_fast_optional_string(jscan *s, jscan_str *out, int *has);
/* A usage object (openai_read_usage's four counts). */
int openai_fast_usage(jscan *s, llm_usage *u);
/* openai_read_timings: an object sets both counts (0 for what is absent) and *has; else
   nothing. */
int openai_fast_timings(jscan *s, llm_usage *u, int *has);
/* A call's function object: its name and arguments. */
int openai_fast_function(jscan *s, fast_call *c);

#endif
