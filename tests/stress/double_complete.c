/*
 * double_complete.c -- a host that completes the same tool call twice (a
 * contract violation, but one a host can make): the second completion must
 * return PARLEY_ERR_NOT_FOUND and touch nothing (run under ASan in the
 * sanitizer build: it was a use-after-free).  Three ways: twice inside the
 * tool_call callback, twice after the turn ended, and once after destroy()
 * then again.  Prints "N passed, N failed".
 *
 *   parley-double-complete PLUGIN BASE_URL
 */
#include <dlfcn.h>
#include <parley/plugin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const parley_plugin *P;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static parley_tool_call *held;
static int answer_inside, done, ok_turns, passed, failed;
static parley_status second_inside = PARLEY_OK;

#define CHECK(c) ((c) ? (void)passed++ : (void)(failed++, fprintf(stderr, "CHECK failed: %s\n", #c)))

static void on_tool(void *hd, parley_tool_call *c, const parley_tool_call_info *info)
{
    (void)hd;
    (void)info;
    pthread_mutex_lock(&mu);
    int inside = answer_inside;
    if (!inside)
        held = c;
    pthread_mutex_unlock(&mu);
    if (inside) {
        parley_status first = P->complete_tool_call(c, "{\"ok\":true}", 0);
        parley_status second = P->complete_tool_call(c, "{\"ok\":false}", 1);
        pthread_mutex_lock(&mu);
        second_inside = first == PARLEY_OK ? second : PARLEY_ERR_INTERNAL;
        pthread_mutex_unlock(&mu);
    }
}

static void on_done(void *ud, const parley_result *r)
{
    (void)ud;
    pthread_mutex_lock(&mu);
    done++;
    ok_turns += r->status == PARLEY_OK;
    pthread_mutex_unlock(&mu);
}

static int wait_until(int *what, int want)
{
    for (int i = 0; i < 20000; i++) {
        pthread_mutex_lock(&mu);
        int got = *what;
        pthread_mutex_unlock(&mu);
        if (got >= want)
            return 1;
        usleep(1000);
    }
    return 0;
}

static int wait_for_held(void)
{
    for (int i = 0; i < 20000; i++) {
        pthread_mutex_lock(&mu);
        int got = held != NULL;
        pthread_mutex_unlock(&mu);
        if (got)
            return 1;
        usleep(1000);
    }
    return 0;
}

static parley_agent *make_agent(const char *base_url, int tool_timeout_ms)
{
    static parley_host host = {.struct_size = sizeof host, .tool_call = on_tool};
    char opts[512];
    snprintf(opts, sizeof opts,
             "{\"base_url\":\"%s\",\"model\":\"fake-model\",\"tools\":[{\"name\":\"turn_on\"}],"
             "\"tool_timeout_ms\":%d}", base_url, tool_timeout_ms);
    char *err = NULL;
    parley_agent *a = P->create(&host, opts, &err);
    if (!a)
        fprintf(stderr, "create: %s\n", err ? err : "?");
    return a;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGIN BASE_URL\n", argv[0]);
        return 2;
    }
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    parley_entry_fn entry = so ? (parley_entry_fn)dlsym(so, PARLEY_ENTRY_SYMBOL) : NULL;
    P = entry ? entry(PARLEY_ABI_VERSION) : NULL;
    if (!P) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 2;
    }
    parley_input in = {.struct_size = sizeof in, .text = "[[tool:turn_on {}]]"};

    /* 1. Twice inside the callback: the first result is used, the second refused. */
    parley_agent *a = make_agent(argv[2], 30000);
    if (!a)
        return 2;
    answer_inside = 1;
    CHECK(P->async_process(a, &in, on_done, NULL, NULL, NULL) == PARLEY_OK);
    CHECK(wait_until(&done, 1));
    CHECK(ok_turns == 1);
    CHECK(second_inside == PARLEY_ERR_NOT_FOUND);

    /* 2. After the turn went on without it (tool timeout): once fine, twice refused. */
    P->destroy(a);
    a = make_agent(argv[2], 50);
    if (!a)
        return 2;
    answer_inside = 0;
    CHECK(P->async_process(a, &in, on_done, NULL, NULL, NULL) == PARLEY_OK);
    CHECK(wait_for_held());
    CHECK(wait_until(&done, 2)); /* tool_timeout_ms passes: the turn ends without the result */
    pthread_mutex_lock(&mu);
    parley_tool_call *late = held;
    held = NULL;
    pthread_mutex_unlock(&mu);
    CHECK(P->complete_tool_call(late, "{\"ok\":true}", 0) == PARLEY_OK);
    CHECK(P->complete_tool_call(late, "{\"ok\":true}", 0) == PARLEY_ERR_NOT_FOUND);

    /* 3. After destroy(): once fine (plugin.h allows it), twice refused. */
    CHECK(P->async_process(a, &in, on_done, NULL, NULL, NULL) == PARLEY_OK);
    CHECK(wait_for_held());
    P->destroy(a);
    pthread_mutex_lock(&mu);
    late = held;
    held = NULL;
    pthread_mutex_unlock(&mu);
    CHECK(P->complete_tool_call(late, "{\"ok\":true}", 0) == PARLEY_OK);
    CHECK(P->complete_tool_call(late, "{\"ok\":true}", 0) == PARLEY_ERR_NOT_FOUND);
    /* A value no call ever had. */
    CHECK(P->complete_tool_call((parley_tool_call *)(uintptr_t)0x7fffffffu, "{}", 0) ==
          PARLEY_ERR_NOT_FOUND);

    /* LeakSanitizer 14 crashes ("Tracer caught signal 11") scanning this
     * thread's dynamic TLS after the plugin (which used TLS on this thread in
     * async_process) is unloaded; the process ends next anyway. */
#if !defined(__SANITIZE_ADDRESS__)
    dlclose(so);
#else
    (void)so;
#endif
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
