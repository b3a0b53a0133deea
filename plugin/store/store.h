/*
 * store.h -- where conversations are kept.  One interface, one file per
 * backend (memory.c, sqlite.c, redis.c), in the spirit of SQLite's
 * sqlite3_vfs and curl's lib/vtls/: the agent and the turn know only this
 * header; a backend is a table of functions plus a struct that starts with
 * `struct store`.
 *
 * What a store holds
 * ------------------
 * Conversations, each named by a store_key (the conversation id, qualified by
 * persona and interface so that the same id under two personas or two
 * interfaces is two conversations).  A conversation is an ordered list of
 * whole TURNS; a turn is its messages, in order.  A message is an opaque JSON
 * object text (the store never interprets it) plus the few fields the store
 * indexes: its id, role and time.  The unit of writing, truncation and
 * deletion is the whole turn, so a tool result is never kept or sent without
 * the call that asked for it.
 *
 * Retention (what is KEPT) is the store's: store_limits.  What is SENT is the
 * caller's: load() takes the number of most recent turns it wants.
 *
 * Errors
 * ------
 * Every function returns a parley_status: PARLEY_OK, PARLEY_ERR_NOT_FOUND
 * (where documented), PARLEY_ERR_NO_MEMORY, or PARLEY_ERR_STORAGE (I/O
 * failure, corrupt data, lost connection).  On failure *err, when err is not
 * NULL, receives a malloc'd message for a person: it names the store
 * ("sqlite store /var/lib/parley/history.db: disk I/O error") and never holds
 * a secret (password).  A failed call changes nothing: append() is atomic.
 *
 * Threads
 * -------
 * Every function of an open store may be called from any thread, concurrently
 * (host threads read history while the agent's turns load and append); the
 * backend serialises internally as it needs.  A backend whose calls may block
 * on I/O (disk, network) sets `blocking`: the agent then never calls its
 * load/append/expire on the worker thread that runs the HTTP transfers.
 *
 * The door
 * --------
 * Code outside store/ never calls a backend's table: it calls the store_*()
 * functions at the end of this header (as curl's vtls.c fronts every TLS
 * backend and SQLite's os.c every VFS).  Every method is required except the
 * lease pair; store_open() checks the table once (its version, no required
 * method missing), so no caller tests for a NULL method or a version.
 *
 * Versioning
 * ----------
 * STORE_BACKEND_VERSION counts the revisions of the table.  Every backend is
 * built in, so a table of another version is a build mistake that
 * store_open() refuses.
 */
#ifndef PARLEY_STORE_H
#define PARLEY_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/plugin_status.h"

#define STORE_BACKEND_VERSION 6

/* Longest conversation id, and the length of turn and message ids (UUIDs). */
#define STORE_MAX_CONVERSATION_ID 256
/* Longest interface_message_id (an interface's own message id, e.g. Telegram's). */
#define STORE_MAX_INTERFACE_MESSAGE_ID 256
#define STORE_ID_LEN 36

typedef struct store store;

/* Names one conversation.  "" (never NULL) for "no persona" / "no interface". */
typedef struct store_key {
    const char *conversation_id; /* 1..STORE_MAX_CONVERSATION_ID bytes, validated by the caller */
    const char *persona;
    const char *interface_type;
} store_key;

/* One message of a turn being appended (borrowed for the call). */
typedef struct store_message {
    const char *message_id;      /* STORE_ID_LEN chars, unique in the store */
    const char *role;            /* "user", "assistant", "tool", "system" */
    uint64_t created_ms;         /* wall clock, ms since the epoch */
    const char *json;            /* the message: one JSON object, compact */
    size_t json_len;
    /* version 4: identity the host gave it (both optional) */
    const char *interface_message_id; /* NULL, or 1..STORE_MAX_INTERFACE_MESSAGE_ID bytes */
    const char *metadata;        /* NULL, or one compact JSON object, kept verbatim */
    size_t metadata_len;
} store_message;

