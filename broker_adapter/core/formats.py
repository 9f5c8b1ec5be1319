"""The broker's on-disk layouts and their parsing, and nothing else: standard library only.

The Spark audit reads the broker's data (docs/formats.md sections 4 and 5) from the nodes' files, on executors that
need not have the broker's runtime, so it may import this module and no other of ``broker_adapter``. It is the one
home of the message layout (its constants and every reader of it: ``decode``, ``peek_route``, ``check_stored``,
``message_fields``, the ``peek_*`` helpers), the command magic and the ConsumeQueue unit size.
``broker_adapter.core.message``, ``commands`` and ``consumequeue`` own the writers; ``tests/spark/test_formats.py``
proves that both sides agree.

A RocketMQ CommitLog message (version 1, IPv4 hosts), the body of one log entry (docs/formats.md section 5):

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
entry, so the writer patches them into an encoded message in place (``message.patch_placement``).
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass, field
from typing import Final

# -- message (docs/formats.md section 5) ----------------------------------------------------------------------------
MAGIC_CODE: Final = 0xDAA320A7 - (1 << 32)  # RocketMQ writes it as a Java int: -626843481
FIXED: Final = struct.Struct(">iiiiiqqiq8sq8siq")  # fields 1-14: TOTALSIZE .. PREPAREDTRANSACTIONOFFSET
FIXED_SIZE: Final = 84  # FIXED.size
OVERHEAD: Final = FIXED_SIZE + 4 + 1 + 2  # 91: with BODYLEN, TOPICLEN, PROPERTIESLEN
QUEUE_OFFSET_OFFSET: Final = 20  # where QUEUEOFFSET is (PHYSICALOFFSET follows it)
PHYSICAL_OFFSET_OFFSET: Final = 28
STORE_TIMESTAMP_OFFSET: Final = 56  # after TOTALSIZE .. BORNTIMESTAMP (40) and BORNHOST (8, IPv4)
MAX_TOPIC_BYTES: Final = 127
MAX_PROPERTIES_BYTES: Final = 32767

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
KEY_SEPARATOR: Final = " "  # between the keys of PROPERTY_KEYS
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
# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, ... BODYLEN
_STORED_HEAD: Final = struct.Struct(">iiii4xqqi44xi")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")

Buffer = bytes | bytearray | memoryview


class MessageFormatError(ValueError):
    """A message body does not follow the layout; the text says which field and where."""


@dataclass(slots=True)  # not frozen: see ``Route``
class MessageFields:
    """A message's routing fields: what a reader of the log compares with the ConsumeQueue and the acks."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    msg_id: str | None


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, 32-bit wrap): RocketMQ's tags code."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """A ConsumeQueue unit's tags code (0: no tags). Cached: every message's dispatch asks it, of a few tags."""
    return java_string_hash(tags) if tags else 0


def decode_properties(raw: Buffer) -> dict[str, str]:
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


