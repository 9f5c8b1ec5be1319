"""The official RocketMQ 5 client through a leader kill, and its PushConsumer (issue 10's acceptance tests).

A ``Producer`` sends while the leader is killed with SIGKILL once (then restarted); a ``SimpleConsumer`` then
receives and acks everything: every acknowledged send is received, and once acked it is never received again.
A ``PushConsumer`` with a listener consumes another topic to its end. Real node processes, unchanged client.
"""

from __future__ import annotations

import threading

import pytest
from rocketmq import FilterExpression, Producer, PushConsumer, SimpleConsumer
from rocketmq.v5.consumer.push.message_listener import ConsumeResult, MessageListener

from broker_adapter.client import Producer as OurProducer
from dledger import group as grp
from tests.rocketmq.conftest import (
    client_config,
    create_topic,
    new_message,
    poll,
    receive_exactly_once,
    running,
    start_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture
def own_group(tmp_path):
    g = start_group(tmp_path / "g")
    yield g
    grp.stop_group(g)


def _kill_the_leader(g: grp.GroupSpec) -> str:
    leader = grp.wait_for_leader(g)
    grp.kill_node(g.node(leader.id))
    return leader.id


@pytest.mark.parametrize(
    "count", [1_000, pytest.param(5_000, marks=pytest.mark.slow)], ids=lambda n: f"{n}-messages"
)
def test_producer_through_a_leader_kill_then_simple_consumer_gets_every_acked_send(own_group, count):
    g = own_group
    topic = "rmq-failover"
    create_topic(g, topic, 4)
    acked: dict[str, int] = {}  # message id -> the i of its body
    failed = 0
    killed = None
    with running(Producer(client_config(g), (topic,))) as producer:
        for i in range(count):
            if i == count // 3:
                killed = _kill_the_leader(g)
            try:
                acked[producer.send(new_message(topic, b"m%d" % i)).message_id] = i
            except Exception:  # the client's own error types; the outcome of that one send is unknown
                failed += 1
    assert killed is not None
    grp.start_node(g.node(killed))
    assert len(acked) >= count - 50, f"only {len(acked)} of {count} sends acknowledged ({failed} failed)"

    with running(
        SimpleConsumer(client_config(g), "rmq-failover-g", {topic: FilterExpression()}, await_duration=1)
    ) as consumer:
        received = receive_exactly_once(consumer, acked)
    assert len(received) <= count, "nothing was received that no producer sent"


class _Collect(MessageListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            self.bodies.append(bytes(message.body))
        return ConsumeResult.SUCCESS


def test_push_consumer_consumes_a_topic_to_its_end(broker_group):
    g = broker_group
    topic = "rmq-push"
    create_topic(g, topic, 2)
    with OurProducer(g.addresses) as p:
        for i in range(200):
            p.send(topic, b"push-%d" % i)
    listener = _Collect()
    consumer = PushConsumer(client_config(g), "rmq-push-g", listener, {topic: FilterExpression()})
    with running(consumer):
        poll(lambda: len(set(listener.bodies)) >= 200, 90, "the push consumer to reach the end")
    assert set(listener.bodies) == {b"push-%d" % i for i in range(200)}
