"""Pulled messages on the consumer side, and the decoder of a pull at batch granularity.

A ``Pull`` that asks for ``raw`` is answered with the messages as the CommitLog stores them, concatenated
(``PullResponse.raw``, ``raw_count`` of them): the server converts nothing, and the consumer turns the bytes
into ``PulledMessage`` objects here, in one pass that reads only the fields a consumer sees (the message
layout is ``broker_adapter.message``'s; each message starts with its TOTALSIZE).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from broker_adapter import message
from dledger.errors import DLedgerError

# TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, BORNTIMESTAMP, STORETIMESTAMP, then BODYLEN at 84
_HEAD: Final = struct.Struct(">ii4xi4xqq4xq8xq20xi")
_OVERHEAD: Final = message.OVERHEAD
_MAGIC: Final = message.MAGIC_CODE
_NV: Final = message.NAME_VALUE_SEPARATOR
_SEP: Final = message.PROPERTY_SEPARATOR
_TAGS: Final = message.PROPERTY_TAGS
_KEYS: Final = message.PROPERTY_KEYS
_UNIQ: Final = message.PROPERTY_UNIQ_KEY
_KEY_SEP: Final = message.KEY_SEPARATOR


@dataclass(frozen=True, slots=True)
class PulledMessage:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    msg_id: str
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    store_timestamp: int = 0


def decode(data: bytes, count: int) -> list[PulledMessage]:
    """The ``count`` messages of a raw pull (``PullResponse.raw``), in queue-offset order. Bytes that do not
    hold exactly ``count`` well-formed messages raise ``DLedgerError``."""
    out: list[PulledMessage] = []
    append = out.append
    unpack = _HEAD.unpack_from
    n = len(data)
    off = 0
    topics: dict[bytes, str] = {}
    try:
        while off < n:
            total, magic, qid, qoff, phys, born, stored, body_len = unpack(data, off)
            end = off + total
            if magic != _MAGIC or total < _OVERHEAD or end > n or body_len < 0:
                raise message.MessageFormatError(f"no message starts at byte {off} of {n}")
            p = off + 88
            body = data[p : p + body_len]
            p += body_len
            tl = data[p]
            raw_topic = data[p + 1 : p + 1 + tl]
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = raw_topic.decode()
            p += 1 + tl
            pl = int.from_bytes(data[p : p + 2], "big")
            p += 2
            if p + pl != end:
                raise message.MessageFormatError(f"the message at byte {off} does not end at its TOTALSIZE")
            props: dict[str, str] = {}
            if pl:
                for item in data[p:end].decode().split(_SEP):
                    if item:
                        name, sep, value = item.partition(_NV)
                        if not sep:
                            raise message.MessageFormatError(f"property {name!r} has no value separator")
                        props[name] = value
            keys = props.get(_KEYS)
            append(
                PulledMessage(
                    topic,
                    qid,
                    qoff,
                    phys,
                    body,
                    props.get(_TAGS) or None,
                    tuple(keys.split(_KEY_SEP)) if keys else (),
                    props.get(_UNIQ, ""),
                    props,
                    born,
                    stored,
                )
            )
            off = end
    except (struct.error, IndexError, UnicodeDecodeError, message.MessageFormatError) as e:
        raise DLedgerError(f"a raw pull response is malformed: {e}") from None
    if len(out) != count:
        raise DLedgerError(f"a raw pull response holds {len(out)} messages, not the {count} it announces")
    return out
