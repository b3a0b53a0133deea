/* parley-fake-llm: an offline, deterministic, OpenAI-compatible Chat
 * Completions server for Parley's integration tests, demo and benchmarks.
 *
 * Module map:
 *   main.c    CLI, daemon start/stop, signals
 *   http.c    MHD access handler: routing, body collection, latency via
 *             suspend/resume, request log entries
 *   validate.c request validation (OpenAI-style 400s)
 *   chat.c    markers, reply generation, JSON bodies
 *   sse.c     paced (chunked) bodies: SSE streams, slow/cut streams
 *   faults.c  fault-mode parsing, retry counters, fault responses
 *   anthropic.c the Anthropic Messages dialect (POST /v1/messages)
 *   ollama.c  Ollama's native dialect (POST /api/chat)
 *   dialect.c what the dialects share: reasoning markers, strict checks
 *   timer.c   wakeup heap thread that resumes suspended connections
 *   reqlog.c  JSON-lines request log
 *   prompt.c  the prompt model: canonical rendering, tokenizer, context window,
 *             prompt caches (llama.cpp slots, Anthropic breakpoints, OpenAI automatic)
 *   util.c    buffers, clocks, UTF-8 helpers
 */
#ifndef PARLEY_FAKELLM_H
#define PARLEY_FAKELLM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#define FAKE_MAX_BODY ((size_t)8 * 1024 * 1024)
#define FAKE_MODEL_ID "fake-model"

/* ------------------------------------------------------------ util.c */

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
void buf_reserve(buf_t *b, size_t extra);
void buf_append(buf_t *b, const void *p, size_t n);
void buf_puts(buf_t *b, const char *s);
void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the (NUL-terminated) buffer to the caller and resets b. */
char *buf_take(buf_t *b, size_t *len);
void buf_free(buf_t *b);

uint64_t now_ms(void); /* CLOCK_MONOTONIC */
/* Smallest index >= want that does not split a UTF-8 sequence. */
size_t utf8_boundary(const char *s, size_t len, size_t want);
/* json_stringn(), but invalid UTF-8 is replaced by U+FFFD instead of failing. */
json_t *json_string_lossy(const char *s, size_t n);
/* json_dumps(JSON_COMPACT) returning the length too; aborts on OOM. */
char *json_dump_compact(const json_t *j, size_t *len);
/* Parses "123" fully into *out; false on junk or overflow. */
bool parse_ulong(const char *s, size_t n, unsigned long *out);

/* ------------------------------------------------------------ faults.c */

enum fault_kind {
    FAULT_NONE,
    FAULT_STATUS,        /* 500, 429:S, 503x2, ... */
    FAULT_HANG,
    FAULT_TRUNCATED,
    FAULT_NOT_JSON,
    FAULT_BAD_SHAPE,     /* arg: SHAPE_* */
    FAULT_INVALID_UTF8,
    FAULT_RESET,
    FAULT_OVERSIZED,     /* arg: MiB */
    FAULT_ENDLESS_TOOLS,
    FAULT_SLOW_STREAM,   /* arg: ms between chunks */
    FAULT_STREAM_CUT,    /* arg: 1 = abort the connection instead of a clean end */
    FAULT_DONE_HOLD,     /* stream: after [DONE] keep the connection open; arg: ms between
                            keep-alive comments, 0 = send nothing */
    FAULT_HEADER_FLOOD,  /* arg: KiB of extra response headers (command line only) */
    FAULT_SCHEMA_MISMATCH, /* structured output: an answer that breaks the schema */
    FAULT_ERROR_200,     /* status NNN's error object with a 200; arg 1: a streamed request
                            gets it as an event of its stream instead */
};

enum { SHAPE_NO_CHOICES, SHAPE_EMPTY_CHOICES, SHAPE_NULL_MESSAGE };

