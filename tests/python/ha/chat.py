"""Stand-ins for homeassistant/components/conversation/ (chat_log.py at
01bc0afafea1a7fce60ca97305d6e3e234bbbcf9, models.py at
04bcd6a56baf45fa3478ffccbbee2a2e5ece7b3e, entity.py at
2be4e07ea86d353ab3b8f238950f4f58bedf7ded, util.py's
async_get_result_from_chat_log as in the 2026 util.py (the one with
async_move_agent_to_subentry), reading ToolResultContent.result as core code
must once tool_result is deprecated, trace.py) and
homeassistant/helpers/chat_session.py at
16fefdc65e867796ec0f2fc7e265b4f9dbd86ab0.

Kept as HA has them: a session unused for 5 minutes is dropped when the
cleanup timer fires, and an unknown ULID gets a new one (so nothing outlives
a restart); the chat log is copied per turn and saved only if an assistant
message was added; async_add_assistant_content_without_tools refuses tool
calls that are not external; the delta stream starts a new message at every
"role" and runs non-external tool calls itself; subscribers see every
content added; the result comes from the last assistant message, with the
intent response of the last Assist tool result."""
import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import enum
from dataclasses import asdict, dataclass, field, replace

from . import core, llm

# -- helpers/chat_session.py ---------------------------------------------------------

CONVERSATION_TIMEOUT = datetime.timedelta(minutes=5)
current_session = contextvars.ContextVar("current_session", default=None)


@dataclass
class ChatSession:
    conversation_id: str
    last_updated: datetime.datetime = field(default_factory=core.utcnow)
    _cleanup_callbacks: list = field(default_factory=list)

    def async_updated(self):
        self.last_updated = core.utcnow()

    def async_on_cleanup(self, cb):
        self._cleanup_callbacks.append(cb)

    def async_cleanup(self):
        for cb in self._cleanup_callbacks:
            cb()
        self._cleanup_callbacks.clear()


class SessionCleanup:
    unsub = None

    def __init__(self, hass):
        self.hass = hass
        hass.bus.async_listen_once(core.EVENT_HOMEASSISTANT_STOP, self._on_hass_stop)
        self.cleanup_job = core.HassJob(self._cleanup, "chat_session_cleanup",
                                        job_type=core.HassJobType.Callback)

    def schedule(self):
        if self.unsub:
            return
        self.unsub = core.async_call_later(self.hass, CONVERSATION_TIMEOUT.total_seconds() + 1,
                                           self.cleanup_job)

    def _on_hass_stop(self, event):
        if self.unsub:
            self.unsub()
        self.unsub = None

    def _cleanup(self, now):
        self.unsub = None
        all_sessions = self.hass.data["chat_session"]
        for conversation_id, session in list(all_sessions.items()):
            if session.last_updated + CONVERSATION_TIMEOUT < now:
                del all_sessions[conversation_id]
                session.async_cleanup()
        if all_sessions:
            self.schedule()


@contextlib.contextmanager
def async_get_chat_session(hass, conversation_id=None):
    if session := current_session.get():
        if session.conversation_id == conversation_id:
            yield session
            return
        session = None
    all_sessions = hass.data.get("chat_session")
    if all_sessions is None:
        all_sessions = hass.data["chat_session"] = {}
        hass.data["chat_session_cleanup"] = SessionCleanup(hass)
    if conversation_id is None:
        conversation_id = core.ulid_now()
    elif conversation_id in all_sessions:
        session = all_sessions[conversation_id]
    else:
        try:
            core.ulid_to_bytes(conversation_id)
            conversation_id = core.ulid_now()
        except ValueError:
            pass
    if session is None:
        session = ChatSession(conversation_id)
    current_session.set(session)
    yield session
    current_session.set(None)
    session.last_updated = core.utcnow()
    all_sessions[conversation_id] = session
    hass.data["chat_session_cleanup"].schedule()


