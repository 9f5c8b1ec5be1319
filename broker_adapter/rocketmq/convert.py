"""RocketMQ v2 messages <-> the broker's one message model (a CommitLog message, ``broker_adapter.core.message``).

A message sent by a RocketMQ 5 client is stored exactly as RocketMQ stores it: its tag in TAGS, keys in KEYS
(space separated), client message id in UNIQ_CLIENT_MESSAGE_ID_KEYIDX, message group in __SHARDINGKEY, user
properties as properties. So our own ``Consumer`` reads it like any message, and a message sent by our own
``Producer`` reaches RocketMQ clients with the same tag, keys and id. The idempotent-producer properties
(PRODUCER_ID / PRODUCER_SEQ) come from the client id and the sequence inside the client's message id, which the
official clients keep across retries: a send retried after a failover is stored once.

A received message carries its body's MD5 as 32 upper-case hex digits, as RocketMQ's proxy sends it: it is the
one digest every official client checks alike (their CRC32 checks disagree: Node.js compares a decimal string,
Java, Go and C# unpadded hex, Python 8 padded digits; docs/rocketmq.md, Body digest). Its message group comes back
both as ``message_group`` and as the user property ``__SHARDINGKEY``, as the proxy passes every property that is
not one of RocketMQ's own system properties through.

Normal, FIFO (a message group, stored in the queue the group hashes to), delayed (``delivery_timestamp``, kept
in ``TIMER_DELIVER_MS``) and transactional messages pass (``check_type`` says which; the servicer sends the
last two through ``broker_delivery``). Lite and priority messages are refused with UNSUPPORTED.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Final

from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import Code, DigestType, Encoding, MessageType, definition_pb2

from broker_adapter.core import message, selectors
from broker_adapter.core.model import DELAY, NORMAL, TRANSACTION, OutgoingMessage
from broker_adapter.core.selectors import Select
from broker_adapter.core.sqlfilter import FilterSyntaxError
from broker_adapter.rocketmq.status import RocketMQError, bad_request, unsupported

# Properties the broker fills from system properties; user properties may not use these names (the message
# group's property only when it names the message's own group: a received message sent on as it came).
SYSTEM_PROPERTIES: Final = frozenset(
    {
        message.PROPERTY_TAGS,
        message.PROPERTY_KEYS,
        message.PROPERTY_UNIQ_KEY,
        message.PROPERTY_MESSAGE_GROUP,
        message.PROPERTY_PRODUCER_ID,
        message.PROPERTY_SEQUENCE,
        message.PROPERTY_TIMER_DELIVER_MS,
        message.PROPERTY_REAL_TOPIC,
        message.PROPERTY_REAL_QUEUE_ID,
        message.PROPERTY_TRANSACTION_PREPARED,
        message.PROPERTY_ORIGIN,
        message.PROPERTY_BORN_HOST,
    }
)
# refused as user properties: the broker's own and RocketMQ's (message.ROCKETMQ_RESERVED_PROPERTIES)
_RESERVED_FOR_SENDS: Final = SYSTEM_PROPERTIES | message.ROCKETMQ_RESERVED_PROPERTIES
# RocketMQ's proxy limits (ProxyConfig userPropertyMaxNum, maxUserPropertySize, maxMessageGroupSize).
MAX_USER_PROPERTIES: Final = 128
MAX_USER_PROPERTY_BYTES: Final = 16 * 1024
MAX_MESSAGE_GROUP_BYTES: Final = 64
# Properties a consumer does not see among its message's user properties: what SystemProperties carry. The
# message group is in both, as RocketMQ's proxy passes __SHARDINGKEY through (it is no system property there).
_HIDDEN_PROPERTIES: Final = SYSTEM_PROPERTIES - {message.PROPERTY_MESSAGE_GROUP}
# A v1 message id of the official clients: "01" + MAC (6 bytes) + pid (2) + seconds (4) + sequence (4), in hex.
_MESSAGE_ID_V1: Final = re.compile(r"^01[0-9A-F]{32}$")

# Enum values as plain ints: reading them off the generated enum wrappers costs a Python call each time.
_GZIP: Final = int(Encoding.GZIP)
_PLAIN_ENCODINGS: Final = frozenset({int(Encoding.ENCODING_UNSPECIFIED), int(Encoding.IDENTITY)})
_IDENTITY: Final = int(Encoding.IDENTITY)
_MD5: Final = int(DigestType.MD5)
_NORMAL: Final = int(MessageType.NORMAL)
_FIFO: Final = int(MessageType.FIFO)
_DELAY: Final = int(MessageType.DELAY)
_TRANSACTION: Final = int(MessageType.TRANSACTION)
_SUPPORTED_TYPES: Final = frozenset(
    {int(MessageType.MESSAGE_TYPE_UNSPECIFIED), _NORMAL, _FIFO, _DELAY, _TRANSACTION}
)

_UNSUPPORTED_TYPES: Final = {
    MessageType.LITE: "lite topics",
    MessageType.PRIORITY: "priority messages",
}


def _ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def check_type(m: definition_pb2.Message) -> str:
    """How the broker stores a message (NORMAL, DELAY or TRANSACTION), by declared type or by the fields that
    imply it; refuses what it does not implement."""
    sp = m.system_properties
    what = _UNSUPPORTED_TYPES.get(sp.message_type)
    if what is None and sp.HasField("lite_topic"):
        what = _UNSUPPORTED_TYPES[MessageType.LITE]
    if what is None and sp.HasField("priority"):
        what = _UNSUPPORTED_TYPES[MessageType.PRIORITY]
    if what is not None:
        raise unsupported(what)
    if sp.message_type not in _SUPPORTED_TYPES:
        raise bad_request(f"unknown message type {sp.message_type}")
    if sp.message_type == _TRANSACTION:
        if sp.HasField("delivery_timestamp") or sp.HasField("message_group"):
            raise bad_request(
                "a transactional message cannot also be delayed or FIFO",
                Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            )
        return TRANSACTION
    if sp.HasField("delivery_timestamp") or sp.message_type == _DELAY:
        if not sp.HasField("delivery_timestamp"):
            raise bad_request("a DELAY message needs a delivery_timestamp", Code.ILLEGAL_DELIVERY_TIME)
        if sp.HasField("message_group"):
            raise bad_request(
                "a delayed message cannot also be FIFO", Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
            )
        return DELAY
    return NORMAL


def delivery_ms(m: definition_pb2.Message) -> int:
    """A delayed message's due time, ms since the epoch."""
    return _ms(m.system_properties.delivery_timestamp)