def body_crc(body: Buffer) -> int:
    """RocketMQ's BODYCRC: java.util.zip.CRC32 of the body masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def _sections(buf: Buffer) -> tuple[int, int, int]:
    """Where an encoded message's variable fields are, its structure checked (TOTALSIZE against the buffer,
    BODYLEN, TOPICLEN and PROPERTIESLEN ending it exactly; not MAGICCODE, BODYCRC or the text's encoding):
    (BODYLEN, where TOPICLEN is, where the properties start); the properties run to the end."""
    n = len(buf)
    if n < OVERHEAD:
        raise MessageFormatError(f"message is {n} bytes, shorter than the {OVERHEAD}-byte minimum")
    total = _I32.unpack_from(buf, 0)[0]
    if total != n:
        raise MessageFormatError(f"TOTALSIZE {total} != {n} bytes available")
    body_len: int = _U32.unpack_from(buf, FIXED_SIZE)[0]
    topic_at = FIXED_SIZE + 4 + body_len
    if topic_at + 3 > n:
        raise MessageFormatError(f"BODYLEN {body_len} runs past the message end ({n} bytes)")
    props_at = topic_at + 1 + buf[topic_at] + 2
    if props_at > n:
        raise MessageFormatError(f"TOPICLEN {buf[topic_at]} runs past the message end ({n} bytes)")
    props_len = _U16.unpack_from(buf, props_at - 2)[0]
    if props_at + props_len != n:
        raise MessageFormatError(f"PROPERTIESLEN {props_len} does not end the message at TOTALSIZE {n}")
    return body_len, topic_at, props_at


def message_fields(body: bytes | memoryview) -> MessageFields:
    """Routing fields of an encoded message; raises ``MessageFormatError`` naming the bad field.

    A message's identity (``msg_id``) is RocketMQ's unique client key, or, when a producer did not set one,
    ``<PRODUCER_ID>:<PRODUCER_SEQ>`` from the idempotent producer's properties. A copy the broker made (a due
    delayed message, a committed transaction, a dead letter: it carries ``DLEDGER_ORIGIN``) keeps the client's
    key for its consumers, and is identified here as ``<key>@<origin>``: the original the producer's ack names
    and each copy are then one message each (the broker copies one origin once, docs/rocketmq.md, Delivery)."""
    _, topic_at, props_at = _sections(body)
    n = len(body)
    _total, queue_id, _flag, queue_offset, physical_offset = _ROUTE.unpack_from(body, 0)
    try:
        topic = bytes(body[topic_at + 1 : props_at - 2]).decode()
        props = decode_properties(body[props_at:n]) if props_at < n else {}
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


# -- a whole message --------------------------------------------------------------------------------------------------
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


@functools.lru_cache(maxsize=256)
def _unhost(raw: bytes) -> tuple[str, int]:
    return ".".join(str(b) for b in raw[:4]), int.from_bytes(raw[4:8], "big")


def decode(buf: Buffer, check_crc: bool = True) -> Message:
    """Decode one message occupying all of ``buf`` (an entry body)."""
    n = len(buf)
    if n >= OVERHEAD:  # (a shorter one: _sections says so)
        _check_magic(_I32.unpack_from(buf, 4)[0])
    _, topic_at, props_at = _sections(buf)
    f = FIXED.unpack_from(buf, 0)
    body = bytes(buf[FIXED_SIZE + 4 : topic_at])
    if check_crc and body_crc(body) != f[2]:
        raise MessageFormatError(f"BODYCRC {f[2]} does not match the body ({body_crc(body)})")
    return Message(
        topic=bytes(buf[topic_at + 1 : props_at - 2]).decode(),
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
        properties=decode_properties(buf[props_at:n]),
    )


def _check_magic(magic: int) -> None:
    if magic != MAGIC_CODE:
        raise MessageFormatError(f"bad MAGICCODE {magic & 0xFFFFFFFF:#010x}, expected 0xdaa320a7")


# -- routes: what the dispatcher needs ------------------------------------------------------------------------------
@dataclass(slots=True)
class Route:
    """What the dispatcher needs from a message, read without copying or checking the body. Not frozen (treat it
    as read-only): one is built for every message on every node, and a frozen dataclass costs about five times as
    much to build (docs/send-budget.md)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags: str | None
    producer: tuple[str, int] | None = None  # (PRODUCER_ID, PRODUCER_SEQ), as ``peek_producer``
    origin: str | None = None  # PROPERTY_ORIGIN: the copy's source, for copies the broker makes
    uniq: bytes | None = (
        None  # the raw UNIQ_KEY and KEYS values: the key index's input (``peek_id_and_keys``)
    )
    keys: bytes | None = None


