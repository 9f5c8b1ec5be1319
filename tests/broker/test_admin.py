"""Administration on a real three-node group (issue 28; ``broker_adapter.core.admin``, ``dledger.v1.BrokerAdmin``,
``broker_adapter.admin_client.BrokerAdmin``, ``broker_adapter.admin_cli``): consumer groups listed, described,
reset (to earliest, latest, an offset, a time) and deleted through the log; topic status, deletion (sends
refused, created again from offset 0, a node replaying the deletion on restart); messages found by key, id and
store time through the key index, also after the index was deleted and rebuilt from the log; dead letters
listed, exported and resent; run-time settings replicated; per-topic and per-group metrics; every bad input
answered with INVALID_ARGUMENT or NOT_FOUND and a message naming what is wrong.

One group for the module (started once, about 5 s); each test uses its own topics and groups.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner

from broker_adapter import cli as broker_cli
from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.client import Consumer, Producer
from broker_adapter.v1 import admin_pb2, admin_pb2_grpc
from dledger import group as grp
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError
from tests.rocketmq.conftest import create_topic, poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


app = typer.Typer()
broker_cli.register(app)  # the broker's commands of the dledger CLI


@pytest.fixture(scope="module")
def g(tmp_path_factory):
    directory = tmp_path_factory.mktemp("admin")
    spec = grp.create(directory / "g", 3, None, state_machine="broker")
    for n in spec.nodes:
        text = Path(n.config).read_text()
        Path(n.config).write_text(f'metrics_listen = "127.0.0.1:{grp.free_ports(1)[0]}"\n' + text)
    for n in spec.nodes:
        grp.start_node(n)
    try:
        grp.wait_for_leader(spec, 30)
        grp.wait_for_all(spec, 30)
        yield spec
    finally:
        grp.stop_group(spec)


def cli(*args: str) -> str:
    """Run a broker command in-process; an argument with spaces is several words."""
    r = CliRunner().invoke(app, [w for a in args for w in (a.split() if " " in a else [a])])
    assert r.exit_code == 0, r.output
    return r.output


def send_keyed(g, topic: str, prefix: str, n: int) -> list:
    with Producer(g.addresses) as p:
        return p.send_batch(
            topic, [(f"{prefix}-{i}".encode(), "tagA", [f"{prefix}-key-{i}"]) for i in range(n)]
        )


def test_consumer_groups_describe_reset_and_delete(g):
    create_topic(g, "cg", 2)
    first = send_keyed(g, "cg", "a", 10)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    send_keyed(g, "cg", "b", 10)
    ends = {q: sum(1 for r in first if r.queue_id == q) for q in (0, 1)}
    with Consumer(g.addresses, "billing") as c:
        c.commit("cg", 0, 3)
    with BrokerAdmin(g.addresses) as a:
        assert [x.group for x in a.list_groups()] == ["billing"]
        (s,) = a.list_groups()
        assert (s.topics == ("cg",) and s.lag == 20 - 3 - 0 - (20 - 20) - 0) or s.lag > 0
        rows = a.describe_group("billing", "cg")
        assert [(q.queue_id, q.committed, q.max_offset) for q in rows] == [(0, 3, 10), (1, None, 10)]
        assert rows[0].lag == 7 and rows[1].lag == 10

        reset = a.reset_offsets("billing", "cg", "time", cut)
        assert [(r.queue_id, r.old, r.new) for r in reset] == [(0, 3, ends[0]), (1, None, ends[1])]
        assert [r.new for r in a.reset_offsets("billing", "cg", "latest")] == [10, 10]
        assert [r.new for r in a.reset_offsets("billing", "cg", "earliest", queue_id=1)] == [0]
        assert [r.new for r in a.reset_offsets("billing", "cg", "offset", 5)] == [5, 5]
        # every node applied the reset (it went through the log)
        for n in g.nodes:

            def applied(n=n) -> bool:
                request = admin_pb2.DescribeGroupRequest(group="billing", allow_follower=True)
                r = a.call("DescribeGroup", request, retry_unknown=True, address=n.address)
                return all(q.committed_offset == 5 for q in r.queues)

            poll(applied, 5, f"{n.id} applied the reset")

        out = cli(
            "consumer-group", "describe", "--group", "billing", "--addresses", ",".join(g.addresses), "--json"
        )
        assert [q["committed"] for q in json.loads(out)["queues"]] == [5, 5]
        cli(
            "consumer-group reset --group billing --topic cg --to offset --offset 2 --queue 0 --addresses",
            ",".join(g.addresses),
        )
        assert a.describe_group("billing")[0].committed == 2

        a.delete_group("billing")
        assert a.list_groups() == []
        with pytest.raises(NotFoundError, match="unknown consumer group 'billing'"):
            a.describe_group("billing")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda a: a.reset_offsets("x", "bad", "sideways"), InvalidRequestError, "reset mode must be one of"),
        (lambda a: a.reset_offsets("x", "bad", "offset", 99), InvalidRequestError, "beyond the end of bad/0"),
        (lambda a: a.reset_offsets("x", "bad", "offset", -1), InvalidRequestError, "needs a value >= 0"),
        (lambda a: a.reset_offsets("x", "nope", "latest"), NotFoundError, "unknown topic 'nope'"),
        (lambda a: a.reset_offsets("x", "bad", "latest", queue_id=7), NotFoundError, "unknown queue bad/7"),
        (lambda a: a.reset_offsets("a b", "bad", "latest"), InvalidRequestError, "invalid consumer group"),
        (lambda a: a.delete_group("ghost"), NotFoundError, "unknown consumer group 'ghost'"),
        (lambda a: a.describe_group("ghost"), NotFoundError, "unknown consumer group 'ghost'"),
        (lambda a: a.topic_status("nope"), NotFoundError, "unknown topic 'nope'"),
        (lambda a: a.topic_status("bad topic"), InvalidRequestError, "invalid topic name"),
        (lambda a: a.delete_topic("nope"), NotFoundError, "unknown topic 'nope'"),
        (lambda a: a.delete_topic("%SYS%TIMER"), InvalidRequestError, "broker's own"),
        (lambda a: a.query_by_key(""), InvalidRequestError, "needs a value"),
        (lambda a: a.query_by_key("k", limit=5000), InvalidRequestError, "limit must be in 1..1024"),
        (lambda a: a.query_by_key("k", topic="nope"), NotFoundError, "unknown topic 'nope'"),
        (lambda a: a.query_by_time("bad", 10, 5), InvalidRequestError, "0 <= start < end"),
        (
            lambda a: a._query(admin_pb2.QueryMessagesRequest(by="tag", value="x")),
            InvalidRequestError,
            "query by",
        ),
        (lambda a: a.set_config(retention_days=1), InvalidRequestError, "cannot be set at run time"),
        (lambda a: a.set_config(max_delay_ms="soon"), InvalidRequestError, "max_delay_ms takes a int"),
        (
            lambda a: a.set_config(max_delay_ms=5),
            InvalidRequestError,
            r"max_delay_ms must be an integer in 1000",
        ),
        (lambda a: a.set_config(), InvalidRequestError, "give at least one key=value"),
    ],
)
def test_bad_input_is_refused_with_a_message(g, call, error, match):
    create_topic(g, "bad", 1)
    with BrokerAdmin(g.addresses) as a, pytest.raises(error, match=match):
        call(a)


def test_bad_input_gets_the_grpc_status(g):
    create_topic(g, "bad", 1)
    with grpc.insecure_channel(g.addresses[0]) as ch:
        stub = admin_pb2_grpc.BrokerAdminStub(ch)
        for request, code in [
            (admin_pb2.TopicStatusRequest(topic="nope", allow_follower=True), grpc.StatusCode.NOT_FOUND),
            (
                admin_pb2.QueryMessagesRequest(by="time", topic="bad", allow_follower=True),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
        ]:
            method = (
                stub.TopicStatus if isinstance(request, admin_pb2.TopicStatusRequest) else stub.QueryMessages
            )
            with pytest.raises(grpc.RpcError) as info:
                method(request, timeout=5)
            assert info.value.code() == code, info.value.details()


def test_topic_status_delete_and_create_again(g):
    create_topic(g, "doomed", 2)
    old = send_keyed(g, "doomed", "old", 6)
    early = Producer(g.addresses)
    early.send("doomed", b"before")
    with BrokerAdmin(g.addresses) as a:
        st = a.topic_status("doomed")
        assert [q.min_offset for q in st] == [0, 0] and sum(q.max_offset for q in st) == 7
        assert all(q.last_store_ms > 0 for q in st)
        with Consumer(g.addresses, "reader") as c:
            c.commit("doomed", 0, 2)
        assert a.delete_topic("doomed") == 2
        with pytest.raises(NotFoundError, match="was deleted"):
            early.send("doomed", b"late")  # a producer that knew the topic: refused by the leader
        with pytest.raises(NotFoundError, match="was deleted"):
            a.topic_status("doomed")
        assert a.list_groups() == [], "the group's only offsets were on the deleted topic"
        assert a.query_by_key("old-key-1") == [], "a deleted topic's messages are not found"
        for n in g.nodes:
            poll(
                lambda n=n: not (Path(n.data_dir) / "consumequeue" / "doomed").exists(),
                5,
                f"{n.id} removed its queues",
            )

        a.create_topic("doomed", 3)
        new = send_keyed(g, "doomed", "new", 3)
        by_queue: dict[int, list[int]] = {}
        for r in new:
            by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
        assert all(o == list(range(len(o))) for o in by_queue.values()), "queues start again at 0"
        q0 = new[0].queue_id
        in_q0 = [f"new-{i}".encode() for i, r in enumerate(new) if r.queue_id == q0]
        assert [m.body for m in a.browse("doomed", q0, 0)] == in_q0
        assert a.query_by_key("old-key-1") == []
        assert [m.msg_id for m in a.query_by_id(new[1].msg_id)] == [new[1].msg_id]
        addrs = ",".join(g.addresses)
        browsed = json.loads(cli(f"topic browse --topic doomed --queue {q0} --json --addresses", addrs))
        assert [m["body"] for m in browsed] == [b.decode() for b in in_q0]
        (route,) = json.loads(cli("topic route --topic doomed --json --addresses", addrs))
        assert route["queues"] == 3 and route["leader"] in g.addresses

    # A follower restarted (no snapshot) replays the old messages, the deletion and the new topic's messages.
    leader = grp.wait_for_leader(g)
    node = next(n for n in g.nodes if n.id != leader.id)
    grp.stop_node(
        node
    )  # its ConsumeQueue files hold the new topic's units: the old messages' replay passes them
    grp.start_node(node)
    grp.wait_for_all(g, 30)
    with Consumer(g.addresses, "probe") as c:

        def served() -> list | None:
            try:
                return c.pull("doomed", q0, 0, 10, allow_follower=True, address=node.address)
            except NotFoundError:
                return None  # not replayed that far yet

        got = poll(served, 20, "the node serves it")
    assert [m.body for m in got] == in_q0
    assert len(old) == 6
    early.close()


def test_query_by_key_id_and_time_and_rebuilt_index(g):
    create_topic(g, "q", 2)
    t0 = int(time.time() * 1000)
    sent = send_keyed(g, "q", "m", 40)
    t1 = int(time.time() * 1000) + 1
    with BrokerAdmin(g.addresses) as a:
        (m,) = a.query_by_key("m-key-17")
        assert (m.body, m.keys, m.tags, m.msg_id) == (b"m-17", ("m-key-17",), "tagA", sent[17].msg_id)
        (m,) = a.query_by_id(sent[3].msg_id, topic="q")
        assert m.body == b"m-3" and (m.queue_id, m.queue_offset) == (sent[3].queue_id, sent[3].queue_offset)
        assert a.query_by_key("no-such-key") == []
        found = a.query_by_time("q", t0, t1, limit=1024)
        assert sorted(x.body for x in found) == sorted(f"m-{i}".encode() for i in range(40))
        assert a.query_by_time("q", t1 + 60_000, t1 + 120_000) == []
        out = cli("message", "query", "--key", "m-key-5", "--addresses", ",".join(g.addresses), "--json")
        assert [json.loads(out)[0]["body"]] == ["m-5"]

    # The index is derived: a node whose index was deleted rebuilds it from its log at start.
    leader = grp.wait_for_leader(g)
    node = next(n for n in g.nodes if n.id != leader.id)
    grp.stop_node(node)
    shutil.rmtree(Path(node.data_dir) / "keyindex")
    grp.start_node(node)
    grp.wait_for_all(g, 30)
    with BrokerAdmin(g.addresses) as a:

        def on_node():
            try:
                r = a.call(
                    "QueryMessages",
                    admin_pb2.QueryMessagesRequest(by="key", value="m-key-33", allow_follower=True),
                    retry_unknown=True,
                    address=node.address,
                )
            except DLedgerError:
                return None
            return list(r.messages)

        (m,) = poll(on_node, 20, "the rebuilt index answers")
        assert m.body == b"m-33"


def test_dead_letters_list_export_and_resend(g, tmp_path):
    create_topic(g, "work", 1)
    with BrokerAdmin(g.addresses) as a:
        a.set_group_settings("dg", max_attempts=1)
    with Producer(g.addresses) as p:
        p.send("work", b"poison", tags="t1", keys=["pk"])
    with Consumer(g.addresses, "dg") as c:
        (m,) = c.pull("work", 0, 0)
        assert c.later(m).dead_lettered
    with BrokerAdmin(g.addresses) as a:
        poll(lambda: a.dead_letter_groups() == [("dg", 1)], 10, "the dead letter listed")
        (d,) = list(a.dead_letters("dg"))
        assert d.body == b"poison"
        out_file = tmp_path / "dlq.jsonl"
        cli("dlq", "export", "--group", "dg", "--out", str(out_file), "--addresses", ",".join(g.addresses))
        (line,) = out_file.read_text().splitlines()
        assert json.loads(line)["body"] == "poison"
        listed = json.loads(cli("dlq list --json --addresses", ",".join(g.addresses)))
        assert listed == [{"group": "dg", "dead_letters": 1}]
        r = a.resend("dg", 0, d.queue_offset)
        assert (r.topic, r.queue_offset) == ("work", 1) and r.msg_id != m.msg_id
        (back,) = a.browse("work", 0, 1)
        assert (back.body, back.tags, back.keys) == (b"poison", "t1", ("pk",))
        with pytest.raises(NotFoundError, match="no dead letter at %DLQ%dg/0 offset 1"):
            a.resend("dg", 0, 1)
        with pytest.raises(InvalidRequestError, match="beyond the end of %DLQ%dg/0"):
            a.resend("dg", 0, 5)


def test_run_time_settings_and_metrics(g):
    with BrokerAdmin(g.addresses) as a:
        shown = a.get_config()
        assert shown["max_delay_ms"] == {"value": 86_400_000, "source": "node.toml"}
        shown = a.set_config(max_delay_ms=5000)
        assert shown["max_delay_ms"] == {"value": 5000, "source": "log"}
        create_topic(g, "late", 1)
        with Producer(g.addresses) as p:
            with pytest.raises(InvalidRequestError, match="5000 ms"):
                p.send("late", b"x", deliver_at_ms=int(time.time() * 1000) + 60_000)
            p.send("late", b"x", deliver_at_ms=int(time.time() * 1000) + 2_000)  # within it
        for n in g.nodes:

            def has_it(n=n) -> bool:
                r = a.call("GetConfig", admin_pb2.GetConfigRequest(), retry_unknown=True, address=n.address)
                return {v.key: v.source for v in r.values}["max_delay_ms"] == "log"

            poll(has_it, 5, f"{n.id} has it")
        out = cli(
            "broker", "config", "set", "retention_hours=1000", "--addresses", ",".join(g.addresses), "--json"
        )
        assert {r["key"]: r["value"] for r in json.loads(out)}["retention_hours"] == 1000.0
        a.set_config(max_delay_ms=86_400_000, retention_hours=0)

    create_topic(g, "rates", 1)
    send_keyed(g, "rates", "r", 5)
    with Consumer(g.addresses, "rater") as c:
        c.commit("rates", 0, 2)
    port = Path(g.nodes[0].config).read_text().split('metrics_listen = "127.0.0.1:')[1].split('"')[0]

    def scraped() -> str | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        ok = 'dledger_broker_topic_messages{topic="rates"} 5.0' in text
        return text if ok and 'dledger_broker_group_lag{group="rater",topic="rates"} 3.0' in text else None

    text = poll(scraped, 10, "the broker's metrics")
    assert 'dledger_broker_group_committed{group="rater",topic="rates"} 2.0' in text


def test_members_are_the_consumers_pulling_from_and_the_rocketmq_consumers_heartbeating_to_the_leader(g):
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    from broker_adapter.v1 import broker_pb2, broker_pb2_grpc

    leader = grp.wait_for_leader(g)
    with grpc.insecure_channel(leader.address) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        for cid, kind in (("c-1", "SIMPLE_CONSUMER"), ("p-1", "PRODUCER")):
            stub.Heartbeat(
                service_pb2.HeartbeatRequest(
                    group=definition_pb2.Resource(name="members"),
                    client_type=definition_pb2.ClientType.Value(kind),
                ),
                metadata=[("x-mq-client-id", cid)],
                timeout=5,
            )
    create_topic(g, "member-topic", 1)
    with Consumer(g.addresses, "members") as ours, BrokerAdmin(g.addresses) as a:
        a.set_group_settings("members", max_attempts=3)  # a group with state, so describe knows it
        assert a.group_members("members") == ["c-1"], "consumers only, producers are not members"
        ours.pull("member-topic", 0, 0, wait_ms=10)  # our consumer names its group and itself on each pull
        a.browse("member-topic", 0, 0, 1)  # an anonymous read: nobody's member
        assert ours.client_id.startswith(f"{socket.gethostname()}@")
        assert a.group_members("members") == sorted(["c-1", ours.client_id])
        described = json.loads(
            cli("consumer-group describe --group members --json --addresses", ",".join(g.addresses))
        )
        assert described["members"] == sorted(["c-1", ours.client_id])
    with grpc.insecure_channel(leader.address) as ch:  # half a member, or a bad group: INVALID_ARGUMENT
        pull = broker_pb2_grpc.BrokerStub(ch).Pull
        for group, cid, why in (
            ("members", "", "both its consumer_group and its client_id"),
            ("bad group!", "x", "invalid consumer group"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                pull(
                    broker_pb2.PullRequest(topic="member-topic", consumer_group=group, client_id=cid),
                    timeout=5,
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in refused.value.details()
