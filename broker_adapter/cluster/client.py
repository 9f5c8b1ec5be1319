"""Clients of a whole cluster: many broker groups found through the name servers (docs/cluster.md).

``ClusterProducer`` asks the name servers for a topic's route (every group that has the topic, with its queue
count), spreads sends round robin over all of the topic's queues in all groups (or by key hash), and talks to each
group through that group's own ``Producer``, which follows the group's leader. A group that fails a send is
skipped for the next ones until the route is refreshed (every ``route_ttl_s``, and at once after a failure), as
RocketMQ's producers avoid a failed broker.

``ClusterConsumer`` is one member of a consumer group: it heartbeats to every name server, lists the group's
live members, and takes its share of the topic's queues (``allocate``: average or round robin over the sorted
queue list, the same on every member, so the shares never overlap once members agree). When a member joins or
dies, the others see it within one heartbeat expiry and rebalance; a queue that moves is read by its new owner
from the group's committed offset (replicated in that group's log). Delivery is at least once: a message taken
by the old owner but not yet committed when the queue moved is delivered again, never lost.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from broker_adapter.client import Consumer, Producer, SendResult
from broker_adapter.nameserver.client import NameServerClient
from broker_adapter.nameserver.registry import GroupRoute
from broker_adapter.pulled import PulledMessage
from dledger.errors import DLedgerError, InvalidRequestError
from dledger.security.config import ClientSecurity

ROUTE_TTL_S = 30.0  # RocketMQ's clients refresh routes every 30 s
AVOID_S = 10.0  # how long a group that failed a send is skipped


@dataclass(frozen=True, slots=True, order=True)
class ClusterQueue:
    group: str
    queue_id: int


def allocate(
    strategy: str, queues: Sequence[ClusterQueue], members: Sequence[str], me: str
) -> list[ClusterQueue]:
    """This member's share of ``queues``: the same answer on every member given the same inputs.

    ``average``: contiguous blocks, the first ``len(queues) % len(members)`` members one more (RocketMQ's
    AllocateMessageQueueAveragely); ``round_robin``: every n-th queue (AllocateMessageQueueAveragelyByCircle)."""
    members = sorted(members)
    queues = sorted(queues)
    if me not in members or not queues:
        return []
    n, k = len(members), members.index(me)
    if strategy == "round_robin":
        return list(queues[k::n])
    if strategy != "average":
        raise InvalidRequestError(f"allocation strategy {strategy!r} is unknown: use average or round_robin")
    base, extra = divmod(len(queues), n)
    start = k * base + min(k, extra)
    return list(queues[start : start + base + (1 if k < extra else 0)])


class _Routes:
    """A topic's route from the name servers, cached and refreshed."""

    def __init__(self, nameservers: NameServerClient, ttl_s: float):
        self.ns = nameservers
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, list[GroupRoute]]] = {}

    def get(self, topic: str, refresh: bool = False) -> list[GroupRoute]:
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[0] < self.ttl_s:
            return cached[1]
        routes = self.ns.route(topic)
        with self._lock:
            self._routes[topic] = (now, routes)
        return routes


def _addresses(route: GroupRoute) -> list[str]:
    """Leader first, so the group's client reaches it without a redirect."""
    rest = [a for a in route.addresses if a != route.leader_address]
    return [route.leader_address, *rest] if route.leader_address else rest


