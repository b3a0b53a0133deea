/*
 * raw_client_test.c -- the limit's client against parley-fake-llm: it must
 * find the end of every reply shape the server sends (Content-Length JSON,
 * chunked SSE, chunks split across reads), keep its connections alive, and
 * count every failure (error status, dropped connection, nothing listening,
 * a reply that never comes) instead of hanging or miscounting.
 *
 *   bench-raw-client-test [PATH-TO-parley-fake-llm]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/check.h"
#include "raw_client.h"

#ifndef PARLEY_BENCH_FAKE_LLM
#define PARLEY_BENCH_FAKE_LLM "parley-fake-llm"
#endif

static pid_t server_pid;

/* Start the fake server on a free port; returns the port. */
static int server_start(const char *fake_llm)
{
    char port_file[] = "/tmp/raw-client-test.XXXXXX";
    int fd = mkstemp(port_file);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(port_file);
    server_pid = fork();
    if (server_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(fake_llm, fake_llm, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
              "--quiet", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f) {
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok && port > 0) {
                unlink(port_file);
                return port;
            }
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* A loopback port bound to a socket that never listens (kept open until exit). */
static int bound_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

static void server_stop(void)
{
    kill(server_pid, SIGTERM);
    waitpid(server_pid, NULL, 0);
}

/* One run of `conns` connections x `per` requests of a chat body whose user
 * text is `text`; returns raw_client_run()'s result. */
static int run(int port, const char *text, int stream, int conns, int per, double timeout_s,
               struct raw_stats *st)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"fake-model\",\"stream\":%s,\"messages\":[{\"role\":\"user\","
             "\"content\":\"%s\"}]}",
             stream ? "true" : "false", text);
    const char *bodies[1] = {body};
    size_t lens[1] = {strlen(body)};
    struct raw_config cfg = {.port = port,
                             .path = "/v1/chat/completions",
                             .content_type = "application/json",
                             .bodies = bodies,
                             .body_lens = lens,
                             .n_bodies = 1,
                             .connections = conns,
                             .timeout_s = timeout_s};
    char err[256];
    struct raw_client *c = raw_client_new(&cfg, err, sizeof err);
    if (!c) {
        fprintf(stderr, "%s\n", err);
        memset(st, 0, sizeof *st);
        return -2;
    }
    double *lat = calloc((size_t)conns * (size_t)per, sizeof *lat);
    int rc = raw_client_run(c, per, lat, st);
    int lat_ok = 1;
    for (int i = 0; i < conns * per && st->completed == (long)conns * per; i++)
        lat_ok &= lat[i] > 0;
    CHECK(lat_ok); /* every finished request has its latency */
    free(lat);
    raw_client_free(c);
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    int port = server_start(argc > 1 ? argv[1] : PARLEY_BENCH_FAKE_LLM);
    CHECK(port > 0);
    if (port <= 0)
        return check_report();
    struct raw_stats st;

    /* JSON replies with Content-Length, on keep-alive connections. */
    CHECK(run(port, "hello", 0, 20, 3, 30, &st) == 0);
    CHECK(st.completed == 60 && st.failures == 0 && st.connects == 20);
    CHECK(st.peak_in_flight == 20);
    CHECK(st.reply_bytes > 60 * 100);
    double json_bytes = st.reply_bytes;

    /* SSE: chunked, ends with the zero-size chunk. */
    CHECK(run(port, "hello", 1, 20, 3, 30, &st) == 0);
    CHECK(st.completed == 60 && st.failures == 0 && st.connects == 20);
    CHECK(st.reply_bytes > json_bytes); /* the events repeat the envelope */

    /* Chunks that arrive one by one (separate reads). */
    CHECK(run(port, "hello [[fault:slow_stream:2]]", 1, 4, 2, 30, &st) == 0);
    CHECK(st.completed == 8 && st.failures == 0 && st.connects == 4);

    /* An error status is a failure; its reply still ends, the connection stays. */
    CHECK(run(port, "hello [[fault:500]]", 0, 5, 2, 30, &st) == 0);
    CHECK(st.completed == 10 && st.failures == 10 && st.connects == 5);
    CHECK(strstr(st.error, "HTTP status 500") != NULL);

    /* A connection dropped mid-reply: a failure, and the next request reconnects. */
    CHECK(run(port, "hello [[fault:reset]]", 0, 3, 2, 30, &st) == 0);
    CHECK(st.completed == 6 && st.failures == 6 && st.connects == 6);
    CHECK(strstr(st.error, "closed before the reply ended") != NULL);

    /* A reply that never comes: the run gives up at its timeout, all counted. */
    CHECK(run(port, "hello [[fault:hang]]", 0, 3, 2, 1, &st) == -1);
    CHECK(st.failures == 6);
    CHECK(strstr(st.error, "unfinished") != NULL);

    server_stop();

    /* Nothing listening (a port bound but not listening, so that no parallel test can
     * take it): every request fails at connect, none hangs. */
    int closed_port = bound_port();
    CHECK(closed_port > 0);
    CHECK(run(closed_port, "hello", 0, 3, 2, 5, &st) == 0);
    CHECK(st.completed == 6 && st.failures == 6);
    CHECK(strstr(st.error, "connect") != NULL);

    return check_report();
}
