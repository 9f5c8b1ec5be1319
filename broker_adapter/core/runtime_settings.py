"""Broker settings changed at run time through the log (``dledger broker config set``): retention and the
longest delay of a delayed message. A ``SetConfig`` command carries the keys set; every node applies it in log
order and keeps the values (in the dispatcher's snapshot), over its node config's ``[broker]`` table, so every
node of the group runs with the same values without a restart. Values are checked as ``[broker]`` checks them
(``broker_adapter.settings.BrokerSettings``) before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from broker_adapter.settings import BrokerSettings
from dledger.errors import ConfigError, InvalidRequestError

# The [broker] keys that may be changed at run time, and the type each takes.
RUNTIME_KEYS: Final[dict[str, type]] = {
    "retention_hours": float,
    "retention_bytes": int,
    "disk_max_used_percent": float,
    "max_delay_ms": int,
}


def parse(values: Mapping[str, str]) -> dict[str, Any]:
    """Text values (as typed on a command line) to typed ones; ``InvalidRequestError`` naming the key."""
    out: dict[str, Any] = {}
    for key, text in values.items():
        kind = RUNTIME_KEYS.get(key)
        if kind is None:
            raise InvalidRequestError(
                f"{key!r} cannot be set at run time; settable: {', '.join(sorted(RUNTIME_KEYS))}"
            )
        try:
            out[key] = kind(text)
        except ValueError:
            raise InvalidRequestError(f"{key} takes a {kind.__name__}, got {text!r}") from None
    return out


def effective(base: BrokerSettings, overrides: Mapping[str, Any]) -> BrokerSettings:
    """The node's ``[broker]`` settings with the run-time values over them (``InvalidRequestError`` when a value
    is out of range: the message ``[broker]`` would give at start)."""
    known = {k: v for k, v in overrides.items() if k in RUNTIME_KEYS}
    try:
        return dataclasses.replace(base, **known)
    except (ConfigError, TypeError) as e:
        raise InvalidRequestError(str(e)) from None


def shown(base: BrokerSettings, overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each run-time key: its value in force and where it comes from ("log" or "node.toml")."""
    now = effective(base, overrides)
    return {
        k: {"value": getattr(now, k), "source": "log" if k in overrides else "node.toml"}
        for k in sorted(RUNTIME_KEYS)
    }
