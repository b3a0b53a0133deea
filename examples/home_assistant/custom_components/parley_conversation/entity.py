"""What the conversation and AI Task entities share: the subentry's agent,
the unique id (the subentry's id) and a device per subentry, as in Home
Assistant's own LLM integrations."""
from __future__ import annotations

from homeassistant.config_entries import ConfigEntry, ConfigSubentry
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.entity import Entity

from .const import CONF_MODEL, CONF_PROVIDER, DOMAIN
from .runtime import AgentHandle


class ParleyEntity(Entity):
    _attr_has_entity_name = True
    _attr_name = None

    def __init__(self, entry: ConfigEntry, subentry: ConfigSubentry) -> None:
        self.entry = entry
        self.subentry = subentry
        self._attr_unique_id = subentry.subentry_id
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, subentry.subentry_id)},
            name=subentry.title,
            manufacturer="Parley (%s)" % (entry.data.get(CONF_PROVIDER) or "openai"),
            model=subentry.data.get(CONF_MODEL),
            entry_type=dr.DeviceEntryType.SERVICE,
        )

    @property
    def handle(self) -> AgentHandle:
        return self.entry.runtime_data.agents[self.subentry.subentry_id]

    async def async_added_to_hass(self) -> None:
        await super().async_added_to_hass()
        self.entry.runtime_data.entities[self.entity_id] = self.handle

    async def async_will_remove_from_hass(self) -> None:
        self.entry.runtime_data.entities.pop(self.entity_id, None)
        await super().async_will_remove_from_hass()
