/* agent_api.h -- the functions behind the ABI table (agent.c), for entry.c. */
#ifndef PARLEY_AGENT_API_H
#define PARLEY_AGENT_API_H

#include <parley/plugin.h>

#include "store/store.h"

parley_agent *agent_create(const parley_host *host, const char *options_json, char **error);
#ifdef PARLEY_TEST_HOOKS
/* For tests only (parley_core, never parley.so: plugin/CMakeLists.txt): as agent_create,
 * with `backend` (NULL: the one history_store names) opened at the location history_store
 * gives. */
parley_agent *agent_create_with_store(const parley_host *host, const char *options_json,
                                      const store_backend *backend, char **error);
#endif
void agent_destroy(parley_agent *a);
parley_status agent_async_process(parley_agent *a, const parley_input *in, parley_done_fn done,
                                  void *user_data, parley_request_id *request_id, char **error);
parley_status agent_cancel(parley_agent *a, parley_request_id id);
parley_status agent_complete_tool_call(parley_tool_call *h, const char *result, int is_error);
parley_status agent_history_get(parley_agent *a, const char *id, char **out);
parley_status agent_turn_get(parley_agent *a, const char *turn_id, char **out);
parley_status agent_conversations_list(parley_agent *a, char **out);
parley_status agent_history_clear(parley_agent *a, const char *id);
parley_status agent_metrics(parley_agent *a, char **out);
parley_status agent_update_options(parley_agent *a, const char *options_json, char **error);
parley_status agent_history_query(parley_agent *a, const char *query_json, char **out);
parley_status agent_message_get(parley_agent *a, const char *message_id, char **out);
parley_status agent_history_get_by(parley_agent *a, const char *selector_json, char **out);
parley_status agent_history_clear_by(parley_agent *a, const char *selector_json);
parley_status agent_conversations_list_by(parley_agent *a, const char *filter_json, char **out);
parley_status agent_message_find(parley_agent *a, const char *selector_json, char **out);
parley_status agent_set_interface_message_id(parley_agent *a, const char *turn_id,
                                             const char *interface_message_id);
parley_status agent_append_message(parley_agent *a, const char *message_json, parley_done_fn done,
                                   void *user_data, parley_request_id *request_id, char **error);

#endif
