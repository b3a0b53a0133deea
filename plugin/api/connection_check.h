/*
 * connection_check.h -- "does this configuration reach a server?", for a
 * setup screen: one blocking GET of the server's model list, with errors a
 * person can act on.  Needs no agent.  Behind parley_plugin.check_connection.
 */
#ifndef PARLEY_CONNECTION_CHECK_H
#define PARLEY_CONNECTION_CHECK_H

#include "lib/plugin_status.h"

/* PARLEY_OK: *out_json = {"ok":true,"url":...,"models":[...]}.  Otherwise
 * *error (malloc'd) says what is wrong and what to try.  See plugin.h. */
parley_status connection_check(const char *options_json, char **out_json, char **error);

#endif
