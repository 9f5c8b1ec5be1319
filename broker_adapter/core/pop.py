"""Consumption by pop (RocketMQ 5's receive / ack / change invisible duration) as plain broker operations.

The leader picks the deliverable offsets of a queue (expired in-flight ones, then new ones), proposes a ``Pop``
command stamped with its clock, and returns what the applied command granted. Acks and invisible-time changes
are ``Ack`` / ``ChangeInvisible`` commands naming a delivery epoch. The replicated state they change is
``broker_adapter.core.invisibility`` inside the dispatcher; receipt handles and protocol statuses belong to
the RocketMQ face.

The group's settings (``broker_adapter.core.groups``) shape a pop: a FIFO group's pop names each offset's message
group, and a message that used up the group's delivery attempts is copied to the group's dead-letter topic
(``delivery.DeadLetters``) before anything else of that queue is popped. Acks and invisible-time changes
wake receives waiting on the queue, since they can make a FIFO message group's next message deliverable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from broker_adapter.core import commands, message
from broker_adapter.core.clock import now_ms
from broker_adapter.core.invisibility import Handled, Outcome, Popped, PopStates
from broker_adapter.core.model import check_user_topic
from broker_adapter.core.selectors import Select  # does a consumer's filter take this message?
from dledger.errors import DLedgerError, NotFoundError

if TYPE_CHECKING:
    from broker_adapter.core.delivery import DeadLetters
    from broker_adapter.core.group_commit import GroupCommit
    from broker_adapter.core.leadership import Leadership
    from broker_adapter.core.reader import QueueReader
    from broker_adapter.core.statemachine import BrokerStateMachine
    from broker_adapter.core.topic_registry import TopicRegistry

# A receive that found every queue busy or drained looks again at least this often.
BUSY_RECHECK_S: Final = 0.2
# Offsets deleted by retention that one Pop command passes over (a group far behind skips them in few commands).
PASS_OVER: Final = 4096


class Pops:
    def __init__(
        self,
        sm: BrokerStateMachine,
        leadership: Leadership,
        topics: TopicRegistry,
        reader: QueueReader,
        proposer: GroupCommit,
        dead_letters: DeadLetters,
    ):
        self._sm = sm
        self._leadership = leadership
        self._topics = topics
        self._reader = reader
        self._proposer = proposer
        self._dead_letters = dead_letters
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
        renew: str = "",
    ) -> tuple[int, Popped, dict[int, message.Message]] | None:
        """Pop from queue ``first``, or from the topic's other queues when it has nothing to deliver, as
        RocketMQ's broker pops a topic for a receive (queue id -1): a client that picked a drained queue does not
        long-poll while other queues hold messages. Queues another receive of the group is popping are skipped;
        with nothing anywhere, wait for a dispatch to any queue or an invisible time running out, for ``poll_ms``
        and not past ``deadline`` (loop time). ``renew``: the client id of an auto-renewed receive (``commands.Pop``).
        Returns (queue id, what was granted, the granted messages by offset), or None."""
        check_user_topic(topic)
        await self._leadership.leader_state()
        sm = self._sm
        loop = asyncio.get_running_loop()
        until = min(loop.time() + poll_ms / 1000, deadline)
        n = self._topics.queues(topic)
        order = [(first + i) % n for i in range(n)]
        while True:
            for q in order:
                key = (group, topic, q)
                lock = self._locks.setdefault(key, asyncio.Lock())
                if lock.locked():
                    continue
                async with lock:
                    got = await self._pop(key, select, batch, invisible_ms, renew)
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
            await self._reader.wait_dispatch(topic, order, wake)

    async def _pop(
        self, key: tuple[str, str, int], select: Select, batch: int, invisible_ms: int, renew: str = ""
    ) -> tuple[Popped, dict[int, message.Message]] | None:
        """Pop what a queue can deliver now (one Pop command through the log, which also passes over messages
        the filter or the log no longer has), or None. Batches that were all filtered out are passed over at
        once; offsets an earlier pop took but has not applied yet are left for the caller's next look."""
        sm = self._sm
        read = self._reader.read
        group, topic, qid = key
        while True:
            now = now_ms()
            settings = sm.group_settings(group)
            q = sm.pops.view(key, sm.offsets.get(key, 0))
            if await self._pass_over_deleted(key, q.next, now, invisible_ms):
                continue
            for o, f in q.exhausted(now, settings.max_attempts):
                await self._dead(key, o, f.epoch, f.attempt)
            offsets = q.deliverable(now, sm.next_offset(topic, qid), batch, settings.max_attempts)
            if not offsets:
                return None
            held = {o: m for o in offsets if (m := read(topic, qid, o)) is not None}
            taken = {o: m for o, m in held.items() if select(m)}
            take = tuple(taken)
            skip = tuple(o for o in offsets if o not in taken)  # filtered out, or gone from the log
            mgroups: tuple[tuple[int, str], ...] = ()
            if settings.fifo:
                mgroups = tuple(
                    (o, g)
                    for o, m in taken.items()
                    if (g := m.properties.get(message.PROPERTY_MESSAGE_GROUP))
                )
            pop = commands.Pop(group, topic, qid, now, invisible_ms, take, skip, mgroups, renew)
            (popped,) = await self._proposer.submit([pop])
            if isinstance(popped, BaseException):
                raise popped if isinstance(popped, DLedgerError) else NotFoundError(str(popped))
            if popped.deliveries:
                return popped, {d.offset: taken[d.offset] for d in popped.deliveries}  # granted of ``take``
            if take:  # taken by an earlier pop still in the log tail
                return None

    async def _pass_over_deleted(
        self, key: tuple[str, str, int], next_offset: int, now: int, invisible_ms: int
    ) -> bool:
        """Retention deleted offsets the group never received (docs/broker.md, "Retention"): pass over up to
        ``PASS_OVER`` of them in one Pop command, instead of a receive batch at a time. True when it moved on."""
        group, topic, qid = key
        held = self._reader.first_held(topic, qid)
        if next_offset >= held:
            return False
        gone = tuple(range(next_offset, min(held, next_offset + PASS_OVER)))
        (r,) = await self._proposer.submit([commands.Pop(group, topic, qid, now, invisible_ms, (), gone)])
        if isinstance(r, BaseException):
            raise r if isinstance(r, DLedgerError) else NotFoundError(str(r))
        sm = self._sm
        return sm.pops.view(key, sm.offsets.get(key, 0)).next > next_offset  # no progress: the usual path

    async def _dead(self, key: tuple[str, str, int], offset: int, epoch: int, attempt: int) -> None:
        """Copy a message that used up its attempts to the group's dead-letter topic (ends it in the pop state)."""
        group, topic, qid = key
        m = self._reader.read(topic, qid, offset)
        if m is None:  # the log no longer holds it: nothing to copy, the group is done with it
            await self._proposer.submit([commands.Ack(group, topic, qid, offset, epoch)])
            return
        await self._dead_letters.forward(group, topic, qid, offset, epoch, attempt, m)

    async def revive(self, now: int) -> int:
        """Move every message that used up its group's attempts to the dead-letter topic (queues a receive is
        popping are left to it); returns how many were moved."""
        sm = self._sm
        moved = 0
        for key in [k for k, q in sm.pops.queues.items() if q.inflight]:
            lock = self._locks.setdefault(key, asyncio.Lock())
            if lock.locked():
                continue
            async with lock:
                q = sm.pops.get(key)
                if q is None:
                    continue
                for o, f in q.exhausted(now, sm.group_settings(key[0]).max_attempts):
                    await self._dead(key, o, f.epoch, f.attempt)
                    moved += 1
        return moved

    async def forward_dead(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> Outcome:
        """A consumer's own verdict (ForwardMessageToDeadLetterQueue): copy this delivery to the dead-letter
        topic now. The ``Outcome`` of the receipt handle (DONE when the copy ended it)."""
        await self._leadership.leader_state()
        key = (group, topic, queue_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            q = self._sm.pops.get(key)
            outcome = PopStates._owner(q, offset, epoch)
            if outcome is not Outcome.DONE:
                return outcome
            assert q is not None  # DONE: the queue holds this delivery
            m = self._reader.read(topic, queue_id, offset)
            if m is None:
                raise NotFoundError(
                    f"{topic}/{queue_id} offset {offset}: the log no longer holds the message"
                )
            done = await self._dead_letters.forward(
                group, topic, queue_id, offset, epoch, q.inflight[offset].attempt, m
            )
        return Outcome.DONE if done else Outcome.REDELIVERED

    def _wake(self, topic: str, queue_ids: Sequence[int]) -> None:
        for q in set(queue_ids):
            self._reader.wake(topic, q)

    async def ack(
        self, group: str, topic: str, deliveries: Sequence[tuple[int, int, int]]
    ) -> list[Handled | BaseException]:
        """Acknowledge deliveries (queue id, offset, epoch) of a group: one ``Handled`` (or error) each."""
        await self._leadership.leader_state()
        out = await self._proposer.submit([commands.Ack(group, topic, q, o, e) for q, o, e in deliveries])
        self._wake(topic, [q for q, _, _ in deliveries])
        return out

    async def change_invisible(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        epoch: int,
        invisible_ms: int,
        renew: bool = False,
    ) -> Handled | BaseException:
        """Make a delivery invisible for ``invisible_ms`` from now: its ``Handled`` (or error). ``renew``: the
        leader renewing an auto-renewed delivery (it stays one), not a client's own change."""
        await self._leadership.leader_state()
        cmd = commands.ChangeInvisible(group, topic, queue_id, offset, epoch, now_ms(), invisible_ms, renew)
        changed: list[Handled | BaseException] = await self._proposer.submit([cmd])
        self._wake(topic, [queue_id])
        return changed[0]
