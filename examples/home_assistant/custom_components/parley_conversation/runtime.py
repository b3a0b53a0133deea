"""What a loaded config entry holds: the plugin, and per subentry one
parley.Agent with the options it runs under.

Parley's options come from the entry (the connection) and the subentry (the
agent).  A changed subentry is applied to the live agent with
update_options, so no memory and no turn in flight is lost; only an option
Parley cannot change live (where the memory is kept, its idle expiry) makes
a new agent, and the memory is in an SQLite file that the new agent opens
again.  Home Assistant's stable prompt is Parley's own `prompt` option (the
cached system prompt); when it changes the agent is updated under a lock,
together with starting the turn it is for.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from .const import (CONF_API_KEY, CONF_BASE_URL, CONF_MAX_TOKENS, CONF_MEMORY,
                    CONF_MEMORY_IDLE_HOURS, CONF_MEMORY_TURNS, CONF_MODEL,
                    CONF_PARLEY_OPTIONS, CONF_PROVIDER, CONF_STREAM, CONF_TEMPERATURE,
                    MAX_INPUT_BYTES, MEMORY_CONVERSATION, RECOMMENDED_OPTIONS,
                    SUBENTRY_AI_TASK)
from .parley import Agent, InvalidOptions, ParleyError

# HA forgets its own conversation after 5 idle minutes; a memory that belongs
# to it is kept a little longer, then dropped (it could never be reached again).
CONVERSATION_IDLE_S = 900


def setting(sub: dict, key: str):
    return sub.get(key, RECOMMENDED_OPTIONS.get(key))


def connection_options(entry_data: dict) -> dict:
    options = {"provider": entry_data.get(CONF_PROVIDER) or "openai"}
    if entry_data.get(CONF_BASE_URL):
        options["base_url"] = entry_data[CONF_BASE_URL]
    if entry_data.get(CONF_API_KEY):
        options["api_key"] = entry_data[CONF_API_KEY]
    return options


def parley_options(entry_data: dict, sub_type: str, sub: dict, store: str | None,
                   prompt: str = "") -> dict:
    """Parley's options (docs/options.md) for one subentry."""
    options = connection_options(entry_data)
    options.update(model=sub.get(CONF_MODEL) or "", prompt=prompt,
                   max_input_bytes=MAX_INPUT_BYTES)
    if sub.get(CONF_TEMPERATURE) is not None:
        options["temperature"] = float(sub[CONF_TEMPERATURE])
    if sub.get(CONF_MAX_TOKENS) is not None:  # a NumberSelector gives a float
        options["max_tokens"] = int(sub[CONF_MAX_TOKENS])
    if sub_type != SUBENTRY_AI_TASK:
        options["stream"] = bool(setting(sub, CONF_STREAM))
        options["max_history_turns"] = int(setting(sub, CONF_MEMORY_TURNS))
        if store:
            options["history_store"] = store
        if setting(sub, CONF_MEMORY) == MEMORY_CONVERSATION:
            options["history_idle_timeout_s"] = CONVERSATION_IDLE_S
        else:
            options["history_idle_timeout_s"] = int(float(setting(sub, CONF_MEMORY_IDLE_HOURS))
                                                    * 3600)
    options.update(sub.get(CONF_PARLEY_OPTIONS) or {})
    return options


@dataclass
class AgentHandle:
    """One subentry's agent."""
    entry_data: dict
    sub_type: str
    data: dict
    store: str | None
    plugin: object
    prompt: str = ""
    agent: Agent | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    synced: dict = field(default_factory=dict)   # HA conversation id -> chat log items seen

    def options(self) -> dict:
        return parley_options(self.entry_data, self.sub_type, self.data, self.store,
                              self.prompt)

    def start(self) -> None:
        """Make the agent (on the event loop: it belongs to it).  Raises
        parley.InvalidOptions naming a bad option."""
        self.agent = Agent(self.options(), plugin=self.plugin)

    async def apply(self, entry_data: dict, data: dict) -> None:
        """Changed entry or subentry data: update the live agent; a new agent
        (on the same store) only for an option that cannot change live."""
        before = self.entry_data, self.data
        old = self.options()
        self.entry_data, self.data = entry_data, data
        if self.options() == old:
            return
        async with self.lock:
            try:
                await self.agent.update_options(self.options())
                return
            except InvalidOptions as err:
                if "cannot change on a live agent" not in str(err):
                    self.entry_data, self.data = before  # the agent runs on unchanged
                    raise
            await self.agent.aclose()
            self.start()

    async def begin(self, prompt: str, start) -> asyncio.Task:
        """Run start() (a coroutine that submits one turn) with the agent's
        cached prompt set to `prompt`; the turn is submitted before any other
        prompt change can come in between."""
        async with self.lock:
            if prompt != self.prompt:
                self.prompt = prompt
                await self.agent.update_options(self.options())
            task = asyncio.ensure_future(start())
            await asyncio.sleep(0)  # the task's first step submits the turn
        return task

    def remember_synced(self, ha_conversation_id: str, count: int) -> None:
        self.synced.pop(ha_conversation_id, None)
        self.synced[ha_conversation_id] = count
        while len(self.synced) > 256:  # HA's ids die after 5 idle minutes
            self.synced.pop(next(iter(self.synced)))

    async def aclose(self) -> None:
        if self.agent is not None:
            await self.agent.aclose()


@dataclass
class ParleyData:
    """A config entry's runtime_data."""
    plugin: object
    agents: dict = field(default_factory=dict)     # subentry id -> AgentHandle
    entities: dict = field(default_factory=dict)   # entity id -> AgentHandle


def store_for(storage_dir: str, subentry_id: str) -> str:
    return "sqlite:" + os.path.join(storage_dir, subentry_id + ".sqlite")


def error_key(err: ParleyError) -> str:
    """The config flow's error key for a failed connection check."""
    text = str(err)
    if err.status == "http_status" and ("HTTP 401" in text or "HTTP 403" in text):
        return "invalid_auth"
    if err.status in ("connect", "timeout", "http_status", "bad_response"):
        return "cannot_connect"
    if err.status == "invalid_options":
        return "invalid_url"
    if err.status == "plugin_load":
        return "plugin_not_found"
    return "unknown"
