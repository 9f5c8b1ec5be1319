"""Consumption by pop (RocketMQ 5's receive / ack / change invisible duration) as plain broker operations.

The leader picks the deliverable offsets of a queue (expired in-flight ones, then new ones), proposes a ``Pop``
command stamped with its clock, and returns what the applied command granted. Acks and invisible-time changes
are ``Ack`` / ``ChangeInvisible`` commands naming a delivery epoch. The replicated state they change is
``broker_adapter.rocketmq.invisibility`` inside the dispatcher; receipt handles and protocol statuses belong to
the RocketMQ face.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from broker_adapter import commands, message
from broker_adapter.rocketmq.invisibility import Popped
from broker_adapter.selectors import Select  # does a consumer's filter take this message?
from dledger.errors import DLedgerError, NotFoundError

if TYPE_CHECKING:
    from broker_adapter.broker import Broker

# A receive that found every queue busy or drained looks again at least this often.
BUSY_RECHECK_S: Final = 0.2
# Offsets deleted by retention that one Pop command passes over (a group far behind skips them in few commands).
PASS_OVER: Final = 4096


def now_ms() -> int:
    """The leader's clock for invisible time (stamped into commands; nodes never read their own)."""
    return int(time.time() * 1000)


class Pops:
    def __init__(self, broker: Broker):
        self._broker = broker
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}

    async def receive(
        self,
        group: str,
        topic: str,
        first: int,
        select: Select,
        batch: int,
        invisible_ms: int,
        poll_ms: int,
        deadline: float,
    ) -> tuple[int, Popped, dict[int, message.Message]] | None:
        """Pop from queue ``first``, or from the topic's other queues when it has nothing to deliver, as
        RocketMQ's broker pops a topic for a receive (queue id -1): a client that picked a drained queue does not
        long-poll while other queues hold messages. Queues another receive of the group is popping are skipped;
        with nothing anywhere, wait for a dispatch to any queue or an invisible time running out, for ``poll_ms``
        and not past ``deadline`` (loop time). Returns (queue id, what was granted, the granted messages by offset), or None."""
        b = self._broker
        await b.leader_state()
        sm = b.sm
        loop = asyncio.get_running_loop()
        until = min(loop.time() + poll_ms / 1000, deadline)
        n = b.queues(topic)
        order = [(first + i) % n for i in range(n)]
        while True:
            for q in order:
                key = (group, topic, q)
                lock = self._locks.setdefault(key, asyncio.Lock())
                if lock.locked():
                    continue
                async with lock:
                    got = await self._pop(key, select, batch, invisible_ms)
                if got:
                    return (q, *got)
            if loop.time() >= until:
                return None
            now = now_ms()
            wake = min(until, loop.time() + BUSY_RECHECK_S)
            for q in order:
                key = (group, topic, q)
                pq = sm.pops.view(key, sm.offsets.get(key, 0))
                if pq.deliverable(now, sm.next_offset(topic, q), 1):
                    # more to look at (messages filtered out by tag, or a pop not applied yet): soon again
                    wake = min(wake, loop.time() + 0.01)
                nd = pq.next_deadline()
                if nd is not None:
                    wake = min(wake, loop.time() + max(0, nd - now) / 1000 + 0.001)
            await b.wait_dispatch(topic, order, wake)

    async def _pop(
        self, key: tuple[str, str, int], select: Select, batch: int, invisible_ms: int
    ) -> tuple[Popped, dict[int, message.Message]] | None:
        """Pop what a queue can deliver now (one Pop command through the log, which also passes over messages
        the filter or the log no longer has), or None. Batches that were all filtered out are passed over at
        once; offsets an earlier pop took but has not applied yet are left for the caller's next look."""
        b = self._broker
        sm = b.sm
        group, topic, qid = key
        while True:
            now = now_ms()
            q = sm.pops.view(key, sm.offsets.get(key, 0))
            if await self._pass_over_deleted(key, q.next, now, invisible_ms):
                continue
            offsets = q.deliverable(now, sm.next_offset(topic, qid), batch)
            if not offsets:
                return None
            msgs = {o: b.read(topic, qid, o) for o in offsets}
            take = tuple(o for o in offsets if msgs[o] is not None and select(msgs[o]))
            skip = tuple(o for o in offsets if o not in take)  # filtered out, or gone from the log
            (popped,) = await b.submit([commands.Pop(group, topic, qid, now, invisible_ms, take, skip)])
            if isinstance(popped, BaseException):
                raise popped if isinstance(popped, DLedgerError) else NotFoundError(str(popped))
            if popped.deliveries:
                return popped, {d.offset: msgs[d.offset] for d in popped.deliveries}
            if take:  # taken by an earlier pop still in the log tail
                return None

    async def _pass_over_deleted(
        self, key: tuple[str, str, int], next_offset: int, now: int, invisible_ms: int
    ) -> bool:
        """Retention deleted offsets the group never received (docs/broker.md, "Retention"): pass over up to
        ``PASS_OVER`` of them in one Pop command, instead of a receive batch at a time. True when it moved on."""
        group, topic, qid = key
        held = self._broker.first_held(topic, qid)
        if next_offset >= held:
            return False
        gone = tuple(range(next_offset, min(held, next_offset + PASS_OVER)))
        (r,) = await self._broker.submit([commands.Pop(group, topic, qid, now, invisible_ms, (), gone)])
        if isinstance(r, BaseException):
            raise r if isinstance(r, DLedgerError) else NotFoundError(str(r))
        sm = self._broker.sm
        return sm.pops.view(key, sm.offsets.get(key, 0)).next > next_offset  # no progress: the usual path

    async def ack(self, group: str, topic: str, deliveries: Sequence[tuple[int, int, int]]) -> list[Any]:
        """Acknowledge deliveries (queue id, offset, epoch) of a group: one ``Handled`` (or error) each."""
        await self._broker.leader_state()
        return await self._broker.submit([commands.Ack(group, topic, q, o, e) for q, o, e in deliveries])

    async def change_invisible(
        self, group: str, topic: str, queue_id: int, offset: int, epoch: int, invisible_ms: int
    ) -> Any:
        """Make a delivery invisible for ``invisible_ms`` from now: its ``Handled`` (or error)."""
        await self._broker.leader_state()
        (r,) = await self._broker.submit(
            [commands.ChangeInvisible(group, topic, queue_id, offset, epoch, now_ms(), invisible_ms)]
        )
        return r
