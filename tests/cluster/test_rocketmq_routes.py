"""The other groups' part of a RocketMQ 5 route, and that appending it to a group's own answer is one valid reply."""

from __future__ import annotations

from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.nameserver.registry import GroupRoute
from broker_adapter.rocketmq import cluster_routes, route

TOPIC = definition_pb2.Resource(name="orders")
G1 = GroupRoute("g1", "c", "127.0.0.1:2002", ("127.0.0.1:2001", "127.0.0.1:2002", "127.0.0.1:2003"), 2)
G2 = GroupRoute("g2", "c", "", ("127.0.0.1:3001",), 1)


def _addresses(mq) -> list[str]:
    return [f"{a.host}:{a.port}" for a in mq.broker.endpoints.addresses]


def test_route_tail_merges_into_the_groups_own_answer():
    own = service_pb2.QueryRouteResponse(
        status=definition_pb2.Status(code=Code.OK, message="OK"),
        message_queues=[
            definition_pb2.MessageQueue(topic=TOPIC, id=0, broker=definition_pb2.Broker(name="g0"))
        ],
    ).SerializeToString()
    merged = service_pb2.QueryRouteResponse.FromString(
        own + cluster_routes.route_tail(TOPIC, [G1, G2], False)
    )
    assert merged.status.code == Code.OK
    assert [(mq.broker.name, mq.id) for mq in merged.message_queues] == [
        ("g0", 0),
        ("g1", 0),
        ("g1", 1),
        ("g2", 0),
    ]
    assert _addresses(merged.message_queues[1]) == ["127.0.0.1:2002", "127.0.0.1:2001", "127.0.0.1:2003"]
    assert _addresses(merged.message_queues[3]) == ["127.0.0.1:3001"]  # no leader known: the live node
    # every group is a whole broker: its queues take every type this group's own queues take
    assert {tuple(mq.accept_message_types) for mq in merged.message_queues[1:]} == {route.ACCEPTED_TYPES}


def test_a_client_that_dialled_one_address_gets_one_per_broker():
    tail = service_pb2.QueryAssignmentResponse.FromString(cluster_routes.assignment_tail(TOPIC, [G1], True))
    assert [_addresses(a.message_queue) for a in tail.assignments] == [["127.0.0.1:2002"]] * 2


def test_no_other_group_adds_nothing():
    assert cluster_routes.route_tail(TOPIC, [], False) == b""
    assert cluster_routes.assignment_tail(TOPIC, [], True) == b""
