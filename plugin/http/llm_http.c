/* llm_http.c -- see llm_http.h. */
#include "http/llm_http.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lib/clock.h"

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    http_call *c = ud;
    size_t n = size * nmemb;
    if (c->complete)
        return n; /* after the end of the answer (keep-alive comments): not even counted */
    if (c->status == 0)
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->status);
    if (c->received + n > c->max_bytes) {
        c->oversized = 1;
        return 0; /* abort: CURLE_WRITE_ERROR */
    }
    c->received += n;
    if (c->sink && c->status >= 200 && c->status < 300) {
        int rc = c->sink(c->owner, data, n);
        if (rc == HTTP_SINK_COMPLETE) {
            c->complete = 1; /* let the body end by itself, so the connection can be reused */
            return n;
        }
        if (rc != 0) {
            c->sink_failed = 1;
            return 0;
        }
        return n;
    }
    if (!c->body.cap) { /* the first piece: room for the whole answer when its length is known */
        curl_off_t length = -1;
        curl_easy_getinfo(c->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
        if (length > (curl_off_t)n && (size_t)length <= c->max_bytes)
            pbuf_reserve(&c->body, (size_t)length);
    }
    pbuf_append(&c->body, data, n);
    return c->body.oom ? 0 : n;
}

/* Retry-After: delta-seconds or an HTTP date. */
static int64_t parse_retry_after(const char *v)
{
    while (*v == ' ' || *v == '\t')
        v++;
    char *end;
    long long secs = strtoll(v, &end, 10);
    if (end != v && secs >= 0)
        return secs > 86400 ? 86400000 : (int64_t)secs * 1000;
    /* An HTTP date, "Sun, 06 Nov 1994 08:49:37 GMT": parsed by hand, since
     * strptime's month names follow the host's locale. */
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    char mon[4] = "";
    int day, year, hh, mm, ss;
    const char *comma = strchr(v, ',');
    if (!comma || sscanf(comma + 1, " %d %3s %d %d:%d:%d GMT", &day, mon, &year, &hh, &mm, &ss) != 6)
        return -1;
    const char *m = strlen(mon) == 3 ? strstr(months, mon) : NULL;
    if (!m || (m - months) % 3 != 0)
        return -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_mday = day;
    tm.tm_mon = (int)((m - months) / 3);
    tm.tm_year = year - 1900;
    tm.tm_hour = hh;
    tm.tm_min = mm;
    tm.tm_sec = ss;
    time_t when = timegm(&tm), now = time(NULL);
    return when > now ? (int64_t)(when - now) * 1000 : 0;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    http_call *c = ud;
    size_t n = size * nmemb;
    c->header_bytes += n;
    if (n <= 2 && (data[0] == '\r' || data[0] == '\n')) { /* the blank line ending a block */
        long status = 0;
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 200) { /* 1xx blocks are followed by the real one */
            c->status = status;
            c->headers_done = 1;
        }
        return n;
    }
    static const char name[] = "retry-after:";
    if (n > sizeof name - 1 && strncasecmp(data, name, sizeof name - 1) == 0) {
        char value[128];
        size_t vlen = n - (sizeof name - 1);
        if (vlen >= sizeof value)
            vlen = sizeof value - 1;
        memcpy(value, data + sizeof name - 1, vlen);
        value[vlen] = '\0';
        c->retry_after_ms = parse_retry_after(value);
    }
    return n;
}

CURLU *http_parse_url(const char *url)
{
    CURLU *u = curl_url();
    /* The flags libcurl 7.88 itself parses CURLOPT_URL with (url.c). */
    if (u && curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME)) {
        curl_url_cleanup(u);
        u = NULL;
    }
    return u;
}

uint64_t http_config_generation(void)
{
    static _Atomic uint64_t last;
    return atomic_fetch_add(&last, 1) + 1;
}

char *http_display_url(const char *url)
{
    CURLU *h = curl_url();
    char *shown = NULL, *out = NULL;
    if (h && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_USER, NULL, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_PASSWORD, NULL, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_OPTIONS, NULL, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_QUERY, NULL, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_FRAGMENT, NULL, 0) == CURLUE_OK &&
        curl_url_get(h, CURLUPART_URL, &shown, 0) == CURLUE_OK)
        out = strdup(shown);
    curl_free(shown);
    curl_url_cleanup(h);
    return out;
}

