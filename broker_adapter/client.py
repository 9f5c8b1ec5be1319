"""Broker clients: ``Producer`` (idempotent sends that follow leader changes) and ``Consumer`` (pulls, long
polling, and a group iterator whose offsets are committed through the log), blocking, and ``AsyncProducer`` /
``AsyncConsumer`` for asyncio.

All talk to any node of the group, with the routing and retry policy of every dledger client
(``dledger.routing``): a write that reaches a follower is redirected by the "leader-address" trailer; an
unreachable node or an election in progress is retried on the next server with a bounded backoff. A producer
numbers its messages (producer id + sequence) once, before the first attempt, so a retry after a timeout or a
lost leader is recognised by the leader and answered with the first attempt's result instead of being stored
twice.

A producer sends over a session (``broker_adapter.producing``; docs/broker.md, "Producer sessions"): one
``SendStream`` to the leader, shared
by every concurrent send of the producer, whatever their topics. The client encodes each message in its stored
form (``core.message.encode_send``), so the leader checks and appends the bytes without re-encoding them; sends
queued while a batch is being written go out together in the next one, and each caller gets its own results.
A message with a delivery time goes through the unary ``Send``.

The blocking clients are thread-safe: use one per process, shared by its threads. Sends that threads make
concurrently through one ``Producer`` are packed together (``dledger.combiner``) and handed to the session on
the producer's event-loop thread (``dledger.loop_thread``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from broker_adapter.core import topics
from broker_adapter.core.model import SendResult
from broker_adapter.core.sqlfilter import compile_filter
from broker_adapter.producing import MAX_PACK, Numbering, Placed, Sessions, results, stored_of
from broker_adapter.pulled import PulledMessage
from broker_adapter.pulled import decode as decode_pulled
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger.combiner import Combiner
from dledger.connections import AsyncChannels, Channels
from dledger.errors import DLedgerError
from dledger.loop_thread import LoopThread
from dledger.routing import Attempts, Router
from dledger.security.config import ClientSecurity
from dledger.security.tls import client_credentials

# Calls that change the broker's state; the others are reads, which never have an "unknown outcome".
_WRITES = frozenset({"Send", "CreateTopic", "CommitOffset"})


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic: str
    queues: int
    max_offsets: tuple[int, ...]


def _items(items: Sequence[bytes | tuple[bytes, str | None, Sequence[str] | None]]):
    for item in items:
        body, tags, keys = (item, None, None) if isinstance(item, bytes | bytearray) else item
        yield bytes(body), tags, keys


def _send_results(r: broker_pb2.SendResponse, msgs: list[broker_pb2.OutgoingMessage]) -> list[SendResult]:
    return [
        SendResult(x.msg_id or m.msg_id, x.topic, x.queue_id, x.queue_offset, x.commitlog_offset, x.duplicate)
        for x, m in zip(r.results, msgs, strict=True)
    ]


def _topics(r: broker_pb2.ListTopicsResponse) -> list[TopicInfo]:
    return [TopicInfo(t.topic, t.queues, tuple(t.max_offsets)) for t in r.topics]


def _pulled(r: broker_pb2.PullResponse) -> list[PulledMessage]:
    """Messages of a raw pull (``broker_adapter.pulled``): the server sent the stored bytes, decoded here once."""
    return decode_pulled(r.raw, r.raw_count)


def _pull_request(
    topic, queue_id, offset, max_messages, wait_ms, allow_follower, sql_filter=None, member=("", "")
) -> broker_pb2.PullRequest:
    """``member``: (consumer group, client id) of a consumer's pull, so the group lists it among its members
    (``broker_adapter/members.py``); empty for an anonymous read."""
    return broker_pb2.PullRequest(
        topic=topic,
        queue_id=queue_id,
        offset=offset,
        max_messages=max_messages,
        max_wait_ms=wait_ms,
        allow_follower=allow_follower,
        raw=True,
        filter=sql_filter or "",
        consumer_group=member[0],
        client_id=member[1],
    )


def consumer_client_id() -> str:
    """A consumer's id among its group's members: host, process and a per-instance suffix, as RocketMQ's
    clients name themselves (``host@pid#...``)."""
    return f"{socket.gethostname()}@{os.getpid()}#{uuid.uuid4().hex[:8]}"


class _GroupMember:
    """What ``Consumer`` and ``AsyncConsumer`` share: their group, filter and name among the group's members."""

    def _join(self, group: str, sql_filter: str | None, client_id: str | None) -> None:
        self.group = group
        self.sql_filter = _checked_filter(sql_filter)
        self.client_id = client_id or consumer_client_id()

    def _member_pull(
        self, topic: str, queue_id: int, offset: int, max_messages: int, wait_ms: int, allow_follower: bool
    ) -> broker_pb2.PullRequest:
        """A pull that names this consumer, so the group lists it among its members while it pulls."""
        return _pull_request(
            topic,
            queue_id,
            offset,
            max_messages,
            wait_ms,
            allow_follower,
            self.sql_filter,
            (self.group, self.client_id),
        )


def _checked_filter(sql_filter: str | None) -> str | None:
    """A consumer's SQL92 filter, parsed once here so a bad one fails at construction (``FilterSyntaxError``,
    a ValueError naming the position); the server parses and applies it (docs/broker.md, "Filters")."""
    if sql_filter is not None and sql_filter.strip():
        compile_filter(sql_filter)
        return sql_filter.strip()
    return None


def _start_offsets(info: TopicInfo | None, topic: str, committed: list[int | None], from_beginning: bool):
    if info is None:
        raise DLedgerError(f"NOT_FOUND: unknown topic {topic!r}")
    return {
        q: c if c is not None else (0 if from_beginning else info.max_offsets[q])
        for q, c in enumerate(committed)
    }


class _Calls:
    """What the blocking and asyncio connections share: the group's addresses, the leader of the moment, and
    how one broker method is tried (``dledger/connections.py`` runs the tries)."""

    writes: frozenset[str] = _WRITES  # calls that change state (an unknown outcome: retried only if allowed)

    def __init__(
        self,
        servers: Sequence[str],
        timeout_s: float = 10.0,
        retry_for_s: float = 20.0,
        security: ClientSecurity | None = None,
    ):
        """``security``: CA and access keys of a secure group (default: from the environment, docs/security.md)."""
        if not servers:
            raise ValueError("at least one server address is needed")
        self._credentials = client_credentials(security)
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self._router = Router(self.servers)

    def _attempts(self, method: str, retry_unknown: bool, address: str | None) -> Attempts:
        return self._router.attempts(
            self.retry_for_s, method, retry_unknown=retry_unknown, address=address, retry_pinned=True
        )

    def _invoke(self, method: str, request):
        """One try of ``method`` on the node at an address (what ``Channels.call`` runs)."""
        return lambda target, _: getattr(self.stub(target), method)(request, timeout=self.timeout_s)

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        raise NotImplementedError


class BrokerConnection(_Calls):
    """Channels to the group's nodes and the retry rules every broker call shares; thread-safe."""

    def __init__(self, servers: Sequence[str], **kw):
        super().__init__(servers, **kw)
        self._channels = Channels(self._credentials)

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self._channels.stub(address, broker_pb2_grpc.BrokerStub)

    def call(self, method: str, request, *, retry_unknown: bool, address: str | None = None):
        """Call ``method`` on the leader (or only on ``address``), following redirects; ``retry_unknown`` says
        whether a write whose outcome is unknown may be sent again (true for idempotent requests)."""
        write = method in self.writes
        attempts = self._attempts(method, retry_unknown, address)
        invoke = self._invoke(method, request)
        return self._channels.call(
            attempts, invoke, write=write, rpc_timeout_s=self.timeout_s, remember_leader=write
        )

    def close(self) -> None:
        self._channels.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- administration --------------------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int) -> TopicInfo:
        r = self.call(
            "CreateTopic", broker_pb2.CreateTopicRequest(topic=topic, queues=queues), retry_unknown=True
        )
        return TopicInfo(r.topic, r.queues, (0,) * r.queues)

    def list_topics(self) -> list[TopicInfo]:
        return _topics(self.call("ListTopics", broker_pb2.ListTopicsRequest(), retry_unknown=True))

    def route(self) -> broker_pb2.RouteResponse:
        return self.call("Route", broker_pb2.RouteRequest(), retry_unknown=True)

    def set_group_settings(self, group: str, **settings) -> dict:
        """Replace a consumer group's delivery settings (``broker_adapter.core.groups.GroupSettings`` fields: fifo,
        max_attempts, backoff, levels_ms, initial_ms, max_ms, multiplier); returns those now in force."""
        r = self.call(
            "SetGroupSettings", broker_pb2.GroupSettingsRequest(group=group, **settings), retry_unknown=True
        )
        return json.loads(r.settings_json)


