/*
 * parley/plugin.h -- the Parley conversation-agent plugin ABI.
 *
 * Parley is a shared object (parley.so) that a home-assistant host loads with
 * dlopen().  The host resolves ONE symbol, PARLEY_ENTRY_SYMBOL, calls it with
 * the ABI version it was compiled against, and gets back a table of function
 * pointers (struct parley_plugin).  Everything else goes through that table.
 *
 * This header is the whole contract.  It is plain C99, includes nothing but
 * <stddef.h> and <stdint.h>, and exposes no jansson or libcurl types.
 *
 * ---------------------------------------------------------------------------
 * Life of one turn
 * ---------------------------------------------------------------------------
 *
 *   host                                   plugin (agent's worker thread)
 *   ----                                   ------------------------------
 *   create(host, options_json)  -------->  validate options, start worker
 *   async_process(input, done)  -------->  copy input, enqueue, return id
 *                                          conversation -> request -> LLM
 *                      tool_call(info) <-  model asked for a tool
 *   complete_tool_call(call, result) --->  (any thread, any time later)
 *                                          ... more LLM rounds ...
 *                                          commit turn to history
 *                     done(result)     <-  exactly once per accepted turn
 *   destroy(agent)              -------->  cancel in-flight turns, join
 *
 * ---------------------------------------------------------------------------
 * Threads
 * ---------------------------------------------------------------------------
 * Each agent owns one worker thread.  It runs every HTTP transfer of every
 * turn of that agent (libcurl multi interface), and it is the ONLY thread on
 * which the plugin calls the host's callbacks: parley_done_fn,
 * parley_delta_fn, parley_host.tool_call and parley_host.log (log may also be
 * called from the thread calling create()).
 *
 * Callbacks must return quickly: while one runs, no other turn of that agent
 * makes progress.  Every function and callback below carries thread tags
 * (after CLAP's headers), defined once here:
 *
 *   [any-thread]          the host may call it from any thread, concurrently
 *                         with every other call, for the lifetime of the agent.
 *   [worker-thread]       a callback: the plugin calls it on the agent's worker.
 *   [callback-ok]         may also be called from inside a callback of the same
 *                         agent: it never waits on I/O nor on the worker.
 *   [not-from-callback]   must NOT be called from inside a callback of the same
 *                         agent (it waits for the worker, or on the network,
 *                         and would stall or deadlock every turn).
 *   [blocking: store I/O] may wait on the history store: SQLite's disk, Redis'
 *                         network.  Inside a callback of the same agent it is
 *                         refused while the store blocks (PARLEY_ERR_INVALID_INPUT,
 *                         field "thread", and a log line): call it from another
 *                         thread.  With the memory store it never blocks and is
 *                         allowed everywhere.
 *   [blocking: network]   waits on the LLM server (bounded by the timeouts).
 *
 * Reading a struct the other side filled: PARLEY_HAS_FIELD(p, type, field)
 * says whether `field` lies within p->struct_size (see Versioning).
 *
 * ---------------------------------------------------------------------------
 * Memory
 * ---------------------------------------------------------------------------
 * - Strings passed IN by the host are only borrowed for the duration of the
 *   call; the plugin copies what it keeps before returning.
 * - Pointers passed to host callbacks (results, infos, deltas) are valid only
 *   until the callback returns; the host copies what it keeps.
 * - Strings returned OUT through a `char **` parameter are owned by the host,
 *   who frees them with parley_plugin.free_string (never with free(): the
 *   plugin may use another allocator).
 * - All text is UTF-8.  All JSON is UTF-8 JSON text.
 *
 * ---------------------------------------------------------------------------
 * Versioning
 * ---------------------------------------------------------------------------
 * PARLEY_ABI_VERSION changes only on an incompatible change.  Structs that
 * cross the boundary start with `struct_size`; the side that fills a struct
 * sets it to sizeof() as it knows it, and the other side reads only the
 * fields that fit.  New fields are only ever appended, so an old host works
 * with a new plugin and vice versa.
 */
