"""Finding and loading parley.so, and the calls that need no agent.

Where the plugin is looked for, first match wins:
  1. the `path` argument (Agent(plugin=...), load_plugin(path));
  2. the PARLEY_PLUGIN environment variable (a path to parley.so);
  3. `pkg-config --variable=plugindir parley` + "/parley.so", when pkg-config
     knows parley (an installed Parley; PKG_CONFIG_PATH as usual);
  4. parley.so next to this package (parley/parley.so), for bundled copies.
"""
import ctypes
import json
import os
import shutil
import subprocess
import threading

from . import _abi
from .errors import ParleyError, PluginLoadError, error_for

PLUGIN_FILE = "parley.so"

_cache = {}
_cache_lock = threading.Lock()


def _pkg_config_plugindir():
    exe = shutil.which("pkg-config")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--variable=plugindir", "parley"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return value if out.returncode == 0 and value else None


def candidate_paths(path=None):
    """[(where, path)] in the order load_plugin() tries them."""
    if path is not None:
        return [("path argument", os.fspath(path))]
    found = []
    env = os.environ.get("PARLEY_PLUGIN")
    if env:
        found.append(("PARLEY_PLUGIN", env))
    plugindir = _pkg_config_plugindir()
    if plugindir:
        found.append(("pkg-config plugindir",
                      os.path.normpath(os.path.join(plugindir, PLUGIN_FILE))))
    found.append(("next to the package",
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), PLUGIN_FILE)))
    return found


def load_plugin(path=None):
    """The Plugin at `path`, or found as the module docstring says.  Loaded
    once per file and shared by every Agent."""
    tried = []
    for where, p in candidate_paths(path):
        if path is None and not os.path.exists(p):
            tried.append("%s (%s): no such file" % (p, where))
            continue
        key = os.path.realpath(p)
        with _cache_lock:
            if key not in _cache:
                _cache[key] = Plugin(p)
            return _cache[key]
    raise PluginLoadError("cannot find %s; tried: %s. Pass its path, set PARLEY_PLUGIN, or "
                          "install Parley so pkg-config finds it" % (PLUGIN_FILE, "; ".join(tried)))


class Plugin:
    """One loaded parley.so and its function table (static; never unloaded)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._lib = ctypes.CDLL(self.path)  # RTLD_LOCAL: one exported symbol matters
        except OSError as e:
            raise PluginLoadError("cannot load %s: %s" % (self.path, e)) from None
        try:
            entry = self._lib[_abi.ENTRY_SYMBOL]
        except AttributeError:
            raise PluginLoadError("%s is not a Parley plugin: it has no symbol %s"
                                  % (self.path, _abi.ENTRY_SYMBOL)) from None
        entry.restype = ctypes.POINTER(_abi.PluginTable)
        entry.argtypes = [ctypes.c_uint32]
        table = entry(_abi.ABI_VERSION)
        if not table:
            raise PluginLoadError("%s does not serve Parley ABI version %d (the plugin is too "
                                  "old or too new for this binding)"
                                  % (self.path, _abi.ABI_VERSION))
        self._table = table
        self.abi_version = table.contents.abi_version
        self.name = (table.contents.name or b"").decode()
        self.version = (table.contents.version or b"").decode()
        for required in ("create", "destroy", "async_process", "cancel", "complete_tool_call",
                         "free_string", "status_name"):
            if self.function(required) is None:
                raise PluginLoadError("%s: its function table lacks %s" % (self.path, required))

    def __repr__(self):
        return "<parley.Plugin %s %s at %s>" % (self.name, self.version, self.path)

    def function(self, name):
        """The table's function, or None when this plugin predates it."""
        return _abi.table_function(self._table, name)

    def require(self, name):
        fn = self.function(name)
        if fn is None:
            raise ParleyError("%s %s has no %s() (added in a later version)"
                              % (self.name, self.version, name), status="not_supported")
        return fn

    def status_name(self, code):
        name = self.function("status_name")(code)
        return name.decode() if name else "unknown"

    def take_string(self, ptr):
        """Copy a plugin-owned char * to str and free it."""
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self.function("free_string")(ptr)

    def last_error(self):
        """Why the history function this thread just called failed, in the plugin's
        words (parley_plugin.last_error), or None (also from a plugin without it)."""
        fn = self.function("last_error")
        return self.take_string(fn()) if fn is not None else None

    def error(self, code, message, **turn):
        return error_for(code, self.status_name(code), message, **turn)

    def options_schema(self):
        """JSON Schema (a dict) of every option, with defaults."""
        return json.loads(self.take_string(self.require("options_schema")()))

    def check_connection(self, options):
        """Blocking: can these options (a dict, as for Agent) reach the server?
        {"ok": True, "url": ..., "models": [...]}, or raises the error for the
        plugin's status (parley.ConnectError, HttpStatus, Timeout, InvalidOptions,
        BadResponse, ...) carrying its sentence for a person.  Takes at most
        connect_timeout_ms + request_timeout_ms; use the async
        parley.check_connection() from an event loop."""
        fn = self.require("check_connection")
        text = options if isinstance(options, (str, bytes)) else json.dumps(options)
        out, err = ctypes.c_void_p(), ctypes.c_void_p()
        status = fn(text.encode() if isinstance(text, str) else text, ctypes.byref(out),
                    ctypes.byref(err))
        result, message = self.take_string(out.value), self.take_string(err.value)
        if status != _abi.OK:
            raise self.error(status, message or "check_connection() failed")
        return json.loads(result)


def options_schema(plugin=None):
    """The options JSON Schema of the plugin found by load_plugin(plugin)."""
    return (plugin if isinstance(plugin, Plugin) else load_plugin(plugin)).options_schema()


async def check_connection(options, plugin=None):
    """Check options before saving them (a setup form): the connection check runs
    on an executor thread, never on the event loop.  Returns {"ok": True, "url",
    "models": [model ids]}; raises parley.ConnectError / HttpStatus / Timeout /
    RateLimited / BadResponse / InvalidOptions, whose message says what to fix
    ("nothing listens at ...; is the server running?").  plugin: a Plugin or a
    path to parley.so (default: load_plugin())."""
    import asyncio
    p = plugin if isinstance(plugin, Plugin) else load_plugin(plugin)
    return await asyncio.get_running_loop().run_in_executor(None, p.check_connection, options)