def producer_sequence(message_id: str) -> int | None:
    """The sequence number inside an official client's v1 message id (None for any other id)."""
    return int(message_id[-8:], 16) if _MESSAGE_ID_V1.match(message_id) else None


def outgoing(m: definition_pb2.Message, queue_id: int, client_id: str, max_body: int) -> OutgoingMessage:
    """The broker's message for a RocketMQ message (already checked to be of a supported type)."""
    sp = m.system_properties
    body = m.body
    encoding = sp.body_encoding
    if encoding == _GZIP:
        body = _gunzip(body, max_body)
    elif encoding not in _PLAIN_ENCODINGS:
        raise bad_request(f"unknown body encoding {encoding}")
    if not body:
        raise bad_request("message body is empty", Code.MESSAGE_BODY_EMPTY)
    if len(body) > max_body:
        raise bad_request(
            f"message body is {len(body)} bytes; this broker takes at most {max_body}",
            Code.MESSAGE_BODY_TOO_LARGE,
        )
    msg_id = sp.message_id
    if not msg_id:
        raise bad_request("message has no message_id", Code.ILLEGAL_MESSAGE_ID)
    if _reserved(msg_id):
        raise bad_request("message_id contains a reserved character", Code.ILLEGAL_MESSAGE_ID)
    props: dict[str, str] = {}
    user = m.user_properties
    if len(user) > MAX_USER_PROPERTIES:
        raise bad_request(
            f"message has {len(user)} user properties; at most {MAX_USER_PROPERTIES}",
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
        )
    size = 0
    for k, v in user.items() if user else ():
        size += len(k.encode()) + len(v.encode())
        if k == message.PROPERTY_MESSAGE_GROUP and sp.HasField("message_group") and v == sp.message_group:
            continue  # what a consumer received, sent on with its properties: the group says it already
        if not k or k in _RESERVED_FOR_SENDS or _reserved(k) or _reserved(v):
            raise bad_request(
                f"user property {k!r} is empty, reserved by RocketMQ or contains \\x01/\\x02",
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
            )
        props[k] = v
    if size > MAX_USER_PROPERTY_BYTES:
        raise bad_request(
            f"message user properties are {size} bytes; at most {MAX_USER_PROPERTY_BYTES}",
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
        )
    tags = ""
    if sp.HasField("tag"):
        tags = sp.tag
        if not tags.strip() or "|" in tags or _reserved(tags):
            raise bad_request(f"tag {tags!r} is blank or contains '|'", Code.ILLEGAL_MESSAGE_TAG)
    keys = list(sp.keys)
    for k in keys:
        if not k.strip() or message.KEY_SEPARATOR in k or _reserved(k):
            raise bad_request(f"key {k!r} is blank or contains a space", Code.ILLEGAL_MESSAGE_KEY)
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group.strip() or _reserved(group):
            raise bad_request(f"message group {group!r} is blank", Code.ILLEGAL_MESSAGE_GROUP)
        if len(group.encode()) > MAX_MESSAGE_GROUP_BYTES:
            raise bad_request(
                f"message group is {len(group.encode())} bytes; at most {MAX_MESSAGE_GROUP_BYTES}",
                Code.ILLEGAL_MESSAGE_GROUP,
            )
        props[message.PROPERTY_MESSAGE_GROUP] = group
    if sp.born_host:
        if _reserved(sp.born_host):
            raise bad_request("born_host contains a reserved character")
        props[message.PROPERTY_BORN_HOST] = sp.born_host  # as RocketMQ's proxy keeps it
    out = OutgoingMessage(
        queue_id=queue_id,
        body=body,
        tags=tags,
        keys=keys,
        msg_id=msg_id,
        properties=props,
        born_timestamp=_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
    )
    seq = producer_sequence(msg_id)
    if seq is not None and client_id and not _reserved(client_id):
        out.producer_id = client_id
        out.sequence = seq
    return out


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body inflated to at most ``limit`` bytes: a small body that inflates past it (a gzip bomb) is
    refused before it is held in memory whole."""
    out: list[bytes] = []
    size = 0
    data = body
    try:
        while data:  # one gzip member after another, as gzip.decompress reads them
            d = zlib.decompressobj(wbits=31)
            chunk = d.decompress(data, limit + 1 - size)
            size += len(chunk)
            out.append(chunk)
            if size > limit or d.unconsumed_tail:
                raise bad_request(
                    f"message body inflates past {limit} bytes; this broker takes at most {limit}",
                    Code.MESSAGE_BODY_TOO_LARGE,
                )
            if not d.eof:
                raise bad_request("message body is not valid gzip: truncated", Code.MESSAGE_CORRUPTED)
            data = d.unused_data
    except zlib.error as err:
        raise bad_request(f"message body is not valid gzip: {err}", Code.MESSAGE_CORRUPTED) from None
    return b"".join(out)


def body_digest(body: bytes) -> str:
    """A received body's digest as RocketMQ's proxy sends it and every official client checks it: MD5 in 32
    upper-case hex digits (``DigestType.MD5``)."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def _reserved(text: str) -> bool:
    return message.NAME_VALUE_SEPARATOR in text or message.PROPERTY_SEPARATOR in text


