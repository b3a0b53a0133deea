"""Parley conversation agent for Home Assistant (an example integration).

The config entry is the connection to one LLM server (provider, URL, key);
each `conversation` subentry is an agent and each `ai_task_data` subentry an
AI Task entity, as in Home Assistant's own LLM integrations.  Per subentry
one parley.Agent (runtime.py), made at setup, changed in place when the
subentry or the connection changes, closed at unload.  Memories are kept in
one SQLite file per agent under the configuration directory, so they survive
restarts; the `forget` service clears one or all.
"""
from __future__ import annotations

import logging
import os

import voluptuous as vol

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant, ServiceCall
from homeassistant.exceptions import ConfigEntryError, ServiceValidationError
from homeassistant.helpers import config_validation as cv

from .const import CONF_PLUGIN_PATH, DOMAIN, SERVICE_FORGET, SUBENTRY_AI_TASK
from .parley import InvalidOptions, NotFound, PluginLoadError, load_plugin
from .runtime import AgentHandle, ParleyData, store_for

_LOGGER = logging.getLogger(__name__)

PLATFORMS = [Platform.AI_TASK, Platform.CONVERSATION]
CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)

FORGET_SCHEMA = vol.Schema({
    vol.Optional("entity_id"): cv.entity_ids,
    vol.Optional("memory_id"): cv.string,
})


async def async_setup(hass: HomeAssistant, config: dict) -> bool:
    """The forget service: one memory (memory_id: "device:<satellite or
    device>", "user:<user id>", "home", or HA's conversation id) or all, of
    the agents named (entity_id) or of every Parley agent."""

    async def forget(call: ServiceCall) -> None:
        wanted = call.data.get("entity_id")
        memory_id = call.data.get("memory_id")
        handles = []
        for entry in hass.config_entries.async_loaded_entries(DOMAIN):
            for entity_id, handle in entry.runtime_data.entities.items():
                if wanted is None or entity_id in wanted:
                    handles.append(handle)
        if wanted is not None and not handles:
            raise ServiceValidationError("no Parley agent among %s" % ", ".join(wanted))
        for handle in handles:
            try:
                await handle.agent.clear_history(memory_id)
            except NotFound:
                pass  # that agent never had this memory
            handle.synced.clear()

    hass.services.async_register(DOMAIN, SERVICE_FORGET, forget, schema=FORGET_SCHEMA)
    return True


def storage_dir(hass: HomeAssistant) -> str:
    return hass.config.path(".storage", DOMAIN)


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    try:
        # dlopen and pkg-config block: not on the event loop.
        plugin = await hass.async_add_executor_job(load_plugin,
                                                   entry.data.get(CONF_PLUGIN_PATH) or None)
    except PluginLoadError as err:
        raise ConfigEntryError(str(err)) from err  # shown on the integration's card
    folder = storage_dir(hass)
    await hass.async_add_executor_job(lambda: os.makedirs(folder, exist_ok=True))
    data = ParleyData(plugin)
    try:
        for subentry in entry.subentries.values():
            store = (None if subentry.subentry_type == SUBENTRY_AI_TASK
                     else store_for(folder, subentry.subentry_id))
            handle = AgentHandle(dict(entry.data), subentry.subentry_type, dict(subentry.data),
                                 store, plugin)
            handle.start()  # on the event loop: the agent belongs to it
            data.agents[subentry.subentry_id] = handle
    except InvalidOptions as err:
        for handle in data.agents.values():
            await handle.aclose()
        raise ConfigEntryError(str(err)) from err
    entry.runtime_data = data
    entry.async_on_unload(entry.add_update_listener(async_update_entry))
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_update_entry(hass: HomeAssistant, entry: ConfigEntry) -> None:
    """The connection or a subentry changed: apply it to the live agents.  A
    subentry added or removed changes the entities: reload."""
    data: ParleyData = entry.runtime_data
    if set(entry.subentries) != set(data.agents):
        await hass.config_entries.async_reload(entry.entry_id)
        return
    for subentry_id, handle in data.agents.items():
        try:
            await handle.apply(dict(entry.data), dict(entry.subentries[subentry_id].data))
        except InvalidOptions as err:
            _LOGGER.error("%s: %s", entry.subentries[subentry_id].title, err)


async def async_unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    unloaded = await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
    if unloaded:
        for handle in entry.runtime_data.agents.values():
            await handle.aclose()  # cancels turns in flight, frees the agent
    return unloaded