class ClusterProducer:
    """Thread-safe; one per process, shared by threads, as with ``Producer``."""

    def __init__(
        self,
        nameservers: Sequence[str],
        producer_id: str | None = None,
        route_ttl_s: float = ROUTE_TTL_S,
        security: ClientSecurity | None = None,
    ):
        """``security``: the cluster's CA and an access key, for the name servers and every group (default:
        from the environment, docs/security.md)."""
        self.producer_id = producer_id or uuid.uuid4().hex
        self.security = security
        self.nameservers = NameServerClient(nameservers, security=security)
        self._routes = _Routes(self.nameservers, route_ttl_s)
        self._lock = threading.Lock()
        self._producers: dict[str, Producer] = {}
        self._avoid: dict[str, float] = {}  # group -> until (monotonic)
        self._rr = itertools.count()

    def _producer(self, route: GroupRoute) -> Producer:
        with self._lock:
            p = self._producers.get(route.group)
            if p is None:
                # One producer id per group: sequences (the idempotence key) are per producer and per group.
                p = self._producers[route.group] = Producer(
                    _addresses(route), producer_id=f"{self.producer_id}@{route.group}", security=self.security
                )
            return p

    def _queues(self, topic: str, refresh: bool) -> tuple[list[GroupRoute], list[ClusterQueue]]:
        routes = self._routes.get(topic, refresh)
        return routes, [ClusterQueue(r.group, q) for r in routes for q in range(r.queues)]

    def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: Sequence[str] | None = None,
        retries: int = 2,
    ) -> tuple[str, SendResult]:
        """Send one message; returns (group, result). Retries on another group when one fails."""
        last: DLedgerError | None = None
        refresh = False
        for _ in range(retries + 1):
            routes, queues = self._queues(topic, refresh)
            by_group = {r.group: r for r in routes}
            now = time.monotonic()
            usable = [q for q in queues if self._avoid.get(q.group, 0) <= now] or queues
            if keys:
                target = usable[zlib.crc32(keys[0].encode()) % len(usable)]
            else:
                target = usable[next(self._rr) % len(usable)]
            producer = self._producer(by_group[target.group])
            msg = producer.outgoing(topic, bytes(body), tags, keys, queue_id=target.queue_id)
            try:
                return target.group, producer.send_messages(topic, [msg])[0]
            except DLedgerError as err:
                last = err
                self._avoid[target.group] = time.monotonic() + AVOID_S
                refresh = True
        assert last is not None
        raise last

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for p in producers:
            p.close()
        self.nameservers.close()

    def __enter__(self) -> ClusterProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClusterConsumer:
    """One member of consumer group ``group`` reading ``topic`` across every broker group that has it.

    ``rebalance()`` heartbeats, lists members and recomputes this member's queues; ``messages()`` calls it every
    ``rebalance_s`` while it reads, and commits each batch's offset in the owning group's log."""

    def __init__(
        self,
        nameservers: Sequence[str],
        group: str,
        topic: str,
        client_id: str | None = None,
        strategy: str = "average",
        rebalance_s: float = 1.0,
        route_ttl_s: float = 5.0,
        security: ClientSecurity | None = None,
    ):
        """``security``: as ``ClusterProducer``'s."""
        allocate(strategy, [], [], "")  # reject an unknown strategy now, not at the first rebalance
        self.security = security
        self.group = group
        self.topic = topic
        self.client_id = client_id or f"{uuid.uuid4().hex[:12]}"
        self.strategy = strategy
        self.rebalance_s = rebalance_s
        self.nameservers = NameServerClient(nameservers, security=security)
        self._routes = _Routes(self.nameservers, route_ttl_s)
        self._consumers: dict[str, Consumer] = {}
        self._route_of: dict[str, GroupRoute] = {}
        self.assigned: list[ClusterQueue] = []
        self._offsets: dict[ClusterQueue, int] = {}
        self.rebalances = 0  # times the assignment changed (for status lines and tests)

    def _consumer(self, group: str) -> Consumer:
        c = self._consumers.get(group)
        if c is None:
            c = self._consumers[group] = Consumer(
                _addresses(self._route_of[group]),
                self.group,
                security=self.security,
                client_id=self.client_id,  # one name for it in the name servers and in every group
            )
        return c

    def rebalance(self) -> list[ClusterQueue]:
        self.nameservers.consumer_heartbeat(self.group, self.client_id)
        members = self.nameservers.consumers(self.group)
        if self.client_id not in members:  # the name server we asked had not seen our heartbeat yet
            members = sorted({*members, self.client_id})
        routes = self._routes.get(self.topic)
        self._route_of = {r.group: r for r in routes}
        queues = [ClusterQueue(r.group, q) for r in routes for q in range(r.queues)]
        mine = allocate(self.strategy, queues, members, self.client_id)
        if mine != self.assigned:
            self.rebalances += 1
            for q in set(self._offsets) - set(mine):
                del self._offsets[q]  # its new owner continues from the committed offset
            self.assigned = mine
        return mine

    def _start(self, q: ClusterQueue) -> int:
        off = self._offsets.get(q)
        if off is None:
            c = self._consumer(q.group)
            committed = c.committed(self.topic, q.queue_id)
            off = self._offsets[q] = committed if committed is not None else 0
        return off

    def messages(
        self, *, batch: int = 256, idle_s: float = 2.0, limit: int | None = None
    ) -> Iterator[tuple[ClusterQueue, PulledMessage]]:
        """(queue, message) from this member's queues; a batch's offset is committed when the caller asks for
        the next batch. Ends after ``idle_s`` with nothing new, or after ``limit`` messages."""
        taken = 0
        idle_since = time.monotonic()
        next_rebalance = 0.0
        while limit is None or taken < limit:
            if time.monotonic() >= next_rebalance:
                self.rebalance()
                next_rebalance = time.monotonic() + self.rebalance_s
            got = False
            for q in list(self.assigned):
                if q not in self.assigned:
                    continue
                c = self._consumer(q.group)
                msgs = c.pull(self.topic, q.queue_id, self._start(q), batch)
                if not msgs:
                    continue
                got = True
                for m in msgs:
                    yield q, m
                    taken += 1
                    if limit is not None and taken >= limit:
                        self._commit(q, m.queue_offset + 1)
                        return
                self._commit(q, msgs[-1].queue_offset + 1)
            if got:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_s:
                return
            else:
                time.sleep(0.05)

    def _commit(self, q: ClusterQueue, offset: int) -> None:
        if q in self._offsets:  # still ours: a queue that moved away is left to its new owner
            self._offsets[q] = offset
            self._consumer(q.group).commit(self.topic, q.queue_id, offset)

    def close(self) -> None:
        self.nameservers.unregister_consumer(self.group, self.client_id)
        for c in self._consumers.values():
            c.close()
        self.nameservers.close()

    def __enter__(self) -> ClusterConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
