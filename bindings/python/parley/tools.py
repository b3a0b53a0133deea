"""Tools: what a tool callable receives (ToolCall), how the model sees it
(tool, tool_declaration), and the one completion of each call the plugin
hands over (PendingCall)."""
import dataclasses
import inspect
import json


@dataclasses.dataclass
class ToolCall:
    """What a tool callable receives: the model's call and the turn's input."""
    name: str
    arguments: dict
    call_id: str
    request_id: int
    conversation_id: object = None
    turn_id: object = None
    language: object = None
    device_id: object = None
    satellite_id: object = None
    agent_id: object = None
    context: object = None  # dict from the input's context, or None
    interface_type: object = None  # where the turn came from ("telegram"), or None
    persona: object = None  # the persona the turn speaks as, or None for the agent's own


def tool(description=None, parameters=None):
    """Decorator declaring how the model sees a tool callable:

        @parley.tool("Turn a light on", {"type": "object", "properties": {...}})
        async def turn_on(call): ...

    Without it the description is the docstring and the parameters are an
    empty object schema."""
    def mark(fn):
        fn.parley_tool = {"description": description, "parameters": parameters}
        return fn
    return mark


def tool_declaration(name, fn):
    """{"name", "description", "parameters"} for a tool callable."""
    spec = getattr(fn, "parley_tool", None) or {}
    return {"name": name,
            "description": spec.get("description") or inspect.getdoc(fn) or name,
            "parameters": spec.get("parameters") or {"type": "object", "properties": {}}}


def declared_name(decl):
    if isinstance(decl, dict):
        if isinstance(decl.get("function"), dict):
            return decl["function"].get("name")
        return decl.get("name")
    return None


def tool_result(value):
    """A tool's return value as complete_tool_call's result_json: str as-is
    (plain text), None as "no output", anything else as JSON.  Raises
    TypeError or ValueError for a value that is not JSON: NaN and infinities
    (which json.dumps would write as the non-JSON NaN, Infinity), or text
    that is not UTF-8 (a lone surrogate)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


def error_text(e):
    """"Type: message" of a tool's exception as UTF-8, whatever its message:
    one whose __str__ raises is named so, a lone surrogate is escaped."""
    try:
        message = str(e)
    except Exception as bad:  # noqa: BLE001 -- the message itself is broken
        message = "(its message could not be read: %s)" % type(bad).__name__
    return ("%s: %s" % (type(e).__name__, message)).encode("utf-8", "backslashreplace")


class PendingCall:
    """One tool call handle: completed exactly once, from whichever thread
    gets there first (the tool's task, close, or interpreter exit)."""

    def __init__(self, core, handle):
        self.core = core
        self.handle = handle
        self.done = False
        self.task = None

    def complete(self, result_json, is_error):
        with self.core.lock:
            if self.done:
                return
            self.done = True
            self.core.calls.discard(self)
        self.core.plugin.function("complete_tool_call")(self.handle, result_json, int(is_error))
