"""The Broker gRPC service (proto/dledger/v1/broker.proto) on a node that runs the broker plugin.

Writes (send, create topic, commit offset) go through the log on the leader: each is one entry, proposed with
the allocator's ``prepare`` so a message gets its queue offset and CommitLog offset as the leader places it, and
answered once the dispatcher has applied it (so the answer carries the dispatched queue offset). A follower
answers writes with FAILED_PRECONDITION naming the leader. Reads are served from this node's dispatched state;
a follower serves them only when the client allows it. Input is checked before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import grpc

from broker_adapter import commands, message
from broker_adapter.allocator import QueueOffsetAllocator
from broker_adapter.commitlog import CommitLog, CommitLogError
from broker_adapter.dispatcher import BrokerStateMachine, Dispatched
from dledger.core.messages import Role
from dledger.errors import (
    DLedgerError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.transport import convert
from dledger.v1 import broker_pb2, broker_pb2_grpc

MAX_PULL_MESSAGES = 1024
MAX_WAIT_MS = 30_000
MAX_SEND_BATCH = 1024


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, node: Any, dispatcher: BrokerStateMachine, allocator: QueueOffsetAllocator):
        self._node = node
        self._sm = dispatcher
        self._alloc = allocator
        self._commitlog = CommitLog(node.log_store, dispatcher)
        self._waiters: dict[tuple[str, int], asyncio.Event] = {}
        self._applied_event: asyncio.Event | None = None
        self._inflight: dict[tuple[str, int], asyncio.Future] = {}
        # Read barrier: a new leader answers from its dispatched state only once it has applied everything up to
        # its own first entry of the term (so nothing committed by earlier leaders is missing from its answers).
        self._barrier: tuple[int, int] = (-1, -1)  # (term, index of the leader's first entry in that term)
        self._barrier_passed_term = -1

    # -- hooks ---------------------------------------------------------------------------------------------
    def dispatched(self, topic: str, queue_id: int, next_offset: int) -> None:
        """The dispatcher wrote units for this queue: wake long-polling pulls."""
        ev = self._waiters.pop((topic, queue_id), None)
        if ev is not None:
            ev.set()
        ev = self._applied_event
        if ev is not None:
            self._applied_event = None
            ev.set()

    def role_changed(self, role: Role, term: int) -> None:
        if role is Role.LEADER:
            self._barrier = (term, self._node.log_store.last_index)

    async def _leader_state(self, timeout_s: float = 5.0) -> int:
        """The leader's term once its dispatched state includes everything earlier leaders committed."""
        term = self._require_leader()
        if self._barrier_passed_term == term:
            return term
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            barrier_term, index = self._barrier
            if barrier_term == term and self._node.metadata().applied_index >= index:
                self._barrier_passed_term = term
                return term
            if loop.time() >= deadline:
                raise UnavailableError(
                    f"node {self._node.id} became the leader but has not applied its log up to index {index} yet; "
                    "retry shortly"
                )
            await asyncio.sleep(0.005)
            term = self._require_leader()  # leadership may have moved meanwhile

    # -- helpers -------------------------------------------------------------------------------------------
    async def _abort(self, context: grpc.aio.ServicerContext, err: DLedgerError) -> None:
        addr = None
        if isinstance(err, NotLeaderError) and err.leader_hint:
            addr = self._node.address_of(err.leader_hint)
        context.set_trailing_metadata(convert.error_metadata(err, addr))
        await context.abort(convert.status_code(err), str(err))

    def _require_leader(self) -> int:
        """The leader's term, or the error a follower answers with."""
        core = self._node.core
        if core is not None and core.role is Role.LEADER:
            return core.term
        leader = core.leader_id if core is not None else None
        if leader and leader != self._node.id:
            raise NotLeaderError(
                leader,
                f"node {self._node.id} is not the leader; the leader is {leader} at "
                f"{self._node.address_of(leader) or '?'}",
            )
        raise UnavailableError(
            f"node {self._node.id} is not the leader and no leader is known; retry shortly"
        )

    def _prepare(self, index: int, pos: int, body: bytes) -> bytes:
        return self._alloc.prepare(self._node.core.term, index, pos, body)

    def _queues_of(self, topic: str) -> int:
        try:
            commands.check_topic(topic)
        except commands.CommandError as e:
            raise InvalidRequestError(str(e)) from None
        n = self._sm.topics.get(topic)
        if n is None:
            raise NotFoundError(
                f"unknown topic {topic!r}: create it first (dledger topic create), or turn on "
                "[broker] auto_create_topic_queues"
            )
        return n

    @property
    def auto_create_topic_queues(self) -> int:
        return self._node.config.auto_create_topic_queues

    async def ensure_topic(self, topic: str) -> int:
        """The topic's queue count. With ``auto_create_topic_queues`` on, the leader first creates an unknown
        topic through the log (a CreateTopic entry, so every node agrees); off, an unknown topic is NOT_FOUND."""
        try:
            return self._queues_of(topic)
        except NotFoundError:
            queues = self.auto_create_topic_queues
            if not queues:
                raise
        self._require_leader()
        (result,) = await self._submit([commands.encode(commands.CreateTopic(topic, queues))])
        if isinstance(result, BaseException) and not isinstance(result, commands.CommandError):
            raise result
        # A CommandError here means a concurrent create chose another queue count first: that one stands.
        return self._queues_of(topic)

    def _check_queue(self, topic: str, queue_id: int) -> None:
        n = self._queues_of(topic)
        if not 0 <= queue_id < n:
            raise NotFoundError(f"unknown queue {topic}/{queue_id}: the topic has queues 0..{n - 1}")

    async def _submit(self, bodies: list[bytes]) -> list[Any]:
        outcomes = await self._node.submit(bodies, prepare=self._prepare)
        return [o if isinstance(o, BaseException) else o.result for o in outcomes]

    async def _wait_applied(self, index: int, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while self._sm.applied_index < index:
            left = deadline - loop.time()
            if left <= 0:
                raise OutcomeUnknownError(f"entry {index} was not applied in time; retry")
            if self._applied_event is None:
                self._applied_event = asyncio.Event()
            # Re-check at least every 50 ms: an apply that dispatched no message sends no wake-up.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied_event.wait(), min(left, 0.05))

    # -- for the broker's other faces (broker_adapter.rocketmq) ---------------------------------------------
    async def send(self, request: broker_pb2.SendRequest) -> broker_pb2.SendResponse:
        """Send as ``Send`` does, on the leader; raises ``DLedgerError`` instead of answering a status."""
        return await self._send(request)

    async def leader_state(self, timeout_s: float = 5.0) -> int:
        """The leader's term once its dispatched state is complete (raises NotLeaderError on a follower)."""
        return await self._leader_state(timeout_s)

    # -- Send ----------------------------------------------------------------------------------------------
    async def Send(self, request, context):
        try:
            return await self._send(request)
        except DLedgerError as e:
            await self._abort(context, e)

    async def _send(self, request) -> broker_pb2.SendResponse:
        topic = request.topic
        try:
            commands.check_topic(topic)
        except commands.CommandError as e:
            raise InvalidRequestError(str(e)) from None
        await self._leader_state()  # a follower redirects before judging a topic by its possibly stale state
        queues = await self.ensure_topic(topic)
        msgs = list(request.messages)
        if not msgs or len(msgs) > MAX_SEND_BATCH:
            raise InvalidRequestError(f"a send carries 1..{MAX_SEND_BATCH} messages, got {len(msgs)}")
        now = int(time.time() * 1000)
        limit = self._node.config.max_body_bytes
        encoded: list[tuple[str, bytes]] = []
        for i, m in enumerate(msgs):
            if not 0 <= m.queue_id < queues:
                raise NotFoundError(
                    f"message {i}: unknown queue {topic}/{m.queue_id} (queues 0..{queues - 1})"
                )
            props = dict(m.properties)
            msg_id = m.msg_id or uuid.uuid4().hex.upper()
            props[message.PROPERTY_UNIQ_KEY] = msg_id
            if m.tags:
                props[message.PROPERTY_TAGS] = m.tags
            if m.keys:
                props[message.PROPERTY_KEYS] = message.KEY_SEPARATOR.join(m.keys)
            if m.producer_id:
                props[message.PROPERTY_PRODUCER_ID] = m.producer_id
                props[message.PROPERTY_SEQUENCE] = str(m.sequence)
            try:
                raw = message.encode(
                    message.Message(
                        topic=topic,
                        body=m.body,
                        queue_id=m.queue_id,
                        born_timestamp=m.born_timestamp or now,
                        store_timestamp=now,
                        properties=props,
                    )
                )
            except message.MessageFormatError as e:
                raise InvalidRequestError(f"message {i}: {e}") from None
            if len(raw) > limit:
                raise InvalidRequestError(
                    f"message {i} is {len(raw)} bytes encoded; the limit is {limit} (max_body_bytes)"
                )
            encoded.append((msg_id, raw))
        term = self._require_leader()
        self._alloc.ensure_term(term, self._node.log_store.last_index)
        loop = asyncio.get_running_loop()
        results: list[Any] = [None] * len(msgs)
        fresh: list[int] = []
        waits: list[tuple[int, Any]] = []
        mine: list[tuple[tuple[str, int], asyncio.Future]] = []
        for i, m in enumerate(msgs):
            if m.producer_id:
                key = (m.producer_id, m.sequence)
                found = self._alloc.find_send(*key)
                if found is False and key in self._inflight:
                    found = self._inflight[key]
                if found is not False:
                    waits.append((i, found))
                    continue
                fut = loop.create_future()
                self._inflight[key] = fut
                mine.append((key, fut))
            fresh.append(i)
        try:
            if fresh:
                # Acknowledged at commit: where each message goes is fixed when the leader places it (the
                # dispatcher checks every node dispatches it exactly there), so the ack need not wait for apply.
                placed: list[Dispatched] = []
                node = self._node

                def prepare(index: int, pos: int, body: bytes) -> bytes:
                    out, d = self._alloc.prepare_entry(node.core.term, index, pos, body)
                    placed.append(d)
                    return out

                await node.append([encoded[i][1] for i in fresh], prepare)
                for i, d in zip(fresh, placed, strict=True):
                    results[i] = d
        except BaseException as e:
            for key, fut in mine:
                self._inflight.pop(key, None)
                if not fut.done():
                    fut.set_exception(e if isinstance(e, DLedgerError) else DLedgerError(str(e)))
                    fut.exception()  # retrieved: a retry may never wait on it
            raise
        for (key, fut), i in zip(mine, [i for i in fresh if msgs[i].producer_id], strict=True):
            self._inflight.pop(key, None)
            fut.set_result(results[i])
        deadline = loop.time() + 10.0
        for i, found in waits:
            results[i] = await self._resolve_duplicate(msgs[i], found, deadline)
        out = broker_pb2.SendResponse()
        retried = {i for i, _ in waits}
        for i, d in enumerate(results):
            dup = i in retried
            if isinstance(d, Dispatched):
                out.results.add(
                    msg_id=encoded[i][0] if not dup else (msgs[i].msg_id or ""),
                    topic=d.topic,
                    queue_id=d.queue_id,
                    queue_offset=d.queue_offset,
                    commitlog_offset=d.commitlog_offset,
                    duplicate=dup,
                )
            else:
                out.results.add(
                    msg_id=msgs[i].msg_id,
                    topic=topic,
                    queue_id=msgs[i].queue_id,
                    queue_offset=-1,
                    commitlog_offset=-1,
                    duplicate=True,
                )
        return out

    async def _resolve_duplicate(self, m, found, deadline: float) -> Dispatched | None:
        """The first attempt's result for a retried (producer, seq): None when it is too old to remember."""
        if isinstance(found, asyncio.Future):
            return await asyncio.shield(found)
        if isinstance(found, int) and not isinstance(found, bool):
            await self._wait_applied(found, deadline)
            found = self._sm.sent(m.producer_id, m.sequence)
        if isinstance(found, Dispatched):
            return found
        if found is True:
            return None
        raise OutcomeUnknownError(f"send {m.producer_id}/{m.sequence} left the log; retry it")

    # -- Pull ----------------------------------------------------------------------------------------------
    async def Pull(self, request, context):
        try:
            return await self._pull(request)
        except DLedgerError as e:
            await self._abort(context, e)

    async def _pull(self, request) -> broker_pb2.PullResponse:
        topic, qid, offset = request.topic, request.queue_id, request.offset
        self._check_queue(topic, qid)
        if offset < 0:
            raise InvalidRequestError(f"offset must be >= 0, got {offset}")
        max_messages = request.max_messages or 32
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidRequestError(f"max_messages must be in 1..{MAX_PULL_MESSAGES}, got {max_messages}")
        if not 0 <= request.max_wait_ms <= MAX_WAIT_MS:
            raise InvalidRequestError(f"max_wait_ms must be in 0..{MAX_WAIT_MS}, got {request.max_wait_ms}")
        leader = not request.allow_follower or self._node.core.role is Role.LEADER
        if leader:
            await self._leader_state()
        end = self._sm.next_offset(topic, qid)
        if offset > end and not leader:
            return broker_pb2.PullResponse(next_offset=offset, max_offset=end)  # a lagging follower
        if offset > end:
            raise InvalidRequestError(
                f"offset {offset} is beyond the end of {topic}/{qid} ({end}) on node {self._node.id}"
            )
        if offset == end and request.max_wait_ms:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + request.max_wait_ms / 1000
            while self._sm.next_offset(topic, qid) <= offset:
                left = deadline - loop.time()
                if left <= 0:
                    break
                ev = self._waiters.setdefault((topic, qid), asyncio.Event())
                try:
                    await asyncio.wait_for(ev.wait(), left)
                except TimeoutError:
                    break
            end = self._sm.next_offset(topic, qid)
        out = broker_pb2.PullResponse(next_offset=offset, max_offset=end)
        n = min(max_messages, end - offset)
        if n <= 0:
            return out
        cq = self._sm.queue(topic, qid)
        hi = self._sm.applied_index
        got = 0
        while got < n:
            units = cq.read(offset + got, n - got)
            if not units:
                if got:
                    break
                raise NotFoundError(
                    f"{topic}/{qid} offset {offset} precedes node {self._node.id}'s snapshot and its log no longer "
                    "holds it"
                )
            for u in units:
                if u.size == 0:
                    raise NotFoundError(
                        f"{topic}/{qid} offset {u.queue_offset} precedes node {self._node.id}'s snapshot and its "
                        "log no longer holds it"
                    )
                try:
                    m = self._commitlog.read_message(u.commitlog_offset, u.size, hi)
                except CommitLogError as e:
                    raise NotFoundError(f"{topic}/{qid} offset {u.queue_offset}: {e}") from None
                except message.MessageFormatError as e:
                    raise DLedgerError(f"{topic}/{qid} offset {u.queue_offset}: {e}") from None
                out.messages.add(
                    topic=m.topic,
                    queue_id=m.queue_id,
                    queue_offset=m.queue_offset,
                    commitlog_offset=m.physical_offset,
                    body=m.body,
                    tags=m.tags or "",
                    keys=m.keys,
                    msg_id=m.msg_id or "",
                    properties=m.properties,
                    born_timestamp=m.born_timestamp,
                    store_timestamp=m.store_timestamp,
                )
            got += len(units)
        out.next_offset = offset + got
        return out

    # -- topics and offsets --------------------------------------------------------------------------------
    async def CreateTopic(self, request, context):
        try:
            try:
                body = commands.encode(commands.CreateTopic(request.topic, request.queues))
            except commands.CommandError as e:
                raise InvalidRequestError(str(e)) from None
            self._require_leader()
            (result,) = await self._submit([body])
            if isinstance(result, commands.CommandError):
                raise InvalidRequestError(str(result))
            if isinstance(result, BaseException):
                raise result
            return broker_pb2.CreateTopicResponse(topic=result.topic, queues=result.queues)
        except DLedgerError as e:
            await self._abort(context, e)

    async def ListTopics(self, request, context):
        try:
            if not request.allow_follower:
                await self._leader_state()
            out = broker_pb2.ListTopicsResponse()
            for t, n in sorted(self._sm.topics.items()):
                out.topics.add(topic=t, queues=n, max_offsets=[self._sm.next_offset(t, q) for q in range(n)])
            return out
        except DLedgerError as e:
            await self._abort(context, e)

    async def CommitOffset(self, request, context):
        try:
            try:
                commands.check_group(request.group)
            except commands.CommandError as e:
                raise InvalidRequestError(str(e)) from None
            await self._leader_state()
            self._check_queue(request.topic, request.queue_id)
            end = self._sm.next_offset(request.topic, request.queue_id)
            if not 0 <= request.offset <= end:
                raise InvalidRequestError(
                    f"offset {request.offset} is outside {request.topic}/{request.queue_id}'s range 0..{end}"
                )
            body = commands.encode(
                commands.CommitOffset(request.group, request.topic, request.queue_id, request.offset)
            )
            self._require_leader()
            (result,) = await self._submit([body])
            if isinstance(result, commands.CommandError):
                raise NotFoundError(str(result))
            if isinstance(result, BaseException):
                raise result
            return broker_pb2.CommitOffsetResponse()
        except DLedgerError as e:
            await self._abort(context, e)

    async def QueryOffset(self, request, context):
        try:
            try:
                commands.check_group(request.group)
            except commands.CommandError as e:
                raise InvalidRequestError(str(e)) from None
            if not request.allow_follower:
                await self._leader_state()
            self._check_queue(request.topic, request.queue_id)
            if not any(g == request.group for g, _, _ in self._sm.offsets):
                raise NotFoundError(f"unknown consumer group {request.group!r}: it never committed an offset")
            o = self._sm.committed_offset(request.group, request.topic, request.queue_id)
            return broker_pb2.QueryOffsetResponse(offset=o or 0, found=o is not None)
        except DLedgerError as e:
            await self._abort(context, e)

    async def Route(self, request, context):
        info = self._node.metadata()
        return broker_pb2.RouteResponse(
            node_id=info.node_id,
            leader_id=info.leader_id or "",
            leader_address=info.leader_address or "",
            term=info.term,
            max_commitlog_offset=self._commitlog.max_offset(self._sm.applied_index),
        )


def service_names() -> Sequence[str]:
    return (broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,)