/* ---- the pool: multi handles on the worker's epoll ---------------------- */

/* How many freed calls keep their easy handle for the next request, at most:
 * enough for the transfers one loop iteration ends, not the whole cap. */
#define SPARE_CALLS_MAX 256
/* libcurl's receive buffer per transfer, which it holds for the whole wait:
 * its minimum, 1 KiB, instead of its default 16 KiB.  Answers come in small
 * pieces (SSE events, a few KB of JSON); a bigger one that arrives at once
 * just takes more reads (docs/performance.md, "Memory per in-flight turn"). */
#define RECEIVE_BUFFER_BYTES 1024L

/* The slot of descriptor s, the table grown to hold it; NULL when out of memory. */
static http_fd *fd_slot(http_pool *p, curl_socket_t s)
{
    if (s < 0)
        return NULL;
    size_t i = (size_t)s;
    if (i >= p->nfds) {
        size_t n = p->nfds ? p->nfds : 64;
        while (n <= i)
            n *= 2;
        http_fd *grown = realloc(p->fds, n * sizeof *grown);
        if (!grown)
            return NULL;
        memset(grown + p->nfds, 0, (n - p->nfds) * sizeof *grown);
        p->fds = grown;
        p->nfds = n;
    }
    return &p->fds[i];
}

/* What an epoll event of s carries: its generation (bumped on every add) and s. */
static uint64_t fd_tag(const http_fd *f, curl_socket_t s)
{
    return ((uint64_t)f->gen << 32) | (uint32_t)s;
}

static void fd_unregister(http_pool *p, curl_socket_t s, http_fd *f)
{
    if (f->registered)
        epoll_ctl(p->epoll_fd, EPOLL_CTL_DEL, s, NULL); /* may be closed already: nothing to undo */
    f->registered = 0;
    f->wanted = 0;
}

/* CURLMOPT_SOCKETFUNCTION: keep the worker's epoll set in step with what curl waits for. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy;
    (void)socketp;
    http_shard *sh = userp;
    http_pool *p = sh->pool;
    http_fd *f = fd_slot(p, s);
    if (what == CURL_POLL_REMOVE) {
        if (!f)
            return 0;
        /* An idle connection stays registered for input only: it wakes the
         * worker only if the server closes it.  Anything else leaves now:
         * output (always ready), and sockets whose close the pool does not
         * see (the resolver's), whose number may be reused. */
        if (f->registered && f->opened && f->events == EPOLLIN)
            f->wanted = 0;
        else
            fd_unregister(p, s, f);
        return 0;
    }
    /* Never return -1 below: libcurl then marks the whole multi handle dead
     * and fails every transfer of the shard, not just this one.  A socket
     * that cannot be watched leaves only its own transfer waiting for its
     * timeouts (or for its next change of events, which tries again). */
    if (!f)
        return 0; /* out of memory: the descriptor table could not grow */
    uint8_t events = (uint8_t)((what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u));
    f->wanted = 1;
    f->shard = sh->index;
    if (f->registered && f->events == events)
        return 0; /* a kept-alive connection, registered as it idled: nothing to do */
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = events;
    int op = f->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (op == EPOLL_CTL_ADD)
        f->gen++;
    ev.data.u64 = fd_tag(f, s);
    if (epoll_ctl(p->epoll_fd, op, s, &ev) != 0) {
        /* Closed and reused behind the table's back (a socket the pool did not open). */
        if (errno == ENOENT) {
            f->gen++;
            ev.data.u64 = fd_tag(f, s);
            op = EPOLL_CTL_ADD;
        } else if (errno == EEXIST) {
            op = EPOLL_CTL_MOD;
        } else {
            fd_unregister(p, s, f);
            return 0;
        }
        if (epoll_ctl(p->epoll_fd, op, s, &ev) != 0) {
            fd_unregister(p, s, f);
            return 0;
        }
    }
    f->registered = 1;
    f->events = events;
    return 0;
}

