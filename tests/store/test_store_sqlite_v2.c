/*
 * test_store_sqlite_v2.c -- the SQLite store's schema version 2 (store.h
 * backend version 4): a version-1 file, written here with the v1 DDL as the
 * 0.1 code wrote it, is upgraded in place when opened (its turns still read,
 * new appends work, the lifetime counts start from the turns it kept); a
 * failed upgrade refuses the file and leaves it byte-identical; message
 * identity (interface ids, metadata) and lifetimes survive a restart; and
 * set_interface_message_id / find_message / load_turn as store.h declares
 * them.  (The same behaviour on every backend is the conformance suite's.)
 */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/check.h"
#include "../unit/read_file.h"
#include "fault_vfs.h"
#include "store/store.h"

static const store_backend *const B = &store_sqlite_backend;
static char tmpdir[] = "/tmp/parley-sqlite-v2-XXXXXX";
static unsigned files;

static char *fresh_path(void)
{
    return pstr_printf("%s/s%u.db", tmpdir, files++);
}

static store *open_path(const char *path, size_t keep_turns, uint64_t idle_ms, char **err)
{
    store_config cfg = {.location = path, .limits = {keep_turns, 100, idle_ms}};
    store *s = NULL;
    return B->open(&cfg, &s, err) == PARLEY_OK ? s : NULL;
}

static store *open_ok(const char *path, size_t keep_turns, uint64_t idle_ms)
{
    char *err = NULL;
    store *s = open_path(path, keep_turns, idle_ms, &err);
    if (!s)
        fprintf(stderr, "open %s: %s\n", path, err ? err : "?");
    free(err);
    CHECK(s != NULL);
    return s;
}

static int64_t pragma_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* ---- a version-1 file, as Parley 0.1 wrote it ---- */

/* The v1 DDL exactly as sqlite.c (schema_v1) creates it. */
static const char v1_schema[] =
    "CREATE TABLE store_meta( id INTEGER PRIMARY KEY CHECK (id = 1), conversations INTEGER NOT "
    "NULL, turns INTEGER NOT NULL, message_bytes INTEGER NOT NULL);"
    "INSERT INTO store_meta VALUES (1, 0, 0, 0);"
    "CREATE TABLE conversations( id INTEGER PRIMARY KEY, persona TEXT NOT NULL, interface_type "
    "TEXT NOT NULL, conversation_id TEXT NOT NULL, created_ms INTEGER NOT NULL, last_used_ms "
    "INTEGER NOT NULL, use_seq INTEGER NOT NULL, turns INTEGER NOT NULL, message_bytes INTEGER "
    "NOT NULL, UNIQUE (persona, interface_type, conversation_id));"
    "CREATE UNIQUE INDEX conversations_by_use ON conversations(use_seq);"
    "CREATE TABLE turns( id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES "
    "conversations(id), turn_id TEXT NOT NULL UNIQUE, started_ms INTEGER NOT NULL, finished_ms "
    "INTEGER NOT NULL, message_bytes INTEGER NOT NULL);"
    "CREATE INDEX turns_by_conversation ON turns(conversation, id);"
    "CREATE TABLE messages( id INTEGER PRIMARY KEY, turn INTEGER NOT NULL REFERENCES turns(id), "
    "message_id TEXT NOT NULL, role TEXT NOT NULL, created_ms INTEGER NOT NULL, json TEXT NOT "
    "NULL);"
    "CREATE INDEX messages_by_turn ON messages(turn);";

/* Conversation "kitchen" (telegram) kept 2 turns; a third was dropped by
 * keep_turns before the upgrade, so its counts say 2 turns, 4 messages.
 * Conversation "garage" has one turn of one user message. */
