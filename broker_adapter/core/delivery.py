"""The leader's side of delivery state: delayed, transactional and dead-letter messages (docs/rocketmq.md, Delivery).

What is decided here is only *when* to act; what happens is replicated. A delayed message is stored in the timer
topic and a transactional one in the half topic (``timer``, ``transactions``); when one is due or committed, and
when a consumer group's message ran out of attempts, the leader appends a copy to the real (or dead-letter) topic
that names its origin, and the dispatcher ends the origin when it applies the copy. The leader then waits until
its own state machine has applied everything it appended before it looks again, so it never copies one origin
twice; a new leader starts from its read barrier (everything its log holds is applied), so it takes over exactly
what is still open (docs/decisions/0018-delivery-state-in-the-log.md).

One task per leadership (``run``) ticks every ``TICK_S``: due timer messages are copied (within about a tick and
a commit of their due time), and open transactions past their check time are counted (``TxCheck``) and handed to
``on_tx_check`` on every node as the count is applied (the RocketMQ face sends RecoverOrphanedTransactionCommand
on the Telemetry streams of that topic's producers connected to the node).
Every ``REVIVE_MS`` it also moves messages that used up their delivery attempts to their dead-letter topics
(``Pops.revive``), so that happens without a consumer polling the queue (RocketMQ's revive service does too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final

from broker_adapter.core import commands, message
from broker_adapter.core.clock import now_ms
from broker_adapter.core.model import (
    Outgoing,
    OutgoingMessage,
    SendResult,
    UnknownQueueError,
    check_group,
    check_user_topic,
)
from broker_adapter.core.timer import Waiting
from broker_adapter.core.topics import HALF_TOPIC, RETRY_PREFIX, TIMER_TOPIC, dlq_topic, retry_topic
from broker_adapter.core.transactions import COMMIT, ROLLBACK, Half
from dledger.core.messages import Role
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError

if TYPE_CHECKING:
    from broker_adapter.core.group_commit import GroupCommit
    from broker_adapter.core.leadership import Leadership
    from broker_adapter.core.reader import QueueReader
    from broker_adapter.core.send import Sender
    from broker_adapter.core.statemachine import BrokerStateMachine
    from broker_adapter.core.topic_registry import TopicRegistry
    from dledger.plugins import NodeHandle

log = logging.getLogger(__name__)

TICK_S: Final = 0.05
REVIVE_MS: Final = 1_000
STALE_CHECK_MS: Final = 10_000  # a check-back applied this long after the leader counted it is not sent  # how often the leader looks for messages that used up their attempts, unasked
BATCH: Final = 256  # copies per tick
# Properties of a stored timer / half message that its copy does not carry (the send path sets the ones it owns).
_NOT_COPIED: Final = frozenset(
    {
        message.PROPERTY_REAL_TOPIC,
        message.PROPERTY_REAL_QUEUE_ID,
        message.PROPERTY_TRANSACTION_PREPARED,
        message.PROPERTY_PRODUCER_GROUP,
        message.PROPERTY_CHECK_IMMUNITY_S,
        message.PROPERTY_PRODUCER_ID,
        message.PROPERTY_SEQUENCE,
        message.PROPERTY_UNIQ_KEY,
        message.PROPERTY_TAGS,
        message.PROPERTY_KEYS,
        message.PROPERTY_ORIGIN,
    }
)


class IllegalDeliveryTimeError(InvalidRequestError):
    """A delivery time further ahead than the broker's maximum delay."""


class TransactionError(NotFoundError):
    """EndTransaction names no open transaction (never sent, or ended the other way)."""


class RecallError(NotFoundError):
    """A recall names a delayed message that no longer waits (delivered at its time, or gone)."""


