"""The RocketMQ face's cached route answers (``route.Routes``) never outlive what they describe: a topic created
after a miss, a topic whose queue count changed under the cache (as a snapshot install can do), and a change
of leader (the leader's address is listed first) each give a fresh answer. Driven in one process over the
in-memory node double of ``tests/broker``: no gRPC transport, no node processes."""

from __future__ import annotations

import asyncio

import pytest
from rocketmq.grpc_protocol import Code, service_pb2

from broker_adapter.rocketmq.servicer import MessagingServicer
from dledger.core.messages import Role
from tests.broker.test_broker import made  # noqa: F401  (the fixture: a leader broker over the double)


class Context:
    def invocation_metadata(self):
        return (("x-mq-client-id", "c1"),)

    def time_remaining(self):
        return 5.0


def query(servicer: MessagingServicer, topic: str) -> service_pb2.QueryRouteResponse:
    req = service_pb2.QueryRouteRequest()
    req.topic.name = topic
    r = asyncio.get_event_loop().run_until_complete(servicer.QueryRoute(req, Context()))
    return service_pb2.QueryRouteResponse.FromString(r) if isinstance(r, bytes) else r


def assignment(servicer: MessagingServicer, topic: str) -> service_pb2.QueryAssignmentResponse:
    req = service_pb2.QueryAssignmentRequest()
    req.topic.name = topic
    req.group.name = "g1"
    r = asyncio.get_event_loop().run_until_complete(servicer.QueryAssignment(req, Context()))
    return service_pb2.QueryAssignmentResponse.FromString(r) if isinstance(r, bytes) else r


def first_endpoint(mq) -> str:
    a = mq.broker.endpoints.addresses[0]
    return f"{a.host}:{a.port}"


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    asyncio.set_event_loop(lp)
    yield lp
    lp.close()


def test_a_route_follows_topic_creation_and_queue_count(made, loop):  # noqa: F811
    broker, _ = made
    s = MessagingServicer(broker)
    assert query(s, "t").status.code == Code.TOPIC_NOT_FOUND
    loop.run_until_complete(broker.create_topic("t", 2))
    r = query(s, "t")
    assert r.status.code == Code.OK and [mq.id for mq in r.message_queues] == [0, 1]
    assert [a.message_queue.id for a in assignment(s, "t").assignments] == [0, 1]
    assert query(s, "t") == r  # answered again (from the cache) alike
    broker.sm.topics["t"] = 3  # the state replaced under the cache, as a snapshot install does
    assert [mq.id for mq in query(s, "t").message_queues] == [0, 1, 2]
    assert [a.message_queue.id for a in assignment(s, "t").assignments] == [0, 1, 2]
    del broker.sm.topics["t"]
    assert query(s, "t").status.code == Code.TOPIC_NOT_FOUND


def test_a_route_lists_the_current_leader_first(made, loop):  # noqa: F811
    broker, node = made
    s = MessagingServicer(broker)
    loop.run_until_complete(broker.create_topic("t", 1))
    (mq,) = query(s, "t").message_queues
    assert first_endpoint(mq) == node.config.peers["n0"]
    assert len(mq.broker.endpoints.addresses) == 2
    node.leader_id, node.term = "n1", 2  # this node lost the leadership to n1
    for listener in node.listeners:
        listener(Role.FOLLOWER, 2)
    (mq,) = query(s, "t").message_queues
    assert first_endpoint(mq) == node.config.peers["n1"]
    (a,) = assignment(s, "t").assignments
    assert first_endpoint(a.message_queue) == node.config.peers["n1"]
    node.leader_id = None  # an election under way: no leader known, the addresses in order
    (mq,) = query(s, "t").message_queues
    assert [f"{x.host}:{x.port}" for x in mq.broker.endpoints.addresses] == sorted(node.config.peers.values())


def test_role_changes_drop_cached_answers(made, loop):  # noqa: F811
    broker, node = made
    s = MessagingServicer(broker)
    loop.run_until_complete(broker.create_topic("t", 1))
    query(s, "t")
    assert len(s.routes) == 1
    for listener in node.listeners:
        listener(Role.FOLLOWER, 2)
    assert len(s.routes) == 0


def query_from(servicer: MessagingServicer, topic: str, *access_point: str) -> service_pb2.QueryRouteResponse:
    """QueryRoute as a client configured with ``access_point`` sends it (the request's endpoints)."""
    req = service_pb2.QueryRouteRequest()
    req.topic.name = topic
    for a in access_point:
        host, _, port = a.rpartition(":")
        req.endpoints.addresses.add(host=host, port=int(port))
    r = asyncio.get_event_loop().run_until_complete(servicer.QueryRoute(req, Context()))
    return service_pb2.QueryRouteResponse.FromString(r) if isinstance(r, bytes) else r


def listed(mq) -> list[str]:
    return [f"{x.host}:{x.port}" for x in mq.broker.endpoints.addresses]


def test_a_route_advertises_the_access_point_the_client_used(made, loop):  # noqa: F811
    """As RocketMQ's proxy does: a client that knows one node (grpc-js can dial only one host:port) is told
    to dial that node, never a list; a client that knows several gets its own list, the leader first."""
    broker, node = made
    s = MessagingServicer(broker)
    loop.run_until_complete(broker.create_topic("t", 2))
    leader, other = node.config.peers["n0"], node.config.peers["n1"]
    for mq in query_from(s, "t", other).message_queues:
        assert listed(mq) == [other]
    (mq, _) = query_from(s, "t", "localhost:" + other.rpartition(":")[2]).message_queues
    assert listed(mq) == ["localhost:" + other.rpartition(":")[2]]  # a name stays the name the client used
    (mq, _) = query_from(s, "t", other, leader).message_queues
    assert listed(mq) == [leader, other]
    node.leader_id, node.term = "n1", 2
    for listener in node.listeners:
        listener(Role.FOLLOWER, 2)
    (mq, _) = query_from(s, "t", other, leader).message_queues
    assert listed(mq) == [other, leader]
    req = service_pb2.QueryAssignmentRequest()
    req.topic.name, req.group.name = "t", "g1"
    req.endpoints.addresses.add(host="127.0.0.9", port=1)
    r = loop.run_until_complete(s.QueryAssignment(req, Context()))
    r = service_pb2.QueryAssignmentResponse.FromString(r) if isinstance(r, bytes) else r
    assert {tuple(listed(a.message_queue)) for a in r.assignments} == {("127.0.0.9:1",)}
