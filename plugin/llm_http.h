/*
 * llm_http.h -- one HTTP attempt against the LLM server, on the worker's
 * curl multi handle, and what its outcome means for the turn.
 *
 * The body of a 2xx answer goes to a sink (the SSE decoder when streaming)
 * or is buffered; anything else is buffered for its error text.  Every body
 * is bounded by max_response_bytes: a larger one is cut off, not buffered.
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
    struct curl_slist *headers;    /* Content-Type, Accept, the provider's own */
    long connect_timeout_ms;
    long request_timeout_ms;
    int verify_tls;
    size_t max_response_bytes;
} http_config;

/* Receives the body of a 2xx answer; returns 0, or -1 to abort the transfer. */
typedef int (*http_sink_fn)(void *owner, const char *data, size_t len);

typedef struct http_call {
    CURL *easy;
    CURLM *multi;
    void *owner;             /* the turn; CURLOPT_PRIVATE points at this struct */
    http_sink_fn sink;       /* NULL: buffer the body */
    pbuf body;               /* buffered body (error bodies always) */
    size_t received;         /* body bytes received, sunk or buffered */
    size_t max_bytes;
    long status;             /* HTTP status once headers arrived, else 0 */
    int64_t retry_after_ms;  /* from Retry-After; -1 when absent */
    int oversized;           /* the body passed max_bytes */
    int sink_failed;         /* the sink refused data */
    char error[CURL_ERROR_SIZE];
} http_call;

/* Start a POST of body (borrowed until the call ends).  NULL on failure. */
http_call *http_call_start(CURLM *multi, const http_config *cfg, const char *body, size_t len,
                           void *owner, http_sink_fn sink);

/* The call's http_call from a finished easy handle (CURLMSG_DONE). */
http_call *http_call_of(CURL *easy);

/* Take the call off the multi handle and free it (finished or not). */
void http_call_free(http_call *c);

/*
 * What a finished call means.  PARLEY_OK: a 2xx body is there to decode.
 * Otherwise *msg (malloc'd) explains and *retryable says whether trying again
 * may help (a connection failure before any response byte).  An HTTP error
 * status gives PARLEY_ERR_RATE_LIMITED (429) or PARLEY_ERR_HTTP_STATUS with
 * the body left in c->body: the provider codec reads the server's error text
 * from it and decides whether a retry may help -- this layer knows no
 * server's error shape.
 */
/* The answer's HTTP status, 0 when none arrived. */
long http_call_status(const http_call *c);

parley_status http_call_outcome(const http_call *c, CURLcode code, char **msg, int *retryable);

#endif
