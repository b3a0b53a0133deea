/*
 * shim.h -- internals shared by the parley-host modules.
 *
 * parley-host is a small host for parley.so: it loads the plugin, offers
 * tools, and drives conversations from a terminal (interactive.c) or from
 * JSON lines (jsonl.c).  Its stdout formats are a contract for the tests, so
 * every byte written there goes through output.c.
 */
#ifndef PARLEY_HOST_SHIM_H
#define PARLEY_HOST_SHIM_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>

#include <jansson.h>

#include "parley/plugin.h"

/* Longest input line accepted (bytes, excluding "\n" or "\r\n"). */
#define SHIM_MAX_LINE (1024u * 1024u)

/* Dump flags for every JSON the shim prints: keys in insertion order. */
#define SHIM_JSON_COMPACT (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)
#define SHIM_JSON_PRETTY  (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)

/* Process-wide state.  One agent per process, so a global keeps every
 * callback signature simple; host_data still points here. */
struct shim {
    const parley_plugin *pl;
    parley_agent *agent;
    parley_log_level log_level;
    json_t *options; /* borrowed: the options given to create() (for /options, the banner) */

    /* mu/cv guard the runners' turn bookkeeping and are also broadcast by
     * the signal thread, so every wait in the shim wakes up on SIGINT. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int interrupted; /* signal number that asked us to stop, or 0 */
    /* Interactive mode: Ctrl-C while a turn is in flight cancels that turn
     * (the signal thread sets cancel_requested and broadcasts cv) instead of
     * quitting; a second Ctrl-C before it ended quits. */
    atomic_int turn_in_flight;
    atomic_int cancel_requested;
    int wake_fd; /* read end of a pipe that becomes readable on a signal */
};

extern struct shim g_shim;

/* ---- output.c ---------------------------------------------------------- */

/* Write one JSON value as one compact line: single fwrite + fflush under the
 * output lock, so lines from different threads never interleave.  The answer
 * to input line seq (an op's when op is non-NULL): should memory have run out
 * while it was built (a helper below or jset flagged it on this thread) or
 * serialized, a fixed no_memory line for seq takes its place, written without
 * allocating, so no line goes unanswered and none is answered with a part. */
void out_json_line(json_t *value, unsigned long seq, const char *op);
/* json_object_set_new, flagging the line being built when it fails (a NULL
 * value: out of memory; value is stolen either way). */
void jset(json_t *object, const char *key, json_t *value);
/* Text to stdout under the same lock (interactive mode). */
void out_text(const char *s, size_t len);
void out_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Interactive mode on a terminal: a transient status ("thinking… 3s") on the
 * current line, shown only at the start of a line and erased ("\r", clear to
 * end of line) before any other output.  NULL or "" erases it. */
void out_status(const char *text);
/* Finish a partly written line (streamed text) with '\n'; erases any status. */
void out_end_line(void);
/* The terminal echoed a line the user typed (and its newline) after our
 * prompt: the cursor is at the start of a line again. */
void out_input_echoed(void);
/* Nonzero when the last byte written to stdout was '\n' (or none yet). */
int out_at_line_start(void);
/* Diagnostics of the shim itself: "parley-host: ..." on stderr.  Errors are
 * always printed; lower levels only up to --log-level. */
void diag(parley_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* parley_host.log: "parley[level]: message" on stderr, filtered by level. */
void host_log(void *host_data, parley_log_level level, const char *message);
const char *log_level_name(parley_log_level level);

/* A JSON string from plugin text: NULL -> null; invalid UTF-8 is repaired
 * (U+FFFD) rather than dropped, so a line is never lost. */
json_t *jstr(const char *s);
json_t *jstrn(const char *s, size_t len);
/* Parse JSON text the plugin returned.  NULL -> `if_null` (stolen);
 * unparsable -> the raw text as a JSON string, with a warning naming `what`. */
json_t *jparse_plugin(const char *text, json_t *if_null, const char *what);
/* Why jansson could not parse, in words, WITHOUT its "near '...'" quote of
 * the text: in an options file that quote can be the API key itself. */
const char *json_error_reason(const json_error_t *e);
/* {"code": status_name, "message": message or status_name}. */
json_t *jerror(parley_status status, const char *message);
json_t *jerror_code(const char *code, const char *message);
const char *status_str(parley_status status);
/* Free a string the plugin returned (free_string, never free()). */
void plugin_free(char *s);

/* ---- input.c ----------------------------------------------------------- */

/* Line reader over a file descriptor that also watches g_shim.wake_fd, so a
 * blocked read ends on SIGINT.  Lines longer than SHIM_MAX_LINE are
 * consumed whole and reported as too long. */
struct line_reader {
    int fd;
    char *rbuf; /* raw read buffer */
    size_t rpos, rlen;
    char *line; /* current line, NUL-terminated, without "\n" / "\r\n" */
    size_t len, cap;
    int too_long;
    int eof;
};

enum lr_status { LR_LINE = 1, LR_EOF = 0, LR_INTERRUPTED = -1 };

int lr_init(struct line_reader *lr, int fd);
void lr_free(struct line_reader *lr);
/* Next line in lr->line / lr->len (lr->too_long set when it was cut). */
enum lr_status lr_next(struct line_reader *lr);
/* Sleep up to ms; returns 0, or -1 when interrupted by a signal. */
int shim_sleep_ms(long ms);
/* Nonzero once SIGINT/SIGTERM arrived. */
int shim_interrupted(void);

/* ---- tools.c ----------------------------------------------------------- */

/* Load the tools the host offers: a tools file, or "demo". */
int tools_load(const char *spec, char **err);
/* Append the declarations to options["tools"] (created if absent). */
int tools_declare(json_t *options, char **err);
/* Start the thread that completes delayed / from_thread calls. */
int tools_start(char **err);
/* parley_host.tool_call */
void tools_on_call(void *host_data, parley_tool_call *call, const parley_tool_call_info *info);
/* After destroy(): complete every handle still held (delayed or "never"),
 * stop the completer thread, free everything. */
void tools_shutdown(void);

/* ---- live_options.c ---------------------------------------------------- */

/* update_options with `next` (a whole options object, stolen) plus the
 * --tools declarations; on success it becomes g_shim.options.  Else the
 * status, and *msg (malloc'd, may be NULL) says why. */
parley_status live_options_apply(json_t *next, char **msg);
/* At exit: drop the options object made current by live_options_apply. */
void live_options_free(void);

/* ---- runners ----------------------------------------------------------- */

int run_jsonl(unsigned long concurrency);
int run_interactive(void);
/* Interactive mode prints tool steps as they happen (tools.c calls these on
 * the threads that run and complete the tools); no-ops in JSONL mode. */
void interactive_tool_started(const parley_tool_call_info *info);
void interactive_tool_finished(const char *call_id, const char *result, int is_error);
/* After destroy(): the done callback of a cancelled turn may still have
 * updated interactive state until then. */
void interactive_free(void);

#endif
