"""The few Home Assistant names the example integration uses, as small
stand-ins (Home Assistant itself cannot be installed here).  Signatures follow
home-assistant/core: components/conversation (ConversationInput,
ConversationResult, ChatLog, AssistantContent, ConverseError),
helpers/llm.py (ToolInput, APIInstance), helpers/intent.py (IntentResponse)."""
import dataclasses
import enum
import sys
import types


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)
    return mod


@dataclasses.dataclass
class Context:
    user_id: object = None


@dataclasses.dataclass
class LLMContext:
    platform: str
    context: object
    language: object
    assistant: str
    device_id: object


@dataclasses.dataclass
class ConversationInput:
    text: str
    context: Context
    conversation_id: object
    device_id: object
    satellite_id: object
    language: str
    agent_id: str
    extra_system_prompt: object = None

    def as_llm_context(self, conversing_domain):
        return LLMContext(conversing_domain, self.context, self.language, "conversation",
                          self.device_id)


@dataclasses.dataclass
class ConversationResult:
    response: object
    conversation_id: object = None
    continue_conversation: bool = False


@dataclasses.dataclass
class AssistantContent:
    agent_id: str
    content: object = None
    role: str = "assistant"


@dataclasses.dataclass
class SystemContent:
    content: str
    role: str = "system"


class ConverseError(Exception):
    def as_conversation_result(self):
        return ConversationResult(response=None)


@dataclasses.dataclass
class ToolInput:
    tool_name: str
    tool_args: dict
    id: str = "generated"
    external: bool = False


class IntentResponseErrorCode(str, enum.Enum):
    UNKNOWN = "unknown"


class IntentResponse:
    def __init__(self, language):
        self.language = language
        self.speech = None
        self.error = None

    def async_set_speech(self, speech):
        self.speech = speech

    def async_set_error(self, code, message):
        self.error = (code, message)


class ConversationEntityFeature(enum.IntFlag):
    CONTROL = 1


class ConversationEntity:
    _attr_supported_features = ConversationEntityFeature(0)


class ConfigEntry:
    def __init__(self, data, options=None, entry_id="entry1"):
        self.data, self.options, self.entry_id = data, options or {}, entry_id
        self.runtime_data = None


class ConfigEntryError(Exception):
    pass


def install():
    if "homeassistant" in sys.modules:
        return
    _module("homeassistant")
    _module("homeassistant.const", MATCH_ALL="*",
            Platform=enum.Enum("Platform", {"CONVERSATION": "conversation"}))
    _module("homeassistant.core", HomeAssistant=object, Context=Context)
    _module("homeassistant.exceptions", ConfigEntryError=ConfigEntryError)
    _module("homeassistant.config_entries", ConfigEntry=ConfigEntry, ConfigFlow=object)
    _module("homeassistant.components")
    _module("homeassistant.components.conversation", ConversationEntity=ConversationEntity,
            ConversationEntityFeature=ConversationEntityFeature,
            ConversationInput=ConversationInput, ConversationResult=ConversationResult,
            AssistantContent=AssistantContent, ConverseError=ConverseError, ChatLog=object)
    _module("homeassistant.helpers")
    _module("homeassistant.helpers.intent", IntentResponse=IntentResponse,
            IntentResponseErrorCode=IntentResponseErrorCode)
    _module("homeassistant.helpers.llm", ToolInput=ToolInput, APIInstance=object, Tool=object,
            LLMContext=LLMContext)
    # voluptuous_openapi.convert: the stand-in tools already carry JSON Schema.
    _module("voluptuous_openapi", convert=lambda schema, custom_serializer=None: schema)
