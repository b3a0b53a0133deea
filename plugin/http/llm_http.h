/*
 * llm_http.h -- one HTTP attempt against the LLM server, on the worker's
 * curl multi handle, and what its outcome means for the turn.
 *
 * The body of a 2xx answer goes to a sink (the SSE decoder when streaming)
 * or is buffered; anything else is buffered for its error text.  Every body
 * is bounded by max_response_bytes: a larger one is cut off, not buffered.
 *
 * Calls go through a pool that keeps at most max_connections transfers on its
 * multi handles (so at most that many sockets); the others wait, in order, and
 * no curl timeout runs while they wait: the turn's own deadline bounds them.
 *
 * The pool is driven by the worker's epoll loop (curl_multi_socket_action):
 * it registers curl's sockets in the worker's epoll set, the worker hands
 * their events back (http_pool_on_socket) and runs curl's timers when due.
 * Many connections are spread over several multi handles ("shards"), because
 * libcurl scans a multi handle's whole connection cache when a transfer
 * starts and ends: with one handle, that work grows with the square of the
 * connections.  Up to HTTP_SHARD_CONNECTIONS there is one shard.
 */
#ifndef PARLEY_LLM_HTTP_H
#define PARLEY_LLM_HTTP_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/plugin_status.h"

typedef struct http_config {
    const char *url;               /* <base_url> + the provider's path */
    CURLU *parsed_url;             /* url parsed once (CURLOPT_CURLU: libcurl reads it on the
                                      worker, at each transfer's start and resend, while the
                                      turn holds the snapshot), or NULL: libcurl parses url
                                      per transfer */
    const char *display_url;       /* the same without credentials, query or fragment: for messages */
    struct curl_slist *headers;    /* Content-Type, Accept, the provider's own */
    long connect_timeout_ms;
    long request_timeout_ms;
    int verify_tls;
    size_t max_response_bytes;
    uint64_t generation;           /* http_config_generation(): a spare easy handle configured
                                      for this number is configured for this config */
} http_config;

/* A number no other http_config has had in this process (never 0): a freed
 * config's address may come back for another, its generation does not. */
uint64_t http_config_generation(void);

/* url parsed as libcurl parses CURLOPT_URL on every transfer, for
 * http_config.parsed_url; NULL when it cannot be (then libcurl parses it per
 * transfer and reports what is wrong with it, as before).  curl_url_cleanup()
 * frees it. */
CURLU *http_parse_url(const char *url);

/*
 * Receives the body of a 2xx answer; returns 0 for more, HTTP_SINK_COMPLETE
 * when the answer is whole (`complete` is set; anything the server sends
 * after it is dropped unseen, and the owner may end the call without waiting
 * for the body's end), or -1 to abort the transfer as a failure.
 */
typedef int (*http_sink_fn)(void *owner, const char *data, size_t len);
#define HTTP_SINK_COMPLETE 1

typedef struct http_call http_call;

/* Connections per multi handle, at most (see above). */
#define HTTP_SHARD_CONNECTIONS 256

/* One multi handle and its share of the connection cap. */
typedef struct http_shard {
    CURLM *multi;
    struct http_pool *pool;
    uint32_t index;          /* in pool->shards: tags its sockets' epoll events */
    size_t active;           /* calls on this multi handle */
    size_t cap;              /* its connections (the caps add up to max_connections) */
    uint64_t timer_due_ms;   /* when curl wants CURL_SOCKET_TIMEOUT; UINT64_MAX: never */
} http_shard;

/*
 * What the pool knows of one descriptor number (pool->fds is indexed by it).
 * A connection socket that libcurl opened through the pool stays in the
 * epoll set while its connection idles in libcurl's cache: a request on a
 * kept-alive connection then costs no epoll_ctl at all (it cost two: an add
 * and a delete).  It leaves the set just before libcurl closes it, or when it
 * wakes the worker while idle (the server closed it, or sent unasked).
 */
