/*
 * test_store_sqlite_files.c -- the SQLite store against what can happen to its
 * files (issue 27, items 8 to 12): a FIFO, a directory or a symbolic link
 * where the store should be is refused at once with a message that says what
 * it is; the WAL deleted under a running agent, then a crash (the child
 * process _exit()s without closing), loses no committed turn; a damaged WAL
 * stops writes and is never checkpointed into the file (found by a read, or
 * by its checksums at close; a crash's torn frame is not damage); two agents
 * writing one file (its PATH-lock deleted) keep the stored totals right, and
 * a deleted PATH-lock is made again; a refused file keeps no -wal, -shm or
 * -lock beside it.
 */
#include <pthread.h>
#include <signal.h>
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
#include "store/store.h"

static const store_backend *const B = &store_sqlite_backend;
static char tmpdir[] = "/tmp/parley-sqlite-files-XXXXXX";
static unsigned files;

/* What the store said in the log, one line after another (from any of its threads). */
static char logged[4096];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void log_to_buffer(void *ud, parley_log_level level, const char *message)
{
    (void)ud;
    pthread_mutex_lock(&log_lock);
    size_t used = strlen(logged);
    snprintf(logged + used, sizeof logged - used, "%d %s\n", (int)level, message);
    pthread_mutex_unlock(&log_lock);
}

static int was_logged(const char *words)
{
    pthread_mutex_lock(&log_lock);
    int yes = strstr(logged, words) != NULL;
    pthread_mutex_unlock(&log_lock);
    return yes;
}

static char *fresh_path(void) { return pstr_printf("%s/f%u.db", tmpdir, files++); }

static store *open_path(const char *path, char **err)
{
    store_config cfg = {.location = path, .limits = {0, 100, 0}, .log = log_to_buffer};
    store *s = NULL;
    return B->open(&cfg, &s, err) == PARLEY_OK ? s : NULL;
}

static store *open_ok(const char *path)
{
    char *err = NULL;
    store *s = open_path(path, &err);
    if (!s)
        fprintf(stderr, "open %s: %s\n", path, err ? err : "?");
    free(err);
    CHECK(s != NULL);
    return s;
}

/* Turn n of conversation `conv`: a user message and an answer. */
static parley_status put(store *s, const char *conv, unsigned n, char **err)
{
    char tid[37], mids[2][37], json[2][64];
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", n, n);
    for (int i = 0; i < 2; i++) {
        snprintf(mids[i], sizeof mids[i], "%08x-1111-4000-8000-%012x", n, i);
        snprintf(json[i], sizeof json[i], "{\"role\":\"%s\",\"content\":\"t%u\"}",
                 i ? "assistant" : "user", n);
    }
    store_message msgs[2] = {
        {mids[0], "user", 1000 + n, json[0], strlen(json[0]), NULL, NULL, 0},
        {mids[1], "assistant", 1000 + n, json[1], strlen(json[1]), NULL, NULL, 0}};
    store_turn turn = {tid, 1000 + n, 1000 + n, msgs, 2, NULL, 0, 0};
    store_key key = {conv, "", ""};
    return B->append(s, &key, &turn, 1000 + n, err);
}

static void put_ok(store *s, const char *conv, unsigned n)
{
    char *err = NULL;
    parley_status st = put(s, conv, n, &err);
    if (st != PARLEY_OK)
        fprintf(stderr, "append %s #%u: %s\n", conv, n, err ? err : "?");
    CHECK(st == PARLEY_OK);
    free(err);
}

/* How many turns of `conv` the store holds (-1: a read error). */
static int turns_of(store *s, const char *conv)
{
    store_key key = {conv, "", ""};
    pbuf b = PBUF_INIT;
    size_t n = 0;
    char *err = NULL;
    parley_status st = B->load(s, &key, 0, 5000, &b, &n, &err);
    free(err);
    pbuf_free(&b);
    return st == PARLEY_OK ? (int)n / 2 : -1;
}

static int64_t query_int(const char *path, const char *sql)
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

static int integrity_ok(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int ok = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        ok = strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok;
}

static int exists(const char *path, const char *suffix)
{
    char *p = pstr_printf("%s%s", path, suffix);
    struct stat st;
    int yes = lstat(p, &st) == 0;
    free(p);
    return yes;
}

/* Open must fail with a message holding every one of `words` (NULL-ended),
 * leaving no -lock, -wal or -shm beside the path that was not there before. */
