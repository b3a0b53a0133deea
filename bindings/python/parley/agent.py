"""parley.Agent: one plugin agent driven from an asyncio event loop.

Threading model (the whole of it):
- The plugin calls us on its worker thread (done, delta, tool_call, log).
  Those ctypes callbacks only copy what the pointers hold (valid during the
  callback only) and hop to the event loop with call_soon_threadsafe; they
  never raise into C.  Everything else -- futures, queues, tool coroutines,
  the user's log function -- runs on the loop thread.
- Plugin functions taking the agent pointer go through _Core.using(), which
  counts calls in progress, so destroy() (from aclose, a finalizer or exit)
  never frees the agent under a running call.
- ctypes releases the GIL around every foreign call: destroy() blocks until
  the worker has run each pending done callback, and those need the GIL.
"""
import asyncio
import atexit
import contextlib
import ctypes
import dataclasses
import datetime
import inspect
import itertools
import json
import logging
import threading
import warnings
import weakref

from . import _abi
from .errors import Cancelled, InvalidInput, ParleyError
from .plugin import Plugin, load_plugin
from .tools import PendingCall, ToolCall, declared_name, error_text, tool_declaration, tool_result

_log = logging.getLogger("parley")


def _retrieve_tool_failure(task):
    """A tool task's own failure (the call is completed regardless): logged
    here, so asyncio never reports "Task exception was never retrieved"."""
    if not task.cancelled() and task.exception() is not None:
        _log.error("parley tool task failed", exc_info=task.exception())
_PY_LEVEL = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}

# Input fields process()/stream() accept as keywords, as in HA's ConversationInput.
_TEXT_FIELDS = ("language", "device_id", "satellite_id", "agent_id", "extra_system_prompt",
                "interface_type", "interface_message_id", "persona", "timestamp")
# Input fields given as a dict (or its JSON text): keyword -> parley_input field.
_JSON_FIELDS = {"context": "context_json", "images": "images_json",
                "metadata": "metadata_json", "reply_to": "reply_to_json",
                "response_format": "response_format_json"}



def _rfc3339(value):
    """A timestamp= as the plugin reads it: a datetime with its offset, or RFC 3339 text
    as given (a naive datetime has no offset: the plugin refuses it by name)."""
    return value.isoformat() if isinstance(value, datetime.datetime) else value


# Set while this thread runs one of our plugin callbacks (a plugin worker).
_in_callback = threading.local()


@dataclasses.dataclass
class Result:
    """A completed turn."""
    response: str
    conversation_id: object  # str, or None for a stateless turn
    turn_id: str
    steps: list              # parsed steps_json (docs/abi.md)
    continue_conversation: bool
    request_id: int
    usage: object = None     # dict of token counts, when the plugin's result carries usage
    stop_reason: object = None  # "stop", "length" (cut short by max_tokens), ...; None if absent
    # Message identity (docs/history.md): the stored ids of the user's message and of the
    # answer (None for a stateless turn), and what came of reply_to= ("included",
    # "in_window", "not_found"; None without reply_to).
    user_message_id: object = None
    answer_message_id: object = None
    reply_context: object = None
    # With response_format=: the answer as data (a dict), checked against the schema; the
    # response is the same as JSON text.  None without a response format.
    structured: object = None
    extra: dict = dataclasses.field(default_factory=dict)  # appended result fields, by C name


def _text(b):
    return None if b is None else b.decode("utf-8", "replace")


def _named_problem(text):
    """The message of an {"error": {"message": ..}} a read function returned, or None."""
    try:
        return json.loads(text)["error"]["message"]
    except (TypeError, ValueError, KeyError):
        return None


