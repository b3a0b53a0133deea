/* metrics_http.c -- see metrics_http.h.  One thread, one connection at a time: a scrape
 * is small and rare, and a slow client is cut off after a second. */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shim.h"

#define REQUEST_MAX       8192
#define CLIENT_TIMEOUT_MS 1000

static int listen_fd = -1, stop_pipe[2] = {-1, -1};
static pthread_t server;
static int started;

/* The address of spec into *ss: 0, or -1 with *err. */
static int parse(const char *spec, struct sockaddr_storage *ss, socklen_t *len, char **err)
{
    const char *colon = strrchr(spec, ':');
    char host[64];
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    size_t n = colon ? (size_t)(colon - spec) : 0;
    if (!colon || !colon[1] || *end || port < 1 || port > 65535 || n == 0 || n >= sizeof host) {
        if (asprintf(err, "--metrics-listen: expected ADDR:PORT (e.g. 127.0.0.1:9464), got '%s'",
                     spec) < 0)
            *err = NULL;
        return -1;
    }
    memcpy(host, spec, n);
    host[n] = '\0';
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1 && (ntohl(v4->sin_addr.s_addr) >> 24) == 127) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
        return 0;
    }
    if (strcmp(host, "[::1]") == 0 && inet_pton(AF_INET6, "::1", &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
        return 0;
    }
    if (asprintf(err,
                 "--metrics-listen: '%s' is not a loopback address (127.x.x.x, "
                 "localhost or [::1]): the metrics are served to this machine only",
                 host) < 0)
        *err = NULL;
    return -1;
}

int metrics_http_parse(const char *spec, char **err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    *err = NULL;
    return parse(spec, &ss, &len, err);
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0 && errno != EINTR)
            return;
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
    }
}

static void reply(int fd, const char *status, const char *type, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, type, strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
}

/* Read the request head (up to the blank line), waiting at most CLIENT_TIMEOUT_MS. */
static int read_head(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    while (len + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, CLIENT_TIMEOUT_MS) <= 0)
            return -1;
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
        if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n"))
            return 0;
    }
    return -1;
}

static void serve(int fd)
{
    char req[REQUEST_MAX];
    if (read_head(fd, req, sizeof req) != 0)
        return;
    int get = strncmp(req, "GET ", 4) == 0, head = strncmp(req, "HEAD ", 5) == 0;
    const char *path = req + (get ? 4 : 5);
    size_t plen = strcspn(path, " ?\r\n");
    if (!get && !head) {
        reply(fd, "405 Method Not Allowed", "text/plain", "only GET /metrics\n");
        return;
    }
    if (plen != 8 || strncmp(path, "/metrics", 8) != 0) {
        reply(fd, "404 Not Found", "text/plain", "the metrics are at /metrics\n");
        return;
    }
    const parley_plugin *pl = g_shim.pl;
    char *text = NULL;
    parley_status st = PARLEY_ERR_INVALID_INPUT;
    if (PARLEY_HAS_FIELD(pl, parley_plugin, metrics_prometheus) && pl->metrics_prometheus)
        st = pl->metrics_prometheus(g_shim.agent, &text);
    if (st == PARLEY_OK)
        reply(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text ? text : "");
    else
        reply(fd, "500 Internal Server Error", "text/plain",
              "this plugin has no metrics_prometheus, or it failed\n");
    plugin_free(text);
}

static void *server_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        serve(fd);
        close(fd);
    }
    return NULL;
}

int metrics_http_start(const char *spec, char **err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    *err = NULL;
    if (parse(spec, &ss, &len, err) != 0)
        return -1;
    int one = 1;
    listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(listen_fd, (struct sockaddr *)&ss, len) != 0 || listen(listen_fd, 16) != 0 ||
        pipe(stop_pipe) != 0) {
        if (asprintf(err, "--metrics-listen %s: %s", spec, strerror(errno)) < 0)
            *err = NULL;
        metrics_http_stop();
        return -1;
    }
    int e = pthread_create(&server, NULL, server_main, NULL);
    if (e != 0) {
        if (asprintf(err, "--metrics-listen: cannot start its thread: %s", strerror(e)) < 0)
            *err = NULL;
        metrics_http_stop();
        return -1;
    }
    started = 1;
    diag(PARLEY_LOG_INFO, "metrics at http://%s/metrics", spec);
    return 0;
}

void metrics_http_stop(void)
{
    if (started) {
        if (write(stop_pipe[1], "x", 1) < 0)
            diag(PARLEY_LOG_WARN, "metrics: cannot wake the server thread");
        pthread_join(server, NULL);
        started = 0;
    }
    for (int i = 0; i < 2; i++)
        if (stop_pipe[i] >= 0)
            close(stop_pipe[i]);
    stop_pipe[0] = stop_pipe[1] = -1;
    if (listen_fd >= 0)
        close(listen_fd);
    listen_fd = -1;
}
