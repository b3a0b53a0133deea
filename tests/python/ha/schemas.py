"""Stand-ins for voluptuous (0.15), probatio, voluptuous_openapi (0.1),
homeassistant/helpers/config_validation.py and helpers/selector.py, read
from home-assistant/core dev (2026 snapshot; ollama/config_flow.py and
ollama/entity.py there show the selectors and probatio.to_openapi in use).

Schemas validate the way the real ones do where the integration can tell:
a form's input is validated against its data_schema before the step sees
it (data_entry_flow), missing required keys and values outside a
selector's options are errors, defaults are filled in, NumberSelector gives
a float.  to_openapi / convert turn these schemas into JSON Schema; each
records that it was called, so a test can tell which one an agent used."""
import enum

# -- voluptuous ---------------------------------------------------------------

UNDEFINED = object()


class Invalid(Exception):
    def __init__(self, message, path=None):
        super().__init__(message)
        self.msg, self.path = message, path or []


class MultipleInvalid(Invalid):
    pass


class Marker:
    def __init__(self, schema, msg=None, default=UNDEFINED, description=None):
        self.schema = schema
        self.msg = msg
        self.default = default if default is UNDEFINED or callable(default) \
            else (lambda value=default: value)
        self.description = description

    def __hash__(self):
        return hash(self.schema)

    def __eq__(self, other):
        return self.schema == (other.schema if isinstance(other, Marker) else other)

    def __str__(self):
        return str(self.schema)


class Required(Marker):
    pass


class Optional(Marker):
    pass


def _validate(validator, value, path):
    if validator in (str, int, float, bool):
        if validator is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, validator) or (validator is int and isinstance(value, bool)):
            raise Invalid("expected %s for dictionary value @ data['%s']"
                          % (validator.__name__, path), [path])
        return value
    if isinstance(validator, dict):
        return Schema(validator)(value)
    if isinstance(validator, list):
        if not isinstance(value, list):
            raise Invalid("expected a list @ data['%s']" % path, [path])
        return [_validate(validator[0], v, path) for v in value] if validator else value
    if callable(validator):
        try:
            return validator(value)
        except Invalid:
            raise
        except (TypeError, ValueError) as err:
            raise Invalid("%s @ data['%s']" % (err, path), [path]) from None
    if validator != value:
        raise Invalid("not a valid value @ data['%s']" % path, [path])
    return value


PREVENT_EXTRA, ALLOW_EXTRA = 0, 1


class Schema:
    def __init__(self, schema, extra=PREVENT_EXTRA):
        self.schema = schema
        self.extra = extra

    def __call__(self, data):
        if not isinstance(self.schema, dict):
            return _validate(self.schema, data, "")
        if not isinstance(data, dict):
            raise MultipleInvalid("expected a dictionary")
        out = {}
        known = set()
        for key, validator in self.schema.items():
            name = key.schema if isinstance(key, Marker) else key
            known.add(name)
            if name in data:
                out[name] = _validate(validator, data[name], name)
            elif isinstance(key, Marker) and key.default is not UNDEFINED:
                out[name] = key.default()
            elif isinstance(key, Required):
                raise MultipleInvalid("required key not provided @ data['%s']" % name, [name])
        extra = set(data) - known
        if extra and self.extra == PREVENT_EXTRA:
            raise MultipleInvalid("extra keys not allowed @ data['%s']" % sorted(extra)[0])
        for name in extra:
            out[name] = data[name]
        return out

    def extend(self, schema):
        return Schema({**self.schema, **schema}, self.extra)


class In:
    def __init__(self, container):
        self.container = container

    def __call__(self, value):
        if value not in self.container:
            raise Invalid("value must be one of %s" % sorted(self.container))
        return value


class Coerce:
    def __init__(self, type_):
        self.type = type_

    def __call__(self, value):
        try:
            return self.type(value)
        except (TypeError, ValueError):
            raise Invalid("expected %s" % self.type.__name__) from None


class All:
    def __init__(self, *validators):
        self.validators = validators

    def __call__(self, value):
        for v in self.validators:
            value = _validate(v, value, "")
        return value


