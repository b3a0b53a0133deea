"""Stand-ins for the Home Assistant modules the example integration imports
(Home Assistant cannot be installed on the build machines).  Each file says
which Home Assistant source file, and which commit of it, it follows; the
names are Home Assistant's.  install() puts them in sys.modules under their
Home Assistant names; legacy(True) switches to Home Assistant before
llm.ToolResult and probatio (2025: tool results are dicts, schemas
voluptuous)."""
import sys
import types

from . import ai_task, chat, core, entries, llm, schemas

_TOOL_RESULT = llm.ToolResult


def _module(name, **attrs):
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)
    return mod


def _names(module, *names):
    return {n: getattr(module, n) for n in names}


def install():
    if "homeassistant" in sys.modules:
        return
    _module("homeassistant")
    try:
        import voluptuous  # noqa: F401  -- the real one, if installed
    except ImportError:
        _module("voluptuous", **_names(schemas, "Schema", "Required", "Optional", "In",
                                       "Coerce", "All", "Invalid", "MultipleInvalid",
                                       "PREVENT_EXTRA", "ALLOW_EXTRA", "Marker"))
    _module("probatio", Schema=schemas.Schema, Invalid=schemas.Invalid,
            to_openapi=schemas.to_openapi)
    _module("voluptuous_openapi", convert=schemas.convert)
    _module("homeassistant.const", **_names(core, "MATCH_ALL", "CONF_NAME", "CONF_MODEL",
                                            "CONF_URL", "CONF_API_KEY", "CONF_LLM_HASS_API",
                                            "EVENT_HOMEASSISTANT_STOP", "STATE_UNKNOWN",
                                            "STATE_UNAVAILABLE", "Platform"))
    _module("homeassistant.core", **_names(core, "HomeAssistant", "Context", "ServiceCall",
                                           "callback", "HassJob", "HassJobType"))
    _module("homeassistant.exceptions", **_names(core, "HomeAssistantError", "TemplateError",
                                                 "ConfigEntryError", "ConfigEntryNotReady",
                                                 "ServiceValidationError"))
    _module("homeassistant.data_entry_flow", **_names(entries, "FlowResultType", "AbortFlow",
                                                      "FlowHandler", "UnknownHandler"))
    _module("homeassistant.config_entries",
            **_names(entries, "ConfigEntry", "ConfigEntryState", "ConfigFlow",
                     "ConfigSubentry", "ConfigSubentryFlow", "ConfigEntries", "HANDLERS"),
            ConfigFlowResult=dict, SubentryFlowResult=dict)
    _module("homeassistant.helpers")
    _module("homeassistant.helpers.config_validation",
            **_names(schemas, "string", "entity_ids", "config_entry_only_config_schema", "url"))
    _module("homeassistant.helpers.selector",
            **_names(schemas, "SelectOptionDict", "SelectSelector", "SelectSelectorConfig",
                     "SelectSelectorMode", "NumberSelector", "NumberSelectorConfig",
                     "NumberSelectorMode", "TextSelector", "TextSelectorConfig",
                     "TextSelectorType", "TemplateSelector", "BooleanSelector"))
    sys.modules["homeassistant.helpers.llm"] = llm
    sys.modules["homeassistant.helpers"].llm = llm
    _module("homeassistant.helpers.intent", **_names(llm, "IntentResponse",
                                                     "IntentResponseErrorCode",
                                                     "IntentResponseType"))
    _module("homeassistant.helpers.json", json_dumps=llm.json_dumps,
            json_encoder_default=llm.json_encoder_default)
    _module("homeassistant.helpers.chat_session",
            **_names(chat, "ChatSession", "async_get_chat_session", "CONVERSATION_TIMEOUT"))
    _module("homeassistant.helpers.event", async_call_later=core.async_call_later)
    _module("homeassistant.helpers.entity", Entity=entries.Entity)
    _module("homeassistant.helpers.restore_state", RestoreEntity=entries.RestoreEntity)
    _module("homeassistant.helpers.device_registry",
            **_names(entries, "DeviceInfo", "DeviceEntryType"))
    _module("homeassistant.components")
    _module("homeassistant.components.conversation",
            **_names(chat, "ConversationInput", "ConversationResult", "ConversationEntityFeature",
                     "ChatLog", "SystemContent", "UserContent", "AssistantContent",
                     "ToolResultContent", "Attachment", "ConverseError", "ChatLogEventType",
                     "async_get_chat_log", "async_subscribe_chat_logs",
                     "async_get_result_from_chat_log", "trace"),
            ConversationEntity=chat.make_entity_class(entries.RestoreEntity),
            Content=object, AssistantContentDeltaDict=dict)
    _module("homeassistant.components.ai_task",
            **_names(ai_task, "AITaskEntityFeature", "GenDataTask", "GenDataTaskResult",
                     "DEFAULT_SYSTEM_PROMPT", "async_generate_data"),
            AITaskEntity=ai_task.make_entity_class(entries.RestoreEntity))


def legacy(on: bool) -> None:
    """Home Assistant before ToolResult (2025) or the current one."""
    llm.LEGACY[0] = on
    conv = sys.modules["homeassistant.components.conversation"]
    if on:
        if hasattr(llm, "ToolResult"):
            del llm.ToolResult
        conv.ToolResultContent = chat.LegacyToolResultContent
    else:
        llm.ToolResult = _TOOL_RESULT
        conv.ToolResultContent = chat.ToolResultContent
