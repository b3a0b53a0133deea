/*
 * llm_http.h -- one HTTP attempt against the LLM server, on the worker's
 * curl multi handle, and what its outcome means for the turn.
 *
 * The body of a 2xx answer goes to a sink (the SSE decoder when streaming)
 * or is buffered; anything else is buffered for its error text.  Every body
 * is bounded by max_response_bytes: a larger one is cut off, not buffered.
 *
 * Calls go through a pool that keeps at most max_connections transfers on the
 * multi handle (so at most that many sockets); the others wait, in order, and
 * no curl timeout runs while they wait: the turn's own deadline bounds them.
 */
#ifndef PARLEY_LLM_HTTP_H
#define PARLEY_LLM_HTTP_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "plugin_status.h"

typedef struct http_config {
    const char *url;               /* <base_url> + the provider's path */
    const char *display_url;       /* the same without credentials, query or fragment: for messages */
    struct curl_slist *headers;    /* Content-Type, Accept, the provider's own */
    long connect_timeout_ms;
    long request_timeout_ms;
    int verify_tls;
    size_t max_response_bytes;
} http_config;

/*
 * Receives the body of a 2xx answer; returns 0 for more, HTTP_SINK_COMPLETE
 * when the answer is whole (`complete` is set; anything the server sends
 * after it is dropped unseen, and the owner may end the call without waiting
 * for the body's end), or -1 to abort the transfer as a failure.
 */
typedef int (*http_sink_fn)(void *owner, const char *data, size_t len);
#define HTTP_SINK_COMPLETE 1

typedef struct http_call http_call;

/* The worker's transfers: at most max_active on the multi handle at once. */
typedef struct http_pool {
    CURLM *multi;
    size_t active;           /* calls on the multi handle */
    size_t max_active;       /* the max_connections option */
    http_call *wait_head;    /* calls waiting for a connection, oldest first */
    http_call *wait_tail;
} http_pool;

/* The URL as messages may show it (malloc'd; NULL on OOM or an unparsable
 * URL): without user:password@, login options, query or fragment, any of
 * which may hold a secret. */
char *http_display_url(const char *url);

/* Create the multi handle, capped at max_connections; 0 or -1. */
int http_pool_init(http_pool *p, size_t max_connections);
void http_pool_cleanup(http_pool *p); /* every call must be freed first */

struct http_call {
    CURL *easy;
    http_pool *pool;
    int started;             /* on the multi handle (else waiting for a connection) */
    uint64_t started_ms;     /* clock_mono_ms() when it got on the multi handle */
    http_call *wait_prev, *wait_next; /* in the pool's wait list */
    void *owner;             /* the turn; CURLOPT_PRIVATE points at this struct */
    http_sink_fn sink;       /* NULL: buffer the body */
    pbuf body;               /* buffered body (error bodies always) */
    size_t received;         /* body bytes received, sunk or buffered */
    size_t max_bytes;
    long status;             /* HTTP status once headers arrived, else 0 */
    int64_t retry_after_ms;  /* from Retry-After; -1 when absent */
    int oversized;           /* the body passed max_bytes */
    int sink_failed;         /* the sink refused data */
    int complete;            /* the sink has the whole answer (the body may not have ended) */
    size_t header_bytes;     /* response header bytes seen (the response began) */
    int headers_done;        /* a final (non-1xx) header block ended */
    const char *display_url;
    char error[CURL_ERROR_SIZE];
};

/* Start a POST of body (borrowed until the call ends), now or once a
 * connection is free.  NULL on failure. */
http_call *http_call_start(http_pool *pool, const http_config *cfg, const char *body, size_t len,
                           void *owner, http_sink_fn sink);

/* The call's http_call from a finished easy handle (CURLMSG_DONE). */
http_call *http_call_of(CURL *easy);

/* Take the call off the multi handle (or the wait list) and free it,
 * finished or not; a waiting call may then start. */
void http_call_free(http_call *c);

/*
 * What a finished call means.  PARLEY_OK: a 2xx body is there to decode.
 * Otherwise *msg (malloc'd) explains and *retryable says whether trying again
 * may help (429, 500-599, or a connection failure before any response byte;
 * never a bad TLS certificate).  A status whose headers arrived is that
 * status, whether the body then came whole or not, streamed or not.  Its
 * body is left in c->body: the provider codec reads the server's error text
 * from it and has the last word on retrying -- this layer knows no server's
 * error shape.
 */
/* The answer's HTTP status, 0 when none arrived. */
long http_call_status(const http_call *c);

parley_status http_call_outcome(const http_call *c, CURLcode code, char **msg, int *retryable);

#endif
