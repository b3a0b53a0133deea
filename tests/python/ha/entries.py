"""Stand-ins for homeassistant/config_entries.py (ConfigEntry with
subentries, ConfigFlow, ConfigSubentryFlow, the flow managers),
data_entry_flow.py, helpers/entity.py, helpers/restore_state.py,
helpers/entity_platform.py and helpers/device_registry.py (DeviceInfo),
read from home-assistant/core dev (2026 snapshot: ollama/config_flow.py
and __init__.py there are the flows and setup these follow).

As in HA: a form's user input is validated against its data_schema before
the step sees it; a config flow's entry is added and set up (the
integration's async_setup once, then async_setup_entry, errors to the
entry's state); async_update_entry / async_update_subentry run the update
listeners as tasks (test: await hass.async_block_till_done()); adding or
removing a subentry does too; an abort raised in a step (AbortFlow) ends the
flow; platforms are the integration's modules, their entities get hass,
an entity id and async_added_to_hass."""
import dataclasses
import enum
import importlib
import re
from types import MappingProxyType

from . import core, schemas

# -- data_entry_flow.py --------------------------------------------------------------


class FlowResultType(enum.StrEnum):
    FORM = "form"
    CREATE_ENTRY = "create_entry"
    ABORT = "abort"


class AbortFlow(Exception):
    def __init__(self, reason, description_placeholders=None):
        super().__init__(reason)
        self.reason = reason
        self.description_placeholders = description_placeholders


class UnknownHandler(Exception):
    pass


class FlowHandler:
    hass = None
    handler = None
    flow_id = None
    context: dict = {}

    @property
    def source(self):
        return self.context.get("source")

    def async_show_form(self, *, step_id, data_schema=None, errors=None,
                        description_placeholders=None, last_step=None):
        return {"type": FlowResultType.FORM, "flow_id": self.flow_id, "handler": self.handler,
                "step_id": step_id, "data_schema": data_schema, "errors": errors,
                "description_placeholders": description_placeholders}

    def async_abort(self, *, reason, description_placeholders=None):
        return {"type": FlowResultType.ABORT, "flow_id": self.flow_id, "handler": self.handler,
                "reason": reason, "description_placeholders": description_placeholders}

    def add_suggested_values_to_schema(self, data_schema, suggested_values):
        schema = {}
        for key, validator in data_schema.schema.items():
            if isinstance(key, schemas.Marker) and suggested_values \
                    and key.schema in suggested_values:
                new_key = type(key)(key.schema, default=key.default,
                                    description={"suggested_value":
                                                 suggested_values[key.schema]})
            else:
                new_key = key
            schema[new_key] = validator
        return schemas.Schema(schema)


# -- config_entries.py ---------------------------------------------------------------

class ConfigEntryState(enum.Enum):
    LOADED = "loaded"
    SETUP_ERROR = "setup_error"
    SETUP_RETRY = "setup_retry"
    NOT_LOADED = "not_loaded"


