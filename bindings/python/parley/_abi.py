"""ctypes mirror of include/parley/plugin.h (ABI version 1).

Every struct that crosses the boundary starts with `struct_size`.  Structs we
fill get our sizeof(); structs the plugin fills are read only up to the
struct_size it set (fields_within), so an older plugin (fewer fields) and a
newer one (more fields) both work.  New fields and functions are only ever
appended in the header: append them to the end of the matching list here.
"""
import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_size_t, c_uint32,
                    c_uint64, c_void_p)

ABI_VERSION = 1
ENTRY_SYMBOL = "parley_plugin_entry"

# enum parley_status values the binding itself needs (the rest map by number).
OK = 0
ERR_NOT_FOUND = 11

# -- callbacks the host gives the plugin ------------------------------------
# All are called on the agent's worker thread (log also on the create() thread).
LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
TOOL_CALL_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)   # info read via ToolCallInfo
DELTA_FN = CFUNCTYPE(None, c_void_p, c_uint64, c_void_p, c_size_t)
DONE_FN = CFUNCTYPE(None, c_void_p, c_void_p)                   # result read via Result


class ToolCallInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("request_id", c_uint64),
        ("conversation_id", c_char_p),
        ("turn_id", c_char_p),
        ("call_id", c_char_p),
        ("tool_name", c_char_p),
        ("arguments_json", c_char_p),
        ("user_data", c_void_p),
        ("language", c_char_p),
        ("device_id", c_char_p),
        ("satellite_id", c_char_p),
        ("agent_id", c_char_p),
        ("context_json", c_char_p),
        # appended after ABI 1.0 (fields_within reads only what the plugin's struct_size holds)
        ("interface_type", c_char_p),
        ("persona", c_char_p),
    ]


class Host(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("host_data", c_void_p),
        ("log", LOG_FN),
        ("tool_call", TOOL_CALL_FN),
    ]


class Input(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("text", c_char_p),
        ("conversation_id", c_char_p),
        ("language", c_char_p),
        ("device_id", c_char_p),
        ("satellite_id", c_char_p),
        ("agent_id", c_char_p),
        ("extra_system_prompt", c_char_p),
        ("context_json", c_char_p),
        ("tools_json", c_char_p),
        ("on_delta", DELTA_FN),
        # appended after ABI 1.0, in header order
        ("on_reasoning", DELTA_FN),
        ("metadata_json", c_char_p),
        ("interface_type", c_char_p),
        ("interface_message_id", c_char_p),
        ("reply_to_json", c_char_p),
        # personas and images
        ("persona", c_char_p),
        ("images_json", c_char_p),
        # structured output
        ("response_format_json", c_char_p),
        # host timestamps
        ("timestamp", c_char_p),
    ]


RESULT_FIELDS = [
    ("struct_size", c_uint32),
    ("request_id", c_uint64),
    ("status", c_int),
    ("error_message", c_char_p),
    ("conversation_id", c_char_p),
    ("turn_id", c_char_p),
    ("response", c_char_p),
    ("steps_json", c_char_p),
    ("continue_conversation", c_int),
]

# Fields appended to parley_result after ABI 1.0, in header order, as
# (C field name, ctypes type).  A plugin that predates a field has a smaller
# struct_size, and the field is then simply absent from Result.extra.  Add a
# line here when plugin.h gains a field; a "*_json" field is parsed, and
# "usage_json" / "stop_reason" also become Result.usage / Result.stop_reason,
# and the message identity fields Result attributes of the same names.
RESULT_APPENDED = [
    ("usage_json", c_char_p),
    ("stop_reason", c_char_p),
    ("user_message_id", c_char_p),
    ("answer_message_id", c_char_p),
    ("reply_context", c_char_p),
    ("structured_json", c_char_p),
]


def _result_struct(appended):
    return type("Result", (Structure,), {"_fields_": RESULT_FIELDS + list(appended)})


Result = _result_struct(RESULT_APPENDED)


def fields_within(struct_type, ptr):
    """Copy every field of the struct at `ptr` that lies within its struct_size.

    Pointers are only valid during the callback that passed them: this copies
    strings to bytes at once.  Returns {name: value} (absent when beyond
    struct_size)."""
    size = ctypes.cast(ptr, POINTER(c_uint32))[0]
    obj = ctypes.cast(ptr, POINTER(struct_type)).contents
    out = {}
    for name, ctype in struct_type._fields_:
        desc = getattr(struct_type, name)
        if desc.offset + desc.size > size:
            break
        out[name] = getattr(obj, name)
    return out


# -- the function table ------------------------------------------------------
# Functions returning an owned `char *` are declared c_void_p so we can free
# them with free_string after copying (c_char_p would lose the pointer).
_P = c_void_p
_PP = POINTER(c_void_p)

PLUGIN_FUNCTIONS = [
    ("create", CFUNCTYPE(_P, POINTER(Host), c_char_p, _PP)),
    ("destroy", CFUNCTYPE(None, _P)),
    ("async_process", CFUNCTYPE(c_int, _P, POINTER(Input), DONE_FN, c_void_p,
                                POINTER(c_uint64), _PP)),
    ("cancel", CFUNCTYPE(c_int, _P, c_uint64)),
    ("complete_tool_call", CFUNCTYPE(c_int, _P, c_char_p, c_int)),
    ("options_schema", CFUNCTYPE(_P)),
    ("free_string", CFUNCTYPE(None, _P)),
    ("status_name", CFUNCTYPE(c_char_p, c_int)),
    ("history_get", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("turn_get", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("conversations_list", CFUNCTYPE(c_int, _P, _PP)),
    ("history_clear", CFUNCTYPE(c_int, _P, c_char_p)),
    ("metrics", CFUNCTYPE(c_int, _P, _PP)),
    # Appended after ABI 1.0, in header order: present when struct_size covers them.
    ("check_connection", CFUNCTYPE(c_int, c_char_p, _PP, _PP)),
    ("update_options", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("history_query", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("message_get", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("history_get_by", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("history_clear_by", CFUNCTYPE(c_int, _P, c_char_p)),
    ("conversations_list_by", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("message_find", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("set_interface_message_id", CFUNCTYPE(c_int, _P, c_char_p, c_char_p)),
    ("append_message", CFUNCTYPE(c_int, _P, c_char_p, DONE_FN, c_void_p, POINTER(c_uint64),
                                 _PP)),
    ("last_error", CFUNCTYPE(_P)),
    ("persona_put", CFUNCTYPE(c_int, _P, c_char_p, c_char_p, _PP)),
    ("persona_remove", CFUNCTYPE(c_int, _P, c_char_p, _PP)),
    ("metrics_prometheus", CFUNCTYPE(c_int, _P, _PP)),
    # Further appended functions go here, in header order.
]


class PluginTable(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("name", c_char_p),
        ("version", c_char_p),
    ] + PLUGIN_FUNCTIONS


def table_function(table_ptr, name):
    """The table's function `name`, or None when the plugin's table is too
    short to have it (an older plugin) or the pointer is NULL."""
    desc = getattr(PluginTable, name)
    if desc.offset + desc.size > table_ptr.contents.struct_size:
        return None
    fn = getattr(table_ptr.contents, name)
    return fn if fn else None