def _c_str(field, value):
    """`value` as the NUL-terminated UTF-8 the plugin reads, or a clear error
    (a NUL would silently cut the string short in C)."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (field, type(value).__name__))
    if "\0" in value:
        raise InvalidInput("%s contains a NUL character" % field)
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput("%s is not valid Unicode: %s" % (field, e)) from None


class _Turn:
    def __init__(self, loop, tools, streaming, on_reasoning=None):
        self.future = loop.create_future()
        self.queue = asyncio.Queue() if streaming else None
        self.tools = tools
        self.on_reasoning = on_reasoning
        self.request_id = None
        self.finished = False
        self.calls = set()  # PendingCall of this turn's running tools


class _Core:
    """The plugin agent and everything its callbacks touch.  Holds no
    reference to the Agent, so an Agent can be collected (and its finalizer
    destroy this) while turns are in flight."""

    def __init__(self, plugin, loop, tools, log):
        self.plugin = plugin
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self.tools = tools
        self.log = log
        self.turns = {}            # token -> _Turn; loop thread only
        self.calls = set()         # every PendingCall not yet completed; under lock
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.destroying = threading.Lock()
        self.in_use = 0            # plugin calls on the agent in progress
        self.closing = False
        self.abandoned = False     # the Agent was collected without aclose()
        self.handle = None
        self._tokens = itertools.count(1)
        # The C side keeps these function pointers: they live as long as we do.
        self.c_log = _abi.LOG_FN(self._c_log)
        self.c_tool_call = _abi.TOOL_CALL_FN(self._c_tool_call)
        self.c_delta = _abi.DELTA_FN(self._c_delta)
        self.c_reasoning = _abi.DELTA_FN(self._c_reasoning)
        self.c_done = _abi.DONE_FN(self._c_done)

    # -- plugin worker thread: copy, hop, never raise ---------------------

    def _hop(self, fn, *args):
        try:
            self.loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            return False

    def _c_log(self, _host_data, level, message):
        on_loop = threading.get_ident() == self.loop_thread  # e.g. during create()
        _in_callback.active = not on_loop
        try:
            if on_loop:
                self._deliver_log(level, _text(message))
            else:
                self._hop(self._deliver_log, level, _text(message))
        except BaseException:  # noqa: BLE001 -- nothing may raise into C
            pass
        finally:
            _in_callback.active = False

    def _c_done(self, user_data, result_ptr):
        _in_callback.active = True
        try:
            self._hop(self._on_done, user_data, _abi.fields_within(_abi.Result, result_ptr))
        except BaseException:  # noqa: BLE001
            pass
        finally:
            _in_callback.active = False

    def _c_delta(self, user_data, _request_id, text, length):
        _in_callback.active = True
        try:
            self._hop(self._on_delta, user_data,
                      ctypes.string_at(text, length).decode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass
        finally:
            _in_callback.active = False

    def _c_reasoning(self, user_data, _request_id, text, length):
        _in_callback.active = True
        try:
            self._hop(self._on_reasoning, user_data,
                      ctypes.string_at(text, length).decode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass
        finally:
            _in_callback.active = False

    def _c_tool_call(self, _host_data, handle, info_ptr):
        _in_callback.active = True
        try:
            call = PendingCall(self, handle)
            with self.lock:
                self.calls.add(call)
            try:
                info = _abi.fields_within(_abi.ToolCallInfo, info_ptr)
            except BaseException:  # noqa: BLE001
                call.complete(b"parley binding: cannot read the tool call", 1)
                raise
            if not self._hop(self._on_tool_call, call, info):
                call.complete(b"the host's event loop is closed", 1)
        except BaseException:  # noqa: BLE001
            pass
        finally:
            _in_callback.active = False

    # -- loop thread -----------------------------------------------------

    def _deliver_log(self, level, message):
        try:
            if self.log is not None:
                self.log(level, message)
            else:
                _log.log(_PY_LEVEL.get(level, logging.DEBUG), "%s", message)
        except Exception:  # a broken log function must not break turns
            _log.exception("parley log callback failed")

    def _on_delta(self, token, text):
        turn = self.turns.get(token)
        if turn is not None and turn.queue is not None:
            turn.queue.put_nowait(("delta", text))

    def _on_reasoning(self, token, text):
        turn = self.turns.get(token)
        if turn is None or turn.on_reasoning is None:
            return
        if turn.queue is not None:  # stream(): in order with the text deltas
            turn.queue.put_nowait(("reasoning", text))
        else:
            _call_reasoning(turn.on_reasoning, text)

    def _on_done(self, token, r):
        turn = self.turns.pop(token, None)
        if turn is None:
            return
        turn.finished = True
        if self.abandoned:
            return  # the Agent is gone: nobody awaits this turn
        for call in list(turn.calls):  # the turn is over: its tools' results are moot
            if call.task is not None:
                call.task.cancel()
        try:
            outcome = self._result(r)
        except Exception as e:  # noqa: BLE001 -- e.g. unparsable steps: report, don't lose
            outcome = ParleyError("parley binding: cannot read the result: %r" % e,
                                  status="internal")
        if turn.queue is not None:
            turn.queue.put_nowait(("error" if isinstance(outcome, BaseException) else "result",
                                   outcome))
        elif turn.future is not None and not turn.future.done():
            if isinstance(outcome, BaseException):
                turn.future.set_exception(outcome)
            else:
                turn.future.set_result(outcome)

    def _result(self, r):
        steps = json.loads(_text(r.get("steps_json")) or "[]")
        ids = dict(request_id=r["request_id"], conversation_id=_text(r.get("conversation_id")),
                   turn_id=_text(r.get("turn_id")))
        if r["status"] != _abi.OK:
            return self.plugin.error(r["status"], _text(r.get("error_message")), steps=steps,
                                     **ids)
        extra = {}
        for name, _ctype in _abi.RESULT_APPENDED:
            if name in r:
                v = r[name]
                v = _text(v) if isinstance(v, bytes) else v
                extra[name] = json.loads(v) if name.endswith("_json") and v else v
        return Result(response=_text(r.get("response")) or "", steps=steps,
                      continue_conversation=bool(r.get("continue_conversation")),
                      usage=extra.get("usage_json"), stop_reason=extra.get("stop_reason"),
                      user_message_id=extra.get("user_message_id"),
                      answer_message_id=extra.get("answer_message_id"),
                      reply_context=extra.get("reply_context"),
                      structured=extra.get("structured_json"), extra=extra, **ids)

    def _on_tool_call(self, call, info):
        name = _text(info.get("tool_name")) or ""
        turn = self.turns.get(info.get("user_data"))
        fn = (turn.tools.get(name) if turn and turn.tools else None) or self.tools.get(name)
        if self.closing:
            call.complete(b"the agent is closing", 1)
            return
        if fn is None:
            call.complete(("no Python callable for tool %r" % name).encode(), 1)
            return
        try:
            arguments = json.loads(_text(info.get("arguments_json")) or "{}")
            ctx = _text(info.get("context_json"))
            tc = ToolCall(name=name, arguments=arguments, call_id=_text(info.get("call_id")),
                          request_id=info.get("request_id"),
                          conversation_id=_text(info.get("conversation_id")),
                          turn_id=_text(info.get("turn_id")),
                          language=_text(info.get("language")),
                          device_id=_text(info.get("device_id")),
                          satellite_id=_text(info.get("satellite_id")),
                          agent_id=_text(info.get("agent_id")),
                          context=json.loads(ctx) if ctx else None,
                          interface_type=_text(info.get("interface_type")),
                          persona=_text(info.get("persona")))
        except ValueError as e:
            call.complete(("parley binding: bad tool call: %s" % e).encode(), 1)
            return
        if turn is not None:
            turn.calls.add(call)
        call.task = self.loop.create_task(self._run_tool(fn, tc, call, turn))
        call.task.add_done_callback(_retrieve_tool_failure)

    async def _run_tool(self, fn, tc, call, turn):
        try:
            value = fn(tc)
            if inspect.isawaitable(value):
                value = await value
            try:
                result = tool_result(value)
            except (TypeError, ValueError) as e:
                what = "text that is not UTF-8" if isinstance(e, UnicodeError) else \
                    "a value that is not JSON"
                call.complete(("tool %r returned %s: " % (tc.name, what)).encode()
                              + error_text(e), 1)
            else:
                call.complete(result, 0)
        except asyncio.CancelledError:
            call.complete(b"cancelled", 1)
            raise
        except Exception as e:  # noqa: BLE001 -- the model is told, as HA does
            call.complete(error_text(e), 1)
        finally:
            call.complete(b"the tool ended without a result", 1)  # no-op if completed
            if turn is not None:
                turn.calls.discard(call)

    # -- any thread --------------------------------------------------------

    @contextlib.contextmanager
    def using(self):
        """The agent pointer, valid until the block ends (destroy waits)."""
        with self.lock:
            if self.closing or self.handle is None:
                raise Cancelled("the agent is closed", status="cancelled")
            self.in_use += 1
        try:
            yield self.handle
        finally:
            with self.lock:
                self.in_use -= 1
                self.idle.notify_all()

    def destroy(self):
        """Cancel every turn (each done callback runs before this returns),
        free the agent, complete every tool call still open.  Idempotent.
        Not from this agent's worker thread."""
        with self.destroying:  # a second caller returns only once it is done
            with self.lock:
                self.closing = True
                while self.in_use:
                    self.idle.wait()
                handle, self.handle = self.handle, None
            if handle is not None:
                self.plugin.function("destroy")(handle)
            with self.lock:
                left = list(self.calls)
            for call in left:
                call.complete(b"the agent was closed", 1)
            _live.discard(self)


