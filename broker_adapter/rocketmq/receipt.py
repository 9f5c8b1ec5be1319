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

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from broker_adapter.rocketmq.sealed import pack_names, seal, unpack_names, unseal

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
        names = pack_names((self.group, self.topic), ReceiptHandleError, "group and topic")
        return seal(PREFIX, _FIXED.pack(self.queue_id, self.offset, self.epoch, self.deadline_ms) + names)

    def encoder(self) -> Callable[[int, int], str]:
        """``encode`` for many deliveries of one pop (same group, topic, queue and deadline): a function of
        (offset, epoch) that packs only those, the rest once. The same text as ``encode``."""
        names = pack_names((self.group, self.topic), ReceiptHandleError, "group and topic")
        tail = _DEADLINE.pack(self.deadline_ms) + names
        head = _HEAD.pack
        qid = self.queue_id

        def encode(offset: int, epoch: int) -> str:
            return seal(PREFIX, head(qid, offset, epoch) + tail)

        return encode

    @staticmethod
    def decode(text: str) -> ReceiptHandle:
        body = unseal(PREFIX, text, MAX_LENGTH, _FIXED.size + 2, ReceiptHandleError, "receipt handle")
        queue_id, offset, epoch, deadline = _FIXED.unpack_from(body, 0)
        try:
            group, topic = unpack_names(body, _FIXED.size, 2, ReceiptHandleError, "group and topic")
        except ReceiptHandleError as e:
            raise ReceiptHandleError(f"receipt handle {e}") from None
        if min(queue_id, offset, epoch) < 0:
            raise ReceiptHandleError("receipt handle fields are out of range")
        return ReceiptHandle(group, topic, queue_id, offset, epoch, deadline)
