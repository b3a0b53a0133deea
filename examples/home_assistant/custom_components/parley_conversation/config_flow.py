"""Setup, as in Home Assistant's own LLM integrations: the config entry is the
connection (provider, URL, key), checked with Parley's connection check
before it is saved (a refused key or a dead URL is a form error with Parley's
own sentence); each agent is a `conversation` subentry and each AI Task
entity an `ai_task_data` subentry, with the server's models offered in a
list.  Reconfiguring either changes the live agents in place (update
listener in __init__.py): no memory is lost."""
from __future__ import annotations

import logging
from typing import Any

import voluptuous as vol

from homeassistant.config_entries import (ConfigEntry, ConfigEntryState, ConfigFlow,
                                          ConfigFlowResult, ConfigSubentryFlow,
                                          SubentryFlowResult)
from homeassistant.const import CONF_NAME
from homeassistant.core import callback
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (BooleanSelector, NumberSelector,
                                            NumberSelectorConfig, NumberSelectorMode,
                                            SelectOptionDict, SelectSelector,
                                            SelectSelectorConfig, SelectSelectorMode,
                                            TemplateSelector, TextSelector,
                                            TextSelectorConfig, TextSelectorType)

from .const import (CONF_API_KEY, CONF_BASE_URL, CONF_LLM_HASS_API, CONF_MAX_TOKENS,
                    CONF_MEMORY, CONF_MEMORY_IDLE_HOURS, CONF_MEMORY_TURNS, CONF_MODEL,
                    CONF_PLUGIN_PATH, CONF_PROMPT, CONF_PROVIDER, CONF_RECOMMENDED,
                    CONF_STREAM, CONF_TEMPERATURE, DEFAULT_AI_TASK_NAME,
                    DEFAULT_CONVERSATION_NAME, DEFAULT_PROVIDER, DOMAIN, MEMORIES,
                    PROVIDERS, RECOMMENDED_OPTIONS, SUBENTRY_AI_TASK, SUBENTRY_CONVERSATION)
from .parley import ParleyError, load_plugin
from .runtime import connection_options, error_key

_LOGGER = logging.getLogger(__name__)

# Settings the form shows only with "recommended" off (their recommended
# values: RECOMMENDED_OPTIONS, or Parley's defaults).
ADVANCED = (CONF_STREAM, CONF_MEMORY_TURNS, CONF_MEMORY_IDLE_HOURS, CONF_TEMPERATURE,
            CONF_MAX_TOKENS)


def connection_schema() -> vol.Schema:
    return vol.Schema({
        vol.Required(CONF_PROVIDER, default=DEFAULT_PROVIDER): SelectSelector(
            SelectSelectorConfig(options=PROVIDERS, translation_key=CONF_PROVIDER,
                                 mode=SelectSelectorMode.DROPDOWN)),
        vol.Required(CONF_BASE_URL): TextSelector(TextSelectorConfig(type=TextSelectorType.URL)),
        vol.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)),
        vol.Optional(CONF_PLUGIN_PATH): TextSelector(),
    })


def _clean(user_input: dict) -> dict:
    data = {k: v.strip() if isinstance(v, str) else v for k, v in user_input.items()}
    return {k: v for k, v in data.items() if v not in ("", None)}


async def validate_connection(hass, data: dict) -> tuple[dict, dict, list]:
    """(errors, placeholders, models) of a connection check with these entry
    data; errors empty when the server answered with its models."""
    try:
        plugin = await hass.async_add_executor_job(load_plugin, data.get(CONF_PLUGIN_PATH))
        checked = await hass.async_add_executor_job(
            plugin.check_connection, dict(connection_options(data), model="-"))
    except ParleyError as err:
        return {"base": error_key(err)}, {"error": str(err.message)}, []
    return {}, {}, list(checked.get("models") or [])


class ParleyConfigFlow(ConfigFlow, domain=DOMAIN):
    VERSION = 2

    async def async_step_user(self, user_input: dict[str, Any] | None = None
                              ) -> ConfigFlowResult:
        errors, placeholders = {}, {}
        if user_input is not None:
            data = _clean(user_input)
            self._async_abort_entries_match({CONF_BASE_URL: data[CONF_BASE_URL]})
            errors, placeholders, models = await validate_connection(self.hass, data)
            if not errors:
                model = models[0] if models else ""
                return self.async_create_entry(
                    title=data[CONF_BASE_URL], data=data,
                    subentries=[
                        {"subentry_type": SUBENTRY_CONVERSATION, "title": DEFAULT_CONVERSATION_NAME,
                         "data": {CONF_MODEL: model, CONF_RECOMMENDED: True,
                                  CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
                                  **RECOMMENDED_OPTIONS},
                         "unique_id": None},
                        {"subentry_type": SUBENTRY_AI_TASK, "title": DEFAULT_AI_TASK_NAME,
                         "data": {CONF_MODEL: model, CONF_RECOMMENDED: True},
                         "unique_id": None},
                    ])
        return self.async_show_form(
            step_id="user", errors=errors, description_placeholders=placeholders,
            data_schema=self.add_suggested_values_to_schema(connection_schema(),
                                                            user_input or {}))

    async def async_step_reconfigure(self, user_input: dict[str, Any] | None = None
                                     ) -> ConfigFlowResult:
        """A new URL or key for the connection: checked, then applied to the
        live agents by the update listener (no reload, nothing forgotten)."""
        entry = self._get_reconfigure_entry()
        errors, placeholders = {}, {}
        if user_input is not None:
            data = _clean(user_input)
            errors, placeholders, _models = await validate_connection(self.hass, data)
            if not errors:
                self.hass.config_entries.async_update_entry(entry, data=data,
                                                            title=data[CONF_BASE_URL])
                return self.async_abort(reason="reconfigure_successful")
        return self.async_show_form(
            step_id="reconfigure", errors=errors, description_placeholders=placeholders,
            data_schema=self.add_suggested_values_to_schema(connection_schema(),
                                                            user_input or dict(entry.data)))

    @classmethod
    @callback
    def async_get_supported_subentry_types(cls, config_entry: ConfigEntry
                                           ) -> dict[str, type[ConfigSubentryFlow]]:
        return {SUBENTRY_CONVERSATION: ParleySubentryFlow, SUBENTRY_AI_TASK: ParleySubentryFlow}


