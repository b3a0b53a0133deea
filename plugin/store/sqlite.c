/*
 * sqlite.c -- the durable store: one SQLite file (see store.h; the file
 * format, what survives what and the migration path are in docs/history.md).
 *
 * Schema version 4 (PRAGMA user_version = 4, application_id = "Prly"):
 *   store_meta     one row: how many conversations, turns and message bytes
 *                  the file holds, so that opening a store reads no table;
 *   conversations  one row per (persona, interface_type, conversation_id),
 *                  with its times, its counts and `use_seq`, the LRU order
 *                  (larger = committed to more recently; the memory store's
 *                  list order, which wall-clock times cannot give when two
 *                  commits share a millisecond or the clock steps back), and
 *                  (v2) its lifetime (store_lifetime), kept across trimming,
 *                  and (v3) `context`, the context engine's record (store.h
 *                  version 5; NULL: none), deleted with its row;
 *   turns          one row per turn, `turn_id` UNIQUE (appends are idempotent),
 *                  with (v4) `tokens`, its size in tokens (store.h version 6;
 *                  NULL: unknown, as in every row stored before v4);
 *   messages       one row per message, in order within its turn, with (v2)
 *                  the host's interface_message_id and metadata (NULL: none)
 *                  and its conversation (NULL in rows stored before v2 that
 *                  never got an interface id: only the interface id index
 *                  needs it).
 * Every index serves one operation: conversations' UNIQUE key (find by
 * key), conversations_by_use (LRU eviction, idle expiry, list order),
 * turns' UNIQUE turn_id (get a turn, idempotency), turns_by_conversation
 * (the last N turns, trimming), messages_by_turn (a turn's messages),
 * messages_by_message_id (message_get), messages_by_interface_id (find a
 * message or a reply's turn by the interface's id within a conversation;
 * partial: only messages that have one).
 *
 * A file is created as version 1 and upgraded to 4 in the same transaction,
 * so new files and upgraded ones have exactly the same schema, and the
 * upgrades run on every new file.  A version-1, 2 or 3 file is upgraded in
 * place when it is opened (one transaction; on failure it is refused
 * unchanged).
 *
 * Opening never modifies a file it does not recognise: the header is read
 * with plain read(2) first (not SQLite, not ours, corrupt header, newer
 * schema), and SQLite only opens a file that claims to be a Parley store;
 * then the schema is checked through SQLite with checkpoint-on-close off, so
 * a refusal at that point still leaves the database file as it was.
 *
 * Three connections, each used under its own mutex, so every call may come
 * from any thread: writes (append, forget, expire) on one; reads (load and
 * the JSON dumps, each in one read transaction: a WAL snapshot) on another,
 * so a read never waits for a commit's fsync; and the checkpointer's, which
 * copies the WAL into the database on its own thread.  `blocking` is set:
 * the agent keeps these calls off its transfer loop.
 * A side file PATH-lock, held with flock(2) while the store is open, makes
 * a second agent (another process, or the same one: flock locks belong to
 * the open file description) fail with "in use by another agent".
 *
 * Files changed under a running store (check_wal, check_lock: a stat(2)
 * before each write and every second on the checkpointer's thread): a
 * deleted WAL is copied into the file while it can still be read, then
 * writes stop; a deleted PATH-lock is made again.  A corruption error on any
 * connection stops writes and every checkpoint, the one at close included.
 * Each write reads store_meta inside its transaction, so a second writer
 * (PATH-lock deleted) cannot make the totals wrong.
 */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store_json.h"

#define SQLITE_STORE_APPLICATION_ID 0x50726c79 /* "Prly" */
#define SQLITE_STORE_SCHEMA_VERSION 4
#define SQLITE_STORE_BUSY_TIMEOUT_MS 5000

static const char schema_v1[] =
    "CREATE TABLE store_meta("
    " id INTEGER PRIMARY KEY CHECK (id = 1),"
    " conversations INTEGER NOT NULL,"
    " turns INTEGER NOT NULL,"
    " message_bytes INTEGER NOT NULL);"
    "INSERT INTO store_meta VALUES (1, 0, 0, 0);"
    "CREATE TABLE conversations("
    " id INTEGER PRIMARY KEY,"
    " persona TEXT NOT NULL,"
    " interface_type TEXT NOT NULL,"
    " conversation_id TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " last_used_ms INTEGER NOT NULL,"
    " use_seq INTEGER NOT NULL,"
    " turns INTEGER NOT NULL,"
    " message_bytes INTEGER NOT NULL,"
    " UNIQUE (persona, interface_type, conversation_id));"
    "CREATE UNIQUE INDEX conversations_by_use ON conversations(use_seq);"
    "CREATE TABLE turns("
    " id INTEGER PRIMARY KEY,"
    " conversation INTEGER NOT NULL REFERENCES conversations(id),"
    " turn_id TEXT NOT NULL UNIQUE,"
    " started_ms INTEGER NOT NULL,"
    " finished_ms INTEGER NOT NULL,"
    " message_bytes INTEGER NOT NULL);"
    "CREATE INDEX turns_by_conversation ON turns(conversation, id);"
    "CREATE TABLE messages("
    " id INTEGER PRIMARY KEY,"
    " turn INTEGER NOT NULL REFERENCES turns(id),"
    " message_id TEXT NOT NULL,"
    " role TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " json TEXT NOT NULL);"
    "CREATE INDEX messages_by_turn ON messages(turn);";

/*
 * Version 1 -> 2: message identity and conversation lifetimes.  A v1 file
 * kept no lifetime, so an upgraded conversation's counts start from the
 * turns it still holds (turns already dropped by keep_turns are not
 * counted); last_message_ms is the created_ms of its last stored message.
 * messages.conversation stays NULL in v1 rows (none has an interface id:
 * set_interface_message_id fills it when it gives one).
 * messages_by_message_id was created by a v1 build with queries; IF NOT
 * EXISTS covers files of the builds before it.  (In SQLite `|` and `<<` have
 * the same precedence, hence the parentheses.)
 */
static const char migration_v2[] =
    "ALTER TABLE messages ADD COLUMN interface_message_id TEXT;"
    "ALTER TABLE messages ADD COLUMN metadata TEXT;"
    "ALTER TABLE messages ADD COLUMN conversation INTEGER;"
    "ALTER TABLE conversations ADD COLUMN last_message_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE conversations ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE conversations ADD COLUMN turn_count INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE conversations ADD COLUMN roles INTEGER NOT NULL DEFAULT 0;"
    "UPDATE conversations SET message_count = kept.n, turn_count = conversations.turns,"
    " roles = kept.roles,"
    " last_message_ms = (SELECT created_ms FROM messages WHERE id = kept.last) FROM ("
    "  SELECT t.conversation AS conversation, max(m.id) AS last,"
    "   count(*) AS n, (max(m.role = 'user')) | (max(m.role = 'assistant') << 1)"
    "   | (max(m.role = 'tool') << 2) | (max(m.role = 'system') << 3) AS roles"
    "  FROM messages m JOIN turns t ON t.id = m.turn GROUP BY t.conversation) AS kept"
    " WHERE conversations.id = kept.conversation;"
    "CREATE INDEX IF NOT EXISTS messages_by_message_id ON messages(message_id);"
    "CREATE INDEX messages_by_interface_id ON messages(conversation, interface_message_id)"
    " WHERE interface_message_id IS NOT NULL;"
    "PRAGMA user_version = 2;";

/* Version 2 -> 3: the context engine's record of each conversation (NULL: none yet). */
static const char migration_v3[] =
    "ALTER TABLE conversations ADD COLUMN context TEXT;"
    "PRAGMA user_version = 3;";

/* Version 3 -> 4: each turn's size in tokens (NULL: unknown; the context
 * engine then estimates it from the turn's bytes, as it did before). */
static const char migration_v4[] =
    "ALTER TABLE turns ADD COLUMN tokens INTEGER;"
    "PRAGMA user_version = 4;";

/* The conversation columns read_conv_row() reads, in its order. */
#define CONV_COLUMNS                                                                      \
    "id, created_ms, last_used_ms, turns, message_bytes, last_message_ms, message_count," \
    " turn_count, roles"

/* The columns every message read selects; the FROM clause joins its turn and conversation.
 * A message's position is its row id: rows are inserted in append order. */
#define MESSAGE_COLUMNS                                                                      \
    "SELECT m.id, m.message_id, m.role, m.created_ms, m.json, t.turn_id, c.conversation_id," \
    " c.persona, c.interface_type, m.interface_message_id, m.metadata"                       \
    " FROM messages m JOIN turns t ON t.id = m.turn"                                         \
    " JOIN conversations c ON c.id = t.conversation"

/* The prepared statements, made on first use and kept until close. */
enum stmt_id {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_BEGIN_READ,
    S_FIND_CONVERSATION,
    S_CONVERSATION_BY_ROW,
    S_TURN_EXISTS,
    S_INSERT_CONVERSATION,
    S_UPDATE_CONVERSATION,
    S_INSERT_TURN,
    S_INSERT_MESSAGE,
    S_OLDEST_TURN,
    S_DELETE_TURN_MESSAGES,
    S_DELETE_TURN,
    S_DELETE_CONVERSATION_MESSAGES,
    S_DELETE_CONVERSATION_TURNS,
    S_DELETE_CONVERSATION,
    S_LRU,
    S_SET_META,
    S_LOAD,
    S_CONVERSATION_MESSAGES,
    S_FIND_TURN,
    S_TURN_MESSAGES,
    S_LIST,
    S_IID_TARGET,
    S_SET_IID,
    S_TURN_IN_CONVERSATION,
    S_TURN_BY_IID,
    S_TURNS_AFTER,
    S_MESSAGE_BY_IID,
    S_READ_META,
    S_CONTEXT_GET,
    S_CONTEXT_SET,
    S_COUNT
};

static const char *const stmt_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_BEGIN_READ] = "BEGIN",
    [S_FIND_CONVERSATION] = "SELECT " CONV_COLUMNS " FROM conversations"
                            " WHERE persona = ?1 AND interface_type = ?2 AND conversation_id = ?3",
    [S_CONVERSATION_BY_ROW] = "SELECT " CONV_COLUMNS " FROM conversations WHERE id = ?1",
    [S_TURN_EXISTS] = "SELECT 1 FROM turns WHERE turn_id = ?1",
    [S_INSERT_CONVERSATION] =
        "INSERT INTO conversations(persona, interface_type, conversation_id, created_ms,"
        " last_used_ms, use_seq, turns, message_bytes) VALUES (?1, ?2, ?3, ?4, ?4, ?5, 0, 0)",
    [S_UPDATE_CONVERSATION] = "UPDATE conversations SET created_ms = ?2, last_used_ms = ?3,"
                              " use_seq = ?4, turns = ?5, message_bytes = ?6,"
                              " last_message_ms = ?7, message_count = ?8, turn_count = ?9,"
                              " roles = ?10 WHERE id = ?1",
    [S_INSERT_TURN] = "INSERT INTO turns(conversation, turn_id, started_ms, finished_ms,"
                      " message_bytes, tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [S_INSERT_MESSAGE] = "INSERT INTO messages(turn, message_id, role, created_ms, json,"
                         " interface_message_id, metadata, conversation)"
                         " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [S_OLDEST_TURN] = "SELECT id, message_bytes FROM turns WHERE conversation = ?1"
                      " ORDER BY id LIMIT 1",
    [S_DELETE_TURN_MESSAGES] = "DELETE FROM messages WHERE turn = ?1",
    [S_DELETE_TURN] = "DELETE FROM turns WHERE id = ?1",
    [S_DELETE_CONVERSATION_MESSAGES] =
        "DELETE FROM messages WHERE turn IN (SELECT id FROM turns WHERE conversation = ?1)",
    [S_DELETE_CONVERSATION_TURNS] = "DELETE FROM turns WHERE conversation = ?1",
    [S_DELETE_CONVERSATION] = "DELETE FROM conversations WHERE id = ?1",
    [S_LRU] = "SELECT id, last_used_ms, turns, message_bytes FROM conversations"
              " ORDER BY use_seq LIMIT 1",
    [S_SET_META] = "UPDATE store_meta SET conversations = ?1, turns = ?2, message_bytes = ?3"
                   " WHERE id = 1",
    [S_LOAD] = "SELECT m.json, m.turn, t.tokens FROM messages m JOIN turns t ON t.id = m.turn"
               " WHERE m.turn IN (SELECT id FROM turns"
               " WHERE conversation = ?1 ORDER BY id DESC LIMIT ?2) ORDER BY m.turn, m.id",
    [S_CONVERSATION_MESSAGES] = "SELECT t.id, t.turn_id, t.started_ms, t.finished_ms, m.json,"
                                " t.tokens"
                                " FROM turns t JOIN messages m ON m.turn = t.id"
                                " WHERE t.conversation = ?1 ORDER BY t.id, m.id",
    [S_FIND_TURN] = "SELECT t.id, t.started_ms, t.finished_ms, c.id, c.conversation_id,"
                    " c.last_used_ms, c.turns, c.message_bytes, t.tokens"
                    " FROM turns t JOIN conversations c ON c.id = t.conversation"
                    " WHERE t.turn_id = ?1",
    [S_TURN_MESSAGES] = "SELECT json FROM messages WHERE turn = ?1 ORDER BY id",
    [S_LIST] = "SELECT id, conversation_id, created_ms, last_used_ms, turns, message_bytes,"
               " persona, interface_type, last_message_ms, message_count, turn_count, roles"
               " FROM conversations ORDER BY use_seq DESC",
    /* set_interface_message_id: the turn's last assistant message, else its last one */
    [S_IID_TARGET] = "SELECT m.id, m.message_id, c.id, c.last_used_ms FROM turns t"
                     " JOIN conversations c ON c.id = t.conversation"
                     " JOIN messages m ON m.turn = t.id WHERE t.turn_id = ?1"
                     " ORDER BY m.role = 'assistant' DESC, m.id DESC LIMIT 1",
    [S_SET_IID] = "UPDATE messages SET interface_message_id = ?2, conversation = ?3"
                  " WHERE id = ?1",
    /* load_turn and find_message: only within the conversation (?1) */
    [S_TURN_IN_CONVERSATION] = "SELECT id, turn_id FROM turns WHERE turn_id = ?2"
                               " AND conversation = ?1",
    [S_TURN_BY_IID] = "SELECT t.id, t.turn_id FROM messages m JOIN turns t ON t.id = m.turn"
                      " WHERE m.conversation = ?1 AND m.interface_message_id = ?2"
                      " ORDER BY m.id DESC LIMIT 1",
    /* how many turns of the conversation came after turn ?2, counting up to ?3 */
    [S_TURNS_AFTER] = "SELECT count(*) FROM (SELECT 1 FROM turns WHERE conversation = ?1"
                      " AND id > ?2 LIMIT ?3)",
    [S_MESSAGE_BY_IID] = MESSAGE_COLUMNS " WHERE m.conversation = ?1"
                         " AND m.interface_message_id = ?2 ORDER BY m.id DESC LIMIT 1",
    /* a write's starting totals and LRU position, read inside its transaction */
    [S_READ_META] = "SELECT conversations, turns, message_bytes,"
                    " (SELECT coalesce(max(use_seq), 0) FROM conversations)"
                    " FROM store_meta WHERE id = 1",
    [S_CONTEXT_GET] = "SELECT context FROM conversations WHERE id = ?1",
    [S_CONTEXT_SET] = "UPDATE conversations SET context = ?2 WHERE id = ?1",
};