static const char v1_rows[] =
    "INSERT INTO conversations VALUES (1, '', 'telegram', 'kitchen', 1000, 3000, 2, 2, 112);"
    "INSERT INTO conversations VALUES (2, '', '', 'garage', 1500, 1500, 1, 1, 30);"
    "INSERT INTO turns VALUES (2, 1, '00000002-0000-4000-8000-000000000002', 1900, 2000, 56);"
    "INSERT INTO turns VALUES (3, 2, '00000003-0000-4000-8000-000000000003', 1400, 1500, 30);"
    "INSERT INTO turns VALUES (4, 1, '00000004-0000-4000-8000-000000000004', 2900, 3000, 56);"
    "INSERT INTO messages VALUES (3, 2, '00000002-1111-4000-8000-000000000000', 'user', 1990,"
    " '{\"role\":\"user\",\"content\":\"a\"}');"
    "INSERT INTO messages VALUES (4, 2, '00000002-1111-4000-8000-000000000001', 'assistant',"
    " 1991, '{\"role\":\"assistant\",\"content\":\"b\"}');"
    "INSERT INTO messages VALUES (5, 3, '00000003-1111-4000-8000-000000000000', 'user', 1490,"
    " '{\"role\":\"user\",\"content\":\"garage door\"}');"
    "INSERT INTO messages VALUES (6, 4, '00000004-1111-4000-8000-000000000000', 'user', 2990,"
    " '{\"role\":\"user\",\"content\":\"c\"}');"
    "INSERT INTO messages VALUES (7, 4, '00000004-1111-4000-8000-000000000001', 'tool', 2991,"
    " '{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"ok\"}');"
    "UPDATE store_meta SET conversations = 2, turns = 3, message_bytes = 142;";

/* A v1 store at `path`; with_id_index: the messages_by_message_id index the
 * v1 builds with queries added (the ones before them did not). */
static void make_v1_file(const char *path, int with_id_index)
{
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    char *sql = sqlite3_mprintf("BEGIN; %s %s %s PRAGMA application_id = %d;"
                                " PRAGMA user_version = 1; COMMIT; PRAGMA journal_mode = WAL;",
                                v1_schema, v1_rows,
                                with_id_index
                                    ? "CREATE INDEX messages_by_message_id ON messages(message_id);"
                                    : "",
                                0x50726c79);
    char *err = NULL;
    CHECK(sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK);
    if (err)
        fprintf(stderr, "v1 file: %s\n", err);
    sqlite3_free(err);
    sqlite3_free(sql);
    CHECK(sqlite3_close(db) == SQLITE_OK);
    chmod(path, 0600);
}

