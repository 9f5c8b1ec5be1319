"""Building RocketMQ CommitLog messages (version 1, IPv4 hosts): encoding one, stamping the properties every sender
sets, patching in what the leader decides as it places one, and the property names the broker reads and writes.

The layout and every reader of it live in ``broker_adapter.core.formats`` (standard library only: the Spark audit
imports it alone); this module builds on it, and hands on its names (``Message``, ``decode``, ``peek_route``...)
to the many users that know them as ``message.X``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping
from typing import Final

from broker_adapter.core.formats import (
    FIXED,
    FIXED_SIZE,
    KEY_SEPARATOR,
    MAGIC_CODE,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    NAME_VALUE_SEPARATOR,
    OVERHEAD,
    PHYSICAL_OFFSET_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_ORIGIN,
    PROPERTY_PRODUCER_ID,
    PROPERTY_SEPARATOR,
    PROPERTY_SEQUENCE,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    QUEUE_OFFSET_OFFSET,
    STORE_TIMESTAMP_OFFSET,
    Message,
    MessageFormatError,
    Route,
    body_crc,
    check_stored,
    decode,
    decode_properties,
    java_string_hash,
    peek_id_and_keys,
    peek_producer,
    peek_properties,
    peek_property,
    peek_route,
    peek_store_timestamp,
    route_of,
    tags_code,
)

# The names of ``formats`` this module hands on, with its own public ones.
__all__ = [
    "FIXED_SIZE",
    "KEY_SEPARATOR",
    "MAGIC_CODE",
    "MAX_PROPERTIES_BYTES",
    "MAX_TOPIC_BYTES",
    "NAME_VALUE_SEPARATOR",
    "OVERHEAD",
    "PHYSICAL_OFFSET_OFFSET",
    "PROPERTY_BORN_HOST",
    "PROPERTY_CHECK_IMMUNITY_S",
    "PROPERTY_KEYS",
    "PROPERTY_MESSAGE_GROUP",
    "PROPERTY_ORIGIN",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_PRODUCER_ID",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_SEPARATOR",
    "PROPERTY_SEQUENCE",
    "PROPERTY_TAGS",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TRANSACTION_ID",
    "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_UNIQ_KEY",
    "QUEUE_OFFSET_OFFSET",
    "ROCKETMQ_RESERVED_PROPERTIES",
    "Message",
    "MessageFormatError",
    "Route",
    "body_crc",
    "check_stored",
    "decode",
    "decode_properties",
    "encode",
    "encode_fields",
    "encode_properties",
    "encode_send",
    "encoded_size",
    "java_string_hash",
    "patch_placement",
    "peek_id_and_keys",
    "peek_producer",
    "peek_properties",
    "peek_property",
    "peek_route",
    "peek_store_timestamp",
    "route_of",
    "tags_code",
]

# Property names RocketMQ uses (MessageConst).
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


def encode_properties(props: Mapping[str, str]) -> bytes:
    text = "".join([f"{k}\x01{v}\x02" for k, v in props.items()])
    # Each name and value adds exactly one of each separator; any more means one of them holds a separator.
    if text.count(NAME_VALUE_SEPARATOR) != len(props) or text.count(PROPERTY_SEPARATOR) != len(props):
        for k, v in props.items():
            if any(NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part for part in (k, v)):
                raise MessageFormatError(
                    f"property {k!r} contains a reserved separator character (\\x01 or \\x02)"
                )
    return text.encode()


_U32: Final = struct.Struct(">I")  # BODYLEN
_U16: Final = struct.Struct(">H")  # PROPERTIESLEN


@functools.lru_cache(maxsize=4096)
def _topic_field(topic: str) -> bytes:
    """TOPICLEN + TOPIC, checked (cached: a producer writes the same few topics into every message)."""
    topic_b = topic.encode()
    if not topic_b or len(topic_b) > MAX_TOPIC_BYTES:
        raise MessageFormatError(f"topic must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, got {len(topic_b)}")
    return bytes((len(topic_b),)) + topic_b


@functools.lru_cache(maxsize=256)
def _host(host: tuple[str, int]) -> bytes:
    """BORNHOST / STOREHOST bytes (cached: a broker writes the same few hosts into every message)."""
    ip, port = host
    parts = ip.split(".")
    if len(parts) != 4:
        raise MessageFormatError(f"host {ip!r} is not an IPv4 address")
    return bytes(int(p) for p in parts) + port.to_bytes(4, "big")


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
    topic_field = _topic_field(topic)
    props = encode_properties(properties)
    if len(props) > MAX_PROPERTIES_BYTES:
        raise MessageFormatError(f"properties are {len(props)} bytes, at most {MAX_PROPERTIES_BYTES} allowed")
    body_len = len(body)
    head = FIXED.pack(
        OVERHEAD + body_len + len(topic_field) - 1 + len(props),
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
    return b"".join((head, _U32.pack(body_len), body, topic_field, _U16.pack(len(props)), props))


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
        struct.pack_into(">q", buf, STORE_TIMESTAMP_OFFSET, store_timestamp)
