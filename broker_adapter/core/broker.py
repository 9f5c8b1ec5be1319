"""The broker's operations as plain Python, under every protocol face (``service`` for ``dledger.v1.Broker``,
``rocketmq.servicer`` for RocketMQ 5's ``MessagingService``): each face converts its requests, calls this, and
converts the answer or the ``dledger.errors`` error it raises. Nothing here knows gRPC.

Writes (send, create topic, commit offset, and the pops, acks and invisible-time changes of ``broker_pop``) go
through the log on the leader: each is one entry, proposed with the allocator's ``prepare`` (concurrent calls'
entries packed into one proposal by ``broker_commit``) so a message gets its queue offset and CommitLog offset as the leader places it. A follower refuses writes with ``NotLeaderError``
naming the leader. Reads are served from this node's dispatched state; a follower serves them only when the
caller allows it. Input is checked before anything is written. The node is reached only through
``dledger.plugins.NodeHandle``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Final

from broker_adapter.core import commands, groups, message
from broker_adapter.core.admin import Admin
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.commitlog import CommitLog, CommitLogError
from broker_adapter.core.delivery import DeadLetters, Delivery
from broker_adapter.core.group_commit import GroupCommit
from broker_adapter.core.leadership import Leadership
from broker_adapter.core.model import (
    DELAY,
    NORMAL,
    TRANSACTION,
    OffsetRangeError,
    Outgoing,
    Pulled,
    PulledRaw,
    RouteInfo,
    SendResult,
    UnknownGroupError,
    check_group,
    check_user_topic,
)
from broker_adapter.core.pop import Pops
from broker_adapter.core.reader import QueueReader
from broker_adapter.core.send import Sender
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.core.topic_registry import TopicRegistry
from broker_adapter.core.topics import HALF_TOPIC, TIMER_TOPIC
from broker_adapter.settings import BrokerSettings
from dledger.core.messages import Role
from dledger.errors import (
    DLedgerError,
    InvalidRequestError,
    NotFoundError,
)
from dledger.plugins import NodeHandle

MAX_PULL_MESSAGES: Final = 1024
MAX_WAIT_MS: Final = 30_000


class Broker:
    def __init__(
        self,
        node: NodeHandle,
        state_machine: BrokerStateMachine,
        allocator: QueueOffsetAllocator,
        settings: BrokerSettings | None = None,
    ):
        self.node = node
        self.settings = settings or BrokerSettings()  # the node config's [broker] table
        self.sm = state_machine
        self._alloc = allocator
        self.commitlog = CommitLog(node.log_store, state_machine)
        # The parts, each given the few others it uses (none of them sees this facade):
        self.leadership = Leadership(node)  # may this node write; its read barrier as a new leader
        # concurrent calls' entries: one proposal
        self.group_commit = GroupCommit(node, allocator, linger_s=self.settings.group_commit_linger_ms / 1000)
        self.topics = TopicRegistry(
            state_machine, self.leadership, self.group_commit, self.settings.auto_create_topic_queues
        )
        self.reader = QueueReader(node, state_machine, self.commitlog)  # messages by queue offset, long polls
        self._sender = Sender(node, state_machine, allocator, self.group_commit, self.leadership, self.topics)
        self.send = self._sender.send  # bound once: the hot path pays no extra call
        self.send_stored = self._sender.send_stored  # a producer session's batches (docs/broker.md)
        dead_letters = DeadLetters(state_machine, self._sender)
        # RocketMQ 5 consumption: pop, ack, change invisible duration
        self.pops = Pops(
            state_machine, self.leadership, self.topics, self.reader, self.group_commit, dead_letters
        )
        # Delayed, transactional and dead-letter messages (the leader's loop)
        self.delivery = Delivery(
            node,
            state_machine,
            self.leadership,
            self.topics,
            self.reader,
            self.group_commit,
            self._sender,
            self.pops.revive,
            self.settings.max_delay_ms,
        )
        # Administration: groups, topics, message queries, run-time settings (docs/broker.md, Administration)
        self.admin = Admin(
            state_machine,
            self.leadership,
            self.group_commit,
            self.topics,
            self.reader,
            self.commitlog,
            self.settings,
            self._sender.settled,
        )
        self.leadership.on_ready = self.delivery.ensure_running
        state_machine.on_tx_check = self.delivery.tx_checked

    # -- hooks ---------------------------------------------------------------------------------------------
    def dispatched(self, topic: str, queue_id: int, next_offset: int) -> None:
        """The dispatcher wrote units for this queue: wake long-polling pulls and receives."""
        self.reader.wake(topic, queue_id)

    def role_changed(self, role: Role, term: int) -> None:
        self.leadership.role_changed(role, term)
        self.delivery.role_changed(role, term)

    # -- leadership ----------------------------------------------------------------------------------------
    async def leader_state(self, timeout_s: float = 5.0) -> int:
        """The leader's term once its dispatched state includes everything earlier leaders committed."""
        return await self.leadership.leader_state(timeout_s)

    def require_leader(self) -> int:
        """The leader's term, or the error a follower answers with."""
        return self.leadership.require_leader()

    # -- topics and queues ---------------------------------------------------------------------------------
    def queues(self, topic: str) -> int:
        """The topic's queue count on this node (``InvalidTopicError`` / ``UnknownTopicError`` otherwise)."""
        return self.topics.queues(topic)

    def check_queue(self, topic: str, queue_id: int) -> None:
        self.topics.check_queue(topic, queue_id)

    @property
    def auto_create_topic_queues(self) -> int:
        return self.topics.auto_create_queues

    async def ensure_topic(self, topic: str) -> int:
        """The topic's queue count. With ``auto_create_topic_queues`` on, the leader first creates an unknown
        topic through the log (a CreateTopic entry, so every node agrees); off, an unknown topic is NOT_FOUND."""
        return await self.topics.ensure_topic(topic)

    async def send_kinds(
        self, topic: str, msgs: Sequence[Outgoing], kinds: Sequence[str], due_ms: Sequence[int]
    ) -> list[SendResult]:
        """One request's messages, each stored by its kind: NORMAL in ``topic``, DELAY in the timer topic until
        its ``due_ms``, TRANSACTION as a half message. Each kind is one send, and every send is checked before
        the first is written, so a request refused for any of its messages leaves nothing in the log."""
        parts: list[tuple[list[int], str, Sequence[Outgoing], bool]] = []
        for kind in (NORMAL, DELAY, TRANSACTION):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            if not idx:
                continue
            part = [msgs[i] for i in idx]
            if kind == DELAY:
                held = await self.delivery.timed(topic, part, [due_ms[i] for i in idx])
                parts.append((idx, TIMER_TOPIC, held, True))
            elif kind == TRANSACTION:
                parts.append((idx, HALF_TOPIC, await self.delivery.half(topic, part, ""), True))
            else:
                parts.append((idx, topic, part, False))
        for _, to, batch, system in parts:
            await self._sender.check(to, batch, system)
        sent: dict[int, SendResult] = {}
        for idx, to, batch, system in parts:
            for i, r in zip(idx, await self.send(to, batch, system), strict=True):
                sent[i] = r
        return [sent[i] for i in range(len(msgs))]  # each message has one of the three kinds

    async def applied_through(self, index: int, timeout_s: float = 10.0) -> None:
        """Until this node's state machine applied entry ``index``."""
        await self._sender.wait_applied(index, asyncio.get_running_loop().time() + timeout_s)

    async def set_group_settings(self, group: str, settings: dict[str, Any]) -> Any:
        """Replace a consumer group's delivery settings (``broker_adapter.core.groups``) through the log."""
        check_group(group)
        try:
            checked = groups.GroupSettings.from_json(settings)
        except groups.GroupSettingsError as e:
            raise InvalidRequestError(str(e)) from None
        await self.leader_state()
        (result,) = await self.submit([commands.GroupSettingsCmd(group, checked.to_json())])
        if isinstance(result, BaseException):
            raise result if isinstance(result, DLedgerError) else InvalidRequestError(str(result))
        return result

    async def create_topic(self, topic: str, queues: int) -> commands.CreateTopic:
        try:
            body = commands.encode(commands.CreateTopic(topic, queues))
        except commands.CommandError as e:
            raise InvalidRequestError(str(e)) from None
        # Refused here, before anything is proposed, when the leader's state already has the topic with another
        # queue count: a refusal writes nothing (the gRPC fuzzing found a committed CreateTopic that its apply
        # then refused). The state machine still refuses it at apply for a create racing another.
        await self.leader_state()
        have = self.sm.topics.get(topic)
        if have is not None and have != queues:
            raise InvalidRequestError(f"topic {topic!r} already exists with {have} queues")
        (result,) = await self.submit([body])
        if isinstance(result, commands.CommandError):
            raise InvalidRequestError(str(result))
        if isinstance(result, BaseException):
            raise result
        created: commands.CreateTopic = (
            result  # what applying a CreateTopic answers when it did not refuse it
        )
        return created

    async def list_topics(self, allow_follower: bool = False) -> list[tuple[str, int, list[int]]]:
        """(topic, queues, each queue's end) for every topic, by name."""
        if not allow_follower:
            await self.leader_state()
        sm = self.sm
        return [(t, n, [sm.next_offset(t, q) for q in range(n)]) for t, n in sorted(sm.topics.items())]

    # -- proposing -----------------------------------------------------------------------------------------
    async def submit(self, cmds: Sequence[commands.Command | bytes]) -> list[Any]:
        """Propose commands (or encoded bodies) as one batch, packed with concurrent calls' entries
        (``broker_commit``); each one's applied result, or the error the state machine returned for it."""
        return await self.group_commit.submit(cmds)

    # -- pull ----------------------------------------------------------------------------------------------
    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_wait_ms: int = 0,
        allow_follower: bool = False,
        select: Callable[[message.Message], bool] | None = None,
    ) -> Pulled:
        """Up to ``max_messages`` consecutive messages from ``offset``, long-polling up to ``max_wait_ms`` at the
        queue's end. A lagging follower (when allowed) answers an offset beyond its end with nothing. With
        ``select`` (a subscription's filter, ``broker_adapter.core.selectors``) only what it takes is answered, and
        the next offset passes the others."""
        offset, n, end = await self._pull_span(
            topic, queue_id, offset, max_messages, max_wait_ms, allow_follower
        )
        if n <= 0:
            return Pulled([], offset, end)
        offset, n, data, sizes = self._stored_held(topic, queue_id, offset, n, end)
        if n <= 0:
            return Pulled([], offset, end)
        msgs = self._decoded(topic, queue_id, offset, data, sizes)
        if select is not None:
            return Pulled([m for m in msgs if select(m)], offset + len(sizes), end)
        return Pulled(msgs, offset + len(msgs), end)

    @staticmethod
    def _decoded(
        topic: str, queue_id: int, offset: int, data: bytes, sizes: Sequence[int]
    ) -> list[message.Message]:
        decode = message.decode
        msgs: list[message.Message] = []
        at = 0
        for size in sizes:
            try:
                msgs.append(decode(data[at : at + size], check_crc=False))  # the entry's body_crc covers it
            except message.MessageFormatError as e:
                raise DLedgerError(f"{topic}/{queue_id} offset {offset + len(msgs)}: {e}") from None
            at += size
        return msgs

    async def pull_raw(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_wait_ms: int = 0,
        allow_follower: bool = False,
        select: Callable[[message.Message], bool] | None = None,
    ) -> PulledRaw:
        """``pull`` at batch granularity: the messages' stored bytes concatenated, decoded by nobody here (a
        consumer decodes them with ``broker_adapter.pulled``). Same checks, waits and errors as ``pull``. With
        ``select``, the stored bytes of the messages it takes (decoded here to judge them)."""
        offset, n, end = await self._pull_span(
            topic, queue_id, offset, max_messages, max_wait_ms, allow_follower
        )
        if n <= 0:
            return PulledRaw(b"", 0, offset, end)
        offset, n, data, sizes = self._stored_held(topic, queue_id, offset, n, end)
        if n <= 0:
            return PulledRaw(b"", 0, offset, end)
        if select is not None:
            msgs = self._decoded(topic, queue_id, offset, data, sizes)
            kept, at = [], 0
            for m, size in zip(msgs, sizes, strict=True):
                if select(m):
                    kept.append(data[at : at + size])
                at += size
            return PulledRaw(b"".join(kept), len(kept), offset + len(sizes), end)
        return PulledRaw(data, len(sizes), offset + len(sizes), end)

    async def _pull_span(
        self, topic: str, qid: int, offset: int, max_messages: int, max_wait_ms: int, allow_follower: bool
    ) -> tuple[int, int, int]:
        """Where a pull from ``offset`` starts (the first offset this node holds, when retention deleted what
        came before: a consumer that fell behind goes on from there), how many messages it takes (after its
        long poll), and the queue's end."""
        check_user_topic(topic)
        if not allow_follower and not self.node.is_leader():
            self.require_leader()  # a follower redirects before judging a topic by its possibly stale state
        self.check_queue(topic, qid)
        if offset < 0:
            raise InvalidRequestError(f"offset must be >= 0, got {offset}")
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidRequestError(f"max_messages must be in 1..{MAX_PULL_MESSAGES}, got {max_messages}")
        if not 0 <= max_wait_ms <= MAX_WAIT_MS:
            raise InvalidRequestError(f"max_wait_ms must be in 0..{MAX_WAIT_MS}, got {max_wait_ms}")
        leader = not allow_follower or self.node.is_leader()
        if leader:
            await self.leader_state()
        sm = self.sm
        end = sm.next_offset(topic, qid)
        if offset > end and not leader:
            return offset, 0, end  # a lagging follower
        if offset > end:
            raise InvalidRequestError(
                f"offset {offset} is beyond the end of {topic}/{qid} ({end}) on node {self.node.id}"
            )
        if offset == end and max_wait_ms:
            loop = asyncio.get_running_loop()
            await self.wait_dispatch(topic, (qid,), loop.time() + max_wait_ms / 1000, offset)
            end = sm.next_offset(topic, qid)
        offset = max(offset, self.first_held(topic, qid))
        return offset, max(0, min(max_messages, end - offset)), end

    def _stored_held(
        self, topic: str, qid: int, offset: int, n: int, end: int
    ) -> tuple[int, int, bytes, list[int]]:
        """``_stored``, moved on to the first held offset when the log's start passed ``offset`` meanwhile
        (retention compacts on the I/O thread while a pull waits): (offset, n, data, sizes)."""
        while True:
            try:
                data, sizes = self._stored(topic, qid, offset, n)
                return offset, n, data, sizes
            except NotFoundError:
                held = self.first_held(topic, qid)
                if held <= offset:
                    raise
                offset, n = held, max(0, min(n, end - held))
                if n == 0:
                    return offset, 0, b"", []

    def _stored(self, topic: str, qid: int, offset: int, n: int) -> tuple[bytes, list[int]]:
        """The stored bytes of up to ``n`` consecutive messages from ``offset``, concatenated, and each one's
        size: their ConsumeQueue units in one read per file, their bodies in one store call (``CommitLog.bodies``
        checks every entry: a corrupt one raises the store's ``StorageCorruptError`` naming it). Fewer when the
        queue ends early; ``NotFoundError`` when one is no longer held."""
        cq = self.sm.queue(topic, qid)
        offsets, sizes = cq.spans(offset, n)
        while len(sizes) < n:  # the units continue in the next ConsumeQueue file
            more_offsets, more_sizes = cq.spans(offset + len(sizes), n - len(sizes))
            if not more_sizes:
                break
            offsets += more_offsets
            sizes += more_sizes
        if not sizes or 0 in sizes:
            at = sizes.index(0) if sizes else 0
            raise NotFoundError(
                f"{topic}/{qid} offset {offset + at} precedes node {self.node.id}'s snapshot and its log no longer "
                "holds it"
            )
        try:
            return self.commitlog.bodies(offsets, sizes), sizes
        except CommitLogError as e:
            raise NotFoundError(f"{topic}/{qid} offset {offset + e.at}: {e}") from None

    async def pull_selected(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        batch: int,
        select: Callable[[message.Message], bool],
        poll_ms: int,
        deadline: float,
    ) -> tuple[list[message.Message], int]:
        """The messages among ``batch`` offsets from ``offset`` that ``select`` accepts (messages this node
        no longer holds are passed over), waiting up to ``poll_ms`` (and not past ``deadline``, loop time) for
        one to be dispatched at the queue's end; and the offset after the ones looked at. On the leader."""
        check_user_topic(topic)
        await self.leader_state()
        end = self.sm.next_offset(topic, queue_id)
        if not 0 <= offset <= end:
            raise OffsetRangeError(f"offset {offset} is outside {topic}/{queue_id}'s range 0..{end}")
        until = min(asyncio.get_running_loop().time() + poll_ms / 1000, deadline)
        await self.wait_dispatch(topic, (queue_id,), until, offset)
        hi = min(self.sm.next_offset(topic, queue_id), offset + batch)
        found = []
        for o in range(offset, hi):
            m = self.read(topic, queue_id, o)
            if m is not None and select(m):
                found.append(m)
        return found, hi

    async def wait_dispatch(
        self, topic: str, queue_ids: Sequence[int], until: float, offset: int | None = None
    ) -> None:
        """Until a message is dispatched to one of the queues or ``until`` (loop time). With ``offset`` (one
        queue): until the queue reaches past it."""
        await self.reader.wait_dispatch(topic, queue_ids, until, offset)

    def first_held(self, topic: str, queue_id: int) -> int:
        """The first queue offset whose message this node's log holds (docs/broker.md, "Retention")."""
        return self.reader.first_held(topic, queue_id)

    def read(self, topic: str, queue_id: int, offset: int) -> message.Message | None:
        """The committed message at a queue offset, or None when this node's log no longer holds it."""
        return self.reader.read(topic, queue_id, offset)

    def first_stored_at(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``ts_ms`` (store times grow with the
        offset); messages this node no longer holds count as older."""
        return self.admin.first_stored_at(topic, queue_id, ts_ms)

    # -- consumer offsets ----------------------------------------------------------------------------------
    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Replicate a consumer group's committed offset of a queue (0..the queue's end)."""
        check_group(group)
        await self.leader_state()
        self.check_queue(topic, queue_id)
        end = self.sm.next_offset(topic, queue_id)
        if not 0 <= offset <= end:
            raise OffsetRangeError(f"offset {offset} is outside {topic}/{queue_id}'s range 0..{end}")
        body = commands.encode(commands.CommitOffset(group, topic, queue_id, offset))
        self.require_leader()
        (result,) = await self.submit([body])
        if isinstance(result, commands.CommandError):
            raise NotFoundError(str(result))
        if isinstance(result, BaseException):
            raise result

    async def committed_offset(
        self, group: str, topic: str, queue_id: int, allow_follower: bool = False
    ) -> int | None:
        """The group's committed offset of a queue (None: none for this queue); ``UnknownGroupError`` when the
        group never committed any offset."""
        check_group(group)
        if not allow_follower:
            await self.leader_state()
        self.check_queue(topic, queue_id)
        if not any(g == group for g, _, _ in self.sm.offsets):
            raise UnknownGroupError(f"unknown consumer group {group!r}: it never committed an offset")
        return self.sm.committed_offset(group, topic, queue_id)

    # -- route ---------------------------------------------------------------------------------------------
    def route(self) -> RouteInfo:
        info = self.node.metadata()
        return RouteInfo(
            info.node_id,
            info.leader_id,
            info.leader_address,
            info.term,
            self.commitlog.max_offset(self.sm.applied_index),
        )