/* CURLOPT_OPENSOCKETFUNCTION: mark the connection sockets, whose close the pool sees. */
static curl_socket_t on_open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)purpose;
    /* Close-on-exec: a host that forks and runs a program does not hand it the LLM connections. */
    curl_socket_t s = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    http_fd *f = s >= 0 ? fd_slot(clientp, s) : NULL;
    if (s >= 0 && !f) {
        close(s);
        return CURL_SOCKET_BAD;
    }
    if (f) {
        fd_unregister(clientp, s, f); /* a number reused after a close the pool did not see */
        f->opened = 1;
    }
    return s;
}

/* CURLOPT_CLOSESOCKETFUNCTION: out of the epoll set first, then closed. */
static int on_close_socket(void *clientp, curl_socket_t s)
{
    http_pool *p = clientp;
    http_fd *f = (size_t)s < p->nfds ? &p->fds[s] : NULL;
    if (f) {
        fd_unregister(p, s, f);
        f->opened = 0;
    }
    return close(s);
}

/* CURLMOPT_TIMERFUNCTION: remember when; the worker's loop runs it (never from here). */
static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    http_shard *sh = userp;
    sh->timer_due_ms = timeout_ms < 0 ? UINT64_MAX : clock_mono_ms() + (uint64_t)timeout_ms;
    return 0;
}

int http_pool_init(http_pool *p, size_t max_connections, int epoll_fd)
{
    memset(p, 0, sizeof *p);
    p->epoll_fd = epoll_fd;
    p->max_active = max_connections ? max_connections : 1;
    size_t n = (p->max_active + HTTP_SHARD_CONNECTIONS - 1) / HTTP_SHARD_CONNECTIONS;
    p->shards = calloc(n, sizeof *p->shards);
    if (!p->shards)
        return -1;
    p->nshards = n;
    for (size_t i = 0; i < n; i++) {
        http_shard *sh = &p->shards[i];
        sh->pool = p;
        sh->index = (uint32_t)i;
        /* The caps add up to max_connections exactly. */
        sh->cap = p->max_active / n + (i < p->max_active % n ? 1 : 0);
        sh->timer_due_ms = UINT64_MAX;
        if (!(sh->multi = curl_multi_init())) {
            http_pool_cleanup(p);
            return -1;
        }
        /* Belt and braces: curl itself never opens more, nor keeps more idle. */
        curl_multi_setopt(sh->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)sh->cap);
        curl_multi_setopt(sh->multi, CURLMOPT_MAXCONNECTS, (long)sh->cap);
        curl_multi_setopt(sh->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
        curl_multi_setopt(sh->multi, CURLMOPT_SOCKETDATA, sh);
        curl_multi_setopt(sh->multi, CURLMOPT_TIMERFUNCTION, on_timer);
        curl_multi_setopt(sh->multi, CURLMOPT_TIMERDATA, sh);
    }
    return 0;
}

void http_pool_cleanup(http_pool *p)
{
    while (p->spare) {
        http_call *c = p->spare;
        p->spare = c->wait_next;
        curl_easy_cleanup(c->easy);
        pbuf_free(&c->body);
        free(c);
    }
    p->nspare = 0;
    for (size_t i = 0; i < p->nshards; i++)
        if (p->shards[i].multi)
            curl_multi_cleanup(p->shards[i].multi);
    free(p->shards);
    p->shards = NULL;
    p->nshards = 0;
    free(p->done);
    p->done = NULL;
    p->done_cap = 0;
    free(p->fds); /* after the multi handles: closing their connections reads it */
    p->fds = NULL;
    p->nfds = 0;
}

