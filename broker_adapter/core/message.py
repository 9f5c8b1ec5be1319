"""RocketMQ CommitLog message (version 1, IPv4 hosts): the body of one log entry (docs/formats.md section 5).

    #  field                        bytes  offset
    1  TOTALSIZE                    4      0
    2  MAGICCODE (0xDAA320A7)       4      4
    3  BODYCRC                      4      8     crc32(body) & 0x7FFFFFFF, as RocketMQ's UtilAll.crc32
    4  QUEUEID                      4      12
    5  FLAG                         4      16
    6  QUEUEOFFSET                  8      20    assigned by the leader (dense per topic and queue)
    7  PHYSICALOFFSET               8      28    entry pos + 48: the position of this message in the log
    8  SYSFLAG                      4      36
    9  BORNTIMESTAMP                8      40
    10 BORNHOST (ipv4 + port)       8      48
    11 STORETIMESTAMP               8      56
    12 STOREHOST (ipv4 + port)      8      64
    13 RECONSUMETIMES               4      72
    14 PREPAREDTRANSACTIONOFFSET    8      76
    15 BODYLEN + BODY               4 + n  84
    16 TOPICLEN + TOPIC             1 + t        t <= 127 bytes of UTF-8
    17 PROPERTIESLEN + PROPERTIES   2 + p        name \\x01 value \\x02 ..., as RocketMQ's MessageDecoder

Fixed overhead is 91 bytes. QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are known only once the leader places the
entry, so they are patched into an encoded message in place (``patch_placement``) without re-encoding the rest.
Pure functions only: the broker, the Spark audit and the tests share this module.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from broker_adapter.core.formats import (  # the layout's constants and pure helpers live beneath this module
    MAGIC_CODE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_PRODUCER_ID,
    PROPERTY_SEPARATOR,
    PROPERTY_SEQUENCE,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    MessageFormatError,
    decode_properties,
)
from broker_adapter.core.formats import (
    PROPERTY_ORIGIN as PROPERTY_ORIGIN,  # re-exported: the delivery code reads it with the other property names
)
from broker_adapter.core.formats import (
    java_string_hash as java_string_hash,  # re-exported: the message API users know
)
from broker_adapter.core.formats import (
    tags_code as tags_code,
)

_FIXED: Final = struct.Struct(">iiiiiqqiq8sq8siq")  # fields 1-14
FIXED_SIZE: Final = _FIXED.size  # 84
OVERHEAD: Final = FIXED_SIZE + 4 + 1 + 2  # 91
QUEUE_OFFSET_OFFSET: Final = 20
PHYSICAL_OFFSET_OFFSET: Final = 28
MAX_TOPIC_BYTES: Final = 127
MAX_PROPERTIES_BYTES: Final = 32767


def peek_property(buf: bytes | bytearray | memoryview, name: str) -> str | None:
    """One property of an encoded message, read without decoding the others (None when absent)."""
    v = _property(_properties_view(buf), (name + NAME_VALUE_SEPARATOR).encode())
    return None if v is None else v.decode()


def peek_store_timestamp(buf: bytes | bytearray | memoryview) -> int:
    """STORETIMESTAMP of an encoded message (the leader's clock when it placed it)."""
    stamp: int = struct.unpack_from(">q", buf, _STORE_TIMESTAMP_AT)[0]
    return stamp


_STORE_TIMESTAMP_AT: Final = 56  # after TOTALSIZE .. BORNTIMESTAMP (40) and BORNHOST (8, IPv4)


def peek_properties(buf: bytes | bytearray | memoryview) -> dict[str, str]:
    """Every property of an encoded message."""
    return decode_properties(_properties_view(buf))


# Property names RocketMQ uses (MessageConst).
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_MESSAGE_GROUP: Final = "__SHARDINGKEY"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"  # a timer message's due time, ms since the epoch
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"  # where a timer / half message goes when due / committed
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_CHECK_IMMUNITY_S: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"  # a committed transactional message's transaction id
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"  # a dead letter's original topic
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_BORN_HOST: Final = (
    "__BORNHOST"  # the producer's own name for its host (a RocketMQ 5 client's born_host)
)
KEY_SEPARATOR: Final = " "
# The property names RocketMQ keeps for itself (its MessageConst.STRING_HASH_SET): a RocketMQ 5 client may not
# send them as user properties (broker_adapter/rocketmq/convert.py), as RocketMQ's proxy refuses them; the broker
# reads several of them (RETRY_TOPIC, RECONSUME_TIME, PGROUP...) to count retries and route copies.
ROCKETMQ_RESERVED_PROPERTIES: Final = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_BORN_HOST,
        *[
            "WAIT",
            "DELAY",
            "MIN_OFFSET",
            "MAX_OFFSET",
            "BUYER_ID",
            "TRANSFER_FLAG",
            "CORRECTION_FLAG",
            "MQ2_FLAG",
            "MSG_REGION",
            "TRACE_ON",
        ],
        *[
            "UNIQ_KEY",
            "MAX_RECONSUME_TIMES",
            "CONSUME_START_TIME",
            "POP_CK",
            "POP_CK_OFFSET",
            "1ST_POP_TIME",
            "DUP_INFO",
        ],
        *[
            "TRAN_PREPARED_QUEUE_OFFSET",
            "EXTEND_UNIQ_INFO",
            "INSTANCE_ID",
            "CORRELATION_ID",
            "REPLY_TO_CLIENT",
            "TTL",
        ],
        *[
            "ARRIVE_TIME",
            "PUSH_REPLY_TIME",
            "CLUSTER",
            "MSG_TYPE",
            "INNER_MULTI_QUEUE_OFFSET",
            "TIMER_DELAY_MS",
        ],
        *["TIMER_DELAY_SEC", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS"],
        *[
            "TIMER_DEL_UNIQKEY",
            "TIMER_DELAY_LEVEL",
            "BORN_TIMESTAMP",
            "DLQ_ORIGIN_TOPIC",
            "DLQ_ORIGIN_MESSAGE_ID",
            "__CRC32#",
        ],
    }
)


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []

    @property
    def msg_id(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's BODYCRC: java.util.zip.CRC32 of the body masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(props: dict[str, str]) -> bytes:
    text = "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())
    # Each name and value adds exactly one of each separator; any more means one of them holds a separator.
    if text.count(NAME_VALUE_SEPARATOR) != len(props) or text.count(PROPERTY_SEPARATOR) != len(props):
        for k, v in props.items():
            if any(NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part for part in (k, v)):
                raise MessageFormatError(
                    f"property {k!r} contains a reserved separator character (\\x01 or \\x02)"
                )
    return text.encode()


@functools.lru_cache(maxsize=256)
def _host(host: tuple[str, int]) -> bytes:
    """BORNHOST / STOREHOST bytes (cached: a broker writes the same few hosts into every message)."""
    ip, port = host
    parts = ip.split(".")
    if len(parts) != 4:
        raise MessageFormatError(f"host {ip!r} is not an IPv4 address")
    return bytes(int(p) for p in parts) + port.to_bytes(4, "big")


@functools.lru_cache(maxsize=256)
def _unhost(raw: bytes) -> tuple[str, int]:
    return ".".join(str(b) for b in raw[:4]), int.from_bytes(raw[4:8], "big")


def encoded_size(topic: str, body_len: int, properties: dict[str, str]) -> int:
    return OVERHEAD + body_len + len(topic.encode()) + len(encode_properties(properties))


def encode(msg: Message) -> bytes:
    return encode_fields(
        msg.topic,
        msg.body,
        msg.properties,
        queue_id=msg.queue_id,
        flag=msg.flag,
        queue_offset=msg.queue_offset,
        physical_offset=msg.physical_offset,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        store_timestamp=msg.store_timestamp,
        store_host=msg.store_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=msg.prepared_transaction_offset,
    )


def encode_fields(
    topic: str,
    body: bytes,
    properties: dict[str, str],
    *,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: tuple[str, int] = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host: tuple[str, int] = ("127.0.0.1", 0),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """``encode`` without building a ``Message`` first (the broker's send path encodes every message)."""
    topic_b = topic.encode()
    if not topic_b or len(topic_b) > MAX_TOPIC_BYTES:
        raise MessageFormatError(f"topic must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, got {len(topic_b)}")
    props = encode_properties(properties)
    if len(props) > MAX_PROPERTIES_BYTES:
        raise MessageFormatError(f"properties are {len(props)} bytes, at most {MAX_PROPERTIES_BYTES} allowed")
    head = _FIXED.pack(
        OVERHEAD + len(body) + len(topic_b) + len(props),
        MAGIC_CODE,
        body_crc(body),
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
        _host(born_host),
        store_timestamp,
        _host(store_host),
        reconsume_times,
        prepared_transaction_offset,
    )
    return b"".join(
        (
            head,
            len(body).to_bytes(4, "big"),
            body,
            len(topic_b).to_bytes(1, "big"),
            topic_b,
            len(props).to_bytes(2, "big"),
            props,
        )
    )


def encode_send(
    topic: str,
    body: bytes,
    queue_id: int,
    msg_id: str,
    *,
    tags: str = "",
    keys: Iterable[str] = (),
    producer_id: str = "",
    sequence: int = 0,
    properties: Mapping[str, str] | None = None,
    born_timestamp: int = 0,
) -> tuple[bytes, dict[str, str]]:
    """A message to send in its stored form, with the properties every sender stamps (id, tags, keys, the
    idempotent producer's identity): the leader's for a ``Send``, the client's for a producer session, alike.
    QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are left 0 for the leader (``patch_placement``)."""
    props = dict(properties) if properties else {}
    props[PROPERTY_UNIQ_KEY] = msg_id
    if tags:
        props[PROPERTY_TAGS] = tags
    if keys:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
    if producer_id:
        props[PROPERTY_PRODUCER_ID] = producer_id
        props[PROPERTY_SEQUENCE] = str(sequence)
    return encode_fields(topic, body, props, queue_id=queue_id, born_timestamp=born_timestamp), props


def patch_placement(
    buf: bytearray | memoryview, queue_offset: int, physical_offset: int, store_timestamp: int | None = None
) -> None:
    """Write what the leader decides as it places a message (QUEUEOFFSET, PHYSICALOFFSET and, unless None,
    STORETIMESTAMP) into the encoded message in place."""
    struct.pack_into(">qq", buf, QUEUE_OFFSET_OFFSET, queue_offset, physical_offset)
    if store_timestamp is not None:
        struct.pack_into(">q", buf, _STORE_TIMESTAMP_AT, store_timestamp)


def decode(buf: bytes | bytearray | memoryview, check_crc: bool = True) -> Message:
    """Decode one message occupying all of ``buf`` (an entry body)."""
    n = len(buf)
    if n < OVERHEAD:
        raise MessageFormatError(f"message is {n} bytes, shorter than the {OVERHEAD}-byte minimum")
    f = _FIXED.unpack_from(buf, 0)
    total, magic = f[0], f[1]
    if magic != MAGIC_CODE:
        raise MessageFormatError(f"bad MAGICCODE {magic & 0xFFFFFFFF:#010x}, expected 0xdaa320a7")
    if total != n:
        raise MessageFormatError(f"TOTALSIZE {total} != {n} bytes available")
    off = FIXED_SIZE
    body_len = int.from_bytes(buf[off : off + 4], "big")
    off += 4
    if body_len < 0 or off + body_len + 3 > n:
        raise MessageFormatError(f"BODYLEN {body_len} runs past the message end ({n} bytes)")
    body = bytes(buf[off : off + body_len])
    off += body_len
    if check_crc and body_crc(body) != f[2]:
        raise MessageFormatError(f"BODYCRC {f[2]} does not match the body ({body_crc(body)})")
    topic_len = buf[off]
    off += 1
    topic = bytes(buf[off : off + topic_len]).decode()
    off += topic_len
    if off + 2 > n:
        raise MessageFormatError("message ends before PROPERTIESLEN")
    props_len = int.from_bytes(buf[off : off + 2], "big")
    off += 2
    if off + props_len != n:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}")
    props = decode_properties(buf[off : off + props_len])
    return Message(
        topic=topic,
        body=body,
        queue_id=f[3],
        flag=f[4],
        queue_offset=f[5],
        physical_offset=f[6],
        sys_flag=f[7],
        born_timestamp=f[8],
        born_host=_unhost(f[9]),
        store_timestamp=f[10],
        store_host=_unhost(f[11]),
        reconsume_times=f[12],
        prepared_transaction_offset=f[13],
        properties=props,
    )


@dataclass(frozen=True, slots=True)
class Route:
    """What the dispatcher needs from a message, read without copying or checking the body."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags: str | None
    producer: tuple[str, int] | None = None  # (PRODUCER_ID, PRODUCER_SEQ), as ``peek_producer``
    origin: str | None = None  # PROPERTY_ORIGIN: the copy's source, for copies the broker makes


_ROUTE_HEAD = struct.Struct(">i8xi4xqq")  # TOTALSIZE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET


def peek_route(buf: bytes | bytearray | memoryview) -> Route:
    """Topic, queue, offsets, size and tags of an encoded message (structure checked, BODYCRC not)."""
    n = len(buf)
    if n < OVERHEAD:
        raise MessageFormatError(f"message is {n} bytes, shorter than the {OVERHEAD}-byte minimum")
    total, queue_id, queue_offset, physical_offset = _ROUTE_HEAD.unpack_from(buf, 0)
    if total != n:
        raise MessageFormatError(f"TOTALSIZE {total} != {n} bytes available")
    off = FIXED_SIZE + 4 + int.from_bytes(buf[FIXED_SIZE : FIXED_SIZE + 4], "big")
    if off + 3 > n:
        raise MessageFormatError(f"BODYLEN runs past the message end ({n} bytes)")
    topic_len = buf[off]
    topic = bytes(buf[off + 1 : off + 1 + topic_len]).decode()
    off += 1 + topic_len
    props_len = int.from_bytes(buf[off : off + 2], "big")
    if off + 2 + props_len != n:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}")
    if not props_len:
        return Route(topic, queue_id, queue_offset, physical_offset, n, None)
    # One copy of the properties section, searched for the three the dispatcher needs.
    raw = bytes(buf[off + 2 : n])
    tags = _property(raw, _TAGS_KEY)
    origin = _property(raw, _ORIGIN_KEY)
    return Route(
        topic,
        queue_id,
        queue_offset,
        physical_offset,
        n,
        None if tags is None else tags.decode(),
        _producer(raw),
        None if origin is None else origin.decode(),
    )


_ROUTING_PROPERTIES: Final = frozenset(
    {PROPERTY_TAGS, PROPERTY_ORIGIN, PROPERTY_PRODUCER_ID, PROPERTY_SEQUENCE}
)
# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, ... BODYLEN
_STORED_HEAD = struct.Struct(">iiii4xqqi44xi")


def check_stored(buf: bytes) -> Route:
    """A message a producer sent in its stored form (a producer session, docs/broker.md), checked as the leader
    must before storing bytes it did not encode: the structure, MAGICCODE, BODYCRC, a normal message (SYSFLAG 0,
    offsets left 0 for the leader) and properties a consumer can read (UTF-8, each ``name\x01value``). Its
    ``Route`` (what ``peek_route`` reads), in one pass over the properties, or ``MessageFormatError`` naming
    the field."""
    n = len(buf)
    if n < OVERHEAD:
        raise MessageFormatError(f"message is {n} bytes, shorter than the {OVERHEAD}-byte minimum")
    total, magic, crc, queue_id, queue_offset, physical_offset, sys_flag, body_len = _STORED_HEAD.unpack_from(
        buf
    )
    if total != n:
        raise MessageFormatError(f"TOTALSIZE {total} != {n} bytes available")
    if magic != MAGIC_CODE:
        raise MessageFormatError(f"bad MAGICCODE {magic & 0xFFFFFFFF:#010x}, expected 0xdaa320a7")
    if sys_flag != 0:
        raise MessageFormatError(
            f"SYSFLAG is {sys_flag}: a session sends normal messages with IPv4 hosts (0)"
        )
    if queue_offset or physical_offset:
        raise MessageFormatError("QUEUEOFFSET and PHYSICALOFFSET are the leader's to fill in: send 0")
    if queue_id < 0:
        raise MessageFormatError(f"QUEUEID {queue_id} is negative")
    off = FIXED_SIZE + 4 + body_len
    if body_len < 0 or off + 3 > n:
        raise MessageFormatError(f"BODYLEN {body_len} runs past the message end ({n} bytes)")
    if body_crc(memoryview(buf)[FIXED_SIZE + 4 : off]) != crc:
        raise MessageFormatError(f"BODYCRC {crc} does not match the body")
    topic_len = buf[off]
    try:
        topic = buf[off + 1 : off + 1 + topic_len].decode()
    except UnicodeDecodeError:
        raise MessageFormatError("TOPIC is not UTF-8") from None
    off += 1 + topic_len
    props_len = int.from_bytes(buf[off : off + 2], "big")
    if off + 2 + props_len != n:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}")
    try:
        props = buf[off + 2 :].decode()
    except UnicodeDecodeError:
        raise MessageFormatError("PROPERTIES are not UTF-8") from None
    routing: dict[str, str] = {}  # the properties a route holds: each at most once, so every reader agrees
    for item in props.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep:
            if item:
                raise MessageFormatError(f"property {name!r} has no value separator")
        elif name in _ROUTING_PROPERTIES:
            if name in routing:
                raise MessageFormatError(f"property {name} appears twice")
            routing[name] = value
    tags, origin = routing.get(PROPERTY_TAGS), routing.get(PROPERTY_ORIGIN)
    pid, seq = routing.get(PROPERTY_PRODUCER_ID), routing.get(PROPERTY_SEQUENCE)
    producer = (pid, int(seq)) if pid and seq is not None and seq.isascii() and seq.isdigit() else None
    return Route(topic, queue_id, 0, 0, n, tags, producer, origin)


def route_of(topic: str, queue_id: int, size: int, properties: dict[str, str]) -> Route:
    """The ``Route`` that ``peek_route`` reads from a message of ``size`` bytes encoded with these properties
    (offsets 0: the allocator fills them in), for the encoder that has them at hand."""
    pid = properties.get(PROPERTY_PRODUCER_ID)
    seq = properties.get(PROPERTY_SEQUENCE)
    producer = (pid, int(seq)) if pid and seq is not None and seq.isascii() and seq.isdigit() else None
    return Route(
        topic, queue_id, 0, 0, size, properties.get(PROPERTY_TAGS), producer, properties.get(PROPERTY_ORIGIN)
    )


def _properties_view(buf: bytes | bytearray | memoryview) -> bytes:
    n = len(buf)
    off = FIXED_SIZE + 4 + int.from_bytes(buf[FIXED_SIZE : FIXED_SIZE + 4], "big")
    off += 1 + buf[off]
    return bytes(buf[off + 2 : n])


_PRODUCER_KEY: Final = (PROPERTY_PRODUCER_ID + NAME_VALUE_SEPARATOR).encode()
_TAGS_KEY: Final = (PROPERTY_TAGS + NAME_VALUE_SEPARATOR).encode()
_ORIGIN_KEY: Final = (PROPERTY_ORIGIN + NAME_VALUE_SEPARATOR).encode()
_SEQUENCE_KEY: Final = (PROPERTY_SEQUENCE + NAME_VALUE_SEPARATOR).encode()


def _property(raw: bytes, key: bytes) -> bytes | None:
    """The value of the property whose ``name\x01`` is ``key``, found without decoding the others."""
    at = raw.find(key)
    while at > 0 and raw[at - 1] != 2:  # inside another property's value: look further
        at = raw.find(key, at + 1)
    if at < 0:
        return None
    start = at + len(key)
    end = raw.find(b"\x02", start)
    return raw[start : end if end >= 0 else len(raw)]


def peek_producer(buf: bytes | bytearray | memoryview) -> tuple[str, int] | None:
    """(PRODUCER_ID, PRODUCER_SEQ) of an encoded message from an idempotent producer, else None.

    Reads only the properties section; a malformed sequence is treated as absent (the message is then not
    deduplicated, never rejected at dispatch)."""
    return _producer(_properties_view(buf))


def _producer(raw: bytes) -> tuple[str, int] | None:
    pid = _property(raw, _PRODUCER_KEY)
    if not pid:
        return None
    seq = _property(raw, _SEQUENCE_KEY)
    if seq is None or not seq.isdigit():
        return None
    return pid.decode(), int(seq)