/* The WAL is copied into the database file when it holds this many pages (SQLite's
 * default), by a checkpointer thread.  The WAL starts over only when a commit
 * begins after a checkpoint has copied all of it; appends back to back can keep
 * beating the checkpointer, so past the second figure the committing connection
 * checkpoints itself (that commit waits for the disk), which bounds the WAL to
 * about 64 MiB with 4 KiB pages. */
#define CHECKPOINT_PAGES 1000
#define CHECKPOINT_INLINE_PAGES (16 * CHECKPOINT_PAGES)

/* The checkpointer: its own connection, woken by the commit hook. */
typedef struct checkpointer {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int pending;                 /* a commit found the WAL past CHECKPOINT_PAGES */
    int stop;
    int running;                 /* 0: checkpoints run inline (no thread) */
    sqlite3 *db;
} checkpointer;

/* What store_meta holds: read at the start of each write transaction (another
 * writer may have changed it: a second agent whose PATH-lock was deleted),
 * updated by the write, written back in the same transaction. */
typedef struct totals {
    int64_t conversations;
    int64_t turns;
    int64_t message_bytes;
    int64_t trimmed; /* turns dropped by keep_turns since open: not stored in the file */
} totals;

/* One connection and its cached statements, used under its own mutex. */
typedef struct conn {
    pthread_mutex_t lock;
    sqlite3 *db;
    sqlite3_stmt *stmts[S_COUNT];
} conn;

typedef struct sqlite_store {
    struct store base;
    conn w;                      /* writes: append, forget, expire (and the counters below) */
    conn r;                      /* reads: load and the JSON dumps, never behind a write */
    char *path;
    int lock_fd;                 /* PATH-lock, flock'ed while open */
    int lock_created;            /* this open created PATH-lock (removed if it refuses the file) */
    store_limits limits;
    int sync_full;
    totals totals;
    int64_t last_use_seq;        /* the largest conversations.use_seq */
    size_t evicted;
    size_t expired;
    checkpointer ckpt;
    store_log_fn log;            /* cfg->log, kept: damage found after open, a query
                                    skipping a damaged message */
    void *log_ud;
    char *wal_path;              /* PATH-wal */
    dev_t wal_dev;               /* the WAL SQLite has open, as stat(2) saw it */
    ino_t wal_ino;
    int wal_known;               /* wal_dev/wal_ino are set */
    int lock_lost_said;          /* the log said another agent holds a new PATH-lock */
    int stopped;                 /* atomic: a STOP_* reason; writes are refused from then on */
    pthread_mutex_t stop_lock;   /* guards stop_why */
    char stop_why[200];          /* SQLite's words for a corruption, or what happened */
} sqlite_store;

/* Why writes stopped (sqlite_store.stopped): the WAL that SQLite writes was
 * unlinked or replaced (whatever it holds dies with the process), or a
 * connection met a corruption error (copying the WAL into the file would
 * spread the damage: nothing is checkpointed from then on, not even at close). */
enum { STOP_WAL_LOST = 1, STOP_DAMAGED = 2 };

/* The rc begin() returns when writes are stopped: end_write() says why. */
#define WRITES_STOPPED (-1)

/* A conversation row, as the operations need it. */
typedef struct conv_row {
    int64_t id;
    int64_t created_ms;
    int64_t last_used_ms;
    int64_t turns;
    int64_t message_bytes;
    store_lifetime life;
} conv_row;

/* ---- errors ---- */

static void set_err(char **err, char *message)
{
    if (err)
        *err = message;
    else
        free(message);
}

static parley_status fail_with(char **err, parley_status st, const char *path, const char *what,
                               const char *why)
{
    set_err(err, pstr_printf("sqlite store %s: %s%s%s", path, what, why ? ": " : "",
                             why ? why : ""));
    return st;
}

static void store_say(sqlite_store *s, parley_log_level level, char *message)
{
    if (s->log && message)
        s->log(s->log_ud, level, message);
    free(message);
}

/* Stop writes for good with `reason` (a STOP_* bit; `why` says it to the
 * caller of every later write).  Returns 1 the first time that reason is
 * set, so that the caller says it once in the log. */
static int stop_writes(sqlite_store *s, int reason, const char *why)
{
    pthread_mutex_lock(&s->stop_lock);
    int before = __atomic_fetch_or(&s->stopped, reason, __ATOMIC_SEQ_CST);
    if (!(before & reason) && (reason == STOP_DAMAGED || !before))
        snprintf(s->stop_why, sizeof s->stop_why, "%s", why); /* damage is what to say */
    pthread_mutex_unlock(&s->stop_lock);
    return !(before & reason);
}

static int stopped(sqlite_store *s, int reason)
{
    return __atomic_load_n(&s->stopped, __ATOMIC_SEQ_CST) & reason;
}

static int is_corruption(int rc)
{
    return (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB;
}

/* A connection met a corruption error: no more writes, and no checkpoint
 * from then on (it would copy what may be a damaged WAL into the file). */
static void note_damage(sqlite_store *s, const char *sqlite_says)
{
    char why[sizeof s->stop_why];
    snprintf(why, sizeof why,
             "damaged (%s): writes are stopped and nothing more is copied from its WAL into "
             "the file; move the file and its -wal and -shm aside or restore a backup, then "
             "recreate the agent",
             sqlite_says);
    if (stop_writes(s, STOP_DAMAGED, why))
        store_say(s, PARLEY_LOG_ERROR, pstr_printf("sqlite store %s: %s", s->path, why));
}

/* A failed SQLite call, as a status and a message (taken before any rollback
 * replaces the connection's error text). */
static parley_status fail_sqlite(sqlite_store *s, sqlite3 *db, char **err, const char *what,
                                 int rc)
{
    const char *why = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (!why || !*why || strcmp(why, "not an error") == 0)
        why = sqlite3_errstr(rc);
    if (is_corruption(rc))
        note_damage(s, why);
    parley_status st = (rc & 0xff) == SQLITE_NOMEM ? PARLEY_ERR_NO_MEMORY : PARLEY_ERR_STORAGE;
    return fail_with(err, st, s->path, what, why);
}

static void say(const store_config *cfg, parley_log_level level, char *message)
{
    if (cfg->log && message)
        cfg->log(cfg->log_ud, level, message);
    free(message);
}

/* ---- statements ---- */

/* The cached statement `id`, reset and unbound; NULL (rc set) if it cannot be prepared. */
static sqlite3_stmt *stmt(conn *c, enum stmt_id id, int *rc)
{
    sqlite3_stmt *st = c->stmts[id];
    if (!st) {
        *rc = sqlite3_prepare_v3(c->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
        if (*rc != SQLITE_OK)
            return NULL;
        c->stmts[id] = st;
    }
    return st;
}

/* Run a statement that returns no rows; resets it.  SQLITE_OK or the error. */
static int run(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void done(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

static int bind_text(sqlite3_stmt *st, int i, const char *text)
{
    return sqlite3_bind_text(st, i, text ? text : "", -1, SQLITE_STATIC);
}

static int bind_key(sqlite3_stmt *st, const store_key *key)
{
    int rc = bind_text(st, 1, key->persona);
    if (rc == SQLITE_OK)
        rc = bind_text(st, 2, key->interface_type);
    if (rc == SQLITE_OK)
        rc = bind_text(st, 3, key->conversation_id);
    return rc;
}

static int run_with_id(sqlite_store *s, enum stmt_id id, int64_t row)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, id, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, row);
    return run(st);
}

/* ---- transactions ---- */

static void check_wal(sqlite_store *s);

/* The totals and the largest use_seq as the file holds them now, inside the
 * write transaction: whoever else wrote, this write starts from the truth. */
static int read_meta(sqlite_store *s, totals *t)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_READ_META, &rc);
    if (!st)
        return rc;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        t->conversations = sqlite3_column_int64(st, 0);
        t->turns = sqlite3_column_int64(st, 1);
        t->message_bytes = sqlite3_column_int64(st, 2);
        s->last_use_seq = sqlite3_column_int64(st, 3);
    }
    done(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc == SQLITE_DONE ? SQLITE_CORRUPT : rc;
}

/* Begin a write transaction (w.lock held) with *t the file's totals;
 * WRITES_STOPPED when writes are stopped (end_write() says why). */
static int begin(sqlite_store *s, totals *t)
{
    *t = s->totals;
    check_wal(s);
    if (stopped(s, STOP_WAL_LOST | STOP_DAMAGED))
        return WRITES_STOPPED;
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_BEGIN, &rc);
    if (st && (rc = run(st)) == SQLITE_OK)
        rc = read_meta(s, t);
    return rc;
}

static int commit(sqlite_store *s, const totals *t)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_SET_META, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, t->conversations);
    sqlite3_bind_int64(st, 2, t->turns);
    sqlite3_bind_int64(st, 3, t->message_bytes);
    rc = run(st);
    if (rc != SQLITE_OK)
        return rc;
    st = stmt(&s->w, S_COMMIT, &rc);
    return st ? run(st) : rc;
}

/* Undo the open transaction, if SQLite has not already (it does after some errors). */
static void rollback(sqlite_store *s)
{
    if (sqlite3_get_autocommit(s->w.db))
        return;
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_ROLLBACK, &rc);
    if (st)
        run(st);
}

/* End a write transaction begun with begin(): commit it with the new totals
 * when rc is SQLITE_OK (then s->totals = *t), else roll it back.  On failure
 * *err says what failed, in SQLite's words (taken before the rollback). */
static parley_status end_write(sqlite_store *s, int rc, const totals *t, const char *what,
                               char **err)
{
    if (rc == WRITES_STOPPED) {
        pthread_mutex_lock(&s->stop_lock);
        parley_status st = fail_with(err, PARLEY_ERR_STORAGE, s->path, what, s->stop_why);
        pthread_mutex_unlock(&s->stop_lock);
        return st;
    }
    if (rc == SQLITE_OK)
        rc = commit(s, t);
    if (rc == SQLITE_OK) {
        s->totals = *t;
        return PARLEY_OK;
    }
    parley_status st = fail_sqlite(s, s->w.db, err, what, rc);
    rollback(s);
    return st;
}

/* ---- rows ---- */

static int is_idle(const sqlite_store *s, int64_t last_used_ms, uint64_t now_ms)
{
    uint64_t timeout = s->limits.idle_timeout_ms, last = (uint64_t)last_used_ms;
    return timeout && now_ms > last && now_ms - last > timeout;
}

static void read_conv_row(sqlite3_stmt *st, conv_row *row)
{
    row->id = sqlite3_column_int64(st, 0);
    row->created_ms = sqlite3_column_int64(st, 1);
    row->last_used_ms = sqlite3_column_int64(st, 2);
    row->turns = sqlite3_column_int64(st, 3);
    row->message_bytes = sqlite3_column_int64(st, 4);
    row->life.last_message_ms = (uint64_t)sqlite3_column_int64(st, 5);
    row->life.message_count = (uint64_t)sqlite3_column_int64(st, 6);
    row->life.turn_count = (uint64_t)sqlite3_column_int64(st, 7);
    row->life.roles = (unsigned)sqlite3_column_int64(st, 8);
}

