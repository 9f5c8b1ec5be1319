"""Read-only views of the broker's data for the audit: message routing fields and ConsumeQueue units.

The layouts are FORMATS.md sections 4 and 5 as ``broker_adapter.message`` and ``broker_adapter.consumequeue``
define them; this module reuses their constants and property decoding but never their writers (opening a
``ConsumeQueue`` repairs a torn unit in place, which an audit must not do).

A message's identity (``msg_id``) is RocketMQ's unique client key (``UNIQ_CLIENT_MESSAGE_ID_KEYIDX``), or, when a
producer did not set one, ``<PRODUCER_ID>:<PRODUCER_SEQ>`` from the idempotent producer's properties.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

from broker_adapter import message
from broker_adapter.consumequeue import UNIT_SIZE

MESSAGE_MAGIC_BYTES: Final = struct.pack(">i", message.MAGIC_CODE)
COMMAND_MAGIC_BYTES: Final = b"DLBC"  # broker_adapter.commands.COMMAND_MAGIC, 0x444C4243

# Kinds of entry bodies (the ``body_kind`` column).
BODY_RAW: Final = 0
BODY_MESSAGE: Final = 1
BODY_COMMAND: Final = 2
BODY_BAD_MESSAGE: Final = 3

_ROUTE: Final = struct.Struct(">i4x4xiiqq")  # TOTALSIZE, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET
_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")

CQ_UNIT_DTYPE: Final = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_UNIT_DTYPE.itemsize == UNIT_SIZE


@dataclass(frozen=True, slots=True)
class MessageFields:
    """What the audit compares for one message."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    msg_id: str | None


def body_kind(head: bytes) -> int:
    """Message, command or raw, from bytes 4..8 of an entry body (``head`` = those four bytes)."""
    if head == MESSAGE_MAGIC_BYTES:
        return BODY_MESSAGE
    if head == COMMAND_MAGIC_BYTES:
        return BODY_COMMAND
    return BODY_RAW


def message_fields(body: bytes | memoryview) -> MessageFields:
    """Routing fields of an encoded message; raises ``message.MessageFormatError`` naming the bad field."""
    n = len(body)
    if n < message.OVERHEAD:
        raise message.MessageFormatError(
            f"message is {n} bytes, shorter than the {message.OVERHEAD}-byte minimum"
        )
    total, queue_id, _flag, queue_offset, physical_offset = _ROUTE.unpack_from(body, 0)
    if total != n:
        raise message.MessageFormatError(f"TOTALSIZE {total} != entry body length {n}")
    body_len = _U32.unpack_from(body, message.FIXED_SIZE)[0]
    off = message.FIXED_SIZE + 4 + body_len
    if off + 3 > n:
        raise message.MessageFormatError(f"BODYLEN {body_len} runs past the message end ({n} bytes)")
    topic_len = body[off]
    topic_raw = bytes(body[off + 1 : off + 1 + topic_len])
    off += 1 + topic_len
    if off + 2 > n:
        raise message.MessageFormatError(f"TOPICLEN {topic_len} runs past the message end ({n} bytes)")
    props_len = _U16.unpack_from(body, off)[0]
    off += 2
    if off + props_len != n:
        raise message.MessageFormatError(
            f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}"
        )
    try:
        topic = topic_raw.decode()
        props = message.decode_properties(body[off:n]) if props_len else {}
    except UnicodeDecodeError as err:
        raise message.MessageFormatError(f"topic or properties are not UTF-8: {err}") from err
    msg_id = props.get(message.PROPERTY_UNIQ_KEY)
    if msg_id is None:
        producer = props.get(message.PROPERTY_PRODUCER_ID)
        seq = props.get(message.PROPERTY_SEQUENCE)
        if producer is not None and seq is not None:
            msg_id = f"{producer}:{seq}"
    return MessageFields(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        size=n,
        tags_code=message.tags_code(props.get(message.PROPERTY_TAGS)),
        msg_id=msg_id,
    )


def read_queue_file(path: str) -> np.ndarray:
    """The whole units of one ConsumeQueue file as a structured array (``CQ_UNIT_DTYPE``), read-only.

    The unit in row r has queue offset ``file start byte // 20 + r``. A partial unit at the end of the file is
    left out here; the driver reports it from the listing, as it reports gaps between files.
    """
    with open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=CQ_UNIT_DTYPE, count=len(raw) // UNIT_SIZE)