static void check_refused(const char *path, const char *const *words)
{
    int had_lock = exists(path, "-lock"), had_wal = exists(path, "-wal"),
        had_shm = exists(path, "-shm");
    char *err = NULL;
    store *s = open_path(path, &err);
    CHECK(s == NULL);
    if (s)
        B->close(s);
    for (const char *const *w = words; *w; w++) {
        CHECK(err && strstr(err, *w));
        if (!err || !strstr(err, *w))
            fprintf(stderr, "  refusal of %s said: %s (wanted \"%s\")\n", path,
                    err ? err : "(null)", *w);
    }
    free(err);
    CHECK(had_lock || !exists(path, "-lock"));
    CHECK(had_wal || !exists(path, "-wal"));
    CHECK(had_shm || !exists(path, "-shm"));
}

/* ---- item 8: a FIFO (a directory, a socket) is refused without blocking ---- */

static void test_fifo_refused_at_once(void)
{
    char *path = fresh_path();
    CHECK(mkfifo(path, 0600) == 0);
    alarm(20); /* before the fix create() waited for a writer forever */
    check_refused(path, (const char *const[]){path, "not a regular file", "FIFO", NULL});
    free(path);

    /* A FIFO where its lock file goes. */
    char *locked = fresh_path();
    char *lock = pstr_printf("%s-lock", locked);
    CHECK(mkfifo(lock, 0600) == 0);
    check_refused(locked, (const char *const[]){lock, "is not a regular file: remove it", NULL});
    free(lock);
    free(locked);

    char *dir = fresh_path();
    CHECK(mkdir(dir, 0700) == 0);
    check_refused(dir, (const char *const[]){dir, "not a regular file", "a directory", NULL});
    free(dir);
    alarm(0);
}

/* ---- item 9: a symbolic link is named as one, with the real path ---- */

static void test_symlink_named(void)
{
    char *real = fresh_path();
    store *s = open_ok(real);
    put_ok(s, "c", 1);
    B->close(s);
    char *link = fresh_path();
    CHECK(symlink(real, link) == 0);
    char *resolved = realpath(real, NULL);
    check_refused(link,
                  (const char *const[]){link, "a symbolic link (to ", resolved ? resolved : real,
                                        "give the real path", NULL});
    free(resolved);
    char *dangling = fresh_path();
    CHECK(symlink("/nonexistent/parley.db", dangling) == 0);
    check_refused(dangling, (const char *const[]){"a symbolic link", "give the real path", NULL});
    free(dangling);
    free(link);
    free(real);
}

/* ---- item 10: the WAL deleted while the agent runs ---- */

/* In a child: open, store `n` turns, delete PATH-wal, then either append once
 * more (refused: writes stop) or wait for the checkpointer's look; then
 * _exit() without closing, as a crash would.  The exit status counts the
 * child's failed checks. */
static int failed_before_fork;

static void wal_deleted_child(const char *path, unsigned n, int append_after)
{
    store *s = open_ok(path);
    for (unsigned i = 1; i <= n; i++)
        put_ok(s, "c", i);
    char *wal = pstr_printf("%s-wal", path);
    CHECK(unlink(wal) == 0);
    free(wal);
    if (append_after) {
        char *err = NULL;
        CHECK(put(s, "c", n + 1, &err) == PARLEY_ERR_STORAGE);
        CHECK(err && strstr(err, path) && strstr(err, "deleted or replaced") &&
              strstr(err, "recreate the agent"));
        free(err);
        CHECK(turns_of(s, "c") == (int)n); /* reads go on */
    } else {
        usleep(2500 * 1000); /* the checkpointer looks every second */
    }
    CHECK(was_logged("were copied into the file"));
    fflush(stderr);
    _exit(check_failed > failed_before_fork); /* (its own failures only) */
}

static void test_wal_deleted_then_crash(int append_after)
{
    char *path = fresh_path();
    logged[0] = '\0';
    failed_before_fork = check_failed;
    pid_t pid = fork();
    if (pid == 0)
        wal_deleted_child(path, 20, append_after);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    store *s = open_ok(path);
    CHECK(turns_of(s, "c") == 20); /* every acknowledged turn: before the fix, none */
    put_ok(s, "c", 21);            /* a recreated agent writes again */
    B->close(s);
    free(path);
}

/* A damaged WAL: the corruption error a read meets stops writes, and the
 * file is never checkpointed from it, not even at close. */