/* On connection c: SQLITE_ROW with *row filled, SQLITE_DONE when unknown, or an error. */
static int find_conversation(conn *c, const store_key *key, conv_row *row)
{
    int rc;
    sqlite3_stmt *st = stmt(c, S_FIND_CONVERSATION, &rc);
    if (!st)
        return rc;
    rc = bind_key(st, key);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
        read_conv_row(st, row);
    done(st);
    return rc;
}

static int delete_turns_of(sqlite_store *s, int64_t conversation)
{
    int rc = run_with_id(s, S_DELETE_CONVERSATION_MESSAGES, conversation);
    if (rc == SQLITE_OK)
        rc = run_with_id(s, S_DELETE_CONVERSATION_TURNS, conversation);
    return rc;
}

/* Delete a conversation with its turns, inside the caller's transaction. */
static int delete_conversation(sqlite_store *s, const conv_row *row, totals *t)
{
    int rc = delete_turns_of(s, row->id);
    if (rc == SQLITE_OK)
        rc = run_with_id(s, S_DELETE_CONVERSATION, row->id);
    if (rc == SQLITE_OK) {
        t->conversations--;
        t->turns -= row->turns;
        t->message_bytes -= row->message_bytes;
    }
    return rc;
}

/* Forget conversation `id`, which a read found idle at now_ms, in its own
 * write transaction -- if it still is: an append may have come in between.
 * Best effort: a read does not fail because the file cannot be written (the
 * conversation is idle, so every read already treats it as gone).  Called
 * without the read lock held. */
static void forget_idle(sqlite_store *s, int64_t id, uint64_t now_ms)
{
    pthread_mutex_lock(&s->w.lock);
    totals t;
    conv_row row;
    int rc = begin(s, &t), gone = 0;
    sqlite3_stmt *st = rc == SQLITE_OK ? stmt(&s->w, S_CONVERSATION_BY_ROW, &rc) : NULL;
    if (st) {
        sqlite3_bind_int64(st, 1, id);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            read_conv_row(st, &row);
        done(st);
        if (rc == SQLITE_ROW && is_idle(s, row.last_used_ms, now_ms)) {
            rc = delete_conversation(s, &row, &t);
            gone = rc == SQLITE_OK;
        } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
            rc = SQLITE_OK; /* used again, or already gone */
        }
    }
    if (end_write(s, rc, &t, "cannot forget an idle conversation", NULL) == PARLEY_OK)
        s->expired += (size_t)gone;
    pthread_mutex_unlock(&s->w.lock);
}

/* The least recently used conversation: SQLITE_ROW, SQLITE_DONE if none, or an error. */
static int lru_tail(sqlite_store *s, conv_row *row)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_LRU, &rc);
    if (!st)
        return rc;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        row->id = sqlite3_column_int64(st, 0);
        row->last_used_ms = sqlite3_column_int64(st, 1);
        row->turns = sqlite3_column_int64(st, 2);
        row->message_bytes = sqlite3_column_int64(st, 3);
    }
    done(st);
    return rc;
}

/* ---- opening: checks that read only ---- */

/* Why `path`, which lstat(2) says is not a regular file, cannot be a store
 * (malloc'd).  A symbolic link is refused rather than followed: SQLite names
 * its -wal and -shm files after the path it is given, so a link would put
 * them beside the link, not beside the file they belong to. */
static char *not_a_file(const char *path, mode_t mode)
{
    if (S_ISLNK(mode)) {
        char *real = realpath(path, NULL);
        char *problem = real ? pstr_printf("a symbolic link (to %s): give the real path of the "
                                           "file, not a link to it",
                                           real)
                             : pstr_printf("a symbolic link (to nothing that exists): give the "
                                           "real path of the file, not a link to it");
        free(real);
        return problem;
    }
    const char *kind = S_ISDIR(mode)                    ? "a directory"
                       : S_ISFIFO(mode)                 ? "a FIFO (named pipe)"
                       : S_ISSOCK(mode)                 ? "a socket"
                       : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                                        : "something else";
    return pstr_printf("not a regular file (it is %s): give the path of a store file, or of "
                       "one to create",
                       kind);
}

/* Why the file at `path` cannot be a store (malloc'd), or NULL when it can;
 * *is_new when it is missing or empty.  The type is checked before anything
 * is opened, and the open cannot block (O_NONBLOCK: opening a FIFO for
 * reading would wait for a writer forever) nor follow a link. */
static char *header_problem(const char *path, int *is_new)
{
    *is_new = 0;
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return not_a_file(path, st.st_mode);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) {
        *is_new = 1;
        return NULL;
    }
    if (fd < 0)
        return pstr_printf("cannot open it: %s", strerror(errno));
    unsigned char h[100];
    ssize_t got = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) /* (replaced since the lstat) */
        got = read(fd, h, sizeof h);
    int saved = errno;
    close(fd);
    if (!S_ISREG(st.st_mode))
        return not_a_file(path, st.st_mode);
    if (got < 0)
        return pstr_printf("cannot read it: %s", strerror(saved));
    if (got == 0) {
        *is_new = 1; /* created but never written (a crash at creation) */
        return NULL;
    }
    if ((size_t)got < sizeof h || memcmp(h, "SQLite format 3", 16) != 0)
        return pstr_printf("not a SQLite database (not a Parley history store)");
    unsigned page = (unsigned)h[16] << 8 | h[17];
    int page_ok = page == 1 || (page >= 512 && page <= 32768 && (page & (page - 1)) == 0);
    if (!page_ok || h[18] < 1 || h[18] > 2 || h[19] < 1 || h[19] > 2 || h[21] != 64 ||
        h[22] != 32 || h[23] != 32)
        return pstr_printf("corrupt (invalid database header)");
    uint32_t user_version = (uint32_t)h[60] << 24 | (uint32_t)h[61] << 16 | (uint32_t)h[62] << 8 |
                            h[63];
    uint32_t application_id = (uint32_t)h[68] << 24 | (uint32_t)h[69] << 16 |
                              (uint32_t)h[70] << 8 | h[71];
    if (application_id != SQLITE_STORE_APPLICATION_ID)
        return pstr_printf("a SQLite database of another application, not a Parley history "
                           "store (application_id 0x%08x)",
                           (unsigned)application_id);
    if (user_version > SQLITE_STORE_SCHEMA_VERSION)
        return pstr_printf("written by a newer Parley (schema version %u; this one reads up to "
                           "%d): upgrade Parley or use another file",
                           (unsigned)user_version, SQLITE_STORE_SCHEMA_VERSION);
    return NULL;
}

static char *directory_problem(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return NULL; /* the current directory */
    char *dir = slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    if (!dir)
        return NULL;
    struct stat st;
    char *problem = NULL;
    if (stat(dir, &st) != 0)
        problem = pstr_printf("directory %s: %s (create it first)", dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        problem = pstr_printf("%s is not a directory", dir);
    free(dir);
    return problem;
}

/* Take PATH-lock; on failure a message (malloc'd). */
static char *take_lock(sqlite_store *s)
{
    char *lock_path = pstr_printf("%s-lock", s->path);
    if (!lock_path)
        return NULL;
    /* O_NONBLOCK: a FIFO in its place must not block the open */
    const int flags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = open(lock_path, O_RDWR | O_CREAT | O_EXCL | flags, 0600);
    s->lock_created = fd >= 0;
    if (fd < 0)
        fd = open(lock_path, O_RDWR | flags);
    if (fd < 0 && errno != ELOOP)
        fd = open(lock_path, O_RDONLY | flags); /* a read-only directory */
    char *problem = NULL;
    struct stat st;
    if (fd < 0) {
        problem = errno == ELOOP
                      ? pstr_printf("its lock file %s is a symbolic link: remove it", lock_path)
                      : pstr_printf("cannot open its lock file %s: %s", lock_path, strerror(errno));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        problem = pstr_printf("its lock file %s is not a regular file: remove it", lock_path);
        close(fd);
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        problem = errno == EWOULDBLOCK
                      ? pstr_printf("in use by another agent (%s is locked); one store file "
                                    "serves one agent at a time",
                                    lock_path)
                      : pstr_printf("cannot lock %s: %s", lock_path, strerror(errno));
        close(fd);
    } else {
        s->lock_fd = fd;
    }
    if (problem && s->lock_created)
        unlink(lock_path);
    free(lock_path);
    return problem;
}

/* Remove PATH-lock if this open created it (still holding it: another open
 * that got the old file would refuse the same file for the same reason). */
static void forget_lock_file(sqlite_store *s)
{
    if (s->lock_fd < 0 || !s->lock_created)
        return;
    char *lock_path = pstr_printf("%s-lock", s->path);
    if (lock_path)
        unlink(lock_path);
    free(lock_path);
}

/* ---- opening: through SQLite ---- */

static int query_int(sqlite3 *db, const char *sql, int64_t *value)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *value = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc == SQLITE_DONE ? SQLITE_CORRUPT : rc;
}