void http_pool_on_socket(http_pool *p, uint64_t tag, uint32_t events)
{
    curl_socket_t s = (curl_socket_t)(uint32_t)tag;
    if ((size_t)s >= p->nfds)
        return;
    http_fd *f = &p->fds[s];
    if (!f->registered || fd_tag(f, s) != tag)
        return; /* an event of a socket closed since, in the same batch */
    if (!f->wanted) { /* an idle connection woke: the server closed it; curl finds out on reuse */
        fd_unregister(p, s, f);
        return;
    }
    int flags = (events & EPOLLIN ? CURL_CSELECT_IN : 0) | (events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                (events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
    int running;
    curl_multi_socket_action(p->shards[f->shard].multi, s, flags, &running);
}

void http_pool_run_timers(http_pool *p)
{
    uint64_t now = clock_mono_ms();
    for (size_t i = 0; i < p->nshards; i++) {
        http_shard *sh = &p->shards[i];
        if (sh->timer_due_ms > now)
            continue;
        sh->timer_due_ms = UINT64_MAX; /* curl sets the next one from inside the call */
        int running;
        curl_multi_socket_action(sh->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
}

int64_t http_pool_next_timer_in(const http_pool *p, uint64_t now_ms)
{
    uint64_t due = UINT64_MAX;
    for (size_t i = 0; i < p->nshards; i++)
        if (p->shards[i].timer_due_ms < due)
            due = p->shards[i].timer_due_ms;
    if (due == UINT64_MAX)
        return -1;
    return due > now_ms ? (int64_t)(due - now_ms) : 0;
}

http_done *http_pool_take_done(http_pool *p, size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nshards; i++) {
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(p->shards[i].multi, &left))) {
            http_call *c = NULL;
            if (msg->msg != CURLMSG_DONE ||
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c) != CURLE_OK || !c)
                continue;
            if (n == p->done_cap) {
                size_t cap = p->done_cap ? p->done_cap * 2 : 64;
                http_done *d = realloc(p->done, cap * sizeof *d);
                if (!d) { /* no room: the rest stay unread until next time */
                    *n_out = n;
                    return p->done;
                }
                p->done = d;
                p->done_cap = cap;
            }
            c->finished_ok = msg->data.result == CURLE_OK;
            p->done[n].call = c;
            p->done[n].result = msg->data.result;
            n++;
        }
    }
    *n_out = n;
    return p->done;
}

/* The shard with room for one more transfer: the first, so that a few
 * transfers at a time keep reusing the same connections. */
static http_shard *shard_with_room(http_pool *p)
{
    for (size_t i = 0; i < p->nshards; i++)
        if (p->shards[i].active < p->shards[i].cap)
            return &p->shards[i];
    return NULL;
}

/* Put the call on a multi handle: its timeouts start now.  0, or -1 with errno ENOMEM
 * (libcurl out of memory) or EINVAL (refused). */
static int call_add(http_call *c)
{
    http_pool *p = c->pool;
    http_shard *sh = shard_with_room(p);
    CURLMcode mc = sh ? curl_multi_add_handle(sh->multi, c->easy) : CURLM_INTERNAL_ERROR;
    if (mc != CURLM_OK) {
        errno = mc == CURLM_OUT_OF_MEMORY ? ENOMEM : EINVAL;
        return -1;
    }
    c->shard = sh;
    c->started = 1;
    c->started_ms = clock_mono_ms();
    sh->active++;
    p->active++;
    return 0;
}

/* O(1): a cancel storm over thousands of waiting calls stays linear. */
static void wait_unlink(http_pool *p, http_call *c)
{
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else
        p->wait_head = c->wait_next;
    if (c->wait_next)
        c->wait_next->wait_prev = c->wait_prev;
    else
        p->wait_tail = c->wait_prev;
    c->wait_prev = c->wait_next = NULL;
}

/* Start waiting calls while connections are free. */
static void pool_start_waiting(http_pool *p)
{
    while (p->wait_head && p->active < p->max_active) {
        http_call *c = p->wait_head;
        if (call_add(c) != 0)
            return; /* curl out of memory: it stays first in line; its deadline bounds it */
        wait_unlink(p, c);
    }
}

/* A call for a new request: a spare one (its easy handle still set up for
 * the config it last ran with), or a new one. */
static http_call *call_new(http_pool *pool)
{
    http_call *c = pool->spare;
    if (c) {
        pool->spare = c->wait_next;
        pool->nspare--;
        CURL *easy = c->easy;
        uint64_t configured = c->configured;
        memset(c, 0, sizeof *c);
        c->easy = easy;
        c->configured = configured;
        return c;
    }
    if (!(c = calloc(1, sizeof *c)))
        return NULL;
    if (!(c->easy = curl_easy_init())) {
        free(c);
        return NULL;
    }
    return c;
}

/*
 * A fresh easy handle in c's place (0, or -1 out of memory), where curl_easy_reset
 * would do: a transfer that did not end cleanly (libcurl short of memory) can leave
 * libcurl's receive buffer allocated at CURLOPT_BUFFERSIZE's 1 KiB; curl_easy_reset
 * then puts the size back to 16 KiB and keeps the buffer, and setting the option again
 * is refused once a buffer exists (CURLE_BAD_FUNCTION_ARGUMENT, libcurl 7.88), so the
 * next transfer received 16 KiB into 1 KiB and corrupted the heap.
 */