class Producer(BrokerConnection, Numbering):
    """Sends messages; queue selection round robin, or by key hash when a message has keys. Thread-safe:
    concurrent sends, to any topics, are packed together onto the producer's session."""

    def __init__(self, servers: Sequence[str], producer_id: str | None = None, **kw):
        BrokerConnection.__init__(self, servers, **kw)
        Numbering.__init__(self, producer_id)
        self._loop = LoopThread(f"producer-{self.producer_id[:8]}")
        self._aio_channels = AsyncChannels(
            self._credentials
        )  # the loop thread's own (aio channels are per loop)
        self._sessions = Sessions(
            self._router,
            self.timeout_s,
            self.retry_for_s,
            lambda address: self._aio_channels.stub(address, broker_pb2_grpc.BrokerStub),
        )
        self._packer: Combiner[bytes, Placed] = Combiner(self._send_now, max_items=MAX_PACK)

    def _queue_count(self, topic: str) -> int:
        n = self._queues.get(topic)
        return (
            n
            if n is not None
            else self._learn_topics(((t.topic, t.queues) for t in self.list_topics()), topic)
        )

    def outgoing(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: Sequence[str] | None = None,
        queue_id: int | None = None,
    ) -> broker_pb2.OutgoingMessage:
        """A numbered message (its sequence is fixed now, so every retry of it is recognised), for the queue
        ``queue_id`` or, by default, one chosen by key or round robin."""
        if queue_id is not None:
            m = self._number(1, body, tags, keys)
            m.queue_id = queue_id
            return m
        return self._number(self._queue_count(topic), body, tags, keys)

    def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: Sequence[str] | None = None,
        deliver_at_ms: int = 0,
    ) -> SendResult:
        """Send one message; with ``deliver_at_ms`` (ms since the epoch) it is delivered then, not before."""
        if deliver_at_ms:
            m = self.outgoing(topic, body, tags, keys)
            m.delivery_timestamp = deliver_at_ms
            return self.send_messages(topic, [m])[0]
        raw, msg_id, queue_id = self._stored(topic, self._queue_count(topic), bytes(body), tags, keys)
        return results(topic, [(msg_id, queue_id)], self._packer.submit([raw]))[0]

    def send_batch(
        self, topic: str, items: Sequence[bytes | tuple[bytes, str | None, Sequence[str] | None]]
    ) -> list[SendResult]:
        """Send many messages as consecutive entries; an item is a body or (body, tags, keys)."""
        queues = self._queue_count(topic)
        stored = [self._stored(topic, queues, *item) for item in _items(items)]
        placed = self._packer.submit([raw for raw, _, _ in stored])
        return results(topic, [(i, q) for _, i, q in stored], placed)

    def send_messages(self, topic: str, msgs: list[broker_pb2.OutgoingMessage]) -> list[SendResult]:
        """Send messages built with ``outgoing``; those with a delivery time through the unary ``Send``."""
        if any(m.delivery_timestamp for m in msgs):
            r = self.call("Send", broker_pb2.SendRequest(topic=topic, messages=msgs), retry_unknown=True)
            return _send_results(r, msgs)
        placed = self._packer.submit([stored_of(topic, m) for m in msgs])
        return results(topic, [(m.msg_id, m.queue_id) for m in msgs], placed)

    def _send_now(self, raws: list[bytes]) -> Sequence[Placed]:
        return self._loop.run(self._sessions.send(raws))

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            self._loop.run(self._close_sessions())
            self._loop.close()
        BrokerConnection.close(self)

    async def _close_sessions(self) -> None:
        await self._sessions.close()
        await self._aio_channels.close()


