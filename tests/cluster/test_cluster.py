"""A real local cluster: two name servers and two three-node broker groups, each a separate process.

Covers what a user of several groups relies on: every name server learns every group without talking to the
others, producers spread over the groups and survive a group's leader kill, a consumer group's members split
the queues and rebalance when one joins, leaves or dies, a restarted name server is whole again after one
heartbeat, bad registrations are refused, and the Spark audit of the whole cluster passes with the acks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import grpc
import pytest

from broker_adapter.client import BrokerConnection, Consumer
from broker_adapter.cluster import local as cl
from broker_adapter.cluster.client import ClusterConsumer, ClusterProducer
from broker_adapter.nameserver.client import NameServerClient, NoRouteError
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger import group as grp
from dledger.errors import UnavailableError

CONSUMER_EXPIRY_MS = 1_500

# Every acknowledged send of this module: the audit at the end checks each is in its group's log exactly once,
# and that the log holds nothing no one sent.
ACKS: list[dict] = []


def _groups_with(ns: NameServerClient, topic: str) -> int:
    try:
        return len(ns.route(topic))
    except NoRouteError:
        return 0


def send_to(p: ClusterProducer, topic: str, body: bytes) -> str:
    return send(p, body, topic)["msg_id"]


def send(p: ClusterProducer, body: bytes, topic: str = "T") -> dict:
    group, r = p.send(topic, body)
    ack = {
        "group": group,
        "msg_id": r.msg_id,
        "topic": r.topic,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "commitlog_offset": r.commitlog_offset,
    }
    ACKS.append(ack)
    return ack


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    c = cl.up(d, groups=2, nodes=3, nameservers=2, heartbeat_ms=300, consumer_expiry_ms=CONSUMER_EXPIRY_MS)
    try:
        cl.create_topic(c, "T", 2)
        yield c
    finally:
        cl.down(c)


def wait_for(predicate, timeout_s=15.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def both_groups(ns: NameServerClient):
    """T's route once both groups registered it, from every node (a registration follows the topic's creation
    within a beat, and each node registers itself: on a loaded machine the last may come a beat later)."""
    try:
        routes = ns.route("T")
    except NoRouteError:
        return None
    return routes if len(routes) == 2 and all(len(r.addresses) == 3 for r in routes) else None


def test_every_name_server_knows_every_group_and_topic(cluster):
    for address in cluster.nameserver_addresses:
        with NameServerClient([address]) as ns:
            routes = wait_for(lambda ns=ns: both_groups(ns), what="topic T in both groups' routes")
            assert [(r.group, r.queues, len(r.addresses)) for r in routes] == [("g0", 2, 3), ("g1", 2, 3)]
            assert all(r.leader_address in r.addresses for r in routes)


def test_bad_requests_are_refused_with_a_reason(cluster):
    with grpc.insecure_channel(cluster.nameserver_addresses[0]) as ch:
        stub = pb_grpc.NameServerStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterBroker(
                pb.BrokerRegistration(cluster="c", group="", node_id="n0", address="127.0.0.1:1")
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "group is empty" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterBroker(
                pb.BrokerRegistration(cluster="c", group="g9", node_id="n0", address="nowhere")
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "host:port" in e.value.details()
        info = stub.ClusterInfo(pb.ClusterInfoRequest())
        assert {b.registration.group for b in info.brokers} == {"g0", "g1"}  # nothing bad was registered
    with NameServerClient(cluster.nameserver_addresses) as ns, pytest.raises(NoRouteError, match="no live"):
        ns.route("no-such-topic")


def test_producer_spreads_over_groups_and_two_consumers_split_the_queues(cluster, tmp_path):
    ns = cluster.nameserver_addresses
    with NameServerClient(ns) as client:  # so that the test does not depend on an earlier one having waited
        wait_for(lambda: both_groups(client), what="topic T in both groups' routes")
    with ClusterProducer(ns) as p:
        acks = [send(p, f"m{i}".encode()) for i in range(200)]
    assert {a["group"] for a in acks} == {"g0", "g1"}
    a = ClusterConsumer(ns, "split", "T", client_id="a")
    b = ClusterConsumer(ns, "split", "T", client_id="b")
    try:
        a.rebalance()
        b.rebalance()
        wait_for(lambda: len(a.rebalance()) == 2 and len(b.rebalance()) == 2, what="two queues each")
        assert set(a.assigned).isdisjoint(b.assigned)
        got: dict[str, list[str]] = {"a": [], "b": []}

        def read(c, name):
            got[name] = [m.msg_id for _, m in c.messages(idle_s=1.0)]

        threads = [threading.Thread(target=read, args=(c, n)) for c, n in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(got["a"] + got["b"]) == sorted(x["msg_id"] for x in acks)  # each once, none lost
    finally:
        a.close()
        b.close()


def test_members_rebalance_when_one_joins_leaves_or_dies(cluster):
    ns = cluster.nameserver_addresses
    a = ClusterConsumer(ns, "rebal", "T", client_id="a")
    b = ClusterConsumer(ns, "rebal", "T", client_id="b")
    c = ClusterConsumer(ns, "rebal", "T", client_id="c")
    try:
        assert len(a.rebalance()) == 4  # alone: every queue of both groups
        b.rebalance()
        wait_for(lambda: len(a.rebalance()) == 2, what="a to give up half on b's arrival")
        b.close()  # a clean leave unregisters at once
        wait_for(lambda: len(a.rebalance()) == 4, what="a to take everything back")
        c.rebalance()
        wait_for(lambda: len(a.rebalance()) == 2, what="a to share with c")
        # c dies without a word: it stops heartbeating and expires on the name servers
        wait_for(
            lambda: len(a.rebalance()) == 4, timeout_s=CONSUMER_EXPIRY_MS / 1000 + 10, what="c to expire"
        )
        assert a.rebalances >= 4
    finally:
        a.close()
        c.nameservers.close()


def test_a_group_leader_kill_does_not_stop_the_producer(cluster):
    g0 = cluster.group("g0")
    leader = grp.wait_for_leader(g0)
    with ClusterProducer(cluster.nameserver_addresses) as p:
        send(p, b"warm-up")
        grp.kill_node(g0.node(leader.id))
        try:
            acks = [send(p, f"k{i}".encode()) for i in range(60)]
        finally:
            grp.start_node(g0.node(leader.id))
    assert len(acks) == 60 and {a["group"] for a in acks} == {"g0", "g1"}
    grp.wait_for_leader(g0)
    cl.wait_registered(cluster)


def test_a_restarted_name_server_is_whole_again_after_one_heartbeat(cluster):
    spec = cluster.nameservers[0]
    assert cl.stop_nameserver(spec)
    with NameServerClient([spec.address], timeout_s=0.3) as ns, pytest.raises(UnavailableError):
        ns.route("T")
    cl.start_nameserver(spec)
    with NameServerClient([spec.address], timeout_s=1.0) as ns:

        def whole():
            try:
                return len(ns.route("T")) == 2
            except Exception:
                return False

        wait_for(whole, what="the restarted name server to know both groups")


def test_consuming_through_a_rebalance_loses_nothing(cluster):
    """A reads part of the topic, B joins and both finish it, then A dies mid-read and B takes over: every
    acknowledged message is consumed (duplicates across a rebalance are allowed, loss is not)."""
    ns = cluster.nameserver_addresses
    cl.create_topic(cluster, "R", 2)
    with NameServerClient(ns) as nsc:
        wait_for(lambda: _groups_with(nsc, "R") == 2, what="topic R in both groups' routes")
    with ClusterProducer(ns) as p:
        sent = {send_to(p, "R", f"r{i}".encode()) for i in range(300)}
    seen: list[str] = []
    a = ClusterConsumer(ns, "through", "R", client_id="a", rebalance_s=0.2)
    b = ClusterConsumer(ns, "through", "R", client_id="b", rebalance_s=0.2)
    try:
        seen += [m.msg_id for _, m in a.messages(batch=16, limit=80)]
        b.rebalance()
        wait_for(lambda: len(a.rebalance()) == 2, what="a to share with b")
        seen += [m.msg_id for _, m in a.messages(batch=16, limit=40)]
        # a dies: no unregister, no more heartbeats; b must take a's queues from their committed offsets
        wait_for(
            lambda: len(b.rebalance()) == 4, timeout_s=CONSUMER_EXPIRY_MS / 1000 + 10, what="a to expire"
        )
        seen += [m.msg_id for _, m in b.messages(batch=16, idle_s=1.5)]
    finally:
        b.close()
        a.nameservers.close()
    assert sent <= set(seen), f"lost {len(sent - set(seen))} acknowledged messages"


def test_the_cli_produces_and_consumes_through_the_name_servers(cluster, tmp_path):
    ns = ",".join(cluster.nameserver_addresses)
    acks = tmp_path / "acks.jsonl"
    cli = [sys.executable, "-m", "dledger"]
    r = subprocess.run(
        [*cli, "produce", "--nameservers", ns, "--topic", "T", "--count", "20", "--ack-log", str(acks)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    records = [json.loads(line) for line in acks.read_text().splitlines()]
    ACKS.extend(records)
    assert len(records) == 20 and {a["group"] for a in records} == {"g0", "g1"}
    out = tmp_path / "consumed.jsonl"
    r = subprocess.run(
        [
            *cli,
            "consume",
            "--nameservers",
            ns,
            "--topic",
            "T",
            "--group",
            "cli",
            "--quiet",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    consumed = {json.loads(line)["msg_id"] for line in out.read_text().splitlines()}
    assert {a["msg_id"] for a in ACKS if a["topic"] == "T"} <= consumed
    r = subprocess.run(
        [*cli, "produce", "--nameservers", "nowhere", "--topic", "T", "--body", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not host:port" in r.stderr


def test_the_official_rocketmq_client_spreads_over_every_group_from_one_address(cluster):
    """QueryRoute / QueryAssignment at one node of g0 list g1's queues too (from the name servers' picture), so the
    official client sends to both groups and its SimpleConsumer receives from both. (That every group's queues
    accept every message type is tests/cluster/test_rocketmq_routes.py's: the audit at the end of this module
    judges ack logs of normal sends.)"""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    from broker_adapter.rocketmq import ensure_event_loop

    cl.create_topic(cluster, "RQ", 2)
    with NameServerClient(cluster.nameserver_addresses) as nsc:
        wait_for(lambda: _groups_with(nsc, "RQ") == 2, what="topic RQ in both groups' routes")
    cfg = ClientConfiguration(cluster.group("g0").addresses[0], Credentials(), request_timeout=5)
    ensure_event_loop()

    def route_groups() -> set[str]:
        import grpc as _grpc
        from rocketmq.grpc_protocol import MessagingServiceStub, definition_pb2, service_pb2

        with _grpc.insecure_channel(cluster.group("g0").addresses[0]) as ch:
            r = MessagingServiceStub(ch).QueryRoute(
                service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="RQ")),
                metadata=(("x-mq-client-id", "tests@1@0@cluster"),),
                timeout=5,
            )
        return {mq.broker.name for mq in r.message_queues}

    wait_for(lambda: route_groups() == {"g0", "g1"}, what="g0's route to list g1's queues")
    producer = Producer(cfg, ("RQ",))
    producer.startup()
    sent = set()
    try:
        for i in range(24):
            m = Message()
            m.topic = "RQ"
            m.body = f"rq{i}".encode()
            sent.add(producer.send(m).message_id)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(cfg, "rq-readers", {"RQ": FilterExpression()}, await_duration=1)
    consumer.startup()
    got = set()
    try:
        deadline = time.monotonic() + 60
        while got != sent and time.monotonic() < deadline:
            for m in consumer.receive(32, 20):
                got.add(m.message_id)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert got == sent
    # Both groups hold some of them: the client really spread its sends.
    for gname in cluster.groups:
        with BrokerConnection(cluster.group(gname).addresses) as c:
            info = {t.topic: t for t in c.list_topics()}["RQ"]
            assert sum(info.max_offsets) > 0, f"{gname} got none of the official client's messages"
            ACKS.extend(_acks_of(cluster, gname, "RQ"))


def _acks_of(cluster, gname: str, topic: str) -> list[dict]:
    """Ack records for messages sent by a client that keeps no ack log (the official one): read back from the
    group, so the audit's "nothing unsent" rule knows them."""
    out = []
    with Consumer(cluster.group(gname).addresses, "audit-reader") as c:
        info = {t.topic: t for t in c.list_topics()}[topic]
        for q in range(info.queues):
            for m in c.pull(topic, q, 0, 1000):
                out.append(
                    {
                        "group": gname,
                        "msg_id": m.msg_id,
                        "topic": topic,
                        "queue_id": m.queue_id,
                        "queue_offset": m.queue_offset,
                        "commitlog_offset": m.commitlog_offset,
                    }
                )
    return out


def test_the_audit_of_the_whole_cluster_finds_every_acknowledged_message_once(cluster, tmp_path):
    """Last in this file (pytest-xdist's loadfile keeps the order): every send of the module is in ACKS."""
    ack_log = tmp_path / "acks.jsonl"
    ack_log.write_text("".join(json.dumps(a) + "\n" for a in ACKS))
    for gname in cluster.groups:
        grp.wait_for_all(cluster.group(gname))
    out = subprocess.run(
        [sys.executable, "-m", "dledger", "audit", cluster.directory, "--ack-log", str(ack_log)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "group g0: passed" in out.stdout and "group g1: passed" in out.stdout