/* Run `sql` (statements ending with ';') in one write transaction: all or nothing. */
static int exec_transaction(sqlite3 *db, const char *sql)
{
    char *all = sqlite3_mprintf("BEGIN IMMEDIATE; %s COMMIT;", sql);
    if (!all)
        return SQLITE_NOMEM;
    int rc = sqlite3_exec(db, all, NULL, NULL, NULL);
    sqlite3_free(all);
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* Write the schema into an empty file: version 1, then the upgrades, in one
 * transaction (rollback journal: WAL is switched on afterwards, so the header
 * already names the store). */
static int create_schema(sqlite3 *db)
{
    char *sql =
        sqlite3_mprintf("%s PRAGMA application_id = %d; PRAGMA user_version = 1; %s %s %s",
                        schema_v1, SQLITE_STORE_APPLICATION_ID, migration_v2, migration_v3,
                        migration_v4);
    if (!sql)
        return SQLITE_NOMEM;
    int rc = exec_transaction(db, sql);
    sqlite3_free(sql);
    return rc;
}

/*
 * Check what SQLite sees (the WAL included) before anything writes: the
 * application id, the schema version, the tables, the meta row.  Returns a
 * message (malloc'd) for a file to refuse, or NULL; *rc holds a SQLite error
 * when the file could not be read; *empty when it holds nothing at all;
 * *version the file's schema version.
 */
static char *schema_problem(sqlite_store *s, int *rc, int *empty, int64_t *version_out)
{
    int64_t application_id = 0, version = 0, objects = 0, tables = 0;
    *empty = 0;
    *version_out = 0;
    if ((*rc = query_int(s->w.db, "PRAGMA application_id", &application_id)) != SQLITE_OK ||
        (*rc = query_int(s->w.db, "PRAGMA user_version", &version)) != SQLITE_OK ||
        (*rc = query_int(s->w.db, "SELECT count(*) FROM sqlite_schema", &objects)) != SQLITE_OK)
        return NULL;
    if (application_id == 0 && version == 0 && objects == 0) {
        *empty = 1; /* a creation that never committed, rolled back by SQLite */
        return NULL;
    }
    if (application_id != SQLITE_STORE_APPLICATION_ID)
        return pstr_printf("not a Parley history store (application_id 0x%08x)",
                           (unsigned)application_id);
    if (version > SQLITE_STORE_SCHEMA_VERSION)
        return pstr_printf("written by a newer Parley (schema version %lld; this one reads up to "
                           "%d): upgrade Parley or use another file",
                           (long long)version, SQLITE_STORE_SCHEMA_VERSION);
    if (version < 1)
        return pstr_printf("corrupt (unknown schema version %lld)", (long long)version);
    *version_out = version;
    if ((*rc = query_int(s->w.db,
                         "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN"
                         " ('store_meta', 'conversations', 'turns', 'messages')",
                         &tables)) != SQLITE_OK)
        return NULL;
    if (tables != 4)
        return pstr_printf("corrupt (tables missing from schema version %lld)",
                           (long long)version);
    int64_t v2_columns = 0;
    if (version >= 2 &&
        (*rc = query_int(s->w.db,
                         "SELECT (SELECT count(*) FROM pragma_table_info('messages') WHERE name"
                         " IN ('interface_message_id', 'metadata', 'conversation'))"
                         " + (SELECT count(*) FROM pragma_table_info('conversations') WHERE name"
                         " IN ('last_message_ms', 'message_count', 'turn_count', 'roles'))",
                         &v2_columns)) != SQLITE_OK)
        return NULL;
    if (version >= 2 && v2_columns != 7)
        return pstr_printf("corrupt (columns missing from schema version 2)");
    int64_t v3_columns = 0;
    if (version >= 3 &&
        (*rc = query_int(s->w.db,
                         "SELECT count(*) FROM pragma_table_info('conversations')"
                         " WHERE name = 'context'",
                         &v3_columns)) != SQLITE_OK)
        return NULL;
    if (version >= 3 && v3_columns != 1)
        return pstr_printf("corrupt (columns missing from schema version 3)");
    int64_t v4_columns = 0;
    if (version >= 4 &&
        (*rc = query_int(s->w.db,
                         "SELECT count(*) FROM pragma_table_info('turns') WHERE name = 'tokens'",
                         &v4_columns)) != SQLITE_OK)
        return NULL;
    if (version >= 4 && v4_columns != 1)
        return pstr_printf("corrupt (columns missing from schema version 4)");
    if ((*rc = query_int(s->w.db, "SELECT conversations FROM store_meta WHERE id = 1",
                         &s->totals.conversations)) != SQLITE_OK ||
        (*rc = query_int(s->w.db, "SELECT turns FROM store_meta WHERE id = 1",
                         &s->totals.turns)) != SQLITE_OK ||
        (*rc = query_int(s->w.db, "SELECT message_bytes FROM store_meta WHERE id = 1",
                         &s->totals.message_bytes)) != SQLITE_OK ||
        (*rc = query_int(s->w.db, "SELECT coalesce(max(use_seq), 0) FROM conversations",
                         &s->last_use_seq)) != SQLITE_OK)
        return NULL;
    return NULL;
}

static int configure(sqlite_store *s)
{
    char sql[160];
    snprintf(sql, sizeof sql, "PRAGMA journal_mode = WAL; PRAGMA synchronous = %s;",
             s->sync_full ? "FULL" : "NORMAL");
    return sqlite3_exec(s->w.db, sql, NULL, NULL, NULL);
}

/* ---- checkpoints, off the turn path ----
 * SQLite's automatic checkpoint runs inside the COMMIT that crosses the
 * threshold, fsyncs included: whichever turn commits then would wait for the
 * disk.  Instead the commit hook only wakes the checkpointer, which copies
 * the WAL into the database with PASSIVE checkpoints (they never block an
 * append). */

/* A checkpoint, unless a corruption error was seen (it would copy a damaged
 * WAL into the file); a corruption error it meets stops writes. */
static int checkpoint(sqlite_store *s, sqlite3 *db, int mode, int *log_pages, int *copied)
{
    if (stopped(s, STOP_DAMAGED))
        return SQLITE_CORRUPT;
    int rc = sqlite3_wal_checkpoint_v2(db, NULL, mode, log_pages, copied);
    if (is_corruption(rc))
        note_damage(s, sqlite3_errmsg(db));
    return rc;
}

/* Remember which file PATH-wal is now: the WAL SQLite opened and keeps open
 * (a read opens it: switching a new file to WAL mode does not). */
static void remember_wal(sqlite_store *s)
{
    struct stat st;
    int64_t one = 0;
    query_int(s->w.db, "SELECT count(*) FROM store_meta", &one);
    s->wal_known = s->wal_path && stat(s->wal_path, &st) == 0;
    if (s->wal_known) {
        s->wal_dev = st.st_dev;
        s->wal_ino = st.st_ino;
    }
}

/*
 * The WAL deleted (or replaced) under a running agent: SQLite goes on writing
 * to the open, unlinked file, and every turn in it, acknowledged or not, dies
 * with the process.  One stat(2), before each write and every second (the
 * checkpointer), notices it; the turns are still readable through the open
 * file, so a FULL checkpoint copies them into the database file (and syncs
 * it), then writes stop: a new turn would only go to the deleted file.
 * Called with w.lock held.
 */
static void check_wal(sqlite_store *s)
{
    struct stat st;
    if (!s->wal_known || stopped(s, STOP_WAL_LOST))
        return;
    if (stat(s->wal_path, &st) == 0 ? st.st_dev == s->wal_dev && st.st_ino == s->wal_ino
                                    : errno != ENOENT)
        return;
    stop_writes(s, STOP_WAL_LOST,
                "its WAL (the -wal file) was deleted or replaced while the agent ran, so a "
                "turn written now would be lost: recreate the agent to go on");
    int log_pages = -1, copied = -1;
    int rc = checkpoint(s, s->w.db, SQLITE_CHECKPOINT_FULL, &log_pages, &copied);
    if (rc == SQLITE_OK && copied == log_pages)
        store_say(s, PARLEY_LOG_WARN,
                  pstr_printf("sqlite store %s: %s was deleted or replaced while the agent ran; "
                              "the %d pages it held (every committed turn) were copied into the "
                              "file. Writes are stopped: recreate the agent to go on",
                              s->path, s->wal_path, log_pages));
    else
        store_say(s, PARLEY_LOG_ERROR,
                  pstr_printf("sqlite store %s: %s was deleted or replaced while the agent ran, "
                              "and the turns it held could not be copied into the file (%s): "
                              "they are lost when this agent ends. Writes are stopped",
                              s->path, s->wal_path,
                              rc == SQLITE_OK            ? "a reader held them back"
                              : stopped(s, STOP_DAMAGED) ? "the store is damaged"
                                                         : sqlite3_errmsg(s->w.db)));
}

static int on_wal_commit(void *ud, sqlite3 *db, const char *name, int pages)
{
    sqlite_store *s = ud;
    checkpointer *c = &s->ckpt;
    (void)name;
    if (pages < CHECKPOINT_PAGES)
        return SQLITE_OK;
    if (!c->running || pages >= CHECKPOINT_INLINE_PAGES) {
        checkpoint(s, db, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        return SQLITE_OK;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->pending) { /* the WAL stays this long until a writer restarts it: wake once */
        c->pending = 1;
        pthread_cond_signal(&c->wake);
    }
    pthread_mutex_unlock(&c->lock);
    return SQLITE_OK;
}

/*
 * PATH-lock deleted (or replaced) while the agent runs: nothing would stop a
 * second agent from opening the file.  The checkpointer looks every second:
 * a lock file nobody holds is made again and locked (the old one, unlinked,
 * protects nothing); one another agent holds already means two agents write
 * this file, which the log says once (their writes stay whole and the totals
 * right: each write reads them inside its transaction).
 */
static void check_lock(sqlite_store *s)
{
    struct stat ours, named;
    char *lock_path = pstr_printf("%s-lock", s->path);
    if (!lock_path || s->lock_fd < 0 || fstat(s->lock_fd, &ours) != 0 ||
        (stat(lock_path, &named) == 0 && named.st_dev == ours.st_dev &&
         named.st_ino == ours.st_ino)) {
        free(lock_path);
        return;
    }
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        flock(fd, LOCK_EX | LOCK_NB) == 0) {
        close(s->lock_fd);
        s->lock_fd = fd;
        store_say(s, PARLEY_LOG_WARN,
                  pstr_printf("sqlite store %s: its lock file %s was deleted while the agent "
                              "ran; made again and locked",
                              s->path, lock_path));
    } else if (fd < 0) {
        if (!s->lock_lost_said++)
            store_say(s, PARLEY_LOG_WARN,
                      pstr_printf("sqlite store %s: its lock file %s was deleted while the "
                                  "agent ran and cannot be made again: %s",
                                  s->path, lock_path, strerror(errno)));
    } else {
        close(fd);
        if (!s->lock_lost_said++)
            store_say(s, PARLEY_LOG_WARN,
                      pstr_printf("sqlite store %s: its lock file %s was deleted while the "
                                  "agent ran, and another agent has opened the file since: two "
                                  "agents write one file (each turn stays whole and the totals "
                                  "right, but each agent evicts by its own limits); destroy one "
                                  "of them",
                                  s->path, lock_path));
    }
    free(lock_path);
}

/* How often the checkpointer looks at the WAL and lock files when no commit wakes it. */
#define WAL_CHECK_MS 1000

static void *checkpoint_loop(void *arg)
{
    sqlite_store *s = arg;
    checkpointer *c = &s->ckpt;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += WAL_CHECK_MS / 1000;
        while (!c->pending && !c->stop &&
               pthread_cond_timedwait(&c->wake, &c->lock, &until) != ETIMEDOUT)
            ;
        if (c->stop)
            break;
        int pending = c->pending;
        c->pending = 0;
        pthread_mutex_unlock(&c->lock);
        /* A failure (I/O error, disk full) leaves the WAL as it is: the
         * next commit past the threshold tries again. */
        if (pending)
            checkpoint(s, c->db, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&s->w.lock);
        check_wal(s);
        pthread_mutex_unlock(&s->w.lock);
        check_lock(s);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Start the checkpointer; without it (no thread, no connection) checkpoints
 * run inline, as SQLite's own would. */
static void checkpointer_start(sqlite_store *s)
{
    checkpointer *c = &s->ckpt;
    sqlite3_wal_hook(s->w.db, on_wal_commit, s);
    if (pthread_mutex_init(&c->lock, NULL) != 0)
        return;
    pthread_condattr_t attr;
    int made = pthread_condattr_init(&attr) == 0;
    if (made) { /* timed waits on the monotonic clock: a clock step does not stall checks */
        made = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
               pthread_cond_init(&c->wake, &attr) == 0;
        pthread_condattr_destroy(&attr);
    }
    if (!made) {
        pthread_mutex_destroy(&c->lock);
        return;
    }
    if (sqlite3_open_v2(s->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) ==
        SQLITE_OK) {
        sqlite3_busy_timeout(c->db, SQLITE_STORE_BUSY_TIMEOUT_MS);
        c->running = pthread_create(&c->thread, NULL, checkpoint_loop, s) == 0;
    }
    if (!c->running) {
        sqlite3_close(c->db);
        c->db = NULL;
        pthread_cond_destroy(&c->wake);
        pthread_mutex_destroy(&c->lock);
    }
}

static void checkpointer_stop(sqlite_store *s)
{
    checkpointer *c = &s->ckpt;
    if (!c->running)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    c->running = 0;
    if (stopped(s, STOP_DAMAGED))
        sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    sqlite3_close(c->db); /* first: the main connection, closing last, checkpoints */
    c->db = NULL;
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
}

/* Close a connection; after a corruption error without the checkpoint SQLite
 * does when the last connection closes (the WAL is left as it is). */
static void close_connection(sqlite_store *s, conn *c)
{
    for (int i = 0; i < S_COUNT; i++) {
        sqlite3_finalize(c->stmts[i]);
        c->stmts[i] = NULL;
    }
    if (c->db && stopped(s, STOP_DAMAGED))
        sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    sqlite3_close(c->db);
    c->db = NULL;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* SQLite's WAL checksum (wal.c, walChecksumBytes): over 32-bit words in the
 * byte order the WAL's magic number names, s0 += w0 + s1, s1 += w1 + s0. */
static void wal_checksum(int big_endian, const unsigned char *p, size_t n, uint32_t sum[2])
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        const unsigned char *w = p + i;
        uint32_t w0 = big_endian ? be32(w) : le32(w), w1 = big_endian ? be32(w + 4) : le32(w + 4);
        sum[0] += w0 + sum[1];
        sum[1] += w1 + sum[0];
    }
}

static int read_full(int fd, unsigned char *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got == n;
}

/* How many frames of the WAL are in use (mxFrame of the wal-index header at
 * the start of PATH-shm, two equal copies in native byte order: SQLite's
 * documented WAL-index format), or 0 when that cannot be read. */
static uint32_t wal_frames_in_use(const char *shm_path)
{
    int fd = open(shm_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    unsigned char h[96];
    uint32_t frames = 0;
    if (fd >= 0 && read_full(fd, h, sizeof h) && memcmp(h, h + 48, 48) == 0 && h[12])
        memcpy(&frames, h + 16, sizeof frames); /* isInit set; mxFrame */
    if (fd >= 0)
        close(fd);
    return frames;
}

/*
 * Does the WAL at `path` fail its own checksums?  SQLite checks them only
 * when it rebuilds its index of the WAL (at the first open after the last
 * close); a live WAL damaged after that is copied as it is by the checkpoint
 * of the last close, into the database file.  So before that close: the WAL
 * header's checksum, and the chain of checksums of the frames in use (those
 * the checkpoint copies: frames past them, a crash's torn write or an older
 * generation's tail, are not read).
 */
static int wal_is_damaged(const char *path, const char *shm_path)
{
    uint32_t in_use = wal_frames_in_use(shm_path);
    int fd = in_use ? open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
    if (fd < 0)
        return 0; /* nothing to copy, or nothing we can read */
    unsigned char h[32], *frame = NULL;
    int damaged = 0;
    if (read_full(fd, h, sizeof h)) {
        uint32_t magic = be32(h), page = be32(h + 8), sum[2] = {0, 0};
        int big_endian = magic & 1;
        wal_checksum(big_endian, h, 24, sum);
        damaged = (magic & ~1u) != 0x377f0682 || page < 512 || page > 65536 ||
                  (page & (page - 1)) || sum[0] != be32(h + 24) || sum[1] != be32(h + 28);
        frame = damaged ? NULL : malloc(24 + (size_t)page);
        for (uint32_t i = 0; frame && !damaged && i < in_use; i++) {
            if (!read_full(fd, frame, 24 + (size_t)page) || memcmp(frame + 8, h + 16, 8) != 0) {
                damaged = 1; /* cut short, or not of the header's generation (its salts) */
                break;
            }
            wal_checksum(big_endian, frame, 8, sum);
            wal_checksum(big_endian, frame + 24, page, sum);
            damaged = sum[0] != be32(frame + 16) || sum[1] != be32(frame + 20);
        }
    }
    free(frame);
    close(fd);
    return damaged;
}

static void disconnect(sqlite_store *s)
{
    checkpointer_stop(s);
    close_connection(s, &s->r);
    /* The last close copies the WAL into the file: never a damaged one. */
    char *shm_path = pstr_printf("%s-shm", s->path);
    if (s->w.db && s->wal_known && shm_path && !stopped(s, STOP_DAMAGED | STOP_WAL_LOST) &&
        wal_is_damaged(s->wal_path, shm_path))
        note_damage(s, "its WAL fails its checksums");
    free(shm_path);
    close_connection(s, &s->w); /* last: it checkpoints and removes the WAL */
}

static void free_store(sqlite_store *s)
{
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* after SQLite let go of the file */
    pthread_mutex_destroy(&s->w.lock);
    pthread_mutex_destroy(&s->r.lock);
    pthread_mutex_destroy(&s->stop_lock);
    free(s->wal_path);
    free(s->path);
    free(s);
}

static void sqlite_close(store *base)
{
    sqlite_store *s = (sqlite_store *)base;
    if (!s)
        return;
    disconnect(s);
    free_store(s);
}

/* Does `path` name anything (a file SQLite may leave behind)? */
static int exists(const char *path)
{
    struct stat st;
    return path && lstat(path, &st) == 0;
}

/* parley_content_matches(json, needle): the search rule every backend shares (store_json.h). */
static void content_matches(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const char *json = (const char *)sqlite3_value_text(argv[0]);
    const char *needle = (const char *)sqlite3_value_text(argv[1]);
    sqlite3_result_int(ctx, json && needle &&
                                store_json_content_matches(json, (size_t)sqlite3_value_bytes(argv[0]),
                                                           needle));
}

/* The read connection: sees every committed write (WAL), writes nothing. */
static int open_reader(sqlite_store *s)
{
    int rc = sqlite3_open_v2(s->path, &s->r.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_extended_result_codes(s->r.db, 1);
    sqlite3_busy_timeout(s->r.db, SQLITE_STORE_BUSY_TIMEOUT_MS);
    rc = sqlite3_create_function(s->r.db, "parley_content_matches", 2,
                                 SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL, content_matches,
                                 NULL, NULL);
    if (rc != SQLITE_OK)
        return rc;
    return sqlite3_exec(s->r.db, "PRAGMA query_only = 1", NULL, NULL, NULL);
}

/* Open the SQLite connection on a file that passed header_problem(). */
static parley_status connect_checked(sqlite_store *s, const store_config *cfg, int is_new,
                                     char **err)
{
    if (is_new) {
        int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            return fail_with(err, PARLEY_ERR_STORAGE, s->path, "cannot create it",
                             strerror(errno));
        close(fd);
    }
    int rc = sqlite3_open_v2(s->path, &s->w.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK)
        return fail_sqlite(s, s->w.db, err, "cannot open it", rc);
    /* Until the checks pass, closing must not checkpoint a WAL into the file. */
    sqlite3_db_config(s->w.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    sqlite3_extended_result_codes(s->w.db, 1);
    sqlite3_busy_timeout(s->w.db, SQLITE_STORE_BUSY_TIMEOUT_MS);
    int empty = 0;
    int64_t version = 0;
    char *problem = schema_problem(s, &rc, &empty, &version);
    if (problem) {
        set_err(err, pstr_printf("sqlite store %s: %s", s->path, problem));
        free(problem);
        return PARLEY_ERR_STORAGE;
    }
    if (rc != SQLITE_OK) {
        int code = rc & 0xff;
        return fail_sqlite(s, s->w.db, err,
                           code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? "corrupt"
                                                                           : "cannot read it",
                           rc);
    }
    if (empty) {
        if ((rc = create_schema(s->w.db)) != SQLITE_OK)
            return fail_sqlite(s, s->w.db, err, "cannot create the store", rc);
        say(cfg, PARLEY_LOG_INFO, pstr_printf("sqlite store %s: created", s->path));
    } else if (version < SQLITE_STORE_SCHEMA_VERSION) {
        /* Still no checkpoint on close: a failed upgrade leaves the file as it was. */
        char *sql = sqlite3_mprintf("%s %s %s", version == 1 ? migration_v2 : "",
                                    version <= 2 ? migration_v3 : "", migration_v4);
        rc = sql ? exec_transaction(s->w.db, sql) : SQLITE_NOMEM;
        sqlite3_free(sql);
        if (rc != SQLITE_OK) {
            char what[128];
            snprintf(what, sizeof what,
                     "cannot upgrade it from schema version %lld to %d (the file is unchanged; "
                     "it needs to be writable once)",
                     (long long)version, SQLITE_STORE_SCHEMA_VERSION);
            return fail_sqlite(s, s->w.db, err, what, rc);
        }
        say(cfg, PARLEY_LOG_INFO,
            pstr_printf("sqlite store %s: upgraded from schema version %lld to %d", s->path,
                        (long long)version, SQLITE_STORE_SCHEMA_VERSION));
    }
    sqlite3_db_config(s->w.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, NULL);
    if ((rc = configure(s)) != SQLITE_OK)
        return fail_sqlite(s, s->w.db, err, "cannot configure it", rc);
    if ((rc = open_reader(s)) != SQLITE_OK)
        return fail_sqlite(s, s->r.db, err, "cannot open it for reading", rc);
    remember_wal(s);
    s->log = cfg->log;       /* from now on what any call finds is said in the log (not at open: */
    s->log_ud = cfg->log_ud; /* a refusal says it to the caller), before the thread starts */
    checkpointer_start(s);
    if (sqlite3_db_readonly(s->w.db, "main") == 1)
        say(cfg, PARLEY_LOG_WARN,
            pstr_printf("sqlite store %s: the file is read-only: turns will fail with "
                        "'storage' until it is writable and the agent is recreated",
                        s->path));
    return PARLEY_OK;
}

static parley_status sqlite_open(const store_config *cfg, store **out, char **err)
{
    *out = NULL;
    if (err)
        *err = NULL;
    if (!cfg || !cfg->location || !*cfg->location) {
        set_err(err, strdup("sqlite store: no file given (history_store \"sqlite:PATH\")"));
        return PARLEY_ERR_STORAGE;
    }
    sqlite_store *s = calloc(1, sizeof *s);
    int locks = 0;
    if (s && (s->path = strdup(cfg->location)) != NULL &&
        (s->wal_path = pstr_printf("%s-wal", s->path)) != NULL &&
        pthread_mutex_init(&s->w.lock, NULL) == 0 && ++locks &&
        pthread_mutex_init(&s->r.lock, NULL) == 0 && ++locks &&
        pthread_mutex_init(&s->stop_lock, NULL) == 0)
        locks++;
    if (locks < 3) {
        if (locks >= 1)
            pthread_mutex_destroy(&s->w.lock);
        if (locks == 2)
            pthread_mutex_destroy(&s->r.lock);
        if (s) {
            free(s->wal_path);
            free(s->path);
        }
        free(s);
        set_err(err, strdup("sqlite store: out of memory"));
        return PARLEY_ERR_NO_MEMORY;
    }
    s->base.backend = &store_sqlite_backend;
    s->lock_fd = -1;
    s->limits = cfg->limits;
    if (s->limits.max_conversations == 0) /* contract says >= 1; stay bounded */
        s->limits.max_conversations = 1;
    s->sync_full = cfg->sync_full;

    int is_new = 0;
    char *problem = directory_problem(s->path);
    if (!problem)
        problem = take_lock(s);
    if (!problem)
        problem = header_problem(s->path, &is_new);
    if (problem) {
        set_err(err, pstr_printf("sqlite store %s: %s", s->path, problem));
        free(problem);
        forget_lock_file(s); /* leave nothing next to a file that is not ours */
        sqlite_close(&s->base);
        return PARLEY_ERR_STORAGE;
    }
    char *shm_path = pstr_printf("%s-shm", s->path);
    int had_wal = exists(s->wal_path), had_shm = exists(shm_path);
    parley_status st = connect_checked(s, cfg, is_new, err);
    if (st != PARLEY_OK) {
        /* A refused file is left as it was: without the -wal and -shm files
         * SQLite made for it (and keeps: no checkpoint on close), removed
         * while PATH-lock is still held, nor a PATH-lock this open made. */
        disconnect(s);
        if (!had_wal)
            unlink(s->wal_path);
        if (!had_shm && shm_path)
            unlink(shm_path);
        free(shm_path);
        forget_lock_file(s);
        free_store(s);
        return st;
    }
    free(shm_path);
    *out = &s->base;
    return PARLEY_OK;
}

/* PARLEY_ERR_NOT_FOUND, with no message. */
static parley_status not_found(char **err)
{
    set_err(err, NULL);
    return PARLEY_ERR_NOT_FOUND;
}

/* ---- damaged messages ---- */

/* A read met a message row that is not one JSON object: the file was changed behind the
   store's back.  Such a row is never spliced into the JSON the store returns (store_json.h).
   load() and load_turn() leave the check to the turn, on its failure path only: the request
   renderers already scan every message, and a check per turn would cost ~2 us a KiB. */
#define SQLITE_DAMAGED (-2)

/* Append column `col` (a message or metadata object) to out: SQLITE_ROW, or SQLITE_DAMAGED
   with nothing appended. */
static int put_object_column(sqlite3_stmt *st, int col, pbuf *out)
{
    const char *json = (const char *)sqlite3_column_text(st, col);
    size_t len = (size_t)sqlite3_column_bytes(st, col);
    if (!json || store_json_object_list(json, len) != 1)
        return SQLITE_DAMAGED;
    pbuf_append(out, json, len);
    return SQLITE_ROW;
}

/* The storage error naming the conversation; what the read wrote so far is dropped. */
static parley_status damaged(sqlite_store *s, pbuf *out, size_t mark, const char *conversation_id,
                             char **err)
{
    out->len = mark < out->len ? mark : out->len;
    char *name = pstr_printf("sqlite store %s", s->path);
    const char *cid = conversation_id ? conversation_id : "";
    parley_status st = store_json_damaged(name ? name : "sqlite store", cid, strlen(cid), err);
    free(name);
    return st;
}

/* A query leaves a damaged message out and answers with the rest: the log says why. */
static void skipped_damaged(sqlite_store *s, const char *conversation_id)
{
    char *why = NULL;
    pbuf none = PBUF_INIT;
    damaged(s, &none, 0, conversation_id, &why);
    if (s->log && why) {
        char *line = pstr_printf("%s (a query left it out)", why);
        if (line)
            s->log(s->log_ud, PARLEY_LOG_WARN, line);
        free(line);
    }
    free(why);
}

/* ---- reading: the read connection, one snapshot per call ---- */

static int read_begin(conn *c)
{
    int rc;
    sqlite3_stmt *st = stmt(c, S_BEGIN_READ, &rc);
    return st ? run(st) : rc;
}

static void read_end(conn *c)
{
    int rc;
    sqlite3_stmt *st = sqlite3_get_autocommit(c->db) ? NULL : stmt(c, S_COMMIT, &rc);
    if (st)
        run(st);
}

/* Find `key` for a read: SQLITE_ROW (live), SQLITE_DONE (unknown or idle:
 * *idle_id is then set for forget_idle, else 0), or an error. */
static int find_live(sqlite_store *s, const store_key *key, uint64_t now_ms, conv_row *row,
                     int64_t *idle_id)
{
    *idle_id = 0;
    int rc = find_conversation(&s->r, key, row);
    if (rc == SQLITE_ROW && is_idle(s, row->last_used_ms, now_ms)) {
        *idle_id = row->id;
        rc = SQLITE_DONE;
    }
    return rc;
}

/* A turn's tokens column: NULL (stored before v4), or a value out of range
 * (the file was edited), is unknown. */
static uint32_t tokens_column(sqlite3_stmt *st, int col)
{
    int64_t v = sqlite3_column_type(st, col) == SQLITE_INTEGER ? sqlite3_column_int64(st, col) : 0;
    return v > 0 && v <= UINT32_MAX ? (uint32_t)v : 0;
}

static parley_status sqlite_load_sized(store *base, const store_key *key, size_t last_turns,
                                       uint64_t now_ms, pbuf *out, size_t *nmessages,
                                       store_sizes *sizes, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len, count = 0;
    *nmessages = 0;
    conv_row row = {.id = 0};
    int64_t idle = 0;
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = find_live(s, key, now_ms, &row, &idle);
    if (rc == SQLITE_ROW) {
        sqlite3_stmt *st = stmt(&s->r, S_LOAD, &rc);
        if (st) {
            sqlite3_bind_int64(st, 1, row.id);
            sqlite3_bind_int64(st, 2, last_turns ? (int64_t)last_turns : -1);
            int64_t turn = -1;
            while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                pbuf_append(out, sqlite3_column_text(st, 0), (size_t)sqlite3_column_bytes(st, 0));
                pbuf_putc(out, ',');
                count++;
                if (sizes && sqlite3_column_int64(st, 1) != turn) { /* a turn begins */
                    turn = sqlite3_column_int64(st, 1);
                    store_sizes_add(sizes, 0, tokens_column(st, 2));
                }
                if (sizes && sizes->n)
                    sizes->turn[sizes->n - 1].nmessages++;
            }
            done(st);
        }
    }
    parley_status status = PARLEY_OK;
    if (rc != SQLITE_DONE)
        status = fail_sqlite(s, s->r.db, err, "cannot load the conversation", rc);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    if (status == PARLEY_OK && out->oom) {
        set_err(err, pstr_printf("sqlite store %s: out of memory", s->path));
        status = PARLEY_ERR_NO_MEMORY;
    }
    if (status != PARLEY_OK) {
        out->len = mark < out->len ? mark : out->len;
        return status;
    }
    *nmessages = count;
    return PARLEY_OK;
}

static parley_status sqlite_load(store *base, const store_key *key, size_t last_turns,
                                 uint64_t now_ms, pbuf *out, size_t *nmessages, char **err)
{
    return sqlite_load_sized(base, key, last_turns, now_ms, out, nmessages, NULL, err);
}

/* ---- append ---- */

static int turn_is_valid(const store_turn *turn)
{
    if (!turn || !turn->turn_id || !*turn->turn_id || !turn->messages || turn->nmessages == 0)
        return 0;
    for (size_t i = 0; i < turn->nmessages; i++) {
        const store_message *m = &turn->messages[i];
        if (!m->json || m->json_len == 0 || m->json_len > INT32_MAX ||
            (m->metadata_len && (!m->metadata || m->metadata_len > INT32_MAX)) ||
            (m->interface_message_id &&
             strlen(m->interface_message_id) > STORE_MAX_INTERFACE_MESSAGE_ID))
            return 0;
    }
    return 1;
}

/* The joined length of the turn's messages ("m1,m2"): what message_bytes counts. */
static int64_t joined_length(const store_turn *turn)
{
    int64_t n = 0;
    for (size_t i = 0; i < turn->nmessages; i++)
        n += (int64_t)turn->messages[i].json_len + (i ? 1 : 0);
    return n;
}

static int turn_exists(sqlite_store *s, const char *turn_id)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_TURN_EXISTS, &rc);
    if (!st)
        return rc;
    rc = bind_text(st, 1, turn_id);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    done(st);
    return rc;
}

static int insert_conversation(sqlite_store *s, const store_key *key, uint64_t now_ms,
                               int64_t use_seq, conv_row *row)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_INSERT_CONVERSATION, &rc);
    if (!st)
        return rc;
    rc = bind_key(st, key);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 4, (int64_t)now_ms);
        sqlite3_bind_int64(st, 5, use_seq);
        rc = run(st);
    } else {
        done(st);
    }
    *row = (conv_row){.id = sqlite3_last_insert_rowid(s->w.db),
                      .created_ms = (int64_t)now_ms,
                      .last_used_ms = (int64_t)now_ms};
    return rc;
}

