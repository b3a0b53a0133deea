/*
 * test_context_window.c -- context_window_discover() against the fake LLM
 * (started here, on a loopback port): llama.cpp's /props, vLLM's
 * max_model_len, Ollama's /api/show and the num_ctx Parley sends; a server
 * that says nothing; a port nobody listens on.
 */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "config/options.h"
#include "http/context_window.h"
#include "lib/buf.h"

extern char **environ;

typedef struct {
    pid_t pid;
    int port;
    char dir[64];
} fake_llm;

static int fake_start(fake_llm *f, const char *n_ctx)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/parley-cw-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    char port_file[128];
    snprintf(port_file, sizeof port_file, "%s/port", f->dir);
    char *argv[] = {PARLEY_FAKE_LLM, "--port", "0", "--port-file", port_file, "--quiet",
                    n_ctx ? "--n-ctx" : NULL, (char *)n_ctx, NULL};
    posix_spawn_file_actions_t fa; /* its "listening on" line is not ours to print */
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawn(&f->pid, PARLEY_FAKE_LLM, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    for (int i = 0; i < 500; i++) {
        FILE *fp = fopen(port_file, "r");
        if (fp) {
            int ok = fscanf(fp, "%d", &f->port) == 1;
            fclose(fp);
            if (ok)
                return 0;
        }
        usleep(10000);
    }
    return -1;
}

static void fake_stop(fake_llm *f)
{
    kill(f->pid, SIGTERM);
    waitpid(f->pid, NULL, 0);
    char path[128];
    snprintf(path, sizeof path, "%s/port", f->dir);
    unlink(path);
    rmdir(f->dir);
}

/* Discover with these options (JSON); returns n_ctx, *source set, -1 on error.
 * no_num_ctx: as if Parley sent Ollama no num_ctx (the option cannot say so). */
static long long discover_opts(const char *json, const char **source, int no_num_ctx)
{
    parley_options o;
    char *err = NULL;
    if (options_parse(json, &o, &err) != 0) {
        fprintf(stderr, "options: %s\n", err);
        free(err);
        return -2;
    }
    if (no_num_ctx)
        o.num_ctx = 0;
    context_window_info info;
    int rc = context_window_discover(&o, &info, &err);
    options_free(&o);
    *source = info.source;
    if (rc != 0) {
        CHECK(err != NULL);
        free(err);
        return -1;
    }
    CHECK(err == NULL);
    return info.n_ctx;
}

static long long discover(const char *json, const char **source)
{
    return discover_opts(json, source, 0);
}

int main(void)
{
    fake_llm f;
    const char *src = NULL;
    CHECK(fake_start(&f, "12288") == 0);
    char *json = pstr_printf("{\"base_url\":\"http://127.0.0.1:%d/v1\",\"model\":\"fake-model\"}",
                             f.port);
    CHECK(discover(json, &src) == 12288);
    CHECK(src && strcmp(src, "props") == 0);
    free(json);
    /* Ollama: the num_ctx Parley sends, within the model's own length */
    json = pstr_printf("{\"provider\":\"ollama\",\"base_url\":\"http://127.0.0.1:%d\","
                       "\"model\":\"fake-model\",\"num_ctx\":4096}", f.port);
    CHECK(discover(json, &src) == 4096);
    CHECK(src && strcmp(src, "num_ctx") == 0);
    free(json);
    json = pstr_printf("{\"provider\":\"ollama\",\"base_url\":\"http://127.0.0.1:%d\","
                       "\"model\":\"fake-model\",\"num_ctx\":65536}", f.port);
    CHECK(discover(json, &src) == 12288);
    free(json);
    json = pstr_printf("{\"provider\":\"ollama\",\"base_url\":\"http://127.0.0.1:%d\","
                       "\"model\":\"fake-model\"}", f.port);
    CHECK(discover_opts(json, &src, 1) == 12288);
    CHECK(src && strcmp(src, "show") == 0);
    free(json);
    /* Anthropic: nothing to ask */
    json = pstr_printf("{\"provider\":\"anthropic\",\"base_url\":\"http://127.0.0.1:%d\","
                       "\"model\":\"fake-model\",\"api_key\":\"k\"}", f.port);
    CHECK(discover(json, &src) == 0 && src == NULL);
    free(json);
    /* a base_url without /v1 still finds /props at the root; /models there is 404 */
    json = pstr_printf("{\"base_url\":\"http://127.0.0.1:%d\",\"model\":\"fake-model\"}", f.port);
    CHECK(discover(json, &src) == 12288);
    free(json);
    fake_stop(&f);

    /* a server that says nothing: 0, not an error */
    CHECK(fake_start(&f, NULL) == 0);
    json = pstr_printf("{\"base_url\":\"http://127.0.0.1:%d/v1\",\"model\":\"fake-model\"}", f.port);
    CHECK(discover(json, &src) == 0 && src == NULL);
    free(json);
    int port = f.port;
    fake_stop(&f);

    /* nobody listens: an error saying so */
    json = pstr_printf("{\"base_url\":\"http://127.0.0.1:%d/v1\",\"model\":\"fake-model\","
                       "\"connect_timeout_ms\":500}", port);
    CHECK(discover(json, &src) == -1);
    free(json);
    return check_report();
}