static char *get_conversation(store *s, const char *iface, const char *id, uint64_t now)
{
    store_key key = {id, "", iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = B->get_conversation(s, &key, now, &b, &err);
    free(err);
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static char *load(store *s, const char *iface, const char *id, size_t last, size_t *n)
{
    store_key key = {id, "", iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    CHECK(B->load(s, &key, last, 5000, &b, n, &err) == PARLEY_OK);
    free(err);
    char *text = pbuf_take(&b);
    return text ? text : strdup("");
}

/* One turn: messages "role:text" separated by '|'; message i of turn n has id
 * nnnnnnnn-2222-...-i, created at now-10+i; iids[i] / meta[i] may be NULL. */
static parley_status put(store *s, const char *iface, const char *conv, unsigned n,
                         const char *spec, const char *const *iids, const char *const *meta,
                         uint64_t now)
{
    char tid[37], mids[8][37], json[8][128], role[8][16];
    store_message msgs[8];
    size_t count = 0;
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", n, n);
    for (const char *p = spec; *p && count < 8; count++) {
        const char *colon = strchr(p, ':'), *bar = strchr(p, '|');
        size_t tlen = bar ? (size_t)(bar - colon - 1) : strlen(colon + 1);
        snprintf(role[count], sizeof role[count], "%.*s", (int)(colon - p), p);
        snprintf(json[count], sizeof json[count], "{\"role\":\"%s\",\"content\":\"%.*s\"}",
                 role[count], (int)tlen, colon + 1);
        snprintf(mids[count], 37, "%08x-2222-4000-8000-%012zx", n, count);
        msgs[count] = (store_message){mids[count], role[count], now - 10 + count, json[count],
                                      strlen(json[count]), iids ? iids[count] : NULL,
                                      meta ? meta[count] : NULL,
                                      meta && meta[count] ? strlen(meta[count]) : 0};
        p = bar ? bar + 1 : colon + 1 + tlen;
    }
    store_turn turn = {tid, now - 100, now, msgs, count, NULL, 0, 0};
    store_key key = {conv, "", iface};
    char *err = NULL;
    parley_status st = B->append(s, &key, &turn, now, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "append: %s\n", err ? err : "?");
    free(err);
    return st;
}

static char *message_by_id(store *s, const char *id, uint64_t now)
{
    pbuf b = PBUF_INIT;
    char *err = NULL;
    parley_status st = B->get_message(s, id, now, &b, &err);
    free(err);
    if (st != PARLEY_OK) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static char *find(store *s, const char *iface, const char *conv, const char *iid, uint64_t now,
                  parley_status *status)
{
    store_key key = {conv, "", iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    *status = B->find_message(s, &key, iid, now, &b, &err);
    free(err);
    if (*status != PARLEY_OK) {
        CHECK(b.len == 0);
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

static parley_status set_iid(store *s, unsigned turn_no, const char *iid, uint64_t now,
                             char *message_id);

/* ---- the upgrade ---- */

static void test_upgrade_from_v1(int with_id_index)
{
    char *path = fresh_path();
    make_v1_file(path, with_id_index);
    store *s = open_ok(path, 2, 0);
    if (!s) {
        free(path);
        return;
    }
    /* The old turns read as they did. */
    size_t n = 0;
    char *text = load(s, "telegram", "kitchen", 0, &n);
    CHECK(n == 4);
    CHECK_STR(text, "{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                    "{\"role\":\"user\",\"content\":\"c\"},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"ok\"},");
    free(text);
    /* Lifetime from what the file still held: 2 turns, 4 messages, 3 roles. */
    char *conv = get_conversation(s, "telegram", "kitchen", 4000);
    CHECK(conv && strstr(conv, "\"last_used_at\":\"1970-01-01T00:00:03.000Z\","
                               "\"last_message_at\":\"1970-01-01T00:00:02.991Z\","
                               "\"message_count\":4,\"turn_count\":2,"
                               "\"participants\":[\"user\",\"assistant\",\"tool\"],\"turns\":["));
    free(conv);
    /* Old messages: found by id, without interface ids or metadata. */
    char *m = message_by_id(s, "00000003-1111-4000-8000-000000000000", 4000);
    CHECK(m && strstr(m, "\"turn_id\":\"00000003-0000-4000-8000-000000000003\",\"role\":\"user\","
                         "\"created_at\":\"1970-01-01T00:00:01.490Z\",\"message\":"));
    free(m);
    /* A message stored by version 1 takes an interface id, and is found by it. */
    char mid[STORE_ID_LEN + 1] = "";
    CHECK(set_iid(s, 4, "old-4", 4000, mid) == PARLEY_OK);
    CHECK_STR(mid, "00000004-1111-4000-8000-000000000001");
    parley_status found;
    m = find(s, "telegram", "kitchen", "old-4", 4000, &found);
    CHECK(found == PARLEY_OK && m && strstr(m, "\"message_id\":\"00000004-1111-4000-8000-000000000001\""));
    free(m);
    /* New appends work, with identity; keep_turns 2 drops the oldest turn but
     * not the lifetime. */
    const char *iids[] = {"tg-500", NULL};
    const char *meta[] = {"{\"chat\":7}", NULL};
    CHECK(put(s, "telegram", "kitchen", 5, "user:d|assistant:e", iids, meta, 5000) == PARLEY_OK);
    text = load(s, "telegram", "kitchen", 0, &n);
    CHECK(n == 4 && strstr(text, "\"content\":\"c\"") && strstr(text, "\"content\":\"e\"") &&
          !strstr(text, "\"content\":\"a\""));
    free(text);
    conv = get_conversation(s, "telegram", "kitchen", 5000);
    CHECK(conv && strstr(conv, "\"last_message_at\":\"1970-01-01T00:00:04.991Z\","
                               "\"message_count\":6,\"turn_count\":3,"));
    free(conv);
    parley_status st;
    m = find(s, "telegram", "kitchen", "tg-500", 5000, &st);
    CHECK(st == PARLEY_OK && m && strstr(m, "\"interface_message_id\":\"tg-500\","
                                            "\"metadata\":{\"chat\":7},\"message\":"));
    free(m);
    B->close(s);
    CHECK(pragma_int(path, "PRAGMA user_version") == 4);
    CHECK(pragma_int(path, "SELECT count(*) FROM sqlite_schema WHERE name IN"
                           " ('messages_by_message_id', 'messages_by_interface_id')") == 2);
    /* Reopened: version 4 as it is, everything still there. */
    s = open_ok(path, 2, 0);
    if (s) {
        m = find(s, "telegram", "kitchen", "tg-500", 6000, &st);
        CHECK(st == PARLEY_OK && m && strstr(m, "\"metadata\":{\"chat\":7}"));
        free(m);
        conv = get_conversation(s, "", "garage", 6000);
        CHECK(conv && strstr(conv, "\"message_count\":1,\"turn_count\":1,"
                                   "\"participants\":[\"user\"]"));
        free(conv);
        B->close(s);
    }
    free(path);
}

/* load_sized of a conversation: "messages:tokens " per turn. */
static char *sizes(store *s, const char *iface, const char *id)
{
    store_key key = {id, "", iface};
    pbuf text = PBUF_INIT, out = PBUF_INIT;
    store_sizes z = {0};
    size_t n = 0;
    CHECK(B->load_sized(s, &key, 0, 5000, &text, &n, &z, NULL) == PARLEY_OK);
    for (size_t i = 0; i < z.n; i++)
        pbuf_printf(&out, "%u:%u ", (unsigned)z.turn[i].nmessages, (unsigned)z.turn[i].tokens);
    free(z.turn);
    pbuf_free(&text);
    return out.data ? pbuf_take(&out) : strdup("");
}

/* A version-3 file (before turn sizes: its turns table has no `tokens`) is
 * upgraded in place: its turns read as before, with no size (the context
 * engine estimates them from their bytes, as it did), and new turns keep
 * theirs.  The v3 file is made from a v4 one by taking the column away,
 * which leaves exactly the schema version 3 created. */
static void test_upgrade_from_v3(void)
{
    char *path = fresh_path();
    store *s = open_ok(path, 0, 0);
    CHECK(put(s, "", "den", 1, "user:a|assistant:b", NULL, NULL, 1000) == PARLEY_OK);
    CHECK(put(s, "", "den", 2, "user:c|assistant:d", NULL, NULL, 2000) == PARLEY_OK);
    B->close(s);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "ALTER TABLE turns DROP COLUMN tokens; PRAGMA user_version = 3;",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK(pragma_int(path, "SELECT count(*) FROM pragma_table_info('turns')"
                           " WHERE name = 'tokens'") == 0);
    s = open_ok(path, 0, 0);
    if (!s)
        return;
    CHECK(pragma_int(path, "PRAGMA user_version") == 4);
    char *z = sizes(s, "", "den");
    CHECK_STR(z, "2:0 2:0 "); /* unknown: estimated from their bytes */
    free(z);
    store_key key = {"den", "", ""};
    const char *json = "{\"role\":\"user\",\"content\":\"e\"}";
    store_message m = {"00000003-2222-4000-8000-000000000000", "user", 2990, json, strlen(json),
                       NULL, NULL, 0};
    store_turn t = {"00000003-0000-4000-8000-000000000003", 2900, 3000, &m, 1, NULL, 0, 42};
    CHECK(B->append(s, &key, &t, 3000, NULL) == PARLEY_OK);
    z = sizes(s, "", "den");
    CHECK_STR(z, "2:0 2:0 1:42 ");
    free(z);
    char *conv = get_conversation(s, "", "den", 3000);
    CHECK(conv && strstr(conv, "\"tokens\":42,") && !strstr(conv, "\"tokens\":0"));
    CHECK(conv && strstr(conv, "\"content\":\"a\"") && strstr(conv, "\"content\":\"d\""));
    free(conv);
    B->close(s);
    s = open_ok(path, 0, 0); /* and reopens as version 4 */
    if (s) {
        z = sizes(s, "", "den");
        CHECK_STR(z, "2:0 2:0 1:42 ");
        free(z);
        B->close(s);
    }
    free(path);
}

/* Opening path is refused, with an error naming the file and saying `why`
 * (and `also`, unless NULL), and leaves the file byte-identical. */
static void check_refused_unchanged(const char *path, const char *why, const char *also)
{
    size_t len_before = 0, len_after = 0;
    char *before = read_file(path, &len_before);
    char *err = NULL;
    store *s = open_path(path, 0, 0, &err);
    CHECK(s == NULL);
    if (s)
        B->close(s);
    CHECK(err && strstr(err, path) && strstr(err, why) && (!also || strstr(err, also)));
    if (err && !strstr(err, why))
        fprintf(stderr, "refusal of %s: %s\n", path, err);
    free(err);
    char *after = read_file(path, &len_after);
    CHECK(before && after && len_before == len_after && memcmp(before, after, len_before) == 0);
    free(before);
    free(after);
}

/* A failed upgrade (the disk full when it writes) refuses the file, says
 * why, and leaves it byte-identical; once writes work it upgrades. */
static void test_failed_upgrade_changes_nothing(void)
{
    char *path = fresh_path();
    make_v1_file(path, 0);
    FAULT_VFS_SET(fail_writes, SQLITE_FULL);
    check_refused_unchanged(path, "cannot upgrade it from schema version 1 to 4",
                            "the file is unchanged");
    FAULT_VFS_SET(fail_writes, 0);
    CHECK(pragma_int(path, "PRAGMA user_version") == 1);
    store *s = open_ok(path, 0, 0);
    if (s) {
        size_t n = 0;
        free(load(s, "telegram", "kitchen", 0, &n));
        CHECK(n == 4);
        B->close(s);
    }
    CHECK(pragma_int(path, "PRAGMA user_version") == 4);
    free(path);
}

/* A file that says version 2 without its columns is corrupt: refused, unchanged. */
static void test_v2_without_its_columns_refused(void)
{
    char *path = fresh_path();
    make_v1_file(path, 1);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA user_version = 2;", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused_unchanged(path, "corrupt (columns missing from schema version 2)", NULL);
    free(path);
}

/* A read-only v1 file cannot be upgraded: refused, unchanged.  Root ignores
 * file modes, so as root the check runs as the unprivileged user 65534. */
static int read_only_checks(const char *dir)
{
    int failed_before = check_failed;
    char *path = pstr_printf("%s/v1-read-only.db", dir);
    make_v1_file(path, 1);
    CHECK(chmod(path, 0400) == 0);
    check_refused_unchanged(path, "cannot upgrade it from schema version 1 to 4", NULL);
    free(path);
    return check_failed - failed_before;
}

static void test_read_only_v1_refused(void)
{
    if (geteuid() != 0) {
        read_only_checks(tmpdir);
        return;
    }
    char dir[] = "/tmp/parley-sqlite-v2-ro-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(chown(dir, 65534, 65534) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(100);
        _exit(read_only_checks(dir) ? 1 : 0);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *cleanup = pstr_printf("rm -rf '%s'", dir);
    CHECK(system(cleanup) == 0);
    free(cleanup);
}

/* ---- message identity ---- */

static parley_status set_iid(store *s, unsigned turn_no, const char *iid, uint64_t now,
                             char *message_id)
{
    char tid[37];
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", turn_no, turn_no);
    char *err = NULL;
    parley_status st = B->set_interface_message_id(s, tid, iid, now, message_id, &err);
    free(err);
    return st;
}

static void test_identity_survives_restart(void)
{
    char *path = fresh_path();
    store *s = open_ok(path, 3, 0);
    const char *iids[] = {"u-1", NULL, NULL};
    const char *meta[] = {"{\"from\":\"anna\"}", NULL, NULL};
    CHECK(put(s, "telegram", "c", 1, "user:hi|assistant:hello|tool:x", iids, meta, 1000) ==
          PARLEY_OK);
    char mid[STORE_ID_LEN + 1] = "";
    /* The last assistant message gets it (not the tool message after it). */
    CHECK(set_iid(s, 1, "a-1", 1100, mid) == PARLEY_OK);
    CHECK_STR(mid, "00000001-2222-4000-8000-000000000001");
    /* A turn without an assistant message: its last message. */
    CHECK(put(s, "telegram", "c", 2, "user:one|tool:two", NULL, NULL, 2000) == PARLEY_OK);
    CHECK(set_iid(s, 2, "x-2", 2100, mid) == PARLEY_OK);
    CHECK_STR(mid, "00000002-2222-4000-8000-000000000001");
    CHECK(set_iid(s, 2, "x-3", 2200, NULL) == PARLEY_OK); /* replaces */
    CHECK(set_iid(s, 99, "x-9", 2200, mid) == PARLEY_ERR_NOT_FOUND);
    CHECK(set_iid(s, 2, "", 2200, mid) == PARLEY_ERR_STORAGE);
    /* An interface id over STORE_MAX_INTERFACE_MESSAGE_ID: the append fails, nothing stored. */
    char long_id[STORE_MAX_INTERFACE_MESSAGE_ID + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    const char *too_long[] = {long_id};
    CHECK(put(s, "telegram", "c", 7, "user:no", too_long, NULL, 2300) == PARLEY_ERR_STORAGE);
    CHECK(set_iid(s, 2, long_id, 2300, mid) == PARLEY_ERR_STORAGE);
    char *c_now = get_conversation(s, "telegram", "c", 2300);
    CHECK(c_now && strstr(c_now, "\"message_count\":5,\"turn_count\":2,"));
    free(c_now);
    B->close(s);

    s = open_ok(path, 3, 0);
    if (!s) {
        free(path);
        return;
    }
    parley_status st;
    char *m = find(s, "telegram", "c", "a-1", 3000, &st);
    CHECK(st == PARLEY_OK && m &&
          strstr(m, "{\"message_id\":\"00000001-2222-4000-8000-000000000001\","
                    "\"conversation_id\":\"c\",\"interface_type\":\"telegram\",\"persona\":\"\","
                    "\"turn_id\":\"00000001-0000-4000-8000-000000000001\",\"role\":\"assistant\","
                    "\"created_at\":\"1970-01-01T00:00:00.991Z\",\"interface_message_id\":\"a-1\","
                    "\"message\":{\"role\":\"assistant\",\"content\":\"hello\"}}"));
    free(m);
    m = message_by_id(s, "00000001-2222-4000-8000-000000000000", 3000);
    CHECK(m && strstr(m, "\"interface_message_id\":\"u-1\",\"metadata\":{\"from\":\"anna\"},"));
    free(m);
    free(find(s, "telegram", "c", "x-2", 3000, &st)); /* replaced */
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    m = find(s, "telegram", "c", "x-3", 3000, &st);
    CHECK(st == PARLEY_OK && m && strstr(m, "\"role\":\"tool\""));
    free(m);
    /* Only within the conversation: another interface is another conversation. */
    free(find(s, "web", "c", "a-1", 3000, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    /* The most recent of a repeated interface id. */
    const char *again[] = {"u-1"};
    CHECK(put(s, "telegram", "c", 3, "user:again", again, NULL, 4000) == PARLEY_OK);
    m = find(s, "telegram", "c", "u-1", 4000, &st);
    CHECK(st == PARLEY_OK && m && strstr(m, "\"content\":\"again\""));
    free(m);
    /* The query shows them too. */
    store_query q = {.conversation_id = "c", .limit = 10, .until_ms = UINT64_MAX,
                     .newest_first = 1};
    pbuf b = PBUF_INIT;
    size_t count = 0;
    uint64_t last = 0;
    int more = 0;
    CHECK(B->query(s, &q, 4000, &b, &count, &last, &more, NULL) == PARLEY_OK);
    char *all = pbuf_take(&b);
    CHECK(count == 6 && all && strstr(all, "\"interface_message_id\":\"x-3\"") &&
          strstr(all, "\"metadata\":{\"from\":\"anna\"}"));
    free(all);
    /* keep_turns 3: turn 4 drops turn 1, and with it what set_iid can reach. */
    CHECK(put(s, "telegram", "c", 4, "user:four", NULL, NULL, 5000) == PARLEY_OK);
    CHECK(set_iid(s, 1, "late", 5100, mid) == PARLEY_ERR_NOT_FOUND);
    free(find(s, "telegram", "c", "a-1", 5100, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    char *conv = get_conversation(s, "telegram", "c", 5100);
    CHECK(conv && strstr(conv, "\"last_message_at\":\"1970-01-01T00:00:04.990Z\","
                               "\"message_count\":7,\"turn_count\":4,"
                               "\"participants\":[\"user\",\"assistant\",\"tool\"],"));
    free(conv);
    B->close(s);
    free(path);
}

/* An idle conversation is forgotten with its lifetime and its interface ids. */
static void test_expired_turn_not_found(void)
{
    char *path = fresh_path();
    store *s = open_ok(path, 0, 1000);
    const char *iids[] = {"u-1", NULL};
    CHECK(put(s, "", "c", 1, "user:a|assistant:b", iids, NULL, 1000) == PARLEY_OK);
    CHECK(set_iid(s, 1, "a-1", 5000, NULL) == PARLEY_ERR_NOT_FOUND);
    parley_status st;
    free(find(s, "", "c", "u-1", 5000, &st));
    CHECK(st == PARLEY_ERR_NOT_FOUND);
    /* Appending to an idle conversation restarts it, lifetime included. */
    CHECK(put(s, "", "d", 3, "user:x|assistant:y", NULL, NULL, 1000) == PARLEY_OK);
    CHECK(put(s, "", "d", 4, "tool:z", NULL, NULL, 9000) == PARLEY_OK);
    char *d = get_conversation(s, "", "d", 9000);
    CHECK(d && strstr(d, "\"message_count\":1,\"turn_count\":1,\"participants\":[\"tool\"]"));
    free(d);
    CHECK(put(s, "", "c", 2, "system:restart", NULL, NULL, 9000) == PARLEY_OK);
    char *conv = get_conversation(s, "", "c", 9000);
    CHECK(conv && strstr(conv, "\"message_count\":1,\"turn_count\":1,"
                               "\"participants\":[\"system\"]"));
    free(conv);
    B->close(s);
    free(path);
}

static parley_status reply(store *s, const char *iface, const char *conv, const char *turn_id,
                           const char *iid, size_t window, char **text, size_t *n,
                           char turn_out[STORE_ID_LEN + 1], int *in_window)
{
    store_key key = {conv, "", iface};
    pbuf b = PBUF_INIT;
    char *err = NULL;
    *n = 99;
    *in_window = -1;
    parley_status st =
        B->load_turn(s, &key, turn_id, iid, window, 9000, &b, n, turn_out, in_window, &err);
    free(err);
    *text = pbuf_take(&b);
    if (!*text)
        *text = strdup("");
    return st;
}

static void test_load_turn(void)
{
    char *path = fresh_path();
    store *s = open_ok(path, 0, 0);
    const char *first[] = {"u-1", NULL, NULL};
    CHECK(put(s, "telegram", "c", 1, "user:lights?|assistant:call|tool:ok", first, NULL, 1000) ==
          PARLEY_OK);
    CHECK(set_iid(s, 1, "a-1", 1100, NULL) == PARLEY_OK);
    for (unsigned i = 2; i <= 4; i++)
        CHECK(put(s, "telegram", "c", i, "user:more|assistant:sure", NULL, NULL, 1000 * i) ==
              PARLEY_OK);
    CHECK(put(s, "telegram", "other", 9, "user:elsewhere", NULL, NULL, 5000) == PARLEY_OK);
    char *text, out[STORE_ID_LEN + 1];
    size_t n;
    int in_window;
    /* By interface id, outside a window of 3 turns: its whole turn, in load()'s form. */
    CHECK(reply(s, "telegram", "c", NULL, "a-1", 3, &text, &n, out, &in_window) == PARLEY_OK);
    CHECK(in_window == 0 && n == 3);
    CHECK_STR(out, "00000001-0000-4000-8000-000000000001");
    CHECK_STR(text, "{\"role\":\"user\",\"content\":\"lights?\"},"
                    "{\"role\":\"assistant\",\"content\":\"call\"},"
                    "{\"role\":\"tool\",\"content\":\"ok\"},");
    free(text);
    /* turn_id_out is optional. */
    store_key key = {"c", "", "telegram"};
    pbuf b = PBUF_INIT;
    CHECK(B->load_turn(s, &key, NULL, "a-1", 3, 9000, &b, &n, NULL, &in_window, NULL) ==
          PARLEY_OK);
    CHECK(in_window == 0 && n == 3 && b.len > 0);
    pbuf_free(&b);
    /* Inside a window of 4 (and of 0 = all): nothing appended. */
    CHECK(reply(s, "telegram", "c", NULL, "u-1", 4, &text, &n, out, &in_window) == PARLEY_OK);
    CHECK(in_window == 1 && n == 0 && !*text);
    free(text);
    CHECK(reply(s, "telegram", "c", NULL, "u-1", 0, &text, &n, out, &in_window) == PARLEY_OK);
    CHECK(in_window == 1 && n == 0 && !*text);
    free(text);
    /* By turn id. */
    CHECK(reply(s, "telegram", "c", "00000002-0000-4000-8000-000000000002", NULL, 1, &text, &n,
                out, &in_window) == PARLEY_OK);
    CHECK(in_window == 0 && n == 2);
    CHECK_STR(out, "00000002-0000-4000-8000-000000000002");
    free(text);
    CHECK(reply(s, "telegram", "c", "00000004-0000-4000-8000-000000000004", NULL, 1, &text, &n,
                out, &in_window) == PARLEY_OK);
    CHECK(in_window == 1 && n == 0);
    free(text);
    /* Another conversation's turn, an unknown id, an unknown conversation: not found,
     * nothing appended. */
    CHECK(reply(s, "telegram", "c", "00000009-0000-4000-8000-000000000009", NULL, 1, &text, &n,
                out, &in_window) == PARLEY_ERR_NOT_FOUND);
    CHECK(!*text);
    free(text);
    CHECK(reply(s, "telegram", "c", NULL, "nope", 1, &text, &n, out, &in_window) ==
          PARLEY_ERR_NOT_FOUND);
    free(text);
    CHECK(reply(s, "web", "c", NULL, "a-1", 1, &text, &n, out, &in_window) ==
          PARLEY_ERR_NOT_FOUND);
    free(text);
    B->close(s);
    free(path);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    if (fault_vfs_install() != SQLITE_OK) {
        fprintf(stderr, "cannot install the fault VFS\n");
        return 2;
    }
    test_upgrade_from_v1(0);
    test_upgrade_from_v1(1);
    test_failed_upgrade_changes_nothing();
    test_read_only_v1_refused();
    test_v2_without_its_columns_refused();
    test_upgrade_from_v3();
    test_identity_survives_restart();
    test_expired_turn_not_found();
    test_load_turn();
    char *cleanup = pstr_printf("rm -rf '%s'", tmpdir);
    if (system(cleanup) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cleanup);
    return check_report();
}
