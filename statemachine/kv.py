"""A replicated key-value store: the built-in example of a state machine.

Commands are log entry bodies in a small binary form (one opcode byte, a 2-byte key length, the key, the value),
so a put costs a few dozen bytes of overhead, not a JSON document:

    P <klen:u16> <key> <value>     put      -> result: the previous value or None
    D <klen:u16> <key>             delete   -> result: True if the key existed
    C <klen:u16> <key> <elen:u32> <expected> <value>
                                   compare-and-swap (elen 0xFFFFFFFF: "the key is absent")
                                            -> result: Swapped(swapped, current value or None)

Reads do not go through the log: a linearizable read asks the leader for a read index (Raft thesis 6.4: the
leader confirms it still leads with one heartbeat round, then the read waits until the apply loop has applied
that index) and then reads the local map. ``get`` here is the local read; the node adds the read-index step.
"""

from __future__ import annotations

import struct
from collections.abc import ItemsView, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from statemachine.api import CommittedEntry

OP_PUT = ord("P")
OP_DELETE = ord("D")
OP_CAS = ord("C")
_KLEN = struct.Struct(">H")
_ELEN = struct.Struct(">I")
ABSENT = 0xFFFFFFFF
_SNAP_ITEM = struct.Struct(">HI")
MAX_KEY = 0xFFFF


class KVCommandError(ValueError):
    pass


def encode_put(key: bytes, value: bytes) -> bytes:
    _check_key(key)
    return bytes((OP_PUT,)) + _KLEN.pack(len(key)) + key + value


def encode_delete(key: bytes) -> bytes:
    _check_key(key)
    return bytes((OP_DELETE,)) + _KLEN.pack(len(key)) + key


def encode_cas(key: bytes, expected: bytes | None, value: bytes) -> bytes:
    """Set ``key`` to ``value`` if it now holds ``expected`` (None: if it does not exist)."""
    _check_key(key)
    elen = _ELEN.pack(ABSENT if expected is None else len(expected))
    return bytes((OP_CAS,)) + _KLEN.pack(len(key)) + key + elen + (expected or b"") + value


@dataclass(frozen=True, slots=True)
class Swapped:
    swapped: bool
    current: bytes | None  # the key's value after the command


def _check_key(key: bytes) -> None:
    if not key or len(key) > MAX_KEY:
        raise KVCommandError(f"key must be 1..{MAX_KEY} bytes, got {len(key)}")


def decode_command(body: bytes | memoryview) -> tuple[int, bytes, bytes]:
    """Split a command into (opcode, key, value); a malformed body raises ``KVCommandError``."""
    if len(body) < 3:
        raise KVCommandError(f"command of {len(body)} bytes is shorter than the 3-byte minimum")
    op = body[0]
    (klen,) = _KLEN.unpack_from(body, 1)
    if klen == 0 or 3 + klen > len(body):
        raise KVCommandError(f"key length {klen} does not fit a {len(body)}-byte command")
    key = bytes(body[3 : 3 + klen])
    value = bytes(body[3 + klen :])
    if op == OP_DELETE and value:
        raise KVCommandError("delete carries no value")
    if op not in (OP_PUT, OP_DELETE, OP_CAS):
        raise KVCommandError(f"unknown opcode {op:#x}")
    if op == OP_CAS:
        if len(value) < _ELEN.size:
            raise KVCommandError("compare-and-swap lacks its expected-value length")
        (elen,) = _ELEN.unpack_from(value)
        if elen != ABSENT and _ELEN.size + elen > len(value):
            raise KVCommandError(f"expected value of {elen} bytes does not fit a {len(body)}-byte command")
    return op, key, value


def split_cas(value: bytes) -> tuple[bytes | None, bytes]:
    """The (expected, new value) of a compare-and-swap command's tail (checked by ``decode_command``)."""
    (elen,) = _ELEN.unpack_from(value)
    if elen == ABSENT:
        return None, value[_ELEN.size :]
    return value[_ELEN.size : _ELEN.size + elen], value[_ELEN.size + elen :]


class KVStore:
    """In-memory map whose durability is the log plus snapshots."""

    name = "kv"

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}

    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        results: list[Any] = []
        data = self._data
        for e in entries:
            try:
                op, key, value = decode_command(e.body)
            except KVCommandError as err:
                # A bad command is committed like any other entry: every node rejects it the same way.
                results.append(err)
                continue
            if op == OP_PUT:
                results.append(data.get(key))
                data[key] = value
            elif op == OP_CAS:
                expected, new = split_cas(value)
                if data.get(key) == expected:
                    data[key] = new
                    results.append(Swapped(True, new))
                else:
                    results.append(Swapped(False, data.get(key)))
            else:
                results.append(data.pop(key, None) is not None)
        return results

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> ItemsView[bytes, bytes]:
        return self._data.items()

    def save_snapshot(self, writer: BinaryIO) -> None:
        writer.write(len(self._data).to_bytes(8, "big"))
        for k, v in sorted(self._data.items()):
            writer.write(_SNAP_ITEM.pack(len(k), len(v)))
            writer.write(k)
            writer.write(v)

    def load_snapshot(self, reader: BinaryIO) -> None:
        count = int.from_bytes(_read_exact(reader, 8), "big")
        data: dict[bytes, bytes] = {}
        for _ in range(count):
            klen, vlen = _SNAP_ITEM.unpack(_read_exact(reader, _SNAP_ITEM.size))
            key = _read_exact(reader, klen)
            data[key] = _read_exact(reader, vlen)
        self._data = data

    def close(self) -> None:
        self._data = {}


def _read_exact(reader: BinaryIO, n: int) -> bytes:
    buf = reader.read(n)
    if len(buf) != n:
        raise EOFError(f"snapshot ended early: wanted {n} bytes, got {len(buf)}")
    return buf
