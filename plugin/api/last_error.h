/*
 * last_error.h -- the words behind a status a history function returned.
 *
 * Most of the table's history functions return a status and nothing else on
 * failure (history_clear, history_clear_by, set_interface_message_id), or an
 * out_json only for some statuses; the reason went to the host's log, where
 * a host answering a user cannot pick it up.  Each such failure also leaves
 * its message here, per calling thread, and parley_plugin.last_error hands
 * it to the host right after the call (errno's pattern: nothing to free on
 * the failing call's path, nothing shared between threads).
 */
#ifndef PARLEY_LAST_ERROR_H
#define PARLEY_LAST_ERROR_H

/* Forget the calling thread's message: a function that may set one starts so. */
void last_error_clear(void);

/* The calling thread's message is now this (cut to 1 KiB at a character). */
void last_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The ABI function: a malloc'd copy of the calling thread's message, NULL if none. */
char *last_error_copy(void);

#endif