static int insert_turn(sqlite_store *s, int64_t conversation, const store_turn *turn)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_INSERT_TURN, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, conversation);
    bind_text(st, 2, turn->turn_id);
    sqlite3_bind_int64(st, 3, (int64_t)turn->started_ms);
    sqlite3_bind_int64(st, 4, (int64_t)turn->finished_ms);
    sqlite3_bind_int64(st, 5, joined_length(turn));
    if (turn->tokens) /* else NULL: unknown */
        sqlite3_bind_int64(st, 6, turn->tokens);
    if ((rc = run(st)) != SQLITE_OK)
        return rc;
    int64_t turn_row = sqlite3_last_insert_rowid(s->w.db);
    if (!(st = stmt(&s->w, S_INSERT_MESSAGE, &rc)))
        return rc;
    for (size_t i = 0; i < turn->nmessages && rc == SQLITE_OK; i++) {
        const store_message *m = &turn->messages[i];
        sqlite3_bind_int64(st, 1, turn_row);
        bind_text(st, 2, m->message_id);
        bind_text(st, 3, m->role);
        sqlite3_bind_int64(st, 4, (int64_t)m->created_ms);
        sqlite3_bind_text(st, 5, m->json, (int)m->json_len, SQLITE_STATIC);
        if (m->interface_message_id && *m->interface_message_id) /* else NULL: none */
            bind_text(st, 6, m->interface_message_id);
        if (m->metadata && m->metadata_len)
            sqlite3_bind_text(st, 7, m->metadata, (int)m->metadata_len, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, conversation);
        rc = run(st);
    }
    return rc;
}

