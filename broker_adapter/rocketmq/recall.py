"""Recall handles: what a RocketMQ 5 producer hands back (RecallMessage) to cancel a delayed message before it is
due. A send receipt carries one for each delayed message, as RocketMQ 5.3 does; a normal message gets none.

A handle names the message where the broker group holds it: (group, topic, offset in the timer topic, due time,
message id). The broker acts on the replicated timer index (``broker_adapter.timer``), not on the handle: the
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

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass
from typing import Final

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
        names = [x.encode() for x in (self.group, self.topic, self.msg_id)]
        if any(len(n) > 255 for n in names):
            raise RecallHandleError("group, topic and message id must be at most 255 bytes each")
        body = _FIXED.pack(self.offset, self.due_ms) + b"".join(bytes([len(n)]) + n for n in names)
        raw = body + zlib.crc32(body).to_bytes(4, "big")
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str) -> RecallHandle:
        if not isinstance(text, str) or not text.startswith(PREFIX) or len(text) > MAX_LENGTH:
            raise RecallHandleError(f"not a recall handle of this broker: {text[:40]!r}")
        b64 = text[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        except (binascii.Error, ValueError) as err:
            raise RecallHandleError(f"recall handle is not base64url: {err}") from None
        if len(raw) < _FIXED.size + 3 + 4:
            raise RecallHandleError(f"recall handle is too short ({len(raw)} bytes)")
        body, crc = raw[:-4], int.from_bytes(raw[-4:], "big")
        if zlib.crc32(body) != crc:
            raise RecallHandleError("recall handle checksum does not match: it was altered or truncated")
        offset, due = _FIXED.unpack_from(body, 0)
        at = _FIXED.size
        names: list[str] = []
        try:
            for _ in range(3):
                n = body[at]
                names.append(body[at + 1 : at + 1 + n].decode())
                at += 1 + n
        except (IndexError, UnicodeDecodeError) as err:
            raise RecallHandleError(f"recall handle names no group, topic and message id: {err}") from None
        if at != len(body) or offset < 0 or not names[2]:
            raise RecallHandleError("recall handle fields are out of range")
        return RecallHandle(names[0], names[1], offset, due, names[2])
