"""Pulled messages on the consumer side, and the decoder of a pull at batch granularity.

A ``Pull`` that asks for ``raw`` is answered with the messages as the CommitLog stores them, concatenated
(``PullResponse.raw``, ``raw_count`` of them): the server converts nothing, and the consumer turns the bytes
into ``PulledMessage`` objects here (the message layout is ``broker_adapter.core.message``'s; each message starts with
its TOTALSIZE). Decoding is the consumer's per-message cost, so it does the least it can: one header unpack, the
body, the topic, and a tuple per message; the properties stay bytes until a consumer asks for tags, keys, msg_id
or properties (and are parsed again at each such ask: consumers read them once, if at all).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from broker_adapter.core import message
from broker_adapter.core.formats import property_bytes
from dledger.errors import DLedgerError

# TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, BORNTIMESTAMP, STORETIMESTAMP, then BODYLEN at 84
_HEAD: Final = struct.Struct(">ii4xi4xqq4xq8xq20xi")
_OVERHEAD: Final = message.OVERHEAD
_MAGIC: Final = message.MAGIC_CODE
_NV: Final = message.NAME_VALUE_SEPARATOR
_SEP: Final = message.PROPERTY_SEPARATOR
_KEY_SEP: Final = message.KEY_SEPARATOR
_TAGS: Final = (message.PROPERTY_TAGS + _NV).encode()
_KEYS: Final = (message.PROPERTY_KEYS + _NV).encode()
_UNIQ: Final = (message.PROPERTY_UNIQ_KEY + _NV).encode()
_FIELDS: Final = (
    "topic",
    "queue_id",
    "queue_offset",
    "commitlog_offset",
    "body",
    "tags",
    "keys",
    "msg_id",
    "properties",
    "born_timestamp",
    "store_timestamp",
)
_new_tuple = tuple.__new__


class PulledMessage(tuple):
    """One pulled message: ``topic, queue_id, queue_offset, commitlog_offset, body, tags, keys, msg_id,
    properties, born_timestamp, store_timestamp``, immutable, equal when those are.

    A tuple underneath (built in one call by ``decode``: a pull of 1,024 messages builds 1,024 of them) holding
    the stored properties as bytes; tags, keys, msg_id and properties are read from them when asked. Built
    directly (``PulledMessage(topic, ..., msg_id, properties, ...)``) it holds the values given.
    """

    __slots__ = ()

    def __new__(
        cls,
        topic: str,
        queue_id: int,
        queue_offset: int,
        commitlog_offset: int,
        body: bytes,
        tags: str | None,
        keys: Sequence[str],
        msg_id: str,
        properties: Mapping[str, str] | None = None,
        born_timestamp: int = 0,
        store_timestamp: int = 0,
    ) -> PulledMessage:
        given = (tags, tuple(keys), msg_id, dict(properties or {}))
        return _new_tuple(
            cls,
            (topic, queue_id, queue_offset, commitlog_offset, body, born_timestamp, store_timestamp, given),
        )

    topic: str = property(itemgetter(0))  # type: ignore[assignment]
    queue_id: int = property(itemgetter(1))  # type: ignore[assignment]
    queue_offset: int = property(itemgetter(2))  # type: ignore[assignment]
    commitlog_offset: int = property(itemgetter(3))  # type: ignore[assignment]
    body: bytes = property(itemgetter(4))  # type: ignore[assignment]
    born_timestamp: int = property(itemgetter(5))  # type: ignore[assignment]
    store_timestamp: int = property(itemgetter(6))  # type: ignore[assignment]

    @property
    def tags(self) -> str | None:
        meta = self[7]
        if type(meta) is tuple:
            return meta[0]
        return _value(meta, _TAGS) or None

    @property
    def keys(self) -> tuple[str, ...]:
        meta = self[7]
        if type(meta) is tuple:
            return meta[1]
        keys = _value(meta, _KEYS)
        return tuple(keys.split(_KEY_SEP)) if keys else ()

    @property
    def msg_id(self) -> str:
        meta = self[7]
        if type(meta) is tuple:
            return meta[2]
        return _value(meta, _UNIQ) or ""

    @property
    def properties(self) -> dict[str, str]:
        meta = self[7]
        if type(meta) is tuple:
            return meta[3]
        return _properties(meta)

    def _public(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._public() == other._public()  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def _unordered(self, other: object) -> bool:
        return NotImplemented

    __lt__ = __le__ = __gt__ = __ge__ = (
        _unordered  # messages have no order (a tuple's would compare internals)
    )

    def __hash__(self) -> int:  # equal messages have equal first five fields
        return hash(self[:5])

    def __repr__(self) -> str:
        return (
            "PulledMessage("
            + ", ".join(f"{n}={v!r}" for n, v in zip(_FIELDS, self._public(), strict=True))
            + ")"
        )

    def __reduce__(self):
        return (_rebuilt, (tuple(self),))

    def __getnewargs__(self):  # pragma: no cover - __reduce__ takes precedence; kept for copy protocols
        return (tuple(self),)


def _rebuilt(items: tuple) -> PulledMessage:
    return _new_tuple(PulledMessage, items)


def _value(raw: bytes, key: bytes) -> str | None:
    """The value of the property named by ``key`` (``name\\x01``) in stored properties, the others undecoded."""
    value = property_bytes(raw, key)
    try:
        return value.decode() if value is not None else None
    except UnicodeDecodeError as e:
        raise DLedgerError(f"a pulled message's properties are malformed: {e}") from None


def _properties(raw: bytes) -> dict[str, str]:
    props: dict[str, str] = {}
    try:
        for item in raw.decode().split(_SEP):
            if item:
                name, sep, value = item.partition(_NV)
                if not sep:
                    raise message.MessageFormatError(f"property {name!r} has no value separator")
                props[name] = value
    except (UnicodeDecodeError, message.MessageFormatError) as e:
        raise DLedgerError(f"a pulled message's properties are malformed: {e}") from None
    return props


def decode(data: bytes, count: int) -> list[PulledMessage]:
    """The ``count`` messages of a raw pull (``PullResponse.raw``), in queue-offset order. Bytes that do not
    hold exactly ``count`` messages (each one's sizes, magic code and topic checked) raise ``DLedgerError``;
    malformed properties raise it when they are read."""
    out: list[PulledMessage] = []
    append = out.append
    unpack = _HEAD.unpack_from
    cls = PulledMessage
    n = len(data)
    off = 0
    topics: dict[bytes, str] = {}
    try:
        while off < n:
            total, magic, qid, qoff, phys, born, stored, body_len = unpack(data, off)
            end = off + total
            p = off + 88 + body_len
            if magic != _MAGIC or total < _OVERHEAD or end > n or body_len < 0 or p + 3 > end:
                raise message.MessageFormatError(f"no message starts at byte {off} of {n}")
            tl = data[p]
            t = p + 1 + tl
            raw_topic = data[p + 1 : t]
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = raw_topic.decode()
            if t + 2 + (data[t] << 8 | data[t + 1]) != end:
                raise message.MessageFormatError(f"the message at byte {off} does not end at its TOTALSIZE")
            append(
                _new_tuple(cls, (topic, qid, qoff, phys, data[off + 88 : p], born, stored, data[t + 2 : end]))
            )
            off = end
    except (struct.error, IndexError, UnicodeDecodeError, message.MessageFormatError) as e:
        raise DLedgerError(f"a raw pull response is malformed: {e}") from None
    if len(out) != count:
        raise DLedgerError(f"a raw pull response holds {len(out)} messages, not the {count} it announces")
    return out
