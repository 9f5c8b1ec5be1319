"""Node plugins of the pure state machines (``state_machine = "kv"`` or ``"counter"`` in a node's config).

Registered as entry points of the group ``dledger.plugins`` (pyproject.toml), like the broker's.

The key-value store adds its own gRPC service (``dledger.v1.KV``: put, linearizable get, delete,
compare-and-swap); the counter has none: its entries reach it through the DLedger client API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statemachine.api import StateMachine
from statemachine.counter import Counter
from statemachine.kv import KVStore


@dataclass
class StateMachineOnly:
    state_machine: StateMachine

    def attach(self, node: Any, server: Any) -> Sequence[str]:
        return ()


@dataclass
class KVPlugin:
    state_machine: KVStore

    def attach(self, node: Any, server: Any) -> Sequence[str]:
        from dledger.kv.service import attach  # gRPC only where a node serves it

        return attach(node, server, self.state_machine)


def kv(config: Any) -> KVPlugin:
    return KVPlugin(KVStore())


def counter(config: Any) -> StateMachineOnly:
    return StateMachineOnly(Counter())
