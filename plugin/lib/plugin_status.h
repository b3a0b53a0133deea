/* plugin_status.h -- the public status codes, for modules that need nothing else of the ABI. */
#ifndef PARLEY_PLUGIN_STATUS_H
#define PARLEY_PLUGIN_STATUS_H

#include <parley/plugin.h>

/* Stable lower-case name of a status ("timeout"); never NULL. */
const char *status_name(parley_status s);

#endif
