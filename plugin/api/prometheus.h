/*
 * prometheus.h -- the agent's metrics in the Prometheus text exposition format
 * (version 0.0.4), for parley_plugin.metrics_prometheus: what a monitoring
 * system scrapes (the shim serves it at /metrics, docs/shim.md).  The JSON
 * `metrics` stays as it was; this is the same agent seen with labels.
 */
#ifndef PARLEY_PROMETHEUS_H
#define PARLEY_PROMETHEUS_H

#include <parley/plugin.h>

parley_status agent_metrics_prometheus(parley_agent *a, char **out);

#endif