static unsigned role_bit(const char *role)
{
    static const struct {
        const char *name;
        unsigned bit;
    } roles[] = {{"user", STORE_ROLE_USER},
                 {"assistant", STORE_ROLE_ASSISTANT},
                 {"tool", STORE_ROLE_TOOL},
                 {"system", STORE_ROLE_SYSTEM}};
    for (size_t i = 0; role && i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i].name) == 0)
            return roles[i].bit;
    return 0;
}

/* Add an appended turn to a conversation's lifetime (never lowered by trimming). */
static void count_in_lifetime(store_lifetime *life, const store_turn *turn)
{
    life->turn_count++;
    life->message_count += turn->nmessages;
    life->last_message_ms = turn->messages[turn->nmessages - 1].created_ms;
    for (size_t i = 0; i < turn->nmessages; i++)
        life->roles |= role_bit(turn->messages[i].role);
}

/* Drop the oldest turns of `row` beyond keep_turns. */
static int trim_turns(sqlite_store *s, conv_row *row, totals *t)
{
    int rc = SQLITE_OK;
    while (rc == SQLITE_OK && s->limits.keep_turns && row->turns > (int64_t)s->limits.keep_turns) {
        sqlite3_stmt *st = stmt(&s->w, S_OLDEST_TURN, &rc);
        if (!st)
            return rc;
        sqlite3_bind_int64(st, 1, row->id);
        if ((rc = sqlite3_step(st)) != SQLITE_ROW) {
            done(st);
            return rc == SQLITE_DONE ? SQLITE_CORRUPT : rc; /* counts disagree with rows */
        }
        int64_t turn = sqlite3_column_int64(st, 0), bytes = sqlite3_column_int64(st, 1);
        done(st);
        rc = run_with_id(s, S_DELETE_TURN_MESSAGES, turn);
        if (rc == SQLITE_OK)
            rc = run_with_id(s, S_DELETE_TURN, turn);
        if (rc == SQLITE_OK) {
            row->turns--;
            row->message_bytes -= bytes;
            t->turns--;
            t->message_bytes -= bytes;
            t->trimmed++;
        }
    }
    return rc;
}

/* Forget least recently used conversations beyond max_conversations, never `keep`. */
static int evict_beyond_limit(sqlite_store *s, int64_t keep, uint64_t now_ms, totals *t,
                              size_t *evicted, size_t *expired)
{
    int rc = SQLITE_OK;
    while (t->conversations > (int64_t)s->limits.max_conversations) {
        conv_row victim;
        if ((rc = lru_tail(s, &victim)) != SQLITE_ROW)
            return rc == SQLITE_DONE ? SQLITE_OK : rc;
        if (victim.id == keep)
            return SQLITE_OK;
        if ((rc = delete_conversation(s, &victim, t)) != SQLITE_OK)
            return rc;
        if (is_idle(s, victim.last_used_ms, now_ms))
            (*expired)++;
        else
            (*evicted)++;
    }
    return rc;
}

static int update_conversation(sqlite_store *s, const conv_row *row, int64_t use_seq)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_UPDATE_CONVERSATION, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, row->id);
    sqlite3_bind_int64(st, 2, row->created_ms);
    sqlite3_bind_int64(st, 3, row->last_used_ms);
    sqlite3_bind_int64(st, 4, use_seq);
    sqlite3_bind_int64(st, 5, row->turns);
    sqlite3_bind_int64(st, 6, row->message_bytes);
    sqlite3_bind_int64(st, 7, (int64_t)row->life.last_message_ms);
    sqlite3_bind_int64(st, 8, (int64_t)row->life.message_count);
    sqlite3_bind_int64(st, 9, (int64_t)row->life.turn_count);
    sqlite3_bind_int64(st, 10, (int64_t)row->life.roles);
    return run(st);
}

/* The whole append, inside one transaction; the caller commits or rolls back. */
/* The context record of conversation row `id` (NULL: none), inside the caller's transaction. */
static int write_context(sqlite_store *s, int64_t id, const char *json, size_t len)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->w, S_CONTEXT_SET, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    if (json)
        sqlite3_bind_text(st, 2, json, (int)len, SQLITE_TRANSIENT);
    return run(st);
}

static int append_in_transaction(sqlite_store *s, const store_key *key, const store_turn *turn,
                                 uint64_t now_ms, totals *t, size_t *evicted, size_t *expired,
                                 int *stored)
{
    int rc = turn_exists(s, turn->turn_id);
    if (rc == SQLITE_ROW)
        return SQLITE_OK; /* already stored: a retried append changes nothing */
    if (rc != SQLITE_DONE)
        return rc;
    int64_t use_seq = s->last_use_seq + 1;
    conv_row row;
    int restarted = 0;
    rc = find_conversation(&s->w, key, &row);
    if (rc == SQLITE_DONE) {
        if ((rc = insert_conversation(s, key, now_ms, use_seq, &row)) != SQLITE_OK)
            return rc;
        t->conversations++;
    } else if (rc != SQLITE_ROW) {
        return rc;
    } else if (is_idle(s, row.last_used_ms, now_ms)) {
        /* Idle past the timeout: the old context is forgotten, the conversation restarts. */
        if ((rc = delete_turns_of(s, row.id)) != SQLITE_OK)
            return rc;
        t->turns -= row.turns;
        t->message_bytes -= row.message_bytes;
        row.turns = row.message_bytes = 0;
        row.created_ms = (int64_t)now_ms;
        row.life = (store_lifetime){0, 0, 0, 0}; /* forgotten: its lifetime and record too */
        restarted = 1;
        (*expired)++;
    }
    if ((rc = insert_turn(s, row.id, turn)) != SQLITE_OK)
        return rc;
    int64_t bytes = joined_length(turn);
    row.turns++;
    row.message_bytes += bytes;
    row.last_used_ms = (int64_t)now_ms;
    count_in_lifetime(&row.life, turn);
    t->turns++;
    t->message_bytes += bytes;
    if ((rc = trim_turns(s, &row, t)) != SQLITE_OK ||
        (rc = update_conversation(s, &row, use_seq)) != SQLITE_OK ||
        ((turn->context || restarted) &&
         (rc = write_context(s, row.id, turn->context, turn->context_len)) != SQLITE_OK) ||
        (rc = evict_beyond_limit(s, row.id, now_ms, t, evicted, expired)) != SQLITE_OK)
        return rc;
    *stored = 1;
    return SQLITE_OK;
}

static parley_status sqlite_append(store *base, const store_key *key, const store_turn *turn,
                                   uint64_t now_ms, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    if (!key || !key->conversation_id || !turn_is_valid(turn))
        return fail_with(err, PARLEY_ERR_STORAGE, s->path, "cannot append",
                         "a turn needs a conversation id, a turn id and messages (interface "
                         "message ids of at most 256 bytes)");
    pthread_mutex_lock(&s->w.lock);
    totals t;
    size_t evicted = 0, expired = 0;
    int stored = 0;
    int rc = begin(s, &t);
    if (rc == SQLITE_OK)
        rc = append_in_transaction(s, key, turn, now_ms, &t, &evicted, &expired, &stored);
    parley_status st = end_write(s, rc, &t, "cannot store the turn", err);
    if (st == PARLEY_OK) {
        s->evicted += evicted;
        s->expired += expired;
        if (stored)
            s->last_use_seq++;
    }
    pthread_mutex_unlock(&s->w.lock);
    return st;
}

/* ---- the JSON the ABI returns ---- */

/* The status of a dump (the read lock held: the message names SQLite's error). */
static parley_status finish_json(sqlite_store *s, pbuf *out, size_t mark, int rc,
                                 const char *what, char **err)
{
    parley_status st = PARLEY_OK;
    if (rc != SQLITE_DONE && rc != SQLITE_OK)
        st = fail_sqlite(s, s->r.db, err, what, rc);
    else if (out->oom)
        st = fail_with(err, PARLEY_ERR_NO_MEMORY, s->path, what, "out of memory");
    if (st != PARLEY_OK)
        out->len = mark < out->len ? mark : out->len;
    return st;
}

/* The turns of a conversation as turn objects joined by ','. */
static int put_turns(sqlite_store *s, int64_t conversation, pbuf *out)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->r, S_CONVERSATION_MESSAGES, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, conversation);
    pbuf messages = PBUF_INIT;
    char turn_id[STORE_ID_LEN + 1] = "";
    int64_t current = -1, started = 0, finished = 0;
    uint32_t tokens = 0;
    int nturns = 0;
    for (;;) {
        rc = sqlite3_step(st);
        int64_t turn = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
        if (current != -1 && turn != current) { /* the previous turn is complete */
            if (nturns++)
                pbuf_putc(out, ',');
            store_json_turn(out, turn_id, (uint64_t)started, (uint64_t)finished, tokens,
                            messages.data ? messages.data : "", messages.len);
            pbuf_reset(&messages);
        }
        if (rc != SQLITE_ROW)
            break;
        if (turn != current) {
            current = turn;
            const char *id = (const char *)sqlite3_column_text(st, 1);
            snprintf(turn_id, sizeof turn_id, "%s", id ? id : "");
            started = sqlite3_column_int64(st, 2);
            finished = sqlite3_column_int64(st, 3);
            tokens = tokens_column(st, 5);
        } else {
            pbuf_putc(&messages, ',');
        }
        if ((rc = put_object_column(st, 4, &messages)) != SQLITE_ROW)
            break;
    }
    done(st);
    if (messages.oom)
        out->oom = 1;
    pbuf_free(&messages);
    return rc;
}

