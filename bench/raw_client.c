/*
 * raw_client.c -- the limit: a minimal epoll HTTP/1.1 client (see raw_client.h).
 *
 * A connection is a small state machine: connecting, sending its prebuilt
 * request, then reading the reply line by line (status line, headers, chunk
 * sizes) or in bulk (Content-Length bodies, chunk data), counting and
 * discarding.  When a reply ends the connection sends its next request at
 * once, from inside the same event: no queue, no timer, no allocation.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasestr, memalign */
#endif
#include "raw_client.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_BUFFER_SIZE (64 * 1024) /* shared by every connection: replies are not kept */
#define MAX_EVENTS 1024
#define LINE_MAX_KEPT 60 /* the start of each header line: enough for the headers we read */

enum conn_state {
    CS_IDLE,        /* between requests, or done with this run's requests */
    CS_CONNECTING,  /* non-blocking connect() under way */
    CS_SENDING,     /* request partly written */
    CS_STATUS,      /* reading the status line */
    CS_HEADERS,
    CS_BODY,        /* `remaining` Content-Length bytes to go */
    CS_CHUNK_SIZE,
    CS_CHUNK_DATA,  /* `remaining` bytes of this chunk to go */
    CS_CHUNK_END,   /* the CRLF after a chunk's data */
    CS_TRAILERS,    /* after the last chunk, up to the empty line */
    CS_UNTIL_CLOSE, /* no length given: the reply ends with the connection */
};

struct conn {
    int fd;                   /* -1: not connected */
    unsigned char state;      /* enum conn_state */
    unsigned char out_armed;  /* EPOLLOUT is in this socket's epoll interest */
    unsigned char chunked, close_after, line_len;
    int status;
    int sent;                 /* requests started in the current run */
    size_t out_off;           /* bytes of the current request written */
    long long remaining;
    long long content_length; /* -1: none */
    double start;
    char line[LINE_MAX_KEPT];
};

struct raw_client {
    struct raw_config cfg;
    struct sockaddr_in addr;
    int epfd;
    char **requests; /* prebuilt: request line, headers and body */
    size_t *request_lens;
    struct conn *conns;
    char *rbuf;
    struct epoll_event *events;
    /* the current run */
    int per_conn;
    double *lat;
    struct raw_stats *st;
    long started;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void note_error(struct raw_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(struct raw_client *c, const char *fmt, ...)
{
    if (c->st->error[0])
        return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->st->error, sizeof c->st->error, fmt, ap);
    va_end(ap);
}

static void conn_close(struct raw_client *c, struct conn *k)
{
    if (k->fd >= 0) {
        epoll_ctl(c->epfd, EPOLL_CTL_DEL, k->fd, NULL);
        close(k->fd);
    }
    k->fd = -1;
    k->out_armed = 0;
}

/* The current request of k ended: a whole reply (ok) or a failure (closes the connection). */
static void finish(struct raw_client *c, struct conn *k, int ok)
{
    size_t i = (size_t)(k - c->conns);
    if (c->lat)
        c->lat[i * (size_t)c->per_conn + (size_t)(k->sent - 1)] = now_s() - k->start;
    c->st->completed++;
    if (!ok || k->status != 200) {
        c->st->failures++;
        if (ok)
            note_error(c, "HTTP status %d", k->status);
    }
    if (!ok || k->close_after)
        conn_close(c, k);
    k->state = CS_IDLE;
}

static void fail(struct raw_client *c, struct conn *k, const char *what, int err)
{
    if (err)
        note_error(c, "%s: %s", what, strerror(err));
    else
        note_error(c, "%s", what);
    finish(c, k, 0);
}

static void set_out_interest(struct raw_client *c, struct conn *k, int want_out)
{
    if (k->out_armed == want_out)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0u),
                             .data.u32 = (uint32_t)(k - c->conns)};
    epoll_ctl(c->epfd, EPOLL_CTL_MOD, k->fd, &ev);
    k->out_armed = (unsigned char)want_out;
}

