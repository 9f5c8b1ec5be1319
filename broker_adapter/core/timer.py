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

A timer message the log no longer holds (it cannot be copied) ends with a ``Settle`` command. A producer's
RecallMessage ends one before it is due with a ``Recall`` command (the leader proposes it only while the entry
is still here, between two of its delivery ticks, so a recalled message is never copied); ``recalled``
remembers the last ``RECALLED_WINDOW`` recalls (offset -> message id), so a retried recall answers the same.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_MAX_DELAY_MS: Final = 86_400_000  # RocketMQ's proxy: a delivery time at most 1 day ahead
RECALLED_WINDOW: Final = 4096


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
        self.recalled: OrderedDict[int, str] = OrderedDict()  # offset -> message id of the last recalls

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, w: Waiting) -> None:
        self.entries[w.offset] = w
        heapq.heappush(self._heap, (w.due_ms, w.offset))

    def remove(self, offset: int) -> Waiting | None:
        return self.entries.pop(offset, None)

    def recall(self, offset: int, msg_id: str) -> Waiting | None:
        """Cancel a waiting message (None if it is not waiting: delivered, settled or recalled before)."""
        w = self.entries.pop(offset, None)
        if w is not None:
            self.recalled[offset] = msg_id
            while len(self.recalled) > RECALLED_WINDOW:
                self.recalled.popitem(last=False)
        return w

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

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting": [[w.offset, w.due_ms, w.topic, w.queue_id] for _, w in sorted(self.entries.items())],
            "recalled": [[off, mid] for off, mid in self.recalled.items()],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any] | list[Any]) -> TimerIndex:
        """From ``to_json``, or a snapshot's list of waiting rows from before recalls."""
        t = cls()
        rows = d if isinstance(d, list) else d.get("waiting", [])
        for off, due, topic, qid in rows:
            t.add(Waiting(int(off), int(due), str(topic), int(qid)))
        for off, mid in [] if isinstance(d, list) else d.get("recalled", []):
            t.recalled[int(off)] = str(mid)
        return t
