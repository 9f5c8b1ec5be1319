"""Built-in node plugins (``state_machine = "kv"`` or ``"counter"`` in a node's config): a state machine and no
extra gRPC service; entries reach them through the DLedger client API."""

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


def kv(config: Any) -> StateMachineOnly:
    return StateMachineOnly(KVStore())


def counter(config: Any) -> StateMachineOnly:
    return StateMachineOnly(Counter())
