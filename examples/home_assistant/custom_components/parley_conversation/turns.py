"""One Parley turn for Home Assistant, and what HA and Parley must know of it.

Parley runs the model's tool loop itself, so to Home Assistant each step is
an *external* tool call (`llm.ToolInput(external=True)`) with its result, the
way HA's own agents record tools a server ran for them; the chat log then
holds one assistant message per model reply, with its reasoning as
`thinking_content`, and `async_get_result_from_chat_log` finds the intent
data of Assist's tools in it.  The other way round, what HA's shared chat log
holds that Parley did not say (commands HA handled locally, satellite
announcements, other agents' turns) is appended to Parley's history before the
turn, without a model call.  Also here: the key of a memory, the split of HA's
prompt into its stable part (Parley's cached system prompt) and the per-turn
rest, and HA's tools as Parley tool callables.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import sys

from homeassistant.components import conversation
from homeassistant.helpers import llm
from homeassistant.helpers.json import json_dumps

from .const import MEMORY_DEVICE, MEMORY_HOME, MEMORY_USER
from .parley import ParleyError, tool

try:  # Home Assistant 2026: tool schemas are probatio schemas
    import probatio
except ImportError:  # older Home Assistant: voluptuous schemas
    probatio = None

_LOGGER = logging.getLogger(__name__)

# llm.DATE_TIME_PROMPT as HA renders it into the system prompt (when no
# GetDateTime tool is offered): per-turn text.
_DATE_TIME = re.compile(r"Current time is \d{1,2}:\d{2}:\d{2}\. Today's date is "
                        r"\d{4}-\d{2}-\d{2}\.\n?")


# -- what a memory belongs to ---------------------------------------------

def memory_id(memory: str, user_input, ha_conversation_id: str) -> str:
    """Parley's conversation id for this input.  HA's own id (re-minted after
    5 idle minutes and at every restart) unless the memory belongs to the
    satellite/device, the user or the home; an input without the thing the
    memory belongs to (a typed message has no device) keeps HA's id."""
    if memory == MEMORY_DEVICE:
        source = user_input.satellite_id or user_input.device_id
        if source:
            return "device:" + source
    elif memory == MEMORY_USER:
        user_id = user_input.context.user_id if user_input.context else None
        if user_id:
            return "user:" + user_id
    elif memory == MEMORY_HOME:
        return "home"
    return ha_conversation_id


# -- the prompt --------------------------------------------------------------

def split_prompt(system: str, api_prompt: str | None, extra: str | None) -> tuple[str, str]:
    """(stable, per_turn) parts of the system prompt HA rendered
    (ChatLog.async_provide_llm_data: prompt template, LLM API prompt, date and
    time, extra system prompt, joined by newlines).  The stable part ends with
    the API's prompt; without one, before the date/time line or the extra
    prompt."""
    cut = None
    if api_prompt and (at := system.rfind(api_prompt)) >= 0:
        cut = at + len(api_prompt)
    elif (m := _DATE_TIME.search(system)) is not None:
        cut = m.start()
    elif extra and system.endswith(extra):
        cut = len(system) - len(extra)
    if cut is None:
        return system.strip("\n"), ""
    return system[:cut].strip("\n"), system[cut:].strip("\n")


# -- HA's tools --------------------------------------------------------------

def tool_schema(parameters, custom_serializer) -> dict:
    """A tool's parameters as JSON Schema, converted the way HA's own agents
    do: probatio.to_openapi (2026), voluptuous_openapi.convert before."""
    if probatio is not None:
        try:
            return probatio.to_openapi(parameters, custom_serializer=custom_serializer)
        except (TypeError, ValueError, AttributeError):
            pass  # a voluptuous schema on a mixed install
    from voluptuous_openapi import convert  # pylint: disable=import-outside-toplevel
    return convert(parameters, custom_serializer=custom_serializer)


def unwrap(value) -> tuple[object, bool]:
    """(data, is_error) of what async_call_tool returned: an llm.ToolResult
    (HA 2026) or, from older HA, the data itself."""
    if not isinstance(value, dict) and hasattr(value, "data") and hasattr(value, "error"):
        return value.data, bool(value.error)
    return value, False


def tool_result(data, error: bool):
    """What HA's chat log keeps for a tool result: llm.ToolResult where HA has it."""
    cls = getattr(llm, "ToolResult", None)
    return cls(data=data, error=error) if cls is not None else data


def failure(data) -> Exception:
    """An exception the binding reports to the model as "<error>: <error_text>",
    from HA's error data {"error": <exception name>, "error_text": ...}."""
    name = str(data.get("error") or "") if isinstance(data, dict) else ""
    text = str(data.get("error_text") or "") if isinstance(data, dict) else json_dumps(data)
    return type(name if name.isidentifier() else "ToolError", (Exception,), {})(text)