class Consumer(BrokerConnection, _GroupMember):
    """Pulls messages of a consumer group; committed offsets live in the replicated log. Thread-safe.
    ``sql_filter``: a SQL92 expression over properties and TAGS; only matching messages are pulled."""

    def __init__(
        self,
        servers: Sequence[str],
        group: str,
        *,
        sql_filter: str | None = None,
        client_id: str | None = None,
        **kw,
    ):
        """``client_id``: this consumer's name among the group's members, which the group lists while it pulls
        (default ``consumer_client_id()``)."""
        super().__init__(servers, **kw)
        self._join(group, sql_filter, client_id)

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        allow_follower: bool = False,
        address: str | None = None,
    ) -> list[PulledMessage]:
        return self._pull(topic, queue_id, offset, max_messages, wait_ms, allow_follower, address)[0]

    def pull_raw(self, topic: str, queue_id: int, offset: int, max_messages: int = 32) -> tuple[bytes, int]:
        """What ``pull`` returns from the leader, undecoded: the messages as the CommitLog stores them,
        concatenated, and how many there are (for a reader that decodes them its own way:
        ``spark/datasource/columns.py``)."""
        req = _pull_request(topic, queue_id, offset, max_messages, 0, False, self.sql_filter)
        r = self.call("Pull", req, retry_unknown=True)
        return r.raw, r.raw_count

    def _pull(
        self, topic, queue_id, offset, max_messages, wait_ms=0, allow_follower=False, address=None
    ) -> tuple[list[PulledMessage], int]:
        """The pulled messages and the offset after those the server looked at (past filtered-out ones)."""
        req = self._member_pull(topic, queue_id, offset, max_messages, wait_ms, allow_follower)
        r = self.call("Pull", req, retry_unknown=True, address=address)
        return _pulled(r), r.next_offset

    def later(self, m: PulledMessage) -> broker_pb2.LaterResponse:
        """This group failed ``m`` now: it comes back in ``retry_topic`` after the group's backoff, or goes to
        ``%DLQ%<group>`` past its attempts (docs/rocketmq.md, Delivery). At least once: a retried call whose
        outcome was unknown may schedule it twice."""
        req = broker_pb2.LaterRequest(
            group=self.group, topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset
        )
        return self.call("Later", req, retry_unknown=True)

    @property
    def retry_topic(self) -> str:
        """Where this group's messages come back after ``later`` (read it like any topic)."""
        return topics.retry_topic(self.group)

    def commit(self, topic: str, queue_id: int, offset: int) -> None:
        req = broker_pb2.CommitOffsetRequest(group=self.group, topic=topic, queue_id=queue_id, offset=offset)
        self.call("CommitOffset", req, retry_unknown=True)

    def committed(self, topic: str, queue_id: int) -> int | None:
        req = broker_pb2.QueryOffsetRequest(group=self.group, topic=topic, queue_id=queue_id)
        try:
            r = self.call("QueryOffset", req, retry_unknown=True)
        except DLedgerError as e:
            if "unknown consumer group" in str(e):
                return None
            raise
        return r.offset if r.found else None

    def messages(
        self,
        topic: str,
        *,
        from_beginning: bool = True,
        batch: int = 256,
        wait_ms: int = 200,
        idle_s: float = 1.0,
        limit: int | None = None,
    ) -> Iterator[PulledMessage]:
        """Every queue of ``topic`` from the group's committed offsets (or the start / the end when the group
        never committed); each pulled batch's offset is committed once the caller has taken it and asks for
        the next one. Ends after ``idle_s`` with nothing new, or after ``limit`` messages."""
        info = {t.topic: t for t in self.list_topics()}.get(topic)
        queues = info.queues if info is not None else 0
        offsets = _start_offsets(
            info, topic, [self.committed(topic, q) for q in range(queues)], from_beginning
        )
        taken = 0
        idle_since = time.monotonic()
        # While the caller takes a batch, the next queue's pull is already under way (one at a time, on a helper
        # thread; the server reads and sends while this side decodes): only after a batch that had messages.
        ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer-pull-ahead")
        pending: tuple[int, int, Future[tuple[list[PulledMessage], int]]] | None = None
        try:
            while limit is None or taken < limit:
                got_any = False
                for q in range(queues):
                    if pending is not None and pending[:2] == (q, offsets[q]):
                        msgs, after = pending[2].result()
                    else:
                        msgs, after = self._pull(topic, q, offsets[q], batch, 0)
                    pending = None
                    if msgs:
                        nq = (q + 1) % queues
                        at = after if nq == q else offsets[nq]
                        pending = (nq, at, ahead.submit(self._pull, topic, nq, at, batch, 0))
                    for m in msgs:
                        yield m
                        taken += 1
                        if limit is not None and taken >= limit:
                            offsets[q] = m.queue_offset + 1
                            self.commit(topic, q, offsets[q])
                            return
                    if after > offsets[q]:
                        got_any = True  # past what was taken and what the filter passed over
                        offsets[q] = after
                        self.commit(topic, q, offsets[q])
                if got_any:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > idle_s:
                    return
                else:
                    # Long-poll one queue so an idle loop does not spin.
                    self.pull(topic, 0, offsets[0], 1, wait_ms=wait_ms)
        finally:
            ahead.shutdown(wait=False, cancel_futures=True)