# -- conversation/trace.py ------------------------------------------------------------

class trace:  # noqa: N801 -- the module conversation.trace
    class ConversationTraceEventType(enum.StrEnum):
        ASYNC_PROCESS = "async_process"
        AGENT_DETAIL = "agent_detail"
        TOOL_CALL = "tool_call"

    EVENTS = []   # (event type, data) of every trace append, oldest first

    @staticmethod
    def async_conversation_trace_append(event_type, event_data):
        trace.EVENTS.append((event_type, event_data))


# -- conversation/const.py, models.py -----------------------------------------------------

DOMAIN = "conversation"


class ConversationEntityFeature(enum.IntFlag):
    CONTROL = 1


class ChatLogEventType(enum.StrEnum):
    INITIAL_STATE = "initial_state"
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    CONTENT_ADDED = "content_added"


@dataclass(slots=True)
class ConversationInput:
    text: str
    context: core.Context
    conversation_id: str | None
    device_id: str | None
    satellite_id: str | None
    language: str
    agent_id: str
    extra_system_prompt: str | None = None

    def as_llm_context(self, conversing_domain):
        return llm.LLMContext(platform=conversing_domain, context=self.context,
                              language=self.language, assistant=DOMAIN,
                              device_id=self.device_id)


@dataclass(slots=True)
class ConversationResult:
    response: object
    conversation_id: str | None = None
    continue_conversation: bool = False


# -- conversation/chat_log.py ----------------------------------------------------------------

current_chat_log = contextvars.ContextVar("current_chat_log", default=None)


def async_subscribe_chat_logs(hass, callback_func):
    subscriptions = hass.data.setdefault("conversation_chat_log_subscriptions", [])
    subscriptions.append(callback_func)
    return lambda: subscriptions.remove(callback_func)


def _notify(hass, conversation_id, event_type, data):
    for callback_func in hass.data.get("conversation_chat_log_subscriptions", []):
        callback_func(conversation_id, event_type, data)


class ConverseError(core.HomeAssistantError):
    def __init__(self, message, conversation_id, response):
        super().__init__(message)
        self.conversation_id = conversation_id
        self.response = response

    def as_conversation_result(self):
        return ConversationResult(response=self.response, conversation_id=self.conversation_id)


@dataclass(frozen=True)
class SystemContent:
    role: str = field(init=False, default="system")
    content: str = ""
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    def as_dict(self):
        return {"role": self.role, "content": self.content, "created": self.created}


@dataclass(frozen=True)
class Attachment:
    media_content_id: str
    mime_type: str
    path: object


@dataclass(frozen=True)
class UserContent:
    role: str = field(init=False, default="user")
    content: str = ""
    attachments: list | None = field(default=None)
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    def as_dict(self):
        return {"role": self.role, "content": self.content, "created": self.created}


@dataclass(frozen=True)
class AssistantContent:
    role: str = field(init=False, default="assistant")
    agent_id: str = ""
    content: str | None = None
    thinking_content: str | None = None
    tool_calls: list | None = None
    native: object = None
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    def as_dict(self):
        result = {"role": self.role, "agent_id": self.agent_id, "created": self.created}
        if self.content:
            result["content"] = self.content
        if self.thinking_content:
            result["thinking_content"] = self.thinking_content
        if self.tool_calls:
            result["tool_calls"] = self.tool_calls
        return result


@dataclass(frozen=True, kw_only=True)
class ToolResultContent:
    role: str = field(init=False, default="tool_result")
    agent_id: str
    tool_call_id: str
    tool_name: str
    result: llm.ToolResult
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    @property
    def tool_result(self):
        raise AssertionError("ToolResultContent.tool_result is deprecated: use .result")

    def as_dict(self):
        return {"role": self.role, "agent_id": self.agent_id, "tool_call_id": self.tool_call_id,
                "tool_name": self.tool_name, "result": asdict(self.result),
                "tool_result": self.result.data, "created": self.created}


