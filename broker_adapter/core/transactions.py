"""Transactional (half) messages: the replicated table of transactions not yet ended.

A RocketMQ 5 producer sends a transactional message, runs its local transaction and then commits or rolls it
back (EndTransaction). Until then the message is stored in the system topic ``HALF_TOPIC`` (one queue), where
no consumer reads it; dispatching it adds it here, by its offset there. Its transaction id is its message id (the
client's unique key, as RocketMQ sets a send receipt's transaction id), so ``by_id`` finds the open entries of a
transaction id; it is derived from ``open`` and never stored. A commit makes the leader append a copy to the real
topic naming the half offset (``message.PROPERTY_ORIGIN`` = ``half/<offset>``), and dispatching that copy ends
the entry; a rollback is a ``Settle`` command.

Two half messages with one message id are a producer's send stored twice (a retry the idempotent-producer window
did not catch). Both stay open under that id; an EndTransaction ends the newer (as RocketMQ's proxy takes the
newest transaction data of an id), and the older is checked back like any orphan, so the producer's checker
ends it too (a commit then delivers the message twice: at least once, as the duplicate send did). A producer that never ends its transaction is asked (RecoverOrphanedTransactionCommand on
its Telemetry stream) once the message is ``immunity_ms`` old, then every ``CHECK_INTERVAL_MS``, at most
``MAX_CHECKS`` times: each check is a ``TxCheck`` command counted before it is sent, so the limit holds across
failovers; past it the transaction is dropped as a rollback (RocketMQ discards it too).

``ended`` remembers how the last ``ENDED_WINDOW`` transactions ended, by transaction id, so a producer retrying its
EndTransaction after a failover gets the same answer instead of an error. (Snapshots from before transaction ids
were message ids key it by half offset: those load as the offset's digits, the id such a producer holds.)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

DEFAULT_IMMUNITY_MS: Final = 6_000  # RocketMQ's transactionTimeOut: no check for a younger half message
CHECK_INTERVAL_MS: Final = 6_000
MAX_CHECKS: Final = 15  # RocketMQ's transactionCheckMax
ENDED_WINDOW: Final = 4096
COMMIT: Final = "commit"
ROLLBACK: Final = "rollback"


@dataclass(frozen=True, slots=True)
class Half:
    offset: int  # in HALF_TOPIC's queue 0
    stored_ms: int
    topic: str
    queue_id: int
    producer_group: str
    msg_id: str
    checks: int = 0
    next_check_ms: int = 0  # the first check: stored_ms + immunity

    @property
    def transaction_id(self) -> str:
        """The message id; the half offset's digits for a message without one (none of the official clients')."""
        return self.msg_id or str(self.offset)


class HalfMessages:
    def __init__(self) -> None:
        self.open: dict[int, Half] = {}
        # transaction id -> its open offsets, oldest first (derived from ``open``)
        self.by_id: dict[str, list[int]] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # transaction id -> COMMIT / ROLLBACK

    def __len__(self) -> int:
        return len(self.open)

    def add(self, h: Half) -> None:
        self.open[h.offset] = h
        self.by_id.setdefault(h.transaction_id, []).append(h.offset)  # dispatched in offset order

    def find(self, transaction_id: str) -> Half | None:
        """The newest open half message of ``transaction_id``."""
        offsets = self.by_id.get(transaction_id)
        return self.open[offsets[-1]] if offsets else None

    def end(self, offset: int, how: str) -> Half | None:
        h = self.open.pop(offset, None)
        if h is not None:
            tid = h.transaction_id
            offsets = self.by_id[tid]
            offsets.remove(offset)
            if not offsets:
                del self.by_id[tid]
            self.ended.pop(tid, None)  # the window's order is the order of ends
            self.ended[tid] = how
            while len(self.ended) > ENDED_WINDOW:
                self.ended.popitem(last=False)
        return h

    def checked(self, offset: int, now_ms: int) -> Half | None:
        """Count a check-back at ``now_ms``; past ``MAX_CHECKS`` the transaction ends as a rollback (None)."""
        h = self.open.get(offset)
        if h is None:
            return None
        if h.checks >= MAX_CHECKS:
            self.end(offset, ROLLBACK)
            return None
        h = self.open[offset] = replace(h, checks=h.checks + 1, next_check_ms=now_ms + CHECK_INTERVAL_MS)
        return h

    def to_check(self, now_ms: int, limit: int) -> list[Half]:
        return sorted((h for h in self.open.values() if h.next_check_ms <= now_ms), key=lambda h: h.offset)[
            :limit
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "open": [
                [
                    h.offset,
                    h.stored_ms,
                    h.topic,
                    h.queue_id,
                    h.producer_group,
                    h.msg_id,
                    h.checks,
                    h.next_check_ms,
                ]
                for _, h in sorted(self.open.items())
            ],
            "ended": [[o, how] for o, how in self.ended.items()],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HalfMessages:
        t = cls()
        for off, stored, topic, qid, pgroup, msg_id, checks, nxt in sorted(d.get("open", [])):
            t.add(
                Half(
                    int(off),
                    int(stored),
                    str(topic),
                    int(qid),
                    str(pgroup),
                    str(msg_id),
                    int(checks),
                    int(nxt),
                )
            )
        for tid, how in d.get("ended", []):
            t.ended[str(tid)] = str(how)  # an old snapshot's half offset: its digits
        return t
