/*
 * tool_handle.h -- what the host holds for a tool call: not the address of
 * the plugin's handle but a never-reused 64-bit id, looked up in one
 * process-wide registry.  A completion takes the id out of the registry, so
 * a second completion of the same call (a host bug) finds nothing and gets
 * PARLEY_ERR_NOT_FOUND instead of touching freed memory.
 */
#ifndef PARLEY_TOOL_HANDLE_H
#define PARLEY_TOOL_HANDLE_H

#include <parley/plugin.h>

/* Register the plugin's handle; the value to give the host, or NULL on OOM. */
parley_tool_call *tool_handle_register(parley_tool_call *h);

/* The handle behind the host's value, removed from the registry (so this
 * succeeds once per handle), or NULL when unknown or already taken. */
parley_tool_call *tool_handle_take(parley_tool_call *public_value);

#endif
