"""Stand-ins for homeassistant/helpers/llm.py, helpers/intent.py (the
IntentResponse the Assist tools return) and helpers/json.py, read from
home-assistant/core dev: llm.py at 004be187e720f879eace3c615f55204519f21859
for LLMContext/ToolInput/Tool/APIInstance/API and the prompts; ToolResult
as conversation/chat_log.py at 01bc0afafea1a7fce60ca97305d6e3e234bbbcf9 uses
it (ToolResult(data=..., error=True), asdict(result)); json.py at
014a60dd55f8cbf3ae773affef1c41ed403dda87.

As in HA 2026, APIInstance.async_call_tool validates the arguments with
the tool's schema (an Invalid is raised, the chat log would turn it into an
error result) and returns llm.ToolResult, never the tool's dict; LEGACY
switches to the older contract (the dict itself, no ToolResult)."""
import dataclasses
import datetime
import enum
import json
from pathlib import Path

from . import core, schemas

LEGACY = [False]   # True: Home Assistant before ToolResult (2025)

LLM_API_ASSIST = "assist"

DATE_TIME_PROMPT = (
    'Current time is {{ now().strftime("%H:%M:%S") }}. '
    'Today\'s date is {{ now().strftime("%Y-%m-%d") }}.\n'
)

DEFAULT_INSTRUCTIONS_PROMPT = """You are a voice assistant for Home Assistant.
Answer questions about the world truthfully.
Answer in plain text. Keep it simple and to the point.
"""


@dataclasses.dataclass(slots=True)
class LLMContext:
    platform: str
    context: object
    language: str | None
    assistant: str | None
    device_id: str | None


@dataclasses.dataclass(slots=True)
class ToolInput:
    tool_name: str
    tool_args: dict
    id: str = dataclasses.field(default_factory=core.ulid_now)
    external: bool = False


@dataclasses.dataclass(slots=True)
class ToolResult:
    data: object
    error: bool = False


class Tool:
    name: str
    description: str | None = None
    parameters = schemas.Schema({})

    async def async_call(self, hass, tool_input, llm_context):
        raise NotImplementedError


@dataclasses.dataclass
class APIInstance:
    api: object
    api_prompt: str
    llm_context: LLMContext
    tools: list
    custom_serializer: object = None

    async def async_call_tool(self, tool_input: ToolInput):
        from homeassistant.components.conversation import trace  # noqa: PLC0415
        trace.async_conversation_trace_append(
            trace.ConversationTraceEventType.TOOL_CALL,
            {"tool_name": tool_input.tool_name, "tool_args": tool_input.tool_args})
        for tool in self.tools:
            if tool.name == tool_input.tool_name:
                break
        else:
            raise core.HomeAssistantError(f'Tool "{tool_input.tool_name}" not found')
        tool_input = ToolInput(tool_name=tool_input.tool_name,
                               tool_args=tool.parameters(tool_input.tool_args),
                               id=tool_input.id, external=tool_input.external)
        data = await tool.async_call(self.api.hass, tool_input, self.llm_context)
        return data if LEGACY[0] else ToolResult(data=data)


@dataclasses.dataclass(slots=True, kw_only=True)
class API:
    hass: object
    id: str
    name: str

    async def async_get_api_instance(self, llm_context):
        raise NotImplementedError


def _apis(hass):
    return hass.data.setdefault("llm_apis", {})


def async_register_api(hass, api):
    apis = _apis(hass)
    if api.id in apis:
        raise core.HomeAssistantError(f"API {api.id} is already registered")
    apis[api.id] = api
    return lambda: apis.pop(api.id)


def async_get_apis(hass):
    return list(_apis(hass).values())


async def async_get_api(hass, api_id, llm_context):
    apis = _apis(hass)
    ids = [api_id] if isinstance(api_id, str) else list(api_id)
    for key in ids:
        if key not in apis:
            raise core.HomeAssistantError(f"API {key} not found")
    if len(ids) != 1:
        raise core.HomeAssistantError("the stand-in merges no APIs")
    return await apis[ids[0]].async_get_api_instance(llm_context)


def selector_serializer(schema):
    return schema


class IntentResponseDict(dict):
    """A tool result made from an intent response (the original kept)."""

    def __init__(self, intent_response):
        if not isinstance(intent_response, IntentResponse):
            super().__init__(intent_response)
            return
        result = intent_response.as_dict()
        del result["language"]
        del result["card"]
        super().__init__(result)
        self.original = intent_response


# -- helpers/intent.py -------------------------------------------------------------

class IntentResponseErrorCode(enum.StrEnum):
    NO_INTENT_MATCH = "no_intent_match"
    NO_VALID_TARGETS = "no_valid_targets"
    FAILED_TO_HANDLE = "failed_to_handle"
    UNKNOWN = "unknown"


class IntentResponseType(enum.StrEnum):
    ACTION_DONE = "action_done"
    QUERY_ANSWER = "query_answer"
    ERROR = "error"


class IntentResponse:
    def __init__(self, language, intent=None):
        self.language = language
        self.intent = intent
        self.speech = {}
        self.card = {}
        self.error_code = None
        self.response_type = IntentResponseType.ACTION_DONE
        self.success_results = []
        self.failed_results = []
        self.matched_states = []

    def async_set_speech(self, speech, speech_type="plain", extra_data=None):
        self.speech[speech_type] = {"speech": speech, "extra_data": extra_data}

    def async_set_error(self, code, message):
        self.response_type = IntentResponseType.ERROR
        self.error_code = code
        self.async_set_speech(message)

    def async_set_results(self, success_results, failed_results=None):
        self.success_results = list(success_results)
        self.failed_results = list(failed_results or [])

    def as_dict(self):
        data = {"success": self.success_results, "failed": self.failed_results}
        if self.response_type == IntentResponseType.ERROR:
            data = {"code": self.error_code}
        return {"speech": self.speech, "card": self.card, "language": self.language,
                "response_type": self.response_type.value, "data": data}


# -- helpers/json.py -----------------------------------------------------------------

def json_encoder_default(obj):
    if hasattr(obj, "json_fragment"):
        return obj.json_fragment
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, (datetime.date, datetime.time, datetime.datetime)):
        return obj.isoformat()
    if dataclasses.is_dataclass(obj):  # orjson serialises dataclasses itself
        return dataclasses.asdict(obj)
    raise TypeError


def json_dumps(data) -> str:
    """orjson.dumps(data, option=OPT_NON_STR_KEYS, default=json_encoder_default):
    compact, UTF-8."""
    return json.dumps(data, default=json_encoder_default, separators=(",", ":"),
                      ensure_ascii=False)