/* One whole turn being appended (borrowed for the call). */
typedef struct store_turn {
    const char *turn_id;         /* STORE_ID_LEN chars: a lowercase UUID (memory keeps 16 bytes) */
    uint64_t started_ms;         /* wall clock */
    uint64_t finished_ms;
    const store_message *messages;
    size_t nmessages;            /* >= 1 */
    /* version 5: when not NULL, the conversation's context record (context_set)
     * becomes these bytes in the same atomic step as the turn (ignored by a
     * retried append that finds the turn stored) */
    const char *context;
    size_t context_len;
    /* version 6: the turn's size in tokens as the context engine knew it at
     * commit (context/window.h, ctx_turn_tokens); 0 = unknown.  Kept with the
     * turn, returned by load_sized and shown by get_conversation / get_turn. */
    uint32_t tokens;
} store_turn;

/* Version 6: what load_sized says of each turn it loaded, oldest first. */
typedef struct store_turn_size {
    uint32_t nmessages; /* the turn's messages in the loaded text */
    uint32_t tokens;    /* store_turn.tokens as appended; 0 = unknown (e.g. stored before v6) */
} store_turn_size;

typedef struct store_sizes {
    store_turn_size *turn; /* malloc'd; the caller frees it */
    size_t n, cap;
    int oom;               /* an entry could not be added: the sizes are incomplete */
} store_sizes;

/* Add one turn's size (sets oom on failure). */
void store_sizes_add(store_sizes *z, uint32_t nmessages, uint32_t tokens);

/* Version 4: what a conversation did over its whole life.  Kept when turns
 * are dropped by keep_turns (counts never go down); restarts from zero only
 * when the conversation itself is forgotten (cleared, evicted, expired). */
#define STORE_ROLE_USER 1u
#define STORE_ROLE_ASSISTANT 2u
#define STORE_ROLE_TOOL 4u
#define STORE_ROLE_SYSTEM 8u

typedef struct store_lifetime {
    uint64_t last_message_ms;    /* created_ms of its newest message */
    uint64_t message_count;      /* messages ever appended */
    uint64_t turn_count;         /* turns ever appended (a message appended outside a
                                    turn is a turn of one message) */
    unsigned roles;              /* STORE_ROLE_* of every role that ever took part */
} store_lifetime;

typedef struct store_limits {
    size_t keep_turns;           /* whole turns kept per conversation, oldest dropped; 0 = all */
    size_t max_conversations;    /* >= 1; beyond it the least recently used is forgotten */
    uint64_t idle_timeout_ms;    /* forget a conversation idle this long; 0 = never */
} store_limits;

/* Where the backend may say things (warnings at open, recovery); may be NULL. */
typedef void (*store_log_fn)(void *ud, parley_log_level level, const char *message);

typedef struct store_config {
    const char *location;        /* what follows "scheme:" in history_store ("" for memory) */
    store_limits limits;
    int sync_full;               /* durable backends: flush to stable storage on every append */
    store_log_fn log;
    void *log_ud;
    const char *key_prefix;      /* shared stores (redis): the prefix of every key; NULL = "parley:" */
    uint64_t lease_ms;           /* shared stores: a lease's life without renewal; 0 = 10000 */
} store_config;

typedef struct store_stats {
    size_t conversations;
    size_t turns;
    size_t message_bytes;        /* bytes of stored message JSON */
    size_t evicted;              /* conversations forgotten by max_conversations, since open */
    size_t expired;              /* conversations forgotten by the idle timeout, since open */
    size_t messages;             /* messages of the stored turns, now */
    size_t trimmed;              /* turns dropped to keep keep_turns per conversation, since
                                    open (by this process, for a shared store) */
} store_stats;

/* Version 3: a query over stored messages (borrowed for the call).  Every
 * filter is independent; NULL means "any". */
#define STORE_QUERY_MAX_LIMIT 10000

typedef struct store_query {
    const char *conversation_id; /* NULL: every conversation */
    const char *persona;         /* NULL: any persona ("" is "no persona") */
    const char *interface_type;  /* NULL: any interface ("" is "no interface") */
    const char *role;            /* NULL, or "user", "assistant", "tool", "system" */
    uint64_t since_ms;           /* created_ms >= since_ms (0: no bound) */
    uint64_t until_ms;           /* created_ms <= until_ms (UINT64_MAX: no bound) */
    const char *search;          /* NULL or "": none; else ASCII-case-insensitive substring
                                    of the message's string "content" */
    size_t limit;                /* 1..STORE_QUERY_MAX_LIMIT */
    int newest_first;            /* order: 1 newest first, 0 oldest first */
    uint64_t after;              /* a position returned earlier: continue strictly beyond
                                    it in this order; 0: from the start */
    const char *turn_id;         /* NULL: any turn; else only that turn's messages */
    const char *interface_message_id; /* NULL: any; else only messages carrying that
                                    interface id */
} store_query;