static void test_damaged_wal_not_checkpointed(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    store *s = open_ok(path);
    for (unsigned i = 1; i <= 30; i++)
        put_ok(s, "c", i);
    size_t db_len = 0, wal_len = 0;
    char *db_before = read_file(path, &db_len);
    char *wal = pstr_printf("%s-wal", path);
    char *wal_bytes = read_file(wal, &wal_len);
    CHECK(db_before && wal_bytes && wal_len > 4096);
    if (wal_bytes && wal_len > 32) { /* every frame's page, past the WAL header */
        memset(wal_bytes + 32, 0x5a, wal_len - 32);
        FILE *f = fopen(wal, "r+b"); /* in place: the open file is the same one */
        CHECK(f && fwrite(wal_bytes, 1, wal_len, f) == wal_len);
        if (f)
            fclose(f);
    }
    char *err = NULL;
    pbuf b = PBUF_INIT;
    CHECK(B->list(s, 5000, &b, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, path));
    free(err);
    err = NULL;
    pbuf_free(&b);
    CHECK(put(s, "c", 31, &err) == PARLEY_ERR_STORAGE);
    CHECK(err && strstr(err, "damaged") && strstr(err, "writes are stopped"));
    free(err);
    CHECK(was_logged("damaged"));
    B->close(s);
    size_t after_len = 0;
    char *db_after = read_file(path, &after_len);
    CHECK(db_before && db_after && after_len == db_len &&
          memcmp(db_before, db_after, db_len) == 0); /* before the fix: the WAL copied in */
    CHECK(exists(path, "-wal"));                     /* kept as found */
    free(db_before);
    free(db_after);
    free(wal_bytes);
    free(wal);
    free(path);
}

/* A frame of the WAL damaged and nothing read since: the close, which would
 * copy it into the file, finds the WAL's checksums wrong and does not. */
static void test_damaged_wal_found_at_close(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    store *s = open_ok(path);
    for (unsigned i = 1; i <= 30; i++)
        put_ok(s, "c", i);
    size_t db_len = 0;
    char *db_before = read_file(path, &db_len);
    char *wal = pstr_printf("%s-wal", path);
    struct stat st;
    CHECK(stat(wal, &st) == 0 && st.st_size > 32 + 3 * (24 + 4096));
    FILE *f = fopen(wal, "r+b"); /* the page of the third frame, its header left alone */
    CHECK(f && fseek(f, 32 + 2 * (24 + 4096) + 24 + 100, SEEK_SET) == 0 &&
          fwrite("garbage!", 1, 8, f) == 8);
    if (f)
        fclose(f);
    B->close(s);
    CHECK(was_logged("damaged (its WAL fails its checksums)"));
    size_t after_len = 0;
    char *db_after = read_file(path, &after_len);
    CHECK(db_before && db_after && after_len == db_len &&
          memcmp(db_before, db_after, db_len) == 0); /* before the fix: the frame copied in */
    /* The next open's recovery keeps the frames before the damage: a consistent store. */
    s = open_ok(path);
    int kept = turns_of(s, "c");
    CHECK(kept >= 0 && kept < 30);
    put_ok(s, "c", 100);
    CHECK(turns_of(s, "c") == kept + 1);
    B->close(s);
    CHECK(integrity_ok(path));
    free(db_before);
    free(db_after);
    free(wal);
    free(path);
}

/* A clean close after the WAL went round several generations is not taken for damage. */
static void test_clean_close_not_damage(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    store *s = open_ok(path);
    char big[3001];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char *json = pstr_printf("{\"role\":\"user\",\"content\":\"%s\"}", big);
    for (unsigned n = 1; n <= 3000; n++) {
        char tid[37], mid[37];
        snprintf(tid, sizeof tid, "%08x-0000-4000-8000-%012x", n, n);
        snprintf(mid, sizeof mid, "%08x-1111-4000-8000-%012x", n, 0u);
        store_message m = {mid, "user", n, json, strlen(json), NULL, NULL, 0};
        store_turn turn = {tid, n, n, &m, 1, NULL, 0, 0};
        store_key key = {n % 7 ? "a" : "b", "", ""};
        char *err = NULL;
        CHECK(B->append(s, &key, &turn, n, &err) == PARLEY_OK);
        free(err);
    }
    B->close(s);
    CHECK(!was_logged("damaged"));
    CHECK(!exists(path, "-wal"));
    s = open_ok(path);
    store_stats st;
    char *err = NULL;
    CHECK(B->stats(s, &st, &err) == PARLEY_OK && st.turns == 3000);
    CHECK(query_int(path, "SELECT count(*) FROM messages") == 3000);
    B->close(s);
    free(json);
    free(path);
}

/* After a crash the WAL may end in a torn frame (its header written, not its
 * page) that SQLite's recovery leaves out: not damage, and the close copies
 * the WAL in and removes it as usual. */
