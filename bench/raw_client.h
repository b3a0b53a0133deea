/*
 * raw_client.h -- "the limit": the least a client can do to keep N HTTP/1.1
 * POSTs in flight against the fake LLM server.  Bench-only code (linked into
 * parley-bench, never into parley.so).
 *
 * One thread, one epoll set, one non-blocking keep-alive socket per
 * connection.  Each request is prebuilt once (request line and headers as
 * libcurl sends them, then the body), so a turn costs one write() and, when
 * the reply fits the shared read buffer, one read().  Replies are parsed just
 * enough to know where they end: the status code, Content-Length, chunked
 * transfer coding (which is how SSE streams arrive) or the end of the
 * connection.  Reply bytes are counted, not kept.  No per-request allocation.
 *
 * Usage (one thread):
 *     struct raw_client *c = raw_client_new(&cfg, err, sizeof err);
 *     raw_client_run(c, requests_per_connection, latencies, &stats);  (again and again)
 *     raw_client_free(c);
 */
#ifndef PARLEY_BENCH_RAW_CLIENT_H
#define PARLEY_BENCH_RAW_CLIENT_H

#include <stddef.h>

struct raw_config {
    int port;                  /* of 127.0.0.1 */
    const char *path;          /* request target, e.g. "/v1/chat/completions" */
    const char *content_type;  /* the Content-Type header's value */
    const char *const *bodies; /* request j of a connection sends bodies[j % n_bodies] */
    const size_t *body_lens;
    int n_bodies;
    int connections;           /* requests in flight at once, one connection each */
    double timeout_s;          /* a run gives up on what is unfinished after this */
};

struct raw_stats {
    long completed;      /* requests that got a whole reply (any status) or failed */
    long failures;       /* no whole reply, or a status other than 200 */
    long connects;       /* connections opened (1 per connection unless the server closed) */
    long peak_in_flight;
    double reply_bytes;  /* body bytes received, all requests */
    char error[200];     /* the first failure, if any */
};

struct raw_client;

/* NULL on failure, with a reason in err. */
struct raw_client *raw_client_new(const struct raw_config *cfg, char *err, size_t errlen);

/* Every connection sends requests_per_connection requests, one after the other
 * (closed loop), all connections at once.  latencies, when not NULL, receives
 * connections * requests_per_connection seconds (index connection *
 * requests_per_connection + request; failed requests included).  Connections
 * stay open for the next run.  Returns 0 when every request was completed or
 * failed before the timeout, -1 otherwise (the unfinished ones are counted as
 * failures and their connections closed). */
int raw_client_run(struct raw_client *c, int requests_per_connection, double *latencies,
                   struct raw_stats *stats);

void raw_client_free(struct raw_client *c);

#endif
