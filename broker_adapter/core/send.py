"""The broker's send path: validation, property stamping, idempotent-producer dedup, proposing to the log and
resolving each message to its offsets. Acknowledged at quorum commit: where a message goes is fixed when the
leader places it (the allocator's ``prepare``), so the answer need not wait for the dispatcher.

A (producer_id, sequence) already in the log, or in flight on this leader, is not stored again: the retry is
answered with the first attempt's place (``SendResult.duplicate``).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

from broker_adapter.core import message
from broker_adapter.core.clock import now_ms
from broker_adapter.core.model import (
    Outgoing,
    SendResult,
    UnknownQueueError,
    check_topic,
    check_user_topic,
    encode_outgoing,
)
from broker_adapter.core.statemachine import Dispatched
from dledger.errors import DLedgerError, InvalidRequestError, OutcomeUnknownError

if TYPE_CHECKING:
    from broker_adapter.core.allocator import QueueOffsetAllocator
    from broker_adapter.core.group_commit import GroupCommit
    from broker_adapter.core.leadership import Leadership
    from broker_adapter.core.statemachine import BrokerStateMachine
    from broker_adapter.core.topic_registry import TopicRegistry
    from dledger.plugins import NodeHandle

MAX_SEND_BATCH: Final = 1024

# Where each message of a stored batch went (None: a duplicate too old to remember), for retries arriving meanwhile.
Stored = list[Dispatched | None]
# Where a (producer, seq) already is: ``QueueOffsetAllocator.find_send``'s answer, or, in flight on this leader, its
# batch's results and its place in them.
Found = Dispatched | int | bool | tuple["asyncio.Future[Stored]", int]


class Sender:
    def __init__(
        self,
        node: NodeHandle,
        sm: BrokerStateMachine,
        allocator: QueueOffsetAllocator,
        proposer: GroupCommit,
        leadership: Leadership,
        topics: TopicRegistry,
    ):
        self._node = node  # its config (max_body_bytes) and its log's end
        self._sm = sm
        self._alloc = allocator
        self._proposer = proposer
        self._leadership = leadership
        self._topics = topics
        # (producer, seq) -> (the results of the batch storing it, its index there), while that batch is proposed
        self._inflight: dict[tuple[str, int], tuple[asyncio.Future[Stored], int]] = {}
        # Ids for messages sent without one: 32 hex digits as RocketMQ's, a random prefix per broker process
        # and a counter (uuid4 per message cost more than the rest of the encoding).
        self._id_prefix = uuid.uuid4().hex.upper()[:20]
        self._ids = itertools.count()

    async def wait_applied(self, index: int, deadline: float) -> None:
        """Until this node applied entry ``index`` (a retried message's first attempt, so the dispatcher's producer
        table has it; or the log's end, ``settled``); woken by the node as it applies
        (``NodeHandle.wait_applied``), not by polling. The node's applied index, not the dispatcher's: an entry of
        another state machine (a secure group's user commands) never reaches the dispatcher."""
        if self._sm.applied_index >= index:  # applied already (the dispatcher's index never runs ahead)
            return
        try:
            await asyncio.wait_for(
                self._node.wait_applied(index), deadline - asyncio.get_running_loop().time()
            )
        except TimeoutError:
            raise OutcomeUnknownError(f"entry {index} was not applied in time; retry") from None

    async def settled(self, timeout_s: float = 10.0) -> None:
        """Until this node applied everything in its log now (every copy it appended is reflected in state)."""
        await self.wait_applied(
            self._node.log_store.last_index, asyncio.get_running_loop().time() + timeout_s
        )

    # -- send ----------------------------------------------------------------------------------------------
    async def check(self, topic: str, msgs: Sequence[Outgoing], system: bool = False) -> None:
        """Refuse what ``send`` would refuse for these messages, writing nothing: a request stored as several
        sends checks them all before the first is written (``send_kinds`` of the broker core)."""
        await self._checked(topic, msgs, system)

    async def _checked(
        self, topic: str, msgs: Sequence[Outgoing], system: bool
    ) -> list[tuple[str, bytes, message.Route]]:
        """A send's checks (topic, properties, queues, count, size) on the leader, then the messages encoded."""
        if system:
            check_topic(topic)
        else:
            check_user_topic(topic)
            for i, m in enumerate(msgs):
                if message.PROPERTY_ORIGIN in m.properties:
                    raise InvalidRequestError(_origin_refused(i))
        await (
            self._leadership.leader_state()
        )  # a follower redirects before judging a topic by its stale state
        if system and topic not in self._sm.topics:
            # The broker's own topics (timer, half, retry, dead-letter) come into being with their first
            # message, one queue (the dispatcher records a topic it has not seen): nothing is written before
            # the message itself, so a send refused below leaves no trace.
            queues = 1
        else:
            queues = await self._topics.ensure_topic(topic)
        if not msgs or len(msgs) > MAX_SEND_BATCH:
            raise InvalidRequestError(f"a send carries 1..{MAX_SEND_BATCH} messages, got {len(msgs)}")
        return self._encode(topic, queues, msgs)

    async def send(self, topic: str, msgs: Sequence[Outgoing], system: bool = False) -> list[SendResult]:
        """Store messages in one topic on the leader, each once per (producer_id, sequence); acknowledged at
        quorum commit. A retried send is answered with the first attempt's place (``duplicate``). Only the
        broker itself (``system``) writes to its system topics."""
        encoded = await self._checked(topic, msgs, system)
        placed = await self._store([raw for _, raw, _ in encoded], [r for _, _, r in encoded])
        out: list[SendResult] = []
        for m, (msg_id, _, r), (d, dup) in zip(msgs, encoded, placed, strict=True):
            if dup:
                msg_id = m.msg_id or ""  # the retry's own id: the first attempt's may have been the broker's
            if d is not None:
                out.append(SendResult(msg_id, d.topic, d.queue_id, d.queue_offset, d.commitlog_offset, dup))
            else:
                out.append(SendResult(msg_id, topic, r.queue_id, -1, -1, True))
        return out

    async def send_stored(
        self, raws: Sequence[bytes], may_publish: Callable[[Iterable[str]], Awaitable[None]] | None = None
    ) -> list[tuple[Dispatched | None, bool]]:
        """Messages a producer session sent in their stored form (docs/broker.md, "Producer sessions"), of any
        user topics: checked without decoding (``message.check_stored``), topics resolved once per batch, then
        stored as ``send`` stores them. Per message: where it is (None: a duplicate too old to remember) and
        whether it is a duplicate. ``may_publish(topics)`` raises when the caller may not write to one of the
        batch's topics (a secure group's face asks its guard)."""
        if not raws or len(raws) > MAX_SEND_BATCH:
            raise InvalidRequestError(f"a send carries 1..{MAX_SEND_BATCH} messages, got {len(raws)}")
        await (
            self._leadership.leader_state()
        )  # a follower redirects before judging a topic by its stale state
        limit = self._node.config.max_body_bytes
        queues: dict[str, int] = {}
        routes: list[message.Route] = []
        for i, raw in enumerate(raws):
            try:
                r = message.check_stored(raw)
            except message.MessageFormatError as e:
                raise InvalidRequestError(f"message {i}: {e}") from None
            n = queues.get(r.topic)
            if n is None:
                check_user_topic(r.topic)
                n = queues[r.topic] = await self._topics.ensure_topic(r.topic)
            if r.queue_id >= n:
                raise UnknownQueueError(
                    f"message {i}: unknown queue {r.topic}/{r.queue_id} (queues 0..{n - 1})"
                )
            if r.origin is not None:
                raise InvalidRequestError(_origin_refused(i))
            if len(raw) > limit:
                raise InvalidRequestError(
                    f"message {i} is {len(raw)} bytes; the limit is {limit} (max_body_bytes)"
                )
            routes.append(r)
        if may_publish is not None:
            await may_publish(queues)
        return await self._store(raws, routes)

    async def _store(
        self, raws: Sequence[bytes], routes: Sequence[message.Route]
    ) -> list[tuple[Dispatched | None, bool]]:
        """Propose checked, encoded messages, each once per producer identity (``Route.producer``): per message,
        where it is stored (None: a duplicate too old to remember) and whether it is a duplicate."""
        term = self._leadership.require_leader()
        self._alloc.ensure_term(term, self._node.log_store.last_index)
        loop = asyncio.get_running_loop()
        results: Stored = [None] * len(raws)
        fresh: list[int] = []
        waits: list[tuple[int, Found]] = []
        mine: list[tuple[str, int]] = []
        stored: asyncio.Future[Stored] | None = None  # this batch's results, for retries arriving meanwhile
        for i, r in enumerate(routes):
            key = r.producer
            if key is not None:
                found: Found = self._alloc.find_send(*key)
                if found is False and key in self._inflight:
                    found = self._inflight[key]
                if found is not False:
                    waits.append((i, found))
                    continue
                if stored is None:
                    stored = loop.create_future()
                self._inflight[key] = (stored, i)
                mine.append(key)
            fresh.append(i)
        try:
            if fresh:
                # Acknowledged at commit: where each message goes is fixed when the leader places it (the
                # dispatcher checks every node dispatches it exactly there), so the ack need not wait for apply.
                all_fresh = len(fresh) == len(raws)
                placed, _ = await self._proposer.propose(
                    raws if all_fresh else [raws[i] for i in fresh],
                    False,
                    routes if all_fresh else [routes[i] for i in fresh],
                )
                for i, d in zip(fresh, placed, strict=True):
                    results[i] = d
        except BaseException as e:
            for key in mine:
                self._inflight.pop(key, None)
            if stored is not None:
                stored.set_exception(e if isinstance(e, DLedgerError) else DLedgerError(str(e)))
                stored.exception()  # retrieved: a retry may never wait on it
            raise
        for key in mine:
            self._inflight.pop(key, None)
        if stored is not None:
            stored.set_result(results)
        deadline = loop.time() + 10.0
        for i, found in waits:
            key = routes[i].producer
            assert key is not None
            results[i] = await self._resolve_duplicate(key, found, deadline)
        retried = {i for i, _ in waits}
        return [(d, i in retried) for i, d in enumerate(results)]

    def _encode(
        self, topic: str, queues: int, msgs: Sequence[Outgoing]
    ) -> list[tuple[str, bytes, message.Route]]:
        """(msg_id, CommitLog message bytes, its route) per message, with the broker's properties stamped in."""
        now = now_ms()
        limit = self._node.config.max_body_bytes
        encoded: list[tuple[str, bytes, message.Route]] = []
        for i, m in enumerate(msgs):
            if not 0 <= m.queue_id < queues:
                raise UnknownQueueError(
                    f"message {i}: unknown queue {topic}/{m.queue_id} (queues 0..{queues - 1})"
                )
            msg_id = m.msg_id or f"{self._id_prefix}{next(self._ids):012X}"
            try:
                raw, props = encode_outgoing(topic, m, msg_id, m.born_timestamp or now)
            except message.MessageFormatError as e:
                raise InvalidRequestError(f"message {i}: {e}") from None
            if len(raw) > limit:
                raise InvalidRequestError(
                    f"message {i} is {len(raw)} bytes encoded; the limit is {limit} (max_body_bytes)"
                )
            encoded.append((msg_id, raw, message.route_of(topic, m.queue_id, len(raw), props)))
        return encoded

    async def _resolve_duplicate(
        self, key: tuple[str, int], found: Found, deadline: float
    ) -> Dispatched | None:
        """The first attempt's result for a retried (producer, seq): None when it is too old to remember."""
        if isinstance(found, tuple):  # in flight on this leader: (its batch's results, its place in them)
            batch, i = found
            placed: Dispatched | None = (await asyncio.shield(batch))[i]
            return placed
        if isinstance(found, int) and not isinstance(found, bool):
            await self.wait_applied(found, deadline)
            found = self._sm.sent(*key)
        if isinstance(found, Dispatched):
            return found
        if found is True:
            return None
        raise OutcomeUnknownError(f"send {key[0]}/{key[1]} left the log; retry it")


def _origin_refused(i: int) -> str:
    return (
        f"message {i}: property {message.PROPERTY_ORIGIN} is the broker's own (it marks the copies the broker "
        "makes of delayed, transactional and dead-letter messages)"
    )