typedef struct store_backend {
    int version;                 /* STORE_BACKEND_VERSION the table was written for */
    const char *scheme;          /* "memory", "sqlite", "redis" */
    int blocking;                /* calls may block on I/O: keep them off the worker */

    /* Open (create if missing) the store described by cfg.  The backend
     * copies what it keeps of cfg.  A file it does not recognise (not a
     * Parley store, corrupt, a newer schema) is refused unmodified with a
     * message naming the location and the reason; so is a store another
     * agent holds, unless the backend shares it safely. */
    parley_status (*open)(const store_config *cfg, store **out, char **err);
    void (*close)(store *s);

    /*
     * The messages of the last `last_turns` turns of `key` (0 = all), oldest
     * first, appended to `out` each followed by ',' ("m1,m2,"), and their
     * count in *nmessages.  An unknown conversation, or one idle past the
     * timeout at now_ms (it is then forgotten), is PARLEY_OK with nothing
     * appended.  Reading never changes what a later read shows.
     */
    parley_status (*load)(store *s, const store_key *key, size_t last_turns, uint64_t now_ms,
                          pbuf *out, size_t *nmessages, char **err);

    /*
     * Append one whole turn to `key`, creating the conversation if needed (or
     * restarting it when it was idle past the timeout), then apply the
     * limits: drop turns beyond keep_turns, forget least recently used
     * conversations beyond max_conversations (never `key` itself).
     * Idempotent: a turn_id already in the store is PARLEY_OK and changes
     * nothing (a retried append never duplicates a turn).  Atomic: on failure
     * nothing of the turn is stored.
     */
    parley_status (*append)(store *s, const store_key *key, const store_turn *turn,
                            uint64_t now_ms, char **err);

    /*
     * The JSON the ABI returns (appended to out; write it with store_json.h
     * so every backend prints the same bytes for the same content):
     *   get_conversation: {"conversation_id","created_at","last_used_at","turns":[turn...]}
     *   get_turn:         {"conversation_id","turn":turn}
     *   list:             {"conversations":[{"conversation_id","created_at","last_used_at",
     *                      "turns":N}...]}, most recently used first
     * where turn = {"turn_id","started_at","finished_at","messages":[...]}.
     * PARLEY_ERR_NOT_FOUND for an unknown (or expired at now_ms) conversation or turn.
     */
    parley_status (*get_conversation)(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                      char **err);
    parley_status (*get_turn)(store *s, const char *turn_id, uint64_t now_ms, pbuf *out,
                              char **err);
    parley_status (*list)(store *s, uint64_t now_ms, pbuf *out, char **err);

    /* Forget one conversation (PARLEY_ERR_NOT_FOUND if unknown), or all when key is NULL. */
    parley_status (*forget)(store *s, const store_key *key, char **err);

    /* Forget every conversation idle past the timeout at now_ms; *expired (may be NULL) counts them. */
    parley_status (*expire)(store *s, uint64_t now_ms, size_t *expired, char **err);

    parley_status (*stats)(store *s, store_stats *out, char **err);

    /* ---- version 2: order across processes sharing one store ----
     * NULL in a backend that one process owns (its lanes already order the
     * turns of a conversation).  A turn takes the lease on its conversation
     * before it loads history and gives it back after its append (or its
     * failure), so turns on one conversation run one after another even on
     * several hosts, each seeing the turn before.
     *
     * lease_acquire: PARLEY_OK when this store object now holds the lease
     * on `key` (until lease_release; the backend renews it meanwhile, and
     * append() on `key` is fenced by it: should the lease have expired and
     * been taken by another holder, the append fails with
     * PARLEY_ERR_STORAGE and writes nothing); PARLEY_ERR_BUSY when another
     * holder has it, *retry_ms then hinting when to try again;
     * PARLEY_ERR_STORAGE when the store cannot say.  A successful append on
 * `key` also gives its lease back (one round trip less per turn).
     * lease_release: give it back (a no-op when not held); never fails (a
     * lease it could not delete expires by itself). */
    parley_status (*lease_acquire)(store *s, const store_key *key, uint64_t *retry_ms, char **err);
    void (*lease_release)(store *s, const store_key *key);

    /* ---- version 3: queries and per-message reads ---- */

    /*
     * The messages matching q, in q's order, at most q->limit, appended to
     * `out` as message objects (store_json_message) joined by ',' (no
     * brackets); *count receives how many.  *last receives the POSITION of
     * the last one written (an opaque number, increasing with the order
     * messages were stored: the caller passes it back as q->after for the
     * next page), *more whether more messages match beyond it.  Expired
     * conversations are not shown.
     */
    parley_status (*query)(store *s, const store_query *q, uint64_t now_ms, pbuf *out,
                           size_t *count, uint64_t *last, int *more, char **err);

    /* One message by its message_id, as store_json_message; PARLEY_ERR_NOT_FOUND if unknown. */
    parley_status (*get_message)(store *s, const char *message_id, uint64_t now_ms, pbuf *out,
                                 char **err);

    /* ---- version 4: message identity ----
     *
     * Messages appended with interface_message_id / metadata return them in
     * store_json_message; get_conversation and list carry each
     * conversation's store_lifetime (store_json_lifetime, right after the
     * head); append() keeps the lifetime up to date in the same atomic step.
     */

    /*
     * The interface's id of turn `turn_id`'s final answer, set after the host
     * sent it: the turn's LAST message whose role is "assistant" (for a turn
     * without one, its last message) gets interface_message_id, replacing
     * any earlier value.  *message_id (when not NULL; STORE_ID_LEN + 1 bytes)
     * receives that message's id.  PARLEY_ERR_NOT_FOUND: no such turn kept
     * (unknown, dropped by keep_turns, or expired at now_ms).
     */
    parley_status (*set_interface_message_id)(store *s, const char *turn_id,
                                              const char *interface_message_id, uint64_t now_ms,
                                              char *message_id, char **err);

    /*
     * The message of conversation `key` whose interface_message_id is
     * `interface_message_id` (the most recently stored one if several), as
     * store_json_message appended to out.  PARLEY_ERR_NOT_FOUND if none.
     */
    parley_status (*find_message)(store *s, const store_key *key,
                                  const char *interface_message_id, uint64_t now_ms, pbuf *out,
                                  char **err);

    /*
     * Reply context: the turn of conversation `key` named by turn_id (when
     * not NULL), else the turn holding a message whose interface_message_id
     * is `interface_message_id` (the most recently stored one).  A turn of
     * another conversation is not a match.  PARLEY_ERR_NOT_FOUND when there
     * is none.  Else *turn_id_out (STORE_ID_LEN + 1 bytes) receives its id,
     * and: if it is one of the last `window_turns` turns of key (the ones
     * load(key, window_turns) returns; window_turns 0 = all), *in_window = 1
     * and nothing is appended; otherwise *in_window = 0 and its messages are
     * appended to out in load()'s form ("m1,m2,"), *nmessages counting them.
     */
    parley_status (*load_turn)(store *s, const store_key *key, const char *turn_id,
                               const char *interface_message_id, size_t window_turns,
                               uint64_t now_ms, pbuf *out, size_t *nmessages, char *turn_id_out,
                               int *in_window, char **err);

    /* ---- version 5: the context engine's record ----
     *
     * One small JSON object per conversation that the context engine writes
     * and reads (context/window.h: where the history sent starts, the
     * running summary); the store never interprets it.  It lives and dies
     * with its conversation: forgetting, evicting or expiring the
     * conversation forgets it too.
     */

    /*
     * The record of `key` appended to out ("" when it has none, or the
     * conversation is unknown or expired at now_ms), and *life the
     * conversation's lifetime (all 0 when unknown), both read at one moment.
     */
    parley_status (*context_get)(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                 store_lifetime *life, char **err);

    /*
     * Replace the record of `key` (json: one compact JSON object, len bytes)
     * -- when `expected` is not NULL, only if the record is still exactly
     * those expected_len bytes ("" when it has none): else PARLEY_ERR_BUSY
     * and nothing changes (another host's turn wrote it meanwhile).
     * PARLEY_ERR_NOT_FOUND when the conversation is unknown or expired: a
     * record is never written for a conversation the store does not hold.
     * Changes nothing else (not the LRU order, not last_used).
     */
    parley_status (*context_set)(store *s, const store_key *key, const char *json, size_t len,
                                 const char *expected, size_t expected_len, uint64_t now_ms,
                                 char **err);

    /* ---- version 6: turn sizes ---- */

    /*
     * load(), and each loaded turn's size appended to *sizes (oldest first;
     * their nmessages add up to *nmessages), read at the same moment.
     */
    parley_status (*load_sized)(store *s, const store_key *key, size_t last_turns,
                                uint64_t now_ms, pbuf *out, size_t *nmessages, store_sizes *sizes,
                                char **err);
} store_backend;

