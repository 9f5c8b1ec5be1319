"""What this node's queues hold, read from its dispatched state and its log: a message at a queue offset, the
first offset the log still holds, and waiting until a message is dispatched to a queue (long polls)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from broker_adapter.core import retention
from broker_adapter.core.commitlog import CommitLog, CommitLogError
from broker_adapter.core.formats import Message
from broker_adapter.core.model import OffsetRangeError
from broker_adapter.core.statemachine import BrokerStateMachine
from dledger.plugins import NodeHandle


class QueueReader:
    def __init__(self, node: NodeHandle, sm: BrokerStateMachine, commitlog: CommitLog):
        self._node = node
        self._sm = sm
        self._commitlog = commitlog
        # (topic, queue id) -> the long polls waiting for it: one future per poll, however many queues it watches
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}
        # (topic, queue id) -> (the log's first index, the first offset held then): ``first_held``
        self._first_held: dict[tuple[str, int], tuple[int, int]] = {}

    def wake(self, topic: str, queue_id: int) -> None:
        """Wake the reads long-polling this queue (a dispatch, or an ack in a FIFO message group, may have made a
        message deliverable)."""
        polls = self._waiters.pop((topic, queue_id), None)
        if polls is not None:
            for f in polls:
                if not f.done():
                    f.set_result(None)

    async def wait_dispatch(
        self, topic: str, queue_ids: Sequence[int], until: float, offset: int | None = None
    ) -> None:
        """Until a message is dispatched to one of the queues or ``until`` (loop time). With ``offset`` (one
        queue): until the queue reaches past it."""
        loop = asyncio.get_running_loop()
        if offset is not None:
            (qid,) = queue_ids
            while self._sm.next_offset(topic, qid) <= offset and loop.time() < until:
                await self._woken(topic, queue_ids, until)
            return
        if until > loop.time():
            await self._woken(topic, queue_ids, until)

    async def _woken(self, topic: str, queue_ids: Sequence[int], until: float) -> None:
        """Wait for a ``wake`` of one of the queues or for ``until``: one future and one timer, not a task per
        queue (a receive long-polls every queue of its topic)."""
        loop = asyncio.get_running_loop()
        poll: asyncio.Future[None] = loop.create_future()
        keys = [(topic, q) for q in queue_ids]
        for key in keys:
            self._waiters.setdefault(key, set()).add(poll)
        timer = loop.call_at(until, _settle, poll)
        try:
            await poll
        finally:
            timer.cancel()
            for key in keys:  # a wake took its queue's list; the other queues still hold this poll
                polls = self._waiters.get(key)
                if polls is not None:
                    polls.discard(poll)
                    if not polls:
                        del self._waiters[key]

    def first_held(self, topic: str, queue_id: int) -> int:
        """The first queue offset whose message this node's log holds (0 until retention or a snapshot
        compacted the log; docs/broker.md, "Retention"); remembered until the log's start moves."""
        store = self._node.log_store
        key = (topic, queue_id)
        first = store.first_index
        hit = self._first_held.get(key)
        if hit is not None and hit[0] == first:
            return hit[1]
        if first <= 0:
            held = 0
        else:
            cq = self._sm.queue(topic, queue_id)
            held = retention.first_held(
                cq, self._sm.next_offset(topic, queue_id), store.snapshot_point().end_pos
            )
        if len(self._first_held) > 65_536:
            self._first_held.clear()
        self._first_held[key] = (first, held)
        return held

    def read(self, topic: str, queue_id: int, offset: int) -> Message | None:
        """The committed message at a queue offset, or None when this node's log no longer holds it."""
        if offset < 0:
            raise OffsetRangeError(f"{topic}/{queue_id}: queue offset {offset} is negative")
        units = self._sm.queue(topic, queue_id).read(offset, 1)
        if not units or units[0].size == 0:
            return None
        u = units[0]
        try:
            return self._commitlog.read_message(u.commitlog_offset, u.size, self._sm.applied_index)
        except CommitLogError:
            return None


def _settle(poll: asyncio.Future[None]) -> None:
    if not poll.done():
        poll.set_result(None)