static parley_status sqlite_get_conversation(store *base, const store_key *key, uint64_t now_ms,
                                             pbuf *out, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    conv_row row = {.id = 0};
    int64_t idle = 0;
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = find_live(s, key, now_ms, &row, &idle);
    int found = rc == SQLITE_ROW;
    if (found) {
        store_json_conversation_head(out, key->conversation_id, key->persona,
                                     strlen(key->persona), key->interface_type,
                                     strlen(key->interface_type), (uint64_t)row.created_ms,
                                     (uint64_t)row.last_used_ms);
        store_json_lifetime(out, &row.life);
        pbuf_puts(out, ",\"turns\":[");
        rc = put_turns(s, row.id, out);
        pbuf_puts(out, "]}");
    }
    parley_status st = rc == SQLITE_DAMAGED
                           ? damaged(s, out, mark, key->conversation_id, err)
                           : finish_json(s, out, mark, rc, "cannot read the conversation", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    return st == PARLEY_OK && !found ? not_found(err) : st;
}

static int put_turn_messages(sqlite_store *s, int64_t turn, pbuf *messages)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->r, S_TURN_MESSAGES, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, turn);
    int first = 1;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (!first)
            pbuf_putc(messages, ',');
        first = 0;
        if ((rc = put_object_column(st, 0, messages)) != SQLITE_ROW)
            break;
    }
    done(st);
    return rc;
}

/* {"conversation_id":..,"turn":{..}} for the turn row the S_FIND_TURN statement is on. */
static int put_found_turn(sqlite_store *s, sqlite3_stmt *found, const char *turn_id, pbuf *out)
{
    int64_t turn = sqlite3_column_int64(found, 0);
    uint64_t started = (uint64_t)sqlite3_column_int64(found, 1);
    uint64_t finished = (uint64_t)sqlite3_column_int64(found, 2);
    uint32_t tokens = tokens_column(found, 8);
    const char *conversation_id = (const char *)sqlite3_column_text(found, 4);
    pbuf_puts(out, "{\"conversation_id\":");
    pbuf_json_string(out, conversation_id ? conversation_id : "",
                     conversation_id ? strlen(conversation_id) : 0);
    pbuf_puts(out, ",\"turn\":");
    pbuf messages = PBUF_INIT;
    int rc = put_turn_messages(s, turn, &messages);
    store_json_turn(out, turn_id, started, finished, tokens,
                    messages.data ? messages.data : "", messages.len);
    pbuf_putc(out, '}');
    if (messages.oom)
        out->oom = 1;
    pbuf_free(&messages);
    return rc;
}

static parley_status sqlite_get_turn(store *base, const char *turn_id, uint64_t now_ms, pbuf *out,
                                     char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    int64_t idle = 0;
    int found = 0;
    pthread_mutex_lock(&s->r.lock);
    int rc = turn_id ? read_begin(&s->r) : SQLITE_DONE;
    sqlite3_stmt *st = rc == SQLITE_OK ? stmt(&s->r, S_FIND_TURN, &rc) : NULL;
    if (st) {
        bind_text(st, 1, turn_id);
        rc = sqlite3_step(st);
        /* columns: turn id, started, finished, conversation row, its id, its last use */
        if (rc == SQLITE_ROW && is_idle(s, sqlite3_column_int64(st, 5), now_ms)) {
            idle = sqlite3_column_int64(st, 3); /* its conversation expired */
            rc = SQLITE_DONE;
        } else if (rc == SQLITE_ROW) {
            rc = put_found_turn(s, st, turn_id, out);
            found = rc == SQLITE_DONE;
            if (rc == SQLITE_DAMAGED)
                damaged(s, out, mark, (const char *)sqlite3_column_text(st, 4), err);
        }
        done(st);
    }
    parley_status status = rc == SQLITE_DAMAGED
                               ? PARLEY_ERR_STORAGE
                               : finish_json(s, out, mark, rc, "cannot read the turn", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    return status == PARLEY_OK && !found ? not_found(err) : status;
}

/* ---- queries (backend version 3) ---- */

/* Not idle past the timeout (?1 timeout, ?2 now): is_idle() in SQL. */
#define LIVE_CONVERSATION " NOT (?1 > 0 AND ?2 > c.last_used_ms AND ?2 - c.last_used_ms > ?1)"

/* The row as store_json_message: SQLITE_ROW, or SQLITE_DAMAGED (nothing written) when its
   message or metadata is not one JSON object. */
static int put_message_row(sqlite3_stmt *st, pbuf *out)
{
    const char *text[11];
    size_t len[11];
    for (int i = 1; i < 11; i++) { /* NULL (no interface id, no metadata) reads as "" */
        text[i] = (const char *)sqlite3_column_text(st, i);
        len[i] = text[i] ? (size_t)sqlite3_column_bytes(st, i) : 0;
        if (!text[i])
            text[i] = "";
    }
    if (store_json_object_list(text[4], len[4]) != 1 ||
        (len[10] && store_json_object_list(text[10], len[10]) != 1))
        return SQLITE_DAMAGED;
    store_json_message(out, text[1], text[6], len[6], text[7], len[7], text[8], len[8], text[5],
                       text[2], (uint64_t)sqlite3_column_int64(st, 3), text[4], len[4], text[9],
                       len[9], text[10], len[10]);
    return SQLITE_ROW;
}

/* Step a one-message lookup: its row, if any, written as store_json_message
 * (*found = 1).  SQLITE_DONE or the error; SQLITE_DAMAGED with *err set. */
static int put_first_message(sqlite_store *s, sqlite3_stmt *st, pbuf *out, int *found,
                             char **err)
{
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && (rc = put_message_row(st, out)) == SQLITE_ROW) {
        *found = 1;
        rc = SQLITE_DONE;
    } else if (rc == SQLITE_DAMAGED) {
        damaged(s, out, out->len, (const char *)sqlite3_column_text(st, 6), err);
    }
    return rc;
}

/* The query's SQL: only the filters it has, so SQLite can use the indexes. */
static char *query_sql(const store_query *q)
{
    return sqlite3_mprintf(MESSAGE_COLUMNS " WHERE" LIVE_CONVERSATION
                           " AND m.created_ms BETWEEN ?3 AND ?4%s%s%s%s%s%s%s%s"
                           " ORDER BY m.id %s LIMIT ?11",
                           q->conversation_id ? " AND c.conversation_id = ?5" : "",
                           q->persona ? " AND c.persona = ?6" : "",
                           q->interface_type ? " AND c.interface_type = ?7" : "",
                           q->role ? " AND m.role = ?8" : "",
                           !q->after ? "" : q->newest_first ? " AND m.id < ?9" : " AND m.id > ?9",
                           q->search && *q->search ? " AND parley_content_matches(m.json, ?10)" : "",
                           q->turn_id ? " AND t.turn_id = ?12" : "",
                           q->interface_message_id ? " AND m.interface_message_id = ?13" : "",
                           q->newest_first ? "DESC" : "ASC");
}

static parley_status sqlite_query(store *base, const store_query *q, uint64_t now_ms, pbuf *out,
                                  size_t *count, uint64_t *last, int *more, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    *count = 0;
    *last = 0;
    *more = 0;
    char *sql = query_sql(q);
    if (!sql)
        return fail_with(err, PARLEY_ERR_NO_MEMORY, s->path, "cannot query", "out of memory");
    pthread_mutex_lock(&s->r.lock);
    sqlite3_stmt *st = NULL;
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(s->r.db, sql, -1, &st, NULL);
    if (st) {
        sqlite3_bind_int64(st, 1, (int64_t)s->limits.idle_timeout_ms);
        sqlite3_bind_int64(st, 2, (int64_t)now_ms);
        sqlite3_bind_int64(st, 3, (int64_t)q->since_ms);
        sqlite3_bind_int64(st, 4, q->until_ms > INT64_MAX ? INT64_MAX : (int64_t)q->until_ms);
        const char *texts[] = {q->conversation_id, q->persona, q->interface_type, q->role};
        for (int i = 0; i < 4; i++)
            if (texts[i])
                bind_text(st, 5 + i, texts[i]);
        sqlite3_bind_int64(st, 9, (int64_t)q->after);
        if (q->search)
            bind_text(st, 10, q->search);
        sqlite3_bind_int64(st, 11, (int64_t)q->limit + 1); /* one more: is there a next page? */
        if (q->turn_id)
            bind_text(st, 12, q->turn_id);
        if (q->interface_message_id)
            bind_text(st, 13, q->interface_message_id);
        size_t seen = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            if (seen++ == q->limit) {
                *more = 1;
                continue; /* (the LIMIT ends the loop at the next step) */
            }
            size_t before = out->len;
            if (*count)
                pbuf_putc(out, ',');
            *last = (uint64_t)sqlite3_column_int64(st, 0);
            if (put_message_row(st, out) == SQLITE_DAMAGED) {
                out->len = before; /* the rest of the query still answers */
                skipped_damaged(s, (const char *)sqlite3_column_text(st, 6));
                continue;
            }
            (*count)++;
        }
        sqlite3_finalize(st);
    }
    sqlite3_free(sql);
    parley_status status = finish_json(s, out, mark, rc, "cannot query the messages", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (status != PARLEY_OK)
        *count = 0, *more = 0;
    return status;
}

static parley_status sqlite_get_message(store *base, const char *message_id, uint64_t now_ms,
                                        pbuf *out, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    int found = 0;
    pthread_mutex_lock(&s->r.lock);
    sqlite3_stmt *st = NULL;
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(s->r.db,
                                MESSAGE_COLUMNS " WHERE m.message_id = ?3 AND" LIVE_CONVERSATION,
                                -1, &st, NULL);
    if (st) {
        sqlite3_bind_int64(st, 1, (int64_t)s->limits.idle_timeout_ms);
        sqlite3_bind_int64(st, 2, (int64_t)now_ms);
        bind_text(st, 3, message_id ? message_id : "");
        rc = put_first_message(s, st, out, &found, err);
        sqlite3_finalize(st);
    }
    parley_status status = rc == SQLITE_DAMAGED
                               ? PARLEY_ERR_STORAGE
                               : finish_json(s, out, mark, rc, "cannot read the message", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    return status == PARLEY_OK && !found ? not_found(err) : status;
}

static parley_status sqlite_list(store *base, uint64_t now_ms, pbuf *out, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    pbuf_puts(out, "{\"conversations\":[");
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    sqlite3_stmt *st = rc == SQLITE_OK ? stmt(&s->r, S_LIST, &rc) : NULL;
    int64_t *idle = NULL;
    size_t nidle = 0, cap = 0;
    int first = 1;
    while (st && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t last_used = sqlite3_column_int64(st, 3);
        if (is_idle(s, last_used, now_ms)) { /* checked one by one: clocks may step back */
            if (nidle == cap) {
                size_t ncap = cap ? 2 * cap : 16;
                int64_t *grown = realloc(idle, ncap * sizeof *grown);
                if (!grown)
                    continue; /* not listed; forgotten by a later call */
                idle = grown;
                cap = ncap;
            }
            idle[nidle++] = sqlite3_column_int64(st, 0);
            continue;
        }
        if (!first)
            pbuf_putc(out, ',');
        first = 0;
        const char *id = (const char *)sqlite3_column_text(st, 1);
        const char *persona = (const char *)sqlite3_column_text(st, 6);
        const char *interface_type = (const char *)sqlite3_column_text(st, 7);
        store_json_conversation_head(out, id ? id : "", persona ? persona : "",
                                     (size_t)sqlite3_column_bytes(st, 6),
                                     interface_type ? interface_type : "",
                                     (size_t)sqlite3_column_bytes(st, 7),
                                     (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)last_used);
        store_lifetime life = {(uint64_t)sqlite3_column_int64(st, 8),
                               (uint64_t)sqlite3_column_int64(st, 9),
                               (uint64_t)sqlite3_column_int64(st, 10),
                               (unsigned)sqlite3_column_int64(st, 11)};
        store_json_lifetime(out, &life);
        pbuf_printf(out, ",\"turns\":%lld}", (long long)sqlite3_column_int64(st, 4));
    }
    if (st)
        done(st);
    pbuf_puts(out, "]}");
    parley_status status = finish_json(s, out, mark, rc, "cannot list conversations", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    for (size_t i = 0; i < nidle; i++)
        forget_idle(s, idle[i], now_ms);
    free(idle);
    return status;
}

/* ---- message identity (backend version 4) ---- */

static parley_status sqlite_set_interface_message_id(store *base, const char *turn_id,
                                                     const char *interface_message_id,
                                                     uint64_t now_ms, char *message_id,
                                                     char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t len = interface_message_id ? strlen(interface_message_id) : 0;
    if (len == 0 || len > STORE_MAX_INTERFACE_MESSAGE_ID)
    {
        set_err(err, pstr_printf("sqlite store %s: cannot set the interface message id: it "
                                 "needs 1 to %d bytes",
                                 s->path, STORE_MAX_INTERFACE_MESSAGE_ID));
        return PARLEY_ERR_STORAGE;
    }
    if (!turn_id)
        return not_found(err);
    char target_id[STORE_ID_LEN + 1] = "";
    int found = 0;
    int64_t idle = 0;
    pthread_mutex_lock(&s->w.lock);
    totals t;
    int rc = begin(s, &t);
    sqlite3_stmt *st = rc == SQLITE_OK ? stmt(&s->w, S_IID_TARGET, &rc) : NULL;
    if (st) {
        bind_text(st, 1, turn_id);
        rc = sqlite3_step(st);
        /* columns: the message's row, its message_id, the conversation's row, its last use */
        int64_t message = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
        int64_t conversation = rc == SQLITE_ROW ? sqlite3_column_int64(st, 2) : 0;
        if (rc == SQLITE_ROW) {
            const char *id = (const char *)sqlite3_column_text(st, 1);
            snprintf(target_id, sizeof target_id, "%s", id ? id : "");
            if (is_idle(s, sqlite3_column_int64(st, 3), now_ms))
                idle = sqlite3_column_int64(st, 2); /* its conversation expired */
        }
        done(st);
        if (rc == SQLITE_ROW && !idle && (st = stmt(&s->w, S_SET_IID, &rc)) != NULL) {
            sqlite3_bind_int64(st, 1, message);
            bind_text(st, 2, interface_message_id);
            sqlite3_bind_int64(st, 3, conversation);
            rc = run(st);
            found = rc == SQLITE_OK;
        } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
            rc = SQLITE_OK; /* nothing to change */
        }
    }
    parley_status status = end_write(s, rc, &t, "cannot set the interface message id", err);
    pthread_mutex_unlock(&s->w.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    if (status != PARLEY_OK)
        return status;
    if (!found)
        return not_found(err);
    if (message_id)
        memcpy(message_id, target_id, sizeof target_id);
    return PARLEY_OK;
}

static parley_status sqlite_find_message(store *base, const store_key *key,
                                         const char *interface_message_id, uint64_t now_ms,
                                         pbuf *out, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    conv_row row = {.id = 0};
    int64_t idle = 0;
    int found = 0;
    if (!key || !interface_message_id)
        return not_found(err);
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = find_live(s, key, now_ms, &row, &idle);
    sqlite3_stmt *st = rc == SQLITE_ROW ? stmt(&s->r, S_MESSAGE_BY_IID, &rc) : NULL;
    if (st) {
        sqlite3_bind_int64(st, 1, row.id);
        bind_text(st, 2, interface_message_id);
        rc = put_first_message(s, st, out, &found, err);
        done(st);
    }
    parley_status status = rc == SQLITE_DAMAGED
                               ? PARLEY_ERR_STORAGE
                               : finish_json(s, out, mark, rc, "cannot find the message", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    return status == PARLEY_OK && !found ? not_found(err) : status;
}

/* The turn of conversation `conversation` that load_turn names: SQLITE_ROW
 * with its row and id, SQLITE_DONE when there is none, or an error. */
static int find_reply_turn(sqlite_store *s, int64_t conversation, const char *turn_id,
                           const char *interface_message_id, int64_t *turn, char *turn_id_out)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->r, turn_id ? S_TURN_IN_CONVERSATION : S_TURN_BY_IID, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, conversation);
    bind_text(st, 2, turn_id ? turn_id : interface_message_id);
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        *turn = sqlite3_column_int64(st, 0);
        const char *id = (const char *)sqlite3_column_text(st, 1);
        snprintf(turn_id_out, STORE_ID_LEN + 1, "%s", id ? id : "");
    }
    done(st);
    return rc;
}