@dataclass(frozen=True, kw_only=True)
class LegacyToolResultContent:
    """ToolResultContent before ToolResult (2025): tool_result is the data."""
    role: str = field(init=False, default="tool_result")
    agent_id: str
    tool_call_id: str
    tool_name: str
    tool_result: dict
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    def as_dict(self):
        return {"role": self.role, "agent_id": self.agent_id, "tool_call_id": self.tool_call_id,
                "tool_name": self.tool_name, "tool_result": self.tool_result}


def _result_class():
    return LegacyToolResultContent if llm.LEGACY[0] else ToolResultContent


def _make_result(agent_id, call_id, name, data, error=False):
    if llm.LEGACY[0]:
        return LegacyToolResultContent(agent_id=agent_id, tool_call_id=call_id, tool_name=name,
                                       tool_result=data)
    return ToolResultContent(agent_id=agent_id, tool_call_id=call_id, tool_name=name,
                             result=data if isinstance(data, llm.ToolResult)
                             else llm.ToolResult(data=data, error=error))


@dataclass
class ChatLog:
    hass: object
    conversation_id: str
    content: list = field(default_factory=lambda: [SystemContent(content="")])
    extra_system_prompt: str | None = None
    llm_api: object = None
    delta_listener: object = None
    llm_input_provided_index = 0
    created: datetime.datetime = field(init=False, default_factory=core.utcnow)

    @property
    def continue_conversation(self):
        if not self.content:
            return False
        last = self.content[-1]
        return (last.role == "assistant" and last.content is not None
                and last.content.strip().endswith(("?", ";", "？")))

    @property
    def unresponded_tool_results(self):
        return self.content[-1].role == "tool_result"

    def _added(self, content):
        self.content.append(content)
        _notify(self.hass, self.conversation_id, ChatLogEventType.CONTENT_ADDED,
                {"content": content.as_dict()})

    def async_add_user_content(self, content):
        self._added(content)

    def async_add_assistant_content_without_tools(self, content):
        if (isinstance(content, AssistantContent) and content.tool_calls is not None
                and any(not tool_call.external for tool_call in content.tool_calls)):
            raise ValueError("Non-external tool calls not allowed")
        self._added(content)

    async def async_add_assistant_content(self, content, /, tool_call_tasks=None):
        self.content.append(content)
        if (not isinstance(content, AssistantContent) or content.tool_calls is None
                or all(tool_call.external for tool_call in content.tool_calls)):
            return
        if self.llm_api is None:
            raise ValueError("No LLM API configured")
        tool_call_tasks = tool_call_tasks or {}
        for tool_input in content.tool_calls:
            if tool_input.id not in tool_call_tasks and not tool_input.external:
                tool_call_tasks[tool_input.id] = self.hass.async_create_task(
                    self.llm_api.async_call_tool(tool_input))
        for tool_input in content.tool_calls:
            if tool_input.external:
                continue
            try:
                result = await tool_call_tasks[tool_input.id]
            except core.HomeAssistantError as e:
                data = {"error": type(e).__name__}
                if str(e):
                    data["error_text"] = str(e)
                result = llm.ToolResult(data=data, error=True)
            response = _make_result(content.agent_id, tool_input.id, tool_input.tool_name, result)
            self._added(response)
            yield response

    async def async_add_delta_content_stream(self, agent_id, stream):
        current_content, current_thinking, current_native, current_calls = None, "", None, []
        tool_call_tasks = {}

        def message():
            return AssistantContent(agent_id=agent_id, content=current_content,
                                    thinking_content=current_thinking or None,
                                    tool_calls=current_calls or None, native=current_native)

        async for delta in stream:
            if "role" not in delta:
                if (text := delta.get("content")) is not None:
                    current_content = (current_content or "") + text
                if thinking := delta.get("thinking_content"):
                    current_thinking += thinking
                if native := delta.get("native"):
                    if current_native is not None:
                        raise RuntimeError("Native content already set, cannot overwrite")
                    current_native = native
                if calls := delta.get("tool_calls"):
                    current_calls += calls
                    for call in calls:
                        if not call.external:
                            if self.llm_api is None:
                                raise ValueError("No LLM API configured")
                            tool_call_tasks[call.id] = self.hass.async_create_task(
                                self.llm_api.async_call_tool(call))
                continue
            if current_content is not None or current_thinking or current_calls or current_native:
                content = message()
                yield content
                async for result in self.async_add_assistant_content(
                        content, tool_call_tasks=tool_call_tasks):
                    yield result
                current_content, current_thinking, current_native, current_calls = \
                    None, "", None, []
            if delta["role"] == "assistant":
                current_content = delta.get("content")
                current_thinking = delta.get("thinking_content") or ""
                current_calls = delta.get("tool_calls") or []
                current_native = delta.get("native")
            elif delta["role"] == "tool_result":
                if llm.LEGACY[0]:
                    content = _make_result(agent_id, delta["tool_call_id"], delta["tool_name"],
                                           delta["tool_result"])
                else:
                    result = delta.get("result")
                    if result is None:
                        raise AssertionError("tool_result deltas carry `result` (ToolResult)")
                    content = _make_result(agent_id, delta["tool_call_id"], delta["tool_name"],
                                           result)
                yield content
                self.async_add_assistant_content_without_tools(content)
            else:
                raise ValueError("Only assistant and tool_result roles expected."
                                 f" Got {delta['role']}")
        if current_content is not None or current_thinking or current_calls or current_native:
            content = message()
            yield content
            async for result in self.async_add_assistant_content(
                    content, tool_call_tasks=tool_call_tasks):
                yield result

    async def async_provide_llm_data(self, llm_context, user_llm_hass_api=None,
                                     user_llm_prompt=None, user_extra_system_prompt=None):
        from homeassistant.helpers import intent  # noqa: PLC0415
        llm_api = None
        if user_llm_hass_api:
            try:
                llm_api = await llm.async_get_api(self.hass, user_llm_hass_api, llm_context)
            except core.HomeAssistantError as err:
                response = intent.IntentResponse(language=llm_context.language or "")
                response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN,
                                         "Error preparing LLM API")
                raise ConverseError(f"Error getting LLM API {user_llm_hass_api}",
                                    conversation_id=self.conversation_id,
                                    response=response) from err
        user_name = None
        if llm_context.context and llm_context.context.user_id and (
                user := await self.hass.auth.async_get_user(llm_context.context.user_id)):
            user_name = user.name
        parts = [render(self.hass, user_llm_prompt or llm.DEFAULT_INSTRUCTIONS_PROMPT,
                        user_name)]
        if llm_api:
            parts.append(llm_api.api_prompt)
        tools = llm_api.tools if llm_api else []
        if not any(tool.name.endswith("GetDateTime") for tool in tools):
            parts.append(render(self.hass, llm.DATE_TIME_PROMPT, user_name))
        if extra := (user_extra_system_prompt or self.extra_system_prompt):
            parts.append(extra)
        self.llm_input_provided_index = len(self.content)
        self.llm_api = llm_api
        self.extra_system_prompt = extra
        self.content[0] = SystemContent(content="\n".join(parts))
        self.async_trace({"messages": self.content, "tools": tools or None})

    def async_trace(self, agent_details):
        trace.async_conversation_trace_append(trace.ConversationTraceEventType.AGENT_DETAIL,
                                              agent_details)


