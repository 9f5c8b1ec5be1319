"""Read-only views of the broker's data for the audit: message routing fields and ConsumeQueue units.

The layouts are docs/formats.md sections 4 and 5; their constants and the decoding of a message's routing fields come
from ``broker_adapter.core.formats``, the one module of the broker the audit imports (standard library only: no
writer, no runtime; opening a ``ConsumeQueue`` would repair a torn unit in place, which an audit must not do).
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

from broker_adapter.core.formats import COMMAND_MAGIC, MAGIC_CODE, UNIT_SIZE, MessageFields, message_fields

MESSAGE_MAGIC_BYTES: Final = struct.pack(">i", MAGIC_CODE)
COMMAND_MAGIC_BYTES: Final = struct.pack(">I", COMMAND_MAGIC)  # b"DLBC"

# Kinds of entry bodies (the ``body_kind`` column).
BODY_RAW: Final = 0
BODY_MESSAGE: Final = 1
BODY_COMMAND: Final = 2
BODY_BAD_MESSAGE: Final = 3

CQ_UNIT_DTYPE: Final = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_UNIT_DTYPE.itemsize == UNIT_SIZE


def body_kind(head: bytes) -> int:
    """Message, command or raw, from bytes 4..8 of an entry body (``head`` = those four bytes)."""
    if head == MESSAGE_MAGIC_BYTES:
        return BODY_MESSAGE
    if head == COMMAND_MAGIC_BYTES:
        return BODY_COMMAND
    return BODY_RAW


def read_queue_file(path: str) -> np.ndarray:
    """The whole units of one ConsumeQueue file as a structured array (``CQ_UNIT_DTYPE``), read-only.

    The unit in row r has queue offset ``file start byte // 20 + r``. A partial unit at the end of the file is
    left out here; the driver reports it from the listing, as it reports gaps between files.
    """
    with open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=CQ_UNIT_DTYPE, count=len(raw) // UNIT_SIZE)


__all__ = ["MessageFields", "message_fields"]  # re-exported: the scan decodes messages through here
