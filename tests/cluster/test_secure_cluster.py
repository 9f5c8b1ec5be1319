"""A real secure cluster (``cluster up --secure``): one TLS name server and two three-node broker groups, every
certificate from one CA, every process separate.

What a secure cluster promises (docs/cluster.md, "Security"): signed clients produce and consume through the
name servers over TLS; only a broker node proving its identity with its certificate may register, and only
itself: no certificate, another CA's certificate, a node certificate presented under another node id or for
another group are refused, logged, and never reach a route; plaintext and unsigned questions are refused; and
one group's node certificate cannot speak Raft to another group under the cluster's shared CA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from broker_adapter.cluster import local as cl
from broker_adapter.cluster.client import ClusterConsumer, ClusterProducer
from broker_adapter.nameserver.client import NameServerClient, NameServerRefusedError, NoRouteError
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger import group as grp
from dledger.security import certs, tls
from dledger.security.config import ClientSecurity
from dledger.v1 import raft_pb2, raft_pb2_grpc

FAKE_ADDRESS = "127.0.0.1:1"  # where a hijacked route would send clients


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("secure-cluster")
    c = cl.up(d, groups=2, nodes=3, nameservers=1, heartbeat_ms=300, secure=True)
    try:
        cl.create_topic(c, "T", 2)
        _wait_routed(c, "T")
        yield c
    finally:
        cl.down(c)


def _wait_routed(c: cl.ClusterSpec, topic: str, timeout_s: float = 15.0) -> None:
    """Until the name server routes ``topic`` to both groups (the brokers' next heartbeat carries it)."""
    deadline = time.monotonic() + timeout_s
    with NameServerClient(c.nameserver_addresses, security=c.client_security()) as ns:
        while time.monotonic() < deadline:
            try:
                if len(ns.route(topic)) == 2:
                    return
            except NoRouteError:
                pass
            time.sleep(0.05)
    raise AssertionError(f"topic {topic} not routed to both groups within {timeout_s} s")


def _ns(c: cl.ClusterSpec) -> str:
    return c.nameserver_addresses[0]


def _tls_dir(c: cl.ClusterSpec, group: str) -> Path:
    return Path(c.directory) / group / "tls"


def _node_creds(c: cl.ClusterSpec, group: str, node: str, *, claim: str | None = None, sign_group: str = ""):
    """``group/node``'s real certificate and key, presenting itself as ``claim`` (default: itself) and signing
    for ``sign_group`` (default: its group)."""
    t = _tls_dir(c, group)
    cert, key = (t / f"{node}.pem").read_bytes(), (t / f"{node}.key").read_bytes()
    ca = (Path(c.directory) / "tls" / "ca.pem").read_bytes()
    return tls.peer_channel_credentials(sign_group or group, claim or node, cert, key, ca)


def _register(c: cl.ClusterSpec, credentials, group: str, node: str, call: str = "RegisterBroker"):
    """A registration of ``group/node`` at FAKE_ADDRESS; the gRPC status code it got (OK when accepted)."""
    ch = grpc.secure_channel(_ns(c), credentials)
    try:
        stub = pb_grpc.NameServerStub(ch)
        if call == "RegisterBroker":
            reg = pb.BrokerRegistration(
                cluster=c.name,
                group=group,
                node_id=node,
                address=FAKE_ADDRESS,
                leader=True,
                term=1_000_000,  # would win the leader hint
                topics=[pb.TopicQueues(topic="T", queues=64)],
            )
            stub.RegisterBroker(reg, timeout=5)
        else:
            stub.UnregisterBroker(
                pb.UnregisterBrokerRequest(cluster=c.name, group=group, node_id=node), timeout=5
            )
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        ch.close()


def _admin(c: cl.ClusterSpec) -> ClientSecurity:
    sec = c.client_security()
    assert sec is not None
    return sec


def _routes(c: cl.ClusterSpec):
    with NameServerClient([_ns(c)], security=_admin(c)) as ns:
        return ns.route("T")


def _log(c: cl.ClusterSpec) -> str:
    return (Path(c.nameservers[0].dir) / "nameserver.log").read_text()


def test_signed_clients_produce_and_consume_across_groups(cluster):
    sec = _admin(cluster)
    sent = set()
    groups = set()
    with ClusterProducer(cluster.nameserver_addresses, security=sec) as p:
        for i in range(20):
            g, _r = p.send("T", f"secure-{i}".encode())
            groups.add(g)
            sent.add(f"secure-{i}".encode())
    assert groups == {"g0", "g1"}
    with ClusterConsumer(cluster.nameserver_addresses, "billing", "T", security=sec) as c:
        got = [m.body for _q, m in c.messages(idle_s=1.5)]
    assert sorted(got) == sorted(sent)
    assert {q.group for q in c.assigned} == {"g0", "g1"}


def test_every_node_registered_with_its_proof(cluster):
    with NameServerClient([_ns(cluster)], security=_admin(cluster)) as ns:
        info = ns.cluster_info()
    registered = {(b.registration.group, b.registration.node_id) for b in info.brokers}
    assert registered == {(g, f"n{i}") for g in ("g0", "g1") for i in range(3)}


def test_fake_registrations_are_refused_and_never_routed(cluster, tmp_path):
    ca_file = Path(cluster.directory) / "tls" / "ca.pem"
    tls_only = grpc.ssl_channel_credentials(ca_file.read_bytes())
    admin_signed = tls.client_channel_credentials(_admin(cluster))
    other_ca = certs.make_ca("another CA")
    stranger = certs.make_node_cert(other_ca, "n0", group="g1")
    stranger_creds = tls.peer_channel_credentials(
        "g1", "n0", stranger.cert_pem, stranger.key_pem, ca_file.read_bytes()
    )
    cases = [
        ("no certificate, no credentials", tls_only, "g1", "n0", grpc.StatusCode.UNAUTHENTICATED),
        ("the admin's signature, no certificate", admin_signed, "g1", "n0", grpc.StatusCode.UNAUTHENTICATED),
        ("another CA's certificate for g1/n0", stranger_creds, "g1", "n0", grpc.StatusCode.UNAUTHENTICATED),
        (
            "g0/n1's certificate claiming n0",
            _node_creds(cluster, "g0", "n1", claim="n0"),
            "g0",
            "n0",
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        (
            "g0/n1's certificate signing for group g1",
            _node_creds(cluster, "g0", "n1", sign_group="g1"),
            "g1",
            "n1",
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        (
            "g0/n1 proving itself, registering g0/n0",
            _node_creds(cluster, "g0", "n1"),
            "g0",
            "n0",
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "g0/n1 proving itself, registering g1/n1",
            _node_creds(cluster, "g0", "n1"),
            "g1",
            "n1",
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "g0/n1 proving itself, registering a new group",
            _node_creds(cluster, "g0", "n1"),
            "evil",
            "n1",
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ]
    for what, creds, group, node, expected in cases:
        assert _register(cluster, creds, group, node) == expected, what
    # Unregistering another node (to drop it from routes) is refused the same way.
    assert (
        _register(cluster, _node_creds(cluster, "g0", "n1"), "g1", "n0", "UnregisterBroker")
        == grpc.StatusCode.PERMISSION_DENIED
    )
    assert _register(cluster, tls_only, "g1", "n0", "UnregisterBroker") == grpc.StatusCode.UNAUTHENTICATED

    routes = {r.group: r for r in _routes(cluster)}
    assert set(routes) == {"g0", "g1"}
    for r in routes.values():
        assert FAKE_ADDRESS not in r.addresses and r.leader_address != FAKE_ADDRESS
        assert len(r.addresses) == 3 and r.queues == 2
    with NameServerClient([_ns(cluster)], security=_admin(cluster)) as ns:
        assert all(b.registration.address != FAKE_ADDRESS for b in ns.cluster_info().brokers)

    log = _log(cluster)
    assert "a call without a node proof" in log
    assert "client 'admin'" in log  # who: the signed client that tried to register
    assert "not issued by this group's CA" in log
    assert "claiming to be 'n0' presented the certificate of node 'n1'" in log
    assert "node g0/n1 may not RegisterBroker g0/n0" in log
    assert "node g0/n1 may not RegisterBroker g1/n1" in log
    assert "node g0/n1 may not UnregisterBroker g1/n0" in log
    assert _admin(cluster).secret_key not in log


def test_a_node_registers_itself_with_its_own_proof(cluster):
    """The positive control of the refusals above: the same channel kind, honest, is accepted (at the node's
    real address, so routes stay right)."""
    g = cluster.group("g1")
    spec = g.node("n2")
    ch = grpc.secure_channel(_ns(cluster), _node_creds(cluster, "g1", "n2"))
    try:
        reg = pb.BrokerRegistration(
            cluster=cluster.name, group="g1", node_id="n2", address=spec.address, leader=False, term=1
        )
        r = pb_grpc.NameServerStub(ch).RegisterBroker(reg, timeout=5)
        assert r.expire_after_ms > 0
    finally:
        ch.close()


def test_plaintext_and_unsigned_questions_are_refused(cluster):
    ch = grpc.insecure_channel(_ns(cluster))
    try:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.NameServerStub(ch).QueryRoute(pb.QueryRouteRequest(topic="T"), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
    finally:
        ch.close()
    ca_file = _admin(cluster).ca_file
    for who in (ClientSecurity(ca_file), ClientSecurity(ca_file, "admin", "not-the-secret")):
        with NameServerClient([_ns(cluster)], security=who) as ns:
            with pytest.raises(NameServerRefusedError) as refused:
                ns.route("T")
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(NameServerRefusedError):
                ns.consumer_heartbeat("billing", "intruder")
            with pytest.raises(NameServerRefusedError):
                ns.cluster_info()
    with NameServerClient([_ns(cluster)], security=_admin(cluster)) as ns:
        assert "intruder" not in ns.consumers("billing")
    log = _log(cluster)
    assert "refused QueryRoute: no authorization header" in log
    assert "bad signature for access key 'admin'" in log


def test_a_node_certificate_cannot_speak_raft_to_another_group(cluster):
    """One CA signs every group's nodes and node ids repeat (g0/n0, g1/n0): g0's n0 must not pass for g1's n0."""
    target = cluster.group("g1").node("n1")
    creds = _node_creds(cluster, "g0", "n0", sign_group="g1")
    ch = grpc.secure_channel(target.address, creds)
    try:
        with pytest.raises(grpc.RpcError) as e:
            raft_pb2_grpc.RaftPeerStub(ch).Vote(
                raft_pb2.VoteRequest(group="g1", src="n0", dst="n1"), timeout=5
            )
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        ch.close()
    log = (Path(target.data_dir) / "node.log").read_text()
    assert "of group 'g0', not of this group ('g1')" in log


def test_cli_status_topic_and_produce_consume_through_the_name_servers(cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLEDGER_")}
    cli = [sys.executable, "-m", "dledger"]
    r = subprocess.run(
        [*cli, "cluster", "status", "--dir", cluster.directory, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["nodes"]
    assert len(rows) == 6 and all(row["registered_age_ms"] is not None for row in rows)
    r = subprocess.run(
        [*cli, "cluster", "topic", "--dir", cluster.directory, "--topic", "C", "--queues", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    _wait_routed(cluster, "C")
    ns = ",".join(cluster.nameserver_addresses)
    secure = ["--security", cluster.security]
    acks = tmp_path / "acks.jsonl"
    r = subprocess.run(
        [
            *cli,
            *secure,
            "produce",
            "--nameservers",
            ns,
            "--topic",
            "C",
            "--count",
            "6",
            "--ack-log",
            str(acks),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert len(acks.read_text().splitlines()) == 6
    out = tmp_path / "got.jsonl"
    consume = ["consume", "--nameservers", ns, "--topic", "C", "--group", "cli", "--idle-s", "1.5"]
    r = subprocess.run(
        [*cli, *secure, *consume, "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert len(out.read_text().splitlines()) == 6
    # Without the cluster's settings the CLI is refused by the name server, with a message saying so.
    r = subprocess.run(
        [*cli, "produce", "--nameservers", ns, "--topic", "C", "--count", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode != 0
    assert "if the cluster is secure, give its client settings" in r.stdout + r.stderr


def test_a_name_server_with_a_users_file_lets_readers_route_but_not_read_the_cluster(cluster, tmp_path):
    """``dledger nameserver --users``: more access keys may ask routes and heartbeat into the consumer groups
    their entry lists; ClusterInfo stays the admin's. A partial TLS setting is refused at start, naming what is
    missing."""
    base = Path(cluster.directory)
    users = tmp_path / "users.toml"
    users.write_text(
        '[[user]]\naccess_key = "reader"\nsecret_key = "reader-secret-1"\nconsumer_groups = ["billing"]\n'
    )
    (port,) = grp.free_ports(1)
    address = f"127.0.0.1:{port}"
    cli = [sys.executable, "-m", "dledger", "nameserver", "--listen", address]
    partial = subprocess.run(
        [*cli, "--cert", str(base / "tls" / "ns0.pem")], capture_output=True, text=True, timeout=60
    )
    assert partial.returncode == 2 and "missing --key, --ca, --admin" in partial.stdout + partial.stderr
    tls_args = ["--cert", str(base / "tls" / "ns0.pem"), "--key", str(base / "tls" / "ns0.key")]
    tls_args += ["--ca", str(base / "tls" / "ca.pem"), "--admin", str(base / "admin.toml")]
    log = tmp_path / "ns.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cli, *tls_args, "--users", str(users)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        reader = ClientSecurity(_admin(cluster).ca_file, "reader", "reader-secret-1")
        with NameServerClient([address], security=reader) as ns:
            deadline = time.monotonic() + 20
            while "listening" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.05)
            with pytest.raises(NoRouteError):  # authenticated: the answer is about the topic
                ns.route("T")
            assert ns.consumer_heartbeat("billing", "reader-1") == 1
            assert ns.consumers("billing") == ["reader-1"]
            for call in (
                lambda: ns.consumer_heartbeat("payroll", "reader-1"),
                lambda: ns.consumers("payroll"),
            ):
                with pytest.raises(NameServerRefusedError) as refused:
                    call()
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(NameServerRefusedError) as refused:
                ns.cluster_info()
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        with NameServerClient([address], security=_admin(cluster)) as ns:
            assert [g.group for g in ns.cluster_info().consumer_groups] == ["billing"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "user 'reader' may not call ClusterInfo" in log.read_text()
    assert "user 'reader' may not ConsumerHeartbeat for consumer group 'payroll'" in log.read_text()
    assert "reader-secret-1" not in log.read_text()
