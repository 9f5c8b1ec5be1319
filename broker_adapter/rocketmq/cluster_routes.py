"""The rest of the cluster in a RocketMQ 5 route: the topic's queues in the other broker groups.

A node whose group belongs to a cluster (``[broker] nameservers``, docs/cluster.md) answers QueryRoute and
QueryAssignment with its own group's queues, as alone, plus every other group's queues of the topic. The other
groups come from the name servers' picture that the node's registrar refreshes at every beat. So the official
clients spread sends over every group and consume them all, whichever node they first asked.

Each other group is one more RocketMQ broker, named after the group. Its endpoints are its leader first and then
its other live nodes. A client that dialled one address is given one address per broker, the leader's, because
grpc-js (the Node.js client) cannot dial a list (docs/rocketmq.md).

The extra part is serialized on its own and appended to this group's cached answer. Protobuf merges a repeated
field across concatenated messages, so the two together are one valid response.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocketmq.grpc_protocol import AddressScheme, MessageType, Permission, definition_pb2, service_pb2

from broker_adapter.nameserver.registry import GroupRoute

ACCEPTED_TYPES = (MessageType.NORMAL, MessageType.FIFO)


def _endpoints(route: GroupRoute, single: bool) -> definition_pb2.Endpoints:
    ordered = [route.leader_address] if route.leader_address else []
    ordered += sorted(a for a in route.addresses if a != route.leader_address)
    if single:
        ordered = ordered[:1]
    out = definition_pb2.Endpoints(scheme=AddressScheme.IPv4)
    for a in ordered:
        host, _, port = a.rpartition(":")
        out.addresses.add(host=host, port=int(port))
    return out


def other_queues(
    topic: definition_pb2.Resource, groups: Sequence[GroupRoute], single_address: bool
) -> list[definition_pb2.MessageQueue]:
    out = []
    for g in groups:
        ep = _endpoints(g, single_address)
        for qid in range(g.queues):
            mq = definition_pb2.MessageQueue(id=qid, permission=Permission.READ_WRITE)
            mq.topic.CopyFrom(topic)
            mq.broker.name = g.group
            mq.broker.id = 0
            mq.broker.endpoints.CopyFrom(ep)
            mq.accept_message_types.extend(ACCEPTED_TYPES)
            out.append(mq)
    return out


def route_tail(topic: definition_pb2.Resource, groups: Sequence[GroupRoute], single_address: bool) -> bytes:
    """Serialized QueryRouteResponse holding only the other groups' queues, to append to this group's answer."""
    if not groups:
        return b""
    return service_pb2.QueryRouteResponse(
        message_queues=other_queues(topic, groups, single_address)
    ).SerializeToString()


def assignment_tail(
    topic: definition_pb2.Resource, groups: Sequence[GroupRoute], single_address: bool
) -> bytes:
    """Serialized QueryAssignmentResponse holding only the other groups' assignments (every queue, as for this
    group: pop-style consumption shares queues safely)."""
    if not groups:
        return b""
    mqs = other_queues(topic, groups, single_address)
    return service_pb2.QueryAssignmentResponse(
        assignments=[definition_pb2.Assignment(message_queue=mq) for mq in mqs]
    ).SerializeToString()
