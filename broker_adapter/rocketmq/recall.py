"""Recall handles: what a RocketMQ 5 producer hands back (RecallMessage) to cancel a delayed message before it is
due. A send receipt carries one for each delayed message, as RocketMQ 5.3 does; a normal message gets none.

A handle names the message where the broker group holds it: (group, topic, offset in the timer topic, due time,
message id). The broker acts on the replicated timer index (``broker_adapter.core.timer``), not on the handle: the
offset finds the waiting entry, and the message id must be the one stored there.

Wire form: ``"r1" + base64url(payload)`` without padding, where the payload is::

    offset     8   big-endian, in the timer topic's queue 0
    due        8   ms since the epoch
    group      1 + n   length-prefixed UTF-8 (the broker group that issued it)
    topic      1 + n
    message id 1 + n
    crc32      4   of everything before it: a mangled or made-up handle is refused, not misread

Handles are opaque to clients (RocketMQ's are too), and stable across failovers: any node of the group decodes
them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from broker_adapter.rocketmq.sealed import pack_names, seal, unpack_names, unseal

PREFIX: Final = "r1"
_FIXED: Final = struct.Struct(">qq")
MAX_LENGTH: Final = 1024


class RecallHandleError(ValueError):
    """Not a recall handle this broker issued (malformed, truncated or altered)."""


@dataclass(frozen=True, slots=True)
class RecallHandle:
    group: str
    topic: str
    offset: int
    due_ms: int
    msg_id: str

    def encode(self) -> str:
        names = pack_names(
            (self.group, self.topic, self.msg_id), RecallHandleError, "group, topic and message id"
        )
        return seal(PREFIX, _FIXED.pack(self.offset, self.due_ms) + names)

    @staticmethod
    def decode(text: str) -> RecallHandle:
        body = unseal(PREFIX, text, MAX_LENGTH, _FIXED.size + 3, RecallHandleError, "recall handle")
        offset, due = _FIXED.unpack_from(body, 0)
        what = "group, topic and message id"
        try:
            group, topic, msg_id = unpack_names(body, _FIXED.size, 3, RecallHandleError, what)
        except RecallHandleError as e:
            raise RecallHandleError(f"recall handle {e}") from None
        if offset < 0 or not msg_id:
            raise RecallHandleError("recall handle fields are out of range")
        return RecallHandle(group, topic, offset, due, msg_id)