class AsyncBrokerConnection(_Calls):
    """asyncio: one channel per node, concurrent calls multiplexed over it; the same retry rules."""

    def __init__(self, servers: Sequence[str], **kw):
        super().__init__(servers, **kw)
        self._channels = AsyncChannels(self._credentials)

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self._channels.stub(address, broker_pb2_grpc.BrokerStub)

    async def call(self, method: str, request, *, retry_unknown: bool, address: str | None = None):
        """As ``BrokerConnection.call``."""
        write = method in self.writes
        attempts = self._attempts(method, retry_unknown, address)
        invoke = self._invoke(method, request)
        return await self._channels.call(
            attempts, invoke, write=write, rpc_timeout_s=self.timeout_s, remember_leader=write
        )

    async def close(self) -> None:
        await self._channels.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def create_topic(self, topic: str, queues: int) -> TopicInfo:
        req = broker_pb2.CreateTopicRequest(topic=topic, queues=queues)
        r = await self.call("CreateTopic", req, retry_unknown=True)
        return TopicInfo(r.topic, r.queues, (0,) * r.queues)

    async def list_topics(self) -> list[TopicInfo]:
        return _topics(await self.call("ListTopics", broker_pb2.ListTopicsRequest(), retry_unknown=True))

    async def route(self) -> broker_pb2.RouteResponse:
        return await self.call("Route", broker_pb2.RouteRequest(), retry_unknown=True)

    async def set_group_settings(self, group: str, **settings) -> dict:
        """``BrokerConnection.set_group_settings``, async."""
        r = await self.call(
            "SetGroupSettings", broker_pb2.GroupSettingsRequest(group=group, **settings), retry_unknown=True
        )
        return json.loads(r.settings_json)