/* The first member of every backend's store object. */
struct store {
    const store_backend *backend;
};

/*
 * The backend for a history_store option value: "memory", "sqlite:PATH", or
 * "redis://[:PASSWORD@]HOST:PORT[/DB]".
 * Sets *location to what follows the scheme's colon ("" for memory).  NULL
 * when the scheme is unknown.
 */
const store_backend *store_backend_for(const char *spec, const char **location);

extern const store_backend store_memory_backend;
extern const store_backend store_sqlite_backend;
extern const store_backend store_redis_backend;

/*
 * The door (see "The door" above).  Each forwards to the backend's method of
 * the same name, whose comment in store_backend says what it does.
 */

/* Check the table (version, every required method), then open.  A bad table is
 * PARLEY_ERR_STORAGE with *err naming the backend and what is wrong. */
parley_status store_open(const store_backend *b, const store_config *cfg, store **out, char **err);
void store_close(store *s); /* NULL is a no-op */

const char *store_scheme(const store *s); /* "memory", "sqlite", "redis" */
int store_blocking(const store *s);       /* calls may block: keep them off the worker */
int store_shared(const store *s);         /* several processes share it: turns take leases */

parley_status store_load(store *s, const store_key *key, size_t last_turns, uint64_t now_ms,
                         pbuf *out, size_t *nmessages, char **err);
