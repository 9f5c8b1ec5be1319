"""A replicated counter: each entry body is a signed 8-byte delta; the result is the new value.

The smallest useful state machine, and the one the tests use to check that every node applied the same
entries in the same order (the final value and the number of increments must agree everywhere).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

from statemachine.api import CommittedEntry

_DELTA = struct.Struct(">q")
_STATE = struct.Struct(">qq")


def encode_add(delta: int) -> bytes:
    return _DELTA.pack(delta)


class Counter:
    name = "counter"

    def __init__(self) -> None:
        self.value = 0
        self.applied_count = 0

    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        results: list[Any] = []
        for e in entries:
            if len(e.body) != _DELTA.size:
                results.append(ValueError(f"counter command must be 8 bytes, got {len(e.body)}"))
                continue
            self.value += _DELTA.unpack(e.body)[0]
            self.applied_count += 1
            results.append(self.value)
        return results

    def save_snapshot(self, writer: BinaryIO) -> None:
        writer.write(_STATE.pack(self.value, self.applied_count))

    def load_snapshot(self, reader: BinaryIO) -> None:
        raw = reader.read(_STATE.size)
        if len(raw) != _STATE.size:
            raise EOFError(f"counter snapshot is {len(raw)} bytes, expected {_STATE.size}")
        self.value, self.applied_count = _STATE.unpack(raw)

    def close(self) -> None:
        pass
