"""Receipt handles: what a RocketMQ 5 consumer hands back to acknowledge a message or change its invisible time.

A handle names one delivery of one message to one group: (group, topic, queue, queue offset, epoch). The epoch
is the per-queue delivery counter of the replicated pop state (``invisibility``), so a handle of a delivery that
was superseded (the message was delivered again after its invisible time ran out, or its invisible time was
changed, which issues a new handle) is recognised. The deadline is informational (the state holds the truth).

Wire form: ``"v1" + base64url(payload)`` without padding, where the payload is::

    queue_id   4   big-endian
    offset     8
    epoch      8
    deadline   8   ms since the epoch
    group      1 + n   length-prefixed UTF-8
    topic      1 + n
    crc32      4   of everything before it: a mangled or made-up handle is refused, not misread

Handles are opaque to clients (RocketMQ's are too), and stable across failovers: any node decodes them.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

PREFIX: Final = "v1"
_FIXED: Final = struct.Struct(">iqqq")
_HEAD: Final = struct.Struct(">iqq")  # queue_id, offset, epoch: what differs between one pop's handles
_DEADLINE: Final = struct.Struct(">q")
MAX_LENGTH: Final = 1024


class ReceiptHandleError(ValueError):
    """Not a receipt handle this broker issued (malformed, truncated or altered)."""


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    group: str
    topic: str
    queue_id: int
    offset: int
    epoch: int
    deadline_ms: int

    def encode(self) -> str:
        group, topic = self.group.encode(), self.topic.encode()
        if len(group) > 255 or len(topic) > 255:
            raise ReceiptHandleError("group and topic must be at most 255 bytes each")
        body = b"".join(
            (
                _FIXED.pack(self.queue_id, self.offset, self.epoch, self.deadline_ms),
                bytes([len(group)]),
                group,
                bytes([len(topic)]),
                topic,
            )
        )
        raw = body + zlib.crc32(body).to_bytes(4, "big")
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def encoder(self) -> Callable[[int, int], str]:
        """``encode`` for many deliveries of one pop (same group, topic, queue and deadline): a function of
        (offset, epoch) that packs only those, the rest once. The same text as ``encode``."""
        group, topic = self.group.encode(), self.topic.encode()
        if len(group) > 255 or len(topic) > 255:
            raise ReceiptHandleError("group and topic must be at most 255 bytes each")
        tail = b"".join(
            (_DEADLINE.pack(self.deadline_ms), bytes([len(group)]), group, bytes([len(topic)]), topic)
        )
        head = _HEAD.pack
        qid = self.queue_id
        crc32, b64 = zlib.crc32, base64.urlsafe_b64encode

        def encode(offset: int, epoch: int) -> str:
            body = head(qid, offset, epoch) + tail
            return PREFIX + b64(body + crc32(body).to_bytes(4, "big")).decode().rstrip("=")

        return encode

    @staticmethod
    def decode(text: str) -> ReceiptHandle:
        if not isinstance(text, str) or not text.startswith(PREFIX) or len(text) > MAX_LENGTH:
            raise ReceiptHandleError(f"not a receipt handle of this broker: {text[:40]!r}")
        b64 = text[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        except (binascii.Error, ValueError) as err:
            raise ReceiptHandleError(f"receipt handle is not base64url: {err}") from None
        if len(raw) < _FIXED.size + 2 + 4:
            raise ReceiptHandleError(f"receipt handle is too short ({len(raw)} bytes)")
        body, crc = raw[:-4], int.from_bytes(raw[-4:], "big")
        if zlib.crc32(body) != crc:
            raise ReceiptHandleError("receipt handle checksum does not match: it was altered or truncated")
        queue_id, offset, epoch, deadline = _FIXED.unpack_from(body, 0)
        at = _FIXED.size
        try:
            n = body[at]
            group = body[at + 1 : at + 1 + n].decode()
            at += 1 + n
            n = body[at]
            topic = body[at + 1 : at + 1 + n].decode()
            at += 1 + n
        except (IndexError, UnicodeDecodeError) as err:
            raise ReceiptHandleError(f"receipt handle names no group and topic: {err}") from None
        if at != len(body) or min(queue_id, offset, epoch) < 0:
            raise ReceiptHandleError("receipt handle fields are out of range")
        return ReceiptHandle(group, topic, queue_id, offset, epoch, deadline)