class AsyncProducer(AsyncBrokerConnection, Numbering):
    """``Producer`` for asyncio: concurrent sends, to any topics, share the producer's session."""

    def __init__(self, servers: Sequence[str], producer_id: str | None = None, **kw):
        AsyncBrokerConnection.__init__(self, servers, **kw)
        Numbering.__init__(self, producer_id)
        self._sessions = Sessions(self._router, self.timeout_s, self.retry_for_s, self.stub)

    async def _queue_count(self, topic: str) -> int:
        n = self._queues.get(topic)
        return (
            n
            if n is not None
            else self._learn_topics(((t.topic, t.queues) for t in await self.list_topics()), topic)
        )

    async def outgoing(
        self, topic: str, body: bytes, tags: str | None = None, keys: Sequence[str] | None = None
    ) -> broker_pb2.OutgoingMessage:
        return self._number(await self._queue_count(topic), body, tags, keys)

    async def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: Sequence[str] | None = None,
        deliver_at_ms: int = 0,
    ) -> SendResult:
        """Send one message; with ``deliver_at_ms`` (ms since the epoch) it is delivered then, not before."""
        if deliver_at_ms:
            m = await self.outgoing(topic, body, tags, keys)
            m.delivery_timestamp = deliver_at_ms
            return (await self.send_messages(topic, [m]))[0]
        queues = self._queues.get(topic) or await self._queue_count(topic)
        raw, msg_id, queue_id = self._stored(topic, queues, bytes(body), tags, keys)
        return results(topic, [(msg_id, queue_id)], await self._sessions.send([raw]))[0]

    async def send_batch(
        self, topic: str, items: Sequence[bytes | tuple[bytes, str | None, Sequence[str] | None]]
    ) -> list[SendResult]:
        queues = await self._queue_count(topic)
        stored = [self._stored(topic, queues, *item) for item in _items(items)]
        placed = await self._sessions.send([raw for raw, _, _ in stored])
        return results(topic, [(i, q) for _, i, q in stored], placed)

    async def send_messages(self, topic: str, msgs: list[broker_pb2.OutgoingMessage]) -> list[SendResult]:
        """Send messages built with ``outgoing``; those with a delivery time through the unary ``Send``."""
        if any(m.delivery_timestamp for m in msgs):
            req = broker_pb2.SendRequest(topic=topic, messages=msgs)
            return _send_results(await self.call("Send", req, retry_unknown=True), msgs)
        placed = await self._sessions.send([stored_of(topic, m) for m in msgs])
        return results(topic, [(m.msg_id, m.queue_id) for m in msgs], placed)

    async def close(self) -> None:
        await self._sessions.close()
        await AsyncBrokerConnection.close(self)