# -- probatio / voluptuous_openapi: schema -> JSON Schema ---------------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
CONVERTED = []   # (converter name, schema) of every conversion


def _to_json(validator, custom_serializer):
    if custom_serializer is not None:
        custom = custom_serializer(validator)
        if custom is not validator and isinstance(custom, dict):
            return custom
    if validator in _JSON_TYPES:
        return {"type": _JSON_TYPES[validator]}
    if isinstance(validator, In):
        return {"type": "string", "enum": list(validator.container)}
    if isinstance(validator, Coerce) and validator.type in _JSON_TYPES:
        return {"type": _JSON_TYPES[validator.type]}
    if isinstance(validator, list):
        return {"type": "array", "items": _to_json(validator[0], custom_serializer)
                if validator else {}}
    if isinstance(validator, (Schema, dict)):
        return _object(validator.schema if isinstance(validator, Schema) else validator,
                       custom_serializer)
    return {}


def _object(schema, custom_serializer):
    props, required = {}, []
    for key, validator in schema.items():
        name = key.schema if isinstance(key, Marker) else key
        props[name] = _to_json(validator, custom_serializer)
        if isinstance(key, Marker) and isinstance(key.description, str):
            props[name]["description"] = key.description
        if isinstance(key, Required):
            required.append(name)
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def to_openapi(schema, custom_serializer=None):
    """probatio.to_openapi"""
    CONVERTED.append(("probatio", schema))
    return _to_json(schema, custom_serializer)


def convert(schema, *, custom_serializer=None):
    """voluptuous_openapi.convert"""
    CONVERTED.append(("voluptuous_openapi", schema))
    return _to_json(schema, custom_serializer)


# -- helpers/config_validation.py ------------------------------------------------------

def string(value):
    if value is None:
        raise Invalid("string value is None")
    return str(value)


def entity_ids(value):
    items = [value] if isinstance(value, str) else list(value or [])
    for item in items:
        if "." not in str(item):
            raise Invalid("Entity ID %s is an invalid entity ID" % item)
    return [str(i).lower() for i in items]


def config_entry_only_config_schema(domain):
    return lambda config: config


def url(value):
    text = str(value)
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise Invalid("invalid url")
    return text


# -- helpers/selector.py -------------------------------------------------------------

class SelectSelectorMode(enum.StrEnum):
    LIST = "list"
    DROPDOWN = "dropdown"


class NumberSelectorMode(enum.StrEnum):
    BOX = "box"
    SLIDER = "slider"


class TextSelectorType(enum.StrEnum):
    TEXT = "text"
    URL = "url"
    PASSWORD = "password"


def SelectOptionDict(*, value, label):  # noqa: N802 -- a TypedDict in HA
    return {"value": value, "label": label}


def _config(**kw):
    return dict(kw)


SelectSelectorConfig = NumberSelectorConfig = TextSelectorConfig = _config


class Selector:
    def __init__(self, config=None):
        self.config = dict(config or {})


class TextSelector(Selector):
    def __call__(self, value):
        if not isinstance(value, str):
            raise Invalid("expected a string")
        return value


class TemplateSelector(TextSelector):
    pass


class BooleanSelector(Selector):
    def __call__(self, value):
        if not isinstance(value, bool):
            raise Invalid("expected a boolean")
        return value


class NumberSelector(Selector):
    def __call__(self, value):
        value = Coerce(float)(value)
        if "min" in self.config and value < self.config["min"]:
            raise Invalid("value must be at least %s" % self.config["min"])
        if "max" in self.config and value > self.config["max"]:
            raise Invalid("value must be at most %s" % self.config["max"])
        return value


class SelectSelector(Selector):
    def __call__(self, value):
        allowed = [o["value"] if isinstance(o, dict) else o for o in self.config["options"]]
        values = value if self.config.get("multiple") else [value]
        if self.config.get("multiple") and not isinstance(value, list):
            raise Invalid("expected a list")
        for v in values:
            if not isinstance(v, str):
                raise Invalid("expected a string")
            if not self.config.get("custom_value") and v not in allowed:
                raise Invalid("%s is not a valid option" % v)
        return value