async def call_ha_tool(llm_api, name: str, arguments: dict, call_id: str):
    """Run one of HA's tools; (data, is_error).  A raised error becomes the
    data HA's chat log makes of it ({"error", "error_text"})."""
    try:
        value = await llm_api.async_call_tool(
            llm.ToolInput(tool_name=name, tool_args=arguments, id=call_id))
    except Exception as err:  # noqa: BLE001 -- the model is told, as HA tells it
        data = {"error": type(err).__name__}
        if str(err):
            data["error_text"] = str(err)
        return data, True
    return unwrap(value)


# -- steps into HA's chat log --------------------------------------------------

def _tool_result_content(agent_id, call_id, name, result):
    if hasattr(llm, "ToolResult"):
        return conversation.ToolResultContent(agent_id=agent_id, tool_call_id=call_id,
                                              tool_name=name, result=result)
    return conversation.ToolResultContent(agent_id=agent_id, tool_call_id=call_id,
                                          tool_name=name, tool_result=result)


def _result_delta(call_id, name, result) -> dict:
    key = "result" if hasattr(llm, "ToolResult") else "tool_result"
    return {"role": "tool_result", "tool_call_id": call_id, "tool_name": name, key: result}


def _external(name, arguments, call_id):
    args = arguments if isinstance(arguments, dict) else {"invalid_json": arguments}
    return llm.ToolInput(tool_name=name, tool_args=args, id=call_id, external=True)


def _from_step(step) -> object:
    """A tool result Parley made itself (unknown tool, bad arguments, timeout)."""
    try:
        data = json.loads(step.get("content") or "null")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {"result": step.get("content")}
    return tool_result(data, bool(step.get("is_error")))


class Turn:
    """One turn's bridge between Parley and HA's chat log.  Tool calls and
    results are recorded as the tools run (kept by call id, with the
    ToolResult HA's tool returned, intent data included); streamed text comes
    in as deltas."""

    def __init__(self, chat_log, agent_id: str, streaming: bool) -> None:
        self.chat_log = chat_log
        self.agent_id = agent_id
        self.results: dict[str, object] = {}
        self.result = None  # the streamed turn's Result, once deltas() has it
        self.reasoned = False  # reasoning came as it streamed (on_reasoning)
        self.events: asyncio.Queue | None = asyncio.Queue() if streaming else None

    def tools(self) -> dict:
        """HA's LLM API tools as Parley tool callables for this turn."""
        llm_api = self.chat_log.llm_api
        if not llm_api:
            return {}

        def make(ha_tool):
            async def run(call):
                if self.events is not None:
                    self.events.put_nowait(("call", _external(ha_tool.name, call.arguments,
                                                              call.call_id)))
                data, error = await call_ha_tool(llm_api, ha_tool.name, call.arguments,
                                                 call.call_id)
                result = self.results[call.call_id] = tool_result(data, error)
                if self.events is not None:
                    # The plugin hands over every call of a reply before it
                    # reads any result, but each hand-over needs the GIL: a
                    # tool that ends at once could report before the next
                    # call of its reply arrived.  Waiting one GIL switch
                    # interval lets those calls in first, so that a call
                    # after every result is the next reply's (deltas()).
                    await asyncio.sleep(sys.getswitchinterval())
                    self.events.put_nowait(("result", call.call_id, ha_tool.name, result))
                if error:
                    raise failure(data)
                return json_dumps(data)  # HA's encoder: time/date values, sets, ...
            schema = tool_schema(ha_tool.parameters, llm_api.custom_serializer)
            return tool(ha_tool.description or ha_tool.name, schema)(run)

        return {t.name: make(t) for t in llm_api.tools}

    # -- not streamed: the steps, after the turn --

    def write_steps(self, steps: list, texts: list) -> None:
        """Every step of a finished turn into the chat log: per model reply one
        AssistantContent (its text before the tool calls from `texts`, its
        reasoning, its calls as external tool calls), then one
        ToolResultContent per result."""
        log = self.chat_log
        state = {"reasoning": None, "calls": []}

        def flush_calls():
            if state["calls"]:
                log.async_add_assistant_content_without_tools(conversation.AssistantContent(
                    agent_id=self.agent_id, content=texts.pop(0) if texts else None,
                    thinking_content=state["reasoning"], tool_calls=state["calls"]))
                state["calls"], state["reasoning"] = [], None

        for step in steps:
            kind = step.get("type")
            if kind == "reasoning":
                flush_calls()
                state["reasoning"] = step.get("content")
            elif kind == "tool_call":
                state["calls"].append(_external(step.get("name"), step.get("arguments"),
                                                step.get("call_id")))
            elif kind == "tool_result":
                flush_calls()
                result = self.results.get(step.get("call_id")) or _from_step(step)
                log.async_add_assistant_content_without_tools(_tool_result_content(
                    self.agent_id, step.get("call_id"), step.get("name"), result))
            elif kind == "answer":
                flush_calls()
                log.async_add_assistant_content_without_tools(conversation.AssistantContent(
                    agent_id=self.agent_id, content=step.get("content"),
                    thinking_content=state["reasoning"]))
                state["reasoning"] = None

    # -- streamed: deltas as they come --

    def on_reasoning(self, text: str) -> None:
        """The binding's on_reasoning: reasoning in order with the text deltas."""
        self.events.put_nowait(("reasoning", text))

    async def pump(self, stream) -> None:
        """Parley's stream (text deltas, then the Result) into the event queue."""
        try:
            async for item in stream:
                self.events.put_nowait(("text", item) if isinstance(item, str)
                                       else ("done", item))
        except BaseException as err:  # noqa: BLE001 -- handed to the consumer
            self.events.put_nowait(("error", err))
            if isinstance(err, asyncio.CancelledError):
                raise

    async def deltas(self):
        """The turn as HA's delta stream.  Tool calls and results wait until
        the model speaks again (or the turn ends), so that the calls of one
        reply land in one message: a call that comes once every earlier call
        has its result starts the next reply's message."""
        held: list = []          # ("call", ToolInput) / ("result", id, name, result), in order
        message = {"open": False, "has_calls": False}

        def flush():
            out, pending = [], set()
            for item in held:
                if item[0] == "call":
                    if (not message["open"] or (message["has_calls"] and not pending)):
                        out.append({"role": "assistant"})
                        message.update(open=True, has_calls=False)
                    out.append({"tool_calls": [item[1]]})
                    message["has_calls"] = True
                    pending.add(item[1].id)
                else:
                    pending.discard(item[1])
                    out.append(_result_delta(item[1], item[2], item[3]))
                    message["open"] = False
            held.clear()
            return out

        while True:
            event = await self.events.get()
            kind = event[0]
            if kind in ("call", "result"):
                held.append(event)
                continue
            if kind == "error":
                raise event[1]
            for delta in flush():
                yield delta
            if kind in ("text", "reasoning"):
                # A reply's reasoning comes before its text and its calls.
                if not message["open"] or (kind == "reasoning" and message["has_calls"]):
                    yield {"role": "assistant"}
                    message.update(open=True, has_calls=False)
                if kind == "reasoning":
                    self.reasoned = True
                    yield {"thinking_content": event[1]}
                else:
                    yield {"content": event[1]}
                continue
            result = event[1]  # done
            self.result = result
            reasoning = None if self.reasoned else _answer_reasoning(result.steps)
            if not message["open"] or message["has_calls"]:
                yield {"role": "assistant", "content": result.response}
            if reasoning:
                yield {"thinking_content": reasoning}
            return


