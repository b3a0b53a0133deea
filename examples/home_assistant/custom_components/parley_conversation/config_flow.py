"""A one-form setup: the LLM server, the model, the HA LLM APIs to expose and
HA's prompt template.  Any other Parley option (docs/options.md) can be
added to the entry's data; Parley checks them all when the entry is set up."""
from __future__ import annotations

import voluptuous as vol

from homeassistant.config_entries import ConfigFlow
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (SelectOptionDict, SelectSelector,
                                            SelectSelectorConfig, TemplateSelector)

from . import CONF_LLM_HASS_API, CONF_PLUGIN_PATH, CONF_PROMPT, DOMAIN


class ParleyConfigFlow(ConfigFlow, domain=DOMAIN):
    VERSION = 1

    async def async_step_user(self, user_input=None):
        if user_input is not None:
            return self.async_create_entry(title=user_input["model"], data=user_input)
        apis = [SelectOptionDict(label=api.name, value=api.id)
                for api in llm.async_get_apis(self.hass)]
        schema = vol.Schema({
            vol.Required("base_url", default="http://127.0.0.1:11434/v1"): str,
            vol.Required("model"): str,
            vol.Optional(CONF_LLM_HASS_API): SelectSelector(
                SelectSelectorConfig(options=apis, multiple=True)),
            vol.Optional(CONF_PROMPT): TemplateSelector(),
            vol.Optional("stream", default=False): bool,
            vol.Optional(CONF_PLUGIN_PATH): str,
        })
        return self.async_show_form(step_id="user", data_schema=schema)