struct fault {
    enum fault_kind kind;
    unsigned status;          /* FAULT_STATUS */
    long retry_after;         /* seconds for Retry-After, -1 = no header */
    unsigned long first_k;    /* FAULT_STATUS: >0 => only the first K sightings of a body fail */
    unsigned long arg;
    char name[64];            /* as written by the user; goes to the log */
};

bool fault_parse(const char *s, size_t n, struct fault *out);
/* Decides whether f applies to this body; counts sightings for "xK" modes. */
bool fault_fires(const struct fault *f, const char *body, size_t len);
void faults_cleanup(void);

struct MHD_Response *fault_status_response(const struct fault *f);
/* FAULT_ERROR_200's body: f->status's error object in dialect d's own shape (its
   type and code), as one SSE event / NDJSON line when `event` is set. */
char *fault_error_body(const struct fault *f, int dialect, bool event, size_t *len);
/* Adds arg KiB of "X-Flood-N: aaaa..." headers to resp. */
void fault_header_flood(struct MHD_Response *resp, unsigned long kib);
struct MHD_Response *fault_oversized_response(const char *model, unsigned long seq,
                                              unsigned long mib);
/* Declares a big Content-Length, sends `json`'s first half, then aborts. Takes json. */
struct MHD_Response *fault_reset_response(char *json, size_t len);

/* ------------------------------------------------------------ validate.c, chat.c */

enum tool_choice { CHOICE_AUTO, CHOICE_NONE, CHOICE_REQUIRED, CHOICE_FUNCTION };

struct api_error {
    unsigned status;
    const char *type;
    char *message; /* malloc'd */
    char *param;   /* malloc'd or NULL */
    const char *code;
};

/* Facts extracted from a validated request body. */
struct chat_request {
    json_t *body;              /* borrowed */
    const char *model;         /* borrowed from body */
    bool stream, include_usage;
    char *user_text;           /* U: last user message, "" if none */
    char *system_text;         /* first system/developer message or NULL */
    char *turn_note;           /* Parley's instructions for the turn, split off the end of
                                  user_text (TURN_NOTE_HEADING), or NULL */
    size_t n_messages, n_user;
    bool has_tool_msgs, last_is_tool;
    json_t *tools;             /* borrowed, NULL if not offered */
    enum tool_choice choice;
    const char *forced_tool;   /* CHOICE_FUNCTION */
    bool response_json;        /* response_format json_object or json_schema */
    const json_t *response_schema; /* json_schema's schema (borrowed), or NULL */
    bool schema_mismatch;      /* the schema_mismatch fault applies */
};

struct tool_call {
    char *id, *name, *args;
};

struct chat_reply {
    char *content; /* NULL => JSON null */
    struct tool_call *calls;
    size_t ncalls;
    const char *finish_reason;
    char *reasoning; /* [[think:TEXT]]: the reasoning, in the dialect's own field; or NULL */
    long completion_tokens; /* reported instead of the computed count when > 0 */
    bool context_full;      /* [[ctx-full]]: the context window, not max_tokens, cut it */
    bool ids_given;  /* [[call-ids:...]] named the calls: Ollama sends the ids too */
};

/* validate.c: validates body and fills req; on failure fills err (a 400). */
bool chat_parse(json_t *body, struct chat_request *req, struct api_error *err);
void chat_request_free(struct chat_request *req);
const char *chat_role_of(const json_t *msg);
/* Text of a string or array-of-parts content (parts joined by '\n'). */
char *chat_content_text(const json_t *content);

/* chat.c */
void chat_reply_build(const struct chat_request *req, unsigned long seq, bool endless_tools,
                      struct chat_reply *out);
void chat_reply_free(struct chat_reply *r);
/* Non-streaming chat.completion body. */
struct prompt_stats;
char *chat_completion_json(const struct chat_request *req, const struct chat_reply *r,
                           unsigned long seq, const struct prompt_stats *ps, size_t *len);
