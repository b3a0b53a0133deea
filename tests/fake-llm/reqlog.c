/* --log FILE: one JSON object per request, one per line.
 *
 * Flushed after every line because tests read the file while the server is
 * still running; a mutex keeps lines from different threads whole. */
#include "fakellm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *log_fp;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

bool reqlog_open(const char *path)
{
    log_fp = fopen(path, "a");
    return log_fp != NULL;
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string_lossy(s, strlen(s)) : json_null();
}

void reqlog_write(unsigned long seq, const char *method, const char *path, const char *auth,
                  const char *ctype, const json_t *body, const char *raw, size_t rawlen,
                  int status, const char *fault, int client_port,
                  const struct prompt_stats *ps)
{
    if (!log_fp)
        return;
    json_t *b;
    if (body)
        b = json_incref((json_t *)body); /* only this thread uses it */
    else if (raw && rawlen)
        b = json_string_lossy(raw, rawlen);
    else
        b = json_null();

    json_t *o = json_object();
    json_object_set_new(o, "seq", json_integer((json_int_t)seq));
    json_object_set_new(o, "method", str_or_null(method));
    json_object_set_new(o, "path", str_or_null(path));
    json_object_set_new(o, "authorization", str_or_null(auth));
    json_object_set_new(o, "content_type", str_or_null(ctype));
    json_object_set_new(o, "body", b ? b : json_null());
    json_object_set_new(o, "status", status < 0 ? json_null() : json_integer(status));
    json_object_set_new(o, "fault", str_or_null(fault));
    json_object_set_new(o, "client_port", client_port < 0 ? json_null() : json_integer(client_port));
    if (ps && ps->valid) { /* the prompt model's view of a chat request (prompt.c) */
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)ps->prompt_tokens));
        json_object_set_new(o, "cached_tokens", json_integer((json_int_t)ps->cached_tokens));
        json_object_set_new(o, "cache_creation_tokens",
                            json_integer((json_int_t)ps->cache_creation));
        json_object_set_new(o, "evaluated_tokens", json_integer((json_int_t)ps->evaluated));
        json_object_set_new(o, "slot", ps->slot < 0 ? json_null() : json_integer(ps->slot));
        json_object_set_new(o, "overflow", json_boolean(ps->overflow));
        json_object_set_new(o, "extends_previous",
                            ps->extends < 0 ? json_null() : json_boolean(ps->extends));
        json_object_set_new(o, "n_ctx", json_integer((json_int_t)ps->window));
        json_object_set_new(o, "truncated_messages",
                            json_integer((json_int_t)ps->dropped_messages));
        json_object_set_new(o, "sent_tokens", json_integer((json_int_t)ps->sent_tokens));
    }
    size_t len;
    char *line = json_dump_compact(o, &len);
    json_decref(o);

    pthread_mutex_lock(&log_mu);
    fwrite(line, 1, len, log_fp);
    fputc('\n', log_fp);
    fflush(log_fp);
    pthread_mutex_unlock(&log_mu);
    free(line);
}

void reqlog_close(void)
{
    if (log_fp)
        fclose(log_fp);
    log_fp = NULL;
}