# The properties a route holds, by their place in ``_scan_properties``'s answer. The first four decide where a
# message goes and whose it is: a producer session may carry each at most once (``check_stored``).
_SCANNED: Final = {
    PROPERTY_TAGS.encode(): 0,
    PROPERTY_ORIGIN.encode(): 1,
    PROPERTY_PRODUCER_ID.encode(): 2,
    PROPERTY_SEQUENCE.encode(): 3,
    PROPERTY_UNIQ_KEY.encode(): 4,
    PROPERTY_KEYS.encode(): 5,
}
_ROUTING_SCANNED: Final = 4


def _scan_properties(raw: bytes, strict: bool = False) -> list[bytes | None]:
    """The raw values of the route's properties (``_SCANNED`` order; None when absent) in one pass over the
    properties section, the first of a repeated name winning as in ``property_bytes``. ``strict`` (a session's
    message): an item without a value separator, or a routing property twice, is refused."""
    found: list[bytes | None] = [None] * 6
    for item in raw.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if not sep:
            if strict and item:
                raise MessageFormatError(f"property {name.decode(errors='replace')!r} has no value separator")
            continue
        k = _SCANNED.get(name)
        if k is not None:
            if found[k] is None:
                found[k] = value
            elif strict and k < _ROUTING_SCANNED:
                raise MessageFormatError(f"property {name.decode()} appears twice")
    return found


def _route(
    topic: str, queue_id: int, queue_offset: int, physical_offset: int, size: int, raw: bytes, strict: bool
) -> Route:
    tags, origin, pid, seq, uniq, keys = _scan_properties(raw, strict)
    return Route(
        topic,
        queue_id,
        queue_offset,
        physical_offset,
        size,
        None if tags is None else tags.decode(),
        _producer(pid, seq),
        None if origin is None else origin.decode(),
        uniq,
        keys,
    )


def _producer(pid: bytes | None, seq: bytes | None) -> tuple[str, int] | None:
    """(PRODUCER_ID, PRODUCER_SEQ) from their raw values; a malformed sequence counts as absent (the message is
    then not deduplicated, never rejected at dispatch)."""
    return (pid.decode(), int(seq)) if pid and seq is not None and seq.isdigit() else None


def peek_route(buf: Buffer) -> Route:
    """Topic, queue, offsets, size, tags, producer, origin, id and keys of an encoded message (structure
    checked, BODYCRC not), with one copy of its properties section read in one pass."""
    _, topic_at, props_at = _sections(buf)
    n = len(buf)
    _total, queue_id, _flag, queue_offset, physical_offset = _ROUTE.unpack_from(buf, 0)
    topic = bytes(buf[topic_at + 1 : props_at - 2]).decode()
    if props_at == n:
        return Route(topic, queue_id, queue_offset, physical_offset, n, None)
    return _route(topic, queue_id, queue_offset, physical_offset, n, bytes(buf[props_at:n]), False)


def check_stored(buf: bytes) -> Route:
    """A message a producer sent in its stored form (a producer session, docs/broker.md), checked as the leader
    must before storing bytes it did not encode: the structure, MAGICCODE, BODYCRC, a normal message (SYSFLAG 0,
    offsets left 0 for the leader) and properties a consumer can read (UTF-8, each ``name\x01value``, each
    routing property once). Its ``Route`` (what ``peek_route`` reads), in one pass over the properties, or
    ``MessageFormatError`` naming the field."""
    _, topic_at, props_at = _sections(buf)
    _total, magic, crc, queue_id, queue_offset, physical_offset, sys_flag, _ = _STORED_HEAD.unpack_from(buf)
    _check_magic(magic)
    if sys_flag != 0:
        raise MessageFormatError(
            f"SYSFLAG is {sys_flag}: a session sends normal messages with IPv4 hosts (0)"
        )
    if queue_offset or physical_offset:
        raise MessageFormatError("QUEUEOFFSET and PHYSICALOFFSET are the leader's to fill in: send 0")
    if queue_id < 0:
        raise MessageFormatError(f"QUEUEID {queue_id} is negative")
    if body_crc(memoryview(buf)[FIXED_SIZE + 4 : topic_at]) != crc:
        raise MessageFormatError(f"BODYCRC {crc} does not match the body")
    try:
        topic = buf[topic_at + 1 : props_at - 2].decode()
    except UnicodeDecodeError:
        raise MessageFormatError("TOPIC is not UTF-8") from None
    raw = buf[props_at:]
    try:
        raw.decode()  # a consumer must be able to read them; the scan below reads the bytes
    except UnicodeDecodeError:
        raise MessageFormatError("PROPERTIES are not UTF-8") from None
    return _route(topic, queue_id, 0, 0, len(buf), raw, True)