/* usage with prompt_tokens_details.cached_tokens, as llama.cpp and OpenAI send it */
json_t *chat_usage(const struct prompt_stats *ps, const struct chat_reply *r);
/* llama.cpp's timings object (--cache llamacpp), or NULL */
json_t *chat_timings(const struct prompt_stats *ps, const struct chat_reply *r);
/* {"id":"chatcmpl-SEQ","object":object,"created","model","system_fingerprint"} */
json_t *chat_object_base(const struct chat_request *req, unsigned long seq, const char *object);
/* Bodies for the bad_shape fault (variant: SHAPE_*). */
char *chat_bad_shape_json(const struct chat_request *req, unsigned long seq, unsigned long variant,
                          size_t *len);

/* Finds "[[name:VALUE]]" (or "[[name]]") in text; value may be NULL. */
bool marker_find(const char *text, const char *name, const char **value, size_t *vlen);

void api_error_set(struct api_error *e, unsigned status, const char *type, const char *param,
                   const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void api_error_free(struct api_error *e);
char *api_error_json(const struct api_error *e, size_t *len);

/* Content used by the invalid_utf8 fault: contains INVALID_UTF8_MARK, which
 * utf8_poison() turns into the raw bytes 0xC3 0x28 after JSON encoding. */
#define INVALID_UTF8_MARK "\xEE\x80\x80" /* U+E000, never split by the chunker */
size_t utf8_poison(char *s, size_t len);

/* ------------------------------------------------------------ dialect.c, anthropic.c, ollama.c */

/* The three wire formats; Anthropic and Ollama requests are validated in their own
 * terms, then translated to a Chat Completions body so the same reply rules apply. */
enum dialect { DIALECT_OPENAI, DIALECT_ANTHROPIC, DIALECT_OLLAMA };
struct segments;

/* [[think:TEXT]] in U: the model reasons TEXT (reasoning_content, thinking, ...);
 * [[think-tag:TEXT]]: it says "<think>TEXT</think>" at the start of its content;
 * [[length]]: the text reply ends as cut short by max_tokens, in the dialect's words. */
void reasoning_apply(const struct chat_request *req, struct chat_reply *r);
/* Reasoning must come back with this turn's tool calls (DeepSeek's rule; Anthropic's
 * and Ollama's alike): the openai dialect checks reasoning_content here. */
bool openai_check_extra(const struct chat_request *req, struct api_error *err);
/* A deterministic signature for a thinking text ("sig-<hex>"). */
char *thinking_signature(const char *text);
/* An error body in the dialect's own shape. */
char *dialect_error_json(enum dialect d, const struct api_error *e, size_t *len);

/* In the dialect validators: fail the request with a 400 saying what was wrong. */
#define DIALECT_BAD(...)                                                                    \
    do {                                                                                    \
        api_error_set(err, 400, "invalid_request_error", NULL, NULL, __VA_ARGS__);          \
        goto fail;                                                                          \
    } while (0)
/* Member k of o as a string, or NULL. */
const char *jstr_member(const json_t *o, const char *k);

json_t *anthropic_to_chat(json_t *body, struct api_error *err);
bool anthropic_check_thinking(json_t *body, const char *user_text, struct api_error *err);
/* Cut Parley's turn note off a user message's text (in place): the note (malloc'd) or NULL. */
char *cut_turn_note(char *text);
bool anthropic_check_breakpoints(const json_t *body, struct api_error *err);
char *anthropic_message_json(const struct chat_request *req, const struct chat_reply *r,
                             unsigned long seq, const struct prompt_stats *ps, json_t *native,
                             size_t *len);
void anthropic_sse_build(const struct chat_request *req, const struct chat_reply *r,
                         unsigned long seq, const struct prompt_stats *ps, json_t *native,
                         struct segments *out);

json_t *ollama_to_chat(json_t *body, struct api_error *err);
char *ollama_chat_json(const struct chat_request *req, const struct chat_reply *r,
                       const struct prompt_stats *ps, json_t *native, size_t *len);
void ollama_ndjson_build(const struct chat_request *req, const struct chat_reply *r,
                         const struct prompt_stats *ps, json_t *native, struct segments *out);

/* ------------------------------------------------------------ prompt.c */

enum cache_mode { CACHE_LLAMACPP, CACHE_ANTHROPIC, CACHE_OPENAI, CACHE_NONE };
enum overflow_style { OVERFLOW_LLAMACPP, OVERFLOW_OPENAI, OVERFLOW_VLLM, OVERFLOW_LLAMACPP_OLD };

/* --strict-template: a chat template's rule on the order of messages (validate.c). */
enum strict_template { STRICT_NONE, STRICT_QWEN, STRICT_GEMMA };

/* A prompt in the fake's canonical text, its tokens, and (Anthropic) its blocks. */
struct rendered {
    buf_t text;
    size_t *ends; /* token i covers [ends[i-1], ends[i]) */
    size_t ntok, cap;
    struct { size_t end; bool breakpoint; } *blocks; /* content block ends, cache_control */
    size_t nblocks, bcap;
};

/* What the prompt model made of one chat request (the request log shows it). */
struct prompt_stats {
    bool valid;
    size_t prompt_tokens;   /* as the model saw it (after Ollama's truncation) */
    size_t cached_tokens;   /* read from the prompt cache */
    size_t cache_creation;  /* anthropic mode: written to the cache */
    size_t evaluated;       /* prompt_tokens - cached_tokens */
    size_t window;          /* the context window applied; 0 = unlimited */
    size_t dropped_messages; /* Ollama: messages truncated away to fit num_ctx */
    size_t sent_tokens;     /* Ollama: the prompt as sent, before truncation */
    int slot;               /* llamacpp mode: the slot used; -1 otherwise */
    int extends;            /* the prompt extends the previous one (the slot's, or any: 1/0),
                               -1 when there was none */
    bool overflow;          /* refused for the context window */
    unsigned long gen;      /* the slot's prompt number, for prompt_answered */
};

void prompt_render_chat(const json_t *chat_body, struct rendered *r);
void prompt_render_anthropic(const json_t *native, struct rendered *r);
void rendered_free(struct rendered *r);
/* Match r against the cache of --cache and make it the cache's latest prompt. */
void prompt_account(const struct rendered *r, struct prompt_stats *st);
/* The answer was generated: a slot now also holds it. */
void prompt_answered(const struct prompt_stats *st, const struct chat_reply *rep);
void prompt_cleanup(void);
/* llama.cpp: an answer that would run past the end of the context stops there (finish_reason
 * "length", however large max_tokens was). */
void prompt_context_end(const struct prompt_stats *st, struct chat_reply *rep);
/* A text answer longer than room tokens is cut to fit, with finish_reason "length". */
void prompt_cut_answer(struct chat_reply *rep, size_t room);
/* The window for this request: --n-ctx, or for Ollama the request's options.num_ctx. */
size_t prompt_window(enum dialect d, const json_t *native);
/* Ollama: body minus its oldest messages until it fits n_ctx (new reference). */
json_t *prompt_ollama_truncate(json_t *chat_body, size_t n_ctx, size_t *dropped);
/* The overflow answer (HTTP 400 body) in the dialect's and --overflow-style's shape, or
 * NULL when n prompt tokens (and max_tokens of answer, < 0: none) fit ctx. */
char *prompt_overflow_body(enum dialect d, size_t n, size_t ctx, long max_tokens, size_t *len);

/* ------------------------------------------------------------ schema.c */

/* The answer (compact JSON, malloc'd) a model constrained to `schema` gives; NULL schema:
 * JSON mode, {"answer": user_text}.  broken: the schema_mismatch fault's answer. */
char *schema_answer(const json_t *schema, const char *user_text, bool broken);

/* ------------------------------------------------------------ sse.c */

struct paced_opts {
    uint64_t gap_ms;     /* delay before every segment but the first */
    bool cut;            /* stop halfway through the middle segment */
    bool abort_at_cut;   /* ... and abort the connection instead of ending cleanly */
    bool poison_utf8;    /* apply utf8_poison() to every segment */
    bool hold_open;      /* after the last segment, never end the body ... */
    uint64_t keepalive_ms; /* ... but send ": keep-alive" this often (0: nothing) */
};

/* A body made of segments, each handed to MHD separately (one HTTP chunk). */
struct segments {
    buf_t data;
    size_t *ends;
    size_t n, cap;
};
void segments_add(struct segments *s, const char *p, size_t n);
void segments_free(struct segments *s);

void sse_build(const struct chat_request *req, const struct chat_reply *r, unsigned long seq,
               const struct prompt_stats *ps, bool poison_utf8, struct segments *out);
/* Splits a finished body into ~8 pieces (for slow/cut non-stream replies). */
void segments_split(const char *body, size_t len, size_t pieces, struct segments *out);
/* Takes ownership of segs. */
struct MHD_Response *paced_response(struct MHD_Connection *conn, struct segments *segs,
                                    const struct paced_opts *o, const char *content_type);

/* ------------------------------------------------------------ timer.c */

#define TIMER_NEVER UINT64_MAX

void timer_start(void);
/* The connection must already be suspended; it is resumed at due_ms
 * (now_ms() clock), or at timer_stop() for TIMER_NEVER. */
void timer_resume_at(struct MHD_Connection *conn, uint64_t due_ms);
/* Resumes every pending connection and joins the thread. */
void timer_stop(void);

/* ------------------------------------------------------------ reqlog.c */

bool reqlog_open(const char *path);
/* body: parsed JSON (borrowed) or NULL, then raw bytes are logged as a string
 * (or null when empty). status < 0 logs null. fault may be NULL.  client_port
 * < 0 logs null (one port = one connection). */
void reqlog_write(unsigned long seq, const char *method, const char *path, const char *auth,
                  const char *ctype, const json_t *body, const char *raw, size_t rawlen,
                  int status, const char *fault, int client_port,
                  const struct prompt_stats *ps);
void reqlog_close(void);

/* ------------------------------------------------------------ http.c */

enum MHD_Result http_handler(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload_data,
                             size_t *upload_data_size, void **con_cls);
void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                    enum MHD_RequestTerminationCode toe);
/* Suspends conn and arranges for the timer to resume it. */
void http_suspend_until(struct MHD_Connection *conn, uint64_t due_ms);
/* Call after a suspension made by http_suspend_until() ends. */
void http_resumed(void);

/* ------------------------------------------------------------ main.c */

struct config {
    const char *host;
    unsigned port;
    const char *port_file;
    const char *log_path;
    unsigned long latency_ms;
    struct fault fault;
    unsigned threads;
    unsigned max_connections;
    bool quiet;
    size_t n_ctx;                /* --n-ctx: context window in tokens, 0 = unlimited */
    enum cache_mode cache;       /* --cache */
    size_t slots;                /* --slots (llamacpp mode) */
    size_t cache_ram;            /* --cache-ram: prompts kept in llama.cpp's RAM cache, 0 = off */
    enum overflow_style overflow_style; /* --overflow-style (OpenAI-dialect overflow shape) */
    size_t cache_min;            /* --cache-min: anthropic mode's minimum cacheable prefix */
    uint64_t cache_ttl_ms;       /* --cache-ttl-ms: anthropic/openai cache lifetime */
    bool honor_max_tokens;       /* --honor-max-tokens: cut text answers at max_tokens */
    enum strict_template strict_template; /* --strict-template */
};

extern struct config g_cfg;
extern atomic_bool g_shutting_down;
extern atomic_long g_suspended; /* connections currently suspended by us */
extern atomic_ulong g_seq;      /* last assigned request sequence number */

#endif
