"""The official RocketMQ 5 Python client (unchanged, from PyPI) against a real three-node broker group: one
message model for both faces, receive / ack / change invisible duration through the log, redelivery after the
invisible time, tag filters, and a topic that does not exist."""

from __future__ import annotations

import time

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.v5.exception import BadRequestException

from broker_adapter.client import BrokerConnection
from broker_adapter.client import Consumer as OurConsumer
from broker_adapter.client import Producer as OurProducer
from dledger import group as grp
from tests.rocketmq.conftest import META, client_config, create_topic, new_message, poll, running, stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def receive_all(consumer: SimpleConsumer, want: int, invisible_s: int = 20, timeout_s: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"received {len(got)} of {want}"
        for m in consumer.receive(32, invisible_s):
            got.append(m)
            consumer.ack(m)
    return got


def test_official_producer_and_simple_consumer_share_our_message_model(broker_group):
    g = broker_group
    create_topic(g, "rmq-model", 4)
    cfg = client_config(g)
    sent = {}
    with running(Producer(cfg, ("rmq-model",))) as producer:
        for i in range(12):
            m = new_message(
                "rmq-model", f"body-{i}".encode(), tag="tagA", keys=[f"k{i}", "order"], props={"n": str(i)}
            )
            r = producer.send(m)
            sent[r.message_id] = i
    assert len(sent) == 12
    # Our own consumer reads what the official producer sent: same tag, keys, id and properties.
    ours = OurConsumer(g.addresses, "ours")
    seen = {}
    try:
        for q in range(4):
            for m in ours.pull("rmq-model", q, 0, max_messages=64):
                seen[m.msg_id] = m
    finally:
        ours.close()
    assert set(seen) == set(sent)
    for msg_id, i in sent.items():
        m = seen[msg_id]
        assert (m.body, m.tags, sorted(m.keys), m.properties["n"]) == (
            f"body-{i}".encode(),
            "tagA",
            ["k" + str(i), "order"],
            str(i),
        )
    # The official SimpleConsumer receives each once, with the producer's id, tag, keys and properties.
    with running(
        SimpleConsumer(cfg, "rmq-model-g", {"rmq-model": FilterExpression()}, await_duration=1)
    ) as c:
        got = receive_all(c, 12)
        assert sorted(m.message_id for m in got) == sorted(sent)
        for m in got:
            i = sent[m.message_id]
            assert (m.body, m.tag, m.keys, m.properties, m.delivery_attempt) == (
                f"body-{i}".encode(),
                "tagA",
                {f"k{i}", "order"},
                {"n": str(i)},
                1,
            )
        assert all(c.receive(32, 20) == [] for _ in range(4)), "everything was acknowledged"


def test_our_producer_reaches_the_official_consumer(broker_group):
    g = broker_group
    create_topic(g, "rmq-ours", 2)
    p = OurProducer(g.addresses)
    try:
        ids = {p.send("rmq-ours", f"x{i}".encode(), tags="t", keys=[f"key{i}"]).msg_id: i for i in range(6)}
    finally:
        p.close()
    with running(
        SimpleConsumer(client_config(g), "rmq-ours-g", {"rmq-ours": FilterExpression()}, await_duration=1)
    ) as c:
        got = receive_all(c, 6)
    assert {m.message_id: (m.body, m.tag, m.keys) for m in got} == {
        msg_id: (f"x{i}".encode(), "t", {f"key{i}"}) for msg_id, i in ids.items()
    }


def test_redelivery_after_invisible_time_and_stale_receipts(broker_group):
    g = broker_group
    create_topic(g, "rmq-redeliver", 1)
    cfg = client_config(g)
    with running(Producer(cfg, ("rmq-redeliver",))) as producer:
        msg_id = producer.send(new_message("rmq-redeliver", b"again")).message_id
    with running(
        SimpleConsumer(cfg, "rmq-redeliver-g", {"rmq-redeliver": FilterExpression()}, await_duration=1)
    ) as c:
        (first,) = poll(lambda: c.receive(8, 1), what="first delivery")
        assert (first.message_id, first.delivery_attempt) == (msg_id, 1)
        # Not acknowledged: it comes back once its 1 s invisible time has run out, as attempt 2.
        (second,) = poll(lambda: c.receive(8, 30), what="redelivery")
        assert (second.message_id, second.delivery_attempt) == (msg_id, 2)
        # The first receipt handle names a superseded delivery: refused, nothing changes.
        with pytest.raises(BadRequestException, match="delivered again"):
            c.ack(first)
        # A longer invisible time issues a new handle; the old one is then stale too.
        old_handle = second.receipt_handle
        c.change_invisible_duration(second, 60)
        assert second.receipt_handle and second.receipt_handle != old_handle
        c.ack(second)
        c.ack(second)  # a retried ack is answered OK (it may follow a failover)
        # Acknowledged: never delivered again, even after every invisible time it had would have run out.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert c.receive(8, 1) == []


def test_tag_filter_skips_other_tags(broker_group):
    g = broker_group
    create_topic(g, "rmq-tags", 1)
    cfg = client_config(g)
    with running(Producer(cfg, ("rmq-tags",))) as producer:
        tags = ["a", "b", "c", "a", "b", "a"]
        ids = [
            producer.send(new_message("rmq-tags", f"m{i}".encode(), tag=t)).message_id
            for i, t in enumerate(tags)
        ]
    want = {i for i, t in zip(ids, tags, strict=True) if t in ("a", "c")}
    with running(
        SimpleConsumer(cfg, "rmq-tags-g", {"rmq-tags": FilterExpression("a||c")}, await_duration=1)
    ) as c:
        got = receive_all(c, len(want))
        assert {m.message_id for m in got} == want
        assert c.receive(32, 20) == []


def test_an_unknown_topic_is_topic_not_found_when_auto_create_is_off(broker_group):
    for address in broker_group.addresses:  # the leader and the followers answer alike
        with stub(address) as s:
            req = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="rmq-never-created"))
            resp = s.QueryRoute(req, metadata=META, timeout=10)
        assert resp.status.code == Code.TOPIC_NOT_FOUND
        assert "auto_create_topic_queues" in resp.status.message and not resp.message_queues


def test_auto_create_lets_the_official_producer_send_to_a_new_topic(tmp_path):
    """With ``[broker] auto_create_topic_queues``, the route query a producer starts with creates the topic
    through the log (off by default: see the not-found test above)."""
    g = grp.create(tmp_path / "g", 3, None, state_machine="broker")
    for spec in g.nodes:
        with open(spec.config, "a") as f:
            f.write("\n[broker]\nauto_create_topic_queues = 2\n")
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        grp.wait_for_leader(g)
        with running(Producer(client_config(g), ("rmq-auto",))) as producer:
            ids = {producer.send(new_message("rmq-auto", b"m%d" % i)).message_id for i in range(4)}
        assert len(ids) == 4
        with BrokerConnection(g.addresses) as c:
            info = {t.topic: t for t in c.list_topics()}["rmq-auto"]
        assert info.queues == 2 and sum(info.max_offsets) == 4
    finally:
        grp.stop_group(g)
