"""The broker's on-disk layouts as a reader needs them, and nothing else: standard library only.

The Spark audit reads the broker's data (docs/formats.md sections 4 and 5) from the nodes' files, on executors that
need not have the broker's runtime, so it may import this module and no other of ``broker_adapter``. It holds
the message layout's constants, the decoding of a message's routing fields and properties, the command magic and
the ConsumeQueue unit size. ``broker_adapter.core.message``, ``commands`` and ``consumequeue`` own the writers;
``tests/spark/test_formats.py`` proves that both sides agree.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Final

# -- message (docs/formats.md section 5) ----------------------------------------------------------------------------
MAGIC_CODE: Final = 0xDAA320A7 - (1 << 32)  # RocketMQ writes it as a Java int: -626843481
FIXED_SIZE: Final = 84  # fields 1-14: TOTALSIZE .. PREPAREDTRANSACTIONOFFSET
OVERHEAD: Final = FIXED_SIZE + 4 + 1 + 2  # 91: with BODYLEN, TOPICLEN, PROPERTIESLEN

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROPERTY_PRODUCER_ID: Final = "PRODUCER_ID"  # ours: idempotent producer identity
PROPERTY_SEQUENCE: Final = "PRODUCER_SEQ"  # ours: per-producer sequence number
PROPERTY_ORIGIN: Final = (
    "DLEDGER_ORIGIN"  # ours: a broker copy names what it ends (docs/rocketmq.md, Delivery)
)

# -- broker command (an entry body that is not a message) -----------------------------------------------------------
COMMAND_MAGIC: Final = 0x444C4243  # b"DLBC" at bytes 4..8

# -- ConsumeQueue (docs/formats.md section 4) -----------------------------------------------------------------------
CQ_UNIT: Final = struct.Struct(">qiq")  # commitlog_offset, size, tags_code
UNIT_SIZE: Final = CQ_UNIT.size  # 20

_ROUTE: Final = struct.Struct(">i4x4xiiqq")  # TOTALSIZE, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET
_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")


class MessageFormatError(ValueError):
    """A message body does not follow the layout; the text says which field and where."""


@dataclass(frozen=True, slots=True)
class MessageFields:
    """A message's routing fields: what a reader of the log compares with the ConsumeQueue and the acks."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    msg_id: str | None


@functools.lru_cache(maxsize=4096)
def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, 32-bit wrap): RocketMQ's tags code."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    return java_string_hash(tags) if tags else 0


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """``name \\x01 value \\x02 ...`` as RocketMQ's MessageDecoder writes it."""
    props: dict[str, str] = {}
    for item in bytes(raw).decode().split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep:
            raise MessageFormatError(f"property {name!r} has no value separator")
        props[name] = value
    return props


def message_fields(body: bytes | memoryview) -> MessageFields:
    """Routing fields of an encoded message; raises ``MessageFormatError`` naming the bad field.

    A message's identity (``msg_id``) is RocketMQ's unique client key, or, when a producer did not set one,
    ``<PRODUCER_ID>:<PRODUCER_SEQ>`` from the idempotent producer's properties. A copy the broker made (a due
    delayed message, a committed transaction, a dead letter: it carries ``DLEDGER_ORIGIN``) keeps the client's
    key for its consumers, and is identified here as ``<key>@<origin>``: the original the producer's ack names
    and each copy are then one message each (the broker copies one origin once, docs/rocketmq.md, Delivery)."""
    n = len(body)
    if n < OVERHEAD:
        raise MessageFormatError(f"message is {n} bytes, shorter than the {OVERHEAD}-byte minimum")
    total, queue_id, _flag, queue_offset, physical_offset = _ROUTE.unpack_from(body, 0)
    if total != n:
        raise MessageFormatError(f"TOTALSIZE {total} != entry body length {n}")
    body_len = _U32.unpack_from(body, FIXED_SIZE)[0]
    off = FIXED_SIZE + 4 + body_len
    if off + 3 > n:
        raise MessageFormatError(f"BODYLEN {body_len} runs past the message end ({n} bytes)")
    topic_len = body[off]
    topic_raw = bytes(body[off + 1 : off + 1 + topic_len])
    off += 1 + topic_len
    if off + 2 > n:
        raise MessageFormatError(f"TOPICLEN {topic_len} runs past the message end ({n} bytes)")
    props_len = _U16.unpack_from(body, off)[0]
    off += 2
    if off + props_len != n:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}")
    try:
        topic = topic_raw.decode()
        props = decode_properties(body[off:n]) if props_len else {}
    except UnicodeDecodeError as err:
        raise MessageFormatError(f"topic or properties are not UTF-8: {err}") from err
    msg_id = props.get(PROPERTY_UNIQ_KEY)
    if msg_id is None:
        producer = props.get(PROPERTY_PRODUCER_ID)
        seq = props.get(PROPERTY_SEQUENCE)
        if producer is not None and seq is not None:
            msg_id = f"{producer}:{seq}"
    origin = props.get(PROPERTY_ORIGIN)
    if origin is not None and msg_id is not None:
        msg_id = f"{msg_id}@{origin}"
    return MessageFields(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        size=n,
        tags_code=tags_code(props.get(PROPERTY_TAGS)),
        msg_id=msg_id,
    )