/* Write what is left of the request; once all of it is out, wait for the reply. */
static void send_some(struct raw_client *c, struct conn *k)
{
    int j = (k->sent - 1) % c->cfg.n_bodies;
    const char *req = c->requests[j];
    size_t len = c->request_lens[j];
    while (k->out_off < len) {
        ssize_t w = send(k->fd, req + k->out_off, len - k->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            k->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_out_interest(c, k, 1);
            return;
        } else {
            fail(c, k, "send", w < 0 ? errno : EPIPE);
            return;
        }
    }
    set_out_interest(c, k, 0);
    k->state = CS_STATUS;
    k->line_len = 0;
}

static int conn_open(struct raw_client *c, struct conn *k)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1; /* as libcurl does (CURLOPT_TCP_NODELAY defaults to 1) */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)&c->addr, sizeof c->addr) != 0 &&
        errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return -err;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)(k - c->conns)};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    k->fd = fd;
    k->out_armed = 1;
    c->st->connects++;
    return 0;
}

/* Start k's next request: connect if needed, else write it now. */
static void start_request(struct raw_client *c, struct conn *k)
{
    k->sent++;
    k->start = now_s();
    k->out_off = 0;
    k->status = 0;
    k->close_after = 0;
    long in_flight = ++c->started - c->st->completed;
    if (in_flight > c->st->peak_in_flight)
        c->st->peak_in_flight = in_flight;
    if (k->fd < 0) {
        int rc = conn_open(c, k);
        if (rc < 0)
            fail(c, k, "connect", -rc);
        else
            k->state = CS_CONNECTING;
        return;
    }
    k->state = CS_SENDING;
    send_some(c, k);
}

/* Keep k busy while it has requests left in this run (a failure finishes at once). */
static void advance(struct raw_client *c, struct conn *k)
{
    while (k->state == CS_IDLE && k->sent < c->per_conn)
        start_request(c, k);
}

/* One whole line of the reply head, a chunk size or a trailer; k->line holds its start. */
static void on_line(struct raw_client *c, struct conn *k)
{
    const char *l = k->line;
    switch (k->state) {
    case CS_STATUS:
        if (k->line_len < 12 || strncmp(l, "HTTP/1.", 7) != 0) {
            fail(c, k, "bad status line", 0);
            return;
        }
        k->status = atoi(l + 9);
        k->close_after = l[7] == '0'; /* HTTP/1.0 closes unless told otherwise */
        k->chunked = 0;
        k->content_length = -1;
        k->state = CS_HEADERS;
        return;
    case CS_HEADERS:
        if (k->line_len == 0) { /* end of the head */
            if (k->status / 100 == 1) {
                k->state = CS_STATUS; /* 100 Continue: the real status follows */
            } else if (k->chunked) {
                k->state = CS_CHUNK_SIZE;
            } else if (k->content_length > 0) {
                k->remaining = k->content_length;
                k->state = CS_BODY;
            } else if (k->content_length == 0) {
                finish(c, k, 1);
            } else {
                k->state = CS_UNTIL_CLOSE;
            }
        } else if (strncasecmp(l, "content-length:", 15) == 0) {
            k->content_length = strtoll(l + 15, NULL, 10);
        } else if (strncasecmp(l, "transfer-encoding:", 18) == 0) {
            k->chunked = strcasestr(l + 18, "chunked") != NULL;
        } else if (strncasecmp(l, "connection:", 11) == 0) {
            if (strcasestr(l + 11, "close"))
                k->close_after = 1;
            else if (strcasestr(l + 11, "keep-alive"))
                k->close_after = 0;
        }
        return;
    case CS_CHUNK_SIZE: {
        char *end;
        long long size = strtoll(l, &end, 16); /* extensions after ';' are ignored */
        if (end == l || size < 0) {
            fail(c, k, "bad chunk size line", 0);
        } else if (size == 0) {
            k->state = CS_TRAILERS;
        } else {
            k->remaining = size;
            k->state = CS_CHUNK_DATA;
        }
        return;
    }
    case CS_CHUNK_END:
        if (k->line_len != 0)
            fail(c, k, "chunk data longer than its size", 0);
        else
            k->state = CS_CHUNK_SIZE;
        return;
    case CS_TRAILERS:
        if (k->line_len == 0)
            finish(c, k, 1);
        return;
    default:
        return;
    }
}