#ifndef PARLEY_PLUGIN_H
#define PARLEY_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI this header describes.  Pass it to the entry function. */
#define PARLEY_ABI_VERSION 1u

/** Name of the one exported symbol, for dlsym(). */
#define PARLEY_ENTRY_SYMBOL "parley_plugin_entry"

/**
 * 1 when the struct at p (which starts with uint32_t struct_size, filled by
 * the other side) is large enough to hold `field` of `type`: check before
 * reading a field appended after the first release.
 */
#define PARLEY_HAS_FIELD(p, type, field) \
    ((p)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

#if defined(_WIN32)
#define PARLEY_EXPORT __declspec(dllexport)
#else
#define PARLEY_EXPORT __attribute__((visibility("default")))
#endif

/** Opaque agent instance, made by create() and freed by destroy(). */
typedef struct parley_agent parley_agent;

/** Opaque handle of one tool call the host is asked to execute. */
typedef struct parley_tool_call parley_tool_call;

/** Identifies an accepted turn within its agent; never 0. */
typedef uint64_t parley_request_id;

/**
 * Status codes.  Each has a stable lower-case name (status_name()) that hosts
 * may log, match on, or show; docs/errors.md says what the host should do.
 */
typedef enum parley_status {
    PARLEY_OK = 0,
    PARLEY_ERR_INVALID_INPUT = 1,   /* "invalid_input": bad argument or input field */
    PARLEY_ERR_INVALID_OPTIONS = 2, /* "invalid_options": create() rejected the options */
    PARLEY_ERR_BUSY = 3,            /* "busy": max_in_flight turns already accepted */
    PARLEY_ERR_CANCELLED = 4,       /* "cancelled": cancel() or destroy() ended the turn */
    PARLEY_ERR_TIMEOUT = 5,         /* "timeout": connect/request/turn deadline passed */
    PARLEY_ERR_CONNECT = 6,         /* "connect": could not reach the LLM server */
    PARLEY_ERR_RATE_LIMITED = 7,    /* "rate_limited": HTTP 429 after all retries */
    PARLEY_ERR_HTTP_STATUS = 8,     /* "http_status": the server answered another error status */
    PARLEY_ERR_BAD_RESPONSE = 9,    /* "bad_response": unparsable or malformed LLM output */
    PARLEY_ERR_TOOL_LOOP = 10,      /* "tool_loop": the model kept calling tools past every limit */
    PARLEY_ERR_NOT_FOUND = 11,      /* "not_found": no such conversation / turn / request */
    PARLEY_ERR_NO_MEMORY = 12,      /* "no_memory": an allocation failed */
    PARLEY_ERR_INTERNAL = 13,       /* "internal": a bug in Parley; please report it */
    PARLEY_ERR_STORAGE = 14,        /* "storage": the history store failed (I/O error, disk
                                       full, corrupt or unreachable store); history unchanged */
    PARLEY_ERR_CONTEXT_OVERFLOW = 15 /* "context_overflow": the prompt does not fit the model's
                                        context window (the server said so, with the sizes
                                        where it gave them); history unchanged */
} parley_status;

typedef enum parley_log_level {
    PARLEY_LOG_ERROR = 0,
    PARLEY_LOG_WARN = 1,
    PARLEY_LOG_INFO = 2,
    PARLEY_LOG_DEBUG = 3
} parley_log_level;

/**
 * What the plugin tells the host about one tool call.  Valid only during the
 * parley_host.tool_call callback.
 */
typedef struct parley_tool_call_info {
    uint32_t struct_size;
    parley_request_id request_id; /* the turn asking */
    const char *conversation_id;  /* NULL for a stateless turn */
    const char *turn_id;          /* UUID of the turn being built */
    const char *call_id;          /* the model's id for this call, e.g. "call_abc" */
    const char *tool_name;        /* a tool the host declared */
    const char *arguments_json;   /* a JSON object, already validated */
    void *user_data;              /* the user_data given to async_process */
    /* The turn's input, so a tool can act where the user is (e.g. "turn on
     * the light" from the kitchen satellite).  NULL when the input had none. */
    const char *language;
    const char *device_id;
    const char *satellite_id;
    const char *agent_id;
    const char *context_json;
    /* -- Appended after ABI 1.0: read only within struct_size. -- */
    const char *interface_type; /* where the turn came from ("telegram"), NULL for none: a
                                   tool that answers on the same channel knows which */
    const char *persona;        /* the persona the turn speaks as, NULL for the agent's own */
} parley_tool_call_info;

/**
 * What the host offers the plugin.  Copied by create(); the host_data pointer
 * must stay valid until destroy() returns.
 */
typedef struct parley_host {
    uint32_t struct_size;
    void *host_data; /* passed back to every callback below */

    /* Optional (may be NULL).  Diagnostics: one whole message per call (never
     * cut, however long), always valid UTF-8, NUL-terminated.  Never contains
     * the API key. */
    /* [any-thread: the worker, a store thread, or the caller of create/update_options] */
    void (*log)(void *host_data, parley_log_level level, const char *message);

    /*
     * Optional (may be NULL: then every tool the model asks for fails with an
     * error result the model sees).  Execute one tool call.  The host must
     * eventually call parley_plugin.complete_tool_call(call, ...) exactly once
     * for EVERY call it receives -- from any thread, inside this callback or
     * later, even after the turn was cancelled or the agent destroyed (the
     * handle stays valid until completed; a late completion is then simply
     * discarded).  A call not completed within the `tool_timeout_ms` option
     * is given an error result and the turn moves on.
     */
    /* [worker-thread] */
    void (*tool_call)(void *host_data, parley_tool_call *call, const parley_tool_call_info *info);
} parley_host;

/**
 * Text delta of a streamed answer (option "stream": true), called on the
 * worker thread with the user_data given to async_process, before that
 * turn's done callback.  Each delta is whole UTF-8 characters (never a split
 * sequence) and is not NUL-terminated: use `len`.  Deltas carry all the text
 * the model streams, including any it says alongside tool calls ("Let me
 * check..."); the result's `response` is the final answer only.
 */
/* [worker-thread] */
typedef void (*parley_delta_fn)(void *user_data, parley_request_id request_id, const char *text,
                                size_t len);

/**
 * One conversation input, mirroring Home Assistant's ConversationInput.
 * Everything is borrowed; only `text` is required.  Fields left NULL are
 * absent.
 */
typedef struct parley_input {
    uint32_t struct_size;
    const char *text;                /* what the user said; required, non-empty
                                        but for "" with images_json (no caption) */
    const char *conversation_id;     /* NULL: a new id (auto_create_conversation_id) or a
                                        stateless turn; else continue/start that conversation */
    const char *language;            /* e.g. "en" */
    const char *device_id;
    const char *satellite_id;
    const char *agent_id;
    const char *extra_system_prompt; /* this turn's instructions: sent after the
                                        user's text, not stored (docs/history.md) */
    const char *context_json;        /* a JSON object, e.g. {"user_id":"..."} */
    const char *tools_json;          /* JSON array of tools for this turn only, same
                                        form as the `tools` option; added to those */
    parley_delta_fn on_delta;        /* optional; called with text deltas when streaming */
    /* Optional; called like on_delta (worker thread, whole UTF-8 characters, not
     * NUL-terminated, before the done callback) with the model's reasoning as it
     * streams: reasoning fields, Anthropic thinking, Ollama thinking, or a leading
     * <think>...</think> (option strip_think_tags).  Reasoning never reaches
     * on_delta nor the result's response; it is also in steps_json. */
    parley_delta_fn on_reasoning;

    /* -- Appended after ABI 1.0 (a host's older, smaller struct_size simply
     *    leaves them absent).  Borrowed for the call, like the fields above. -- */
    const char *metadata_json;        /* NULL, or a JSON object kept with the user's message
                                         as given (history_query/message_get/message_find
                                         return it as "metadata"); at most max_input_bytes */
    const char *interface_type;       /* e.g. "telegram", "web": history is kept per
                                         (interface_type, conversation_id); NULL or "" = none */
    const char *interface_message_id; /* NULL, or the interface's own id of the user's message
                                         (1..256 bytes), kept with it: message_find looks it up */
    const char *reply_to_json;        /* NULL, or the turn this message replies to, in its
                                         conversation: {"turn_id":".."} or
                                         {"interface_message_id":".."} (any message of that
                                         turn).  If that turn is older than the history sent,
                                         its messages are sent too, before the new user
                                         message; an unknown target is not an error (see
                                         parley_result.reply_context) */
    /* personas and images (docs/abi.md), appended after the fields above */
    const char *persona;             /* NULL or "": the agent's own prompt and options; else
                                        the name of one of the `personas` option's personas.
                                        History is kept per (persona, conversation_id) */
    const char *images_json;         /* NULL, or a JSON array of images shown with this turn:
                                        [{"url": "data:image/png;base64,..."} or
                                         {"url": "https://..."}] (docs/abi.md) */
    /* structured output (docs/abi.md "Structured output"), appended after the fields above */
    const char *response_format_json; /* NULL, or the answer must be JSON of this form:
                                         {"name"?: "^[a-zA-Z0-9_-]{1,64}$" (default
                                          "response"), "schema"?: a JSON Schema whose root
                                          is "type":"object" (absent: any JSON object),
                                          "strict"?: bool, "description"?: text}.  The
                                          answer is checked against it: the result's
                                          structured_json holds it parsed; an answer that
                                          does not match fails the turn (bad_response) */
    /* host timestamps (docs/history.md), appended after the fields above */
    const char *timestamp;           /* NULL, or when the user said it, RFC 3339
                                        ("2026-11-22T19:31:00Z", "...00.250+01:00"): the
                                        turn's messages are stored with this time instead of
                                        Parley's clock (history_query's since/until read it) */
} parley_input;

/** The outcome of one turn.  Valid only during the done callback. */
typedef struct parley_result {
    uint32_t struct_size;
    parley_request_id request_id;
    parley_status status;        /* PARLEY_OK or why the turn failed */
    const char *error_message;   /* NULL on success; else human-readable, with the
                                    server's own error text when it sent one */
    const char *conversation_id; /* NULL for a stateless turn */
    const char *turn_id;         /* UUID of this turn; set even on failure */
    const char *response;        /* the final answer; NULL on failure */
    const char *steps_json;      /* JSON array of the steps the turn took (see
                                    docs/abi.md), also on failure: a tool may have
                                    run although the turn failed.  "[]" if none */
    int continue_conversation;   /* 1 when the answer ends in a question */
    /* Token counts summed over the turn's requests, as the servers reported them
     * (0 where a server gave none): {"prompt_tokens","completion_tokens",
     * "cache_read_tokens","cache_creation_tokens","prompt_tokens_evaluated",
     * "reasoning_tokens","requests"}; prompt_tokens_evaluated: the prompt tokens
     * the server evaluated rather than read from its cache (docs/abi.md).
     * Never NULL; also on failure (tokens spent before it). */
    const char *usage_json;
    /* Why the model's last reply ended, in Chat Completions words whatever the
     * provider: "stop", "tool_calls", "length" (cut short by max_tokens: the
     * answer is incomplete), "content_filter", "refusal", or the server's own
     * word; NULL when it gave none or no reply came.  Borrowed like the rest. */
    const char *stop_reason;
    /* Message identity (docs/history.md); NULL where there is none: a
     * stateless turn, or a failed one (nothing stored).  Borrowed like the rest. */
    const char *user_message_id;   /* the stored id of the user's message */
    const char *answer_message_id; /* the stored id of the final answer (for append_message:
                                      of the appended message) */
    /* NULL when the input named no reply_to (or the turn failed before its
     * history was read); else "included" (the replied-to turn was older than
     * the history sent: its messages were sent before the new message),
     * "in_window" (it was already in the history sent), or "not_found" (no
     * such turn kept in this conversation, or a store that cannot look turns
     * up: the turn ran without it). */
    const char *reply_context;
    /* With a response_format_json input: the answer, checked against its schema, as
     * compact JSON text (also in `response`); NULL otherwise and on failure. */
    const char *structured_json;
} parley_result;

/**
 * Completion callback: called exactly once per turn that async_process
 * accepted, on the agent's worker thread (also for the turns destroy()
 * cancels: destroy() returns after those callbacks), never from inside
 * async_process itself.
 */
/* [worker-thread] */
typedef void (*parley_done_fn)(void *user_data, const parley_result *result);

/** The function table returned by the entry point.  Static; never freed. */
typedef struct parley_plugin {
    uint32_t struct_size;
    uint32_t abi_version; /* PARLEY_ABI_VERSION the plugin implements */
    const char *name;     /* "parley" */
    const char *version;  /* e.g. "0.1.0" */

    /**
     * Make an agent from options (a JSON object; see docs/options.md).
     * Returns NULL on failure and, if `error` is not NULL, sets *error to a
     * message naming the offending option (free with free_string).  Unknown
     * keys, wrong types and out-of-range values are all errors.
     */
    /* [any-thread] [not-from-callback] [blocking: store I/O]: opens the store */
    parley_agent *(*create)(const parley_host *host, const char *options_json, char **error);

    /**
     * Cancel everything in flight, call each pending turn's done callback
     * with PARLEY_ERR_CANCELLED (on the worker thread, before returning; a
     * turn being written to the history store waits for the write and
     * reports it, as with cancel),
     * stop the worker, free the agent.  Blocks until then.  NULL is a no-op.  Not from a
     * callback of this agent.
     */
    /* [any-thread] [not-from-callback]: joins the worker */
    void (*destroy)(parley_agent *agent);

    /**
     * Start a turn.  Returns at once.
     * PARLEY_OK: the turn is accepted; *request_id (if not NULL) receives its
     *   id; `done` will be called exactly once, later, on the worker thread.
     *   The callback may run (on the worker) before async_process has even
     *   returned: a host that looks the turn up by request id must be ready
     *   for that.
     * Anything else (INVALID_INPUT, BUSY, NO_MEMORY, or CANCELLED while the
     *   agent is being destroyed): nothing was started,
     *   `done` will NOT be called, and *error (if not NULL) explains.
     * Turns on the same conversation_id run one after another in submission
     * order; turns on different conversations run concurrently.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*async_process)(parley_agent *agent, const parley_input *input,
                                   parley_done_fn done, void *user_data,
                                   parley_request_id *request_id, char **error);

    /**
     * Ask to cancel a turn.  Its done callback then comes with
     * PARLEY_ERR_CANCELLED (unless it already completed) and its history is
     * left untouched.  A turn already being written to the history store is
     * not cut off: its callback reports the write (PARLEY_OK: stored;
     * PARLEY_ERR_STORAGE: not).  PARLEY_ERR_NOT_FOUND if the id is unknown or done.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*cancel)(parley_agent *agent, parley_request_id request_id);

    /**
     * Give the result of a tool call (see parley_host.tool_call).
     * result_json: any JSON value, or plain text (sent to the model as-is);
     * NULL means "no output".  is_error != 0 marks a failure: the model
     * sees it as {"error": "tool_error", "error_text": ...}, with a JSON
     * result other than a string kept as JSON under "details" (see
     * docs/errors.md).  Any thread; exactly once per call.  Always frees
     * the handle.  `call` is an opaque id, not an address the plugin frees:
     * completing the same call a second time is detected and returns
     * PARLEY_ERR_NOT_FOUND, changing nothing.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*complete_tool_call)(parley_tool_call *call, const char *result_json,
                                        int is_error);

    /** JSON Schema (draft 2020-12) of every option with its default.  Free with free_string. */
    /* [any-thread] [callback-ok] */
    char *(*options_schema)(void);

    /** Free a string the plugin returned.  NULL is a no-op. */
    /* [any-thread] [callback-ok] */
    void (*free_string)(char *s);

    /** Stable name of a status ("ok", "timeout", ...).  Never NULL; static. */
    /* [any-thread] [callback-ok] */
    const char *(*status_name)(parley_status status);

    /* -- History introspection.  Thread-safe against turns in flight: they
     *    see committed turns only.  *out_json is freed with free_string.
     *    On PARLEY_ERR_STORAGE (as for every read function below) *out_json
     *    is {"error":{"status":"storage","field":"history_store","message"}}
     *    with the store's reason, also logged. -- */

    /** {"conversation_id", "created_at", "last_used_at", ..., "turns":[{"turn_id",
     *  "started_at", "finished_at", "tokens" (when known), "messages"}]} (docs/history.md)
     *  or NOT_FOUND. */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*history_get)(parley_agent *agent, const char *conversation_id,
                                 char **out_json);

    /** {"conversation_id", "turn": {...} (as history_get's turns: "tokens" included), "persona",
     *  "interface_type", "messages": [the turn's messages in history_query's form]} for a
     *  turn_id, or NOT_FOUND. */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*turn_get)(parley_agent *agent, const char *turn_id, char **out_json);

    /** {"conversations":[{"conversation_id","created_at","last_used_at","turns"}...]} */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*conversations_list)(parley_agent *agent, char **out_json);

    /** Forget one conversation (NOT_FOUND if unknown), or all when conversation_id is NULL. */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*history_clear)(parley_agent *agent, const char *conversation_id);

    /** Counters and gauges as a JSON object (turns, errors, retries, in_flight, ...). */
    /* [any-thread] [blocking: store I/O]: the store's counts */
    parley_status (*metrics)(parley_agent *agent, char **out_json);

    /* -- Appended after ABI 1.0: check struct_size before calling (a field
     *    beyond struct_size is not there). -- */

    /**
     * Connection check for a setup screen: can these options (a JSON object,
     * as for create()) reach the server?  Lists the server's models
     * (`GET <base_url>/models`; anthropic: `/v1/models`; ollama: `/api/tags`;
     * with the same auth headers turns send).  Needs no agent.  Blocking, on the calling thread (any thread,
     * concurrently); it takes at most connect_timeout_ms + request_timeout_ms.
     * PARLEY_OK: *out_json = {"ok":true,"url":"...","models":["id",...]}.
     * Else *out_json = NULL and *error says what is wrong in words a person
     * can act on ("nothing listens at ...; is the server running?"), with a
     * status: INVALID_OPTIONS, CONNECT (refused, DNS, TLS, connect timeout),
     * TIMEOUT (no answer), HTTP_STATUS (401 bad key, 404 wrong base_url, ...),
     * RATE_LIMITED, BAD_RESPONSE (not a model list), NO_MEMORY.
     * out_json and error may be NULL; strings set are freed with free_string.
     */
    /* [any-thread] [not-from-callback] [blocking: network] */
    parley_status (*check_connection)(const char *options_json, char **out_json, char **error);

    /**
     * Change the options of a live agent without forgetting anything.
     * options_json is a whole options object, as for create() (a key left out
     * takes its default, as at create).  It is validated like create()'s: on
     * any error nothing changes, PARLEY_ERR_INVALID_OPTIONS is returned and
     * *error (if not NULL; free with free_string) names the option
     * (PARLEY_ERR_NO_MEMORY, "out of memory", when memory ran out instead).
     * History is kept; turns in flight finish under the options they were
     * accepted with; turns accepted after this returns use the new ones.
     * Options that belong to what create() opened once -- history_store,
     * history_sync, history_keep_turns, max_conversations,
     * history_idle_timeout_s, max_connections -- cannot change: a different
     * value is refused by name (destroy and create the agent to change them).
     * Any thread, concurrently with everything but destroy; also from a
     * callback of this agent.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*update_options)(parley_agent *agent, const char *options_json, char **error);

    /* -- Messages (docs/history.md).  Any thread, concurrently with turns in
     *    flight (they see committed turns only); *out_json is freed with
     *    free_string.  On PARLEY_ERR_INVALID_INPUT, *out_json (when set) is
     *    {"error":{"status":"invalid_input","field":"limit","message":"..."}}
     *    naming the offending key. -- */

    /**
     * Query stored messages across conversations.  query_json: a JSON object
     * (NULL = {}) with optional keys conversation_id, interface_type,
     * persona, role, since, until (RFC 3339), search (ASCII-case-insensitive
     * text in a message's content), limit (1..10000, default 100), order
     * ("newest" default, or "oldest"), cursor (a next_cursor of the same
     * query), turn_id, interface_message_id.  PARLEY_OK: *out_json = {"messages":[message...],
     * "next_cursor":"..."|null}, where message = {"message_id",
     * "conversation_id","interface_type","persona","turn_id","role",
     * "created_at","message":{...}}.
     */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*history_query)(parley_agent *agent, const char *query_json, char **out_json);

    /** One stored message by message_id (the form history_query returns), or NOT_FOUND. */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*message_get)(parley_agent *agent, const char *message_id, char **out_json);

    /**
     * history_get / history_clear for a conversation named by a selector,
     * {"conversation_id", "interface_type"?, "persona"?} (absent or "" =
     * none: history_get_by({"conversation_id":"x"}) is history_get("x")).
     * history_clear_by also takes persona "*": the conversation under every
     * persona.  NOT_FOUND when nothing matched.  history_clear_by has no
     * out_json: a bad selector is INVALID_INPUT, explained through the host's
     * log callback.
     */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*history_get_by)(parley_agent *agent, const char *selector_json,
                                    char **out_json);
    /* [any-thread] [blocking: store I/O] */
    parley_status (*history_clear_by)(parley_agent *agent, const char *selector_json);

    /**
     * conversations_list filtered: filter_json = {"persona"?, "interface_type"?}
     * (each a string; "" = none; absent = any), or NULL for all.  Each listed
     * conversation carries "persona" and "interface_type" when they are not
     * empty.  A bad filter or an unknown persona is INVALID_INPUT with
     * *out_json = {"error":{"status","field","message"}}.
     */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*conversations_list_by)(parley_agent *agent, const char *filter_json,
                                           char **out_json);

    /* -- Message identity (docs/history.md).  Any thread. -- */

    /**
     * A message by the interface's own id: selector_json =
     * {"conversation_id", "interface_message_id", "interface_type"?, "persona"?}.
     * PARLEY_OK: *out_json = the message in history_query's form (the most
     * recently stored one if several carry that id).  NOT_FOUND if none;
     * INVALID_INPUT with *out_json = {"error":{...}} naming a bad key;
     * STORAGE when the store failed or cannot look messages up this way
     * (*out_json then says which, field "history_store").
     */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*message_find)(parley_agent *agent, const char *selector_json,
                                  char **out_json);

    /**
     * After the host sent a turn's answer: keep the interface's id of that
     * message (the turn's final answer) so message_find and reply_to find it.
     * Replaces an earlier value.  NOT_FOUND: no such turn is stored (unknown,
     * stateless, failed, or no longer kept).  INVALID_INPUT: an empty or
     * oversized (> 256 bytes) id.  STORAGE: the store failed (the host's log
     * callback says why).  Blocking until stored (a store call).
     */
    /* [any-thread] [blocking: store I/O] */
    parley_status (*set_interface_message_id)(parley_agent *agent, const char *turn_id,
                                              const char *interface_message_id);

    /**
     * Add a message to a conversation without calling the model (an
     * announcement: "the washing machine has finished").  message_json =
     * {"conversation_id", "content", "role"?: "assistant" (default), "user"
     * or "system", "interface_type"?, "persona"?, "interface_message_id"?,
     * "metadata"?: {...}, "timestamp"?: RFC 3339, stored as its created_at}.  Like async_process: it waits behind the turns
     * already accepted on that conversation (never lands inside one), is
     * stored as a turn of one message, and the model sees it in later turns
     * (a "system" note as "[system note] ..." user text: docs/history.md).
     * `done` is called exactly once, on the worker thread, with
     * response = content, turn_id, answer_message_id = the new message's id,
     * steps_json "[]"; status INVALID_INPUT (named in error_message) is
     * returned here instead, nothing queued.  cancel(request_id) works as
     * for a turn.  Errors as async_process's.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*append_message)(parley_agent *agent, const char *message_json,
                                    parley_done_fn done, void *user_data,
                                    parley_request_id *request_id, char **error);

    /**
     * Why the history function just called on this thread failed, in words a
     * person can act on ("no conversation \"42\" under persona \"chef\"",
     * "selector 'persona': unknown persona \"pirate\" (personas: \"chef\")", the
     * store's own error).  Covers history_get, turn_get, history_clear,
     * history_query, message_get, history_get_by, history_clear_by,
     * conversations_list_by, message_find and set_interface_message_id:
     * each forgets the thread's previous message when called and leaves
     * one when it fails.  NULL when there is none.  Free with free_string.
     * Call it on the thread that made the failing call, right after it.
     */
    /* [any-thread] [callback-ok] */
    char *(*last_error)(void);

    /**
     * Add one persona to a live agent, or replace the one of that name, without
     * sending the whole options again: persona_json is its settings as in the
     * `personas` option ({"prompt": "You are a chef.", "temperature": 0.9}).
     * Validated as create() validates `personas`: on any error nothing changes,
     * PARLEY_ERR_INVALID_INPUT and *error (if not NULL; free with free_string)
     * names the field ("name: ...", "persona_json: ...unknown key..."); PARLEY_ERR_NO_MEMORY
     * (nothing changed) when memory ran out.
     * Every history is kept (a replaced persona keeps its conversations); turns
     * in flight finish under the persona they started with; turns accepted
     * after this returns use the new one.  Any thread, also from a callback.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*persona_put)(parley_agent *agent, const char *name,
                                 const char *persona_json, char **error);

    /**
     * Remove one persona from a live agent: later turns naming it are
     * INVALID_INPUT.  Its conversations stay in the store (persona_put of the
     * same name brings them back; history_clear_by with persona "*" reaches
     * them).  NOT_FOUND when there is no such persona; INVALID_INPUT for an
     * empty name.  *error as for persona_put.
     */
    /* [any-thread] [callback-ok] */
    parley_status (*persona_remove)(parley_agent *agent, const char *name, char **error);

    /**
     * The metrics in the Prometheus text exposition format (0.0.4), for a
     * scraper (the shim serves it at /metrics): parley_* counters, monotonic
     * for the agent's life, and gauges of what is true now, labelled by
     * persona, interface_type, reason, outcome (never a conversation id);
     * docs/abi.md lists them.  *out_text is freed with free_string.  Any
     * thread.  The JSON `metrics` stays as it is.
     */
    /* [any-thread] [blocking: store I/O]: the store's counts */
    parley_status (*metrics_prometheus)(parley_agent *agent, char **out_text);
} parley_plugin;

/**
 * The entry point.  Returns the function table if the plugin can serve a host
 * built against `host_abi_version`, else NULL.
 */
typedef const parley_plugin *(*parley_entry_fn)(uint32_t host_abi_version);

PARLEY_EXPORT const parley_plugin *parley_plugin_entry(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* PARLEY_PLUGIN_H */
