"""SQL92 filters on a real three-node group (issue 16): the official Python client's SimpleConsumer subscribed with
``FilterExpression(..., FilterType.SQL)`` receives exactly the messages the expression selects, through a leader
kill; the Node.js client does the same where ``node`` is installed; our own ``Consumer(sql_filter=...)`` pulls
only matching messages and its committed offsets pass the others; a bad expression is refused with the position
(ILLEGAL_FILTER_EXPRESSION on RocketMQ's face, INVALID_ARGUMENT on ours)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, FilterType, definition_pb2, service_pb2

from broker_adapter.client import Consumer as OurConsumer
from broker_adapter.core.sqlfilter import FilterSyntaxError
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger import group as grp
from tests.rocketmq import node_client
from tests.rocketmq.conftest import META, client_config, create_topic, new_message, running, start_group, stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SQL = "(color = 'red' AND i BETWEEN 3 AND 30) OR TAGS IN ('vip')"


def wanted(i: int, color: str, tag: str) -> bool:
    return (color == "red" and 3 <= i <= 30) or tag == "vip"


def send_some(g: grp.GroupSpec, topic: str, start: int, count: int) -> dict[str, int]:
    """Messages with user properties i and color (none on every fifth) and tag vip on every seventh."""
    sent = {}
    with running(Producer(client_config(g), (topic,))) as producer:
        for i in range(start, start + count):
            props = {"i": str(i), "color": "red" if i % 2 else "blue"} if i % 5 else {}
            tag = "vip" if i % 7 == 0 else "std"
            sent[producer.send(new_message(topic, b"m%d" % i, tag=tag, props=props)).message_id] = i
    return sent


def selected(i: int) -> bool:
    if i % 5 == 0:  # no properties: only its tag can select it
        return i % 7 == 0
    return wanted(i, "red" if i % 2 else "blue", "vip" if i % 7 == 0 else "std")


@pytest.fixture
def own_group(tmp_path):
    g = start_group(tmp_path / "g")
    yield g
    grp.stop_group(g)


def test_official_client_sql92_subscription_through_a_leader_kill(own_group, tmp_path):
    g = own_group
    topic = "sql-orders"
    create_topic(g, topic, 4)
    sent = send_some(g, topic, 0, 20)
    leader = grp.wait_for_leader(g)
    grp.kill_node(g.node(leader.id))
    grp.wait_for_leader(g, exclude=leader.id)
    sent |= send_some(g, topic, 20, 20)
    want = {mid for mid, i in sent.items() if selected(i)}
    assert 0 < len(want) < len(sent)

    filt = FilterExpression(SQL, FilterType.SQL)
    got: dict[str, int] = {}
    with running(SimpleConsumer(client_config(g), "sql-g", {topic: filt}, await_duration=1)) as c:
        deadline = time.monotonic() + 60
        while set(got) != want:
            assert time.monotonic() < deadline, f"received {len(got)} of {len(want)}"
            for m in c.receive(32, 20):
                assert m.message_id in want, f"message {sent.get(m.message_id)} does not match {SQL!r}"
                assert m.message_id not in got, "an acked message came again"
                got[m.message_id] = sent[m.message_id]
                c.ack(m)
        assert c.receive(32, 20) == [], "nothing else matches"

    if node_client.node() is not None:  # the Node.js client's SQL92 subscription, through a follower
        follower = next(n for n in g.nodes if n.id != leader.id and grp.is_running(n))
        r = node_client.run(
            tmp_path, "consume", follower.address, topic, "sql-node-g", str(len(want)), "60", SQL
        )
        assert {m["id"] for m in r["received"]} == want
        assert len(r["received"]) == len(want)


def _receive_request(topic: str, expression: str) -> service_pb2.ReceiveMessageRequest:
    req = service_pb2.ReceiveMessageRequest(batch_size=4)
    req.group.name = "sql-bad-g"
    req.message_queue.topic.name = topic
    req.message_queue.id = 0
    req.filter_expression.CopyFrom(
        definition_pb2.FilterExpression(type=FilterType.SQL, expression=expression)
    )
    req.long_polling_timeout.FromMilliseconds(0)
    return req


def test_bad_expressions_are_refused_with_their_position(broker_group):
    g = broker_group
    create_topic(g, "sql-bad", 1)
    for address in g.addresses:  # followers forward; every node answers alike
        with stub(address) as s:
            (r,) = list(s.ReceiveMessage(_receive_request("sql-bad", "a > 'x'"), metadata=META, timeout=10))
            assert r.status.code == Code.ILLEGAL_FILTER_EXPRESSION
            assert "position 5" in r.status.message and "compares numbers" in r.status.message
    # the settings exchange of a consumer subscribing with a bad expression is answered with the error
    settings = definition_pb2.Settings(client_type=definition_pb2.SIMPLE_CONSUMER)
    settings.subscription.group.name = "sql-bad-g"
    entry = settings.subscription.subscriptions.add()
    entry.topic.name = "sql-bad"
    entry.expression.CopyFrom(definition_pb2.FilterExpression(type=FilterType.SQL, expression="i BETWEEN 1"))
    with stub(g.addresses[0]) as s:
        cmds = s.Telemetry(iter([service_pb2.TelemetryCommand(settings=settings)]), metadata=META, timeout=10)
        (answer,) = list(cmds)
        assert answer.status.code == Code.ILLEGAL_FILTER_EXPRESSION
        assert "'sql-bad'" in answer.status.message and "position 12" in answer.status.message
    # the official client's receive is refused with the reason
    bad = FilterExpression("color = 'red' AND", FilterType.SQL)
    consumer = SimpleConsumer(client_config(g), "sql-bad-g", {"sql-bad": bad}, await_duration=1)
    with running(consumer) as c, pytest.raises(Exception, match="position 18"):
        c.receive(8, 20)
    with pytest.raises(FilterSyntaxError, match="position 7"):
        OurConsumer(g.addresses, "sql-bad-ours", sql_filter="a IN (1)")
    ch = grpc.insecure_channel(g.addresses[0])
    try:
        req = broker_pb2.PullRequest(topic="sql-bad", queue_id=0, offset=0, max_messages=4, filter="(a = 1")
        with pytest.raises(grpc.RpcError) as e:
            broker_pb2_grpc.BrokerStub(ch).Pull(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "position 7" in e.value.details()
    finally:
        ch.close()


def test_our_consumer_pulls_only_what_its_filter_selects(broker_group):
    g = broker_group
    topic = "sql-ours"
    create_topic(g, topic, 2)
    sent = send_some(g, topic, 0, 40)
    want = sorted(i for i in sent.values() if selected(i))
    with OurConsumer(g.addresses, "sql-ours-g", sql_filter=SQL) as c:
        got = sorted(int(m.body[1:]) for m in c.messages(topic, idle_s=0.5))
        assert got == want
        # every queue's committed offset is its end: the messages the filter passed over are behind it too
        ends = next(t for t in c.list_topics() if t.topic == topic).max_offsets
        assert [c.committed(topic, q) for q in range(2)] == list(ends)
    with OurConsumer(g.addresses, "sql-ours-raw", sql_filter="i > 100") as c:
        assert c.pull(topic, 0, 0, max_messages=64) == []  # nothing matches: an empty batch, no error


def test_dledger_consume_filter(broker_group, tmp_path):
    """``dledger consume --filter``: the CLI's consumer takes only what the expression selects; a bad one is an
    error naming the position, and exit 1."""
    g = broker_group
    topic = "sql-cli"
    create_topic(g, topic, 2)
    sent = send_some(g, topic, 0, 30)
    out = tmp_path / "out.jsonl"
    base = [
        sys.executable,
        "-m",
        "dledger",
        "consume",
        "--addresses",
        ",".join(g.addresses),
        "--topic",
        topic,
    ]
    r = subprocess.run(
        [
            *base,
            "--group",
            "sql-cli-g",
            "--from-beginning",
            "--quiet",
            "--idle-s",
            "1",
            "--out",
            str(out),
            "--filter",
            SQL,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = {json.loads(line)["msg_id"] for line in out.read_text().splitlines()}
    assert got == {mid for mid, i in sent.items() if selected(i)}
    bad = subprocess.run(
        [*base, "--group", "sql-cli-bad", "--filter", "i >"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 1 and "position 4" in bad.stderr