/* Feed n received bytes to k's parser; returns how many were left over after
 * the reply ended (the server sent more than one reply: never expected). */
static size_t parse(struct raw_client *c, struct conn *k, const char *p, size_t n)
{
    while (n > 0) {
        switch (k->state) {
        case CS_BODY:
        case CS_CHUNK_DATA: {
            size_t take = (unsigned long long)k->remaining < n ? (size_t)k->remaining : n;
            c->st->reply_bytes += (double)take;
            k->remaining -= (long long)take;
            p += take;
            n -= take;
            if (k->remaining == 0) {
                if (k->state == CS_BODY) {
                    finish(c, k, 1);
                    return n;
                }
                k->state = CS_CHUNK_END;
                k->line_len = 0;
            }
            break;
        }
        case CS_UNTIL_CLOSE:
            c->st->reply_bytes += (double)n;
            return 0;
        case CS_STATUS:
        case CS_HEADERS:
        case CS_CHUNK_SIZE:
        case CS_CHUNK_END:
        case CS_TRAILERS: {
            const char *nl = memchr(p, '\n', n);
            size_t upto = nl ? (size_t)(nl - p) : n;
            size_t room = LINE_MAX_KEPT - 1 - k->line_len;
            size_t keep = upto < room ? upto : room;
            memcpy(k->line + k->line_len, p, keep);
            k->line_len = (unsigned char)(k->line_len + keep);
            if (!nl)
                return 0; /* the rest of the line comes with the next read */
            p += upto + 1;
            n -= upto + 1;
            if (k->line_len > 0 && k->line[k->line_len - 1] == '\r')
                k->line_len--;
            k->line[k->line_len] = '\0';
            on_line(c, k);
            k->line_len = 0;
            if (k->state == CS_IDLE)
                return n; /* the reply ended (or failed) */
            break;
        }
        default:
            return n; /* not waiting for a reply */
        }
    }
    return 0;
}

static void on_readable(struct raw_client *c, struct conn *k)
{
    for (;;) {
        ssize_t r = recv(k->fd, c->rbuf, READ_BUFFER_SIZE, 0);
        if (r > 0) {
            int waiting = k->state >= CS_STATUS;
            size_t left = waiting ? parse(c, k, c->rbuf, (size_t)r) : (size_t)r;
            if (left > 0) {
                /* bytes nobody asked for: drop the connection, not the request */
                note_error(c, "%zu unexpected bytes after a reply", left);
                conn_close(c, k);
                return;
            }
            if (k->state == CS_IDLE || (size_t)r < READ_BUFFER_SIZE)
                return; /* level-triggered: epoll reports what is still unread */
        } else if (r == 0) {
            if (k->state == CS_UNTIL_CLOSE) {
                k->close_after = 1;
                finish(c, k, 1);
            } else if (k->state >= CS_STATUS) {
                fail(c, k, "connection closed before the reply ended", 0);
            } else {
                conn_close(c, k); /* the server closed an idle connection */
            }
            return;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        } else {
            if (k->state >= CS_STATUS || k->state == CS_SENDING)
                fail(c, k, "recv", errno);
            else
                conn_close(c, k);
            return;
        }
    }
}