static int call_renew(http_call *c)
{
    CURL *fresh = curl_easy_init();
    if (!fresh)
        return -1;
    curl_easy_cleanup(c->easy);
    c->easy = fresh;
    c->configured = 0;
    return 0;
}

/* Keep the call and its easy handle (as configured) for the next request,
 * or free them.  Its answer buffer goes either way: a spare call would carry
 * it through its next request's whole wait. */
static void call_recycle(http_pool *p, http_call *c)
{
    pbuf_free(&c->body);
    /* libcurl counts the times it resent a request on a closed kept-alive
     * connection (giving up after 5) per easy handle, and only a new handle
     * (a reset, see call_renew) zeroes that count: after a resend, or a
     * transfer that did not end cleanly (it may have resent before failing),
     * start afresh. */
    if (p->nspare >= SPARE_CALLS_MAX || p->nspare >= p->max_active ||
        ((c->sends != 1 || !c->finished_ok) && call_renew(c) != 0)) {
        curl_easy_cleanup(c->easy);
        free(c);
        return;
    }
    c->wait_next = p->spare;
    p->spare = c;
    p->nspare++;
}

/* CURLOPT_PREREQFUNCTION: the request is about to go out (again, on a resend). */
static int on_prereq(void *ud, char *remote_ip, char *local_ip, int remote_port, int local_port)
{
    (void)remote_ip, (void)local_ip, (void)remote_port, (void)local_port;
    http_call *c = ud;
    c->sends++;
    return CURL_PREREQFUNC_OK;
}

/*
 * Everything but the body: set once per easy handle and config, since each
 * setopt of a URL or protocol list parses and copies it again.  The pointers
 * to the call itself stay right because a call keeps its easy handle for
 * life (call_new, call_recycle).
 */
static int call_configure(http_call *c, const http_config *cfg)
{
    if (c->configured && call_renew(c) != 0) /* another config: nothing of the old one may stay */
        return -1;
    CURL *e = c->easy;
    if (cfg->parsed_url) /* no parse per transfer: libcurl duplicates the parsed handle */
        curl_easy_setopt(e, CURLOPT_CURLU, cfg->parsed_url);
    else
        curl_easy_setopt(e, CURLOPT_URL, cfg->url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, cfg->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, c);
    curl_easy_setopt(e, CURLOPT_PRIVATE, c);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->error);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, cfg->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, cfg->request_timeout_ms);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, cfg->verify_tls ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, cfg->verify_tls ? 2L : 0L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    /* Expect: 100-continue would cost a round trip on every large body. */
    curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, RECEIVE_BUFFER_BYTES);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, c->pool);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, c->pool);
    c->configured = cfg->generation;
    return 0;
}

http_call *http_call_start(http_pool *pool, const http_config *cfg, const char *body, size_t len,
                           void *owner, http_sink_fn sink)
{
    http_call *c = call_new(pool);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->pool = pool;
    c->owner = owner;
    c->sink = sink;
    c->max_bytes = cfg->max_response_bytes;
    c->retry_after_ms = -1;
    c->display_url = cfg->display_url ? cfg->display_url : "the LLM server";
    if ((c->configured != cfg->generation || !cfg->generation) && call_configure(c, cfg) != 0) {
        curl_easy_cleanup(c->easy);
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    /* What changes from request to request: only the body. */
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    if (pool->active < pool->max_active && !pool->wait_head) {
        if (call_add(c) != 0) {
            int why = errno;
            call_recycle(pool, c);
            errno = why;
            return NULL;
        }
    } else {
        c->wait_prev = pool->wait_tail;
        if (pool->wait_tail)
            pool->wait_tail->wait_next = c;
        else
            pool->wait_head = c;
        pool->wait_tail = c;
    }
    return c;
}

void http_call_free(http_call *c)
{
    if (!c)
        return;
    http_pool *p = c->pool;
    if (c->started) {
        curl_multi_remove_handle(c->shard->multi, c->easy);
        c->shard->active--;
        p->active--;
    } else {
        wait_unlink(p, c);
    }
    call_recycle(p, c);
    pool_start_waiting(p);
}

/* Failures of the connection itself, before the server said anything. */
static int is_connection_failure(CURLcode code)
{
    switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR: /* the TLS handshake failed: may be transient */
        return 1;
    default:
        return 0;
    }
}

