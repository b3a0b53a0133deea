"""Exceptions.  Every error the plugin reports is a ParleyError whose `status`
is the plugin's stable status name (status_name(): "timeout", "busy", ...,
see docs/errors.md); there is one subclass per status, so code can either
`except parley.Timeout` or look at `err.status`."""


class ParleyError(Exception):
    """An error reported by the plugin (or, for PluginLoadError, by loading it).

    status: the stable status name ("invalid_input", "cancelled", ...).
    code: the numeric parley_status.
    For a failed turn, also: request_id, conversation_id, turn_id, steps
    (the steps the turn took before failing: a tool may have run).
    """

    status = None
    code = None

    def __init__(self, message, *, status=None, code=None, request_id=None,
                 conversation_id=None, turn_id=None, steps=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.request_id = request_id
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.steps = steps if steps is not None else []

    def __str__(self):
        return "%s: %s" % (self.status, self.message) if self.status else self.message


class PluginLoadError(ParleyError):
    """parley.so was not found, is not a Parley plugin, or does not serve
    this binding's ABI version.  status is "plugin_load" (not a plugin status)."""
    status = "plugin_load"


class InvalidInput(ParleyError):
    status, code = "invalid_input", 1


class InvalidOptions(ParleyError):
    status, code = "invalid_options", 2


class Busy(ParleyError):
    status, code = "busy", 3


class Cancelled(ParleyError):
    """The turn was cancelled by cancel(), or by closing the agent.  (A task
    awaiting process() that is itself cancelled gets asyncio.CancelledError.)"""
    status, code = "cancelled", 4


class Timeout(ParleyError):
    status, code = "timeout", 5


class ConnectError(ParleyError):
    status, code = "connect", 6


class RateLimited(ParleyError):
    status, code = "rate_limited", 7


class HttpStatus(ParleyError):
    status, code = "http_status", 8


class BadResponse(ParleyError):
    status, code = "bad_response", 9


class ToolLoop(ParleyError):
    status, code = "tool_loop", 10


class NotFound(ParleyError):
    status, code = "not_found", 11


class NoMemory(ParleyError):
    status, code = "no_memory", 12


class InternalError(ParleyError):
    status, code = "internal", 13


class StorageError(ParleyError):
    status, code = "storage", 14


class ContextOverflow(ParleyError):
    status, code = "context_overflow", 15


_BY_CODE = {cls.code: cls for cls in (InvalidInput, InvalidOptions, Busy, Cancelled, Timeout,
                                      ConnectError, RateLimited, HttpStatus, BadResponse,
                                      ToolLoop, NotFound, NoMemory, InternalError,
                                      StorageError, ContextOverflow)}


def error_for(code, name, message, **turn):
    """The exception for parley_status `code`; `name` is the plugin's
    status_name(code), so a status newer than this binding still gets its
    stable name (as a plain ParleyError)."""
    cls = _BY_CODE.get(code, ParleyError)
    return cls(message or name, status=name, code=code, **turn)