/* Is `turn` one of the last `window_turns` turns of `conversation`?  SQLITE_DONE
 * with *in_window set, or an error. */
static int turn_in_window(sqlite_store *s, int64_t conversation, int64_t turn,
                          size_t window_turns, int *in_window)
{
    *in_window = 1;
    if (window_turns == 0) /* the window is every turn */
        return SQLITE_DONE;
    int rc;
    sqlite3_stmt *st = stmt(&s->r, S_TURNS_AFTER, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, conversation);
    sqlite3_bind_int64(st, 2, turn);
    sqlite3_bind_int64(st, 3, (int64_t)window_turns);
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        *in_window = sqlite3_column_int64(st, 0) < (int64_t)window_turns;
        rc = SQLITE_DONE;
    }
    done(st);
    return rc;
}

/* A turn's messages in load()'s form ("m1,m2,"); SQLITE_DONE or an error. */
static int load_turn_messages(sqlite_store *s, int64_t turn, pbuf *out, size_t *count)
{
    int rc;
    sqlite3_stmt *st = stmt(&s->r, S_TURN_MESSAGES, &rc);
    if (!st)
        return rc;
    sqlite3_bind_int64(st, 1, turn);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        pbuf_append(out, sqlite3_column_text(st, 0), (size_t)sqlite3_column_bytes(st, 0));
        pbuf_putc(out, ',');
        (*count)++;
    }
    done(st);
    return rc;
}

static parley_status sqlite_load_turn(store *base, const store_key *key, const char *turn_id,
                                      const char *interface_message_id, size_t window_turns,
                                      uint64_t now_ms, pbuf *out, size_t *nmessages,
                                      char *turn_id_out, int *in_window, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len, count = 0;
    char found_id[STORE_ID_LEN + 1] = "";
    conv_row row = {.id = 0};
    int64_t idle = 0, turn = 0;
    int found = 0, inside = 1;
    *nmessages = 0;
    *in_window = 0;
    if (turn_id_out) /* optional: the caller may only want the messages */
        turn_id_out[0] = '\0';
    if (!key || (!turn_id && !interface_message_id))
        return not_found(err);
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = find_live(s, key, now_ms, &row, &idle);
    if (rc == SQLITE_ROW)
        rc = find_reply_turn(s, row.id, turn_id, interface_message_id, &turn, found_id);
    if (rc == SQLITE_ROW) {
        found = 1;
        rc = turn_in_window(s, row.id, turn, window_turns, &inside);
        if (rc == SQLITE_DONE && !inside)
            rc = load_turn_messages(s, turn, out, &count);
    }
    parley_status status = finish_json(s, out, mark, rc, "cannot load the replied-to turn", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    if (status != PARLEY_OK)
        return status;
    if (!found)
        return not_found(err);
    if (turn_id_out)
        memcpy(turn_id_out, found_id, sizeof found_id);
    *in_window = inside;
    *nmessages = count;
    return PARLEY_OK;
}

/* ---- forget, expire, stats ---- */

static parley_status sqlite_forget(store *base, const store_key *key, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    pthread_mutex_lock(&s->w.lock);
    totals t;
    int found = 1;
    int rc = begin(s, &t);
    if (rc == SQLITE_OK && !key) {
        rc = sqlite3_exec(s->w.db, "DELETE FROM messages; DELETE FROM turns;"
                                 " DELETE FROM conversations;", NULL, NULL, NULL);
        t = (totals){0, 0, 0, s->totals.trimmed}; /* trimmed: since open, not what is held */
    } else if (rc == SQLITE_OK) {
        conv_row row;
        rc = find_conversation(&s->w, key, &row);
        found = rc == SQLITE_ROW;
        if (found)
            rc = delete_conversation(s, &row, &t);
        else if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    parley_status st = end_write(s, rc, &t, "cannot forget", err);
    pthread_mutex_unlock(&s->w.lock);
    return st == PARLEY_OK && !found ? not_found(err) : st;
}

/* Conversations forgotten per transaction by expire(), so that host reads
 * wait for at most one batch. */
#define EXPIRE_BATCH 256

static parley_status sqlite_expire(store *base, uint64_t now_ms, size_t *expired, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t n = 0;
    parley_status st = PARLEY_OK;
    int more = 1;
    while (more && st == PARLEY_OK) {
        pthread_mutex_lock(&s->w.lock);
        totals t;
        size_t batch = 0;
        more = 0;
        int rc = begin(s, &t);
        while (rc == SQLITE_OK) {
            conv_row tail;
            if ((rc = lru_tail(s, &tail)) != SQLITE_ROW) {
                rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
                break;
            }
            rc = SQLITE_OK;
            if (!is_idle(s, tail.last_used_ms, now_ms))
                break; /* the LRU walk stops at the first live one */
            if ((rc = delete_conversation(s, &tail, &t)) != SQLITE_OK)
                break;
            if (++batch == EXPIRE_BATCH) {
                more = 1;
                break;
            }
        }
        st = end_write(s, rc, &t, "cannot expire idle conversations", err);
        if (st == PARLEY_OK) {
            s->expired += batch;
            n += batch;
        }
        pthread_mutex_unlock(&s->w.lock);
    }
    if (expired)
        *expired = n;
    return st;
}

static parley_status sqlite_stats(store *base, store_stats *out, char **err)
{
    (void)err;
    sqlite_store *s = (sqlite_store *)base;
    pthread_mutex_lock(&s->w.lock);
    out->conversations = (size_t)s->totals.conversations;
    out->turns = (size_t)s->totals.turns;
    out->message_bytes = (size_t)s->totals.message_bytes;
    out->trimmed = (size_t)s->totals.trimmed;
    out->evicted = s->evicted;
    out->expired = s->expired;
    pthread_mutex_unlock(&s->w.lock);
    int64_t messages = 0; /* not kept as a total: counted (what a scrape pays, not a turn) */
    pthread_mutex_lock(&s->r.lock);
    if (read_begin(&s->r) == SQLITE_OK &&
        query_int(s->r.db, "SELECT count(*) FROM messages", &messages) == SQLITE_OK)
        out->messages = (size_t)messages;
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    return PARLEY_OK;
}

/* ---- the context record (version 5) ---- */

static parley_status sqlite_context_get(store *base, const store_key *key, uint64_t now_ms,
                                        pbuf *out, store_lifetime *life, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t mark = out->len;
    *life = (store_lifetime){0, 0, 0, 0};
    conv_row row = {.id = 0};
    int64_t idle = 0;
    pthread_mutex_lock(&s->r.lock);
    int rc = read_begin(&s->r);
    if (rc == SQLITE_OK)
        rc = find_live(s, key, now_ms, &row, &idle);
    if (rc == SQLITE_ROW) {
        *life = row.life;
        sqlite3_stmt *st = stmt(&s->r, S_CONTEXT_GET, &rc);
        if (st) {
            sqlite3_bind_int64(st, 1, row.id);
            if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                const unsigned char *text = sqlite3_column_text(st, 0); /* NULL: none */
                if (text)
                    pbuf_append(out, text, (size_t)sqlite3_column_bytes(st, 0));
                rc = SQLITE_DONE;
            }
            done(st);
        }
    }
    parley_status status = finish_json(s, out, mark, rc, "cannot read the context record", err);
    read_end(&s->r);
    pthread_mutex_unlock(&s->r.lock);
    if (idle)
        forget_idle(s, idle, now_ms);
    if (status != PARLEY_OK)
        *life = (store_lifetime){0, 0, 0, 0};
    return status;
}

/* 1 when conversation row `id`'s record (on the write connection) is not `expected`. */
static int context_moved(sqlite_store *s, int64_t id, const char *expected, size_t len, int *rc)
{
    sqlite3_stmt *st = stmt(&s->w, S_CONTEXT_GET, rc);
    if (!st)
        return 0;
    sqlite3_bind_int64(st, 1, id);
    int moved = 0;
    if ((*rc = sqlite3_step(st)) == SQLITE_ROW) {
        const void *cur = sqlite3_column_text(st, 0);
        size_t n = cur ? (size_t)sqlite3_column_bytes(st, 0) : 0;
        moved = n != len || (n && memcmp(cur, expected, n) != 0);
        *rc = SQLITE_OK;
    } else if (*rc == SQLITE_DONE) {
        *rc = SQLITE_OK;
    }
    done(st);
    return moved;
}

static parley_status sqlite_context_set(store *base, const store_key *key, const char *json,
                                        size_t len, const char *expected, size_t expected_len,
                                        uint64_t now_ms, char **err)
{
    sqlite_store *s = (sqlite_store *)base;
    pthread_mutex_lock(&s->w.lock);
    totals t;
    conv_row row;
    int found = 0;
    int rc = begin(s, &t);
    if (rc == SQLITE_OK) {
        rc = find_conversation(&s->w, key, &row);
        found = rc == SQLITE_ROW && !is_idle(s, row.last_used_ms, now_ms);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    int moved = rc == SQLITE_OK && found && expected &&
                context_moved(s, row.id, expected, expected_len, &rc);
    if (rc == SQLITE_OK && found && !moved)
        rc = write_context(s, row.id, json, len);
    parley_status st = end_write(s, rc, &t, "cannot write the context record", err);
    pthread_mutex_unlock(&s->w.lock);
    if (st == PARLEY_OK && moved)
        return PARLEY_ERR_BUSY;
    return st == PARLEY_OK && !found ? not_found(err) : st;
}

const store_backend store_sqlite_backend = {
    .version = STORE_BACKEND_VERSION,
    .scheme = "sqlite",
    .blocking = 1,
    .open = sqlite_open,
    .close = sqlite_close,
    .load = sqlite_load,
    .load_sized = sqlite_load_sized,
    .append = sqlite_append,
    .get_conversation = sqlite_get_conversation,
    .get_turn = sqlite_get_turn,
    .list = sqlite_list,
    .forget = sqlite_forget,
    .expire = sqlite_expire,
    .stats = sqlite_stats,
    .query = sqlite_query,
    .get_message = sqlite_get_message,
    .set_interface_message_id = sqlite_set_interface_message_id,
    .find_message = sqlite_find_message,
    .load_turn = sqlite_load_turn,
    .context_get = sqlite_context_get,
    .context_set = sqlite_context_set,
};