static void on_event(struct raw_client *c, struct conn *k, uint32_t events)
{
    if (k->fd < 0)
        return;
    if (k->state == CS_CONNECTING) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err) {
            fail(c, k, "connect", err);
            return;
        }
        k->state = CS_SENDING;
        send_some(c, k);
        return;
    }
    if (k->state == CS_SENDING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        send_some(c, k);
    if (k->fd >= 0 && k->state != CS_SENDING && k->state != CS_CONNECTING &&
        (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        on_readable(c, k);
}

int raw_client_run(struct raw_client *c, int requests_per_connection, double *latencies,
                   struct raw_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    c->per_conn = requests_per_connection;
    c->lat = latencies;
    c->st = stats;
    c->started = 0;
    int n = c->cfg.connections;
    long total = (long)n * requests_per_connection;
    for (int i = 0; i < n; i++) {
        c->conns[i].sent = 0;
        c->conns[i].state = CS_IDLE;
    }
    for (int i = 0; i < n; i++)
        advance(c, &c->conns[i]);
    double deadline = now_s() + c->cfg.timeout_s;
    while (stats->completed < total) {
        double left = deadline - now_s();
        if (left <= 0)
            break;
        int wait_ms = left > 0.1 ? 100 : (int)(left * 1e3) + 1;
        int nev = epoll_wait(c->epfd, c->events, MAX_EVENTS, wait_ms);
        if (nev < 0 && errno != EINTR) {
            note_error(c, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int e = 0; e < nev; e++) {
            struct conn *k = &c->conns[c->events[e].data.u32];
            on_event(c, k, c->events[e].events);
            advance(c, k);
        }
    }
    if (stats->completed >= total)
        return 0;
    note_error(c, "%ld of %ld requests unfinished after %.0f s", total - stats->completed, total,
               c->cfg.timeout_s);
    stats->failures += total - stats->completed;
    for (int i = 0; i < n; i++) /* a half-read reply would confuse the next run */
        if (c->conns[i].state != CS_IDLE)
            conn_close(c, &c->conns[i]);
    return -1;
}

static void set_err(char *err, size_t errlen, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, "raw client: %s: %s", what, strerror(errno));
}

struct raw_client *raw_client_new(const struct raw_config *cfg, char *err, size_t errlen)
{
    if (cfg->connections < 1 || cfg->n_bodies < 1 || cfg->port <= 0 || cfg->port > 65535) {
        errno = EINVAL;
        set_err(err, errlen, "bad configuration");
        return NULL;
    }
    struct raw_client *c = calloc(1, sizeof *c);
    if (!c) {
        set_err(err, errlen, "calloc");
        return NULL;
    }
    c->cfg = *cfg;
    c->addr.sin_family = AF_INET;
    c->addr.sin_port = htons((uint16_t)cfg->port);
    c->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    c->requests = calloc((size_t)cfg->n_bodies, sizeof *c->requests);
    c->request_lens = calloc((size_t)cfg->n_bodies, sizeof *c->request_lens);
    c->conns = calloc((size_t)cfg->connections, sizeof *c->conns);
    c->rbuf = malloc(READ_BUFFER_SIZE);
    c->events = calloc(MAX_EVENTS, sizeof *c->events);
    if (c->epfd < 0 || !c->requests || !c->request_lens || !c->conns || !c->rbuf || !c->events) {
        set_err(err, errlen, "setup");
        raw_client_free(c);
        return NULL;
    }
    /* The request head libcurl sends for the floor's POSTs, byte for byte. */
    for (int j = 0; j < cfg->n_bodies; j++) {
        char head[512];
        int h = snprintf(head, sizeof head,
                         "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: */*\r\n"
                         "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                         cfg->path, cfg->port, cfg->content_type, cfg->body_lens[j]);
        if (h < 0 || (size_t)h >= sizeof head || !(c->requests[j] = malloc((size_t)h + cfg->body_lens[j]))) {
            errno = h < 0 || (size_t)h >= sizeof head ? EINVAL : ENOMEM;
            set_err(err, errlen, "building a request");
            raw_client_free(c);
            return NULL;
        }
        memcpy(c->requests[j], head, (size_t)h);
        memcpy(c->requests[j] + h, cfg->bodies[j], cfg->body_lens[j]);
        c->request_lens[j] = (size_t)h + cfg->body_lens[j];
    }
    for (int i = 0; i < cfg->connections; i++)
        c->conns[i].fd = -1;
    memset(c->rbuf, 0x5a, READ_BUFFER_SIZE); /* resident before any measured window (not 0:
                                              * malloc+memset(0) may become an untouched calloc) */
    return c;
}

void raw_client_free(struct raw_client *c)
{
    if (!c)
        return;
    if (c->conns)
        for (int i = 0; i < c->cfg.connections; i++)
            if (c->conns[i].fd >= 0)
                close(c->conns[i].fd);
    if (c->epfd >= 0)
        close(c->epfd);
    if (c->requests)
        for (int j = 0; j < c->cfg.n_bodies; j++)
            free(c->requests[j]);
    free(c->requests);
    free(c->request_lens);
    free(c->conns);
    free(c->rbuf);
    free(c->events);
    free(c);
}