typedef struct http_fd {
    uint32_t gen;          /* bumped on every add: tags its events, so stale ones are dropped */
    uint32_t shard;        /* the shard whose transfer waits on it, while `wanted` */
    uint8_t opened;        /* opened by libcurl through the pool (its close is seen) */
    uint8_t registered;    /* in the epoll set, for `events` */
    uint8_t wanted;        /* a transfer waits on it (else it idles in the cache) */
    uint8_t events;        /* EPOLLIN / EPOLLOUT it is registered for */
} http_fd;

/* What http_pool_take_done hands back: a finished transfer and its code. */
typedef struct http_done {
    http_call *call;
    CURLcode result;
} http_done;

/* The worker's transfers: at most max_active on the multi handles at once. */
typedef struct http_pool {
    int epoll_fd;            /* the worker's: curl's sockets go there */
    http_shard *shards;
    size_t nshards;
    size_t active;           /* calls on a multi handle, all shards */
    size_t max_active;       /* the max_connections option */
    http_call *wait_head;    /* calls waiting for a connection, oldest first */
    http_call *wait_tail;
    http_call *spare;        /* freed calls kept with their easy handle, for reuse */
    size_t nspare;
    http_done *done;         /* finished transfers, read before any is acted on */
    size_t done_cap;
    http_fd *fds;            /* by descriptor number, nfds of them */
    size_t nfds;
} http_pool;

/* The tag of an epoll event that is not a curl socket's (the worker's own). */
#define HTTP_POOL_NOT_MINE UINT64_MAX

/* The URL as messages may show it (malloc'd; NULL on OOM or an unparsable
 * URL): without user:password@, login options, query or fragment, any of
 * which may hold a secret. */
char *http_display_url(const char *url);

/* Create the multi handles, capped at max_connections in all, registering
 * their sockets in epoll_fd (borrowed; outlives the pool); 0 or -1. */
int http_pool_init(http_pool *p, size_t max_connections, int epoll_fd);
void http_pool_cleanup(http_pool *p); /* every call must be freed first */

/* An epoll event whose data.u64 is not HTTP_POOL_NOT_MINE: let curl act on it. */
void http_pool_on_socket(http_pool *p, uint64_t tag, uint32_t events);
/* Let curl act on its timeouts that are due (and start newly added transfers). */
void http_pool_run_timers(http_pool *p);
/* Milliseconds until curl next wants its timers run (0: now), -1: none pending. */
int64_t http_pool_next_timer_in(const http_pool *p, uint64_t now_ms);
/* The transfers that finished, read off every multi handle before the caller
 * acts on any (ending one removes its handle, which is O(unread) in libcurl).
 * The array is the pool's, valid until the next call; *n entries. */
http_done *http_pool_take_done(http_pool *p, size_t *n);

struct http_call {
    CURL *easy;
    http_pool *pool;
    http_shard *shard;       /* where it runs, once started */
    int started;             /* on the multi handle (else waiting for a connection) */
    uint64_t started_ms;     /* clock_mono_ms() when it got on the multi handle */
    http_call *wait_prev, *wait_next; /* in the pool's wait list (next: the spare list) */
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
    int sends;               /* times libcurl sent this request (it resends on a kept-alive
                                connection found closed) */
    int finished_ok;         /* its transfer ended with CURLE_OK (http_pool_take_done) */
    uint64_t configured;     /* the http_config generation `easy` is set up for, 0: none */
    char error[CURL_ERROR_SIZE];
};

/* Start a POST of body (borrowed until the call ends), now or once a
 * connection is free.  NULL on failure, with errno ENOMEM (out of memory,
 * libcurl's included) or EINVAL (libcurl refused the transfer). */
http_call *http_call_start(http_pool *pool, const http_config *cfg, const char *body, size_t len,
                           void *owner, http_sink_fn sink);

/* Take the call off its multi handle (or the wait list) and free it,
 * finished or not; a waiting call may then start.  Never from inside a curl
 * callback. */
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
