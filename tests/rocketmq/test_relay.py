"""A follower relays the official client's sends on its producer session (broker_adapter/rocketmq/sending.py,
``Sends.relay``; docs/rocketmq.md, "Sends through a follower").

Real node processes, the official Python client dialing one follower only. What is relayed (normal and FIFO
messages) is stored once each with everything the client set, in order per message group; what is not (a
delayed message, an unknown topic) is forwarded and served by the leader as before; a bad message is refused
by the follower with the code the leader gives; and through a leader kill every acknowledged send is received
exactly once. The follower's ``dledger_rocketmq_calls_total`` says which path each call took.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from concurrent.futures import wait
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.client import BrokerConnection
from dledger import group as grp
from tests.rocketmq.conftest import (
    META,
    create_topic,
    new_message,
    poll,
    receive_exactly_once,
    running,
    start_group,
    stub,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def metered_group(tmp_path_factory):
    """A three-node broker group whose every node serves /metrics: (group, metrics address by node id). Shared
    by the tests that kill nothing; each reads the counters' change over its own calls."""
    g = grp.create(tmp_path_factory.mktemp("relay") / "g", 3, None, state_machine="broker")
    metrics = {}
    for n, port in zip(g.nodes, grp.free_ports(len(g.nodes)), strict=True):
        metrics[n.id] = f"127.0.0.1:{port}"
        text = Path(n.config).read_text()
        Path(n.config).write_text(f'metrics_listen = "{metrics[n.id]}"\n' + text)
    try:
        for n in g.nodes:
            grp.start_node(n)
        grp.wait_for_all(g, 30)
        yield g, metrics
    finally:
        grp.stop_group(g)


def _a_follower(g: grp.GroupSpec) -> grp.NodeSpec:
    leader = grp.wait_for_leader(g)
    return next(n for n in g.nodes if n.id != leader.id)


def _scrape(metrics_address: str, sample: str) -> int | None:
    """The value of one sample (name and labels, exactly) on the node's /metrics; None if it has none."""
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    values = [line[len(sample) + 1 :] for line in text.splitlines() if line.startswith(sample + " ")]
    return int(float(values[0])) if values else None


def _calls(metrics_address: str, served: str) -> int:
    """The node's ``dledger_rocketmq_calls_total`` for SendMessage served that way."""
    n = _scrape(metrics_address, f'dledger_rocketmq_calls_total{{method="SendMessage",served="{served}"}}')
    return n or 0


def _create_topics(g: grp.GroupSpec, metrics_address: str, topics: dict[str, int]) -> None:
    """Create the topics and wait until the node behind ``metrics_address`` has applied them (a follower that
    does not know a topic yet forwards its sends instead of relaying them)."""
    for topic, queues in topics.items():
        create_topic(g, topic, queues)
    for topic in topics:
        sample = f'dledger_broker_topic_messages{{topic="{topic}"}}'
        poll(lambda s=sample: _scrape(metrics_address, s) is not None, 10, f"the follower to know {topic}")


def _config(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=5)


def test_a_follower_relays_normal_and_fifo_sends_and_forwards_the_rest(metered_group):
    g, metrics = metered_group
    topic, fifo_topic = "relay-normal", "relay-fifo"
    follower = _a_follower(g)
    _create_topics(g, metrics[follower.id], {topic: 4, fifo_topic: 2})
    relayed, forwarded = (_calls(metrics[follower.id], how) for how in ("relayed", "forwarded"))
    sent: dict[str, tuple[bytes, str, str]] = {}  # message id -> (body, tag, key)
    with running(Producer(_config(follower.address), (topic, fifo_topic))) as producer:
        # 64 in flight: the follower packs concurrent sends into its session's batches
        futures = {}
        for i in range(200):
            m = new_message(topic, b"n%d" % i, tag=f"t{i % 3}", keys=[f"k{i}"], props={"p": str(i)})
            futures[producer.send_async(m)] = (b"n%d" % i, f"t{i % 3}", f"k{i}")
            if len(futures) >= 64:
                done, _ = wait(list(futures), timeout=30)
                for f in done:
                    sent[f.result().message_id] = futures.pop(f)
        for f in list(futures):
            sent[f.result(timeout=30).message_id] = futures.pop(f)
        fifo = [
            producer.send(new_message(fifo_topic, b"%s-%d" % (grp_.encode(), i), group=grp_)).message_id
            for i in range(20)
            for grp_ in ("ga", "gb")
        ]
        # A delayed message is the leader's to place in the timer topic: forwarded as the client sent it.
        delayed = new_message(topic, b"later")
        delayed.delivery_timestamp = int(time.time()) + 1  # seconds, as the 5.1.2 client takes it
        later_id = producer.send(delayed).message_id
    assert len(sent) == 200 and len(set(fifo)) == 40
    assert _calls(metrics[follower.id], "relayed") - relayed == 240
    assert _calls(metrics[follower.id], "forwarded") - forwarded == 1

    # Everything once, with what the client set; FIFO in order per message group.
    got: dict[str, tuple[bytes, str, str, str | None]] = {}
    with running(
        SimpleConsumer(_config(follower.address), "relay-g", {topic: FilterExpression()}, await_duration=1)
    ) as c:
        deadline = time.monotonic() + 60
        while len(got) < 201:
            assert time.monotonic() < deadline, f"received {len(got)} of 201"
            for m in c.receive(32, 20):
                assert m.message_id not in got, f"{m.message_id} received twice"
                got[m.message_id] = (bytes(m.body), m.tag, next(iter(m.keys), ""), m.properties.get("p"))
                c.ack(m)
    for msg_id, (body, tag, key) in sent.items():
        assert got[msg_id][:3] == (body, tag, key)
        assert got[msg_id][3] == body[1:].decode()
    assert got[later_id][0] == b"later"
    order: dict[str, list[int]] = {"ga": [], "gb": []}
    with BrokerConnection(g.addresses) as admin:
        admin.set_group_settings("relay-fifo-g", fifo=True)
    fifo_filter = {fifo_topic: FilterExpression()}
    with running(
        SimpleConsumer(_config(follower.address), "relay-fifo-g", fifo_filter, await_duration=1)
    ) as c:
        poll(lambda: _drain(c, order) >= 40, 60, "every FIFO message")
    assert order == {"ga": list(range(20)), "gb": list(range(20))}