def render(hass, template, user_name):
    """helpers/template.py for the two templates used here: HA's date/time
    prompt and {{ ha_name }} / {{ user_name }}."""
    now = core.utcnow()
    return (template.replace('{{ now().strftime("%H:%M:%S") }}', now.strftime("%H:%M:%S"))
            .replace('{{ now().strftime("%Y-%m-%d") }}', now.strftime("%Y-%m-%d"))
            .replace("{{ ha_name }}", hass.config.location_name)
            .replace("{{ user_name }}", user_name or ""))


@contextlib.contextmanager
def async_get_chat_log(hass, session, user_input=None, *, chat_log_delta_listener=None):
    if (chat_log := current_chat_log.get()) and chat_log.conversation_id == session.conversation_id:
        if user_input is not None and ((content := chat_log.content[-1]).role != "user"
                                       or content.content != user_input.text):
            chat_log.async_add_user_content(UserContent(content=user_input.text))
        yield chat_log
        return
    all_chat_logs = hass.data.setdefault("conversation_chat_logs", {})
    is_new_log = session.conversation_id not in all_chat_logs
    if chat_log := all_chat_logs.get(session.conversation_id):
        chat_log = replace(chat_log, content=chat_log.content.copy())
    else:
        chat_log = ChatLog(hass, session.conversation_id)
    if is_new_log:
        _notify(hass, session.conversation_id, ChatLogEventType.CREATED, {})
    if user_input is not None:
        chat_log.async_add_user_content(UserContent(content=user_input.text))
    last_message = chat_log.content[-1]
    token = current_chat_log.set(chat_log)
    yield chat_log
    current_chat_log.reset(token)
    if chat_log.content[-1] is last_message:
        if is_new_log:
            _notify(hass, session.conversation_id, ChatLogEventType.DELETED, {})
        return
    if is_new_log:
        def do_cleanup():
            all_chat_logs.pop(session.conversation_id)
            _notify(hass, session.conversation_id, ChatLogEventType.DELETED, {})
        session.async_on_cleanup(do_cleanup)
    all_chat_logs[session.conversation_id] = chat_log
    if not is_new_log:
        _notify(hass, session.conversation_id, ChatLogEventType.UPDATED, {})


