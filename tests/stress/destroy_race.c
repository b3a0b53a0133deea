/*
 * destroy_race.c -- destroy() while a tool call is outstanding, and the host
 * completes that call from inside another turn's done callback during
 * destroy (plugin.h allows both).  Every turn must end cancelled exactly
 * once, destroy must return, and nothing may touch freed memory (run under
 * ASan in the sanitizer build).  Prints "N passed, N failed".
 *
 *   parley-destroy-race PLUGIN BASE_URL
 */
#include <dlfcn.h>
#include <parley/plugin.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const parley_plugin *P;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static parley_tool_call *held;
static int tool_calls, done_t1, done_t2, cancelled, passed, failed, info_ok;

#define CHECK(c) ((c) ? (void)passed++ : (void)(failed++, fprintf(stderr, "CHECK failed: %s\n", #c)))

static void on_tool(void *hd, parley_tool_call *c, const parley_tool_call_info *info)
{
    (void)hd;
    /* The turn's input reaches the tool, so it can act where the user is. */
    int ok = info->struct_size >= sizeof *info && info->device_id &&
             strcmp(info->device_id, "kitchen-satellite") == 0 && info->language &&
             strcmp(info->language, "en") == 0 && info->context_json &&
             strcmp(info->context_json, "{\"user_id\":\"u1\"}") == 0 && !info->satellite_id &&
             strcmp(info->tool_name, "turn_on") == 0;
    pthread_mutex_lock(&mu);
    info_ok += ok;
    held = c; /* hold it: the host answers later, from T2's done callback */
    tool_calls++;
    pthread_mutex_unlock(&mu);
}

static void on_done(void *ud, const parley_result *r)
{
    pthread_mutex_lock(&mu);
    int is_t2 = strcmp(ud, "T2") == 0;
    if (is_t2)
        done_t2++;
    else
        done_t1++;
    cancelled += r->status == PARLEY_ERR_CANCELLED;
    parley_tool_call *h = is_t2 ? held : NULL;
    if (h)
        held = NULL;
    pthread_mutex_unlock(&mu);
    if (h) /* T1's tool answered while destroy() is ending turns */
        CHECK(P->complete_tool_call(h, "{\"ok\":true}", 0) == PARLEY_OK);
}

static int wait_for_tool_call(void)
{
    for (int i = 0; i < 5000; i++) {
        pthread_mutex_lock(&mu);
        int got = tool_calls;
        pthread_mutex_unlock(&mu);
        if (got)
            return 1;
        usleep(1000);
    }
    return 0;
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
    for (int round = 0; round < 20; round++) {
        parley_host host = {.struct_size = sizeof host, .tool_call = on_tool};
        char opts[512];
        snprintf(opts, sizeof opts,
                 "{\"base_url\":\"%s\",\"model\":\"fake-model\",\"tools\":[{\"name\":\"turn_on\"}]}",
                 argv[2]);
        char *err = NULL;
        parley_agent *a = P->create(&host, opts, &err);
        if (!a) {
            fprintf(stderr, "create: %s\n", err);
            return 2;
        }
        pthread_mutex_lock(&mu);
        tool_calls = done_t1 = done_t2 = cancelled = info_ok = 0;
        held = NULL;
        pthread_mutex_unlock(&mu);

        parley_input t1 = {.struct_size = sizeof t1, .text = "[[tool:turn_on {}]]",
                           .device_id = "kitchen-satellite", .language = "en",
                           .context_json = "{\"user_id\":\"u1\"}"};
        CHECK(P->async_process(a, &t1, on_done, "T1", NULL, NULL) == PARLEY_OK);
        CHECK(wait_for_tool_call());
        pthread_mutex_lock(&mu);
        CHECK(info_ok == 1);
        pthread_mutex_unlock(&mu);
        parley_input t2 = {.struct_size = sizeof t2, .text = "hello [[latency:5000]]"};
        CHECK(P->async_process(a, &t2, on_done, "T2", NULL, NULL) == PARLEY_OK);
        usleep(20000 + 5000 * (round % 5)); /* T2's request under way */
        P->destroy(a);

        pthread_mutex_lock(&mu);
        CHECK(done_t1 == 1 && done_t2 == 1); /* exactly one callback each */
        CHECK(cancelled == 2);
        parley_tool_call *left = held; /* T2 may have ended first: then answer now */
        held = NULL;
        pthread_mutex_unlock(&mu);
        if (left)
            CHECK(P->complete_tool_call(left, "{\"ok\":true}", 0) == PARLEY_OK); /* after destroy: allowed */
    }
    dlclose(so);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