def _drain(c: SimpleConsumer, order: dict[str, list[int]]) -> int:
    for m in c.receive(32, 20):
        group, i = bytes(m.body).decode().rsplit("-", 1)
        order[group].append(int(i))
        c.ack(m)
    return sum(map(len, order.values()))


def test_a_follower_refuses_what_the_leader_refuses_with_the_same_code(metered_group):
    g, metrics = metered_group
    follower = _a_follower(g)
    _create_topics(g, metrics[follower.id], {"relay-refused": 2})
    leader = grp.wait_for_leader(g)
    forwarded = _calls(metrics[follower.id], "forwarded")

    def send(address: str, m: definition_pb2.Message) -> service_pb2.SendMessageResponse:
        with stub(address) as s:
            return s.SendMessage(service_pb2.SendMessageRequest(messages=[m]), metadata=META, timeout=10)

    def message(body: bytes, topic: str = "relay-refused", **system) -> definition_pb2.Message:
        return definition_pb2.Message(
            topic=definition_pb2.Resource(name=topic),
            body=body,
            system_properties=definition_pb2.SystemProperties(
                message_id="01AABBCCDDEEFF00000000000000000001", **system
            ),
        )

    for m in (message(b""), message(b"x", tag="a|b"), message(b"x", keys=["a b"])):
        on_leader, on_follower = send(leader.address, m), send(follower.address, m)
        assert on_follower.status.code == on_leader.status.code != Code.OK
    # An unknown topic is not this follower's to judge: forwarded, and the leader's answer relayed.
    unknown = send(follower.address, message(b"x", topic="relay-never-created"))
    assert unknown.status.code == Code.TOPIC_NOT_FOUND
    assert _calls(metrics[follower.id], "forwarded") - forwarded == 1
    # A retried send (same client id and message id) is stored once, relayed or not.
    first = send(follower.address, message(b"once"))
    again = send(follower.address, message(b"once"))
    direct = send(leader.address, message(b"once"))
    assert first.status.code == again.status.code == direct.status.code == Code.OK
    assert first.entries[0].offset == again.entries[0].offset == direct.entries[0].offset
    with BrokerConnection(g.addresses) as admin:
        info = {t.topic: t for t in admin.list_topics()}["relay-refused"]
    assert sum(info.max_offsets) == 1, "the refused messages stored nothing, the retried one once"


def test_sends_relayed_through_a_leader_kill_are_received_exactly_once(tmp_path):
    g = start_group(tmp_path / "g")
    try:
        _relayed_through_a_leader_kill(g)
    finally:
        grp.stop_group(g)


def _relayed_through_a_leader_kill(g: grp.GroupSpec) -> None:
    topic = "relay-failover"
    create_topic(g, topic, 4)
    follower = _a_follower(g)
    acked: dict[str, int] = {}
    killed = None
    with running(Producer(_config(follower.address), (topic,))) as producer:
        for i in range(600):
            if i == 200:
                killed = grp.wait_for_leader(g).id
                assert killed != follower.id
                grp.kill_node(g.node(killed))
            with contextlib.suppress(Exception):  # the client's own errors: that send's outcome is unknown
                acked[producer.send(new_message(topic, b"m%d" % i)).message_id] = i
    assert killed is not None
    grp.start_node(g.node(killed))
    assert len(acked) >= 550, f"only {len(acked)} of 600 sends acknowledged"
    with running(
        SimpleConsumer(
            _config(follower.address), "relay-failover-g", {topic: FilterExpression()}, await_duration=1
        )
    ) as c:
        received = receive_exactly_once(c, acked)
    assert len(received) <= 600