def message_id_of(m: message.Message) -> str:
    """The client message id (UNIQ_KEY), or one derived from the CommitLog offset for a message without."""
    return m.msg_id or f"00{m.physical_offset:032X}"


def incoming(
    m: message.Message,
    *,
    receipt_handle: str | None = None,
    attempt: int | None = None,
    invisible_ms: int | None = None,
    out: definition_pb2.Message | None = None,
) -> definition_pb2.Message:
    """The RocketMQ message a consumer receives for a stored message (with its receipt handle when popped),
    filled into ``out`` when given (an empty message inside a response: no copy afterwards)."""
    props = m.properties
    if out is None:
        out = definition_pb2.Message(body=m.body)
    else:
        out.body = m.body
    out.topic.name = m.topic
    user = {k: v for k, v in props.items() if k not in _HIDDEN_PROPERTIES}
    if user:
        out.user_properties.update(user)
    sp = out.system_properties
    if m.tags:
        sp.tag = m.tags
    sp.keys.extend(m.keys)
    sp.message_id = message_id_of(m)
    digest = sp.body_digest
    digest.type = _MD5
    digest.checksum = body_digest(m.body)
    sp.body_encoding = _IDENTITY
    group = props.get(message.PROPERTY_MESSAGE_GROUP)
    due = props.get(message.PROPERTY_TIMER_DELIVER_MS)
    sp.message_type = _FIFO if group else _DELAY if due else _NORMAL
    if group:
        sp.message_group = group
    if due and due.isdigit():
        sp.delivery_timestamp.seconds, sp.delivery_timestamp.nanos = (
            int(due) // 1000,
            (int(due) % 1000) * 1_000_000,
        )
    born, stored = m.born_timestamp, m.store_timestamp
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = born // 1000, (born % 1000) * 1_000_000
    sp.born_host = props.get(message.PROPERTY_BORN_HOST) or m.born_host[0]
    sp.store_timestamp.seconds, sp.store_timestamp.nanos = stored // 1000, (stored % 1000) * 1_000_000
    sp.store_host = f"{m.store_host[0]}:{m.store_host[1]}"
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if attempt is not None:
        sp.delivery_attempt = attempt
    if invisible_ms is not None:
        sp.invisible_duration.seconds = invisible_ms // 1000
        sp.invisible_duration.nanos = (invisible_ms % 1000) * 1_000_000
    return out


