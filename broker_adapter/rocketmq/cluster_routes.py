"""The rest of the cluster in a RocketMQ 5 route: the topic's queues in the other broker groups.

A node whose group belongs to a cluster (``[broker] nameservers``, docs/cluster.md) answers QueryRoute and
QueryAssignment with its own group's queues, as alone, plus every other group's queues of the topic. The other
groups come from the name servers' picture that the node's registrar refreshes at every beat. So the official
clients spread sends over every group and consume them all, whichever node they first asked.

Each other group is one more RocketMQ broker, named after the group, whose queues take every message type ours
do (a client refuses to send a delayed or transactional message to a queue that does not list its type). Its endpoints are its leader first and then
its other live nodes. A client that dialled one address is given one address per broker, the leader's, because
grpc-js (the Node.js client) cannot dial a list (docs/rocketmq.md).

The extra part is serialized on its own and appended to this group's cached answer. Protobuf merges a repeated
field across concatenated messages, so the two together are one valid response.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from broker_adapter.nameserver.registry import GroupRoute
from broker_adapter.rocketmq.route import ACCEPTED_TYPES, endpoints, message_queues


def other_queues(
    topic: definition_pb2.Resource, groups: Sequence[GroupRoute], single_address: bool
) -> list[definition_pb2.MessageQueue]:
    out = []
    for g in groups:
        ep = endpoints(g.addresses, g.leader_address or None, single=single_address)
        out += message_queues(topic, g.queues, g.group, ep, ACCEPTED_TYPES)
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