def _call_reasoning(fn, text):
    """Run the host's on_reasoning (plain or async) on the loop; its failure is logged,
    never the turn's."""
    try:
        value = fn(text)
        if inspect.isawaitable(value):
            asyncio.ensure_future(value)
    except Exception:  # noqa: BLE001
        _log.exception("parley on_reasoning callback failed")


# Every core not yet destroyed, so interpreter exit can destroy them.
_live = set()


@atexit.register
def _destroy_all_at_exit():
    for core in list(_live):
        try:
            core.destroy()
        except Exception:  # noqa: BLE001
            pass


def _finalize(core):
    """An Agent was garbage-collected without aclose()."""
    if core.handle is None:
        return
    warnings.warn("parley.Agent was never closed (use 'async with' or await agent.aclose()); "
                  "destroying its plugin agent now", ResourceWarning, stacklevel=2)
    core.abandoned = True
    if getattr(_in_callback, "active", False):
        # Collected on a plugin worker thread: destroy() must not run there.
        try:
            threading.Thread(target=core.destroy, name="parley-destroy").start()
        except RuntimeError:  # interpreter shutting down: exit destroys it
            pass
        return
    core.destroy()



def _declare_tools(options, tools):
    """options with a declaration for every tool callable not declared yet;
    a declared tool without a callable is an error."""
    declared = [declared_name(d) for d in options.get("tools") or []]
    for name in declared:
        if name is not None and name not in tools:
            raise ValueError("tool %r is declared in options['tools'] but has no callable "
                             "in tools=" % name)
    added = [tool_declaration(n, fn) for n, fn in tools.items() if n not in declared]
    if added:
        options["tools"] = list(options.get("tools") or []) + added
    return options

