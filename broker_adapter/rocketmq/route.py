"""Routes, assignments and telemetry settings: how a RocketMQ 5 client finds and configures the broker.

The whole group is one RocketMQ broker (named after the group, broker id 0, the "master") whose endpoints are
the access point the client used, as RocketMQ's proxy answers: each client sends the endpoints it was
configured with in its QueryRoute / QueryAssignment request, and what it could dial once it can dial again.
That matters beyond Python: the Python client opens one pick-first channel to a ';'-separated address list,
but grpc-js (the Node.js client) joins a list into one target it cannot resolve, so a Node.js client is given
one address and must be answered with that one. Every node serves every call and passes writes to the leader
(``forward``), which is how a failover stays invisible to a client that knows one node (or a name that
resolves to several). A request without endpoints (a raw stub) gets every node's address.

Topics accept NORMAL, FIFO, DELAY and TRANSACTION messages. A consumer's settings carry its group's replicated
delivery settings (``broker_adapter.core.groups``): ``fifo``, the delivery attempts and the retry backoff a push
consumer applies. Every push consumer is assigned every queue: pop-style consumption shares queues safely.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from rocketmq.grpc_protocol import (
    AddressScheme,
    ClientType,
    Code,
    MessageType,
    Permission,
    definition_pb2,
    service_pb2,
)

from broker_adapter.core.groups import DEFAULT as DEFAULT_GROUP
from broker_adapter.core.groups import EXPONENTIAL, GroupSettings

LONG_POLLING_S: Final = 20  # what push consumers are told to use (RocketMQ's proxy default is 20-30 s)
RECEIVE_BATCH: Final = 32
ACCEPTED_TYPES: Final = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)


def endpoints(
    addresses: Iterable[str], first: str | None = None, *, single: bool = False
) -> definition_pb2.Endpoints:
    """Every address, ``first`` (the leader's) ahead of the others: the official clients open a pick-first
    channel to a queue's endpoints, so their sends and acks reach the leader without a forwarding hop, and
    fall back to the next node when it goes away. ``single``: the first of them only, for a client that
    dialled one address (grpc-js cannot dial a list; see ``advertised`` and cluster_routes.py)."""
    addresses = list(addresses)
    out = definition_pb2.Endpoints(scheme=AddressScheme.IPv4)
    rest = sorted(set(addresses) - {first})
    ordered = [first, *rest] if first in addresses else rest
    for a in ordered[:1] if single else ordered:
        host, _, port = a.rpartition(":")
        out.addresses.add(host=host, port=int(port))
    return out


def advertised(
    access_point: definition_pb2.Endpoints, addresses: Iterable[str], leader: str | None
) -> definition_pb2.Endpoints:
    """What a client is told to dial: the endpoints it used (its access point), the leader's address moved
    first when it is among them (no forwarding hop for a multi-address client), its order kept otherwise;
    every node's address (leader first) when the request names none."""
    if not access_point.addresses:
        return endpoints(addresses, leader)
    out = definition_pb2.Endpoints()
    out.CopyFrom(access_point)
    if leader and len(out.addresses) > 1:
        listed = [f"{a.host}:{a.port}" for a in out.addresses]
        if leader in listed and listed[0] != leader:
            i = listed.index(leader)
            order = [out.addresses[i], *(a for j, a in enumerate(out.addresses) if j != i)]
            copies = [definition_pb2.Address(host=a.host, port=a.port) for a in order]
            del out.addresses[:]
            out.addresses.extend(copies)
    return out


def message_queues(
    topic: definition_pb2.Resource,
    queues: int,
    broker_name: str,
    ep: definition_pb2.Endpoints,
    accepted: Iterable[int] = ACCEPTED_TYPES,
) -> list[definition_pb2.MessageQueue]:
    """Queues 0..queues-1 of ``topic`` on one broker (a group: broker id 0) reached at ``ep``."""
    accepted = tuple(accepted)
    out = []
    for qid in range(queues):
        mq = definition_pb2.MessageQueue(id=qid, permission=Permission.READ_WRITE)
        mq.topic.CopyFrom(topic)
        mq.broker.name = broker_name
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(ep)
        mq.accept_message_types.extend(accepted)
        out.append(mq)
    return out


def assignments(queues: list[definition_pb2.MessageQueue]) -> list[definition_pb2.Assignment]:
    return [definition_pb2.Assignment(message_queue=mq) for mq in queues]


def settings_for(
    client: definition_pb2.Settings, max_body_size: int, group: GroupSettings = DEFAULT_GROUP
) -> definition_pb2.Settings:
    """The server's answer to a client's settings: the client's own, completed with what the broker decides
    (for a consumer: its group's delivery settings)."""
    out = definition_pb2.Settings()
    out.CopyFrom(client)
    policy = out.backoff_policy
    policy.Clear()
    if client.client_type == ClientType.PRODUCER:
        policy.max_attempts = 3
        policy.exponential_backoff.initial.FromMilliseconds(10)
        policy.exponential_backoff.max.FromMilliseconds(1000)
        policy.exponential_backoff.multiplier = 2.0
        out.publishing.max_body_size = max_body_size
        out.publishing.validate_message_type = True
    else:
        policy.max_attempts = group.max_attempts
        if group.backoff == EXPONENTIAL:
            policy.exponential_backoff.initial.FromMilliseconds(group.initial_ms)
            policy.exponential_backoff.max.FromMilliseconds(group.max_ms)
            policy.exponential_backoff.multiplier = group.multiplier
        else:
            for ms in group.levels_ms:
                policy.customized_backoff.next.add().FromMilliseconds(ms)
        sub = out.subscription
        sub.fifo = group.fifo
        sub.receive_batch_size = RECEIVE_BATCH
        if client.client_type == ClientType.PUSH_CONSUMER or not sub.HasField("long_polling_timeout"):
            sub.long_polling_timeout.FromSeconds(LONG_POLLING_S)
    out.metric.on = False
    return out


class Routes:
    """QueryRoute and QueryAssignment answers, serialized once and kept per (topic, queue count, leader
    address, access point): a client asks for routes every 30 s per topic and at every start, and building one
    is a protobuf message per queue. A topic created, replaced with another queue count or led by another node
    is another key; ``clear`` (a role listener) drops every answer when this node's role or term changes."""

    MAX_ENTRIES: Final = 4096

    def __init__(self, broker_name: str, addresses: Iterable[str]):
        self._broker_name = broker_name
        self._addresses = list(addresses)
        self._cache: dict[tuple[str, str, str, int, str | None, bytes], bytes] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self, *_: object) -> None:
        """Forget every answer (also a role listener: ``clear(role, term)``)."""
        self._cache.clear()

    def _answer(
        self,
        kind: str,
        topic: definition_pb2.Resource,
        queues: int,
        leader: str | None,
        access_point: definition_pb2.Endpoints | None,
    ) -> bytes:
        ap = access_point if access_point is not None else definition_pb2.Endpoints()
        key = (kind, topic.resource_namespace, topic.name, queues, leader, ap.SerializeToString())
        hit = self._cache.get(key)
        if hit is None:
            ep = advertised(ap, self._addresses, leader)
            mqs = message_queues(topic, queues, self._broker_name, ep)
            if kind == "route":
                resp = service_pb2.QueryRouteResponse(status=_OK, message_queues=mqs)
            else:
                resp = service_pb2.QueryAssignmentResponse(status=_OK, assignments=assignments(mqs))
            if len(self._cache) >= self.MAX_ENTRIES:
                self._cache.clear()
            hit = self._cache[key] = resp.SerializeToString()
        return hit

    def route(
        self,
        topic: definition_pb2.Resource,
        queues: int,
        leader: str | None,
        access_point: definition_pb2.Endpoints | None = None,
    ) -> bytes:
        """A serialized ``QueryRouteResponse`` (status OK) for ``queues`` queues of ``topic``; ``leader`` is
        the leader's address (listed first where the client listed it), None when no leader is known;
        ``access_point`` the request's endpoints (``advertised``)."""
        return self._answer("route", topic, queues, leader, access_point)

    def assignment(
        self,
        topic: definition_pb2.Resource,
        queues: int,
        leader: str | None,
        access_point: definition_pb2.Endpoints | None = None,
    ) -> bytes:
        """A serialized ``QueryAssignmentResponse`` (status OK): every queue of ``topic``."""
        return self._answer("assignment", topic, queues, leader, access_point)


_OK: Final = definition_pb2.Status(code=Code.OK, message="OK")