class ParleySubentryFlow(ConfigSubentryFlow):
    """Add or reconfigure an agent or an AI Task entity.  With "recommended"
    on, the form holds the essentials; switching it off shows the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.options: dict[str, Any] = {}

    @property
    def _is_new(self) -> bool:
        return self.source == "user"

    async def async_step_set_options(self, user_input: dict[str, Any] | None = None
                                     ) -> SubentryFlowResult:
        entry = self._get_entry()
        if entry.state != ConfigEntryState.LOADED:
            return self.async_abort(reason="entry_not_loaded")
        if user_input is None:
            if self._is_new:
                name = (DEFAULT_AI_TASK_NAME if self._subentry_type == SUBENTRY_AI_TASK
                        else DEFAULT_CONVERSATION_NAME)
                self.options = {CONF_NAME: name, CONF_RECOMMENDED: True, **(
                    {} if self._subentry_type == SUBENTRY_AI_TASK else
                    {CONF_LLM_HASS_API: [llm.LLM_API_ASSIST], **RECOMMENDED_OPTIONS})}
            else:
                self.options = dict(self._get_reconfigure_subentry().data)
        else:
            recommended_was = self.options.get(CONF_RECOMMENDED)
            self.options = {**self.options, **user_input}
            if user_input.get(CONF_LLM_HASS_API) == []:
                self.options.pop(CONF_LLM_HASS_API, None)
            if user_input.get(CONF_RECOMMENDED) == recommended_was:
                data = dict(self.options)
                if data.get(CONF_RECOMMENDED):
                    for key in ADVANCED:
                        data.pop(key, None)
                if self._is_new:
                    title = data.pop(CONF_NAME)
                    return self.async_create_entry(title=title, data=data)
                return self.async_update_and_abort(entry, self._get_reconfigure_subentry(),
                                                   data=data)
            # "recommended" switched: show the form again, with or without the rest.
        _errors, _placeholders, models = await validate_connection(self.hass, dict(entry.data))
        return self.async_show_form(
            step_id="set_options",
            data_schema=self.add_suggested_values_to_schema(
                vol.Schema(self._schema(models)), self.options))

    async_step_user = async_step_set_options
    async_step_reconfigure = async_step_set_options

    def _schema(self, models: list) -> dict:
        schema: dict = {}
        if self._is_new:
            schema[vol.Required(CONF_NAME)] = str
        schema[vol.Required(CONF_MODEL)] = SelectSelector(SelectSelectorConfig(
            options=[SelectOptionDict(label=m, value=m) for m in models], custom_value=True,
            mode=SelectSelectorMode.DROPDOWN))
        conversation = self._subentry_type == SUBENTRY_CONVERSATION
        if conversation:
            schema[vol.Optional(CONF_PROMPT)] = TemplateSelector()
            schema[vol.Optional(CONF_LLM_HASS_API)] = SelectSelector(SelectSelectorConfig(
                options=[SelectOptionDict(label=api.name, value=api.id)
                         for api in llm.async_get_apis(self.hass)], multiple=True))
            schema[vol.Required(CONF_MEMORY)] = SelectSelector(SelectSelectorConfig(
                options=MEMORIES, translation_key=CONF_MEMORY))
        schema[vol.Required(CONF_RECOMMENDED)] = BooleanSelector()
        if self.options.get(CONF_RECOMMENDED):
            return schema
        if conversation:
            schema[vol.Optional(CONF_STREAM)] = BooleanSelector()
            schema[vol.Optional(CONF_MEMORY_TURNS)] = NumberSelector(NumberSelectorConfig(
                min=0, max=1000, step=1, mode=NumberSelectorMode.BOX))
            schema[vol.Optional(CONF_MEMORY_IDLE_HOURS)] = NumberSelector(NumberSelectorConfig(
                min=0, max=8760, step=0.5, mode=NumberSelectorMode.BOX))
        schema[vol.Optional(CONF_TEMPERATURE)] = NumberSelector(NumberSelectorConfig(
            min=0, max=2, step=0.05))
        schema[vol.Optional(CONF_MAX_TOKENS)] = NumberSelector(NumberSelectorConfig(
            min=1, max=1048576, step=1, mode=NumberSelectorMode.BOX))
        return schema
