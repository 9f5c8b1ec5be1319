"""Broker clients: ``Producer`` (idempotent sends that follow leader changes) and ``Consumer`` (pulls, long
polling, and a group iterator whose offsets are committed through the log).

Both talk to any node of the group. A write that reaches a follower is redirected by the "leader-address"
trailer; an unreachable node or an election in progress is retried on the next server with a bounded backoff.
A producer numbers its messages (producer id + sequence) once, before the first attempt, so a retry after a
timeout or a lost leader is recognised by the leader and answered with the first attempt's result instead of
being stored twice.
"""

from __future__ import annotations

import itertools
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from dledger.errors import DLedgerError, NotLeaderError, OutcomeUnknownError, UnavailableError
from dledger.transport import convert
from dledger.v1 import broker_pb2, broker_pb2_grpc


@dataclass(frozen=True, slots=True)
class SendResult:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PulledMessage:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    msg_id: str
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    store_timestamp: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic: str
    queues: int
    max_offsets: tuple[int, ...]


class BrokerConnection:
    """Channels to the group's nodes and the retry rules every broker call shares."""

    def __init__(self, servers: Sequence[str], timeout_s: float = 10.0, retry_for_s: float = 20.0):
        if not servers:
            raise ValueError("at least one server address is needed")
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerStub] = {}
        self._leader: str | None = None
        self._next = itertools.cycle(range(len(self.servers)))

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        s = self._stubs.get(address)
        if s is None:
            ch = grpc.insecure_channel(address)
            self._channels[address] = ch
            s = self._stubs[address] = broker_pb2_grpc.BrokerStub(ch)
        return s

    def _target(self) -> str:
        if self._leader is not None:
            return self._leader
        return self.servers[next(self._next)]

    def call(self, method: str, request, *, retry_unknown: bool, address: str | None = None):
        """Call ``method`` on the leader (or ``address``), following redirects; ``retry_unknown`` says whether
        a write whose outcome is unknown may be sent again (true for idempotent requests)."""
        deadline = time.monotonic() + self.retry_for_s
        backoff = 0.01  # as DLedgerClient: 10 ms doubling to 200 ms, so a retry lands soon after an election
        attempt = 0
        while True:
            attempt += 1
            target = address or self._target()
            try:
                return getattr(self.stub(target), method)(request, timeout=self.timeout_s)
            except grpc.RpcError as e:
                err = _error(e)
            if isinstance(err, NotLeaderError) and address is None:
                hint = err.leader_hint
                self._leader = hint if hint and ":" in hint else None
                if self._leader is not None and attempt < 3:
                    continue  # redirected: go straight there
            elif isinstance(err, OutcomeUnknownError):
                if not retry_unknown:
                    raise err
                self._leader = None
            elif isinstance(err, UnavailableError):
                self._leader = None
            else:
                raise err
            if time.monotonic() + backoff > deadline:
                raise err
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.2)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

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
        r = self.call("ListTopics", broker_pb2.ListTopicsRequest(), retry_unknown=True)
        return [TopicInfo(t.topic, t.queues, tuple(t.max_offsets)) for t in r.topics]

    def route(self) -> broker_pb2.RouteResponse:
        return self.call("Route", broker_pb2.RouteRequest(), retry_unknown=True)