parley_status store_load_sized(store *s, const store_key *key, size_t last_turns,
                               uint64_t now_ms, pbuf *out, size_t *nmessages, store_sizes *sizes,
                               char **err);
parley_status store_context_get(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                store_lifetime *life, char **err);
parley_status store_context_set(store *s, const store_key *key, const char *json, size_t len,
                                const char *expected, size_t expected_len, uint64_t now_ms,
                                char **err);
parley_status store_append(store *s, const store_key *key, const store_turn *turn,
                           uint64_t now_ms, char **err);
parley_status store_get_conversation(store *s, const store_key *key, uint64_t now_ms, pbuf *out,
                                     char **err);
parley_status store_get_turn(store *s, const char *turn_id, uint64_t now_ms, pbuf *out,
                             char **err);
parley_status store_list(store *s, uint64_t now_ms, pbuf *out, char **err);
parley_status store_forget(store *s, const store_key *key, char **err);
parley_status store_expire(store *s, uint64_t now_ms, size_t *expired, char **err);
parley_status store_stats_get(store *s, store_stats *out, char **err);

/* A store that is not shared needs no lease: acquiring succeeds at once and
 * releasing does nothing (its lanes already order a conversation's turns). */
parley_status store_lease_acquire(store *s, const store_key *key, uint64_t *retry_ms,
                                  char **err);
void store_lease_release(store *s, const store_key *key);

parley_status store_query_run(store *s, const store_query *q, uint64_t now_ms, pbuf *out,
                          size_t *count, uint64_t *last, int *more, char **err);
parley_status store_get_message(store *s, const char *message_id, uint64_t now_ms, pbuf *out,
                                char **err);
parley_status store_set_interface_message_id(store *s, const char *turn_id,
                                             const char *interface_message_id, uint64_t now_ms,
                                             char *message_id, char **err);
parley_status store_find_message(store *s, const store_key *key,
                                 const char *interface_message_id, uint64_t now_ms, pbuf *out,
                                 char **err);
parley_status store_load_turn(store *s, const store_key *key, const char *turn_id,
                              const char *interface_message_id, size_t window_turns,
                              uint64_t now_ms, pbuf *out, size_t *nmessages, char *turn_id_out,
                              int *in_window, char **err);

#endif
