"""Leader-side queue-offset allocation: the QUEUEOFFSET each new message carries, dense per (topic, queue).

The next offset of a queue on the leader is what the dispatcher has dispatched plus the messages already in the
log but not yet dispatched (the uncommitted or unapplied tail). Rather than tracking leadership changes by hand,
the allocator is self-healing: it remembers the last index (and term) it allocated for; when ``prepare`` is
called for any other index (a new leader always appends a no-op first, so this happens at every leadership
change, and after a proposal that failed before reaching the log) it rebuilds its view by scanning the log from
the dispatcher's applied point. Offsets carried by tail entries were chosen by earlier leaders and will commit
in log order, so continuing after them keeps every queue dense and identical on every node.

The same scan records the idempotent-producer identities in the tail, so the leader can tell a retried send
whose first attempt is still on its way to being applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from broker_adapter.core import commands, message
from broker_adapter.core.clock import now_ms
from broker_adapter.core.statemachine import BrokerStateMachine, Dispatched
from storage.codec import HEADER_SIZE

# (index, body) of the log's normal entries in [lo, hi]
ReadEntries = Callable[[int, int], Iterable[tuple[int, bytes | memoryview]]]
PENDING_SLACK: Final = 4096  # tail sends remembered past the last pruning before applied ones are forgotten


class QueueOffsetAllocator:
    def __init__(
        self,
        dispatcher: BrokerStateMachine,
        read_entries: ReadEntries,
        applied_index: Callable[[], int],
    ):
        self._sm = dispatcher
        self._read = read_entries
        self._applied = applied_index
        self._next: dict[tuple[str, int], int] = {}  # queues with messages in the tail
        self._pending: dict[tuple[str, int], int] = {}  # (producer, seq) -> tail index
        self._kept = 0  # len(_pending) after the last pruning
        self._last_index = -2  # nothing allocated yet: the first prepare rebuilds
        self._term = -1
        self.rebuilds = 0

    # -- allocation ----------------------------------------------------------------------------------------
    def next_offset(self, topic: str, queue_id: int) -> int:
        n = self._next.get((topic, queue_id))
        return n if n is not None else self._sm.next_offset(topic, queue_id)

    def prepare_entry(
        self, term: int, index: int, pos: int, body: bytes, route: message.Route | None = None
    ) -> tuple[bytes, Dispatched | None]:
        """The core's ``prepare`` for a broker entry placed at (index, pos) in ``term``: a message gets its
        QUEUEOFFSET, PHYSICALOFFSET (= pos + 48) and STORETIMESTAMP (now), a command passes unchanged; and where
        a message will be dispatched (None for a command): known as soon as the entry is placed, so a send can
        be answered at commit. ``route``: the message's ``peek_route``, when the caller that encoded or checked
        it already knows it (the send path), so the bytes need not be parsed again, here nor when this node
        dispatches the entry (``BrokerStateMachine.placed``)."""
        if index != self._last_index + 1 or term != self._term:
            self.rebuild(term, index - 1)
        self._last_index = index
        if not commands.is_message(body):
            self._placed_command(body)
            return body, None
        r = route if route is not None else message.peek_route(body)
        topic, queue_id = key = r.topic, r.queue_id
        q = self._next.get(key)
        if q is None:
            q = self._sm.next_offset(topic, queue_id)
        physical = pos + HEADER_SIZE
        size = len(body)
        buf = bytearray(body)
        message.patch_placement(buf, q, physical, now_ms())
        self._sm.placed[index] = (
            term,
            message.Route(topic, queue_id, q, physical, size, r.tags, r.producer, r.origin, r.uniq, r.keys),
        )
        self._next[key] = q + 1
        if r.producer is not None:
            self._pending[r.producer] = index
            if len(self._pending) > 2 * self._kept + PENDING_SLACK:
                self._prune()
        return bytes(buf), Dispatched(topic, queue_id, q, physical, size)

    def _prune(self) -> None:
        """Forget the sends the dispatcher has applied (its producer table answers for them): otherwise a
        leader would keep one entry per idempotent message it ever placed (10 million: over 1 GiB)."""
        applied = self._applied()
        self._pending = {k: i for k, i in self._pending.items() if i > applied}
        self._kept = len(self._pending)

    def rebuild(self, term: int, upto: int) -> None:
        """Recompute the tail's view from the log entries after the applied point up to ``upto``."""
        self.rebuilds += 1
        self._sm.placed.clear()  # routes of entries that may never commit (a failed proposal, an older term)
        self._next.clear()
        self._pending.clear()
        self._kept = 0
        applied = self._applied()
        for index, body in self._read(applied + 1, upto):
            if commands.is_message(body):
                r = message.peek_route(body)
                self._next[(r.topic, r.queue_id)] = r.queue_offset + 1
                if r.producer is not None:
                    self._pending[r.producer] = index
            else:
                self._placed_command(body)
        self._last_index = upto
        self._term = term

    def _placed_command(self, body: bytes | memoryview) -> None:
        """A topic's deletion in the tail: its queues start again at offset 0 after it, whatever the
        dispatcher (which has not applied it yet) says."""
        if not commands.is_command(body) or body[8] != commands.OP_DELETE_TOPIC:
            return
        try:
            cmd = commands.decode(body)
        except commands.CommandError:
            return
        assert isinstance(cmd, commands.DeleteTopic)
        queues = max([self._sm.topics.get(cmd.topic, 0), *(q + 1 for t, q in self._next if t == cmd.topic)])
        for q in range(queues):
            self._next[(cmd.topic, q)] = 0

    def ensure_term(self, term: int, upto: int) -> None:
        """Make the view current for a leader of ``term`` whose log ends at ``upto`` (before any prepare)."""
        if term != self._term:
            self.rebuild(term, upto)

    # -- idempotent producers ------------------------------------------------------------------------------
    def find_send(self, producer_id: str, seq: int) -> Dispatched | int | bool:
        """Where (producer, seq) already is: its ``Dispatched`` result once applied, the tail index while it
        waits to be applied, True when applied but older than the remembered window, False when not in the log."""
        index = self._pending.get((producer_id, seq))
        if index is not None:
            if index > self._applied():
                return index
            del self._pending[(producer_id, seq)]
        return self._sm.sent(producer_id, seq)
