"""Transactional (half) messages: the replicated table of transactions not yet ended.

A RocketMQ 5 producer sends a transactional message, runs its local transaction and then commits or rolls it
back (EndTransaction). Until then the message is stored in the system topic ``HALF_TOPIC`` (one queue), where
no consumer reads it; dispatching it adds it here, by its offset there (which is also the transaction id the
producer gets back). A commit makes the leader append a copy to the real topic naming the half offset
(``message.PROPERTY_ORIGIN`` = ``half/<offset>``), and dispatching that copy ends the entry; a rollback is a
``Settle`` command. A producer that never ends its transaction is asked (RecoverOrphanedTransactionCommand on
its Telemetry stream) once the message is ``immunity_ms`` old, then every ``CHECK_INTERVAL_MS``, at most
``MAX_CHECKS`` times: each check is a ``TxCheck`` command counted before it is sent, so the limit holds across
failovers; past it the transaction is dropped as a rollback (RocketMQ discards it too).

``ended`` remembers how the last ``ENDED_WINDOW`` transactions ended, so a producer retrying its EndTransaction
after a failover gets the same answer instead of an error.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

HALF_TOPIC: Final = "%SYS%HALF"
DEFAULT_IMMUNITY_MS: Final = 6_000  # RocketMQ's transactionTimeOut: no check for a younger half message
CHECK_INTERVAL_MS: Final = 6_000
MAX_CHECKS: Final = 15  # RocketMQ's transactionCheckMax
ENDED_WINDOW: Final = 4096
COMMIT: Final = "commit"
ROLLBACK: Final = "rollback"


@dataclass(frozen=True, slots=True)
class Half:
    offset: int  # in HALF_TOPIC's queue 0: the transaction id
    stored_ms: int
    topic: str
    queue_id: int
    producer_group: str
    msg_id: str
    checks: int = 0
    next_check_ms: int = 0  # the first check: stored_ms + immunity


class HalfMessages:
    def __init__(self) -> None:
        self.open: dict[int, Half] = {}
        self.ended: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self.open)

    def add(self, h: Half) -> None:
        self.open[h.offset] = h

    def end(self, offset: int, how: str) -> Half | None:
        h = self.open.pop(offset, None)
        if h is not None:
            self.ended[offset] = how
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
        for off, stored, topic, qid, pgroup, msg_id, checks, nxt in d.get("open", []):
            t.open[int(off)] = Half(
                int(off), int(stored), str(topic), int(qid), str(pgroup), str(msg_id), int(checks), int(nxt)
            )
        for off, how in d.get("ended", []):
            t.ended[int(off)] = str(how)
        return t
