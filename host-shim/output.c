/*
 * output.c -- everything parley-host writes: stdout lines under one lock,
 * diagnostics and plugin log messages on stderr, and the small JSON helpers
 * that turn plugin strings into output values.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "utf8_repair.h"

/* Callbacks arrive on the plugin's worker thread (and on the thread calling
 * destroy) while the main thread prints command output: one lock for stdout. */
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static int at_line_start = 1; /* the last byte written was '\n' (or nothing yet) */
static int status_shown;      /* a transient status is on the current line */

/* Under out_mu: erase the status line before real output takes its place. */
static void clear_status_locked(void)
{
    if (status_shown) {
        fputs("\r\033[K", stdout);
        status_shown = 0;
    }
}

/* Memory ran out while this thread built its current output line (a value in
 * it became null or went missing); out_json_line clears it. */
static _Thread_local int line_short;

void jset(json_t *object, const char *key, json_t *value)
{
    if (json_object_set_new(object, key, value) != 0)
        line_short = 1;
}

/* json_dump_callback's writer into a growing string; a failed write sticks. */
struct dump_buf {
    char *s;
    size_t len, cap;
    int failed;
};

static int dump_put(const char *text, size_t n, void *data)
{
    struct dump_buf *b = data;
    if (!b->failed && b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (p) {
            b->s = p;
            b->cap = cap;
        } else {
            b->failed = 1;
        }
    }
    if (b->failed)
        return -1;
    memcpy(b->s + b->len, text, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

/* json_dumps, or NULL when any write failed: jansson 2.14's json_dumps ignores a failed
 * write of an object's key and returns the line without it. */
static char *dumps_whole(const json_t *value)
{
    struct dump_buf b = {NULL, 0, 0, 0};
    if (json_dump_callback(value, dump_put, &b, SHIM_JSON_COMPACT) != 0 || b.failed || !b.s) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

void out_json_line(json_t *value, unsigned long seq, const char *op)
{
    /* Only on OOM: every string we build is valid UTF-8. */
    char *s = line_short ? NULL : dumps_whole(value);
    line_short = 0;
    if (!s) {
        pthread_mutex_lock(&out_mu);
        if (op)
            fprintf(stdout, "{\"seq\":%lu,\"op\":\"%s\",\"result\":null,\"error\":", seq, op);
        else
            fprintf(stdout, "{\"seq\":%lu,\"error\":", seq);
        fputs("{\"code\":\"no_memory\",\"message\":\"parley-host: out of memory writing this "
              "answer\"}}\n",
              stdout);
        fflush(stdout);
        pthread_mutex_unlock(&out_mu);
        return;
    }
    size_t n = strlen(s);
    /* Reuse the terminating NUL's slot for the newline: one fwrite per line. */
    s[n] = '\n';
    pthread_mutex_lock(&out_mu);
    fwrite(s, 1, n + 1, stdout);
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    free(s);
}

void out_text(const char *s, size_t len)
{
    pthread_mutex_lock(&out_mu);
    clear_status_locked();
    fwrite(s, 1, len, stdout);
    if (len)
        at_line_start = s[len - 1] == '\n';
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
}

void out_status(const char *text)
{
    pthread_mutex_lock(&out_mu);
    if (at_line_start) { /* never on a line that streamed text is still filling */
        clear_status_locked();
        if (text && *text) {
            fputs(text, stdout);
            status_shown = 1;
        }
        fflush(stdout);
    }
    pthread_mutex_unlock(&out_mu);
}

void out_end_line(void)
{
    pthread_mutex_lock(&out_mu);
    clear_status_locked();
    if (!at_line_start) {
        fputc('\n', stdout);
        at_line_start = 1;
    }
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
}

void out_input_echoed(void)
{
    pthread_mutex_lock(&out_mu);
    at_line_start = 1;
    pthread_mutex_unlock(&out_mu);
}

int out_at_line_start(void)
{
    pthread_mutex_lock(&out_mu);
    int r = at_line_start;
    pthread_mutex_unlock(&out_mu);
    return r;
}

void out_printf(const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    out_text(s, (size_t)n);
    free(s);
}

const char *log_level_name(parley_log_level level)
{
    switch (level) {
    case PARLEY_LOG_ERROR:
        return "error";
    case PARLEY_LOG_WARN:
        return "warn";
    case PARLEY_LOG_INFO:
        return "info";
    case PARLEY_LOG_DEBUG:
        return "debug";
    }
    return "?";
}

/* stderr is unbuffered: format first and write once, so messages from
 * several threads do not interleave mid-line. */
static void err_line(const char *prefix, const char *fmt, va_list ap)
{
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        return;
    fprintf(stderr, "%s%s\n", prefix, msg);
    free(msg);
}

void diag(parley_log_level level, const char *fmt, ...)
{
    if (level != PARLEY_LOG_ERROR && level > g_shim.log_level)
        return;
    char prefix[32];
    if (level == PARLEY_LOG_ERROR)
        snprintf(prefix, sizeof prefix, "parley-host: ");
    else
        snprintf(prefix, sizeof prefix, "parley-host[%s]: ", log_level_name(level));
    va_list ap;
    va_start(ap, fmt);
    err_line(prefix, fmt, ap);
    va_end(ap);
}

void host_log(void *host_data, parley_log_level level, const char *message)
{
    const struct shim *s = host_data;
    if ((int)level > (int)s->log_level)
        return;
    fprintf(stderr, "parley[%s]: %s\n", log_level_name(level), message ? message : "");
}

json_t *jstrn(const char *s, size_t len)
{
    if (!s)
        return json_null();
    json_t *j = json_stringn(s, len);
    if (j)
        return j;
    /* Invalid UTF-8: replace each bad byte with U+FFFD. */
    size_t o = 0;
    char *fixed = utf8_repaired(s, len, &o);
    j = fixed ? json_stringn(fixed, o) : NULL;
    free(fixed);
    if (j)
        return j;
    line_short = 1; /* out of memory: the line must not say null for the text */
    return json_null();
}

json_t *jstr(const char *s) { return s ? jstrn(s, strlen(s)) : json_null(); }

json_t *jparse_plugin(const char *text, json_t *if_null, const char *what)
{
    if (!text)
        return if_null;
    json_decref(if_null);
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (v)
        return v;
    /* Out of memory: jansson's error code, or no error set at all (its lexer's first
     * allocation failed; the code byte is then never written). */
    if (e.text[0] == '\0' || json_error_code(&e) == json_error_out_of_memory) {
        line_short = 1;
        return json_null();
    }
    diag(PARLEY_LOG_WARN, "%s from the plugin is not valid JSON (%s); passing it on as a string",
         what, e.text);
    return jstr(text);
}

const char *json_error_reason(const json_error_t *e)
{
    switch (json_error_code(e)) {
    case json_error_out_of_memory:
        return "out of memory";
    case json_error_stack_overflow:
        return "nested too deeply";
    case json_error_invalid_utf8:
        return "not valid UTF-8";
    case json_error_premature_end_of_input:
        return "the text ends too early";
    case json_error_end_of_input_expected:
        return "unexpected text after the JSON value";
    case json_error_null_character:
        return "a \\u0000 escape in a string";
    case json_error_null_byte_in_key:
        return "a NUL byte in a key";
    case json_error_numeric_overflow:
        return "a number too large";
    case json_error_duplicate_key:
        return "a key given more than once";
    default:
        return "invalid syntax";
    }
}

const char *status_str(parley_status status)
{
    const char *n = g_shim.pl ? g_shim.pl->status_name(status) : NULL;
    return n ? n : "unknown";
}

json_t *jerror_code(const char *code, const char *message)
{
    json_t *e = json_object();
    jset(e, "code", jstr(code));
    jset(e, "message", jstr(message ? message : code));
    return e;
}

json_t *jerror(parley_status status, const char *message)
{
    return jerror_code(status_str(status), message);
}

void plugin_free(char *s)
{
    if (s)
        g_shim.pl->free_string(s);
}
