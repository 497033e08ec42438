"""Errors that reach users. Each message names the config key, policy or file at fault."""
from __future__ import annotations

import math
import numbers


class SpecdepthError(Exception):
    """Base class: the app prints these as one clean line, without a traceback."""


class ConfigError(SpecdepthError, ValueError):
    """A config value is invalid. The message starts with the dotted key."""


class PolicyError(SpecdepthError):
    """A policy answered something the engine cannot execute."""


class BackendError(SpecdepthError):
    """A backend cannot run the requested configuration (model pair, device, policy)."""


class PluginError(SpecdepthError):
    """A plug-in (cost model, acceptance model, executor) broke its protocol (docs/plugins.md): the message
    names the plug-in, the hook and what the protocol expects."""


# ---- small validators used by every configurable class -------------------------------------------

def _num(value, key: str, kind: str = "number"):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{key} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be finite, got {value!r}")
    return value


def as_int(value, key: str, *, min: int | None = None, max: int | None = None) -> int:
    """`value` as an int; floats with an integral value are accepted (YAML `8.0`)."""
    _num(value, key, "integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        value = int(value)
    value = int(value)
    if min is not None and value < min:
        raise ConfigError(f"{key} must be >= {min}, got {value}")
    if max is not None and value > max:
        raise ConfigError(f"{key} must be <= {max}, got {value}")
    return value


def as_float(value, key: str, *, min: float | None = None, max: float | None = None,
             min_open: bool = False) -> float:
    value = float(_num(value, key))
    if min is not None and (value < min or (min_open and value == min)):
        raise ConfigError(f"{key} must be {'>' if min_open else '>='} {min}, got {value}")
    if max is not None and value > max:
        raise ConfigError(f"{key} must be <= {max}, got {value}")
    return value


def as_prob(value, key: str) -> float:
    return as_float(value, key, min=0.0, max=1.0)


def as_bool(value, key: str) -> bool:
    """`value` as a bool: true or false only (a YAML string "false" would otherwise read as true)."""
    if type(value).__name__ not in ("bool", "bool_"):   # Python or numpy bool
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return bool(value)


def as_choice(value, key: str, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {sorted(choices)}, got {value!r}")
    return value
