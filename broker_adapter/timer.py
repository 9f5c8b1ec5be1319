"""Delay / timer messages: the replicated index of messages waiting for their delivery time.

A message sent with a delivery time (RocketMQ 5's ``delivery_timestamp``, or the ``TIMER_DELIVER_MS`` property
of our own Producer) is stored in the system topic ``TIMER_TOPIC`` (one queue), not in its topic, so no consumer
of any kind (pop, pull, our ``Consumer``) sees it early. Dispatching it adds it here, keyed by its offset in
that queue. When it is due, the leader appends a copy to the real topic naming the timer offset
(``message.PROPERTY_ORIGIN`` = ``timer/<offset>``); dispatching that copy removes the entry. The entry, its
removal and the copy are all in the log, so every node holds the same index and a new leader takes over exactly
what is still waiting: a message due during a failover is copied by whichever leader finds it still here, once
(the leader's read barrier means it has applied every copy its log holds before it looks;
docs/decisions/0018-delivery-state-in-the-log.md).

A timer message the log no longer holds (it cannot be copied) ends with a ``Settle`` command.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Final

TIMER_TOPIC: Final = "%SYS%TIMER"
DEFAULT_MAX_DELAY_MS: Final = 86_400_000  # RocketMQ's proxy: a delivery time at most 1 day ahead


@dataclass(frozen=True, slots=True)
class Waiting:
    offset: int  # in TIMER_TOPIC's queue 0
    due_ms: int
    topic: str  # the real topic and queue
    queue_id: int


class TimerIndex:
    def __init__(self) -> None:
        self.entries: dict[int, Waiting] = {}
        self._heap: list[tuple[int, int]] = []  # (due, offset): a cache of ``entries``' order, lazily cleaned

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, w: Waiting) -> None:
        self.entries[w.offset] = w
        heapq.heappush(self._heap, (w.due_ms, w.offset))

    def remove(self, offset: int) -> Waiting | None:
        return self.entries.pop(offset, None)

    def due(self, now_ms: int, limit: int) -> list[Waiting]:
        """Up to ``limit`` entries due at ``now_ms``, earliest first."""
        out: list[Waiting] = []
        h = self._heap
        skipped: list[tuple[int, int]] = []
        while h and h[0][0] <= now_ms and len(out) < limit:
            due, off = heapq.heappop(h)
            w = self.entries.get(off)
            if w is None or w.due_ms != due:
                continue  # removed since
            out.append(w)
            skipped.append((due, off))
        for item in skipped:
            heapq.heappush(h, item)
        return out

    def next_due(self) -> int | None:
        h = self._heap
        while h and (h[0][1] not in self.entries or self.entries[h[0][1]].due_ms != h[0][0]):
            heapq.heappop(h)
        return h[0][0] if h else None

    def to_json(self) -> list[Any]:
        return [[w.offset, w.due_ms, w.topic, w.queue_id] for _, w in sorted(self.entries.items())]

    @classmethod
    def from_json(cls, rows: list[Any]) -> TimerIndex:
        t = cls()
        for off, due, topic, qid in rows:
            t.add(Waiting(int(off), int(due), str(topic), int(qid)))
        return t
