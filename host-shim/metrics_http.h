/*
 * metrics_http.h -- --metrics-listen ADDR:PORT: the agent's Prometheus
 * metrics (parley_plugin.metrics_prometheus) served at GET /metrics, so a
 * real Prometheus can scrape the shim.  Loopback only: the numbers say what
 * the household's assistant did, which is nobody else's business, and a
 * reverse proxy is the place to decide otherwise.
 */
#ifndef PARLEY_SHIM_METRICS_HTTP_H
#define PARLEY_SHIM_METRICS_HTTP_H

/* Check "ADDR:PORT" (127.x.x.x, localhost or [::1]; port 1-65535): 0, or -1 with *err. */
int metrics_http_parse(const char *spec, char **err);

/* Listen on the address metrics_http_parse accepted and serve g_shim.agent's metrics from
 * a thread: 0, or -1 with *err (malloc'd).  Call after create(). */
int metrics_http_start(const char *spec, char **err);

/* Stop serving (before destroy()).  A no-op when not started. */
void metrics_http_stop(void);

#endif
