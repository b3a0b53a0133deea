"""Parley conversation agent for Home Assistant (an example integration).

The config entry holds Parley's options (docs/options.md) plus three keys of
this integration: "plugin_path" (optional: where parley.so is, else the
binding's search order), "llm_hass_api" (the HA LLM APIs whose tools the
model may call, e.g. ["assist"]) and "prompt" (Home Assistant's prompt
template, rendered by HA per turn).  One parley.Agent per entry, closed when
the entry is unloaded.
"""
from __future__ import annotations

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryError

from .parley import Agent, InvalidOptions, PluginLoadError, load_plugin

DOMAIN = "parley_conversation"
PLATFORMS = [Platform.CONVERSATION]

# Entry keys that belong to this integration, not to Parley's options.
CONF_PLUGIN_PATH = "plugin_path"
CONF_LLM_HASS_API = "llm_hass_api"
CONF_PROMPT = "prompt"
INTEGRATION_KEYS = (CONF_PLUGIN_PATH, CONF_LLM_HASS_API, CONF_PROMPT)


def parley_options(data: dict) -> dict:
    """Parley's options from the entry: everything but our own keys.  The
    system prompt is Home Assistant's (rendered per turn and sent as the
    turn's extra_system_prompt), so Parley's own prompt is empty."""
    options = {k: v for k, v in data.items() if k not in INTEGRATION_KEYS}
    options["prompt"] = ""
    return options


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    data = {**entry.data, **entry.options}
    try:
        # dlopen and pkg-config are blocking: not on the event loop.
        plugin = await hass.async_add_executor_job(load_plugin, data.get(CONF_PLUGIN_PATH))
        # Made on the event loop: the agent belongs to it.
        entry.runtime_data = Agent(parley_options(data), plugin=plugin)
    except (PluginLoadError, InvalidOptions) as err:
        raise ConfigEntryError(str(err)) from err  # shown on the integration's card
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    unloaded = await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
    if unloaded:
        await entry.runtime_data.aclose()  # cancels turns in flight, frees the agent
    return unloaded
