/* test_connection_check.c -- connection_check() against a one-shot loopback
 * HTTP server in this process (canned answers) and a closed port; also from
 * several threads at once (run under TSan: label tsan). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "api/connection_check.h"

/* A server that answers ONE request with `response` and keeps the request. */
typedef struct {
    int fd;
    int port;
    const char *response;
    char request[4096];
    pthread_t thread;
} one_shot;

static void *serve(void *arg)
{
    one_shot *s = arg;
    int c = accept(s->fd, NULL, NULL);
    if (c < 0)
        return NULL;
    size_t n = 0;
    while (n < sizeof s->request - 1 && !strstr(s->request, "\r\n\r\n")) {
        ssize_t r = read(c, s->request + n, sizeof s->request - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        s->request[n] = '\0';
    }
    size_t len = strlen(s->response), off = 0;
    while (off < len) {
        ssize_t w = write(c, s->response + off, len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(c);
    return NULL;
}

static int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int one_shot_start(one_shot *s, const char *response)
{
    memset(s, 0, sizeof *s);
    s->response = response;
    s->fd = listen_loopback(&s->port);
    return s->fd >= 0 && pthread_create(&s->thread, NULL, serve, s) == 0 ? 0 : -1;
}

static void one_shot_stop(one_shot *s)
{
    pthread_join(s->thread, NULL);
    close(s->fd);
}

/* Options for base_url http://127.0.0.1:<port><path>, with extra JSON members. */
static char *opts(int port, const char *path, const char *extra)
{
    char *s = NULL;
    if (asprintf(&s, "{\"model\":\"m\",\"base_url\":\"http://127.0.0.1:%d%s\",\"max_retries\":0%s}",
                 port, path, extra) < 0)
        return NULL;
    return s;
}

/* Run a check against a server answering `response`; returns the status. */
static parley_status check_against(const char *response, const char *path, const char *extra,
                                   char **out, char **err, char *request, size_t request_size)
{
    one_shot s;
    if (one_shot_start(&s, response) != 0) {
        CHECK(!"cannot start the test server");
        return PARLEY_ERR_INTERNAL;
    }
    char *o = opts(s.port, path, extra);
    parley_status st = connection_check(o, out, err);
    one_shot_stop(&s);
    if (request)
        snprintf(request, request_size, "%s", s.request);
    free(o);
    return st;
}

static char *http(const char *status, const char *body)
{
    char *s = NULL;
    if (asprintf(&s, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n%s", status, strlen(body), body) < 0)
        return NULL;
    return s;
}

static void test_models_listed_with_auth_header(void)
{
    char *resp = http("200 OK", "{\"object\":\"list\",\"data\":[{\"id\":\"llama3.2\"},{\"id\":\"qwen\"}]}");
    char *out = NULL, *err = NULL, req[4096];
    parley_status st = check_against(resp, "/v1", ",\"api_key\":\"sk-unit\"", &out, &err, req,
                                     sizeof req);
    CHECK(st == PARLEY_OK);
    CHECK(err == NULL);
    json_t *v = out ? json_loads(out, 0, NULL) : NULL;
    CHECK(json_is_true(json_object_get(v, "ok")));
    CHECK(json_array_size(json_object_get(v, "models")) == 2);
    CHECK_STR(json_string_value(json_array_get(json_object_get(v, "models"), 0)), "llama3.2");
    const char *url = json_string_value(json_object_get(v, "url"));
    CHECK(url && strstr(url, "/v1/models"));
    CHECK(strncmp(req, "GET /v1/models HTTP/1.1\r\n", 25) == 0);
    CHECK(strstr(req, "\r\nAuthorization: Bearer sk-unit\r\n") != NULL);
    json_decref(v);
    free(out);
    free(err);
    free(resp);
}

static void expect_failure(const char *status, const char *body, const char *path,
                           const char *extra, parley_status want, const char *needle)
{
    char *resp = http(status, body);
    char *out = NULL, *err = NULL;
    parley_status st = check_against(resp, path, extra, &out, &err, NULL, 0);
    CHECK(st == want);
    CHECK(out == NULL);
    CHECK(err && strstr(err, needle));
    if (!err || !strstr(err, needle))
        fprintf(stderr, "  %s: got '%s', wanted '%s'\n", status, err ? err : "(null)", needle);
    free(err);
    free(resp);
}

static void test_errors_say_what_to_do(void)
{
    expect_failure("401 Unauthorized", "{\"error\":{\"message\":\"bad key\"}}", "/v1",
                   ",\"api_key\":\"sk-x\"", PARLEY_ERR_HTTP_STATUS, "the server refused the API key");
    expect_failure("401 Unauthorized", "{}", "/v1", "", PARLEY_ERR_HTTP_STATUS,
                   "the server wants an API key");
    /* a 404 names the URL and says what the codec's not_found_hint says */
    expect_failure("404 Not Found", "{\"detail\":\"Not Found\"}", "", "", PARLEY_ERR_HTTP_STATUS,
                   "base_url usually ends in /v1");
    expect_failure("404 Not Found", "{}", "/v1", "", PARLEY_ERR_HTTP_STATUS,
                   "is base_url the server's API root, and provider right?");
    expect_failure("404 Not Found", "{}", "/v1", ",\"provider\":\"anthropic\",\"api_key\":\"k\"",
                   PARLEY_ERR_HTTP_STATUS, "the Messages API is <base_url>/v1/messages");
    expect_failure("404 Not Found", "{}", "/v1", ",\"provider\":\"ollama\"", PARLEY_ERR_HTTP_STATUS,
                   "Ollama's native API is <base_url>/api/chat");
    expect_failure("429 Too Many Requests", "{}", "/v1", "", PARLEY_ERR_RATE_LIMITED, "HTTP 429");
    expect_failure("200 OK", "<html></html>", "/v1", "", PARLEY_ERR_BAD_RESPONSE,
                   "not with a model list");
    char big[4096];
    memset(big, ' ', sizeof big - 1);
    big[0] = '[';
    big[sizeof big - 2] = ']';
    big[sizeof big - 1] = '\0';
    expect_failure("200 OK", big, "/v1", ",\"max_response_bytes\":1024", PARLEY_ERR_BAD_RESPONSE,
                   "larger than max_response_bytes");
}

/* A port nothing listens on: bound, never listened to, so connects are refused. */
static int closed_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(*fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

static int refused_port;

static void *check_refused(void *arg)
{
    (void)arg;
    char *o = opts(refused_port, "/v1", "");
    char *err = NULL;
    parley_status st = connection_check(o, NULL, &err);
    int ok = st == PARLEY_ERR_CONNECT && err && strstr(err, "nothing listens at") &&
             strstr(err, "is the server running?");
    free(err);
    free(o);
    return ok ? arg : NULL;
}

static void test_closed_port_from_many_threads(void)
{
    int fd;
    refused_port = closed_port(&fd);
    CHECK(refused_port > 0);
    enum { N = 6 };
    pthread_t t[N];
    int tag[N];
    for (int i = 0; i < N; i++)
        CHECK(pthread_create(&t[i], NULL, check_refused, &tag[i]) == 0);
    for (int i = 0; i < N; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        CHECK(r == &tag[i]);
    }
    close(fd);
}

/* A base_url with user:password@ never shows them (hardening: no secret in error text). */
static void test_credentials_never_shown(void)
{
    int fd;
    int port = closed_port(&fd);
    CHECK(port > 0);
    char o[256];
    snprintf(o, sizeof o, "{\"model\":\"m\",\"base_url\":\"http://user:hunter2@127.0.0.1:%d/v1\"}",
             port);
    char *err = NULL;
    CHECK(connection_check(o, NULL, &err) == PARLEY_ERR_CONNECT);
    CHECK(err && strstr(err, "http://127.0.0.1:") && !strstr(err, "hunter2") && !strstr(err, "user"));
    free(err);
    close(fd);
}

static void test_bad_options_and_null_outputs(void)
{
    char *out = (char *)1, *err = NULL;
    CHECK(connection_check("{\"model\":\"m\",\"temprature\":1}", &out, &err) ==
          PARLEY_ERR_INVALID_OPTIONS);
    CHECK(out == NULL);
    CHECK(err && strstr(err, "did you mean 'temperature'?"));
    free(err);
    CHECK(connection_check("not json", NULL, NULL) == PARLEY_ERR_INVALID_OPTIONS);
}

/* libcurl's transfer, or CURLE_OUT_OF_MEMORY while a test says so (libcurl short of
 * memory): this program's definition takes the place of libcurl's for parley_core. */
static CURLcode (*real_perform)(CURL *);
static atomic_int perform_oom;

CURLcode curl_easy_perform(CURL *e)
{
    return atomic_load(&perform_oom) ? CURLE_OUT_OF_MEMORY : real_perform(e);
}

/* libcurl out of memory is no_memory, not "cannot reach" (connect). */
static void test_curl_out_of_memory(void)
{
    int fd;
    int port = closed_port(&fd);
    CHECK(port > 0);
    char *o = opts(port, "/v1", "");
    char *err = NULL;
    atomic_store(&perform_oom, 1);
    parley_status st = connection_check(o, NULL, &err);
    atomic_store(&perform_oom, 0);
    CHECK(st == PARLEY_ERR_NO_MEMORY);
    if (st != PARLEY_ERR_NO_MEMORY)
        fprintf(stderr, "  libcurl out of memory: status %d: %s\n", (int)st, err ? err : "");
    free(err);
    free(o);
    close(fd);
}

int main(void)
{
    real_perform = (CURLcode(*)(CURL *))dlsym(RTLD_NEXT, "curl_easy_perform");
    test_curl_out_of_memory();
    test_models_listed_with_auth_header();
    test_errors_say_what_to_do();
    test_closed_port_from_many_threads();
    test_bad_options_and_null_outputs();
    test_credentials_never_shown();
    return check_report();
}