class Agent:
    """One Parley agent (its own history, options and worker thread).

        async with parley.Agent({"model": "llama3.2"}, tools={"turn_on": turn_on}) as agent:
            result = await agent.process("turn on the kitchen light")

    Create it in a coroutine: it belongs to the running event loop, and every
    method must be called on that loop.  options: the plugin's options (a
    dict; docs/options.md).  tools: {name: callable(ToolCall)} -- async or
    plain; a tool not declared in options["tools"] is declared from the
    callable (parley.tool decorator, or its docstring).  log: callable(level,
    message) run on the loop (default: the "parley" logging logger).
    plugin: a Plugin or a path to parley.so (default: load_plugin()).
    """

    def __init__(self, options, tools=None, log=None, *, plugin=None):
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("create a parley.Agent in a coroutine: it belongs to the running "
                               "event loop") from None
        self._plugin = plugin if isinstance(plugin, Plugin) else load_plugin(plugin)
        tools = dict(tools or {})
        options = _declare_tools(dict(options), tools)
        self._tools = tools
        self._core = core = _Core(self._plugin, loop, tools, log)
        host = _abi.Host(struct_size=ctypes.sizeof(_abi.Host), host_data=None,
                         log=core.c_log, tool_call=core.c_tool_call)
        err = ctypes.c_void_p()
        handle = self._plugin.function("create")(ctypes.byref(host),
                                                 json.dumps(options).encode(), ctypes.byref(err))
        if not handle:
            message = self._plugin.take_string(err.value) or "create() failed"
            raise self._plugin.error(2, message)  # PARLEY_ERR_INVALID_OPTIONS
        core.handle = handle
        self._closing = None  # the aclose() task, once started
        _live.add(core)
        self._finalizer = weakref.finalize(self, _finalize, core)
        self._finalizer.atexit = False  # _destroy_all_at_exit does it, without a warning

    @property
    def plugin(self):
        return self._plugin

    @property
    def closed(self):
        return self._core.closing

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self):
        """Cancel every turn in flight and free the agent.  Returns once every
        turn's done callback has run: their process() calls raise
        parley.Cancelled, their stream() iterators raise it too.  Running
        tool coroutines are cancelled (their calls complete as errors)."""
        if self._closing is None:  # every caller waits for the one close
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self):
        core = self._core
        self._finalizer.detach()
        core.closing = True  # from here on, new turns and tool calls are refused
        with core.lock:
            tasks = [c.task for c in core.calls if c.task is not None]
        await core.loop.run_in_executor(None, core.destroy)
        # destroy() returned after the done callbacks queued their hops, so
        # every turn's future is settled by now.
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- turns -------------------------------------------------------------

    def _start(self, text, conversation_id, fields, streaming):
        core = self._core
        if asyncio.get_running_loop() is not core.loop:
            raise RuntimeError("a parley.Agent must be used on the event loop it was created on")
        turn_tools = fields.pop("tools", None) or {}
        on_reasoning = fields.pop("on_reasoning", None)
        if on_reasoning is not None and not callable(on_reasoning):
            raise TypeError("on_reasoning must be a callable(text)")
        given_json = {k: fields.pop(k) for k in _JSON_FIELDS if k in fields}
        unknown = set(fields) - set(_TEXT_FIELDS)
        if unknown:
            raise TypeError("unknown input field(s) %s; known: %s, %s, tools"
                            % (", ".join(sorted(unknown)), ", ".join(_TEXT_FIELDS),
                               ", ".join(_JSON_FIELDS)))
        if "timestamp" in fields:
            fields["timestamp"] = _rfc3339(fields["timestamp"])
        inp = _abi.Input(struct_size=ctypes.sizeof(_abi.Input), text=_c_str("text", text))
        if conversation_id is not None:
            inp.conversation_id = _c_str("conversation_id", conversation_id)
        for name in _TEXT_FIELDS:
            if fields.get(name) is not None:
                setattr(inp, name, _c_str(name, fields[name]))
        for name, value in given_json.items():
            if value is not None:
                setattr(inp, _JSON_FIELDS[name], _c_str(name, value if isinstance(value, str)
                                                        else json.dumps(value)))
        if turn_tools:
            inp.tools_json = json.dumps([tool_declaration(n, fn)
                                         for n, fn in turn_tools.items()]).encode()
        if streaming:
            inp.on_delta = core.c_delta
        if on_reasoning is not None:
            inp.on_reasoning = core.c_reasoning
        return self._submit(_Turn(core.loop, turn_tools, streaming, on_reasoning),
                            self._plugin.function("async_process"), ctypes.byref(inp))

    def _submit(self, turn, fn, first_arg):
        """Call fn (async_process or append_message) for `turn`; its done callback
        settles the turn's future.  Raises the plugin's error when it refuses."""
        core = self._core
        token = next(core._tokens)
        core.turns[token] = turn  # before the call: done may come before it returns
        rid = ctypes.c_uint64()
        err = ctypes.c_void_p()
        try:
            with core.using() as handle:
                status = fn(handle, first_arg, core.c_done, token, ctypes.byref(rid),
                            ctypes.byref(err))
        except BaseException:
            core.turns.pop(token, None)
            raise
        if status != _abi.OK:
            core.turns.pop(token, None)
            raise self._plugin.error(status, self._plugin.take_string(err.value))
        turn.request_id = rid.value
        return turn

    def _start_append(self, message):
        """append_message: like _start, for a message the model does not answer."""
        core = self._core
        if asyncio.get_running_loop() is not core.loop:
            raise RuntimeError("a parley.Agent must be used on the event loop it was created on")
        return self._submit(_Turn(core.loop, {}, False), self._plugin.require("append_message"),
                            json.dumps(message).encode())

    def _cancel(self, turn):
        if turn.finished:
            return
        try:
            with self._core.using() as handle:
                self._plugin.function("cancel")(handle, turn.request_id)
        except Cancelled:
            pass  # closing: destroy cancels it anyway

    async def process(self, text, conversation_id=None, **fields):
        """Run one turn; returns its Result or raises a ParleyError.

        fields: language, device_id, satellite_id, agent_id,
        extra_system_prompt, persona (str: one of the `personas` option's
        names), interface_type, interface_message_id (str: the interface's
        own id of this message); context (dict or JSON text, e.g.
        {"user_id": ...}); metadata (a dict or its JSON text, kept with the
        stored user message); reply_to ({"turn_id": ...} or
        {"interface_message_id": ...}: the earlier turn this message answers,
        see Result.reply_context); images (a list of {"url":
        "data:image/...;base64,..." or "https://..."}, or its JSON text);
        timestamp (RFC 3339 text or an aware datetime: when the user said it,
        stored as the messages' created_at instead of Parley's clock);
        tools ({name: callable}, for this turn only); response_format
        ({"name": ..., "schema": {JSON Schema of an object}, "strict"?: bool}, or its
        JSON text: the answer is that JSON, checked, and Result.structured holds it
        parsed; a mismatch raises parley.BadResponse saying where); on_reasoning
        (callable(text), plain or async, run on the loop with each piece of the
        model's reasoning as it streams; needs "stream": true for pieces, else
        nothing is called: the whole reasoning is in Result.steps).
        Cancelling the awaiting task cancels the turn in the plugin."""
        turn = self._start(text, conversation_id, fields, streaming=False)
        try:
            return await turn.future
        except asyncio.CancelledError:
            self._cancel(turn)
            # The cancelled future keeps the CancelledError, whose traceback holds
            # this frame and so this Agent: drop it, or the core (via the turn
            # still in flight) would keep the Agent alive.
            turn.future = None
            raise

    async def append_message(self, conversation_id, content, role="assistant", **fields):
        """Add a message to a conversation without calling the model (an
        announcement); returns its Result (response = content, turn_id,
        answer_message_id = the stored message's id) once it is stored.  It
        waits behind the turns already started on that conversation, and later
        turns send it to the model.  role: "assistant", "user" (what a person
        said, recorded without an answer) or "system" (a note).
        fields: interface_type, persona, interface_message_id (str), metadata
        (a dict), timestamp (RFC 3339 text or an aware datetime: its created_at).  Bad input raises parley.InvalidInput naming the key, and
        nothing is stored.  Cancelling the awaiting task cancels it while it
        waits."""
        message = dict(fields, conversation_id=conversation_id, content=content, role=role)
        if "timestamp" in message:
            message["timestamp"] = _rfc3339(message["timestamp"])
        turn = self._start_append({k: v for k, v in message.items() if v is not None})
        try:
            return await turn.future
        except asyncio.CancelledError:
            self._cancel(turn)
            turn.future = None  # as in process(): do not keep this frame alive
            raise

    async def stream(self, text, conversation_id=None, **fields):
        """Like process(), as an async iterator: the text deltas (str) as the
        model produces them, then the Result.  Needs the option "stream": true
        (without it only the Result comes).  Leaving the loop early, or
        cancelling the consuming task, cancels the turn."""
        turn = self._start(text, conversation_id, fields, streaming=True)
        try:
            while True:
                kind, item = await turn.queue.get()
                if kind == "error":
                    raise item
                if kind == "reasoning":  # on_reasoning=, in order with the text
                    _call_reasoning(turn.on_reasoning, item)
                    continue
                yield item
                if kind == "result":
                    return
        finally:
            self._cancel(turn)

    # -- history and metrics ----------------------------------------------
    # Each is one plugin call returning JSON, run off the loop (a store may
    # touch the disk).  A function appended to the ABI later is one more
    # method calling self._json_call("its_name", ...).

    async def _call(self, name, *args, returns_json=True):
        fn = self._plugin.require(name)
        core = self._core

        def run():
            out = ctypes.c_void_p()
            with core.using() as handle:
                status = fn(handle, *args, ctypes.byref(out)) if returns_json \
                    else fn(handle, *args)
            text = self._plugin.take_string(out.value) if returns_json else None
            if status != _abi.OK:  # the plugin's words, read on this thread right after
                words = _named_problem(text) or self._plugin.last_error()
                raise self._plugin.error(status, words or "%s(%s)" % (
                    name, ", ".join(repr(a.decode()) for a in args if a is not None)))
            return json.loads(text) if text is not None else None

        return await core.loop.run_in_executor(None, run)

    async def history(self, conversation_id):
        """{"conversation_id", "created_at", "last_used_at", "turns": [...]};
        raises parley.NotFound for an unknown conversation."""
        return await self._call("history_get", _c_str("conversation_id", conversation_id))

    async def turn(self, turn_id):
        """{"conversation_id", "turn": {...}} for a turn_id, or parley.NotFound."""
        return await self._call("turn_get", _c_str("turn_id", turn_id))

    async def conversations(self, persona=None, interface_type=None):
        """[{"conversation_id", "persona"?, "interface_type"?, "created_at",
        "last_used_at", "turns"}, ...], most recently used first; persona /
        interface_type (a string, "" = none) keep only those conversations."""
        if persona is None and interface_type is None:
            return (await self._call("conversations_list"))["conversations"]
        flt = {k: v for k, v in (("persona", persona), ("interface_type", interface_type))
               if v is not None}
        return (await self._call("conversations_list_by",
                                 json.dumps(flt).encode()))["conversations"]

    async def clear_history(self, conversation_id=None):
        """Forget one conversation (parley.NotFound if unknown), or all."""
        await self._call("history_clear",
                         None if conversation_id is None
                         else _c_str("conversation_id", conversation_id),
                         returns_json=False)

    async def update_options(self, options):
        """Change the live agent's options (a whole options dict, as for Agent()):
        history and turns in flight are kept (they finish under the options they
        started with); turns started after this use the new ones.  The tools stay
        those given to Agent().  Raises parley.InvalidOptions, and changes
        nothing, for bad options or one that cannot change on a live agent
        (history_store, max_connections, ...)."""
        text = json.dumps(_declare_tools(dict(options), self._tools)).encode()
        fn = self._plugin.require("update_options")
        core = self._core

        def run():
            err = ctypes.c_void_p()
            with core.using() as handle:
                status = fn(handle, text, ctypes.byref(err))
            message = self._plugin.take_string(err.value)
            if status != _abi.OK:
                raise self._plugin.error(status, message or "update_options() failed")

        await core.loop.run_in_executor(None, run)

    async def _options_call(self, name, *args):
        """A function taking (agent, ..., char **error): raises its error, else None."""
        fn = self._plugin.require(name)
        core = self._core

        def run():
            err = ctypes.c_void_p()
            with core.using() as handle:
                status = fn(handle, *args, ctypes.byref(err))
            message = self._plugin.take_string(err.value)
            if status != _abi.OK:
                raise self._plugin.error(status, message or "%s() failed" % name)

        await core.loop.run_in_executor(None, run)

    async def put_persona(self, name, settings):
        """Add a persona to the live agent, or replace the one called `name`:
        settings as in the `personas` option ({"prompt": ..., ...}).  Every
        history is kept; turns already started finish as they began.  A bad
        name or setting raises parley.InvalidInput naming it, changing nothing."""
        await self._options_call("persona_put", _c_str("name", name),
                                 json.dumps(settings).encode())

    async def remove_persona(self, name):
        """Remove a persona from the live agent (later turns naming it raise
        parley.InvalidInput); its conversations stay stored and come back with
        put_persona.  parley.NotFound when there is no such persona."""
        await self._options_call("persona_remove", _c_str("name", name))

    async def metrics(self):
        """Counters and gauges (turns, errors, retries, in_flight, ...)."""
        return await self._call("metrics")

    async def metrics_prometheus(self):
        """The metrics in the Prometheus text exposition format (str), to serve at a
        /metrics endpoint: parley_* counters and gauges, labelled by persona,
        interface_type, reason (docs/abi.md, "Prometheus metrics")."""
        fn = self._plugin.require("metrics_prometheus")
        core = self._core

        def run():
            out = ctypes.c_void_p()
            with core.using() as handle:
                status = fn(handle, ctypes.byref(out))
            text = self._plugin.take_string(out.value)
            if status != _abi.OK:
                raise self._plugin.error(status, "metrics_prometheus() failed")
            return text

        return await core.loop.run_in_executor(None, run)

    async def query(self, **filters):
        """history_query: {"messages": [...], "next_cursor": str or None}.

        filters (docs/history.md, "Querying messages"): conversation_id,
        interface_type, persona, role, since, until (RFC 3339 text), search,
        limit, order ("newest"/"oldest"), cursor.  A bad filter raises
        parley.InvalidInput naming it."""
        return await self._call("history_query", json.dumps(filters).encode())

    async def history_by(self, conversation_id, **selector):
        """history() of the conversation under interface_type= and/or persona=."""
        return await self._call("history_get_by", json.dumps(
            dict(selector, conversation_id=conversation_id)).encode())

    async def clear_history_by(self, conversation_id, **selector):
        """Forget the conversation under interface_type= and/or persona= ("*": every persona)."""
        await self._call("history_clear_by", json.dumps(
            dict(selector, conversation_id=conversation_id)).encode(), returns_json=False)

    async def find_message(self, conversation_id, interface_message_id, **selector):
        """message_find: the stored message carrying the interface's id in that
        conversation (interface_type= and/or persona= name it further), in the
        form query() returns; parley.NotFound if none."""
        return await self._call("message_find", json.dumps(
            dict(selector, conversation_id=conversation_id,
                 interface_message_id=interface_message_id)).encode())

    async def set_interface_message_id(self, turn_id, interface_message_id):
        """After sending a turn's answer: keep the interface's id of it (its
        final answer), so find_message() and reply_to= find it.  Replaces an
        earlier value.  parley.NotFound: no such turn is stored."""
        await self._call("set_interface_message_id", _c_str("turn_id", turn_id),
                         _c_str("interface_message_id", interface_message_id),
                         returns_json=False)

    async def message(self, message_id):
        """One stored message by id (the form query() returns), or parley.NotFound."""
        return await self._call("message_get", _c_str("message_id", message_id))

    def options_schema(self):
        return self._plugin.options_schema()