def copy_of(
    m: message.Message, queue_id: int, origin: str, extra: dict[str, str] | None = None
) -> OutgoingMessage:
    """The broker's copy of a stored message, naming what it ends."""
    props = {k: v for k, v in m.properties.items() if k not in _NOT_COPIED}
    props.update(extra or {})
    props[message.PROPERTY_ORIGIN] = origin
    return OutgoingMessage(
        queue_id=queue_id,
        body=m.body,
        tags=m.tags or "",
        keys=m.keys,
        msg_id=m.msg_id or "",
        properties=props,
        born_timestamp=m.born_timestamp,
    )


class Delivery:
    def __init__(
        self,
        node: NodeHandle,
        sm: BrokerStateMachine,
        leadership: Leadership,
        topics: TopicRegistry,
        reader: QueueReader,
        proposer: GroupCommit,
        sender: Sender,
        revive: Callable[[int], Awaitable[int]],
        max_delay_ms: int,
    ):
        self._node = node  # is it still the leader of the loop's term
        self._sm = sm
        self._leadership = leadership
        self._topics = topics
        self._reader = reader
        self._proposer = proposer
        self._sender = sender
        self._revive = revive  # ``Pops.revive``: moves what used up its attempts to the dead-letter topics
        self._task: asyncio.Task[None] | None = None
        self._term = -1
        self._next_revive = 0
        self._tick_lock = asyncio.Lock()
        self._tx_locks: dict[str, asyncio.Lock] = {}  # per transaction id: a retried end waits for the first
        self.on_tx_check: Callable[[Half, message.Message], None] | None = None
        self.max_delay_ms = max_delay_ms

    # -- leadership ----------------------------------------------------------------------------------------
    def role_changed(self, role: Role, term: int) -> None:
        if role is Role.LEADER and term != self._term:
            self.start(term)

    def ensure_running(self, term: int) -> None:
        """Start the loop for ``term`` unless it runs (a role change seen before the event loop ran)."""
        if self._term != term or self._task is None or self._task.done():
            self.start(term)

    def start(self, term: int) -> None:
        """Run the leader's loop for ``term`` (called from the event loop; a no-op without one)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._term = term
        self._task = loop.create_task(self.run(term), name="broker-delivery")

    async def run(self, term: int) -> None:
        while self._node.is_leader() and self._node.term == term:
            try:
                await self._leadership.leader_state()
                await self.tick()
                await asyncio.sleep(TICK_S)
            except asyncio.CancelledError:
                raise
            except DLedgerError as e:
                log.info("%s: delivery tick: %s", self._node.id, e)
                await asyncio.sleep(TICK_S * 4)
            except Exception:  # a bug must not stop delayed delivery for the rest of the term
                log.exception("%s: delivery tick failed", self._node.id)
                await asyncio.sleep(1.0)

    async def tick(self) -> None:
        """One look at what is due (serialized: two looks at once could copy one origin twice)."""
        async with self._tick_lock:
            await self._tick()

    async def _tick(self) -> None:
        sm = self._sm
        now = now_ms()
        due = sm.timer.due(now, BATCH)
        if due:
            await self._release(due)
        checks = sm.halves.to_check(now, BATCH)
        if checks:
            await self._check(checks, now)
        if now >= self._next_revive:
            self._next_revive = now + REVIVE_MS
            await self._revive(now)

    # -- timer ---------------------------------------------------------------------------------------------
    def check_delivery_time(self, due_ms: int, now: int | None = None) -> None:
        now = now_ms() if now is None else now
        if due_ms - now > self.max_delay_ms:
            raise IllegalDeliveryTimeError(
                f"delivery time {due_ms} is {due_ms - now} ms ahead; this broker delays a message at most "
                f"{self.max_delay_ms} ms (max_delay_ms)"
            )

    async def send_timed(
        self, topic: str, msgs: Sequence[Outgoing], due_ms: Sequence[int]
    ) -> list[SendResult]:
        """Store messages to be delivered to ``topic`` at their due times (in the timer topic until then)."""
        return await self._sender.send(TIMER_TOPIC, await self.timed(topic, msgs, due_ms), system=True)

    async def timed(
        self, topic: str, msgs: Sequence[Outgoing], due_ms: Sequence[int]
    ) -> list[OutgoingMessage]:
        """The timer topic's messages for ``send_timed`` (checked: delivery times, queues)."""
        check_user_topic(topic)
        await self._leadership.leader_state()
        n = await self._topics.ensure_topic(topic)
        now = now_ms()
        held = []
        for m, due in zip(msgs, due_ms, strict=True):
            self.check_delivery_time(due, now)
            if not 0 <= m.queue_id < n:
                raise UnknownQueueError(f"unknown queue {topic}/{m.queue_id} (queues 0..{n - 1})")
            props = dict(m.properties)
            props[message.PROPERTY_TIMER_DELIVER_MS] = str(due)
            props[message.PROPERTY_REAL_TOPIC] = topic
            props[message.PROPERTY_REAL_QUEUE_ID] = str(m.queue_id)
            held.append(_with(m, 0, props))
        return held

    async def _release(self, due: list[Waiting]) -> None:
        by_topic: dict[str, list[OutgoingMessage]] = {}
        for w in due:
            m = self._reader.read(TIMER_TOPIC, 0, w.offset)
            n = self._sm.topics.get(w.topic, 1 if w.topic.startswith(RETRY_PREFIX) else 0)
            if m is None or w.queue_id >= n:
                why = "the log no longer holds it" if m is None else f"{w.topic}/{w.queue_id} does not exist"
                log.warning("%s: timer message %d is not delivered: %s", self._node.id, w.offset, why)
                await self._proposer.submit([commands.Settle("timer", w.offset, why)])
                continue
            by_topic.setdefault(w.topic, []).append(copy_of(m, w.queue_id, f"timer/{w.offset}"))
        try:
            for topic, copies in by_topic.items():
                await self._sender.send(topic, copies, system=True)
        finally:
            await (
                self._sender.settled()
            )  # also after a failure: a copy whose outcome is unknown is applied or gone

    async def recall(self, topic: str, offset: int, msg_id: str, due_ms: int) -> bool:
        """Cancel the delayed message ``msg_id`` of ``topic``, waiting at ``offset`` of the timer topic, before
        it is delivered (a ``Recall`` command). True when this call recalled it, False when a recall before did
        (a retry). Under the tick lock: no copy of it is in flight, and none is made once the recall is applied."""
        async with self._tick_lock:
            await self._leadership.leader_state()
            timer = self._sm.timer
            if timer.recalled.get(offset) == msg_id:
                return False
            w = timer.entries.get(offset)
            if w is None:
                late = now_ms() - due_ms
                raise RecallError(
                    f"delayed message {msg_id} is no longer waiting"
                    + (f": it was delivered at its delivery time, {late} ms ago" if late >= 0 else "")
                    + "; a recall must come before the delivery time"
                )
            m = self._reader.read(TIMER_TOPIC, 0, offset)
            if m is None:
                raise RecallError(f"delayed message {msg_id}: the log no longer holds it")
            if (m.msg_id or "") != msg_id or w.topic != topic:  # the checksum holds, but not these names
                raise InvalidRequestError(f"the recall handle names no delayed message {msg_id} of {topic!r}")
            (r,) = await self._proposer.submit([commands.Recall(offset, msg_id)])
            if isinstance(r, BaseException):
                raise r if isinstance(r, DLedgerError) else InvalidRequestError(str(r))
            if r is None:  # cannot happen under the lock; said plainly if it does
                raise RecallError(f"delayed message {msg_id} was delivered before the recall was applied")
            return True

    # -- transactions --------------------------------------------------------------------------------------
    async def send_half(self, topic: str, msgs: Sequence[Outgoing], producer_group: str) -> list[SendResult]:
        """Store transactional messages for ``topic``; each one's message id is its transaction id."""
        return await self._sender.send(HALF_TOPIC, await self.half(topic, msgs, producer_group), system=True)

    async def half(self, topic: str, msgs: Sequence[Outgoing], producer_group: str) -> list[OutgoingMessage]:
        """The half topic's messages for ``send_half`` (checked: queues)."""
        check_user_topic(topic)
        await self._leadership.leader_state()
        n = await self._topics.ensure_topic(topic)
        held = []
        for m in msgs:
            if not 0 <= m.queue_id < n:
                raise UnknownQueueError(f"unknown queue {topic}/{m.queue_id} (queues 0..{n - 1})")
            props = dict(m.properties)
            props[message.PROPERTY_TRANSACTION_PREPARED] = "true"
            props[message.PROPERTY_REAL_TOPIC] = topic
            props[message.PROPERTY_REAL_QUEUE_ID] = str(m.queue_id)
            if producer_group:
                props[message.PROPERTY_PRODUCER_GROUP] = producer_group
            held.append(_with(m, 0, props))
        return held

    async def end_transaction(
        self, transaction_id: str, commit: bool, topic: str | None = None, message_id: str = ""
    ) -> str:
        """Commit (copy to the real topic) or roll back the open transaction ``transaction_id`` (its message id);
        a retried end that matches how it ended answers the same. ``message_id``, when given, must be the
        transaction's. Returns COMMIT or ROLLBACK."""
        lock = self._tx_locks.setdefault(transaction_id, asyncio.Lock())
        try:
            async with lock:
                return await self._end(transaction_id, commit, topic, message_id)
        finally:
            if not lock.locked() and self._tx_locks.get(transaction_id) is lock:
                del self._tx_locks[transaction_id]

    async def _end(self, tid: str, commit: bool, topic: str | None, message_id: str) -> str:
        await self._leadership.leader_state()
        halves = self._sm.halves
        want = COMMIT if commit else ROLLBACK
        h = halves.find(tid)
        if h is None and tid.isdigit():
            # A transaction id issued before ids were message ids (a half offset), held across an upgrade.
            h = halves.open.get(int(tid))
            if h is not None and message_id and h.msg_id != message_id:
                h = None
        if h is None:
            how = halves.ended.get(tid)
            if how == want:
                return how
            raise TransactionError(
                f"transaction {tid} is not open"
                + (f": it was already ended by {how}" if how else " (unknown transaction id)")
            )
        if message_id and h.msg_id and message_id != h.msg_id:
            raise TransactionError(f"transaction {tid} is message {h.msg_id}, not {message_id}")
        if topic is not None and topic != h.topic:
            raise InvalidRequestError(f"transaction {tid} is for topic {h.topic!r}, not {topic!r}")
        if commit:
            m = self._reader.read(HALF_TOPIC, 0, h.offset)
            if m is None:
                raise NotFoundError(f"transaction {tid}: the log no longer holds its message")
            extra = {message.PROPERTY_TRANSACTION_ID: h.transaction_id}
            try:
                await self._sender.send(
                    h.topic, [copy_of(m, h.queue_id, f"half/{h.offset}", extra)], system=True
                )
            finally:
                await self._sender.settled()
        else:
            await self._proposer.submit([commands.Settle("half", h.offset, "rollback")])
        halves = self._sm.halves  # (a snapshot installed meanwhile replaces the table)
        how = halves.ended.get(h.transaction_id)
        if h.offset in halves.open or how != want:
            raise TransactionError(f"transaction {tid} ended by {how or 'nothing yet'}, not {want}")
        return how

    async def _check(self, halves: list[Half], now: int) -> None:
        await self._proposer.submit([commands.TxCheck(h.offset, now) for h in halves])

    def tx_checked(self, half: Half, at_ms: int) -> None:
        """Applied on every node (``BrokerStateMachine.on_tx_check``): a check-back was counted; ask the
        producers whose Telemetry streams this node holds (a producer may be connected to any node). A check
        replayed from an old part of the log (a restart) is not sent again."""
        if self.on_tx_check is None or abs(now_ms() - at_ms) > STALE_CHECK_MS:
            return
        m = self._reader.read(HALF_TOPIC, 0, half.offset)
        if m is not None:
            asyncio.get_running_loop().call_soon(self.on_tx_check, half, m)

    # -- retry for offset consumers ------------------------------------------------------------------------
    async def later(self, group: str, topic: str, queue_id: int, offset: int) -> tuple[bool, int, int]:
        """A consumer of ``group`` failed the message at ``topic``/``queue_id``/``offset``: schedule it again in
        ``%RETRY%<group>`` after the group's backoff, or past its attempts copy it to ``%DLQ%<group>``.
        Returns (dead-lettered, when it comes back, attempts so far)."""
        check_group(group)
        await self._leadership.leader_state()
        self._topics.check_queue(topic, queue_id)
        m = self._reader.read(topic, queue_id, offset)
        if m is None:
            raise NotFoundError(f"{topic}/{queue_id} offset {offset}: no such message on the leader")
        try:
            attempt = int(m.properties.get(message.PROPERTY_RECONSUME_TIME, "0")) + 1
        except ValueError:
            attempt = 1
        settings = self._sm.group_settings(group)
        extra = {
            message.PROPERTY_RETRY_TOPIC: m.properties.get(message.PROPERTY_RETRY_TOPIC, topic),
            message.PROPERTY_ORIGIN_MESSAGE_ID: m.properties.get(
                message.PROPERTY_ORIGIN_MESSAGE_ID, m.msg_id or ""
            ),
            message.PROPERTY_RECONSUME_TIME: str(attempt),
        }
        copy = copy_of(m, 0, "retry", extra)
        if attempt >= settings.max_attempts:
            dlq = dlq_topic(group)
            await self._sender.send(dlq, [copy], system=True)
            return True, 0, attempt
        retry = retry_topic(group)
        due = now_ms() + settings.backoff_ms(attempt)
        props = dict(copy.properties)
        del props[message.PROPERTY_ORIGIN]
        props[message.PROPERTY_TIMER_DELIVER_MS] = str(due)
        props[message.PROPERTY_REAL_TOPIC] = retry
        props[message.PROPERTY_REAL_QUEUE_ID] = "0"
        await self._sender.send(TIMER_TOPIC, [_with(copy, 0, props)], system=True)
        return False, due, attempt


