/*
 * minimal_host.c -- the smallest complete Parley host: load the plugin,
 * create an agent, run one turn, wait for its result, clean up.
 *
 *   cc -I include minimal_host.c -ldl -lpthread -o minimal_host
 *   ./minimal_host build/plugin/parley.so '{"model":"llama3.2"}' "Hello there"
 */
#include <dlfcn.h>
#include <parley/plugin.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The turn's outcome travels from the worker thread to main through this. */
struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int ok;
};

static void on_done(void *user_data, const parley_result *r)
{
    struct waiter *w = user_data;
    /* r and its strings are valid only during this callback: print (or copy) now. */
    if (r->status == PARLEY_OK)
        printf("%s\n", r->response);
    else
        fprintf(stderr, "turn failed: %s\n", r->error_message);
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->ok = r->status == PARLEY_OK;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void on_log(void *host_data, parley_log_level level, const char *message)
{
    (void)host_data;
    if (level <= PARLEY_LOG_WARN)
        fprintf(stderr, "parley: %s\n", message);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PLUGIN OPTIONS_JSON TEXT\n", argv[0]);
        return 2;
    }
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    parley_entry_fn entry = so ? (parley_entry_fn)dlsym(so, PARLEY_ENTRY_SYMBOL) : NULL;
    const parley_plugin *p = entry ? entry(PARLEY_ABI_VERSION) : NULL;
    if (!p) {
        fprintf(stderr, "cannot load a compatible plugin from %s\n", argv[1]);
        return 2;
    }

    parley_host host = {.struct_size = sizeof host, .log = on_log};
    char *error = NULL;
    parley_agent *agent = p->create(&host, argv[2], &error);
    if (!agent) {
        fprintf(stderr, "create failed: %s\n", error);
        p->free_string(error);
        return 1;
    }

    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    parley_input in = {.struct_size = sizeof in, .text = argv[3]};
    if (p->async_process(agent, &in, on_done, &w, NULL, &error) != PARLEY_OK) {
        fprintf(stderr, "not accepted: %s\n", error);
        p->free_string(error);
        p->destroy(agent);
        return 1;
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);

    p->destroy(agent);
    dlclose(so);
    return w.ok ? 0 : 1;
}