# -- conversation/util.py -----------------------------------------------------------------

def async_get_result_from_chat_log(user_input, chat_log):
    from homeassistant.helpers import intent  # noqa: PLC0415
    tool_results = [
        (content.tool_result if llm.LEGACY[0] else content.result.data)
        for content in chat_log.content[chat_log.llm_input_provided_index:]
        if isinstance(content, _result_class())
        and isinstance(content.tool_result if llm.LEGACY[0] else content.result.data,
                       llm.IntentResponseDict)]
    if tool_results:
        intent_response = tool_results[-1].original
    else:
        intent_response = intent.IntentResponse(language=user_input.language)
    if not isinstance((last_content := chat_log.content[-1]), AssistantContent):
        raise core.HomeAssistantError("Unable to get response")
    intent_response.async_set_speech(last_content.content or "")
    return ConversationResult(response=intent_response, conversation_id=chat_log.conversation_id,
                              continue_conversation=chat_log.continue_conversation)


# -- conversation/entity.py ----------------------------------------------------------------------

def make_entity_class(restore_entity):
    class ConversationEntity(restore_entity):
        _attr_should_poll = False
        _attr_supported_features = ConversationEntityFeature(0)
        _attr_supports_streaming = False

        @property
        def supports_streaming(self):
            return self._attr_supports_streaming

        async def internal_async_process(self, user_input):
            self.async_write_ha_state()
            return await self.async_process(user_input)

        async def async_process(self, user_input):
            with (async_get_chat_session(self.hass, user_input.conversation_id) as session,
                  async_get_chat_log(self.hass, session, user_input) as chat_log):
                return await self._async_handle_message(user_input, chat_log)

        async def _async_handle_message(self, user_input, chat_log):
            raise NotImplementedError

    return ConversationEntity


def result_content(agent_id, call_id, name, data, error=False):
    """A ToolResultContent of the running generation (for tests that fill a log)."""
    return _make_result(agent_id, call_id, name, data, error)