def _error(e: grpc.RpcError) -> DLedgerError:
    md = {k: v for k, v in (e.trailing_metadata() or ())}
    code = e.code()
    if (
        code == grpc.StatusCode.UNAVAILABLE
        and convert.OUTCOME_UNKNOWN_KEY not in md
        and convert.REFUSED_KEY not in md
    ):
        # The connection failed: the request may or may not have reached the node.
        return OutcomeUnknownError(f"{e.details()}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return OutcomeUnknownError(f"deadline exceeded: {e.details()}")
    return convert.error_from_status(code, e.details() or "", md)


class Producer(BrokerConnection):
    """Sends messages; queue selection round robin, or by key hash when a message has keys."""

    def __init__(self, servers: Sequence[str], producer_id: str | None = None, **kw):
        super().__init__(servers, **kw)
        self.producer_id = producer_id or uuid.uuid4().hex
        self._id_prefix = uuid.uuid4().hex.upper()[:22]
        self._seq = itertools.count()  # thread-safe in CPython: one producer may be shared by threads
        self._queues: dict[str, int] = {}
        self._rr = itertools.count(1)

    def _queue_count(self, topic: str) -> int:
        n = self._queues.get(topic)
        if n is None:
            for t in self.list_topics():
                self._queues[t.topic] = t.queues
            n = self._queues.get(topic)
            if n is None:
                raise DLedgerError(f"NOT_FOUND: unknown topic {topic!r}")
        return n

    def _select(self, topic: str, keys: Sequence[str] | None) -> int:
        n = self._queue_count(topic)
        if keys:
            return zlib.crc32(keys[0].encode()) % n
        return next(self._rr) % n

    def outgoing(
        self, topic: str, body: bytes, tags: str | None = None, keys: Sequence[str] | None = None
    ) -> broker_pb2.OutgoingMessage:
        """A numbered message (its sequence is fixed now, so every retry of it is recognised)."""
        seq = next(self._seq)
        return broker_pb2.OutgoingMessage(
            queue_id=self._select(topic, keys),
            body=body,
            tags=tags or "",
            keys=list(keys or ()),
            msg_id=f"{self._id_prefix}{seq:010X}",  # unique: a random prefix per producer, then the sequence
            producer_id=self.producer_id,
            sequence=seq,
            born_timestamp=int(time.time() * 1000),
        )

    def send(
        self, topic: str, body: bytes, tags: str | None = None, keys: Sequence[str] | None = None
    ) -> SendResult:
        return self.send_messages(topic, [self.outgoing(topic, body, tags, keys)])[0]

    def send_batch(
        self, topic: str, items: Sequence[bytes | tuple[bytes, str | None, Sequence[str] | None]]
    ) -> list[SendResult]:
        """Send many messages as consecutive entries; an item is a body or (body, tags, keys)."""
        msgs = []
        for item in items:
            body, tags, keys = (item, None, None) if isinstance(item, bytes | bytearray) else item
            msgs.append(self.outgoing(topic, bytes(body), tags, keys))
        return self.send_messages(topic, msgs)

    def send_messages(self, topic: str, msgs: list[broker_pb2.OutgoingMessage]) -> list[SendResult]:
        r = self.call("Send", broker_pb2.SendRequest(topic=topic, messages=msgs), retry_unknown=True)
        return [
            SendResult(
                x.msg_id or m.msg_id, x.topic, x.queue_id, x.queue_offset, x.commitlog_offset, x.duplicate
            )
            for x, m in zip(r.results, msgs, strict=True)
        ]


class Consumer(BrokerConnection):
    """Pulls messages of a consumer group; committed offsets live in the replicated log."""

    def __init__(self, servers: Sequence[str], group: str, **kw):
        super().__init__(servers, **kw)
        self.group = group

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
        req = broker_pb2.PullRequest(
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            max_messages=max_messages,
            max_wait_ms=wait_ms,
            allow_follower=allow_follower,
        )
        r = self.call("Pull", req, retry_unknown=True, address=address)
        return [
            PulledMessage(
                m.topic,
                m.queue_id,
                m.queue_offset,
                m.commitlog_offset,
                m.body,
                m.tags or None,
                tuple(m.keys),
                m.msg_id,
                dict(m.properties),
                m.born_timestamp,
                m.store_timestamp,
            )
            for m in r.messages
        ]

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
        if info is None:
            raise DLedgerError(f"NOT_FOUND: unknown topic {topic!r}")
        offsets = {}
        for q in range(info.queues):
            c = self.committed(topic, q)
            offsets[q] = c if c is not None else (0 if from_beginning else info.max_offsets[q])
        taken = 0
        idle_since = time.monotonic()
        while limit is None or taken < limit:
            got_any = False
            for q in range(info.queues):
                msgs = self.pull(topic, q, offsets[q], batch, wait_ms=0)
                for m in msgs:
                    yield m
                    taken += 1
                    if limit is not None and taken >= limit:
                        offsets[q] = m.queue_offset + 1
                        self.commit(topic, q, offsets[q])
                        return
                if msgs:
                    got_any = True
                    offsets[q] = msgs[-1].queue_offset + 1
                    self.commit(topic, q, offsets[q])
            if got_any:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_s:
                return
            else:
                # Long-poll one queue so an idle loop does not spin.
                self.pull(topic, 0, offsets[0], 1, wait_ms=wait_ms)
