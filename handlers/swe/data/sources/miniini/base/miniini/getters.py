"""Typed access to parsed values."""

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


def _raw(config, section, key, default):
    try:
        return config[section][key.lower()]
    except KeyError:
        if default is not None:
            return default
        raise KeyError(f"[{section}] {key} is not set") from None


def get_int(config, section, key, default=None):
    return int(_raw(config, section, key, default))


def get_bool(config, section, key, default=None):
    value = _raw(config, section, key, default)
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"[{section}] {key}: {value!r} is not a boolean")


def get_list(config, section, key, default=None, separator=","):
    value = _raw(config, section, key, default)
    if isinstance(value, list):
        return value
    return [item.strip() for item in value.split(separator) if item.strip()]