def check_filter(expression: definition_pb2.FilterExpression) -> Select:
    """What a subscription's filter selects: a TAG filter (``*`` or empty: every message) or a SQL92 expression
    over the message's properties and TAGS (``broker_adapter.core.sqlfilter``). ILLEGAL_FILTER_EXPRESSION, naming
    the position, for one that does not parse."""
    from rocketmq.grpc_protocol import FilterType

    text = expression.expression.strip()
    if expression.type == FilterType.SQL:
        try:
            return selectors.by_sql(text)
        except FilterSyntaxError as e:
            raise bad_request(str(e), Code.ILLEGAL_FILTER_EXPRESSION) from None
    if expression.type not in (FilterType.FILTER_TYPE_UNSPECIFIED, FilterType.TAG):
        raise bad_request(f"unknown filter type {expression.type}", Code.ILLEGAL_FILTER_EXPRESSION)
    if not text or text == "*":
        return selectors.everything
    tags = frozenset(t.strip() for t in text.split("||"))
    if "" in tags:
        raise bad_request(f"tag filter {text!r} has an empty tag", Code.ILLEGAL_FILTER_EXPRESSION)
    return selectors.by_tags(tags)


def check_subscriptions(settings: definition_pb2.Settings) -> None:
    """A consumer's settings name its subscriptions: a bad filter is refused at the settings exchange, before
    any receive (as RocketMQ's proxy checks a subscription's SQL92 expression when a consumer registers)."""
    if settings.HasField("subscription"):
        for entry in settings.subscription.subscriptions:
            try:
                check_filter(entry.expression)
            except RocketMQError as e:
                raise RocketMQError(e.code, f"subscription to {entry.topic.name!r}: {e.message}") from None


__all__ = [
    "RocketMQError",
    "body_digest",
    "check_filter",
    "check_subscriptions",
    "check_type",
    "incoming",
    "outgoing",
]