UNDEFINED = object()
HANDLERS = {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigSubentry:
    data: MappingProxyType
    subentry_id: str = dataclasses.field(default_factory=core.ulid_now)
    subentry_type: str
    title: str
    unique_id: str | None


class ConfigEntry:
    def __init__(self, *, domain, title, data, options=None, subentries_data=(), version=1,
                 minor_version=1, unique_id=None, entry_id=None, source="user"):
        self.domain, self.title, self.source = domain, title, source
        self.entry_id = entry_id or core.ulid_now()
        self.data = MappingProxyType(dict(data))
        self.options = MappingProxyType(dict(options or {}))
        self.version, self.minor_version, self.unique_id = version, minor_version, unique_id
        subs = {}
        for sub in subentries_data:
            s = ConfigSubentry(data=MappingProxyType(dict(sub["data"])),
                               subentry_type=sub["subentry_type"], title=sub["title"],
                               unique_id=sub.get("unique_id"),
                               **({"subentry_id": sub["subentry_id"]} if "subentry_id" in sub
                                  else {}))
            subs[s.subentry_id] = s
        self.subentries = MappingProxyType(subs)
        self.state = ConfigEntryState.NOT_LOADED
        self.reason = None
        self.runtime_data = None
        self.update_listeners = []
        self._on_unload = []

    def add_update_listener(self, listener):
        self.update_listeners.append(listener)
        return lambda: self.update_listeners.remove(listener)

    def async_on_unload(self, func):
        self._on_unload.append(func)


class ConfigFlow(FlowHandler):
    VERSION = 1
    MINOR_VERSION = 1

    def __init_subclass__(cls, *, domain=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if domain is not None:
            HANDLERS[domain] = cls

    async def async_set_unique_id(self, unique_id=None, *, raise_on_progress=True):
        self.context["unique_id"] = unique_id

    def _abort_if_unique_id_configured(self):
        for entry in self.hass.config_entries.async_entries(self.handler):
            if entry.unique_id is not None and entry.unique_id == self.context.get("unique_id"):
                raise AbortFlow("already_configured")

    def _async_abort_entries_match(self, match_dict=None):
        for entry in self.hass.config_entries.async_entries(self.handler):
            if all(entry.data.get(k) == v for k, v in (match_dict or {}).items()):
                raise AbortFlow("already_configured")

    def _get_reconfigure_entry(self):
        return self.hass.config_entries.async_get_known_entry(self.context["entry_id"])

    def async_create_entry(self, *, title, data, description=None,
                           description_placeholders=None, options=None, subentries=None):
        return {"type": FlowResultType.CREATE_ENTRY, "flow_id": self.flow_id,
                "handler": self.handler, "title": title, "data": data, "options": options,
                "subentries": list(subentries or ())}

    @classmethod
    def async_get_supported_subentry_types(cls, config_entry):
        return {}


class ConfigSubentryFlow(FlowHandler):
    @property
    def _entry_id(self):
        return self.handler[0]

    @property
    def _subentry_type(self):
        return self.handler[1]

    def _get_entry(self):
        return self.hass.config_entries.async_get_known_entry(self._entry_id)

    def _get_reconfigure_subentry(self):
        if self.source != "reconfigure":
            raise ValueError(f"Source is {self.source}, expected reconfigure")
        return self._get_entry().subentries[self.context["subentry_id"]]

    def async_create_entry(self, *, title=None, data, description=None,
                           description_placeholders=None, unique_id=None):
        return {"type": FlowResultType.CREATE_ENTRY, "flow_id": self.flow_id,
                "handler": self.handler, "title": title, "data": data, "unique_id": unique_id}

    def async_update_and_abort(self, entry, subentry, *, unique_id=UNDEFINED, title=UNDEFINED,
                               data=UNDEFINED, data_updates=UNDEFINED):
        if data_updates is not UNDEFINED:
            data = {**subentry.data, **data_updates}
        self.hass.config_entries.async_update_subentry(entry, subentry, unique_id=unique_id,
                                                       title=title, data=data)
        return self.async_abort(reason="reconfigure_successful")


class _FlowManager:
    def __init__(self, hass, entries):
        self.hass, self.entries = hass, entries
        self._flows = {}
        self._last = {}

    async def _run(self, flow, step_id, user_input):
        try:
            result = await getattr(flow, "async_step_" + step_id)(user_input)
        except AbortFlow as err:
            result = flow.async_abort(reason=err.reason,
                                      description_placeholders=err.description_placeholders)
        if result["type"] == FlowResultType.FORM:
            self._last[flow.flow_id] = result
            return result
        self._flows.pop(flow.flow_id, None)
        if result["type"] == FlowResultType.CREATE_ENTRY:
            result["result"] = await self._finish(flow, result)
        return result

    async def async_configure(self, flow_id, user_input=None):
        flow, form = self._flows[flow_id], self._last[flow_id]
        if form["data_schema"] is not None and user_input is not None:
            user_input = form["data_schema"](user_input)
        return await self._run(flow, form["step_id"], user_input)

    async def _start(self, flow, handler, context, data):
        flow.hass, flow.handler, flow.context = self.hass, handler, dict(context or {})
        flow.flow_id = core.ulid_now()
        self._flows[flow.flow_id] = flow
        return await self._run(flow, flow.context["source"], data)


class ConfigEntriesFlowManager(_FlowManager):
    async def async_init(self, handler, *, context=None, data=None):
        importlib.import_module(self.entries.package(handler) + ".config_flow")
        return await self._start(HANDLERS[handler](), handler, context, data)

    async def _finish(self, flow, result):
        entry = ConfigEntry(domain=flow.handler, title=result["title"], data=result["data"],
                            options=result["options"], subentries_data=result["subentries"],
                            version=flow.VERSION, unique_id=flow.context.get("unique_id"),
                            source=flow.source)
        await self.entries.async_add(entry)
        return entry


class ConfigSubentryFlowManager(_FlowManager):
    async def async_init(self, handler, *, context=None, data=None):
        entry_id, subentry_type = handler
        entry = self.entries.async_get_known_entry(entry_id)
        importlib.import_module(self.entries.package(entry.domain) + ".config_flow")
        types = HANDLERS[entry.domain].async_get_supported_subentry_types(entry)
        if subentry_type not in types:
            raise UnknownHandler(subentry_type)
        return await self._start(types[subentry_type](), handler, context, data)

    async def _finish(self, flow, result):
        entry = self.entries.async_get_known_entry(flow.handler[0])
        subentry = ConfigSubentry(data=MappingProxyType(dict(result["data"])),
                                  subentry_type=flow.handler[1], title=result["title"],
                                  unique_id=result["unique_id"])
        self.entries.async_add_subentry(entry, subentry)
        return subentry


class ConfigEntries:
    """hass.config_entries: entries of integrations under custom_components/."""

    def __init__(self, hass):
        self.hass = hass
        self._entries = {}
        self._set_up = set()   # domains whose async_setup ran
        self.flow = ConfigEntriesFlowManager(hass, self)
        self.subentries = ConfigSubentryFlowManager(hass, self)
        self.entities = {}     # entity id -> entity, of every platform

    @staticmethod
    def package(domain):
        return "custom_components." + domain

    def async_entries(self, domain=None):
        return [e for e in self._entries.values() if domain is None or e.domain == domain]

    def async_loaded_entries(self, domain):
        return [e for e in self.async_entries(domain) if e.state == ConfigEntryState.LOADED]

    def async_get_entry(self, entry_id):
        return self._entries.get(entry_id)

    def async_get_known_entry(self, entry_id):
        return self._entries[entry_id]

    async def async_add(self, entry):
        self._entries[entry.entry_id] = entry
        await self.async_setup(entry.entry_id)

    async def async_setup(self, entry_id):
        entry = self._entries[entry_id]
        module = importlib.import_module(self.package(entry.domain))
        if entry.domain not in self._set_up:
            self._set_up.add(entry.domain)
            if hasattr(module, "async_setup"):
                await module.async_setup(self.hass, {})
        try:
            ok = await module.async_setup_entry(self.hass, entry)
        except core.ConfigEntryNotReady as err:
            entry.state, entry.reason = ConfigEntryState.SETUP_RETRY, str(err)
            return False
        except core.ConfigEntryError as err:
            entry.state, entry.reason = ConfigEntryState.SETUP_ERROR, str(err)
            return False
        entry.state = ConfigEntryState.LOADED if ok else ConfigEntryState.SETUP_ERROR
        return ok

    async def async_unload(self, entry_id):
        entry = self._entries[entry_id]
        if entry.state != ConfigEntryState.LOADED:
            entry.state = ConfigEntryState.NOT_LOADED
            return True
        module = importlib.import_module(self.package(entry.domain))
        ok = await module.async_unload_entry(self.hass, entry)
        if ok:
            for func in entry._on_unload:
                func()
            entry._on_unload.clear()
            entry.state = ConfigEntryState.NOT_LOADED
            entry.runtime_data = None
        return ok

    async def async_reload(self, entry_id):
        await self.async_unload(entry_id)
        return await self.async_setup(entry_id)

    def _changed(self, entry):
        for listener in list(entry.update_listeners):
            self.hass.async_create_task(listener(self.hass, entry))

    def async_update_entry(self, entry, *, data=UNDEFINED, options=UNDEFINED, title=UNDEFINED):
        changed = False
        for name, value in (("data", data), ("options", options)):
            if value is not UNDEFINED and dict(getattr(entry, name)) != dict(value):
                setattr(entry, name, MappingProxyType(dict(value)))
                changed = True
        if title is not UNDEFINED and title != entry.title:
            entry.title, changed = title, True
        if changed:
            self._changed(entry)
        return changed

    def async_add_subentry(self, entry, subentry):
        entry.subentries = MappingProxyType({**entry.subentries, subentry.subentry_id: subentry})
        self._changed(entry)
        return True

    def async_remove_subentry(self, entry, subentry_id):
        subs = dict(entry.subentries)
        del subs[subentry_id]
        entry.subentries = MappingProxyType(subs)
        self._changed(entry)
        return True

    def async_update_subentry(self, entry, subentry, *, data=UNDEFINED, title=UNDEFINED,
                              unique_id=UNDEFINED):
        new = dataclasses.replace(
            subentry,
            data=subentry.data if data is UNDEFINED else MappingProxyType(dict(data)),
            title=subentry.title if title is UNDEFINED else title,
            unique_id=subentry.unique_id if unique_id is UNDEFINED else unique_id)
        if new == subentry:
            return False
        entry.subentries = MappingProxyType({**entry.subentries, subentry.subentry_id: new})
        self._changed(entry)
        return True

    async def async_forward_entry_setups(self, entry, platforms):
        for platform in platforms:
            module = importlib.import_module(self.package(entry.domain) + "." + str(platform))
            await module.async_setup_entry(self.hass, entry, _Adder(self, entry, str(platform)))

    async def async_unload_platforms(self, entry, platforms):
        for entity_id, entity in list(self.entities.items()):
            if entity.registry_entry_config == entry.entry_id:
                await entity.async_will_remove_from_hass()
                del self.entities[entity_id]
        return True


class _Adder:
    """entity_platform's AddConfigEntryEntitiesCallback."""

    def __init__(self, entries, entry, platform):
        self.entries, self.entry, self.platform = entries, entry, platform

    async def _add(self, entity):
        entity.hass = self.entries.hass
        entity.platform = EntityPlatform(self.entry.domain, self.platform)
        entity.registry_entry_config = self.entry.entry_id
        name = entity.device_info["name"] if entity.device_info else self.entry.title
        base = self.platform + "." + (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"))
        entity_id, n = base, 1
        while entity_id in self.entries.entities:
            n += 1
            entity_id = "%s_%d" % (base, n)
        entity.entity_id = entity_id
        self.entries.entities[entity_id] = entity
        await entity.async_internal_added_to_hass()
        await entity.async_added_to_hass()

    def __call__(self, entities, update_before_add=False, *, config_subentry_id=None):
        if config_subentry_id is not None and config_subentry_id not in self.entry.subentries:
            raise ValueError("Can't add entities to unknown subentry %s" % config_subentry_id)
        for entity in entities:
            self.entries.hass.async_create_task(self._add(entity))


@dataclasses.dataclass
class EntityPlatform:
    domain: str
    platform_name: str


# -- helpers/entity.py, restore_state.py, device_registry.py ---------------------------------

class Entity:
    hass = None
    entity_id = None
    platform = None
    registry_entry_config = None
    _attr_has_entity_name = False
    _attr_name = None
    _attr_unique_id = None
    _attr_device_info = None
    _attr_supported_features = None

    @property
    def unique_id(self):
        return self._attr_unique_id

    @property
    def device_info(self):
        return self._attr_device_info

    @property
    def supported_features(self):
        return self._attr_supported_features

    async def async_internal_added_to_hass(self):
        pass

    async def async_added_to_hass(self):
        pass

    async def async_will_remove_from_hass(self):
        pass

    def async_write_ha_state(self):
        pass


class RestoreEntity(Entity):
    async def async_get_last_state(self):
        return None


class DeviceEntryType(enum.StrEnum):
    SERVICE = "service"


def DeviceInfo(**kw):  # noqa: N802 -- a TypedDict in HA
    return dict(kw)