static void test_torn_frame_after_crash_not_damage(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    failed_before_fork = check_failed;
    pid_t pid = fork();
    if (pid == 0) {
        store *s = open_ok(path);
        for (unsigned i = 1; i <= 10; i++)
            put_ok(s, "c", i);
        _exit(check_failed > failed_before_fork); /* a crash: the WAL stays */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *wal = pstr_printf("%s-wal", path);
    size_t len = 0;
    char *bytes = read_file(wal, &len);
    CHECK(bytes && len >= 32 + 24 + 4096);
    if (bytes && len >= 32) { /* one more frame: this generation's salts, no valid checksum */
        unsigned char torn[24 + 4096] = {0, 0, 0, 2};
        memcpy(torn + 8, bytes + 16, 8);
        FILE *f = fopen(wal, "ab");
        CHECK(f && fwrite(torn, 1, sizeof torn, f) == sizeof torn);
        if (f)
            fclose(f);
    }
    store *s = open_ok(path);
    CHECK(turns_of(s, "c") == 10);
    B->close(s);
    CHECK(!was_logged("damaged"));
    CHECK(!exists(path, "-wal"));
    free(bytes);
    free(wal);
    free(path);
}

/* ---- item 11: two agents on one file (its PATH-lock deleted) ---- */

static void test_two_writers_keep_totals(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    store *a = open_ok(path);
    char *lock = pstr_printf("%s-lock", path);
    CHECK(unlink(lock) == 0);
    store *b = open_ok(path); /* nothing can tell it another agent has the file */
    for (unsigned i = 1; i <= 30; i++) {
        put_ok(a, "a", i);
        put_ok(b, "b", 100 + i);
    }
    store_stats st;
    char *err = NULL;
    CHECK(B->stats(b, &st, &err) == PARLEY_OK);
    CHECK(st.conversations == 2 && st.turns == 60);
    usleep(2500 * 1000); /* a's checkpointer finds b holding the new PATH-lock */
    CHECK(was_logged("another agent has opened the file since"));
    B->close(a);
    B->close(b);
    CHECK(query_int(path, "SELECT conversations FROM store_meta") == 2);
    CHECK(query_int(path, "SELECT turns FROM store_meta") == 60);
    CHECK(query_int(path, "SELECT count(*) FROM turns") == 60);
    store *s = open_ok(path);
    CHECK(B->stats(s, &st, &err) == PARLEY_OK);
    CHECK(st.conversations == 2 && st.turns == 60);
    CHECK(turns_of(s, "a") == 30 && turns_of(s, "b") == 30);
    B->close(s);
    free(lock);
    free(path);
}

/* PATH-lock deleted while nobody else has the file: made again within a
 * second, so the next agent is refused again. */
static void test_lock_file_made_again(void)
{
    char *path = fresh_path();
    logged[0] = '\0';
    store *a = open_ok(path);
    char *lock = pstr_printf("%s-lock", path);
    CHECK(unlink(lock) == 0);
    usleep(2500 * 1000);
    CHECK(exists(path, "-lock"));
    CHECK(was_logged("was deleted while the agent ran; made again and locked"));
    check_refused(path, (const char *const[]){"in use by another agent", NULL});
    B->close(a);
    free(lock);
    free(path);
}

/* ---- item 12: a refused file keeps no -wal or -shm ---- */

static void test_refusals_leave_nothing(void)
{
    /* A store cut short: its header is fine, the pages it names are gone. */
    char *cut = fresh_path();
    store *s = open_ok(cut);
    for (unsigned i = 1; i <= 50; i++)
        put_ok(s, "c", i);
    B->close(s);
    CHECK(!exists(cut, "-wal") && !exists(cut, "-shm"));
    CHECK(truncate(cut, 4096) == 0);
    check_refused(cut, (const char *const[]){cut, "corrupt", NULL});
    free(cut);

    /* A WAL-mode file that claims to be a store and has none of its tables. */
    char *hollow = fresh_path();
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(hollow, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db,
                       "PRAGMA journal_mode = WAL; PRAGMA application_id = 1349676153;"
                       " PRAGMA user_version = 2; CREATE TABLE other(x);",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    check_refused(hollow, (const char *const[]){hollow, "tables missing", NULL});
    free(hollow);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_fifo_refused_at_once();
    test_symlink_named();
    test_wal_deleted_then_crash(1);
    test_wal_deleted_then_crash(0);
    test_damaged_wal_not_checkpointed();
    test_damaged_wal_found_at_close();
    test_clean_close_not_damage();
    test_torn_frame_after_crash_not_damage();
    test_two_writers_keep_totals();
    test_lock_file_made_again();
    test_refusals_leave_nothing();
    char *cleanup = pstr_printf("rm -rf '%s'", tmpdir);
    if (system(cleanup) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cleanup);
    return check_report();
}
