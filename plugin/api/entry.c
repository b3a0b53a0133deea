/* entry.c -- the plugin's one exported symbol and its function table. */
#include <parley/plugin.h>
#include <stdlib.h>

#include "api/agent_api.h"
#include "api/connection_check.h"
#include "api/last_error.h"
#include "api/personas_live.h"
#include "api/prometheus.h"
#include "config/options.h"
#include "provider/provider.h"
#include "lib/plugin_status.h"

static char *plugin_options_schema(void) { return provider_options_schema(); }
static void plugin_free_string(char *s) { free(s); }

static const parley_plugin PLUGIN = {
    .struct_size = sizeof(parley_plugin),
    .abi_version = PARLEY_ABI_VERSION,
    .name = "parley",
    .version = PARLEY_VERSION,
    .create = agent_create,
    .destroy = agent_destroy,
    .async_process = agent_async_process,
    .cancel = agent_cancel,
    .complete_tool_call = agent_complete_tool_call,
    .options_schema = plugin_options_schema,
    .free_string = plugin_free_string,
    .status_name = status_name,
    .history_get = agent_history_get,
    .turn_get = agent_turn_get,
    .conversations_list = agent_conversations_list,
    .history_clear = agent_history_clear,
    .metrics = agent_metrics,
    .check_connection = connection_check,
    .update_options = agent_update_options,
    .history_query = agent_history_query,
    .message_get = agent_message_get,
    .history_get_by = agent_history_get_by,
    .history_clear_by = agent_history_clear_by,
    .conversations_list_by = agent_conversations_list_by,
    .message_find = agent_message_find,
    .set_interface_message_id = agent_set_interface_message_id,
    .append_message = agent_append_message,
    .last_error = last_error_copy,
    .persona_put = agent_persona_put,
    .persona_remove = agent_persona_remove,
    .metrics_prometheus = agent_metrics_prometheus,
};

PARLEY_EXPORT const parley_plugin *parley_plugin_entry(uint32_t host_abi_version)
{
    return host_abi_version == PARLEY_ABI_VERSION ? &PLUGIN : NULL;
}
