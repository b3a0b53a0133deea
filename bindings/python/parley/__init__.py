"""Parley for Python: an asyncio binding to the parley.so conversation-agent
plugin (ctypes, standard library only).  See docs/python.md.

    import asyncio, parley

    async def main():
        async with parley.Agent({"model": "llama3.2"}) as agent:
            r = await agent.process("hello", language="en")
            print(r.response)

    asyncio.run(main())
"""
from .agent import Agent, Result
from .tools import ToolCall, tool, tool_declaration
from .errors import (BadResponse, Busy, Cancelled, ConnectError, ContextOverflow, HttpStatus,
                     InternalError, InvalidInput, InvalidOptions, NoMemory, NotFound,
                     ParleyError, PluginLoadError, RateLimited, StorageError, Timeout, ToolLoop)
from .plugin import Plugin, candidate_paths, check_connection, load_plugin, options_schema

from ._abi import ABI_VERSION

__all__ = [
    "Agent", "Result", "ToolCall", "tool", "tool_declaration",
    "Plugin", "load_plugin", "candidate_paths", "options_schema", "check_connection",
    "ABI_VERSION",
    "ParleyError", "PluginLoadError", "InvalidInput", "InvalidOptions", "Busy", "Cancelled",
    "Timeout", "ConnectError", "RateLimited", "HttpStatus", "BadResponse", "ToolLoop",
    "NotFound", "NoMemory", "InternalError", "StorageError", "ContextOverflow",
]