/* The server's TLS certificate (or our TLS setup) was refused: retrying cannot help. */
static int is_tls_refusal(CURLcode code)
{
    switch (code) {
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CLIENTCERT:
        return 1;
    default:
        return 0;
    }
}

long http_call_status(const http_call *c)
{
    /* A body-less answer (an empty 429 from a gateway) never reached on_body. */
    long status = c->status;
    if (status == 0)
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

parley_status http_call_outcome(const http_call *c, CURLcode code, char **msg, int *retryable)
{
    *msg = NULL;
    *retryable = 0;
    const char *detail = c->error[0] ? c->error : curl_easy_strerror(code);
    if (c->oversized) {
        *msg = pstr_printf("LLM response larger than max_response_bytes (%zu bytes)", c->max_bytes);
        return PARLEY_ERR_BAD_RESPONSE;
    }
    if (c->complete)
        return PARLEY_OK; /* the sink had the whole answer; what came after does not matter */
    if (c->sink_failed)
        return PARLEY_ERR_BAD_RESPONSE; /* the sink keeps its own message */
    if (c->body.oom) { /* on_body could not keep the answer: libcurl says "write error" */
        *msg = pstr_printf("out of memory receiving the LLM's answer");
        return PARLEY_ERR_NO_MEMORY;
    }
    long status = http_call_status(c);
    /* An error status whose headers arrived is the server's answer, even if
     * its body was then cut: the same answer gives the same status, always. */
    int error_status = c->headers_done && (status < 200 || status >= 300);
    if (code != CURLE_OK && !error_status) {
        if (code == CURLE_OUT_OF_MEMORY) { /* libcurl's own allocation failed: no fault of the server */
            *msg = pstr_printf("LLM request failed: %s", detail);
            return PARLEY_ERR_NO_MEMORY;
        }
        int began = c->header_bytes > 0 || c->received > 0;
        /* A reused connection has no connect time, but its request did get under way. */
        curl_off_t connect_us = 0, pretransfer_us = 0;
        curl_easy_getinfo(c->easy, CURLINFO_CONNECT_TIME_T, &connect_us);
        curl_easy_getinfo(c->easy, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
        if (code == CURLE_OPERATION_TIMEDOUT && connect_us == 0 && pretransfer_us == 0) {
            /* Never connected: as much a connection failure as a refusal. */
            *retryable = 1;
            *msg = pstr_printf("cannot reach the LLM server: %s", detail);
            return PARLEY_ERR_CONNECT;
        }
        if (code == CURLE_OPERATION_TIMEDOUT) {
            *msg = pstr_printf("LLM request timed out: %s", detail);
            return PARLEY_ERR_TIMEOUT;
        }
        if (is_tls_refusal(code)) {
            *msg = pstr_printf("TLS with the LLM server failed: %s (not retried; verify_tls: false "
                               "skips the check, for testing only)", detail);
            return PARLEY_ERR_CONNECT;
        }
        if (is_connection_failure(code) && !began) {
            *retryable = 1;
            *msg = code == CURLE_SSL_CONNECT_ERROR
                       ? pstr_printf("TLS handshake with the LLM server failed: %s (an https:// "
                                     "base_url for a server that speaks plain http?)", detail)
                       : pstr_printf("cannot reach the LLM server: %s", detail);
            return PARLEY_ERR_CONNECT;
        }
        /* The response began (headers or body), then broke: oversized headers, a cut. */
        *msg = pstr_printf("LLM response failed after it began: %s", detail);
        return PARLEY_ERR_BAD_RESPONSE;
    }
    if (status >= 200 && status < 300)
        return PARLEY_OK;
    /* What the body says, and whether a retry really may help, is the provider
     * codec's to tell (turn.c): this layer knows no server's error shape. */
    *msg = status == 404 ? pstr_printf("LLM server answered HTTP 404 for %s", c->display_url)
                         : pstr_printf("LLM server answered HTTP %ld", status);
    *retryable = status == 429 || (status >= 500 && status <= 599);
    return status == 429 ? PARLEY_ERR_RATE_LIMITED : PARLEY_ERR_HTTP_STATUS;
}