def route_of(topic: str, queue_id: int, size: int, properties: dict[str, str]) -> Route:
    """The ``Route`` that ``peek_route`` reads from a message of ``size`` bytes encoded with these properties
    (offsets 0: the allocator fills them in), for the encoder that has them at hand."""
    pid = properties.get(PROPERTY_PRODUCER_ID)
    seq = properties.get(PROPERTY_SEQUENCE)
    producer = (pid, int(seq)) if pid and seq is not None and seq.isascii() and seq.isdigit() else None
    uniq = properties.get(PROPERTY_UNIQ_KEY)
    keys = properties.get(PROPERTY_KEYS)
    return Route(
        topic,
        queue_id,
        0,
        0,
        size,
        properties.get(PROPERTY_TAGS),
        producer,
        properties.get(PROPERTY_ORIGIN),
        None if uniq is None else uniq.encode(),
        None if keys is None else keys.encode(),
    )


# -- single fields, read without decoding the rest --------------------------------------------------------------------
def peek_store_timestamp(buf: Buffer) -> int:
    """STORETIMESTAMP of an encoded message (the leader's clock when it placed it)."""
    stamp: int = _I64.unpack_from(buf, STORE_TIMESTAMP_OFFSET)[0]
    return stamp


def peek_property(buf: Buffer, name: str) -> str | None:
    """One property of an encoded message, read without decoding the others (None when absent)."""
    v = property_bytes(_properties_view(buf), (name + NAME_VALUE_SEPARATOR).encode())
    return None if v is None else v.decode()


def peek_properties(buf: Buffer) -> dict[str, str]:
    """Every property of an encoded message."""
    return decode_properties(_properties_view(buf))


def peek_producer(buf: Buffer) -> tuple[str, int] | None:
    """(PRODUCER_ID, PRODUCER_SEQ) of an encoded message from an idempotent producer, else None: what its
    ``Route.producer`` says (the same scan of the properties section)."""
    found = _scan_properties(_properties_view(buf))
    return _producer(found[2], found[3])


def _properties_view(buf: Buffer) -> bytes:
    """The properties section of a message already checked (stored): located, not checked again."""
    n = len(buf)
    off = FIXED_SIZE + 4 + int.from_bytes(buf[FIXED_SIZE : FIXED_SIZE + 4], "big")
    off += 1 + buf[off]
    return bytes(buf[off + 2 : n])


def peek_id_and_keys(buf: Buffer) -> tuple[bytes | None, bytes | None]:
    """The raw UNIQ_KEY and KEYS values of an encoded message (the key index's input), nothing decoded: what its
    ``Route.uniq`` and ``Route.keys`` say (the same scan), so the index's catch-up adds what dispatch adds."""
    found = _scan_properties(_properties_view(buf))
    return found[4], found[5]


def property_bytes(raw: bytes, key: bytes) -> bytes | None:
    """The value of the property whose ``name\x01`` is ``key``, found without decoding the others."""
    at = raw.find(key)
    while at > 0 and raw[at - 1] != 2:  # inside another property's value: look further
        at = raw.find(key, at + 1)
    if at < 0:
        return None
    start = at + len(key)
    end = raw.find(b"\x02", start)
    return raw[start : end if end >= 0 else len(raw)]