def _answer_reasoning(steps: list):
    """The reasoning that led to the final answer, if any."""
    reasoning = None
    for step in steps:
        if step.get("type") == "reasoning":
            reasoning = step.get("content")
        elif step.get("type") in ("tool_call", "tool_result"):
            reasoning = None
    return reasoning


async def texts_before_tools(agent, result) -> list:
    """What the model said alongside its tool calls in a finished turn (the
    steps do not carry it): from the stored turn; [] if none or unreadable."""
    if not result.turn_id or not any(s.get("type") == "tool_call" for s in result.steps):
        return []
    try:
        turn = (await agent.turn(result.turn_id))["turn"]
    except ParleyError:
        return []
    return [m.get("content") or None for m in turn.get("messages", [])
            if m.get("role") == "assistant" and m.get("tool_calls")]


def trace_usage(chat_log, usage) -> None:
    """Token counts of the turn into the conversation trace, as HA's agents do."""
    if usage:
        chat_log.async_trace({"stats": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "cached_input_tokens": usage.get("cache_read_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0)}})


# -- HA's chat log into Parley's history ---------------------------------------

def foreign_messages(content: list, start: int, agent_id: str) -> list[tuple[str, str]]:
    """(role, text) of what content[start:-1] holds that this agent did not
    produce: users' words another agent (or HA's own intent handling)
    answered, and other agents' and satellites' assistant text.  The last item
    is this turn's own user message."""
    items = content[start:-1]
    out = []
    for i, item in enumerate(items):
        role = getattr(item, "role", None)
        if role == "user":
            answered_by = next((x for x in items[i + 1:] if x.role in ("assistant", "user")),
                               None)
            if answered_by is not None and answered_by.role == "assistant" \
                    and answered_by.agent_id == agent_id:
                continue  # a turn of ours: Parley has it
            if item.content:
                out.append(("user", item.content))
        elif role == "assistant" and item.agent_id != agent_id and item.content:
            out.append(("assistant", item.content))
    return out