class AsyncConsumer(AsyncBrokerConnection, _GroupMember):
    """``Consumer`` for asyncio."""

    def __init__(
        self,
        servers: Sequence[str],
        group: str,
        *,
        sql_filter: str | None = None,
        client_id: str | None = None,
        **kw,
    ):
        super().__init__(servers, **kw)
        self._join(group, sql_filter, client_id)

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        allow_follower: bool = False,
        address: str | None = None,
    ) -> list[PulledMessage]:
        return (await self._pull(topic, queue_id, offset, max_messages, wait_ms, allow_follower, address))[0]

    async def _pull(
        self, topic, queue_id, offset, max_messages, wait_ms=0, allow_follower=False, address=None
    ) -> tuple[list[PulledMessage], int]:
        """As ``Consumer._pull``."""
        req = self._member_pull(topic, queue_id, offset, max_messages, wait_ms, allow_follower)
        r = await self.call("Pull", req, retry_unknown=True, address=address)
        return _pulled(r), r.next_offset

    async def later(self, m: PulledMessage) -> broker_pb2.LaterResponse:
        """``Consumer.later``, async."""
        req = broker_pb2.LaterRequest(
            group=self.group, topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset
        )
        return await self.call("Later", req, retry_unknown=True)

    @property
    def retry_topic(self) -> str:
        return topics.retry_topic(self.group)

    async def commit(self, topic: str, queue_id: int, offset: int) -> None:
        req = broker_pb2.CommitOffsetRequest(group=self.group, topic=topic, queue_id=queue_id, offset=offset)
        await self.call("CommitOffset", req, retry_unknown=True)

    async def committed(self, topic: str, queue_id: int) -> int | None:
        req = broker_pb2.QueryOffsetRequest(group=self.group, topic=topic, queue_id=queue_id)
        try:
            r = await self.call("QueryOffset", req, retry_unknown=True)
        except DLedgerError as e:
            if "unknown consumer group" in str(e):
                return None
            raise
        return r.offset if r.found else None

    async def messages(
        self,
        topic: str,
        *,
        from_beginning: bool = True,
        batch: int = 256,
        wait_ms: int = 200,
        idle_s: float = 1.0,
        limit: int | None = None,
    ) -> AsyncIterator[PulledMessage]:
        """As ``Consumer.messages``."""
        info = {t.topic: t for t in await self.list_topics()}.get(topic)
        queues = info.queues if info is not None else 0
        committed = [await self.committed(topic, q) for q in range(queues)]
        offsets = _start_offsets(info, topic, committed, from_beginning)
        taken = 0
        idle_since = time.monotonic()
        pending: tuple[int, int, asyncio.Task[tuple[list[PulledMessage], int]]] | None = (
            None  # as in Consumer
        )
        try:
            while limit is None or taken < limit:
                got_any = False
                for q in range(queues):
                    if pending is not None and pending[:2] == (q, offsets[q]):
                        msgs, after = await pending[2]
                    else:
                        msgs, after = await self._pull(topic, q, offsets[q], batch, 0)
                    pending = None
                    if msgs:
                        nq = (q + 1) % queues
                        at = after if nq == q else offsets[nq]
                        pending = (nq, at, asyncio.ensure_future(self._pull(topic, nq, at, batch, 0)))
                    for m in msgs:
                        yield m
                        taken += 1
                        if limit is not None and taken >= limit:
                            offsets[q] = m.queue_offset + 1
                            await self.commit(topic, q, offsets[q])
                            return
                    if after > offsets[q]:
                        got_any = True  # as in Consumer.messages
                        offsets[q] = after
                        await self.commit(topic, q, offsets[q])
                if got_any:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > idle_s:
                    return
                else:
                    await self.pull(topic, 0, offsets[0], 1, wait_ms=wait_ms)
        finally:
            if pending is not None:
                task = pending[2]
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: a read nobody waits for any more
