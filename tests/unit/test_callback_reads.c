/* test_callback_reads.c -- plugin.h's [blocking: store I/O] functions inside a
 * callback (on the agent's worker thread): refused while the store blocks
 * (SQLite here), so a disk wait cannot stall every turn of the agent; allowed
 * with the memory store, which never blocks; allowed from any other thread.
 * The done callback of append_message runs on the worker, with no model. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/agent_api.h"
#include "api/prometheus.h"
#include "check.h"

typedef struct probe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    parley_agent *agent;
    parley_status get, query, metrics, clear, prom; /* what each call answered in the callback */
    char *get_json;
} probe;

static void on_done(void *ud, const parley_result *r)
{
    probe *p = ud;
    (void)r;
    char *out = NULL;
    p->get = agent_history_get(p->agent, "kitchen", &p->get_json);
    p->query = agent_history_query(p->agent, "{}", &out);
    free(out);
    out = NULL;
    p->metrics = agent_metrics(p->agent, &out);
    free(out);
    out = NULL;
    p->prom = agent_metrics_prometheus(p->agent, &out);
    free(out);
    p->clear = agent_history_clear(p->agent, "nobody");
    pthread_mutex_lock(&p->mu);
    p->done = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Append one message to "kitchen" and make the calls from its done callback. */
static void run(const char *options, probe *p)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    char *err = NULL;
    p->agent = agent_create(NULL, options, &err);
    CHECK(p->agent != NULL);
    free(err);
    if (!p->agent)
        return;
    err = NULL;
    CHECK(agent_append_message(p->agent, "{\"conversation_id\":\"kitchen\",\"content\":\"hi\"}",
                               on_done, p, NULL, &err) == PARLEY_OK);
    free(err);
    pthread_mutex_lock(&p->mu);
    while (!p->done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int main(void)
{
    char dir[] = "/tmp/parley-cbreads-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char options[512];
    snprintf(options, sizeof options,
             "{\"base_url\":\"http://127.0.0.1:9/v1\",\"model\":\"m\","
             "\"history_store\":\"sqlite:%s/h.db\"}", dir);

    probe p;
    run(options, &p);
    CHECK(p.get == PARLEY_ERR_INVALID_INPUT);
    CHECK(p.get_json && strstr(p.get_json, "\"field\":\"thread\"") &&
          strstr(p.get_json, "history_get may not be called from inside a callback"));
    CHECK(p.query == PARLEY_ERR_INVALID_INPUT);
    CHECK(p.metrics == PARLEY_ERR_INVALID_INPUT);
    CHECK(p.prom == PARLEY_ERR_INVALID_INPUT);
    CHECK(p.clear == PARLEY_ERR_INVALID_INPUT);
    free(p.get_json);
    /* the same calls from this (a host) thread work */
    char *out = NULL;
    CHECK(agent_history_get(p.agent, "kitchen", &out) == PARLEY_OK);
    CHECK(out && strstr(out, "\"content\":\"hi\""));
    free(out);
    agent_destroy(p.agent);

    /* the memory store never blocks: everything is allowed inside a callback */
    run("{\"base_url\":\"http://127.0.0.1:9/v1\",\"model\":\"m\"}", &p);
    CHECK(p.get == PARLEY_OK);
    CHECK(p.get_json && strstr(p.get_json, "\"content\":\"hi\""));
    CHECK(p.query == PARLEY_OK);
    CHECK(p.metrics == PARLEY_OK);
    CHECK(p.prom == PARLEY_OK);
    CHECK(p.clear == PARLEY_ERR_NOT_FOUND);
    free(p.get_json);
    agent_destroy(p.agent);

    char path[600];
    snprintf(path, sizeof path, "%s/h.db", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/h.db-lock", dir);
    unlink(path);
    rmdir(dir);
    return check_report();
}