class DeadLetters:
    """Copying a delivery of a consumer group's message to the group's dead-letter topic (``Pops``: when it used up
    its attempts, or on the consumer's own verdict); the dispatcher ends the delivery as it applies the copy."""

    def __init__(self, sm: BrokerStateMachine, sender: Sender):
        self._sm = sm
        self._sender = sender

    async def forward(
        self, group: str, topic: str, queue_id: int, offset: int, epoch: int, attempt: int, m: message.Message
    ) -> bool:
        """Copy delivery ``epoch`` of a message to the group's dead-letter topic; True when that ended it."""
        dlq = dlq_topic(group)
        extra = {
            message.PROPERTY_RETRY_TOPIC: topic,
            message.PROPERTY_ORIGIN_MESSAGE_ID: m.msg_id or "",
            message.PROPERTY_RECONSUME_TIME: str(attempt),
        }
        try:
            await self._sender.send(
                dlq, [copy_of(m, 0, f"dlq/{queue_id}/{offset}/{epoch}/{topic}", extra)], system=True
            )
        finally:
            await self._sender.settled()
        q = self._sm.pops.get((group, topic, queue_id))
        return q is None or offset not in q.inflight or q.inflight[offset].epoch != epoch


def _with(m: Outgoing, queue_id: int, props: dict[str, str]) -> OutgoingMessage:
    return OutgoingMessage(
        queue_id=queue_id,
        body=m.body,
        tags=m.tags,
        keys=list(m.keys),
        msg_id=m.msg_id,
        properties=props,
        born_timestamp=m.born_timestamp,
        producer_id=m.producer_id,
        sequence=m.sequence,
    )
