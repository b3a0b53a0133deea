"""Stand-in for homeassistant/core.py, exceptions.py, const.py,
util/dt.py, util/ulid.py and helpers/event.py (async_call_later), read from
home-assistant/core dev (the 2026 snapshot in the search index; chat_log.py at
commit 01bc0afafea1a7fce60ca97305d6e3e234bbbcf9 uses the same names).

Only what the integration and the other stand-ins use; the semantics that
matter kept: tasks made by async_create_task run later (update listeners
are tasks, so a test waits with async_block_till_done), the clock can be
moved (utcnow) and timers fire only when a test fires time changes
(tests/common.py's async_fire_time_changed), conversation ids are ULIDs."""
import asyncio
import dataclasses
import datetime
import enum
import os
import secrets

# -- exceptions.py --------------------------------------------------------


class HomeAssistantError(Exception):
    pass


class TemplateError(HomeAssistantError):
    pass


class ConfigEntryError(HomeAssistantError):
    pass


class ConfigEntryNotReady(HomeAssistantError):
    pass


class ServiceValidationError(HomeAssistantError):
    pass


# -- const.py ---------------------------------------------------------------

MATCH_ALL = "*"
CONF_NAME = "name"
CONF_MODEL = "model"
CONF_URL = "url"
CONF_API_KEY = "api_key"
CONF_LLM_HASS_API = "llm_hass_api"
EVENT_HOMEASSISTANT_STOP = "homeassistant_stop"
STATE_UNKNOWN = "unknown"
STATE_UNAVAILABLE = "unavailable"


class Platform(enum.StrEnum):
    AI_TASK = "ai_task"
    CONVERSATION = "conversation"


# -- util/dt.py: a clock tests can move ---------------------------------------

_offset = [datetime.timedelta(0)]


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + _offset[0]


def advance_clock(**delta) -> None:
    _offset[0] += datetime.timedelta(**delta)


# -- util/ulid.py ---------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid_now() -> str:
    value = (int(utcnow().timestamp() * 1000) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def ulid_to_bytes(value: str) -> bytes:
    if len(value) != 26 or any(c not in _CROCKFORD for c in value.upper()):
        raise ValueError("not a ULID: %r" % value)
    n = 0
    for c in value.upper():
        n = n * 32 + _CROCKFORD.index(c)
    return n.to_bytes(17, "big")[1:]


# -- core.py ----------------------------------------------------------------------

def callback(func):
    return func


@dataclasses.dataclass
class Context:
    user_id: str | None = None
    parent_id: str | None = None
    id: str = dataclasses.field(default_factory=ulid_now)

    def as_dict(self):
        return {"id": self.id, "parent_id": self.parent_id, "user_id": self.user_id}


class HassJobType(enum.Enum):
    Coroutinefunction = 1
    Callback = 2
    Executor = 3


class HassJob:
    def __init__(self, target, name=None, *, job_type=None):
        self.target, self.name, self.job_type = target, name, job_type


@dataclasses.dataclass
class ServiceCall:
    hass: object
    domain: str
    service: str
    data: dict
    context: Context = dataclasses.field(default_factory=Context)


class ServiceRegistry:
    def __init__(self, hass):
        self.hass = hass
        self._services = {}

    def async_register(self, domain, service, service_func, schema=None, **_kw):
        self._services[(domain, service)] = (service_func, schema)

    def has_service(self, domain, service):
        return (domain, service) in self._services

    async def async_call(self, domain, service, service_data=None, blocking=False,
                         context=None):
        func, schema = self._services[(domain, service)]
        data = dict(service_data or {})
        if schema is not None:
            data = schema(data)
        await func(ServiceCall(self.hass, domain, service, data, context or Context()))


class Config:
    def __init__(self, config_dir):
        self.config_dir = config_dir
        self.location_name = "Home"
        self.language = "en"

    def path(self, *parts):
        return os.path.join(self.config_dir, *parts)


class Bus:
    def __init__(self):
        self.listeners = []

    def async_listen_once(self, event_type, listener):
        self.listeners.append((event_type, listener))
        return lambda: None


@dataclasses.dataclass
class User:
    id: str
    name: str


class Auth:
    def __init__(self):
        self.users = {}

    async def async_get_user(self, user_id):
        return self.users.get(user_id)


class HomeAssistant:
    """The event loop's Home Assistant: data, config, services, config
    entries (config_entries.ConfigEntries), tasks, timers."""

    def __init__(self, config_dir):
        from homeassistant import config_entries  # the stand-in, installed by then
        self.loop = asyncio.get_running_loop()
        self.data = {}
        self.config = Config(config_dir)
        self.services = ServiceRegistry(self)
        self.bus = Bus()
        self.auth = Auth()
        self.timers = []           # [due, HassJob or callable, cancelled]
        self._tasks = set()
        self.config_entries = config_entries.ConfigEntries(self)

    def async_create_task(self, target, name=None, eager_start=True):
        task = self.loop.create_task(target, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async_create_background_task = async_create_task

    async def async_add_executor_job(self, target, *args):
        return await self.loop.run_in_executor(None, target, *args)

    async def async_block_till_done(self):
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=False)


# -- helpers/event.py ------------------------------------------------------------------

def async_call_later(hass, delay, action):
    timer = [utcnow() + datetime.timedelta(seconds=float(delay)), action, False]
    hass.timers.append(timer)

    def cancel():
        timer[2] = True
    return cancel


def async_fire_time_changed(hass, now=None):
    """tests/common.py's helper: run every timer due by `now` (default utcnow())."""
    now = now or utcnow()
    due = [t for t in hass.timers if t[0] <= now and not t[2]]
    hass.timers[:] = [t for t in hass.timers if t not in due]
    for _when, action, _cancelled in due:
        target = action.target if isinstance(action, HassJob) else action
        target(now)
