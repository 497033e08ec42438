"""Nested config nodes: a policy's secondary parameters grouped under one key (`policy.<node>.<key>`)."""
from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

from specdepth.errors import ConfigError


def node(value, key: str, defaults: Mapping) -> SimpleNamespace:
    """The config node `value` (a mapping or None) over `defaults`: each key of defaults, set where `value` sets it.
    A key that defaults lacks is refused with a ConfigError naming `key` and the valid keys."""
    given = {} if value is None else value
    if not isinstance(given, Mapping) and not hasattr(given, "keys"):
        raise ConfigError(f"{key} must be a mapping of {sorted(defaults)}, got {value!r}")
    unknown = sorted(str(k) for k in given.keys() if k not in defaults)
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key; valid keys: {', '.join(sorted(defaults))}")
    return SimpleNamespace(**{k: given[k] if k in given else v for k, v in defaults.items()})
